package plan

import (
	"math/bits"
	"net/netip"
)

// u128 is an address of either family as a 128-bit integer; IPv4
// addresses use the low 32 bits. Layout code works on it because it masks,
// compares and steps addresses in tight loops.
type u128 struct{ hi, lo uint64 }

func u128From(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var u u128
	for i := 0; i < 8; i++ {
		u.hi = u.hi<<8 | uint64(b[i])
		u.lo = u.lo<<8 | uint64(b[i+8])
	}
	return u
}

// addr converts back to an address of the family with width w (32 or 128).
func (u u128) addr(w int) netip.Addr {
	if w == 32 {
		v := uint32(u.lo)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(u.hi >> (56 - 8*i))
		b[i+8] = byte(u.lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

// cpl is the common prefix length of a and b as addresses of width w.
func cpl(a, b u128, w int) int {
	if w == 32 {
		return bits.LeadingZeros32(uint32(a.lo ^ b.lo))
	}
	if x := a.hi ^ b.hi; x != 0 {
		return bits.LeadingZeros64(x)
	}
	return 64 + bits.LeadingZeros64(a.lo^b.lo)
}

// addShift returns u + k<<s (no overflow check: callers stay inside a prefix).
func (u u128) addShift(k uint64, s int) u128 {
	var add u128
	switch {
	case s >= 128:
		return u
	case s >= 64:
		add.hi = k << (s - 64)
	case s == 0:
		add.lo = k
	default:
		add.hi = k >> (64 - s)
		add.lo = k << s
	}
	lo, carry := bits.Add64(u.lo, add.lo, 0)
	hi, _ := bits.Add64(u.hi, add.hi, carry)
	return u128{hi, lo}
}

// add and sub are modulo 2**128.
func (u u128) add(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, _ := bits.Add64(u.hi, v.hi, carry)
	return u128{hi, lo}
}

func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, borrow)
	return u128{hi, lo}
}

// shr returns u >> s (0 ≤ s ≤ 128).
func (u u128) shr(s int) u128 {
	switch {
	case s >= 128:
		return u128{}
	case s >= 64:
		return u128{lo: u.hi >> (s - 64)}
	case s == 0:
		return u
	}
	return u128{hi: u.hi >> s, lo: u.lo>>s | u.hi<<(64-s)}
}

// float is u as a float64 (rounded above 2**53).
func (u u128) float() float64 { return float64(u.hi)*pow2[64] + float64(u.lo) }

// unit is 1 << s (0 ≤ s < 128).
func unit(s int) u128 { return u128{}.addShift(1, s) }
