package ban

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/radixsort"
)

// Set is the desired state of all bans, in memory: at most one ban per
// prefix. Bans that are no longer live stay until Prune removes them, but
// List, Counts and Elements ignore them.
//
// A Set holds millions of bans without pointers (see rec), so the garbage
// collector does not walk them: single addresses keyed by their bytes,
// CIDR bans apart (Elements walks the few CIDR bans without scanning the
// addresses), reasons and origins interned.
//
// A Set is not safe for concurrent use; callers lock.
type Set struct {
	a4   map[uint32]rec   // IPv4 addresses, big endian
	a6   map[[16]byte]rec // IPv6 addresses
	nets map[pkey]rec     // CIDR prefixes
	strs strtab
	// tally counts what the maps hold, for Tally; its ByOrigin is kept
	// in byOrigin instead, indexed by the origin's string id.
	tally    Counts
	byOrigin []int
	// exp finds the expired bans for Prune.
	exp wheel
	// n64, while Track64 keeps it, counts the IPv6 address bans (live or
	// not yet pruned) of each /64, by its first 8 bytes: pointer-free,
	// as the rest.
	n64 map[[8]byte]uint32
	// past are the strikes (see Recidive): what is remembered of the
	// prefixes whose last temporary ban ended. A prefix has a ban or a
	// strike, not both.
	past map[pkey]strike
}

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{a4: make(map[uint32]rec), a6: make(map[[16]byte]rec), nets: make(map[pkey]rec)}
}

// get returns the record of prefix p (masked).
func (s *Set) get(p netip.Prefix) (rec, bool) {
	var r rec
	var ok bool
	switch a := p.Addr(); {
	case !p.IsSingleIP():
		r, ok = s.nets[prefixKey(p)]
	case a.Is4():
		r, ok = s.a4[addrKey4(a)]
	default:
		r, ok = s.a6[a.As16()]
	}
	return r, ok
}

// set stores r as the record of p (masked).
func (s *Set) set(p netip.Prefix, r rec) {
	switch a := p.Addr(); {
	case !p.IsSingleIP():
		s.nets[prefixKey(p)] = r
	case a.Is4():
		s.a4[addrKey4(a)] = r
	default:
		k := a.As16()
		if _, ok := s.a6[k]; !ok && s.n64 != nil {
			s.n64[net64(k)]++
		}
		s.a6[k] = r
	}
}

// net64 is the /64 of address key k.
func net64(k [16]byte) (n [8]byte) {
	copy(n[:], k[:8])
	return n
}

// Track64 keeps (on) or drops the count of IPv6 address bans per /64 that
// Count64 reads (a policy with aggregate_v6): some 30 bytes a /64 that
// holds a ban.
func (s *Set) Track64(on bool) {
	switch {
	case !on:
		s.n64 = nil
	case s.n64 == nil:
		s.n64 = make(map[[8]byte]uint32)
		for k := range s.a6 {
			s.n64[net64(k)]++
		}
	}
}

// Count64 is the number of IPv6 address bans inside the /64 p, live or
// not yet pruned (Track64 must be on).
func (s *Set) Count64(p netip.Prefix) int {
	return int(s.n64[net64(p.Masked().Addr().As16())])
}

// del removes the record of p (masked).
func (s *Set) del(p netip.Prefix) {
	switch a := p.Addr(); {
	case !p.IsSingleIP():
		delete(s.nets, prefixKey(p))
	case a.Is4():
		delete(s.a4, addrKey4(a))
	default:
		k := a.As16()
		if _, ok := s.a6[k]; ok && s.n64 != nil {
			n := net64(k)
			if s.n64[n] <= 1 {
				delete(s.n64, n)
			} else {
				s.n64[n]--
			}
		}
		delete(s.a6, k)
	}
}

// eachAddr calls fn for every single-address record until it returns
// false, and reports whether it got to the end.
func (s *Set) eachAddr(fn func(netip.Prefix, rec) bool) bool {
	for k, r := range s.a4 {
		if !fn(netip.PrefixFrom(addrOf4(k), 32), r) {
			return false
		}
	}
	for k, r := range s.a6 {
		if !fn(netip.PrefixFrom(netip.AddrFrom16(k), 128), r) {
			return false
		}
	}
	return true
}

// each calls fn for every record until it returns false.
func (s *Set) each(fn func(netip.Prefix, rec) bool) {
	if !s.eachAddr(fn) {
		return
	}
	for k, r := range s.nets {
		if !fn(k.prefix(), r) {
			return
		}
	}
}

// Put inserts b, or replaces the ban of the same prefix, which it returns
// with existed == true. b.Prefix is stored masked. Put panics if b.Prefix
// is not valid: callers get prefixes from ParsePrefix.
func (s *Set) Put(b Ban) (old Ban, existed bool) {
	if !b.Prefix.IsValid() {
		panic(fmt.Sprintf("ban: Set.Put of invalid prefix %v", b.Prefix))
	}
	b.Prefix = b.Prefix.Masked()
	if s.past != nil {
		delete(s.past, prefixKey(b.Prefix)) // the ban takes the strike's place
	}
	r := rec{expires: nanos(b.Expires), created: nanos(b.Created), reason: s.strs.ref(b.Reason), origin: s.strs.ref(b.Origin)}
	if o, ok := s.get(b.Prefix); ok {
		old, existed = s.ban(b.Prefix, o), true
		s.drop(old, o)
	}
	s.set(b.Prefix, r)
	s.exp.add(b.Prefix, r.expires)
	if s.exp.n > 2*s.Len()+reindexSlack {
		s.reindex()
	}
	s.count(b, r.origin, 1)
	return old, existed
}

// drop releases what record r of ban b holds: its strings, its count.
func (s *Set) drop(b Ban, r rec) {
	s.count(b, r.origin, -1)
	s.strs.unref(r.reason)
	s.strs.unref(r.origin)
}

