package main

import (
	"fmt"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/daemon"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/trial"
)

func newDaemonCmd(g *globals) *cobra.Command {
	var cfg daemon.Config
	var xf xdpFlags
	c := &cobra.Command{
		Use:   "daemon --policy FILE [--netns NAME] [--socket PATH] [--state DIR] [--metrics ADDR] [--pin-dir DIR] [--xdp-generic]",
		Short: "Keep a policy loaded, its sources fresh, and take bans over a local API",
		Long: `Daemon loads the policy (with the bans kept in the state folder) in one
transaction, then:
  - reads each source again on its schedule (refresh: in the policy; URLs every
    hour, files every minute by default) and sends only what changed, in one
    transaction; a source that fails or shrinks too much keeps its last good
    data in force (the policy file itself is read at the start and at each
    ipfence reload, never behind the operator's back);
  - serves the API on a root-only Unix socket (ipfence ban/unban/bans/status
    use it; see internal/daemon/api), coalescing concurrent bans into batched
    transactions;
  - runs the policy's XDP rules (backend: xdp) like apply, swapping the XDP
    program in one step when their sources change;
  - expires bans, checks the kernel against what it loaded (the XDP program
    on every interface too) and repairs drift;
  - exports Prometheus metrics on --metrics (default 127.0.0.1:9477; "" off);
  - tells systemd when it is ready and pets its watchdog (Type=notify).
It stops on SIGINT/SIGTERM and leaves the ruleset in force.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cfg.Logger = g.logger
			cfg.XDP = xf.options()
			cfg.Host = doctor.Pick
			return daemon.New(cfg).Run(ctx)
		},
	}
	c.Flags().StringVarP(&cfg.Policy, "policy", "p", "", "policy file (YAML)")
	_ = c.MarkFlagRequired("policy")
	registerDaemonFlags(c, &cfg)
	c.Flags().Var((*backendFlag)(&cfg.Backend), "backend", "override the policy's backend: nftables, xdp, ipset, iptables-split or auto (what the host supports)")
	c.Flags().StringVar(&cfg.IPTables, "iptables", "", "iptables flavour of the ipset and iptables-split backends: legacy or nft (default: the one `iptables` is)")
	xf.register(c, true)
	return c
}

// registerDaemonFlags registers the flags of the daemon's own settings,
// for `ipfence daemon` and `ipfence agent` (which runs one).
func registerDaemonFlags(c *cobra.Command, cfg *daemon.Config) {
	c.Flags().StringVar(&cfg.NetNS, "netns", "", "network namespace (default: the current one)")
	c.Flags().StringVar(&cfg.StateDir, "state", statedir.DefaultDir, "state folder: bans, feed caches, last good loads or revisions")
	c.Flags().StringVar(&cfg.Socket, "socket", api.DefaultSocket, "API socket (ipfence ban/bans/status use it)")
	c.Flags().StringVar(&cfg.Metrics, "metrics", "127.0.0.1:9477", "Prometheus listen address (\"\" turns metrics off)")
	c.Flags().BoolVar(&cfg.Pprof, "pprof", false, "also serve Go's profiler at /debug/pprof/ on the metrics address (debugging)")
	// Without --pprof nothing reads the heap profile: its records (a
	// stack per sample, kept for the process's life) are memory a
	// long-running daemon holds for nothing.
	c.PreRun = func(*cobra.Command, []string) {
		if !cfg.Pprof {
			runtime.MemProfileRate = 0
		}
	}
	c.Flags().DurationVar(&cfg.Tick, "tick", 10*time.Second, "how often to look for due sources, expired bans and drift")
}

func newReloadCmd(g *globals) *cobra.Command {
	var socket string
	var confirm time.Duration
	c := &cobra.Command{
		Use:   "reload [--socket PATH] [--confirm 2m]",
		Short: "Make the daemon read its policy and sources again and load what changed",
		Long: `Reload makes the daemon read its policy file and sources again and load what
changed. With --confirm 2m the reload is on trial: unless ipfence confirm runs
within two minutes, the daemon loads the policy it ran before again (and keeps
loading it in place of the file while the file stays as it is). The trial is
kept in the state folder: a daemon that restarts within the window takes it up
again, and a reboot rolls it back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if confirm != 0 {
				if err := trial.CheckWindow(confirm); err != nil {
					return usageError{fmt.Errorf("--confirm: %w", err)}
				}
			}
			cl := api.NewClient(socket)
			defer cl.Close()
			var r *api.ReloadResponse
			var err error
			if confirm != 0 {
				r, err = cl.ReloadTrial(cmd.Context(), confirm)
			} else {
				r, err = cl.Reload(cmd.Context())
			}
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			w := cmd.OutOrStdout()
			if !r.Changed {
				fmt.Fprintln(w, "reloaded: nothing changed")
			} else {
				fmt.Fprintf(w, "reloaded (%s) in %d ms: %d elements in force\n", r.Mode, r.Millis, r.Elements)
			}
			if t := r.Trial; t != nil {
				fmt.Fprintf(w, "ON TRIAL: run `ipfence confirm` before %s (%s from now) to keep it; otherwise the daemon loads the policy it ran before\n",
					t.Deadline.Local().Format(time.TimeOnly), t.Window)
			}
			return nil
		},
	}
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the daemon's API socket")
	c.Flags().DurationVar(&confirm, "confirm", 0, "reload on trial: unless `ipfence confirm` runs within this time (e.g. 2m), the policy before it is loaded again")
	return c
}
