package ban

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/radix"
)

// Set is the desired state of all bans, in memory: at most one ban per
// prefix. Bans that are no longer live stay until Prune removes them, but
// List, Counts and Elements ignore them.
//
// A Set is not safe for concurrent use; callers lock.
type Set struct {
	// Single-address bans and CIDR bans apart: Elements walks the few
	// CIDR bans without scanning the (possibly millions of) addresses.
	addrs map[netip.Prefix]Ban
	nets  map[netip.Prefix]Ban
	// tally counts what the maps hold, for Tally.
	tally Counts
}

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{addrs: make(map[netip.Prefix]Ban), nets: make(map[netip.Prefix]Ban), tally: Counts{ByOrigin: map[string]int{}}}
}

// mapFor returns the map that holds bans of prefix p (masked).
func (s *Set) mapFor(p netip.Prefix) map[netip.Prefix]Ban {
	if p.IsSingleIP() {
		return s.addrs
	}
	return s.nets
}

// Put inserts b, or replaces the ban of the same prefix, which it returns
// with existed == true. b.Prefix is stored masked. Put panics if b.Prefix
// is not valid: callers get prefixes from ParsePrefix.
func (s *Set) Put(b Ban) (old Ban, existed bool) {
	if !b.Prefix.IsValid() {
		panic(fmt.Sprintf("ban: Set.Put of invalid prefix %v", b.Prefix))
	}
	b.Prefix = b.Prefix.Masked()
	m := s.mapFor(b.Prefix)
	old, existed = m[b.Prefix]
	if existed {
		s.count(old, -1)
	}
	m[b.Prefix] = b
	s.count(b, 1)
	return old, existed
}

// Delete removes the ban of prefix p (masked) and returns it, or reports
// false if there is none (an invalid p has none).
func (s *Set) Delete(p netip.Prefix) (Ban, bool) {
	p = p.Masked()
	m := s.mapFor(p)
	b, ok := m[p]
	if ok {
		delete(m, p)
		s.count(b, -1)
	}
	return b, ok
}

// Get returns the ban of prefix p (masked), live or not, or reports false
// if there is none.
func (s *Set) Get(p netip.Prefix) (Ban, bool) {
	p = p.Masked()
	b, ok := s.mapFor(p)[p]
	return b, ok
}

// Covering returns a live ban at now whose prefix contains addr: the
// address's own ban if any, else the longest covering prefix ban. It looks
// the address up and walks the CIDR bans only (not the addresses).
func (s *Set) Covering(addr netip.Addr, now time.Time) (Ban, bool) {
	addr = addr.Unmap()
	if b, ok := s.addrs[netip.PrefixFrom(addr, addr.BitLen())]; ok && b.Live(now) {
		return b, true
	}
	var best Ban
	found := false
	for p, b := range s.nets {
		if p.Contains(addr) && b.Live(now) && (!found || p.Bits() > best.Prefix.Bits()) {
			best, found = b, true
		}
	}
	return best, found
}

// EachAddr calls fn for single-address bans, in no particular order (a
// different one each time), until fn returns false.
func (s *Set) EachAddr(fn func(Ban) bool) {
	for _, b := range s.addrs {
		if !fn(b) {
			return
		}
	}
}

// Len returns the number of bans, live or not.
func (s *Set) Len() int { return len(s.addrs) + len(s.nets) }

// Prune removes the bans that are no longer live at now and returns them,
// sorted by prefix as List sorts.
func (s *Set) Prune(now time.Time) []Ban {
	var gone []Ban
	for _, m := range []map[netip.Prefix]Ban{s.addrs, s.nets} {
		for p, b := range m {
			if !b.Live(now) {
				gone = append(gone, b)
				delete(m, p)
				s.count(b, -1)
			}
		}
	}
	slices.SortFunc(gone, func(a, b Ban) int { return comparePrefix(a.Prefix, b.Prefix) })
	return gone
}

// Filter selects bans for List. Its zero value selects all.
type Filter struct {
	Within netip.Prefix // ban prefix inside it (equal included); zero: any
	Origin string       // Origin equal to it; "": any
	Reason string       // Reason containing it; "": any
}

// match reports whether f selects b.
func (f Filter) match(b Ban) bool {
	if f.Within.IsValid() {
		if b.Prefix.Bits() < f.Within.Bits() || !f.Within.Contains(b.Prefix.Addr()) {
			return false
		}
	}
	if f.Origin != "" && b.Origin != f.Origin {
		return false
	}
	return f.Reason == "" || strings.Contains(b.Reason, f.Reason)
}

