package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
)

// xdpPolicy writes a policy whose first two rules (a feed to drop and
// "allow only" three countries) run in XDP on iface when backend is xdp,
// and a third with a port stays in nftables either way.
func xdpPolicy(t *testing.T, dir, backend, iface string) string {
	t.Helper()
	write(t, dir, "drop.txt", "# feed\n1.0.0.0/8\n9.9.9.9\n100.64.0.0-100.64.3.255\n2001:db8::/32\n2c0f::/16\n203.0.113.0/24\n")
	write(t, dir, "ssh.txt", "5.0.0.0/8\n2a00::/12\n")
	write(t, dir, "p.yaml", `
backend: `+backend+`
interfaces: [`+iface+`]
sources:
  drop: {format: list, paths: [drop.txt]}
  ssh:  {format: list, paths: [ssh.txt], allow_broad: true}
  geo:  {format: country-csv, paths: ["builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"]}
protect: [203.0.113.7, 198.18.0.0/15, 2001:2::/48]
rules:
  - {name: feeds,  action: drop, match: {source: drop}}
  - {name: europe, action: allow-only, match: {source: geo, countries: [IT, FR, DE, ES, PL, NL, GB, SE]}}
  - {name: ssh,    action: drop, ports: [udp/9999], match: {source: ssh}}
`)
	return filepath.Join(dir, "p.yaml")
}

// xdpSources samples every rule's set and the protected corner cases.
func xdpSources(c *compiled) []netip.Addr {
	r := rand.New(rand.NewPCG(9, 9))
	var srcs []netip.Addr
	for _, rule := range c.Plan.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set.IPSet(), 5000)...)
	}
	for _, s := range []string{"203.0.113.7", "203.0.113.8", "9.9.9.9", "5.1.2.3", "2001:db8::1"} {
		srcs = append(srcs, netip.MustParseAddr(s))
	}
	return srcs
}

// xdpSetup is a lab where xdpPolicy was applied with XDP on the
// firewall's veth.
type xdpSetup struct {
	lab            *netns.Lab
	dir, pins, pol string   // state and policy folder, bpffs, policy file
	args           []string // the flags of every command on the lab
	out            string   // apply's output
}

// applyXDPPolicy applies xdpPolicy with XDP on a new lab's firewall
// veth, pinning under a bpffs of the test's own.
func applyXDPPolicy(t *testing.T) xdpSetup {
	t.Helper()
	return applyXDPPolicyPinned(t, netnstest.BPFFS(t))
}

