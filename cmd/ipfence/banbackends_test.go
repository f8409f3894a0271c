package main

import (
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// TestBanWithoutDaemon bans with `ipfence ban --netns` and no daemon
// (as fail2ban's action does when the daemon is down) after an apply
// with each backend: XDP (whose rules have no chain in the table: the
// ban must not jump to one), ipset (the ban sets), and iptables-split,
// which has no sets and says so. The banned addresses, which the policy
// lets through, are dropped until unbanned; a bystander passes all along;
// the bans survive another apply. Allow entries beat the bans on ipset,
// and are refused on the others (XDP rules run ahead of the table).
func TestBanWithoutDaemon(t *testing.T) {
	for _, backend := range []string{"xdp", "ipset", "iptables-split"} {
		t.Run(backend, func(t *testing.T) {
			lab := netnstest.New(t)
			dir := t.TempDir()
			pol := xdpPolicy(t, dir, backend, lab.FWIf)
			args := []string{"--netns", lab.FW, "--state", dir}
			var pins []string // apply and flush only: bans never touch XDP
			if backend == "xdp" {
				pins = []string{"--pin-dir", netnstest.BPFFS(t)}
			}
			cli := func(verb string, more ...string) (string, error) {
				t.Helper()
				argv := append(append([]string{verb}, more...), args...)
				if verb == "apply" || verb == "flush" {
					argv = append(argv, pins...)
				}
				return run(t, argv...)
			}
			if _, err := cli("apply", "--policy", pol); err != nil {
				t.Fatal(err)
			}
			// Addresses the policy lets through: in the Europe rule's set,
			// outside the feed (one per family, and a bystander).
			c := compileFor(t, pol, dir)
			var europe *plan.Rule
			for _, r := range c.Plan.Rules {
				if r.Name == "europe" {
					europe = r
				}
			}
			var v4, v6 []netip.Addr
			for _, a := range demo.Sample(rand.New(rand.NewPCG(3, 3)), europe.Set.IPSet(), 400) {
				if c.Plan.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: 53}).Rule != "" {
					continue
				}
				if a.Is4() {
					v4 = append(v4, a)
				} else {
					v6 = append(v6, a)
				}
			}
			if len(v4) < 2 || len(v6) < 1 {
				t.Fatalf("too few allowed sources: %v %v", v4, v6)
			}
			srcs := []netip.Addr{v4[0], v6[0], v4[1]} // the last one is the bystander
			check := func(when string, want ...bool) {
				t.Helper()
				pktgentest.Expect(t, lab, srcs, 53, want, when)
			}
			check("before the bans", true, true, true)
			// Allow entries need sets ahead of every rule: refused with
			// XDP rules and on iptables-split, and not stored.
			if backend != "ipset" {
				if out, err := cli("allow", srcs[2].String(), "--socket", ""); err == nil || !strings.Contains(out+err.Error(), "allow entries need") {
					t.Errorf("allow on %s: %v\n%s: want a refusal that says why", backend, err, out)
				}
				if out, err := cli("allows", "--socket", ""); err != nil || strings.Contains(out, srcs[2].String()) {
					t.Errorf("allows after a refused allow: %v\n%s", err, out)
				}
			}

			out, err := cli("ban", srcs[0].String(), srcs[1].String(), "--ttl", "1h", "--reason", "test", "--socket", "")
			if backend == "iptables-split" {
				if err == nil || !strings.Contains(out+err.Error(), "iptables-split has chains only") {
					t.Fatalf("ban on iptables-split: %v\n%s: want a refusal that says why", err, out)
				}
				if out, err := cli("bans", "--socket", ""); err != nil || strings.Contains(out, srcs[0].String()) {
					t.Errorf("bans after a refused ban: %v\n%s", err, out)
				}
				check("after the refused ban", true, true, true)
				return
			}
			if err != nil {
				t.Fatalf("ban: %v\n%s", err, out)
			}
			check("banned", false, false, true)
			if backend == "ipset" {
				// An allow entry beats the ban (IPv4: an address; IPv6:
				// the /64 around the banned address), until removed.
				// And one the policy's rules drop passes too.
				var blocked netip.Addr
				for _, a := range []string{"8.8.8.8", "1.1.1.1", "203.0.113.9", "100.64.0.9"} {
					if c.Plan.Verdict(plan.Packet{Src: netip.MustParseAddr(a), Proto: "udp", DPort: 53}).Verdict != "accept" {
						blocked = netip.MustParseAddr(a)
						break
					}
				}
				if !blocked.IsValid() {
					t.Fatal("no candidate the policy drops")
				}
				pktgentest.Expect(t, lab, []netip.Addr{blocked}, 53, []bool{false}, "dropped by the policy")
				p6 := netip.PrefixFrom(srcs[1], 64).Masked().String()
				if out, err := cli("allow", srcs[0].String(), p6, blocked.String(), "--ttl", "1h", "--socket", ""); err != nil {
					t.Fatalf("allow: %v\n%s", err, out)
				}
				check("banned and allowed", true, true, true)
				pktgentest.Expect(t, lab, []netip.Addr{blocked}, 53, []bool{true}, "dropped by the policy, allowed")
				if _, err := cli("apply", "--policy", pol); err != nil {
					t.Fatal(err)
				}
				check("banned and allowed, after another apply", true, true, true)
				if out, err := cli("unallow", srcs[0].String(), p6, blocked.String(), "--socket", ""); err != nil {
					t.Fatalf("unallow: %v\n%s", err, out)
				}
				check("banned, no longer allowed", false, false, true)
			}

			// Another apply keeps the bans in force.
			if _, err := cli("apply", "--policy", pol); err != nil {
				t.Fatal(err)
			}
			check("banned, after another apply", false, false, true)
			out, err = cli("bans", "--socket", "")
			if err != nil || !strings.Contains(out, srcs[0].String()) || !strings.Contains(out, srcs[1].String()) {
				t.Errorf("bans: %v\n%s", err, out)
			}

			if out, err := cli("unban", srcs[0].String(), srcs[1].String(), "--socket", ""); err != nil {
				t.Fatalf("unban: %v\n%s", err, out)
			}
			check("unbanned", true, true, true)
			if _, err := cli("flush"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBanRecordedHeads checks that a ban without a daemon rewrites the
// base chain from the heads the apply recorded, not from the rules: the
// XDP rules' heads have no family, so no jump to a chain the table does
// not have. (The bug: a direct ban after an XDP apply failed with "no
// such file or directory" for NFT_MSG_NEWRULE.)
func TestBanRecordedHeads(t *testing.T) {
	dir := t.TempDir()
	pol := xdpPolicy(t, dir, "xdp", "eth0")
	c := compileFor(t, pol, dir)
	if len(c.Plan.XDPRules()) != 2 {
		t.Fatalf("%d XDP rules, want 2", len(c.Plan.XDPRules()))
	}
	tgt := (&kernelFlags{stateDir: filepath.Join(dir, "state")}).target()
	if err := tgt.State.SaveApplied("", statedir.Summarize(c.Plan)); err != nil {
		t.Fatal(err)
	}
	a, err := tgt.State.LoadApplied("")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range a.RuleHeads() {
		xdpRule := h.Name == "feeds" || h.Name == "europe"
		if xdpRule && (h.V4 || h.V6) {
			t.Errorf("head %s: ipv4=%v ipv6=%v, want neither (the rule runs in XDP)", h.Name, h.V4, h.V6)
		}
		if h.Name == "ssh" && !(h.V4 && h.V6) {
			t.Errorf("head ssh: ipv4=%v ipv6=%v, want both", h.V4, h.V6)
		}
	}
	if len(a.Heads) != 3 {
		t.Errorf("recorded %d heads, want 3", len(a.Heads))
	}
}
