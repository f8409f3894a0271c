package main

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
)

// TestAllowEntries runs `ipfence allow` in a lab namespace against a
// policy with a stateless drop rule, a connection-aware drop rule and an
// allow-only rule, and bans: an allow entry lets its packets in whatever
// stops them otherwise, a single address or a prefix inside a blocked
// or banned one (IPv4 and IPv6, the IPv6 one a /48 inside a dropped /32:
// one element, not a complement); its neighbours stay blocked. An entry
// whose TTL is extended before it runs out passes after the first TTL;
// one left to run out is blocked again; unallow removes one; a full
// apply keeps them; with none left, no chain looks the allow sets up.
func TestAllowEntries(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "edge.txt", "100.64.0.0/16\n")
	write(t, dir, "feed.txt", "203.0.113.0/24\n2001:db8::/32\n")
	write(t, dir, "only.txt", "100.0.0.0/8\n203.0.0.0/8\n2001:db8::/32\n2001:db9::/32\n")
	write(t, dir, "p.yaml", "sources:\n"+
		"  edge: {format: list, paths: [edge.txt]}\n  feed: {format: list, paths: [feed.txt]}\n  only: {format: list, paths: [only.txt]}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n"+
		"  - {name: edge, action: drop, stateless: true, match: {source: edge}}\n"+
		"  - {name: feed, action: drop, match: {source: feed}}\n"+
		"  - {name: only, action: allow-only, match: {source: only}}\n")
	pol := filepath.Join(dir, "p.yaml")
	cli := func(args ...string) string {
		t.Helper()
		out, err := run(t, append(args, "--netns", lab.FW, "--state", dir)...)
		if err != nil {
			t.Fatalf("ipfence %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	cli("apply", "--policy", pol)
	if out := netnstest.Ruleset(t, lab.FW); strings.Contains(out, "@allow") {
		t.Errorf("a chain looks the empty allow sets up:\n%s", out)
	}
	srcs := []netip.Addr{
		netip.MustParseAddr("203.0.113.7"),   // 0: the feed: allowed (an address)
		netip.MustParseAddr("203.0.113.8"),   // 1: its neighbour
		netip.MustParseAddr("100.64.5.9"),    // 2: the stateless rule: allowed (its /24)
		netip.MustParseAddr("100.64.6.9"),    // 3: outside that /24
		netip.MustParseAddr("2001:db8:1::5"), // 4: the feed, IPv6: allowed (its /48)
		netip.MustParseAddr("2001:db8:2::5"), // 5: outside that /48
		netip.MustParseAddr("192.0.2.44"),    // 6: not in only: allowed (an address, for 4s)
		netip.MustParseAddr("192.0.2.45"),    // 7: its neighbour
		netip.MustParseAddr("100.1.2.3"),     // 8: banned /16: allowed (an address, for 4s, extended)
		netip.MustParseAddr("100.1.2.4"),     // 9: banned, not allowed
		netip.MustParseAddr("2001:db9::7"),   // 10: banned, IPv6: allowed (an address)
	}
	expect := func(when string, pass ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 9999, pass, when)
	}
	cli("ban", "100.1.0.0/16", "2001:db9::7", "--ttl", "1h")
	expect("blocked", false, false, false, false, false, false, false, false, false, false, false)

	cli("allow", "203.0.113.7", "100.64.5.0/24", "2001:db8:1::/48", "2001:db9::7", "--ttl", "1h", "--reason", "vendor")
	cli("allow", "192.0.2.44", "100.1.2.3", "--ttl", "4s")
	expect("allowed", true, false, true, false, true, false, true, false, true, false, true)
	rs := netnstest.Ruleset(t, lab.FW)
	for _, chain := range []string{nft.BaseChainName, nft.ConnChainName} {
		i := strings.Index(rs, "chain "+chain+" {")
		if i < 0 {
			t.Fatalf("no chain %s:\n%s", chain, rs)
		}
		if body := rs[i:]; !strings.Contains(body[:strings.Index(body, "}")], "@"+nft.AllowAddrs4+" accept") {
			t.Errorf("chain %s does not look the allowed addresses up:\n%s", chain, rs)
		}
	}

	// Bans that fill an empty ban set (and empty it again) rewrite the
	// chain before conntrack: the allow lookups stay first.
	cli("ban", "203.0.113.7", "2001:db8:1::/64", "--ttl", "1h")
	expect("allowed, and banned too", true, false, true, false, true, false, true, false, true, false, true)
	cli("unban", "203.0.113.7", "2001:db8:1::/64")
	expect("allowed, unbanned", true, false, true, false, true, false, true, false, true, false, true)

	// Extended before it runs out: passes after the first TTL; the
	// other 4s entry runs out and its address is blocked again.
	cli("allow", "100.1.2.3", "--ttl", "1h")
	time.Sleep(4500 * time.Millisecond)
	expect("one entry extended, one run out", true, false, true, false, true, false, false, false, true, false, true)

	var list struct {
		Allows []struct {
			Prefix string `json:"prefix"`
			Reason string `json:"reason"`
		} `json:"allows"`
		Total int `json:"total"`
	}
	if err := json.Unmarshal([]byte(cli("allows", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if list.Total != 5 {
		t.Errorf("allows lists %d entries, want 5: %+v", list.Total, list.Allows)
	}

	// A full load keeps them; unallow removes one.
	cli("apply", "--policy", pol)
	cli("unallow", "203.0.113.7")
	expect("reapplied, one removed", false, false, true, false, true, false, false, false, true, false, true)

	cli("unallow", "100.64.5.0/24", "2001:db8:1::/48", "2001:db9::7", "100.1.2.3")
	if out := netnstest.Ruleset(t, lab.FW); strings.Contains(out, "@allow") {
		t.Errorf("with no allow entry left, a chain still looks the allow sets up:\n%s", out)
	}
	expect("none left", false, false, false, false, false, false, false, false, false, false, false)
}
