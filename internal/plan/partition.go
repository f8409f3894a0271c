package plan

import (
	"net/netip"
	"slices"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
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
	comp := prefix.Complement(s, is4, !is4)

	// Both covers are sorted: merge them.
	in, out := family(prefix.Prefixes(s), is4), family(prefix.Prefixes(comp), is4)
	res := make([]piece, 0, len(in)+len(out))
	for len(in) > 0 || len(out) > 0 {
		if len(out) == 0 || (len(in) > 0 && in[0].Addr().Less(out[0].Addr())) {
			res = append(res, piece{in[0], true})
			in = in[1:]
		} else {
			res = append(res, piece{out[0], false})
			out = out[1:]
		}
	}
	return res
}

// family returns the prefixes of one family from a sorted list (IPv4
// sorts first).
func family(ps []netip.Prefix, is4 bool) []netip.Prefix {
	i, _ := slices.BinarySearchFunc(ps, true, func(p netip.Prefix, _ bool) int {
		if p.Addr().Is4() {
			return -1
		}
		return 1
	})
	if is4 {
		return ps[:i]
	}
	return ps[i:]
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
