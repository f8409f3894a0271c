package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/demo"
)

func newDemoCmd(g *globals) *cobra.Command {
	o := demo.Options{Sources: 24000, Rounds: 3, Packets: 200_000}
	c := &cobra.Command{
		Use:   "demo [--policy FILE]",
		Short: "Run the \"allow only Europe\" job in a throw-away network namespace and measure it",
		Long: `Demo compiles a policy (by default the built-in examples/europe.yaml: allow
only the 52 European country codes, from the bundled country data), creates two
network namespaces joined by a veth pair, applies the policy in one of them,
sends one packet per source for tens of thousands of sources (range
boundaries, inside, outside, random; IPv4 and IPv6) and checks every verdict
against the model, then measures the per-packet cost against a plain nft
interval set holding the same prefixes, each config loaded once into a pair
of namespaces of its own. The namespaces are removed at the end.
The host's own firewall is never touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Out, o.Progress = cmd.OutOrStdout(), cmd.ErrOrStderr()
			rep, err := demo.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			printDemo(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	c.Flags().StringVarP(&o.PolicyFile, "policy", "p", "", "policy to run (default: the built-in examples/europe.yaml)")
	c.Flags().IntVar(&o.Sources, "sources", o.Sources, "sources for the verdict check")
	c.Flags().IntVar(&o.Rounds, "rounds", o.Rounds, "measured rounds (after one warm-up round); 0 skips the measurement")
	c.Flags().IntVar(&o.Packets, "packets", o.Packets, "packets per measurement")
	c.Flags().BoolVar(&o.CompareV1, "compare-v1", false, "also measure the layout chosen with the traffic model before issue 23 (config ipfence-v1), in the same rounds")
	c.Flags().StringVar(&o.Pass, "pass-sources", demo.PassAddresses, "how legitimate sources are drawn: "+strings.Join(demo.PassModes, ", ")+
		" (addresses: IPv4 by address, IPv6 by prefix; ranges: every allowed range equally busy; zipf: 4096 range-drawn clients, Zipf-weighted)")
	return c
}

func printDemo(w io.Writer, r *demo.Report) {
	fmt.Fprintf(w, "policy %s, compiled in %d ms\n", r.Policy, r.CompileMs)
	for _, rule := range r.Plan.Rules {
		fmt.Fprintf(w, "  rule %s (%s)\n    IPv4: %s\n    IPv6: %s\n", rule.Name, rule.Action, describeLayout(rule.V4), describeLayout(rule.V6))
	}
	if r.PlanV1 != nil {
		for _, rule := range r.PlanV1.Rules {
			fmt.Fprintf(w, "  rule %s with the v1 traffic model\n    IPv4: %s\n    IPv6: %s\n", rule.Name, describeLayout(rule.V4), describeLayout(rule.V6))
		}
	}
	fmt.Fprintf(w, "load: one netlink transaction, %d maps/sets, %d elements, %d chains: %d ms\n", r.Load.Sets, r.Load.Elements, r.Load.Chains, r.Load.Millis)
	fmt.Fprintf(w, "verdicts: %d sources (%d IPv4, %d IPv6), %d dropped, %d passed: %d differ from the model\n",
		r.Sources, r.SourcesV4, r.SourcesV6, r.Dropped, r.Sources-r.Dropped, r.Mismatches)
	if r.PerPacket == nil {
		return
	}
	pp := r.PerPacket
	fmt.Fprintf(w, "per-packet cost added by the ruleset (median of %d interleaved rounds × %d packets; plain set load %d ms):\n", pp.Rounds, pp.Packets, r.PlainLoadMs)
	fmt.Fprintf(w, "  %-12s %14s %14s %8s %9s %7s %9s\n", "traffic", "plain nft set", "ipfence", "ratio", "lookups", "words", "(model)")
	for _, tr := range []string{"pass-ipv4", "random-ipv4", "pass-ipv6", "random-ipv6"} {
		pl, ip := pp.Cell("plain-set", tr), pp.Cell("ipfence", tr)
		ratio := "-"
		if pl.OverheadNs > 0 {
			ratio = fmt.Sprintf("%.2f", ip.OverheadNs/pl.OverheadNs)
		}
		m := r.Model[tr]
		fmt.Fprintf(w, "  %-12s %+11.0f ns %+11.0f ns %8s %9.2f %7.2f %9.2f\n", tr, pl.OverheadNs, ip.OverheadNs, ratio, m.Lookups, m.Words, m.Predicted)
		if r.PlanV1 != nil {
			v1, m1 := pp.Cell("ipfence-v1", tr), r.Model["v1/"+tr]
			ratio = "-"
			if pl.OverheadNs > 0 {
				ratio = fmt.Sprintf("%.2f", v1.OverheadNs/pl.OverheadNs)
			}
			fmt.Fprintf(w, "  %-12s %14s %+11.0f ns %8s %9.2f %7.2f %9.2f\n", "  (v1 model)", "", v1.OverheadNs, ratio, m1.Lookups, m1.Words, m1.Predicted)
		}
	}
	fmt.Fprintln(w, strings.TrimSpace(`
("pass" sources are addresses the policy lets through, i.e. legitimate traffic,
drawn by `+r.Pass+`; "random" are uniform over the address space, IPv6 over
2000::/3, mostly blocked. lookups and words: ipfence's map lookups and 32-bit
key words per packet on the sources sent; model: the chooser's prediction.)`))
}
