package xdp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
)

var (
	testMAC = []byte{2, 0, 0, 0, 0, 1}
	dst4    = netip.MustParseAddr("198.18.0.1")
	dst6    = netip.MustParseAddr("2001:2::1")
)

// frame returns a UDP frame from src, with a VLAN tag of each EtherType in
// tags (outermost first).
func frame(t testing.TB, src netip.Addr, tags ...uint16) []byte {
	t.Helper()
	dst := dst4
	if src.Is6() {
		dst = dst6
	}
	h := pktgen.Header{SrcMAC: testMAC, DstMAC: testMAC, Src: src, Dst: dst, SrcPort: 1, DstPort: 9}
	f, err := pktgen.AppendUDP(nil, &h, 1, make([]byte, 18))
	if err != nil {
		t.Fatal(err)
	}
	for i := len(tags) - 1; i >= 0; i-- {
		tag := []byte{byte(tags[i] >> 8), byte(tags[i]), 0, 42}
		f = append(f[:12:12], append(tag, f[12:]...)...)
	}
	return f
}

func run(t testing.TB, prog *ebpf.Program, f []byte) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: f})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// TestProgramModel runs the program (BPF_PROG_RUN, no device) on frames
// from random and boundary sources of both families and compares each
// verdict with the model, then the per-class counters with the model's
// counts.
func TestProgramModel(t *testing.T) {
	netnstest.Kernel(t)
	r := rand.New(rand.NewPCG(3, 4))
	rules := randomRules(r, 3, 3000)
	l, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	addrs := append(probes(r, rules, 80000, true), probes(r, rules, 40000, false)...)
	if len(addrs) < 100000 {
		t.Errorf("only %d addresses to test", len(addrs))
	}
	want := map[Class]uint64{}
	for _, a := range addrs {
		c := model(rules, a)
		if lc := l.Lookup(a); lc != c {
			t.Fatalf("Layout.Lookup(%s) = %d, model %d", a, lc, c)
		}
		want[c]++
	}
	// Stateless, the same tables: the program must give the same verdicts
	// (the random flows belong to no connection).
	stateless := slices.Clone(rules)
	for i := range stateless {
		stateless[i].Stateless = true
	}
	ls, err := BuildLayout(stateless)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		l   *Layout
		opt LoadOptions
	}{{l, LoadOptions{}}, {l, LoadOptions{LPM: true}}, {ls, LoadOptions{}}} {
		opt := tc.opt
		t.Run(fmt.Sprintf("%+v/stateless=%v", opt, tc.l.Stateless > 0), func(t *testing.T) {
			o, err := tc.l.Load(opt)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			bad := 0
			for _, a := range addrs {
				c := model(rules, a)
				verdict := uint32(xdpPass)
				if c != 0 {
					verdict = xdpDrop
				}
				if got := run(t, o.Program, frame(t, a)); got != verdict && bad < 10 {
					bad++
					t.Errorf("source %s (class %d): verdict %d, want %d", a, c, got, verdict)
				}
			}
			for c := range Class(len(rules) + 1) {
				got, err := o.Counters(int(c))
				if err != nil {
					t.Fatal(err)
				}
				if got.Packets != want[c] {
					t.Errorf("class %d counted %d packets, want %d", c, got.Packets, want[c])
				}
			}
		})
	}
}

// TestProgramFrames checks the parsing: VLAN-tagged frames get the verdict
// of their source, other protocols and short frames pass uncounted.
func TestProgramFrames(t *testing.T) {
	netnstest.Kernel(t)
	rules := []Rule{{Name: "x", Drop: setOf(t, "198.51.100.0/24", "2001:db8::/32")}}
	l, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	o, err := l.Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	in4, out4 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("198.51.101.7")
	in6, out6 := netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db9::7")
	arp := frame(t, in4)
	arp[12], arp[13] = 0x08, 0x06
	for _, tc := range []struct {
		name string
		f    []byte
		want uint32
	}{
		{"IPv4 in", frame(t, in4), xdpDrop},
		{"IPv4 out", frame(t, out4), xdpPass},
		{"IPv6 in", frame(t, in6), xdpDrop},
		{"IPv6 out", frame(t, out6), xdpPass},
		{"802.1Q IPv4 in", frame(t, in4, 0x8100), xdpDrop},
		{"802.1Q IPv6 in", frame(t, in6, 0x8100), xdpDrop},
		{"802.1ad+802.1Q IPv4 in", frame(t, in4, 0x88a8, 0x8100), xdpDrop},
		{"802.1ad+802.1Q IPv6 out", frame(t, out6, 0x88a8, 0x8100), xdpPass},
		{"ARP", arp, xdpPass},
		{"truncated IPv4", frame(t, in4)[:14+19], xdpPass},
		{"truncated IPv6", frame(t, in6)[:14+39], xdpPass},
	} {
		if got := run(t, o.Program, tc.f); got != tc.want {
			t.Errorf("%s: verdict %d, want %d", tc.name, got, tc.want)
		}
	}
	c, err := o.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	if c.Packets != 5 {
		t.Errorf("class 1 counted %d packets, want 5 (the dropped frames)", c.Packets)
	}
}

