package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/source"
)

// run executes the CLI with args and returns stdout.
func run(t testing.TB, args ...string) (string, error) {
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

func compileFor(t testing.TB, policyFile, stateDir string) *compiled {
	t.Helper()
	g := &globals{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := (&policyFlags{policy: policyFile, stateDir: stateDir, keepInput: true}).compile(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	return c
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
	srcs := demo.Sample(r, c.Plan.Rules[0].Set.IPSet(), 24000)
	pktgentest.ExpectModel(t, lab, c.Plan, srcs, 9999)

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
	if out := netnstest.Exec(t, lab.FW, "nft", "list", "tables"); strings.Contains(out, "ipfence") {
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
	for _, rule := range c.Plan.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set.IPSet(), 6000)...)
	}
	for _, s := range []string{"203.0.113.7", "203.0.113.8", "1.2.3.4", "1.2.4.4", "9.9.9.9", "2001:db8:5::1", "2001:db8:6::1"} {
		srcs = append(srcs, netip.MustParseAddr(s))
	}
	pktgentest.ExpectModel(t, lab, c.Plan, srcs, 9999)
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
	before := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset")
	for _, tc := range []struct {
		name, feed, policy string
		want               string
		is                 error
	}{
		{"malformed line", "192.0.2.0/24\n192.0.2.300\n", "", "feed.txt:2", nil},
		{"missing file", "", "sources:\n  f: {format: list, paths: [nope.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n", "nope.txt", nil},
		{"everything", "0.0.0.0/0\n", "sources:\n  f: {format: list, paths: [feed.txt], allow_broad: true}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n", "0.0.0.0/0", plan.ErrBlocksEverything},
		{"broad feed", "192.0.2.0/24\n128.0.0.0/3\n", "", "feed.txt:2: 128.0.0.0/3 is broader than /8", nil},
		{"too many entries", "192.0.2.1\n192.0.2.3\n192.0.2.5\n", "sources:\n  f: {format: list, paths: [feed.txt], max_entries: 2}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n", "more than 2 entries", nil},
		{"own address", "198.18.0.0/24\n", "", "198.18.0.1", hostaddr.ErrBlocksOwnAddress},
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
			if after := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset"); after != before {
				t.Errorf("the kernel ruleset changed:\n%s", after)
			}
		})
	}
}

func write(t testing.TB, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeFeedPolicy writes into dir a feed of 20 prefixes and a policy
// dropping it, and returns the policy's path.
func writeFeedPolicy(t *testing.T, dir string) string {
	t.Helper()
	var feed strings.Builder
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&feed, "192.0.%d.0/25\n", 2*i)
	}
	write(t, dir, "feed.txt", feed.String())
	write(t, dir, "p.yaml", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	return filepath.Join(dir, "p.yaml")
}

// TestApplyShrinkKeepsKernel: a feed that lost most of its entries since
// the last good apply is refused and the kernel keeps the old set.
func TestApplyShrinkKeepsKernel(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	pol := writeFeedPolicy(t, dir)
	if _, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	before := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset")
	write(t, dir, "feed.txt", "192.0.0.0/25\n")
	_, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	var se *source.ShrinkError
	if !errors.As(err, &se) {
		t.Fatalf("error %v, want a *source.ShrinkError", err)
	}
	if after := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset"); after != before {
		t.Errorf("the kernel ruleset changed:\n%s", after)
	}
	// With the gate off (max_shrink: 0) the operator can apply it.
	write(t, dir, "p.yaml", "sources:\n  f: {format: list, paths: [feed.txt], max_shrink: 0}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	out, err := run(t, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir)
	if err != nil || !strings.Contains(out, "-19 prefixes") {
		t.Errorf("apply with the gate off: %v\n%s", err, out)
	}
}

// TestSourceStatePerNamespace: the shrink gate of one namespace does not
// refuse a policy applied in another (sources' state is per namespace).
func TestSourceStatePerNamespace(t *testing.T) {
	a, b := netnstest.New(t), netnstest.New(t)
	dir := t.TempDir()
	pol := writeFeedPolicy(t, dir)
	if _, err := run(t, "apply", "--policy", pol, "--netns", a.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "feed.txt", "192.0.0.0/25\n")
	if _, err := run(t, "apply", "--policy", pol, "--netns", b.FW, "--state", dir); err != nil {
		t.Errorf("namespace B after a bigger load in A: %v", err)
	}
	var se *source.ShrinkError
	if _, err := run(t, "apply", "--policy", pol, "--netns", a.FW, "--state", dir); !errors.As(err, &se) {
		t.Errorf("namespace A again: %v, want its own shrink gate", err)
	}
}

