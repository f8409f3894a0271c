package prefix

import (
	"math/bits"
	"net/netip"
	"slices"
	"strings"

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
	eachDifference(a, b, func(s span) { out = append(out, s) })
	return out
}

// eachDifference calls fn, in order, with the spans of a minus b (both
// minimal sorted lists).
func eachDifference(a, b []span, fn func(span)) {
	j := 0
	for _, r := range a {
		for j < len(b) && b[j].hi.Less(r.lo) {
			j++
		}
		lo, done := r.lo, false
		for k := j; k < len(b) && !r.hi.Less(b[k].lo); k++ {
			if lo.Less(b[k].lo) {
				fn(span{lo, b[k].lo.Sub64(1)})
			}
			if !b[k].hi.Less(r.hi) {
				done = true
				break
			}
			lo = b[k].hi.Add64(1)
		}
		if !done {
			fn(span{lo, r.hi})
		}
	}
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
	if width == 32 {
		forEachCIDR4(lo.Lo, hi.Lo, fn)
		return
	}
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

// forEachCIDR4 is forEachCIDR for IPv4, in 64-bit arithmetic: a range's
// size, up to 2^32, and every block's fit in a word.
func forEachCIDR4(lo, hi uint64, fn func(U128, int)) {
	for {
		k := min(bits.TrailingZeros64(lo), bits.Len64(hi-lo+1)-1, 32)
		fn(U128{0, lo}, 32-k)
		next := lo + 1<<k
		if next > hi {
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
	return coverDiff(a4, a6, b4, b6)
}

// CoverDiffText is CoverDiff of prefixes written as text (as
// netip.Prefix.String writes them: an applied record's); text that does
// not parse is skipped. It parses them straight into ranges.
func CoverDiffText(a, b []string) (aOnly, bOnly int) {
	a4, a6 := spansOfText(a)
	b4, b6 := spansOfText(b)
	return coverDiff(a4, a6, b4, b6)
}

// CoverDiffSets is CoverDiff of two sets (their minimal covers). It walks
// their ranges in place: a daemon refreshing a 395k-range rule counts its
// change with both sets live, and copies of them as spans took 24 MB more.
func CoverDiffSets(a, b *netipx.IPSet) (aOnly, bOnly int) {
	count := func(x, y []netipx.IPRange) int {
		n := 0
		eachDifferenceRange(x, y, func(r netipx.IPRange) { n += CountRange(r) })
		return n
	}
	ra, rb := rangesOf(a), rangesOf(b)
	return count(ra, rb), count(rb, ra)
}

// CoverDiffSet is CoverDiffText with a given as a set (its minimal
// cover): an apply's new rule set against the text of its last record.
func CoverDiffSet(a *netipx.IPSet, b []string) (aOnly, bOnly int) {
	a4, a6 := spansOf(a)
	b4, b6 := spansOfText(b)
	return coverDiff(a4, a6, b4, b6)
}

// coverDiff is CoverDiff of minimal sorted lists.
func coverDiff(a4, a6, b4, b6 []span) (aOnly, bOnly int) {
	// Counted as the differences come: no list of them is made.
	count := func(a, b []span, width int) int {
		n := 0
		eachDifference(a, b, func(s span) { n += countCIDRs(s.lo, s.hi, width) })
		return n
	}
	aOnly = count(a4, b4, 32) + count(a6, b6, 128)
	bOnly = count(b4, a4, 32) + count(b6, a6, 128)
	return aOnly, bOnly
}

// spansOfText returns the minimal sorted spans of the prefixes ps holds
// as text, per family.
func spansOfText(ps []string) (v4, v6 []span) {
	n6 := 0
	for _, p := range ps {
		if strings.IndexByte(p, ':') >= 0 {
			n6++
		}
	}
	v4, v6 = make([]span, 0, len(ps)-n6), make([]span, 0, n6)
	for _, s := range ps {
		if p, err := netip.ParsePrefix(s); err == nil {
			v4, v6 = appendSpan(v4, v6, p)
		}
	}
	return merge(v4), merge(v6)
}

// spansOfPrefixes returns the minimal sorted spans of ps, per family.
func spansOfPrefixes(ps []netip.Prefix) (v4, v6 []span) {
	n4 := 0
	for _, p := range ps {
		if p.Addr().Is4() {
			n4++
		}
	}
	v4, v6 = make([]span, 0, n4), make([]span, 0, len(ps)-n4)
	for _, p := range ps {
		v4, v6 = appendSpan(v4, v6, p)
	}
	return merge(v4), merge(v6)
}

// appendSpan appends the span of p, if valid, to the list of its family.
func appendSpan(v4, v6 []span, p netip.Prefix) ([]span, []span) {
	switch a := U128From(p.Addr()); {
	case !p.IsValid():
	case p.Addr().Is4():
		v4 = append(v4, prefixSpan(a, p.Bits(), 32))
	default:
		v6 = append(v6, prefixSpan(a, p.Bits(), 128))
	}
	return v4, v6
}
