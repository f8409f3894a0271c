package prefix

import (
	"iter"
	"net/netip"
	"slices"

	"go4.org/netipx"
)

// Set is an immutable set of IPv4 and IPv6 addresses, held as the sorted
// list of its maximal ranges per family, without pointers: an IPv4 range
// is one uint64 (first address << 32 | last), an IPv6 range two U128s.
// That is 8 and 32 bytes a range where a netipx.IPSet takes 48 (two
// netip.Addr, each with its zone pointer), and the collector has nothing
// to scan in it: for the 395k ranges of a 400k-line feed, 3.2 MB instead
// of 19 MB, held by every loaded rule and once more while a refresh
// compiles its successor.
//
// A nil *Set is empty. The zero Set is empty and ready to use. Sets are
// never modified once made, so the functions of this package return an
// operand itself, or share its lists, when the result holds the same
// addresses.
type Set struct {
	v4 []uint64 // first<<32 | last, sorted, none overlapping or touching
	v6 []span   // likewise
}

// mask32 keeps the last address of a packed IPv4 range.
const mask32 = 1<<32 - 1

// list is one family's ranges, a minimal sorted list, as either packing
// keeps them: the set operations are written once over it (each
// instantiation is compiled for its packing, so At is inlined).
type list interface {
	Len() int
	At(i int) span
}

// list4 is a packed IPv4 list (Set.v4, Builder's).
type list4 []uint64

func (l list4) Len() int { return len(l) }

func (l list4) At(i int) span {
	x := l[i]
	return span{U128{0, x >> 32}, U128{0, x & mask32}}
}

// list6 is a list of spans: IPv6 ranges, or a family's spans unpacked.
type list6 []span

func (l list6) Len() int      { return len(l) }
func (l list6) At(i int) span { return l[i] }

// packSpan4 packs an IPv4 span.
func packSpan4(s span) uint64 { return s.lo.Lo<<32 | s.hi.Lo }

// lists returns s's two lists (empty for a nil s).
func (s *Set) lists() (list4, list6) {
	if s == nil {
		return nil, nil
	}
	return s.v4, s.v6
}

// setOfPacked returns the set of two minimal sorted lists, which it takes
// over (an empty set for two empty ones).
func setOfPacked(v4 []uint64, v6 []span) *Set {
	if len(v4) == 0 {
		v4 = nil
	}
	if len(v6) == 0 {
		v6 = nil
	}
	return &Set{v4: v4, v6: v6}
}

// setOf returns the set of two minimal sorted lists of spans; it packs
// the IPv4 one and takes the IPv6 one over.
func setOf(v4, v6 []span) *Set {
	return setOfPacked(pack4(make([]uint64, 0, len(v4)), v4), v6)
}

// collect returns the packed list of the spans each produces, in order
// (a minimal sorted list when they are one), for the family is4 (for
// IPv6 in v6, for IPv4 in v4): the lists are sized for n, and copied to
// their length when that left much unused.
func collect(is4 bool, n int, each func(fn func(span))) (v4 []uint64, v6 []span) {
	if is4 {
		v4 = make([]uint64, 0, n)
		each(func(s span) { v4 = append(v4, packSpan4(s)) })
		return fit(v4), nil
	}
	v6 = make([]span, 0, n)
	each(func(s span) { v6 = append(v6, s) })
	return nil, fit(v6)
}

// fit returns l, copied to its length when it has much room to spare:
// a set keeps its arrays for as long as it lives.
func fit[T any](l []T) []T {
	if cap(l)-len(l) > len(l)/4+16 {
		return slices.Clone(l)
	}
	return l
}

// FromIPSet returns the addresses of s (nil: none) as a Set.
func FromIPSet(s *netipx.IPSet) *Set {
	v4, v6 := spansOf(s)
	return setOf(v4, v6)
}

// IPSet returns s as a netipx.IPSet (a new one, 48 bytes a range), for
// code written against netipx.
func (s *Set) IPSet() *netipx.IPSet {
	v4, v6 := s.lists()
	rr := make([]netipx.IPRange, 0, len(v4)+len(v6))
	for r := range s.All() {
		rr = append(rr, r)
	}
	return newIPSet(rr)
}

