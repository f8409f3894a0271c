package pktgen

// Kernel tests: each builds its own lab (netnstest.New skips them when not
// root, fails them under CI=true).

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// loadRuleset loads nft text into lab's fw namespace with `nft -f`.
func loadRuleset(t testing.TB, lab *netns.Lab, text string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ruleset.nft")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.Exec(lab.FW, "nft", "-f", p); err != nil {
		t.Fatal(err)
	}
}

func flushRuleset(t testing.TB, lab *netns.Lab) {
	t.Helper()
	if _, err := netns.Exec(lab.FW, "nft", "flush", "ruleset"); err != nil {
		t.Fatal(err)
	}
}

func TestCheckNoFirewall(t *testing.T) {
	lab := netnstest.New(t)
	r := rand.New(rand.NewPCG(11, 12))
	const n = 25000 // per family: 50k in all
	srcs := append(RandomV4(r, n), RandomV6(r, n)...)
	r.Shuffle(len(srcs), func(i, j int) { srcs[i], srcs[j] = srcs[j], srcs[i] })
	start := time.Now()
	passed, err := Check(lab, srcs, 7000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checked %d sources in %v", len(srcs), time.Since(start))
	for i, ok := range passed {
		if !ok {
			t.Errorf("packet from %s did not arrive with no firewall", srcs[i])
		}
	}
	// Repeated sources each get a packet; a second run on the same port
	// works (the first released it).
	again := []netip.Addr{srcs[0], srcs[0], srcs[1]}
	if passed, err := Check(lab, again, 7000); err != nil || !slices.Equal(passed, []bool{true, true, true}) {
		t.Errorf("Check of repeated sources: %v, %v", passed, err)
	}
}

func TestCheckRuleset(t *testing.T) {
	lab := netnstest.New(t)
	r := rand.New(rand.NewPCG(21, 22))
	blocked := set(t, "1.0.0.0/8", "2001:db8::/32")
	srcs := append(RandomV4(r, 5000), RandomV6(r, 5000)...)
	srcs = append(srcs, RandomFromSet(r, blocked, 2000)...)
	srcs = append(srcs, Boundaries(blocked)...)
	// Off-path sources: loopback, own addresses, link-local.
	for _, s := range []string{"127.0.0.1", "198.18.0.1", "198.18.0.2", "::", "fe80::1", "2001:2::2"} {
		srcs = append(srcs, netip.MustParseAddr(s))
	}
	want := make([]bool, len(srcs))
	nblocked := 0
	for i, a := range srcs {
		want[i] = !blocked.Contains(a)
		if !want[i] {
			nblocked++
		}
	}

	// Baseline: with no firewall everything arrives, so below every
	// missing packet is the firewall's doing.
	passed, err := Check(lab, srcs, 7001)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(passed, false); i >= 0 {
		t.Fatalf("no firewall: packet from %s lost", srcs[i])
	}

	loadRuleset(t, lab, `table inet t {
	chain p {
		type filter hook prerouting priority -300;
		ip saddr 1.0.0.0/8 drop
		ip6 saddr 2001:db8::/32 drop
	}
	chain c {
		type filter hook prerouting priority 0; # after conntrack (-200)
		ct state invalid drop
	}
}
`)
	passed, err = Check(lab, srcs, 7001)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i := range srcs {
		if passed[i] != want[i] {
			bad++
			if bad <= 10 {
				t.Errorf("source %s: passed=%v, want %v", srcs[i], passed[i], want[i])
			}
		}
	}
	t.Logf("%d sources, %d blocked by the ruleset, %d wrong", len(srcs), nblocked, bad)

	// A rejecting firewall sends ICMP/RST back; Check ignores them.
	flushRuleset(t, lab)
	loadRuleset(t, lab, `table inet t {
	chain i {
		type filter hook input priority 0;
		ip saddr 1.0.0.0/8 reject with icmp admin-prohibited
		ip6 saddr 2001:db8::/32 reject with icmpv6 admin-prohibited
	}
}
`)
	passed, err = Check(lab, srcs, 7001)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(passed, want) {
		t.Error("rejecting ruleset: verdicts differ from the model")
	}
}

// TestCheckDetectsLoss has fw's receiver overflow (tiny buffer, readers held
// back): Check must fail with ErrLost rather than report drops.
func TestCheckDetectsLoss(t *testing.T) {
	lab := netnstest.New(t)
	testHookListen = func(r *receiver) {
		for _, c := range r.conns {
			if err := c.SetReadBuffer(1); err != nil { // the kernel's minimum
				t.Error(err)
			}
		}
		r.gate = make(chan struct{})
		time.AfterFunc(300*time.Millisecond, func() { close(r.gate) })
	}
	defer func() { testHookListen = nil }()
	r := rand.New(rand.NewPCG(5, 6))
	_, err := Check(lab, RandomV4(r, 2000), 7003)
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Check with an overflowing receiver: %v, want ErrLost", err)
	}
	t.Log(err)
}

