package prefix

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// U128 is an address as a 128-bit unsigned number, for code that steps,
// masks and compares addresses in tight loops: an IPv6 address is its 16
// bytes read big-endian, an IPv4 address sits in the low 32 bits of Lo.
// Arithmetic is modulo 2^128. No operation fails or allocates.
type U128 struct{ Hi, Lo uint64 }

// U128From returns a as a number: an IPv4 address in the low 32 bits, any
// other (IPv4-mapped IPv6 included) as its 16 bytes. The zero Addr is 0.
func U128From(a netip.Addr) U128 {
	if a.Is4() {
		b := a.As4()
		return U128{0, uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return U128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// Addr returns u as an address of the family of width bits: an IPv4
// address of u's low 32 bits when width is 32, an IPv6 address otherwise.
func (u U128) Addr(width int) netip.Addr {
	if width == 32 {
		return netip.AddrFrom4(be4(uint32(u.Lo)))
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.Hi)
	binary.BigEndian.PutUint64(b[8:], u.Lo)
	return netip.AddrFrom16(b)
}

func be4(v uint32) [4]byte { return [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

// Pow2 returns 2^k: 0 for k ≥ 128, the modulus.
func Pow2(k int) U128 { return U128{0, 1}.Shl(k) }

// Less reports whether u < v.
func (u U128) Less(v U128) bool { return u.Hi < v.Hi || u.Hi == v.Hi && u.Lo < v.Lo }

// Cmp returns -1, 0 or 1 as u is less than, equal to or greater than v.
func (u U128) Cmp(v U128) int {
	switch {
	case u.Less(v):
		return -1
	case v.Less(u):
		return 1
	}
	return 0
}

// Add returns u + v.
func (u U128) Add(v U128) U128 {
	lo, c := bits.Add64(u.Lo, v.Lo, 0)
	return U128{u.Hi + v.Hi + c, lo}
}

// Sub returns u - v.
func (u U128) Sub(v U128) U128 {
	lo, b := bits.Sub64(u.Lo, v.Lo, 0)
	return U128{u.Hi - v.Hi - b, lo}
}

// Add64 returns u + n.
func (u U128) Add64(n uint64) U128 {
	lo, c := bits.Add64(u.Lo, n, 0)
	return U128{u.Hi + c, lo}
}

// Sub64 returns u - n.
func (u U128) Sub64(n uint64) U128 {
	lo, b := bits.Sub64(u.Lo, n, 0)
	return U128{u.Hi - b, lo}
}

// Shl returns u shifted left by n bits: 0 for n ≥ 128. n must not be
// negative.
func (u U128) Shl(n int) U128 {
	switch {
	case n >= 128:
		return U128{}
	case n >= 64:
		return U128{u.Lo << (n - 64), 0}
	}
	// A shift by 64 or more gives 0 in Go, so n == 0 needs no case.
	return U128{u.Hi<<n | u.Lo>>(64-n), u.Lo << n}
}

// Shr returns u shifted right by n bits: 0 for n ≥ 128. n must not be
// negative.
func (u U128) Shr(n int) U128 {
	switch {
	case n >= 128:
		return U128{}
	case n >= 64:
		return U128{0, u.Hi >> (n - 64)}
	}
	return U128{u.Hi >> n, u.Lo>>n | u.Hi<<(64-n)}
}

// TrailingZeros returns the number of trailing zero bits of u, 128 for 0.
func (u U128) TrailingZeros() int {
	if u.Lo != 0 {
		return bits.TrailingZeros64(u.Lo)
	}
	return 64 + bits.TrailingZeros64(u.Hi)
}

// Len returns the number of bits needed to write u, 0 for 0.
func (u U128) Len() int {
	if u.Hi != 0 {
		return 64 + bits.Len64(u.Hi)
	}
	return bits.Len64(u.Lo)
}

// Float64 returns u as a float64, rounded to within one unit in the last
// place.
func (u U128) Float64() float64 { return float64(u.Hi)*(1<<64) + float64(u.Lo) }
