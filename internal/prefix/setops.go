package prefix

// The set operations below walk the sorted lists of both sets once per
// family and write only the result's (a copy of both, or a
// netipx.IPSetBuilder that sorts them again, took tens of megabytes for
// a 400k-line feed). The sets are immutable, so a result that holds the
// same addresses as an operand is that operand, or shares its lists. A
// nil set counts as empty; the results are never nil.

// Union returns the addresses in a or in b.
func Union(a, b *Set) *Set {
	switch {
	case b.Empty() && a != nil:
		return a
	case a.Empty() && b != nil:
		return b
	}
	return combine(a, b, eachUnion[list4, list4], eachUnion[list6, list6])
}

// Subtract returns the addresses of a that are not in b.
func Subtract(a, b *Set) *Set {
	if !overlaps(a, b) {
		return orEmpty(a)
	}
	return combine(a, b, eachDifference[list4, list4], eachDifference[list6, list6])
}

// Intersect returns the addresses in both a and b.
func Intersect(a, b *Set) *Set {
	if !overlaps(a, b) {
		return &Set{}
	}
	return combine(a, b, eachIntersection[list4, list4], eachIntersection[list6, list6])
}

// combine returns the set of what op4 and op6 make of a's and b's lists
// of each family.
func combine(a, b *Set, op4 func(x, y list4, fn func(span)), op6 func(x, y list6, fn func(span))) *Set {
	a4, a6 := a.lists()
	b4, b6 := b.lists()
	v4, _ := collect(true, len(a4)+len(b4), func(fn func(span)) { op4(a4, b4, fn) })
	_, v6 := collect(false, len(a6)+len(b6), func(fn func(span)) { op6(a6, b6, fn) })
	return setOfPacked(v4, v6)
}

// eachUnion calls fn, in order, with the spans of the union of a and b
// (minimal sorted lists), a minimal sorted list itself.
func eachUnion[A, B list](a A, b B, fn func(span)) {
	var cur span
	have := false
	add := func(s span) {
		// s touches cur when s.lo-1 <= cur.hi; s.lo == 0 means cur
		// starts at 0 too.
		if have && (s.lo == (U128{}) || !cur.hi.Less(s.lo.Sub64(1))) {
			if cur.hi.Less(s.hi) {
				cur.hi = s.hi
			}
			return
		}
		if have {
			fn(cur)
		}
		cur, have = s, true
	}
	i, j, na, nb := 0, 0, a.Len(), b.Len()
	for i < na || j < nb {
		if j == nb || i < na && a.At(i).lo.Less(b.At(j).lo) {
			add(a.At(i))
			i++
		} else {
			add(b.At(j))
			j++
		}
	}
	if have {
		fn(cur)
	}
}

// eachDifference calls fn, in order, with the spans of a minus b (both
// minimal sorted lists), a minimal sorted list itself.
func eachDifference[A, B list](a A, b B, fn func(span)) {
	j, nb := 0, b.Len()
	for i := range a.Len() {
		r := a.At(i)
		for j < nb && b.At(j).hi.Less(r.lo) {
			j++
		}
		lo, done := r.lo, false
		for k := j; k < nb; k++ {
			bk := b.At(k)
			if r.hi.Less(bk.lo) {
				break
			}
			if lo.Less(bk.lo) {
				fn(span{lo, bk.lo.Sub64(1)})
			}
			if !bk.hi.Less(r.hi) {
				done = true
				break
			}
			lo = bk.hi.Add64(1)
		}
		if !done {
			fn(span{lo, r.hi})
		}
	}
}

// eachIntersection calls fn, in order, with the spans of both a and b
// (minimal sorted lists), a minimal sorted list itself.
func eachIntersection[A, B list](a A, b B, fn func(span)) {
	eachOverlap(a, b, func(x, y span) bool {
		lo, hi := x.lo, x.hi
		if lo.Less(y.lo) {
			lo = y.lo
		}
		if y.hi.Less(hi) {
			hi = y.hi
		}
		fn(span{lo, hi})
		return true
	})
}

// Family returns the addresses of s in the families asked for (sharing
// s's list of each).
func Family(s *Set, v4, v6 bool) *Set {
	a, b := s.lists()
	switch {
	case (v4 || len(a) == 0) && (v6 || len(b) == 0):
		return orEmpty(s)
	case v4:
		return &Set{v4: a}
	case v6:
		return &Set{v6: b}
	}
	return &Set{}
}

func orEmpty(s *Set) *Set {
	if s == nil {
		return &Set{}
	}
	return s
}

// overlaps reports whether a and b have an address in common.
func overlaps(a, b *Set) bool {
	a4, a6 := a.lists()
	b4, b6 := b.lists()
	found := false
	stop := func(span, span) bool {
		found = true
		return false
	}
	eachOverlap(a4, b4, stop)
	if !found {
		eachOverlap(a6, b6, stop)
	}
	return found
}

// eachOverlap calls fn, in order, with each pair of a span of a and one of
// b that overlap (both minimal sorted lists), until fn returns false.
func eachOverlap[A, B list](a A, b B, fn func(x, y span) bool) {
	for i, j, na, nb := 0, 0, a.Len(), b.Len(); i < na && j < nb; {
		x, y := a.At(i), b.At(j)
		switch {
		case x.hi.Less(y.lo):
			i++
		case y.hi.Less(x.lo):
			j++
		default:
			if !fn(x, y) {
				return
			}
			// The one that ends first overlaps nothing further.
			if x.hi.Less(y.hi) {
				i++
			} else {
				j++
			}
		}
	}
}
