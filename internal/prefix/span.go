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

// eachRun calls fn, in order, with the runs that tile 0 to max: the
// spans of l (a minimal sorted list), in, and the gaps between them, not
// in.
func eachRun[L list](l L, max U128, fn func(s span, in bool)) {
	next := U128{} // first address not yet accounted for
	for i := range l.Len() {
		s := l.At(i)
		if next.Less(s.lo) {
			fn(span{next, s.lo.Sub64(1)}, false)
		}
		fn(s, true)
		if s.hi == max {
			return
		}
		next = s.hi.Add64(1)
	}
	fn(span{next, max}, false)
}

// eachGap calls fn, in order, with the spans from 0 to max not in l (a
// minimal sorted list), a minimal sorted list itself.
func eachGap[L list](l L, max U128, fn func(span)) {
	eachRun(l, max, func(s span, in bool) {
		if !in {
			fn(s)
		}
	})
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

// CoverDiff returns how many prefixes the minimal CIDR covers of a minus b
// and of b minus a hold, both families together; a and b are prefixes in
// any order, overlapping or not. It sweeps sorted ranges: no set is built
// (the applied record's diff of a 400k-prefix rule built four and took
// 860 MB).
func CoverDiff(a, b []netip.Prefix) (aOnly, bOnly int) {
	a4, a6 := spansOfPrefixes(a)
	b4, b6 := spansOfPrefixes(b)
	return coverDiff(list6(a4), list6(a6), list6(b4), list6(b6))
}

// CoverDiffText is CoverDiff of prefixes written as text (as
// netip.Prefix.String writes them: an applied record's); text that does
// not parse is skipped. It parses them straight into ranges.
func CoverDiffText(a, b []string) (aOnly, bOnly int) {
	a4, a6 := spansOfText(a)
	b4, b6 := spansOfText(b)
	return coverDiff(list6(a4), list6(a6), list6(b4), list6(b6))
}

// CoverDiffSets is CoverDiff of two sets (their minimal covers). It walks
// their lists in place: a daemon refreshing a 395k-range rule counts its
// change with both sets live.
func CoverDiffSets(a, b *Set) (aOnly, bOnly int) {
	a4, a6 := a.lists()
	b4, b6 := b.lists()
	return coverDiff(a4, a6, b4, b6)
}

// CoverDiffSet is CoverDiffText with a given as a set (its minimal
// cover): an apply's new rule set against the text of its last record.
func CoverDiffSet(a *Set, b []string) (aOnly, bOnly int) {
	a4, a6 := a.lists()
	b4, b6 := spansOfText(b)
	return coverDiff(a4, a6, list6(b4), list6(b6))
}

// coverDiff is CoverDiff of minimal sorted lists.
func coverDiff[A4, B4, A6, B6 list](a4 A4, a6 A6, b4 B4, b6 B6) (aOnly, bOnly int) {
	aOnly = countDifference(a4, b4, 32) + countDifference(a6, b6, 128)
	bOnly = countDifference(b4, a4, 32) + countDifference(b6, a6, 128)
	return aOnly, bOnly
}

// countDifference returns how many prefixes the minimal cover of a minus
// b holds, counted as the differences come: no list of them is made.
func countDifference[A, B list](a A, b B, width int) int {
	n := 0
	eachDifference(a, b, func(s span) { n += countCIDRs(s.lo, s.hi, width) })
	return n
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