// List returns the live bans at now that f selects, sorted by prefix (IPv4
// first, then by address, then by length), paged: at most limit of them
// (limit <= 0: all) after skipping offset (offset < 0 counts as 0). total
// is how many f selects, before paging.
func (s *Set) List(now time.Time, f Filter, offset, limit int) (page []Ban, total int) {
	k := s.Match(now, f)
	k.Sort()
	return s.Page(k, offset, limit), k.Len()
}

// Keys are the sorting keys of a selection of bans: List in three steps,
// so that a caller who locks the Set holds the lock only while Match
// walks the bans and Page fetches a page, not while Sort sorts (a second
// or so for millions).
type Keys struct {
	k4 []uint64
	k6 []key6
}

// Match returns the keys of the live bans at now that f selects.
func (s *Set) Match(now time.Time, f Filter) Keys {
	f.Within = f.Within.Masked()
	var k Keys
	for _, m := range []map[netip.Prefix]Ban{s.addrs, s.nets} {
		for p, b := range m {
			if !b.Live(now) || !f.match(b) {
				continue
			}
			if a := p.Addr(); a.Is4() {
				k.k4 = append(k.k4, key4(a, uint32(p.Bits())))
			} else {
				k.k6 = append(k.k6, newKey6(a, uint32(p.Bits())))
			}
		}
	}
	return k
}

// Len is the number of keys.
func (k Keys) Len() int { return len(k.k4) + len(k.k6) }

// Sort sorts the keys in List's order. It does not touch the Set.
func (k Keys) Sort() {
	radix.Sort(k.k4, 0)
	slices.SortFunc(k.k6, compareKey6)
}

// Page returns the bans of sorted keys offset to offset+limit (limit <=
// 0: to the end); a ban deleted since Match is left out.
func (s *Set) Page(k Keys, offset, limit int) []Ban {
	total := k.Len()
	offset = max(offset, 0)
	n := total - min(offset, total)
	if limit > 0 {
		n = min(n, limit)
	}
	if n == 0 {
		return nil
	}
	page := make([]Ban, 0, n)
	for i := offset; i < offset+n; i++ {
		var p netip.Prefix
		if i < len(k.k4) {
			p = netip.PrefixFrom(addr4(k.k4[i]), int(uint32(k.k4[i])))
		} else {
			kk := k.k6[i-len(k.k4)]
			p = netip.PrefixFrom(kk.addr(), int(kk.tail))
		}
		if b, ok := s.Get(p); ok {
			page = append(page, b)
		}
	}
	return page
}

// Counts counts live bans.
type Counts struct {
	Addr4, Addr6 int            // single addresses (/32, /128)
	Net4, Net6   int            // CIDR prefixes
	ByOrigin     map[string]int // by Ban.Origin ("" included), all families
}

// Total returns the number of live bans counted.
func (c Counts) Total() int { return c.Addr4 + c.Addr6 + c.Net4 + c.Net6 }

// count adds d to the tally of b's kind and origin.
func (s *Set) count(b Ban, d int) {
	switch a := b.Prefix.Addr(); {
	case b.IsAddr() && a.Is4():
		s.tally.Addr4 += d
	case b.IsAddr():
		s.tally.Addr6 += d
	case a.Is4():
		s.tally.Net4 += d
	default:
		s.tally.Net6 += d
	}
	if s.tally.ByOrigin[b.Origin] += d; s.tally.ByOrigin[b.Origin] == 0 {
		delete(s.tally.ByOrigin, b.Origin)
	}
}

// Tally counts the bans the set holds by family and by origin, live or
// not (Prune removes the expired ones), in time independent of their
// number: for frequent count queries. Counts is exact at a given time.
func (s *Set) Tally() Counts {
	c := s.tally
	c.ByOrigin = make(map[string]int, len(s.tally.ByOrigin))
	for o, n := range s.tally.ByOrigin {
		c.ByOrigin[o] = n
	}
	return c
}

// Counts counts the live bans at now by family and by origin.
func (s *Set) Counts(now time.Time) Counts {
	c := Counts{ByOrigin: make(map[string]int)}
	for _, m := range []map[netip.Prefix]Ban{s.addrs, s.nets} {
		for p, b := range m {
			if !b.Live(now) {
				continue
			}
			c.ByOrigin[b.Origin]++
			switch single, v4 := p.IsSingleIP(), p.Addr().Is4(); {
			case single && v4:
				c.Addr4++
			case single:
				c.Addr6++
			case v4:
				c.Net4++
			default:
				c.Net6++
			}
		}
	}
	return c
}