func setOf(t testing.TB, ps ...string) *netipx.IPSet {
	t.Helper()
	var b netipx.IPSetBuilder
	for _, p := range ps {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, err := b.IPSet()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// feedRules returns one rule of n random prefixes shaped like a threat
// feed. IPv4: 60% single addresses, 25% /24s, the rest /16 to /23. IPv6:
// 50% single addresses, 30% /64s, the rest /32 to /48.
func feedRules(r *rand.Rand, n int, is4 bool) []Rule {
	var b netipx.IPSetBuilder
	addrs := pktgen.RandomV4(r, n)
	if !is4 {
		addrs = pktgen.RandomV6(r, n)
	}
	for _, a := range addrs {
		x := r.IntN(100)
		bits := 32
		switch {
		case !is4 && x >= 80:
			bits = 32 + r.IntN(17)
		case !is4 && x >= 50:
			bits = 64
		case !is4:
			bits = 128
		case x >= 85:
			bits = 16 + r.IntN(8)
		case x >= 60:
			bits = 24
		}
		b.AddPrefix(netip.PrefixFrom(a, bits).Masked())
	}
	s, _ := b.IPSet()
	return []Rule{{Name: "feed", Drop: s}}
}

// BenchmarkLookup times the program per packet in the kernel without a
// device (BPF_PROG_RUN) against LPM tries of the same prefixes and an
// empty program (what BPF_PROG_RUN itself costs), for sources half in the
// set and half not. The three run in interleaved rounds; each reports the
// median over rounds of the median over 64 sources of each one's mean
// over 1000 runs.
//
//	sudo go test ./internal/backend/xdp -run '^$' -bench Lookup -benchtime 1x
func BenchmarkLookup(b *testing.B) {
	netnstest.Kernel(b)
	// What BPF_PROG_RUN costs around any program: one that passes.
	none, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	defer none.Close()
	for _, family := range []string{"ipv4", "ipv6"} {
		for _, n := range []int{1000, 10000, 100000, 500000, 1000000} {
			r := rand.New(rand.NewPCG(uint64(n), 5))
			rules := feedRules(r, n, family == "ipv4")
			l, err := BuildLayout(rules)
			if err != nil {
				b.Fatal(err)
			}
			others := pktgen.RandomV4(r, 32)
			if family == "ipv6" {
				others = pktgen.RandomV6(r, 32)
			}
			srcs := append(pktgen.RandomFromSet(r, rules[0].Drop, 32), others...)
			b.Run(fmt.Sprintf("family=%s/prefixes=%d", family, len(rules[0].Drop.Prefixes())), func(b *testing.B) {
				tables, err := l.Load(LoadOptions{})
				if err != nil {
					b.Fatal(err)
				}
				defer tables.Close()
				tries, err := l.Load(LoadOptions{LPM: true})
				if err != nil {
					b.Fatal(err)
				}
				defer tries.Close()
				ns := benchPrograms(b, srcs, tables.Program, tries.Program, none)
				b.ReportMetric(ns[0], "ipfence-ns/packet")
				b.ReportMetric(ns[1], "lpm-ns/packet")
				b.ReportMetric(ns[2], "none-ns/packet")
				b.ReportMetric(memlock(b, tables)/(1<<20), "ipfence-MiB")
				b.ReportMetric(memlock(b, tries)/(1<<20), "lpm-MiB")
			})
		}
	}
}

// benchPrograms returns each program's ns per packet on frames from srcs
// (see benchFrames).
func benchPrograms(b *testing.B, srcs []netip.Addr, progs ...*ebpf.Program) []float64 {
	frames := make([][]byte, len(srcs))
	for i, a := range srcs {
		frames[i] = frame(b, a)
	}
	return benchFrames(b, frames, progs...)
}

// benchFrames returns each program's ns per packet on frames: the median
// over interleaved rounds (b.N, at least 5) of the median over frames of
// the mean over 1000 runs.
func benchFrames(b *testing.B, frames [][]byte, progs ...*ebpf.Program) []float64 {
	rounds := make([][]float64, len(progs))
	for round := range max(b.N, 5) {
		for k := range progs {
			i := (k + round) % len(progs) // each program goes first in turn
			var per []float64
			for _, f := range frames {
				_, d, err := progs[i].Benchmark(f, 1000, nil)
				if err != nil {
					b.Fatal(err)
				}
				per = append(per, float64(d.Nanoseconds()))
			}
			rounds[i] = append(rounds[i], median(per))
		}
	}
	out := make([]float64, len(progs))
	for i, r := range rounds {
		out[i] = median(r)
	}
	return out
}

// memlock returns the bytes the kernel accounts to the maps of o, but its
// stats: what its tables take, overheads included.
func memlock(b *testing.B, o *Objects) float64 {
	total := 0.0
	for _, m := range o.maps {
		if m == o.Stats {
			continue
		}
		fd, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(fd), "\n") {
			if v, ok := strings.CutPrefix(line, "memlock:"); ok {
				n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
		}
	}
	return total
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
