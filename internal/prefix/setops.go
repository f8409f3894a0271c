package prefix

import (
	"slices"

	"go4.org/netipx"
)

// The set operations below work on the sorted ranges of the sets in one
// pass, where netipx.IPSetBuilder would copy every range of both sets
// into its lists, sort them again and normalize them with pointer write
// barriers: for the 395k-range set of a 400k-line feed, compiling one
// rule through IPSetBuilder allocated about 560 MB. The sets are
// immutable, so a result that equals an operand is that operand. A nil
// set counts as empty; the results are never nil.

// Union returns the addresses in a or in b.
func Union(a, b *netipx.IPSet) *netipx.IPSet {
	switch {
	case len(rangesOf(b)) == 0 && a != nil:
		return a
	case len(rangesOf(a)) == 0 && b != nil:
		return b
	}
	a4, a6 := spansOf(a)
	b4, b6 := spansOf(b)
	return setOf(union(a4, b4), union(a6, b6))
}

// Subtract returns the addresses of a that are not in b.
func Subtract(a, b *netipx.IPSet) *netipx.IPSet {
	if !overlaps(a, b) {
		return orEmpty(a)
	}
	a4, a6 := spansOf(a)
	b4, b6 := spansOf(b)
	return setOf(subtract(a4, b4), subtract(a6, b6))
}

// Intersect returns the addresses in both a and b.
func Intersect(a, b *netipx.IPSet) *netipx.IPSet {
	if !overlaps(a, b) {
		return &netipx.IPSet{}
	}
	a4, a6 := spansOf(a)
	b4, b6 := spansOf(b)
	// a ∩ b = a − (a − b); a − b is at most a's size plus b's.
	return setOf(subtract(a4, subtract(a4, b4)), subtract(a6, subtract(a6, b6)))
}

// Family returns the addresses of s in the families asked for: s itself
// when s has nothing of the others, otherwise a copy of the family's
// ranges (the result often outlives s: a view would keep the other
// family's ranges alive with it).
func Family(s *netipx.IPSet, v4, v6 bool) *netipx.IPSet {
	rr, n4 := split(s)
	switch {
	case v4 && v6, v4 && n4 == len(rr), v6 && n4 == 0:
		return orEmpty(s)
	case v4:
		return newIPSet(slices.Clone(rr[:n4]))
	case v6:
		return newIPSet(slices.Clone(rr[n4:]))
	}
	return &netipx.IPSet{}
}

func orEmpty(s *netipx.IPSet) *netipx.IPSet {
	if s == nil {
		return &netipx.IPSet{}
	}
	return s
}

// overlaps reports whether a and b have an address in common, walking
// their sorted ranges once without copying them.
func overlaps(a, b *netipx.IPSet) bool {
	ra, rb := rangesOf(a), rangesOf(b)
	for i, j := 0, 0; i < len(ra) && j < len(rb); {
		x, y := ra[i], rb[j]
		switch {
		case x.To().Less(y.From()):
			i++
		case y.To().Less(x.From()):
			j++
		default:
			return true
		}
	}
	return false
}

// union merges two minimal sorted lists into one.
func union(a, b []span) []span {
	switch {
	case len(b) == 0:
		return a
	case len(a) == 0:
		return b
	}
	out := make([]span, 0, len(a)+len(b))
	for i, j := 0, 0; i < len(a) || j < len(b); {
		var s span
		if j == len(b) || i < len(a) && a[i].lo.Less(b[j].lo) {
			s, i = a[i], i+1
		} else {
			s, j = b[j], j+1
		}
		out = appendMerged(out, s)
	}
	return out
}

// appendMerged appends s to out, a minimal sorted list whose last span
// starts at or before s, merging s into that span when they overlap or
// touch.
func appendMerged(out []span, s span) []span {
	if n := len(out); n > 0 {
		last := &out[n-1]
		// As in mergeSorted: s.lo-1 <= last.hi, which cannot overflow.
		if s.lo == (U128{}) || !last.hi.Less(s.lo.Sub64(1)) {
			if last.hi.Less(s.hi) {
				last.hi = s.hi
			}
			return out
		}
	}
	return append(out, s)
}
