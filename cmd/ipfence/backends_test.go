package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
)

// TestBackendsDifferential applies one policy (every action, ports, a
// per-port allow-list with reject, both families, real country data)
// with the nftables, ipset and iptables-split backends in three
// namespaces, sends the same 20k+ sources to each, and requires
// identical verdicts, equal to the model's, and identical explain
// answers. Then it applies the policy with another backend over each
// (switching backends leaves nothing of the old one) and flushes.
func TestBackendsDifferential(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "drop.txt", "# feed\n1.0.0.0/8\n9.9.9.9\n100.64.0.0-100.64.3.255\n2001:db8::/32\n2c0f::/16\n203.0.113.0/24\n")
	write(t, dir, "allow.txt", "1.2.3.0/24\n2001:db8:5::/48\n")
	write(t, dir, "clients.txt", "151.0.0.0/10\n2a01:e00::/26\n")
	write(t, dir, "p.yaml", `
sources:
  drop:    {format: list, paths: [drop.txt]}
  allow:   {format: list, paths: [allow.txt]}
  clients: {format: list, paths: [clients.txt]}
  geo:     {format: country-csv, paths: ["builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"]}
protect: [203.0.113.7, 198.18.0.0/15, 2001:2::/48]
rules:
  - {name: allow,   action: accept, match: {source: allow}}
  - {name: feeds,   action: drop, match: {source: drop}}
  - {name: port9000, action: allow-only, otherwise: reject, match: {source: clients}, ports: [udp/9000]}
  - {name: ssh,     action: allow-only, match: {source: geo, countries: [IT]}, ports: [udp/9999]}
  - {name: rej,     action: reject, match: {source: geo, countries: [BR, AU]}}
`)
	pol := filepath.Join(dir, "p.yaml")
	backends := []string{"nftables", "ipset", "iptables-split"}
	labs := make([]*netns.Lab, len(backends))
	for i, b := range backends {
		labs[i] = netnstest.New(t)
		out, err := run(t, "apply", "--policy", pol, "--netns", labs[i].FW, "--state", filepath.Join(dir, b), "--backend", b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !strings.Contains(out, b) && b != "nftables" {
			t.Errorf("%s: apply does not name the backend:\n%s", b, out)
		}
	}
	c := compileFor(t, pol, dir)
	r := rand.New(rand.NewPCG(11, 11))
	var srcs []netip.Addr
	for _, rule := range c.Plan.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set.IPSet(), 6000)...)
	}
	if len(srcs) < 20000 {
		t.Fatalf("only %d sources", len(srcs))
	}
	for _, port := range []uint16{9000, 9999, 53} {
		first := pktgentest.Send(t, labs[0], srcs, port)
		for i, lab := range labs[1:] {
			pktgentest.Expect(t, lab, srcs, port, first, fmt.Sprintf("port %d, %s against nftables", port, backends[i+1]))
		}
		t.Logf("port %d: %d sources, identical verdicts in %v", port, len(srcs), backends)
	}
	// And the model agrees (the ipset namespace's, which the others
	// equal).
	pktgentest.ExpectModel(t, labs[1], c.Plan, srcs[:20000], 9999)

	for _, a := range []string{"1.2.3.4", "9.9.9.9", "151.1.1.1", "8.8.8.8", "2001:db8:5::1", "2c0f::1", "200.1.1.1"} {
		var first string
		for i, b := range backends {
			out, err := run(t, "explain", "--policy", pol, "--state", dir, "--backend", b, "--port", "udp/9000", a)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = out
			} else if out != first {
				t.Errorf("explain %s: %s says\n%s\nnftables says\n%s", a, b, out, first)
			}
		}
	}

	// Switch every namespace to the next backend, then flush.
	for i, lab := range labs {
		next := backends[(i+1)%len(backends)]
		state := filepath.Join(dir, backends[i])
		if _, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", state, "--backend", next); err != nil {
			t.Fatalf("%s → %s: %v", backends[i], next, err)
		}
		pktgentest.ExpectModel(t, lab, c.Plan, srcs[:6000], 9999)
		// What the old backend loaded is gone.
		gone := map[string][]string{"nftables": {"nft", "list", "tables"}, "ipset": {"ipset", "list", "-n"}, "iptables-split": {"iptables-save", "-t", "raw"}}[backends[i]]
		if out := netnstest.Exec(t, lab.FW, gone...); strings.Contains(out, "ipfence") {
			t.Errorf("%s → %s: %v still lists ipfence's:\n%s", backends[i], next, gone, out)
		}
		if _, err := run(t, "flush", "--netns", lab.FW, "--state", state); err != nil {
			t.Fatal(err)
		}
		for _, argv := range [][]string{{"nft", "list", "ruleset"}, {"iptables-save"}, {"ip6tables-save"}, {"ipset", "list", "-n"}} {
			if out := netnstest.Exec(t, lab.FW, argv...); strings.Contains(out, "ipfence") {
				t.Errorf("%s → %s: %v after flush:\n%s", backends[i], next, argv, out)
			}
		}
	}
}
