package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/stress"
)

func newStressCmd(g *globals) *cobra.Command {
	var o stress.Options
	var existing, clients, rates, cpuprofile string
	c := &cobra.Command{
		Use:   "stress [--existing 0,100000,1000000] [--clients 1,8] [--duration 3m]",
		Short: "Measure and hammer the daemon's ban path in a namespace of its own",
		Long: `Stress starts a daemon (this binary) in a network namespace it creates and
removes, and measures through the API: ban latency (p50/p99) at each number of
existing bans and of concurrent clients, the bulk load rate, the sustained
batched ban rate, count queries, and the daemon's memory. Then a mixed run:
--workers concurrent workers banning, unbanning, counting, listing, scraping
metrics and refreshing the feed for --duration, after which the kernel's ban
sets are read back and checked against the daemon and the workers' record.
The host's firewall is never touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Existing, err = intList(existing); err != nil {
				return usageError{fmt.Errorf("--existing: %w", err)}
			}
			if o.Clients, err = intList(clients); err != nil {
				return usageError{fmt.Errorf("--clients: %w", err)}
			}
			if rates != "" {
				if o.Rates, err = intList(rates); err != nil || slices.Contains(o.Rates, 0) {
					return usageError{fmt.Errorf("--rates: %q is not a list of rates above 0", rates)}
				}
			}
			if o.Exe == "" {
				if o.Exe, err = os.Executable(); err != nil {
					return err
				}
			}
			o.Progress = cmd.ErrOrStderr()
			if cpuprofile != "" {
				f, err := os.Create(cpuprofile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			rep, err := stress.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			printStress(cmd.OutOrStdout(), rep)
			if m := rep.Mixed; m != nil && (m.Lost > 0 || m.Phantom > 0 || m.Errors > 0) {
				return fmt.Errorf("mixed run: %d lost, %d phantom bans, %d errors", m.Lost, m.Phantom, m.Errors)
			}
			return nil
		},
	}
	c.Flags().StringVar(&existing, "existing", "0,100000,1000000", "numbers of bans in force for the latency rows")
	c.Flags().StringVar(&cpuprofile, "cpuprofile", "", "write the client side's CPU profile to this file (debugging)")
	c.Flags().StringArrayVar(&o.DaemonArgs, "daemon-arg", nil, "add an argument to the daemon's command line (repeatable; e.g. --daemon-arg=--pprof)")
	c.Flags().StringVar(&clients, "clients", "1,8", "concurrent clients for the latency rows")
	c.Flags().StringVar(&rates, "rates", "1000,4000", "total bans per second of the paced latency rows (the most clients, each on a schedule; \"\": none)")
	c.Flags().IntVar(&o.Requests, "requests", 2000, "single-ban requests per latency row")
	c.Flags().DurationVar(&o.Duration, "duration", 3*time.Minute, "length of the mixed run (0: none)")
	c.Flags().IntVar(&o.Workers, "workers", 13, "workers of the mixed run")
	c.Flags().StringVar(&o.Exe, "exe", "", "ipfence binary to run the daemon with (default: this one)")
	return c
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a list of numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func printStress(w io.Writer, r *stress.Report) {
	fmt.Fprintln(w, "ban latency through the API (one address per request):")
	fmt.Fprintln(w, "  existing bans  clients      rate  requests       p50        p99        max  sent late (p99)")
	for _, l := range r.Latency {
		rate, late := "flat out", ""
		if l.Rate > 0 {
			rate, late = strconv.Itoa(l.Rate)+"/s", fmt.Sprintf("  %7.0f µs", l.LateP99us)
		}
		fmt.Fprintf(w, "  %13d  %7d  %8s  %8d  %7.0f µs %7.0f µs %7.0f µs%s\n", l.Existing, l.Clients, rate, l.Requests, l.P50us, l.P99us, l.MaxUs, late)
	}
	fmt.Fprintf(w, "bulk load: %d bans at %.0f bans/s (requests of %dk addresses, %d in flight)\n", r.BulkElements, r.BulkPerSec, stress.BulkChunk/1000, stress.BulkInFlight)
	fmt.Fprintf(w, "sustained: %.0f bans/s (8 clients, 256 addresses per request)\n", r.SustainedPerSec)
	fmt.Fprintf(w, "count query at %d bans: p50 %.0f µs, p99 %.0f µs\n", r.CountAt, r.CountP50us, r.CountP99us)
	fmt.Fprintf(w, "daemon RSS: %.0f MiB at %d bans, %.0f MiB at %d bans\n", r.LoadedRSSMiB, r.LoadedRSSAtBans, r.DaemonRSSMiB, r.RSSAtBans)
	if r.MixedRSSMiB > 0 {
		fmt.Fprintf(w, "daemon RSS after the mixed run: %.0f MiB\n", r.MixedRSSMiB)
	}
	if m := r.Mixed; m != nil {
		fmt.Fprintf(w, "mixed run: %d workers, %.0f s, ops %v, %d errors %s\n", m.Workers, m.Seconds, m.Ops, m.Errors, m.FirstError)
		fmt.Fprintf(w, "  at the end: %d bans; kernel checked (%d ranges read, %d addresses probed, %.0f s): %d lost, %d phantom\n",
			m.BansAtEnd, m.KernelRanges, m.KernelProbed, m.ReadBackSecs, m.Lost, m.Phantom)
	}
}
