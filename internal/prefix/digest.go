package prefix

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
)

// Digest names the addresses of one family of s (is4: IPv4, else IPv6):
// "sha256-" and the hex SHA-256 of its maximal ranges, each as its first
// and last address in 16 bytes. Two sets have the same digest for a
// family exactly when they hold the same addresses of it, however they
// were built. A nil s is empty.
func Digest(s *Set, is4 bool) string {
	h := sha256.New()
	var buf [32]byte
	// An IPv4 address's 16 bytes are its IPv4-mapped form (netip.Addr's
	// As16).
	put := func(b []byte, u U128) {
		if is4 {
			u.Hi, u.Lo = 0, 0xffff<<32|u.Lo
		}
		binary.BigEndian.PutUint64(b[:8], u.Hi)
		binary.BigEndian.PutUint64(b[8:16], u.Lo)
	}
	s.each(is4, func(r span) {
		put(buf[:16], r.lo)
		put(buf[16:], r.hi)
		h.Write(buf[:])
	})
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}

// MixedBuckets lists, in address order, the prefixes of length bits (1 to
// the family's width) of one family (is4) that hold addresses both of s
// and outside it: the buckets a layout's root level must descend from.
func MixedBuckets(s *Set, is4 bool, bits int) []netip.Prefix {
	width := widthOf(is4)
	last := Pow2(width - bits).Sub64(1) // a bucket's last address, from its first
	var out []netip.Prefix
	var prev U128
	add := func(b U128) {
		if len(out) == 0 || b != prev {
			out = append(out, netip.PrefixFrom(b.Addr(width), bits))
			prev = b
		}
	}
	s.each(is4, func(r span) {
		lo, hi := r.lo, r.hi
		blo, bhi := lo.Shr(width-bits).Shl(width-bits), hi.Shr(width-bits).Shl(width-bits)
		// Ranges are maximal: the address before lo and after hi are
		// outside s.
		if lo != blo || hi.Less(blo.Add(last)) {
			add(blo)
		}
		if bhi != blo && hi != bhi.Add(last) {
			add(bhi)
		}
	})
	return out
}
