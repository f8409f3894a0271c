package prefix

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"

	"go4.org/netipx"
)

// u128 is an address as a 128-bit number; IPv4 addresses use the low 32
// bits. All arithmetic is modulo 2^128.
type u128 struct{ hi, lo uint64 }

var max4, max6 = u128{0, 1<<32 - 1}, u128{^uint64(0), ^uint64(0)}

func (u u128) less(v u128) bool { return u.hi < v.hi || u.hi == v.hi && u.lo < v.lo }

func (u u128) cmp(v u128) int {
	switch {
	case u.less(v):
		return -1
	case v.less(u):
		return 1
	}
	return 0
}

func (u u128) add1() u128 {
	lo, c := bits.Add64(u.lo, 1, 0)
	return u128{u.hi + c, lo}
}

func (u u128) sub1() u128 {
	lo, b := bits.Sub64(u.lo, 1, 0)
	return u128{u.hi - b, lo}
}

func (u u128) sub(v u128) u128 {
	lo, b := bits.Sub64(u.lo, v.lo, 0)
	return u128{u.hi - v.hi - b, lo}
}

// addPow2 returns u + 2^k for k < 128.
func (u u128) addPow2(k int) u128 {
	if k >= 64 {
		return u128{u.hi + 1<<(k-64), u.lo}
	}
	lo, c := bits.Add64(u.lo, 1<<k, 0)
	return u128{u.hi + c, lo}
}

// shr returns u shifted right by n < 128 bits.
func (u u128) shr(n int) u128 {
	if n >= 64 {
		return u128{0, u.hi >> (n - 64)}
	}
	return u128{u.hi >> n, u.lo>>n | u.hi<<(64-n)}
}

// trailingZeros returns the number of trailing zero bits, 128 for zero.
func (u u128) trailingZeros() int {
	if u.lo != 0 {
		return bits.TrailingZeros64(u.lo)
	}
	return 64 + bits.TrailingZeros64(u.hi)
}

// bitLen returns the number of bits needed to write u, 0 for zero.
func (u u128) bitLen() int {
	if u.hi != 0 {
		return 64 + bits.Len64(u.hi)
	}
	return bits.Len64(u.lo)
}

// span is an inclusive range of addresses of one family.
type span struct{ lo, hi u128 }

func fromAddr(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{0, uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func addr4(u u128) netip.Addr { return netip.AddrFrom4(be4(uint32(u.lo))) }

func be4(v uint32) [4]byte { return [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

func addr6(u u128) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.hi)
	binary.BigEndian.PutUint64(b[8:], u.lo)
	return netip.AddrFrom16(b)
}

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

func cmpLo(a, b span) int { return a.lo.cmp(b.lo) }

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
		if s.lo == (u128{}) || !last.hi.less(s.lo.sub1()) {
			if last.hi.less(s.hi) {
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
		for j < len(b) && b[j].hi.less(r.lo) {
			j++
		}
		lo, done := r.lo, false
		for k := j; k < len(b) && !r.hi.less(b[k].lo); k++ {
			if lo.less(b[k].lo) {
				out = append(out, span{lo, b[k].lo.sub1()})
			}
			if !b[k].hi.less(r.hi) {
				done = true
				break
			}
			lo = b[k].hi.add1()
		}
		if !done {
			out = append(out, span{lo, r.hi})
		}
	}
	return out
}

// complement returns the addresses from 0 to max not in ss, a minimal
// sorted list.
func complement(ss []span, max u128) []span {
	out := make([]span, 0, len(ss)+1)
	next, more := u128{}, true // first address not yet accounted for
	for _, s := range ss {
		if next.less(s.lo) {
			out = append(out, span{next, s.lo.sub1()})
		}
		if s.hi == max {
			more = false
			break
		}
		next = s.hi.add1()
	}
	if more {
		out = append(out, span{next, max})
	}
	return out
}

// forEachCIDR calls fn with the address and length of each prefix of the
// minimal cover of [lo, hi], in order; width is 32 or 128.
func forEachCIDR(lo, hi u128, width int, fn func(u128, int)) {
	for {
		// The largest block starting at lo: aligned on lo's trailing
		// zeros, and no bigger than what is left up to hi.
		k := lo.trailingZeros()
		if d := hi.sub(lo); d != max6 {
			k = min(k, d.add1().bitLen()-1)
		}
		k = min(k, width)
		fn(lo, width-k)
		if k == width {
			return
		}
		next := lo.addPow2(k)
		if hi.less(next) || next == (u128{}) {
			return
		}
		lo = next
	}
}

// countCIDRs returns the number of prefixes in the minimal cover of [lo, hi].
func countCIDRs(lo, hi u128, width int) int {
	n := 0
	forEachCIDR(lo, hi, width, func(u128, int) { n++ })
	return n
}

// spansOf splits the ranges of s by family.
func spansOf(s *netipx.IPSet) (v4, v6 []span) {
	rr := rangesOf(s)
	n4 := len(rr)
	for i, r := range rr {
		if r.From().Is6() {
			n4 = i
			break
		}
	}
	v4, v6 = make([]span, n4), make([]span, len(rr)-n4)
	for i, r := range rr {
		sp := span{fromAddr(r.From()), fromAddr(r.To())}
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
		rr = append(rr, netipx.IPRangeFrom(addr4(s.lo), addr4(s.hi)))
	}
	for _, s := range v6 {
		rr = append(rr, netipx.IPRangeFrom(addr6(s.lo), addr6(s.hi)))
	}
	return newIPSet(rr)
}