// applyXDPPolicyPinned is applyXDPPolicy pinning under pins, a bpffs
// of the test's own (netnstest.BPFFS).
func applyXDPPolicyPinned(t *testing.T, pins string) xdpSetup {
	t.Helper()
	s := xdpSetup{lab: netnstest.New(t), pins: pins, dir: t.TempDir()}
	s.pol = xdpPolicy(t, s.dir, "xdp", s.lab.FWIf)
	s.args = []string{"--netns", s.lab.FW, "--state", s.dir, "--pin-dir", s.pins}
	var err error
	if s.out, err = run(t, append([]string{"apply", "--policy", s.pol}, s.args...)...); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestApplyXDPVerdicts applies a policy whose leading rules run in XDP
// (native, on the lab's veth) and checks real frames' verdicts against
// the model and against the same policy run wholly in nftables; then the
// counters `status` shows, an atomic swap to a changed feed, and flush.
func TestApplyXDPVerdicts(t *testing.T) {
	s := applyXDPPolicy(t)
	lab, dir, pins, pol, args, out := s.lab, s.dir, s.pins, s.pol, s.args, s.out
	if !strings.Contains(out, "XDP: 2 rules on "+lab.FWIf+" (native)") {
		t.Errorf("apply does not report 2 XDP rules attached natively:\n%s", out)
	}
	c := compileFor(t, pol, dir)
	if got := len(c.Plan.XDPRules()); got != 2 || c.Plan.Rules[2].Backend != plan.NFTables || c.Plan.Rules[2].BackendNote == "" {
		t.Fatalf("XDP rules %d, third rule %s (%q): want 2 in XDP and the ported one in nftables with a note",
			got, c.Plan.Rules[2].Backend, c.Plan.Rules[2].BackendNote)
	}
	srcs := xdpSources(c)
	pktgentest.ExpectModel(t, lab, c.Plan, srcs, 9999)
	passedXDP := pktgentest.Send(t, lab, srcs, 9999)

	// The counters: each XDP rule dropped what the model gives it (two
	// rounds of srcs went through: ExpectModel and Send).
	var st struct {
		XDP struct {
			Program    uint32          `json:"program_id"`
			Interfaces []xdp.Interface `json:"interfaces"`
			Rules      []struct {
				Name  string       `json:"name"`
				Total xdp.Counters `json:"total"`
			} `json:"rules"`
		} `json:"xdp"`
	}
	status := func() {
		t.Helper()
		out, err := run(t, append([]string{"status", "--json"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
	}
	status()
	want := map[string]uint64{}
	for _, a := range srcs {
		if d := c.Plan.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: 9999}); d.Rule == "feeds" || d.Rule == "europe" {
			want[d.Rule] += 2
		}
	}
	if len(st.XDP.Interfaces) != 1 || st.XDP.Interfaces[0].Mode != xdp.Native || st.XDP.Interfaces[0].Program != st.XDP.Program {
		t.Errorf("status interfaces %+v, program %d: want %s running it natively", st.XDP.Interfaces, st.XDP.Program, lab.FWIf)
	}
	for _, r := range st.XDP.Rules[1:] {
		if r.Total.Packets != want[r.Name] {
			t.Errorf("rule %s: XDP counted %d drops, the model %d", r.Name, r.Total.Packets, want[r.Name])
		}
	}

	// The same policy in nftables alone: the same verdict for every source.
	nftPol := xdpPolicy(t, t.TempDir(), "nftables", lab.FWIf)
	out, err := run(t, append([]string{"apply", "--policy", nftPol}, args...)...)
	if err != nil || !strings.Contains(out, "the program was detached") {
		t.Fatalf("apply with backend nftables: %v\n%s", err, out)
	}
	if x := xdpOf(t, lab); x != nil && x.Attached {
		t.Errorf("an XDP program is still attached: %+v", x)
	}
	pktgentest.Expect(t, lab, srcs, 9999, passedXDP, "nftables alone, against XDP")

	// Back to XDP, then a changed feed: the link stays, its program is
	// swapped, and the new feed's verdicts hold.
	if _, err := run(t, append([]string{"apply", "--policy", pol}, args...)...); err != nil {
		t.Fatal(err)
	}
	linkBefore := xdpLinkID(t, pins)
	status()
	progBefore := st.XDP.Program
	write(t, dir, "drop.txt", "1.0.0.0/8\n9.9.9.9\n100.64.0.0-100.64.3.255\n2001:db8::/32\n2c0f::/16\n7.7.7.0/24\n")
	if _, err := run(t, append([]string{"apply", "--policy", pol}, args...)...); err != nil {
		t.Fatal(err)
	}
	status()
	if linkAfter := xdpLinkID(t, pins); linkAfter != linkBefore || st.XDP.Program == progBefore {
		t.Errorf("swap: link %d → %d, program %d → %d: want the same link with a new program", linkBefore, linkAfter, progBefore, st.XDP.Program)
	}
	c = compileFor(t, pol, dir)
	pktgentest.ExpectModel(t, lab, c.Plan, append(xdpSources(c), netip.MustParseAddr("7.7.7.7"), netip.MustParseAddr("9.9.9.9")), 9999)

	out, err = run(t, append([]string{"flush"}, args...)...)
	if err != nil || !strings.Contains(out, "detached the XDP program") {
		t.Errorf("flush: %v\n%s", err, out)
	}
	if x := xdpOf(t, lab); x != nil && x.Attached {
		t.Errorf("an XDP program is still attached after flush: %+v", x)
	}
	if entries, _ := os.ReadDir(pins); len(entries) > 2 { // maps.debug, progs.debug
		t.Errorf("pins left after flush: %v", entries)
	}
}

// xdpOf returns the XDP attachment of the lab's firewall interface.
func xdpOf(t *testing.T, lab *netns.Lab) *netlink.LinkXdp {
	t.Helper()
	var x *netlink.LinkXdp
	if err := lab.DoFW(func() error {
		l, err := netlink.LinkByName(lab.FWIf)
		if err == nil {
			x = l.Attrs().Xdp
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return x
}

// xdpLinkID returns the ID of the one XDP link pinned under pins.
func xdpLinkID(t *testing.T, pins string) uint32 {
	t.Helper()
	links, _ := filepath.Glob(filepath.Join(pins, "*", "link_*"))
	if len(links) != 1 {
		t.Fatalf("pinned links %v, want one", links)
	}
	l, err := link.LoadPinnedLink(links[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return uint32(info.ID)
}

// TestApplyXDPBadInputKeepsProgram: an interface that does not exist, or
// one that runs another XDP program, fails the apply with a clear error,
// and the program in place keeps running on every interface, with the
// nftables ruleset unchanged.
func TestApplyXDPBadInputKeepsProgram(t *testing.T) {
	s := applyXDPPolicy(t)
	lab, dir, pol, args := s.lab, s.dir, s.pol, s.args
	before := xdpOf(t, lab)
	ruleset := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset")
	// A foreign program on lo, attached without a link, as `ip link set
	// dev lo xdp obj ...` would.
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	if err := lab.DoFW(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFdWithFlags(lo, foreign.FD(), 1<<1) // XDP_FLAGS_SKB_MODE
	}); err != nil {
		t.Fatal(err)
	}
	// The feed changes, so each apply would swap the program.
	write(t, dir, "drop.txt", "1.0.0.0/8\n9.9.9.9\n100.64.0.0-100.64.3.255\n2001:db8::/32\n2c0f::/16\n203.0.113.0/24\n7.7.7.0/24\n")
	for _, tc := range []struct {
		name, ifaces string
		is           error
		want         string
	}{
		{"missing interface", lab.FWIf + ", nope0", xdp.ErrNoInterface, "nope0"},
		{"foreign program", lab.FWIf + ", lo", xdp.ErrOtherProgram, "lo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "bad.yaml")
			data, err := os.ReadFile(pol)
			if err != nil {
				t.Fatal(err)
			}
			write(t, dir, "bad.yaml", strings.Replace(string(data), "interfaces: ["+lab.FWIf+"]", "interfaces: ["+tc.ifaces+"]", 1))
			_, err = run(t, append([]string{"apply", "--policy", p}, args...)...)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %v naming %s", err, tc.is, tc.want)
			}
			if after := xdpOf(t, lab); after == nil || after.ProgId != before.ProgId {
				t.Errorf("XDP program %+v, want %+v still attached", after, before)
			}
			if now := netnstest.Exec(t, lab.FW, "nft", "list", "ruleset"); now != ruleset {
				t.Errorf("the nftables ruleset changed:\n%s", now)
			}
		})
	}
}

// TestFlushUnderIPNetnsExec: `ip netns exec NS ipfence flush` detaches
// the XDP program although the pins are out of its sight (ip netns exec
// mounts a fresh /sys, without the bpffs): flush finds ipfence's program
// on the interfaces over netlink.
func TestFlushUnderIPNetnsExec(t *testing.T) {
	s := applyXDPPolicy(t)
	if x := xdpOf(t, s.lab); x == nil || !x.Attached {
		t.Fatalf("no XDP program after apply: %+v", x)
	}
	exe := buildIpfence(t)
	out, err := exec.Command("ip", "netns", "exec", s.lab.FW, exe, "flush", "--state", s.dir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "detached the XDP program") {
		t.Errorf("ip netns exec … flush: %v\n%s", err, out)
	}
	if x := xdpOf(t, s.lab); x != nil && x.Attached {
		t.Errorf("an XDP program is still attached after flush under ip netns exec: %+v", x)
	}
	// With the pins in sight, flush removes what is left of them.
	if _, err := run(t, append([]string{"flush"}, s.args...)...); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(s.pins); len(entries) > 2 { // maps.debug, progs.debug
		t.Errorf("pins left after flush: %v", entries)
	}
}

// TestStalePins: a namespace deleted without a flush leaves its XDP
// program pinned, with its maps. doctor reports those pins; flush
// --stale-pins removes them and keeps the pins (and the program) of a
// namespace that exists; a plain flush removes them too. Everything is
// pinned under a bpffs of the test's own.
func TestStalePins(t *testing.T) {
	pins := netnstest.BPFFS(t)
	kept := applyXDPPolicyPinned(t, pins)
	dirOf := func(s xdpSetup) string {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(netns.Path(s.lab.FW), &st); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(pins, fmt.Sprintf("netns-%d", st.Ino))
		if _, err := os.Stat(filepath.Join(dir, "prog")); err != nil {
			t.Fatalf("no program pinned for %s: %v", s.lab.FW, err)
		}
		return dir
	}
	keptDir := dirOf(kept)
	// leave applies the policy in a new namespace, deletes the namespace
	// without a flush and returns its pin folder once its links are
	// detached (the kernel tears a namespace down in the background).
	leave := func() string {
		t.Helper()
		s := applyXDPPolicyPinned(t, pins)
		dir := dirOf(s)
		if err := s.lab.Close(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			all, err := xdp.Pins(pins)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(all, func(p xdp.Pin) bool { return p.Dir == dir })
			if i < 0 {
				t.Fatalf("the pins in %s went with their namespace: %v", dir, all)
			}
			if all[i].Stale() {
				return dir
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v is not stale 30s after its namespace was deleted", all[i])
			}
		}
	}
	goneDir := leave()

	out, err := run(t, "doctor", "--json", "--pin-dir", pins)
	if err != nil {
		t.Fatal(err)
	}
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Pins.OK || len(r.Pins.Stale) != 1 || r.Pins.Stale[0].Dir != goneDir || !r.Pins.Stale[0].Gone || r.Pins.Stale[0].MapBytes == 0 {
		t.Errorf("doctor's pins: %+v, want %s alone stale, with its maps' size", r.Pins, goneDir)
	}
	var text strings.Builder
	printDoctor(&text, &r)
	if want := "pins       WARN " + goneDir; !strings.Contains(text.String(), want) || !strings.Contains(text.String(), "ipfence flush --stale-pins --pin-dir "+pins) {
		t.Errorf("doctor's text lacks %q and what to do:\n%s", want, text.String())
	}

	out, err = run(t, "flush", "--stale-pins", "--pin-dir", pins)
	if err != nil || !strings.Contains(out, "removed the XDP pins of a namespace that is gone: "+goneDir) {
		t.Errorf("flush --stale-pins: %v\n%s", err, out)
	}
	if _, err := os.Stat(goneDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there: %v", goneDir, err)
	}
	if _, err := os.Stat(filepath.Join(keptDir, "prog")); err != nil {
		t.Errorf("the pins of a namespace that exists were removed: %v", err)
	}
	if x := xdpOf(t, kept.lab); x == nil || !x.Attached {
		t.Errorf("the program of a namespace that exists was detached: %+v", x)
	}
	if out, err := run(t, "flush", "--stale-pins", "--pin-dir", pins); err != nil || !strings.Contains(out, "no XDP pins of namespaces that are gone") {
		t.Errorf("flush --stale-pins again: %v\n%s", err, out)
	}

	// A plain flush, of the current namespace (kept's: never the host's
	// in a test), removes them too.
	goneDir = leave()
	exe := buildIpfence(t)
	b, err := exec.Command("ip", "netns", "exec", kept.lab.FW, exe, "flush", "--state", kept.dir, "--pin-dir", pins).CombinedOutput()
	if err != nil || !strings.Contains(string(b), "removed the XDP pins of a namespace that is gone: "+goneDir) {
		t.Errorf("ip netns exec … flush: %v\n%s", err, b)
	}
	if _, err := os.Stat(goneDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after a plain flush: %v", goneDir, err)
	}
}
