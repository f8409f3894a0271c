package main

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
)

// monitorPolicy has two rules in monitor mode (a drop rule, and an
// allow-only rule on a port) among enforcing ones that overlap them.
const monitorPolicy = `
sources:
  trial: {format: list, paths: [trial.txt]}
  feed:  {format: list, paths: [feed.txt]}
  geo:   {format: country-csv, paths: ["builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"]}
protect: [198.18.0.0/15, 2001:2::/48]
rules:
  - {name: trial, action: drop, mode: monitor, match: {source: trial}}
  - {name: feed,  action: reject, match: {source: feed}}
  - {name: only,  action: allow-only, mode: monitor, match: {source: geo, countries: [IT]}, ports: [udp/9999]}
  - {name: rej,   action: reject, match: {source: geo, countries: [BR]}}
`

// TestMonitorRules applies a policy with rules in monitor mode in a lab
// namespace: they stop nothing, the later rules see their packets as if
// they were absent (the kernel's verdicts are the model's, which skips
// them), and each one's counter holds exactly the packets it would have
// stopped. Then `apply --monitor` puts every blocking rule in monitor
// mode: everything passes, and the counters count again.
func TestMonitorRules(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "trial.txt", "1.0.0.0/8\n5.5.0.0/16\n2001:db8::/32\n")
	write(t, dir, "feed.txt", "5.5.5.0/24\n2001:db8:5::/48\n")
	write(t, dir, "p.yaml", monitorPolicy)
	pol := filepath.Join(dir, "p.yaml")

	out, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rule trial            monitor (drop)", "rule only             monitor (drop)", "rule feed             reject"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply's report lacks %q:\n%s", want, out)
		}
	}
	c := compileFor(t, pol, dir)
	srcs := monitorSources(c.Plan)
	decisions := pktgentest.ExpectModel(t, lab, c.Plan, srcs, 9999)
	stopped := 0
	for _, d := range decisions {
		if d.Verdict != "accept" {
			stopped++
		}
	}
	if stopped == 0 || stopped == len(srcs) {
		t.Fatalf("%d of %d sources stopped: the test needs both", stopped, len(srcs))
	}
	expectMonitorCounts(t, lab, c.Plan, decisions)

	// The whole policy in monitor mode, as a trial run of it.
	out, err = run(t, "apply", "--monitor", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rule feed: +0 -0 prefixes (mode enforce → monitor)", "monitor (reject)"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply --monitor's report lacks %q:\n%s", want, out)
		}
	}
	g := &globals{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cm, err := (&policyFlags{policy: pol, stateDir: dir, keepInput: true, monitor: true}).compile(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cm.Plan.Rules {
		if !r.Monitor {
			t.Errorf("--monitor: rule %s enforces", r.Name)
		}
	}
	decisions = pktgentest.Model(cm.Plan, srcs, 9999)
	for i, d := range decisions {
		if d.Verdict != "accept" {
			t.Fatalf("--monitor: the model gives %s %s", srcs[i], d.Verdict)
		}
	}
	pktgentest.Expect(t, lab, srcs, 9999, pktgentest.Passes(decisions), "apply --monitor")
	expectMonitorCounts(t, lab, cm.Plan, decisions)

	// The boot-time restore keeps the trial; an apply ends it.
	out, err = run(t, "apply", "--offline", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil || !strings.Contains(out, "no change against the last apply") || !strings.Contains(out, "monitor (reject)") {
		t.Errorf("apply --offline after --monitor: %v\n%s", err, out)
	}
	out, err = run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil || !strings.Contains(out, "rule feed: +0 -0 prefixes (mode monitor → enforce)") {
		t.Errorf("apply after --monitor: %v\n%s", err, out)
	}
	pktgentest.ExpectModel(t, lab, c.Plan, srcs, 9999)
}

// monitorSources samples the sets of p's rules, boundaries included.
func monitorSources(p *plan.Plan) []netip.Addr {
	r := rand.New(rand.NewPCG(26, 1))
	var srcs []netip.Addr
	for _, rule := range p.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set.IPSet(), 3000)...)
	}
	return append(srcs, netip.MustParseAddr("5.5.5.5"), netip.MustParseAddr("5.5.6.6"), netip.MustParseAddr("2001:db8:5::1"))
}

// expectMonitorCounts checks that the counter of each monitor rule of p
// (freshly loaded, so counting from zero) holds exactly the packets of
// decisions that the rule would have stopped.
func expectMonitorCounts(t *testing.T, lab *netns.Lab, p *plan.Plan, decisions []plan.Decision) {
	t.Helper()
	hit := map[string]string{}
	for i, r := range p.Rules {
		if r.Monitor {
			hit[nft.HitChain(i, r.Name)] = r.Name
		}
	}
	ts, err := nft.StatusChains(context.Background(), p.Table, lab.FW, func(c string) bool { return hit[c] != "" })
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range ts.Chains {
		for _, r := range c.Rules {
			got[hit[c.Name]] += r.Packets
		}
	}
	for _, name := range hit {
		want := uint64(0)
		for _, d := range decisions {
			if slices.Contains(d.Monitored, name) {
				want++
			}
		}
		if want == 0 {
			t.Errorf("rule %s: no packet for it to count", name)
		}
		if got[name] != want {
			t.Errorf("rule %s counted %d packets, want %d (the ones it would have stopped)", name, got[name], want)
		}
	}
}
