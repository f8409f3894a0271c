package ban

import (
	"net/netip"
	"slices"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/radixsort"
)

// Element is what a kernel set holds: a prefix and when it expires (zero:
// never).
type Element struct {
	Prefix  netip.Prefix
	Expires time.Time
}

// compareElement orders elements by prefix as List orders bans.
func compareElement(a, b Element) int { return comparePrefix(a.Prefix, b.Prefix) }

// Elements returns what the kernel must hold for the live bans at now.
//
// addrs has every live single-address ban with its expiry, for hash sets.
// A CIDR ban covering an address does not remove it from addrs.
//
// nets has the live CIDR bans turned into disjoint prefixes, each expiring
// when the last ban covering it expires (the latest expiry; permanent
// wins): 10.0.0.0/8 for 1h plus 10.1.0.0/16 for 1d give 10.1.0.0/16 (1d)
// and the rest of 10.0.0.0/8 (1h). Adjacent pieces with the same expiry
// are merged, and every maximal run of equal expiry is written as its
// minimal list of CIDR prefixes.
//
// Both lists are sorted by prefix, IPv4 first.
func (s *Set) Elements(now time.Time) (addrs, nets []Element) {
	return s.AddrElements(now), s.NetElements(now)
}

// AddrElements returns the addrs of Elements alone: the live
// single-address bans, sorted. It sorts packed keys (address and an index
// into a table of expiries), not Elements: several times faster with
// millions of bans.
func (s *Set) AddrElements(now time.Time) []Element {
	t := nowNanos(now)
	var (
		k4   = make([]uint64, 0, len(s.a4))
		k6   = make([]key6, 0, len(s.a6))
		exps = make([]int64, 0, len(s.a4)+len(s.a6))
	)
	for a, r := range s.a4 {
		if r.live(t) {
			k4 = append(k4, uint64(a)<<32|uint64(len(exps)))
			exps = append(exps, r.expires)
		}
	}
	for a, r := range s.a6 {
		if r.live(t) {
			k6 = append(k6, newKey6(netip.AddrFrom16(a), uint32(len(exps))))
			exps = append(exps, r.expires)
		}
	}
	radixsort.Sort(k4, 32) // addresses are unique: the index does not matter
	slices.SortFunc(k6, compareKey6)
	out := make([]Element, 0, len(exps))
	for _, k := range k4 {
		out = append(out, Element{netip.PrefixFrom(addr4(k), 32), fromNanos(exps[uint32(k)])})
	}
	for _, k := range k6 {
		out = append(out, Element{netip.PrefixFrom(k.addr(), 128), fromNanos(exps[k.tail])})
	}
	return out
}

// NetElements returns the nets of Elements alone: the live CIDR bans as
// disjoint prefixes. It does not look at the single-address bans, so it
// costs what the (usually few) CIDR bans cost.
func (s *Set) NetElements(now time.Time) []Element {
	t := nowNanos(now)
	cidrs := make([]Element, 0, len(s.nets))
	for k, r := range s.nets {
		if r.live(t) {
			cidrs = append(cidrs, Element{k.prefix(), fromNanos(r.expires)})
		}
	}
	slices.SortFunc(cidrs, compareElement)
	return disjoint(cidrs)
}

// span is a run of consecutive addresses with one expiry.
type span struct {
	from, to netip.Addr
	expires  time.Time
}

// disjoint turns CIDR ban elements, sorted by compareElement with no prefix
// twice, into disjoint prefixes each carrying the latest expiry of the
// elements covering it, merged into minimal CIDRs per run of equal expiry.
//
// Prefixes are nested or disjoint, and the order puts a prefix before
// those it contains, so one sweep with a stack of the open (enclosing)
// prefixes assigns every address its latest expiry: the effective expiry
// of a prefix is the later of its own and its parent's.
func disjoint(cidrs []Element) []Element {
	type open struct {
		last    netip.Addr
		expires time.Time // effective: the latest of it and its ancestors
	}
	var (
		stack []open
		spans []span
		pos   netip.Addr // first address not yet given to a span, while stack is not empty
	)
	emit := func(from, to netip.Addr, exp time.Time) {
		if n := len(spans); n > 0 && spans[n-1].to.Next() == from && spans[n-1].expires.Equal(exp) {
			spans[n-1].to = to
			return
		}
		spans = append(spans, span{from, to, exp})
	}
	// pop closes the innermost open prefix: what is left of it after its
	// children is its own.
	pop := func() {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if pos.IsValid() && !top.last.Less(pos) {
			emit(pos, top.last, top.expires)
		}
		pos = top.last.Next() // invalid past the end of the family: nothing follows
	}
	for _, e := range cidrs {
		start, last := e.Prefix.Addr(), netipx.PrefixLastIP(e.Prefix)
		for len(stack) > 0 && stack[len(stack)-1].last.Less(start) { // IPv4 addresses sort before IPv6
			pop()
		}
		exp := e.Expires
		if len(stack) > 0 {
			parent := stack[len(stack)-1]
			if pos.Less(start) {
				emit(pos, start.Prev(), parent.expires)
			}
			exp = later(exp, parent.expires)
		}
		stack = append(stack, open{last, exp})
		pos = start
	}
	for len(stack) > 0 {
		pop()
	}

	var out []Element
	var buf []netip.Prefix
	for _, sp := range spans {
		buf = netipx.IPRangeFrom(sp.from, sp.to).AppendPrefixes(buf[:0])
		for _, p := range buf {
			out = append(out, Element{p, sp.expires})
		}
	}
	return out
}

// Diff returns what turns kernel content old into new: add holds the
// elements of new with no identical element (same prefix, same expiry
// instant) in old, del those of old with no identical element in new. An
// element whose expiry changed is in both: delete first, then add. Both
// keep the order of their input.
func Diff(old, new []Element) (add, del []Element) {
	inOld := make(map[elemKey]struct{}, len(old))
	for _, e := range old {
		inOld[keyOf(e)] = struct{}{}
	}
	inNew := make(map[elemKey]struct{}, len(new))
	for _, e := range new {
		k := keyOf(e)
		inNew[k] = struct{}{}
		if _, ok := inOld[k]; !ok {
			add = append(add, e)
		}
	}
	for _, e := range old {
		if _, ok := inNew[keyOf(e)]; !ok {
			del = append(del, e)
		}
	}
	return add, del
}

// elemKey identifies an element by value: time.Time values are not
// comparable with == (location, monotonic clock reading), so the expiry
// is kept as its instant.
type elemKey struct {
	prefix netip.Prefix
	sec    int64
	nsec   int32
}

func keyOf(e Element) elemKey {
	return elemKey{e.Prefix, e.Expires.Unix(), int32(e.Expires.Nanosecond())}
}