// lookup returns p masked and its record; false if p is invalid or has
// no ban.
func (s *Set) lookup(p netip.Prefix) (netip.Prefix, rec, bool) {
	if !p.IsValid() {
		return p, rec{}, false
	}
	p = p.Masked()
	r, ok := s.get(p)
	return p, r, ok
}

// Delete removes the ban of prefix p (masked) and returns it, or reports
// false if there is none (an invalid p has none).
func (s *Set) Delete(p netip.Prefix) (Ban, bool) {
	p, r, ok := s.lookup(p)
	if !ok {
		return Ban{}, false
	}
	b := s.ban(p, r)
	s.del(p)
	s.drop(b, r)
	return b, true
}

// Get returns the ban of prefix p (masked), live or not, or reports false
// if there is none.
func (s *Set) Get(p netip.Prefix) (Ban, bool) {
	p, r, ok := s.lookup(p)
	if !ok {
		return Ban{}, false
	}
	return s.ban(p, r), true
}

// Covering returns a live ban at now whose prefix contains addr: the
// address's own ban if any, else the longest covering prefix ban. It looks
// the address up and walks the CIDR bans only (not the addresses).
func (s *Set) Covering(addr netip.Addr, now time.Time) (Ban, bool) {
	addr = addr.Unmap()
	t := nowNanos(now)
	own := netip.PrefixFrom(addr, addr.BitLen())
	if r, ok := s.get(own); ok && r.live(t) {
		return s.ban(own, r), true
	}
	var best netip.Prefix
	var bestRec rec
	for k, r := range s.nets {
		p := k.prefix()
		if p.Contains(addr) && r.live(t) && (!best.IsValid() || p.Bits() > best.Bits()) {
			best, bestRec = p, r
		}
	}
	if !best.IsValid() {
		return Ban{}, false
	}
	return s.ban(best, bestRec), true
}

// EachNet calls fn for the prefix (not single-address) bans, live or
// not, in no particular order, until fn returns false.
func (s *Set) EachNet(fn func(Ban) bool) {
	for k, r := range s.nets {
		if !fn(s.ban(k.prefix(), r)) {
			return
		}
	}
}

// EachAddr calls fn for single-address bans, in no particular order (a
// different one each time), until fn returns false.
func (s *Set) EachAddr(fn func(Ban) bool) {
	s.eachAddr(func(p netip.Prefix, r rec) bool { return fn(s.ban(p, r)) })
}

// Len returns the number of bans, live or not.
func (s *Set) Len() int { return len(s.a4) + len(s.a6) + len(s.nets) }

// Prune removes the bans that are no longer live at now and returns them,
// sorted by prefix as List sorts.
func (s *Set) Prune(now time.Time) []Ban {
	t := nowNanos(now)
	var gone []Ban
	s.exp.due(t, func(p netip.Prefix) (keep bool) {
		r, ok := s.get(p)
		switch {
		case !ok || r.expires == 0:
			return false // lifted, or made permanent
		case !r.live(t):
			b, _ := s.Delete(p)
			gone = append(gone, b)
			return false
		default: // due later in now's second, or replaced by a later ban
			return second(r.expires) == second(t)
		}
	})
	slices.SortFunc(gone, func(a, b Ban) int { return comparePrefix(a.Prefix, b.Prefix) })
	return gone
}

// reindexSlack is how many stale expiry entries beyond the bans' number
// Put lets pile up before reindex (a variable for tests).
var reindexSlack = 4096

// reindex rebuilds the expiry wheel from the bans, without its stale
// entries. Put calls it when they outnumber the bans, so it costs O(1) per
// Put over time.
func (s *Set) reindex() {
	s.exp = wheel{}
	s.each(func(p netip.Prefix, r rec) bool {
		s.exp.add(p, r.expires)
		return true
	})
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
	t := nowNanos(now)
	var k Keys
	s.each(func(p netip.Prefix, r rec) bool {
		if !r.live(t) || !f.match(s.ban(p, r)) {
			return true
		}
		if a := p.Addr(); a.Is4() {
			k.k4 = append(k.k4, key4(a, uint32(p.Bits())))
		} else {
			k.k6 = append(k.k6, newKey6(a, uint32(p.Bits())))
		}
		return true
	})
	return k
}

// Len is the number of keys.
func (k Keys) Len() int { return len(k.k4) + len(k.k6) }

// Sort sorts the keys in List's order. It does not touch the Set.
func (k Keys) Sort() {
	radixsort.Sort(k.k4, 0)
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

// count adds d to the tally of b's kind and of its origin (string id).
func (s *Set) count(b Ban, origin uint32, d int) {
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
	if int(origin) >= len(s.byOrigin) {
		s.byOrigin = append(s.byOrigin, make([]int, int(origin)+1-len(s.byOrigin))...)
	}
	s.byOrigin[origin] += d
}

// Tally counts the bans the set holds by family and by origin, live or
// not (Prune removes the expired ones), in time independent of their
// number: for frequent count queries. Counts is exact at a given time.
func (s *Set) Tally() Counts {
	c := s.tally
	c.ByOrigin = make(map[string]int)
	for id, n := range s.byOrigin {
		if n != 0 {
			c.ByOrigin[s.strs.str(uint32(id))] = n
		}
	}
	return c
}

// Counts counts the live bans at now by family and by origin.
func (s *Set) Counts(now time.Time) Counts {
	c := Counts{ByOrigin: make(map[string]int)}
	t := nowNanos(now)
	s.each(func(p netip.Prefix, r rec) bool {
		if !r.live(t) {
			return true
		}
		c.ByOrigin[s.strs.str(r.origin)]++
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
		return true
	})
	return c
}
