package plan

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
)

// smallNetworks builds a set of n unaligned ranges of 64 to 4,096
// addresses (IPv4) or of /44 to /64-sized runs (IPv6), clustered as
// allocations are, plus a few big blocks: many small networks beside a few
// that hold most addresses.
func smallNetworks(r *rand.Rand, is4 bool, n int) *prefix.Set {
	var b prefix.Builder
	w := familyBits(is4)
	var base prefix.U128
	for i := range n {
		if i%50 == 0 {
			base = prefix.U128{Hi: 0x2000<<48 | r.Uint64()>>3}
			if is4 {
				base = prefix.U128{Lo: uint64(r.Uint32())}
			}
		}
		var from, size prefix.U128
		if is4 {
			from = base.Add64(uint64(r.IntN(1 << 22)))
			from.Lo &= 0xffffffff
			size = prefix.U128{Lo: uint64(64 + r.IntN(4096-64))}
		} else {
			from = base.Add(prefix.U128{Lo: r.Uint64()}.Shl(20))
			size = prefix.U128{Lo: uint64(1 + r.IntN(1<<20))}.Shl(44)
		}
		to := from.Add(size)
		if to.Less(from) || is4 && to.Lo > 0xffffffff {
			continue
		}
		b.AddRange(netipx.IPRangeFrom(from.Addr(w), to.Addr(w)))
	}
	for range 8 { // a few big blocks: most of the addresses
		a := prefix.U128{Hi: 0x2000<<48 | r.Uint64()>>3}
		l := 20 + r.IntN(8)
		if is4 {
			a, l = prefix.U128{Lo: uint64(r.Uint32())}, 10+r.IntN(4)
		}
		b.AddPrefix(netip.PrefixFrom(a.Addr(w), l).Masked())
	}
	s, err := b.Build()
	if err != nil {
		panic(err)
	}
	return s
}

// rangeTraffic draws n addresses of s's family is4: a range uniformly,
// then an address in it (IPv6: the range's first address plus a random
// offset below its size, which is a multiple of 2**44 here).
func rangeTraffic(r *rand.Rand, s *prefix.Set, is4 bool, n int) []netip.Addr {
	var rs []netipx.IPRange
	for _, rg := range s.Ranges() {
		if rg.From().Is4() == is4 {
			rs = append(rs, rg)
		}
	}
	w := familyBits(is4)
	out := make([]netip.Addr, n)
	for i := range out {
		rg := rs[r.IntN(len(rs))]
		from, to := prefix.U128From(rg.From()), prefix.U128From(rg.To())
		size := to.Sub(from).Float64() + 1
		off := prefix.U128{Lo: uint64(r.Float64() * size)}
		if !is4 {
			off = prefix.U128{Lo: uint64(r.Float64() * size / (1 << 44))}.Shl(44)
		}
		a := from.Add(off)
		if to.Less(a) {
			a = to
		}
		out[i] = a.Addr(w)
	}
	return out
}

// cost is a layout's mean lookups and key words for srcs.
func cost(l *Layout, srcs []netip.Addr) (lookups, words float64) {
	for _, a := range srcs {
		wd, lk, _ := l.Trace(a)
		lookups += float64(lk)
		words += float64(wd)
	}
	return lookups / float64(len(srcs)), words / float64(len(srcs))
}

// TestRangeTraffic pins what the traffic model of issue 23 buys on a set
// of many small unaligned networks beside a few big blocks, for traffic
// drawn uniformly over the ranges (every network equally busy):
// DefaultModel's layout must cost no more per packet than ModelV1's
// (lookups, plus ExtraWord per extra IPv6 key word), with at most 10%
// more elements, and its verdicts must be the set's.
func TestRangeTraffic(t *testing.T) {
	for _, is4 := range []bool{true, false} {
		r := rand.New(rand.NewPCG(23, 1))
		s := smallNetworks(r, is4, 20000)
		srcs := rangeTraffic(r, s, is4, 40000)
		var lk, wd [2]float64
		var el [2]int
		for k, m := range []TrafficModel{ModelV1, DefaultModel} {
			l, err := Build(s, is4, Options{PassIsIn: true, Model: m})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range srcs[:2000] {
				if !l.Contains(a) {
					t.Fatalf("%v: not in the layout", a)
				}
			}
			lk[k], wd[k] = cost(l, srcs)
			el[k] = l.Entries()
		}
		t.Logf("%s, %d ranges: v1 %.3f lookups %.3f words %d elements; now %.3f lookups %.3f words %d elements",
			familyName(is4), len(s.Ranges()), lk[0], wd[0], el[0], lk[1], wd[1], el[1])
		price := func(k int) float64 { return lk[k] + DefaultModel.ExtraWord*(wd[k]-lk[k]) }
		if price(1) > price(0)+0.005 {
			t.Errorf("%s: range traffic costs %.3f lookups with DefaultModel, %.3f with ModelV1", familyName(is4), price(1), price(0))
		}
		if float64(el[1]) > 1.1*float64(el[0]) {
			t.Errorf("%s: %d elements with DefaultModel, %d with ModelV1", familyName(is4), el[1], el[0])
		}
	}
}
