package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/netns"
)

func newBenchCmd(g *globals) *cobra.Command {
	var quick bool
	var out string
	c := &cobra.Command{
		Use:   "bench SCENARIO [--quick] [--out DIR]",
		Short: "Reproduce firewall benchmarks on this kernel, in network namespaces of its own",
		Long: `Bench runs a benchmark scenario in network namespaces it creates and removes,
and writes results.json, results.csv and report.md into --out. The host's own
firewall is never touched.

Scenarios:
  control   nft sets' control plane: single-element transactions (a ban)
            into hash and interval sets of 0 to 1M elements, with 1 and 8
            concurrent writers; loading a set whole; counting its elements by
            listing it; bulk inserts by elements per transaction.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "control" {
				return usageError{fmt.Errorf("unknown scenario %q (have: control)", args[0])}
			}
			o := bench.FullControl
			if quick {
				o = bench.QuickControl
			}
			lab, err := netns.NewLab(fmt.Sprintf("bench%d", os.Getpid()))
			if err != nil {
				return err
			}
			defer lab.Close()
			progress := func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), s) }
			res, err := bench.Control(cmd.Context(), lab, o, progress)
			if err != nil {
				return err
			}
			if err := writeBenchOut(out, res, res.CSV(), res.Markdown()); err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprint(cmd.OutOrStdout(), res.Markdown())
			fmt.Fprintf(cmd.ErrOrStderr(), "results in %s\n", out)
			return nil
		},
	}
	c.Flags().BoolVar(&quick, "quick", false, "small sizes and counts: a smoke run of seconds")
	c.Flags().StringVar(&out, "out", "ipfence-bench", "folder for results.json, results.csv and report.md")
	return c
}

// writeBenchOut writes a scenario's results into dir.
func writeBenchOut(dir string, res any, csv, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"results.json": append(js, '\n'), "results.csv": []byte(csv), "report.md": []byte(md)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
