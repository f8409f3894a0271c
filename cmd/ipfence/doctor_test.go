package main

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// hostFirewall is the host's firewall as the nft, iptables and ipset
// commands list it (read only).
func hostFirewall(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, argv := range [][]string{{"nft", "list", "ruleset"}, {"iptables-save"}, {"ip6tables-save"}, {"ipset", "list", "-n"}} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, out)
		}
		// iptables-save stamps its output with the time; the host's
		// traffic moves its counters and nft's.
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(line, "#") {
				b.WriteString(counters.ReplaceAllString(line, "") + "\n")
			}
		}
	}
	return b.String()
}

// counters matches the packet counters in iptables-save's chain lines
// ("[12:960]") and nft's counter statements.
var counters = regexp.MustCompile(`\[\d+:\d+\]|packets \d+ bytes \d+`)

// TestDoctor runs `ipfence doctor` on this host, where CI installs every
// backend's tools: each probe succeeds, and the host's firewall and
// namespaces are as they were.
func TestDoctor(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft", "iptables-save", "ip6tables-save", "ipset")
	before := hostFirewall(t)
	out, err := run(t, "doctor", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]doctor.Check{"nftables": r.NFTables, "nft": r.Nft, "iptables": r.IPTables.Check,
		"ip6tables": r.IP6, "ipset": r.IPSet, "xdp": r.XDP.Check} {
		if !c.OK || c.Detail == "" {
			t.Errorf("%s: %+v, want ok", name, c)
		}
	}
	if r.Kernel == "" || r.Nft.Version == "" || r.IPSet.Version == "" || !r.XDP.Native || !r.IPTables.Restore ||
		!slices.Contains(r.IPTables.Installed, r.IPTables.Flavour) || !slices.ContainsFunc(r.XDP.Interfaces, func(i doctor.Interface) bool { return i.Name == "lo" }) {
		t.Errorf("report %+v", r)
	}
	if after := hostFirewall(t); after != before {
		t.Errorf("doctor changed the host's firewall:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Other packages' tests make namespaces meanwhile: look for doctor's.
	ns, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v\n%s", err, ns)
	}
	if strings.Contains(string(ns), "doctor") {
		t.Errorf("doctor left its scratch namespace: %s", ns)
	}
	text, err := run(t, "doctor")
	if err != nil || !strings.Contains(text, "nftables   ok") || !strings.Contains(text, "interfaces ") {
		t.Errorf("doctor text: %v\n%s", err, text)
	}
}
