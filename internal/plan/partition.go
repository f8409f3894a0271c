package plan

import (
	"net/netip"

	"github.com/ipfence/ipfence/internal/prefix"
)

// piece is one prefix of the partition of a family's address space into
// the minimal CIDR cover of a set (in == true) and of its complement.
// It holds the address as a prefix.U128 (no pointers: a partition has millions).
type piece struct {
	addr prefix.U128
	bits uint8
	in   bool
}

// prefix returns p as a prefix of the family of width w.
func (p piece) prefix(w int) netip.Prefix { return netip.PrefixFrom(p.addr.Addr(w), int(p.bits)) }

// partition returns the address space of one family (is4) cut into the
// minimal prefix cover of s and of its complement, sorted by address.
// Every address of the family lies in exactly one piece.
func partition(s *prefix.Set, is4 bool) []piece {
	var res []piece
	prefix.Partition(s, is4, func(p netip.Prefix, in bool) {
		res = append(res, piece{prefix.U128From(p.Addr()), uint8(p.Bits()), in})
	})
	return res
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
