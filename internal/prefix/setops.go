package prefix

import (
	"slices"

	"go4.org/netipx"
)

// The set operations below work on the sorted ranges of the sets in one
// pass, where netipx.IPSetBuilder would copy every range of both sets
// into its lists, sort them again and normalize them with pointer write
// barriers: for the 395k-range set of a 400k-line feed, compiling one
// rule through IPSetBuilder allocated about 560 MB. They read the sets'
// ranges in place and write only the result's (a copy of both as spans
// took 24 MB more for that set, beside the set itself, while a daemon
// refreshed it). The sets are immutable, so a result that equals an
// operand is that operand. A nil set counts as empty; the results are
// never nil.
//
// Both families are one sorted list: netip.Addr orders every IPv4
// address before every IPv6 one, and no range spans both.

// Union returns the addresses in a or in b.
func Union(a, b *netipx.IPSet) *netipx.IPSet {
	switch {
	case len(rangesOf(b)) == 0 && a != nil:
		return a
	case len(rangesOf(a)) == 0 && b != nil:
		return b
	}
	ra, rb := rangesOf(a), rangesOf(b)
	out := make([]netipx.IPRange, 0, len(ra)+len(rb))
	for i, j := 0, 0; i < len(ra) || j < len(rb); {
		var r netipx.IPRange
		if j == len(rb) || i < len(ra) && ra[i].From().Less(rb[j].From()) {
			r, i = ra[i], i+1
		} else {
			r, j = rb[j], j+1
		}
		out = appendMergedRange(out, r)
	}
	return newIPSet(fit(out))
}

// fit returns rr, copied to its length when it has much room to spare:
// the set keeps its array for as long as it lives.
func fit(rr []netipx.IPRange) []netipx.IPRange {
	if cap(rr)-len(rr) > len(rr)/4+16 {
		return slices.Clone(rr)
	}
	return rr
}

// appendMergedRange appends r to out, a minimal sorted list whose last
// range starts at or before r, merging r into that range when they
// overlap or touch.
func appendMergedRange(out []netipx.IPRange, r netipx.IPRange) []netipx.IPRange {
	if n := len(out); n > 0 {
		last := out[n-1]
		// r touches last when r.From()-1 <= last.To(). The first
		// address of a family has no address before it: r then starts
		// where last does, or in the other family.
		prev := r.From().Prev()
		if touches := prev.IsValid() && !last.To().Less(prev) || !prev.IsValid() && last.From() == r.From(); touches {
			if last.To().Less(r.To()) {
				out[n-1] = netipx.IPRangeFrom(last.From(), r.To())
			}
			return out
		}
	}
	return append(out, r)
}

// Subtract returns the addresses of a that are not in b.
func Subtract(a, b *netipx.IPSet) *netipx.IPSet {
	if !overlaps(a, b) {
		return orEmpty(a)
	}
	ra, rb := rangesOf(a), rangesOf(b)
	out := make([]netipx.IPRange, 0, len(ra)+len(rb))
	eachDifferenceRange(ra, rb, func(r netipx.IPRange) { out = append(out, r) })
	return newIPSet(fit(out))
}

// eachDifferenceRange calls fn, in order, with the ranges of ra minus rb
// (both sorted, minimal lists), a minimal sorted list itself.
func eachDifferenceRange(ra, rb []netipx.IPRange, fn func(netipx.IPRange)) {
	j := 0
	for _, r := range ra {
		for j < len(rb) && rb[j].To().Less(r.From()) {
			j++
		}
		lo, done := r.From(), false
		for k := j; k < len(rb) && !r.To().Less(rb[k].From()); k++ {
			if lo.Less(rb[k].From()) {
				fn(netipx.IPRangeFrom(lo, rb[k].From().Prev()))
			}
			if !rb[k].To().Less(r.To()) {
				done = true
				break
			}
			lo = rb[k].To().Next()
		}
		if !done {
			fn(netipx.IPRangeFrom(lo, r.To()))
		}
	}
}

// Intersect returns the addresses in both a and b.
func Intersect(a, b *netipx.IPSet) *netipx.IPSet {
	if !overlaps(a, b) {
		return &netipx.IPSet{}
	}
	var out []netipx.IPRange
	eachOverlap(rangesOf(a), rangesOf(b), func(x, y netipx.IPRange) bool {
		lo, hi := x.From(), x.To()
		if lo.Less(y.From()) {
			lo = y.From()
		}
		if y.To().Less(hi) {
			hi = y.To()
		}
		out = append(out, netipx.IPRangeFrom(lo, hi))
		return true
	})
	return newIPSet(fit(out))
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
	found := false
	eachOverlap(rangesOf(a), rangesOf(b), func(netipx.IPRange, netipx.IPRange) bool {
		found = true
		return false
	})
	return found
}

// eachOverlap calls fn, in order, with each pair of a range of ra and one
// of rb that overlap (both sorted, minimal lists), until fn returns false.
func eachOverlap(ra, rb []netipx.IPRange, fn func(x, y netipx.IPRange) bool) {
	for i, j := 0, 0; i < len(ra) && j < len(rb); {
		x, y := ra[i], rb[j]
		switch {
		case x.To().Less(y.From()):
			i++
		case y.To().Less(x.From()):
			j++
		default:
			if !fn(x, y) {
				return
			}
			// The one that ends first overlaps nothing further.
			if x.To().Less(y.To()) {
				i++
			} else {
				j++
			}
		}
	}
}
