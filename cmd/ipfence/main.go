// Command ipfence manages large IP block and allow lists and compiles them
// into the cheapest per-packet kernel structure.
//
// This file only wires commands; each command lives in its own file and the
// work is done by the packages under internal/.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/memlimit"
	"github.com/ipfence/ipfence/internal/version"
)

// globals holds the flags every command shares.
type globals struct {
	json    bool
	verbose bool
	logger  *slog.Logger
}

func main() {
	memlimit.Set() // under systemd's MemoryHigh=/MemoryMax=: collect before the cgroup throttles or kills
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		var ue usageError
		fmt.Fprintf(os.Stderr, "ipfence: %v\n", err)
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError marks errors in how a command was called (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "ipfence",
		Short:         "Compile very large IP block/allow lists into fast, atomic kernel firewalls",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelInfo
			if g.verbose {
				level = slog.LevelDebug
			}
			g.logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
		},
	}
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print machine-readable JSON (stable schema) instead of text")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details to stderr")
	root.AddCommand(
		newAggregateCmd(g),
		newGeoCmd(g),
		newFeedsCmd(g),
		newCompileCmd(g),
		newApplyCmd(g),
		newConfirmCmd(g),
		newStatusCmd(g),
		newFlushCmd(g),
		newExplainCmd(g),
		newBanCmd(g),
		newUnbanCmd(g),
		newBansCmd(g),
		newAllowCmd(g),
		newUnallowCmd(g),
		newAllowsCmd(g),
		newDaemonCmd(g),
		newReloadCmd(g),
		newStressCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newDoctorCmd(g),
		newKeygenCmd(g),
		newServerCmd(g),
		newPublishCmd(g),
		newRollbackCmd(g),
		newAgentCmd(g),
		newFleetCmd(g),
		newGendocsCmd(),
	)
	return root
}
