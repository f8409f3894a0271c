package prefix

import (
	"net/netip"
	"slices"

	"go4.org/netipx"
)

var max4, max6 = U128{0, 1<<32 - 1}, U128{^uint64(0), ^uint64(0)}

// span is an inclusive range of addresses of one family.
type span struct{ lo, hi U128 }

// merge sorts spans and merges overlapping and adjacent ones, in place: the
// result is the minimal sorted list covering the same addresses.
func merge(ss []span) []span {
	if len(ss) < 2 {
		return ss
	}
	if !slices.IsSortedFunc(ss, cmpLo) {
		slices.SortFunc(ss, cmpLo)
	}
	return mergeSorted(ss)
}

func cmpLo(a, b span) int { return a.lo.Cmp(b.lo) }

// mergeSorted is merge for spans already sorted by lo.
func mergeSorted(ss []span) []span {
	if len(ss) == 0 {
		return ss
	}
	out := ss[:1]
	for _, s := range ss[1:] {
		last := &out[len(out)-1]
		// s overlaps or touches last when s.lo <= last.hi+1, written
		// s.lo-1 <= last.hi so that it cannot overflow; s.lo == 0 means
		// last starts at 0 too.
		if s.lo == (U128{}) || !last.hi.Less(s.lo.Sub64(1)) {
			if last.hi.Less(s.hi) {
				last.hi = s.hi
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

// subtract returns the addresses of a not in b; both are minimal sorted
// lists, and so is the result. Neither is modified; the result is a
// itself when there is nothing to subtract.
func subtract(a, b []span) []span {
	if len(b) == 0 || len(a) == 0 {
		return a
	}
	out := make([]span, 0, len(a))
	j := 0
	for _, r := range a {
		for j < len(b) && b[j].hi.Less(r.lo) {
			j++
		}
		lo, done := r.lo, false
		for k := j; k < len(b) && !r.hi.Less(b[k].lo); k++ {
			if lo.Less(b[k].lo) {
				out = append(out, span{lo, b[k].lo.Sub64(1)})
			}
			if !b[k].hi.Less(r.hi) {
				done = true
				break
			}
			lo = b[k].hi.Add64(1)
		}
		if !done {
			out = append(out, span{lo, r.hi})
		}
	}
	return out
}

// complement returns the addresses from 0 to max not in ss, a minimal
// sorted list.
func complement(ss []span, max U128) []span {
	out := make([]span, 0, len(ss)+1)
	next, more := U128{}, true // first address not yet accounted for
	for _, s := range ss {
		if next.Less(s.lo) {
			out = append(out, span{next, s.lo.Sub64(1)})
		}
		if s.hi == max {
			more = false
			break
		}
		next = s.hi.Add64(1)
	}
	if more {
		out = append(out, span{next, max})
	}
	return out
}

// forEachCIDR calls fn with the address and length of each prefix of the
// minimal cover of [lo, hi], in order; width is 32 or 128.
func forEachCIDR(lo, hi U128, width int, fn func(U128, int)) {
	for {
		// The largest block starting at lo: aligned on lo's trailing
		// zeros, and no bigger than what is left up to hi.
		k := lo.TrailingZeros()
		if d := hi.Sub(lo); d != max6 {
			k = min(k, d.Add64(1).Len()-1)
		}
		k = min(k, width)
		fn(lo, width-k)
		if k == width {
			return
		}
		next := lo.Add(Pow2(k))
		if hi.Less(next) || next == (U128{}) {
			return
		}
		lo = next
	}
}

// countCIDRs returns the number of prefixes in the minimal cover of [lo, hi].
func countCIDRs(lo, hi U128, width int) int {
	n := 0
	forEachCIDR(lo, hi, width, func(U128, int) { n++ })
	return n
}

// split returns the ranges of s and how many of them, first, are IPv4.
func split(s *netipx.IPSet) (rr []netipx.IPRange, n4 int) {
	rr = rangesOf(s)
	// IPv4 ranges sort first.
	n4, _ = slices.BinarySearchFunc(rr, true, func(r netipx.IPRange, _ bool) int {
		if r.From().Is4() {
			return -1
		}
		return 1
	})
	return rr, n4
}

// spansOf splits the ranges of s by family.
func spansOf(s *netipx.IPSet) (v4, v6 []span) {
	rr, n4 := split(s)
	v4, v6 = make([]span, n4), make([]span, len(rr)-n4)
	for i, r := range rr {
		sp := span{U128From(r.From()), U128From(r.To())}
		if i < n4 {
			v4[i] = sp
		} else {
			v6[i-n4] = sp
		}
	}
	return v4, v6
}

// setOf returns the set of two minimal sorted lists.
func setOf(v4, v6 []span) *netipx.IPSet {
	rr := make([]netipx.IPRange, 0, len(v4)+len(v6))
	for _, s := range v4 {
		rr = append(rr, netipx.IPRangeFrom(s.lo.Addr(32), s.hi.Addr(32)))
	}
	for _, s := range v6 {
		rr = append(rr, netipx.IPRangeFrom(s.lo.Addr(128), s.hi.Addr(128)))
	}
	return newIPSet(rr)
}

// CoverDiff returns how many prefixes the minimal CIDR covers of a minus b
// and of b minus a hold, both families together; a and b are prefixes in
// any order, overlapping or not. It sweeps sorted ranges: no set is built
// (the applied record's diff of a 400k-prefix rule built four and took
// 860 MB).
func CoverDiff(a, b []netip.Prefix) (aOnly, bOnly int) {
	a4, a6 := spansOfPrefixes(a)
	b4, b6 := spansOfPrefixes(b)
	count := func(ss []span, width int) int {
		n := 0
		for _, s := range ss {
			n += countCIDRs(s.lo, s.hi, width)
		}
		return n
	}
	aOnly = count(subtract(a4, b4), 32) + count(subtract(a6, b6), 128)
	bOnly = count(subtract(b4, a4), 32) + count(subtract(b6, a6), 128)
	return aOnly, bOnly
}

// spansOfPrefixes returns the minimal sorted spans of ps, per family.
func spansOfPrefixes(ps []netip.Prefix) (v4, v6 []span) {
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		a := U128From(p.Addr())
		if p.Addr().Is4() {
			v4 = append(v4, prefixSpan(a, p.Bits(), 32))
		} else {
			v6 = append(v6, prefixSpan(a, p.Bits(), 128))
		}
	}
	return merge(v4), merge(v6)
}
