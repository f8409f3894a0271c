package plan

import (
	"net/netip"
	"slices"

	"go4.org/netipx"
)

// piece is one prefix of the partition of a family's address space into
// the minimal CIDR cover of a set (in == true) and of its complement.
type piece struct {
	p  netip.Prefix
	in bool
}

// partition returns the address space of one family (is4) cut into the
// minimal prefix cover of s and of its complement, sorted by address.
// Every address of the family lies in exactly one piece.
func partition(s *netipx.IPSet, is4 bool) []piece {
	var b netipx.IPSetBuilder
	full := fullPrefix(is4)
	b.AddPrefix(full)
	b.RemoveSet(s)
	comp, _ := b.IPSet() // only valid prefixes were added: no error possible

	var out []piece
	for _, p := range s.Prefixes() {
		if p.Addr().Is4() == is4 {
			out = append(out, piece{p, true})
		}
	}
	for _, p := range comp.Prefixes() {
		if p.Addr().Is4() == is4 {
			out = append(out, piece{p, false})
		}
	}
	slices.SortFunc(out, func(a, b piece) int { return a.p.Addr().Compare(b.p.Addr()) })
	return out
}

// fullPrefix is 0.0.0.0/0 or ::/0.
func fullPrefix(is4 bool) netip.Prefix {
	if is4 {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
}

// familyBits is 32 or 128.
func familyBits(is4 bool) int {
	if is4 {
		return 32
	}
	return 128
}