// All yields the ranges of s: IPv4 first, each family in address order.
func (s *Set) All() iter.Seq[netipx.IPRange] {
	return func(yield func(netipx.IPRange) bool) {
		v4, v6 := s.lists()
		for i := range v4.Len() {
			if !yield(v4.At(i).ipRange(32)) {
				return
			}
		}
		for _, sp := range v6 {
			if !yield(sp.ipRange(128)) {
				return
			}
		}
	}
}

// ipRange returns s as a netipx.IPRange of its family (width 32 or 128).
func (s span) ipRange(width int) netipx.IPRange {
	return netipx.IPRangeFrom(s.lo.Addr(width), s.hi.Addr(width))
}

// Ranges returns the ranges of s, as All yields them, in a new slice.
func (s *Set) Ranges() []netipx.IPRange { return slices.Collect(s.All()) }

// Len returns how many IPv4 and IPv6 ranges s holds.
func (s *Set) Len() (v4, v6 int) {
	a, b := s.lists()
	return len(a), len(b)
}

// Empty reports whether s holds no address.
func (s *Set) Empty() bool {
	n4, n6 := s.Len()
	return n4 == 0 && n6 == 0
}

// Bytes returns the memory s's lists take.
func (s *Set) Bytes() int {
	v4, v6 := s.lists()
	return 8*cap(v4) + 32*cap(v6)
}

// Equal reports whether s and t hold the same addresses.
func (s *Set) Equal(t *Set) bool {
	s4, s6 := s.lists()
	t4, t6 := t.lists()
	return slices.Equal(s4, t4) && slices.Equal(s6, t6)
}

// Contains reports whether s holds a. As for netipx.IPSet, an
// IPv4-mapped IPv6 address is an IPv6 address, and an address with a
// zone is in no set.
func (s *Set) Contains(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	// The last range starting at or before a holds a if any does.
	u := U128From(a)
	r, ok := s.startingBy(a.Is4(), u)
	return ok && !r.hi.Less(u)
}

// each calls fn with each range of the family is4 of s, in order.
func (s *Set) each(is4 bool, fn func(span)) {
	v4, v6 := s.lists()
	if is4 {
		eachOf(v4, fn)
	} else {
		eachOf(v6, fn)
	}
}

// eachOf calls fn with each span of l, in order.
func eachOf[L list](l L, fn func(span)) {
	for i := range l.Len() {
		fn(l.At(i))
	}
}

// ContainsPrefix reports whether s holds every address of p (false for
// an invalid p).
func (s *Set) ContainsPrefix(p netip.Prefix) bool {
	is4, q, ok := spanOfPrefix(p)
	r, found := s.startingBy(is4, q.lo)
	return ok && found && !r.hi.Less(q.hi)
}

// OverlapsPrefix reports whether s holds an address of p (false for an
// invalid p).
func (s *Set) OverlapsPrefix(p netip.Prefix) bool {
	// The last range starting at or before p's last address overlaps p
	// if any does.
	is4, q, ok := spanOfPrefix(p)
	r, found := s.startingBy(is4, q.hi)
	return ok && found && !r.hi.Less(q.lo)
}

// spanOfPrefix returns p's family and addresses; false for an invalid p.
func spanOfPrefix(p netip.Prefix) (is4 bool, q span, ok bool) {
	if !p.IsValid() {
		return false, span{}, false
	}
	is4 = p.Addr().Is4()
	return is4, prefixSpan(U128From(p.Addr()), p.Bits(), widthOf(is4)), true
}

// startingBy returns the last range of the family is4 that starts at or
// before a; false if none does.
func (s *Set) startingBy(is4 bool, a U128) (span, bool) {
	v4, v6 := s.lists()
	if is4 {
		// The first range starting after a: a range from a to the
		// last address packs to the key itself.
		i, found := slices.BinarySearch(v4, a.Lo<<32|mask32)
		if found {
			i++
		}
		if i == 0 {
			return span{}, false
		}
		return v4.At(i - 1), true
	}
	i, _ := slices.BinarySearchFunc(v6, a, func(sp span, a U128) int {
		if a.Less(sp.lo) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return span{}, false
	}
	return v6[i-1], true
}
