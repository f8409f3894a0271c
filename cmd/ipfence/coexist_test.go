package main

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
)

// othersNft is what firewalld (1.3, nftables backend, a public zone that
// opens udp/9999) and kube-proxy (nftables mode) load.
const othersNft = `table inet firewalld {
	chain raw_PREROUTING { type filter hook prerouting priority raw + 10; policy accept; }
	chain mangle_PREROUTING { type filter hook prerouting priority mangle + 10; policy accept; }
	chain nat_PREROUTING { type nat hook prerouting priority dstnat + 10; policy accept; }
	chain filter_INPUT {
		type filter hook input priority filter + 10; policy accept;
		ct state { established, related } accept
		ct state invalid drop
		iifname "lo" accept
		jump filter_INPUT_ZONES
		reject with icmpx admin-prohibited
	}
	chain filter_INPUT_ZONES { goto filter_IN_public; }
	chain filter_IN_public {
		tcp dport 22 accept
		udp dport 9999 accept
		meta l4proto { icmp, ipv6-icmp } accept
	}
}
table ip kube-proxy {
	map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
	chain filter-prerouting { type filter hook prerouting priority dstnat - 10; policy accept; ct state new jump firewall-check; }
	chain firewall-check { }
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
	chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }
}
`

// dockerRules are Docker's chains (iptables-nft), ufwRules ufw's
// (iptables-legacy).
const dockerRules = `*filter
:DOCKER - [0:0]
:DOCKER-USER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A DOCKER-USER -j RETURN
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
COMMIT
*nat
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A DOCKER -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80
COMMIT
`

const ufwRules = `*filter
:ufw-before-input - [0:0]
:ufw-user-input - [0:0]
-A INPUT -j ufw-before-input
-A ufw-before-input -j ufw-user-input
-A ufw-user-input -p tcp --dport 22 -j ACCEPT
COMMIT
`

// othersRuleset is the other managers' part of the namespace's ruleset:
// their nft tables, and the filter and nat tables of both iptables
// flavours without ipfence's own chains and jumps.
func othersRuleset(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, argv := range [][]string{{"nft", "list", "table", "inet", "firewalld"}, {"nft", "list", "table", "ip", "kube-proxy"}} {
		out, err := netns.Exec(ns, argv...)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(counters.ReplaceAllString(string(out), ""))
	}
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := netns.Exec(ns, save)
		if err != nil {
			t.Fatal(err)
		}
		keep := false
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "*") {
				keep = line == "*filter" || line == "*nat"
			}
			if keep && !strings.HasPrefix(line, "#") && !strings.Contains(line, "ipfence") {
				b.WriteString(save + ": " + counters.ReplaceAllString(line, "") + "\n")
			}
		}
	}
	return b.String()
}

// TestCoexistence loads what firewalld, kube-proxy, Docker and ufw load
// into a namespace, then runs ipfence's apply (nftables, and ipset with
// both iptables flavours) and flush there: the others' tables and chains
// are as they were after each step; ipfence's drops happen with their
// rules in place (their accept does not undo them); and firewalld's
// reload leaves ipfence's table alone. Doctor names each manager.
func TestCoexistence(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "others.nft", othersNft)
	if out, err := netns.Exec(lab.FW, "nft", "-f", filepath.Join(dir, "others.nft")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, l := range []struct{ restore, rules string }{{"iptables-nft-restore", dockerRules}, {"iptables-legacy-restore", ufwRules}} {
		write(t, dir, "rules", l.rules)
		if out, err := netns.Exec(lab.FW, "sh", "-c", l.restore+" --noflush < "+filepath.Join(dir, "rules")); err != nil {
			t.Fatalf("%s: %v\n%s", l.restore, err, out)
		}
	}
	before := othersRuleset(t, lab.FW)
	write(t, dir, "feed.txt", "192.0.2.0/24\n2001:db8:bad::/48\n")
	write(t, dir, "p.yaml", "sources:\n  feed: {format: list, paths: [feed.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	pol := filepath.Join(dir, "p.yaml")
	srcs := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8:bad::1"),
		netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")}
	expect := func(when string, pass ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 9999, pass, when)
	}
	unchanged := func(when string) {
		t.Helper()
		if after := othersRuleset(t, lab.FW); after != before {
			t.Errorf("%s changed the other managers' rules:\nbefore:\n%s\nafter:\n%s", when, before, after)
		}
	}
	cli := func(args ...string) {
		t.Helper()
		if _, err := run(t, append(args, "--netns", lab.FW, "--state", dir)...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	expect("the others alone", true, true, true, true)

	cli("apply", "--policy", pol)
	unchanged("apply")
	expect("nftables", false, false, true, true)
	table := func() string {
		out, err := netns.Exec(lab.FW, "nft", "list", "table", "inet", "ipfence")
		if err != nil {
			t.Fatal(err)
		}
		return counters.ReplaceAllString(string(out), "")
	}
	ours := table()
	// firewall-cmd --reload: firewalld's table replaced in one transaction.
	write(t, dir, "reload.nft", "delete table inet firewalld\n"+othersNft[:strings.Index(othersNft, "table ip kube-proxy")])
	if out, err := netns.Exec(lab.FW, "nft", "-f", filepath.Join(dir, "reload.nft")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := table(); got != ours {
		t.Errorf("firewalld's reload changed ipfence's table:\nbefore:\n%s\nafter:\n%s", ours, got)
	}
	expect("after firewalld's reload", false, false, true, true)
	cli("flush")
	unchanged("flush")

	for _, flavour := range []string{"nft", "legacy"} {
		cli("apply", "--policy", pol, "--backend", "ipset", "--iptables", flavour)
		unchanged("apply --backend ipset --iptables " + flavour)
		expect("ipset, iptables "+flavour, false, false, true, true)
		cli("flush")
		unchanged("flush of iptables " + flavour)
	}
	expect("flushed", true, true, true, true)

	out, err := run(t, "doctor", "--netns", lab.FW, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range r.Managers {
		names = append(names, m.Name)
		if m.Warn {
			t.Errorf("doctor warns about %+v", m)
		}
	}
	for _, want := range []string{"firewalld", "docker", "kube-proxy", "ufw"} {
		if !slices.Contains(names, want) {
			t.Errorf("doctor names %q, not %s", names, want)
		}
	}
	if testing.Verbose() {
		text, _ := run(t, "doctor", "--netns", lab.FW)
		os.Stderr.WriteString(text)
	}
}
