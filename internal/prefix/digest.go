package prefix

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"

	"go4.org/netipx"
)

// Digest names the addresses of one family of s (is4: IPv4, else IPv6):
// "sha256-" and the hex SHA-256 of its maximal ranges, each as its first
// and last address in 16 bytes. Two sets have the same digest for a
// family exactly when they hold the same addresses of it, however they
// were built. A nil s is empty.
func Digest(s *netipx.IPSet, is4 bool) string {
	h := sha256.New()
	var buf [32]byte
	for _, r := range rangesOf(s) {
		if r.From().Is4() != is4 {
			continue
		}
		lo, hi := r.From().As16(), r.To().As16()
		copy(buf[:16], lo[:])
		copy(buf[16:], hi[:])
		h.Write(buf[:])
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}

// MixedBuckets lists, in address order, the prefixes of length bits (1 to
// the family's width) of one family (is4) that hold addresses both of s
// and outside it: the buckets a layout's root level must descend from.
func MixedBuckets(s *netipx.IPSet, is4 bool, bits int) []netip.Prefix {
	width := 128
	if is4 {
		width = 32
	}
	last := Pow2(width - bits).Sub64(1) // a bucket's last address, from its first
	var out []netip.Prefix
	var prev U128
	add := func(b U128) {
		if len(out) == 0 || b != prev {
			out = append(out, netip.PrefixFrom(b.Addr(width), bits))
			prev = b
		}
	}
	for _, r := range rangesOf(s) {
		if r.From().Is4() != is4 {
			continue
		}
		lo, hi := U128From(r.From()), U128From(r.To())
		blo, bhi := lo.Shr(width-bits).Shl(width-bits), hi.Shr(width-bits).Shl(width-bits)
		// Ranges are maximal: the address before lo and after hi are
		// outside s.
		if lo != blo || hi.Less(blo.Add(last)) {
			add(blo)
		}
		if bhi != blo && hi != bhi.Add(last) {
			add(bhi)
		}
	}
	return out
}
