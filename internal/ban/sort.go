package ban

import (
	"cmp"
	"encoding/binary"
	"net/netip"
)

// Sorting millions of bans by comparePrefix on netip.Prefix values is the
// bulk of Elements and List. Both sort packed keys instead: an IPv4
// address and a 32-bit tail (a prefix length, or an index into a side
// table) in a uint64, radix-sorted; an IPv6 address and its tail in a
// key6.

// key4 packs an IPv4 address above a 32-bit tail.
func key4(a netip.Addr, tail uint32) uint64 {
	b := a.As4()
	return uint64(binary.BigEndian.Uint32(b[:]))<<32 | uint64(tail)
}

// addr4 unpacks the address of a key4.
func addr4(k uint64) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(k>>32))
	return netip.AddrFrom4(b)
}

// key6 is an IPv6 address and a tail, ordered by address then tail.
type key6 struct {
	hi, lo uint64
	tail   uint32
}

func newKey6(a netip.Addr, tail uint32) key6 {
	b := a.As16()
	return key6{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), tail}
}

func (k key6) addr() netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], k.hi)
	binary.BigEndian.PutUint64(b[8:], k.lo)
	return netip.AddrFrom16(b)
}

func compareKey6(a, b key6) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.lo, b.lo); c != 0 {
		return c
	}
	return cmp.Compare(a.tail, b.tail)
}