// TestForeignTablesUntouched: a flush or a policy naming another
// manager's table is refused (ErrTableName), and so is one naming a
// table of a name ipfence accepts that ipfence did not make
// (nft.ErrNotOwned: it has no mark); those tables stay.
func TestForeignTablesUntouched(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	netnstest.Exec(t, lab.FW, "nft", "add table inet filter; add chain inet filter input { type filter hook input priority 0; policy accept; }")
	netnstest.Exec(t, lab.FW, "nft", "add table ip DOCKER-USER")
	netnstest.Exec(t, lab.FW, "nft", "add table inet mytable; add chain inet mytable input { type filter hook input priority 0; policy accept; }; add rule inet mytable input tcp dport 22 accept")
	before := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset")
	for _, tc := range []struct {
		table string
		want  error
	}{{"filter", plan.ErrTableName}, {"DOCKER", plan.ErrTableName}, {"ufw", plan.ErrTableName}, {"mytable", nft.ErrNotOwned}} {
		table := tc.table
		if _, err := run(t, "flush", "--table", table, "--netns", lab.FW, "--state", dir); !errors.Is(err, tc.want) {
			t.Errorf("flush --table %s: %v, want %v", table, err, tc.want)
		}
		write(t, dir, "p.yaml", "table: "+table+"\nrules:\n  - {name: f, action: drop, match: {prefixes: [192.0.2.0/24]}}\n")
		if _, err := run(t, "apply", "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW, "--state", dir); !errors.Is(err, tc.want) {
			t.Errorf("apply with table %s: %v, want %v", table, err, tc.want)
		}
	}
	if after := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset"); after != before {
		t.Errorf("the namespace's tables changed:\n%s", after)
	}
}

// TestTableRenamed: a policy that renames ipfence's table leaves no
// table of the old name enforcing the last apply's rules.
func TestTableRenamed(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	for _, table := range []string{"ipf_one", "ipf_two"} {
		write(t, dir, "p.yaml", "table: "+table+"\nrules:\n  - {name: f, action: drop, match: {prefixes: [192.0.2.0/24]}}\n")
		if _, err := run(t, "apply", "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW, "--state", dir); err != nil {
			t.Fatal(err)
		}
	}
	if tables := netnstest.Exec(t, lab.FW, "nft", "list", "tables"); strings.TrimSpace(tables) != "table inet ipf_two" {
		t.Errorf("tables after the rename:\n%s", tables)
	}
}

// TestLoopbackAndNeighbourDiscoveryPass: no rule blocks loopback traffic
// or IPv6 neighbour discovery, even from sources the rule blocks (UDP
// from the same sources through the veth is dropped and counted).
func TestLoopbackAndNeighbourDiscoveryPass(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "allow.txt", "203.0.113.0/24\n2001:db8::/32\n")
	write(t, dir, "p.yaml", "sources:\n  a: {format: list, paths: [allow.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: only, action: allow-only, match: {source: a}}\n")
	if _, err := run(t, "apply", "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	dropped := func() uint64 {
		t.Helper()
		st, err := nft.Status(context.Background(), "ipfence", lab.FW)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range st.Chains {
			for _, r := range c.Rules {
				n += r.Packets
			}
		}
		return n
	}
	blocked4, blocked6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2a00:1::2")
	fw6 := lab.FWAddr6.Addr()
	solicited := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: fw6.As16()[13], 14: fw6.As16()[14], 15: fw6.As16()[15]})
	ns, err := pktgen.AppendNeighborSolicit(nil, &pktgen.Header{SrcMAC: lab.GenMAC,
		DstMAC: net.HardwareAddr{0x33, 0x33, 0xff, fw6.As16()[13], fw6.As16()[14], fw6.As16()[15]},
		Src:    blocked6, Dst: solicited}, fw6)
	if err != nil {
		t.Fatal(err)
	}
	udp := func(h pktgen.Header) []byte {
		h.SrcPort, h.DstPort = 40000, 9
		f, err := pktgen.AppendUDP(nil, &h, 1, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	send := func(frames ...[]byte) {
		t.Helper()
		s, err := pktgen.NewSender(lab)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.Load(frames)
		if _, err := s.Send(10 * len(frames)); err != nil {
			t.Fatal(err)
		}
	}

	send(ns)
	if n := dropped(); n != 0 {
		t.Errorf("neighbour solicitations from %s: %d packets reached a counter, want 0", blocked6, n)
	}
	sendOnLoopback(t, lab,
		udp(pktgen.Header{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6), Src: blocked4, Dst: netip.MustParseAddr("127.0.0.1")}),
		udp(pktgen.Header{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6), Src: blocked6, Dst: netip.IPv6Loopback()}))
	if n := dropped(); n != 0 {
		t.Errorf("loopback datagrams from blocked sources: %d packets reached a counter, want 0", n)
	}
	// The control: the same sources through the veth are dropped.
	send(udp(pktgen.Header{SrcMAC: lab.GenMAC, DstMAC: lab.FWMAC, Src: blocked4, Dst: lab.FWAddr4.Addr()}),
		udp(pktgen.Header{SrcMAC: lab.GenMAC, DstMAC: lab.FWMAC, Src: blocked6, Dst: fw6}))
	if n := dropped(); n != 20 {
		t.Errorf("UDP from blocked sources through the veth: %d dropped, want 20", n)
	}
}