// TestUntestable checks the untestable list against the kernel: with no
// firewall every Testable source must arrive, and the untestable ones that
// arrive may only be in 0.0.0.0/8, which is left out for older kernels.
func TestUntestable(t *testing.T) {
	lab := netnstest.New(t)
	var srcs []netip.Addr
	for _, s := range []string{
		"0.0.0.0", "0.1.2.3", "0.255.255.255", "1.0.0.0", "10.0.0.1", "127.0.0.1", "127.255.255.255",
		"169.254.1.1", "198.18.0.0", "198.18.0.1", "198.18.0.2", "198.18.0.77", "198.18.0.255",
		"223.255.255.255", "224.0.0.0", "224.0.0.1", "239.255.255.255", "240.0.0.0",
		"255.255.255.254", "255.255.255.255",
		"::", "::1", "::2", "::1.2.3.4", "64:ff9b::102:304", "100::1", "fe80::1", "fc00::1",
		"fec0::1", "ff02::1", "ff0e::1", "2001:2::1", "2001:2::77", "2001:db8::1", "3fff::1",
		"4000::1", "feff::1", "ffff:ffff::1",
	} {
		srcs = append(srcs, netip.MustParseAddr(s))
	}
	passed, err := checkSources(lab, srcs, 7002)
	if err != nil {
		t.Fatal(err)
	}
	zero8 := netip.MustParsePrefix("0.0.0.0/8")
	for i, a := range srcs {
		switch {
		case Testable(a) && !passed[i]:
			t.Errorf("%s is Testable but did not arrive with no firewall", a)
		case !Testable(a) && passed[i] && !zero8.Contains(a):
			t.Errorf("%s is not Testable but arrived", a)
		}
	}
	_, err = Check(lab, []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("224.0.0.5")}, 7002)
	if !errors.Is(err, ErrUntestable) {
		t.Errorf("Check of a multicast source: %v, want ErrUntestable", err)
	}
}

// TestTCPSYNKernel has fw's kernel verify AppendTCPSYN's checksums: a SYN to
// a closed port is answered with a reset only if its checksum is right.
func TestTCPSYNKernel(t *testing.T) {
	lab := netnstest.New(t)
	tx, err := NewSender(lab)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	var frames [][]byte
	for _, p := range [][2]netip.Addr{
		{lab.GenAddr4.Addr(), lab.FWAddr4.Addr()},
		{lab.GenAddr6.Addr(), lab.FWAddr6.Addr()},
	} {
		h := Header{SrcMAC: lab.GenMAC, DstMAC: lab.FWMAC, Src: p[0], Dst: p[1], SrcPort: 33333, DstPort: 9}
		f, err := AppendTCPSYN(nil, &h, 1, 12345)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	tcp := func() map[string]uint64 {
		out, err := netns.Exec(lab.FW, "cat", "/proc/net/snmp")
		if err != nil {
			t.Fatal(err)
		}
		return snmpSection(out, "Tcp:")
	}
	before := tcp()
	tx.Load(frames)
	if _, err := tx.Send(len(frames)); err != nil {
		t.Fatal(err)
	}
	var after map[string]uint64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if after = tcp(); after["OutRsts"]-before["OutRsts"] >= 2 {
			break
		}
	}
	if d := after["InCsumErrors"] - before["InCsumErrors"]; d != 0 {
		t.Errorf("fw counted %d TCP checksum errors", d)
	}
	if d := after["OutRsts"] - before["OutRsts"]; d != 2 {
		out, _ := netns.Exec(lab.FW, "nstat", "-a")
		t.Errorf("fw sent %d resets for 2 SYNs to a closed port, want 2; fw counters:\n%s", d, out)
	}
}

