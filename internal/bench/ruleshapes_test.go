package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// shapeSources are n IPv4 sources in distinct /24s, outside the special
// ranges and the lab's 198.18.0.0/15.
func shapeSources(n int) []netip.Addr {
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[uint32]bool{}
	var out []netip.Addr
	for len(out) < n {
		v := r.Uint32()
		a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		if seen[v>>8] || !pktgen.Testable(a) || netip.MustParsePrefix("198.18.0.0/15").Contains(a) || v>>28 >= 14 || v>>24 == 10 {
			continue
		}
		seen[v>>8] = true
		out = append(out, a)
	}
	return out
}

// shapeScript is an inet table whose prerouting chain (priority raw)
// jumps IPv4 packets to chain x with the given rules, after the given
// sets and maps.
func shapeScript(defs []string, rules ...string) string {
	var b strings.Builder
	b.WriteString("table inet t {\n")
	for _, d := range defs {
		b.WriteString(d)
	}
	b.WriteString("chain pre {\ntype filter hook prerouting priority -300; policy accept;\nmeta nfproto ipv4 jump x\n}\n")
	b.WriteString("chain x {\n" + strings.Join(rules, "\n") + "\n}\n}\n")
	return b.String()
}

// halfSet is a set of the leading 16 bits of addrs, as ipfence's /16
// bitmaps (nft.KeyHalf) are.
func halfSet(name string, addrs []netip.Addr) string {
	var ks []string
	for _, a := range addrs {
		b := a.As4()
		ks = append(ks, fmt.Sprintf("0x%x", int(b[0])<<8|int(b[1])))
	}
	slices.Sort(ks)
	return fmt.Sprintf("set %s {\ntypeof @nh,96,16\nelements = { %s }\n}\n", name, strings.Join(slices.Compact(ks), ", "))
}

// slash24Map is a verdict map of the /24s of addrs, each continuing.
func slash24Map(addrs []netip.Addr) string {
	es := make([]string, len(addrs))
	for i, a := range addrs {
		es[i] = netip.PrefixFrom(a, 24).Masked().Addr().String() + " : continue"
	}
	size := 1
	for size < len(addrs) {
		size *= 2
	}
	return fmt.Sprintf("map m {\ntype ipv4_addr : verdict\nsize %d\nelements = { %s }\n}\n", size, strings.Join(es, ", "))
}

// BenchmarkRuleShapes measures what the pieces of a layout cost an IPv4
// packet in the kernel, as the layout chooser's model prices them: the
// hook and jump into a rule's chain, a /16 bitmap rule (nft.KeyHalf),
// and a hash map lookup that hits, in maps of 4,000 to 400,000 elements
// with as many sources as elements (up to 100,000), and the same lookup
// done twice (the second one cached). Each shape is loaded once in a lab
// of its own, and the shapes are measured in interleaved rounds, each
// right after the baseline without a ruleset; ns are medians of the
// per-round differences. It ignores b.N:
//
//	go test ./internal/bench -run '^$' -bench RuleShapes -benchtime 1x
//
// ROUNDS and PACKETS (environment) override 15 rounds of 100000 packets.
func BenchmarkRuleShapes(b *testing.B) {
	netnstest.Kernel(b, "ip", "nft")
	rounds, packets := envInt("ROUNDS", 15), envInt("PACKETS", 100000)
	srcs := shapeSources(400_000)
	all := srcs[:100_000]
	one := func(k int) string { return fmt.Sprintf("set e%d {\ntypeof @nh,96,16\nelements = { %d }\n}\n", k, k) }
	type shape struct {
		name   string
		script string
		srcs   []netip.Addr
	}
	shapes := []shape{
		{"jump", shapeScript(nil), all},
		{"bitmap-1", shapeScript([]string{halfSet("b", all)}, "@nh,96,16 @b return"), all},
		{"bitmap-3-miss", shapeScript([]string{one(1), one(2), one(3)}, "@nh,96,16 @e1 return", "@nh,96,16 @e2 return", "@nh,96,16 @e3 return"), all},
	}
	for _, n := range []int{4_000, 30_000, 100_000, 400_000} {
		m := slash24Map(srcs[:n])
		shapes = append(shapes, shape{fmt.Sprintf("hash-%dk", n/1000), shapeScript([]string{m}, "ip saddr & 255.255.255.0 vmap @m"), srcs[:min(n, len(all))]})
		if n == 100_000 {
			shapes = append(shapes, shape{"hash-100k-twice", shapeScript([]string{m}, "ip saddr & 255.255.255.0 vmap @m", "ip saddr & 255.255.255.0 vmap @m"), all})
		}
	}
	labs, err := NewLabs("shape", len(shapes)+1) // labs[0]: no ruleset
	defer CloseLabs(labs)
	if err != nil {
		b.Fatal(err)
	}
	for i, s := range shapes {
		if _, err := NFTScript(s.script)(context.Background(), labs[i+1]); err != nil {
			b.Fatalf("loading %s: %v", s.name, err)
		}
	}
	diffs := make([][]float64, len(shapes))
	for round := 0; round <= rounds; round++ { // round 0 warms up
		for k := range shapes {
			i := (k + round) % len(shapes)
			var ns [2]float64
			for j, lab := range []*netns.Lab{labs[0], labs[i+1]} {
				res, err := pktgen.MeasureWith(lab, shapes[i].srcs, packets, pktgen.MeasureOptions{Expect: pktgen.ExpectAny})
				if err != nil {
					b.Fatalf("%s: %v", shapes[i].name, err)
				}
				ns[j] = res.CPUNsPerPacket
			}
			if round > 0 {
				diffs[i] = append(diffs[i], ns[1]-ns[0])
			}
		}
	}
	for i, s := range shapes {
		lo, med, hi := Spread(diffs[i])
		b.ReportMetric(med, s.name+"_ns")
		b.Logf("%-16s %+5.0f ns (%+.0f..%+.0f), %d sources", s.name, med, lo, hi, len(s.srcs))
	}
}
