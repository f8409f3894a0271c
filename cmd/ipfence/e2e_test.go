package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/source"
)

// run executes the CLI with args and returns stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if testing.Verbose() && errb.Len() > 0 {
		t.Logf("stderr: %s", errb.String())
	}
	return out.String(), err
}

func compileFor(t *testing.T, policyFile, stateDir string) *compiled {
	t.Helper()
	g := &globals{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := (&policyFlags{policy: policyFile, stateDir: stateDir}).compile(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkVerdicts sends one UDP packet per source through the lab and
// compares what passed with the plan's model.
func checkVerdicts(t *testing.T, lab *netns.Lab, p *plan.Plan, srcs []netip.Addr) {
	t.Helper()
	const port = 9999
	passed, err := pktgen.Check(lab, srcs, port)
	if err != nil {
		t.Fatal(err)
	}
	bad, v4, v6, dropped := 0, 0, 0, 0
	for i, a := range srcs {
		if a.Is4() {
			v4++
		} else {
			v6++
		}
		want := p.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: port})
		if !passed[i] {
			dropped++
		}
		if passed[i] != (want.Verdict == "accept") {
			if bad++; bad <= 10 {
				t.Errorf("%s: kernel %s, model %+v", a, map[bool]string{true: "passed", false: "dropped"}[passed[i]], want)
			}
		}
	}
	t.Logf("%d sources (%d IPv4, %d IPv6): %d dropped, %d verdicts differ from the model", len(srcs), v4, v6, dropped, bad)
	if v4 == 0 || v6 == 0 || dropped == 0 || dropped == len(srcs) {
		t.Errorf("the sample does not exercise both verdicts and families")
	}
}

// TestApplyEuropeVerdicts applies the "allow only Europe" policy from the
// real country data in a fresh namespace and checks the kernel's verdict
// for tens of thousands of sources against the model.
func TestApplyEuropeVerdicts(t *testing.T) {
	lab := netnstest.New(t)
	stateDir := t.TempDir()
	pol := "../../examples/europe.yaml"
	out, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "rule europe: new") {
		t.Errorf("apply output does not report the new rule:\n%s", out)
	}
	c := compileFor(t, pol, stateDir)
	r := rand.New(rand.NewPCG(7, 7))
	srcs := demo.Sample(r, c.plan.Rules[0].Set, 24000)
	checkVerdicts(t, lab, c.plan, srcs)

	// Applying again changes nothing and says so.
	out, err = run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", stateDir)
	if err != nil || !strings.Contains(out, "no change") {
		t.Errorf("re-apply: %v\n%s", err, out)
	}
	out, err = run(t, "status", "--netns", lab.FW, "--state", stateDir)
	if err != nil || !strings.Contains(out, "table inet ipfence loaded") {
		t.Errorf("status: %v\n%s", err, out)
	}
	out, err = run(t, "flush", "--netns", lab.FW, "--state", stateDir)
	if err != nil || !strings.Contains(out, "removed") {
		t.Errorf("flush: %v\n%s", err, out)
	}
	if out, _ := netns.Exec(lab.FW, "nft", "list", "tables"); strings.Contains(string(out), "ipfence") {
		t.Errorf("table still there after flush: %s", out)
	}
}

// TestApplyRulesVerdicts covers every action, ports, protected prefixes
// and a feed with a protected entry, v4 and v6.
func TestApplyRulesVerdicts(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "drop.txt", "# feed\n1.0.0.0/8\n9.9.9.9\n100.64.0.0-100.64.3.255\n2001:db8::/32\n2c0f::/16\n203.0.113.0/24\n")
	write(t, dir, "allow.txt", "1.2.3.0/24\n2001:db8:5::/48\n")
	write(t, dir, "p.yaml", `
sources:
  drop:  {format: list, paths: [drop.txt]}
  allow: {format: list, paths: [allow.txt]}
  geo:   {format: country-csv, paths: ["builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"]}
protect: [203.0.113.7, 198.18.0.0/15, 2001:2::/48]
rules:
  - {name: allow, action: accept, match: {source: allow}}
  - {name: feeds, action: drop, match: {source: drop}}
  - {name: ssh,   action: allow-only, match: {source: geo, countries: [IT]}, ports: [udp/9999]}
  - {name: rej,   action: reject, match: {source: geo, countries: [BR, AU]}}
`)
	pol := filepath.Join(dir, "p.yaml")
	if _, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	c := compileFor(t, pol, dir)
	r := rand.New(rand.NewPCG(8, 8))
	var srcs []netip.Addr
	for _, rule := range c.plan.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set, 6000)...)
	}
	for _, s := range []string{"203.0.113.7", "203.0.113.8", "1.2.3.4", "1.2.4.4", "9.9.9.9", "2001:db8:5::1", "2001:db8:6::1"} {
		srcs = append(srcs, netip.MustParseAddr(s))
	}
	checkVerdicts(t, lab, c.plan, srcs)
}