func TestSenderNoAllocs(t *testing.T) {
	lab := netnstest.New(t)
	tx, err := NewSender(lab)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	h := Header{SrcMAC: lab.GenMAC, DstMAC: lab.FWMAC, Src: netip.MustParseAddr("1.2.3.4"), Dst: lab.Sink4, DstPort: 9}
	f, err := AppendUDP(nil, &h, 0, make([]byte, 12))
	if err != nil {
		t.Fatal(err)
	}
	tx.Load([][]byte{f, f, f})
	if a := testing.AllocsPerRun(20, func() {
		if _, err := tx.Send(1000); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Send allocates %v times per call", a)
	}
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

// TestMeasure checks that Measure counts every packet and gives plausible
// numbers, and shows how to measure a ruleset's cost: interleaved rounds,
// medians. It asserts no speed (speed targets live in benchmarks).
func TestMeasure(t *testing.T) {
	lab := netnstest.New(t)
	r := rand.New(rand.NewPCG(31, 32))
	srcs := append(RandomV4(r, 4096), RandomV6(r, 4096)...)
	const n, rounds = 50000, 5
	oneRule := `table inet t {
	chain p {
		type filter hook prerouting priority -300;
		ip saddr 1.0.0.0/8 drop
		ip6 saddr 2001:db8::/32 drop
	}
}
`
	if _, err := Measure(lab, srcs, n/10); err != nil { // warm-up
		t.Fatal(err)
	}
	var without, with, withoutCPU, withCPU []float64
	for range rounds {
		for _, rules := range []bool{false, true} {
			if rules {
				loadRuleset(t, lab, oneRule)
			}
			res, err := Measure(lab, srcs, n)
			for try := 1; errors.Is(err, ErrLost) && try < 3; try++ {
				// A busy machine defers fw's receive work to ksoftirqd,
				// whose backlog can overflow: retry the round.
				t.Logf("retrying round: %v", err)
				res, err = Measure(lab, srcs, n)
			}
			if rules {
				flushRuleset(t, lab)
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Packets != n || res.Received < n || res.NsPerPacket <= 0 || res.NsPerPacket > 1e6 ||
				res.CPUNsPerPacket <= 0 || res.CPUNsPerPacket > res.NsPerPacket*1.2 {
				t.Fatalf("implausible result %+v", res)
			}
			if rules {
				with = append(with, res.NsPerPacket)
				withCPU = append(withCPU, res.CPUNsPerPacket)
			} else {
				without = append(without, res.NsPerPacket)
				withoutCPU = append(withoutCPU, res.CPUNsPerPacket)
			}
		}
	}
	t.Logf("ns/packet, median of %d rounds of %d packets: no ruleset %.0f, 1-rule ruleset %.0f, overhead %.0f",
		rounds, n, median(without), median(with), median(with)-median(without))
	t.Logf("CPU ns/packet, same rounds: no ruleset %.0f, 1-rule ruleset %.0f, overhead %.0f",
		median(withoutCPU), median(withCPU), median(withCPU)-median(withoutCPU))
	if _, err := Measure(lab, nil, 1); err == nil {
		t.Error("Measure with no sources succeeded")
	}
}

// BenchmarkMeasure reports fw's per-packet cost (wall and CPU ns/pkt) with
// no ruleset and with a one-rule ruleset that accepts the packets. Run with
// -count and compare medians (benchstat).
func BenchmarkMeasure(b *testing.B) {
	lab := netnstest.New(b)
	r := rand.New(rand.NewPCG(1, 2))
	srcs := append(RandomV4(r, 1024), RandomV6(r, 1024)...)
	const n = 100000
	for _, c := range []struct{ name, rules string }{
		{"none", ""},
		{"one-rule", `table inet t {
	chain p {
		type filter hook prerouting priority -300;
		ip saddr 1.0.0.0/8 drop
		ip6 saddr 2001:db8::/32 drop
	}
}
`},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.rules != "" {
				loadRuleset(b, lab, c.rules)
				defer flushRuleset(b, lab)
			}
			b.ReportAllocs()
			var wall, cpu time.Duration
			rounds := 0
			for b.Loop() {
				res, err := Measure(lab, srcs, n)
				if err != nil {
					b.Fatal(err)
				}
				wall += res.Elapsed
				cpu += res.ThreadCPU + res.Ksoftirqd
				rounds++
			}
			b.ReportMetric(float64(wall.Nanoseconds())/float64(rounds*n), "ns/pkt")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(rounds*n), "cpu-ns/pkt")
		})
	}
}

// TestMeasureExpect checks that MeasureWith tells passed from dropped
// packets, to the sink and to fw's own address: each expectation holds
// for the right firewall and fails with ErrVerdict for the wrong one.
func TestMeasureExpect(t *testing.T) {
	lab := netnstest.New(t)
	srcs := []netip.Addr{netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("2001:2:0:1::1")}
	const drop = "table inet t { chain pre { type filter hook prerouting priority raw; ip saddr 198.19.0.0/16 drop; ip6 saddr 2001:2:0:1::/64 drop; }; }"
	for _, local := range []bool{false, true} {
		for _, dropping := range []bool{false, true} {
			if _, err := netns.Exec(lab.FW, "nft", "flush", "ruleset"); err != nil {
				t.Fatal(err)
			}
			if dropping {
				if _, err := netns.Exec(lab.FW, "nft", drop); err != nil {
					t.Fatal(err)
				}
			}
			for _, exp := range []Expect{ExpectPass, ExpectDrop} {
				_, err := MeasureWith(lab, srcs, 500, MeasureOptions{Local: local, Expect: exp})
				right := (exp == ExpectDrop) == dropping
				if right && err != nil {
					t.Errorf("local %v, dropping %v, expect %v: %v", local, dropping, exp, err)
				}
				if !right && !errors.Is(err, ErrVerdict) {
					t.Errorf("local %v, dropping %v, expect %v: error %v, want ErrVerdict", local, dropping, exp, err)
				}
			}
		}
	}
}