// sendOnLoopback writes each frame 10 times to fw's loopback interface
// through an AF_PACKET socket in fw.
func sendOnLoopback(t *testing.T, lab *netns.Lab, frames ...[]byte) {
	t.Helper()
	err := lab.DoFW(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: lo.Index}); err != nil {
			return err
		}
		for range 10 {
			for _, f := range frames {
				if _, err := unix.Write(fd, f); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("sending on fw's loopback: %v", err)
	}
}

// TestBans: bans drop on top of the policy, survive a new apply, expire
// in the kernel, lift, and never reach protected networks, own addresses
// or the policy's leading allowlist.
func TestBans(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	write(t, dir, "allow.txt", "203.0.113.0/28\n")
	write(t, dir, "feed.txt", "192.0.2.0/24\n2001:db8:1::/48\n")
	write(t, dir, "p.yaml", "sources:\n  allow: {format: list, paths: [allow.txt]}\n  feed: {format: list, paths: [feed.txt]}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n"+
		"  - {name: partners, action: accept, match: {source: allow}}\n"+
		"  - {name: feed, action: drop, match: {source: feed}}\n")
	pol := filepath.Join(dir, "p.yaml")
	cli := func(args ...string) (string, error) {
		return run(t, append(args, "--netns", lab.FW, "--state", dir)...)
	}
	if _, err := cli("apply", "--policy", pol); err != nil {
		t.Fatal(err)
	}
	srcs := []netip.Addr{
		netip.MustParseAddr("203.0.113.9"),    // 0: allowlisted, banned below: passes
		netip.MustParseAddr("100.64.1.1"),     // 1: inside a banned /10
		netip.MustParseAddr("100.128.0.1"),    // 2: just outside it
		netip.MustParseAddr("198.51.100.7"),   // 3: banned address
		netip.MustParseAddr("198.51.100.8"),   // 4: its neighbour
		netip.MustParseAddr("2001:db8:ff::1"), // 5: inside a banned /48
		netip.MustParseAddr("2001:db8:fe::1"), // 6: outside
		netip.MustParseAddr("192.0.2.1"),      // 7: the feed
		netip.MustParseAddr("198.51.100.9"),   // 8: banned for 1s
	}
	expect := func(when string, pass ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 9999, pass, when)
	}
	expect("before bans", true, true, true, true, true, true, true, false, true)
	if _, err := cli("ban", "203.0.113.9", "100.64.0.0/10", "198.51.100.7", "2001:db8:ff::/48", "--ttl", "1h", "--reason", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli("ban", "198.51.100.9", "--ttl", "1s"); err != nil {
		t.Fatal(err)
	}
	expect("banned", true, false, true, false, true, false, true, false, false)
	if out := netnstest.Ruleset(t, lab.FW); !strings.Contains(out, "chain prerouting {") {
		t.Errorf("no base chain before conntrack with bans in force:\n%s", out)
	}
	out, err := cli("bans", "--json")
	var listed struct {
		Bans  []ban.Ban `json:"bans"`
		Total int       `json:"total"`
	}
	if err == nil {
		err = json.Unmarshal([]byte(out), &listed)
	}
	if err != nil || listed.Total != 5 || len(listed.Bans) != 5 || listed.Bans[0].Reason != "test" {
		t.Errorf("bans --json: %v\n%s", err, out)
	}

	// A new apply keeps the bans; the 1s ban has run out in the kernel.
	time.Sleep(1100 * time.Millisecond)
	if _, err := cli("apply", "--policy", pol); err != nil {
		t.Fatal(err)
	}
	expect("after apply", true, false, true, false, true, false, true, false, true)

	// Refused bans change nothing.
	before := netnstest.Ruleset(t, lab.FW)
	for _, bad := range [][]string{{"198.18.0.5"}, {"198.51.100.20", "2001:2::9"}, {"10.0.0.0/7"}, {"198.18.0.1"}, {"nonsense"}, {"192.0.2.1", "--ttl", "400d"}} {
		if _, err := cli(append([]string{"ban"}, bad...)...); err == nil {
			t.Errorf("ban %v: no error", bad)
		}
	}
	if after := netnstest.Ruleset(t, lab.FW); after != before {
		t.Errorf("refused bans changed the ruleset:\n%s\nwas:\n%s", after, before)
	}

	if _, err := cli("unban", "100.64.0.0/10", "198.51.100.7", "2001:db8:ff::/48", "203.0.113.9"); err != nil {
		t.Fatal(err)
	}
	expect("unbanned", true, true, true, true, true, true, true, false, true)
	// With no bans and no stateless rules there is no chain before
	// conntrack at all: an empty one would cost every packet its hook.
	if out := netnstest.Ruleset(t, lab.FW); strings.Contains(out, "@ban") || strings.Contains(out, "chain prerouting {") {
		t.Errorf("ban lookups or the base chain left with no bans:\n%s", out)
	}
}