// TestApplyBadInputKeepsKernel: bad input fails with a clear error and the
// kernel keeps exactly the ruleset it had.
func TestApplyBadInputKeepsKernel(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "feed.txt", "192.0.2.0/24\n2001:db8::/48\n")
	write(t, dir, "p.yaml", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	pol := filepath.Join(dir, "p.yaml")
	if _, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	before, err := netns.Exec(lab.FW, "nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, feed, policy string
		want               string
		is                 error
	}{
		{"malformed line", "192.0.2.0/24\n192.0.2.300\n", "", "feed.txt:2", nil},
		{"missing file", "", "sources:\n  f: {format: list, paths: [nope.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n", "nope.txt", nil},
		{"everything", "0.0.0.0/0\n", "", "0.0.0.0/0", plan.ErrBlocksEverything},
		{"own address", "198.18.0.0/24\n", "", "198.18.0.1", ErrBlocksOwnAddress},
		{"unknown country", "", "sources:\n  g: {format: country-csv, paths: [\"builtin:country-ipv4.csv.gz\"]}\nrules:\n  - {name: f, action: drop, match: {source: g, countries: [XX1]}}\n", "XX1", nil},
		{"bad policy", "", "rules:\n  - {name: f, action: dorp, match: {prefixes: [1.2.3.4]}}\n", "p2.yaml:2", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			feed := tc.feed
			if feed == "" {
				feed = "192.0.2.0/24\n"
			}
			write(t, d, "feed.txt", feed)
			p := tc.policy
			if p == "" {
				p = "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n"
			}
			write(t, d, "p2.yaml", p)
			_, err := run(t, "apply", "--policy", filepath.Join(d, "p2.yaml"), "--netns", lab.FW, "--state", dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
			after, _ := netns.Exec(lab.FW, "nft", "list", "ruleset")
			if !bytes.Equal(before, after) {
				t.Errorf("the kernel ruleset changed:\n%s", after)
			}
		})
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestApplyShrinkKeepsKernel: a feed that lost most of its entries since
// the last good apply is refused and the kernel keeps the old set.
func TestApplyShrinkKeepsKernel(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	var feed strings.Builder
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&feed, "192.0.%d.0/25\n", 2*i)
	}
	write(t, dir, "feed.txt", feed.String())
	write(t, dir, "p.yaml", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	pol := filepath.Join(dir, "p.yaml")
	if _, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	before, _ := netns.Exec(lab.FW, "nft", "list", "ruleset")
	write(t, dir, "feed.txt", "192.0.0.0/25\n")
	_, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	var se *source.ShrinkError
	if !errors.As(err, &se) {
		t.Fatalf("error %v, want a *source.ShrinkError", err)
	}
	if after, _ := netns.Exec(lab.FW, "nft", "list", "ruleset"); !bytes.Equal(before, after) {
		t.Errorf("the kernel ruleset changed:\n%s", after)
	}
	// With the gate off (max_shrink: 0) the operator can apply it.
	write(t, dir, "p.yaml", "sources:\n  f: {format: list, paths: [feed.txt], max_shrink: 0}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	out, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil || !strings.Contains(out, "-19 prefixes") {
		t.Errorf("apply with the gate off: %v\n%s", err, out)
	}
}
