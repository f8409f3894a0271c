package pktgen

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"

	"go4.org/netipx"
)

// untestable holds source addresses whose packets fw's kernel drops
// whatever the firewall says, so Check cannot see a verdict for them
// (probed on Linux 6.18 by TestUntestable):
//
//   - 224.0.0.0/4 and 255.255.255.255: martian sources, dropped by IPv4
//     routing after prerouting; 0.0.0.0/8 likewise (Linux 6.18 drops only
//     0.0.0.0, older kernels all of 0/8). 127.0.0.0/8 is accepted because
//     the lab turns route_localnet on.
//   - ::1 and ff00::/8 (multicast): dropped by ipv6_rcv before prerouting.
//   - ::ffff:0:0/96: IPv4-mapped, ambiguous; the frame builders send them as
//     IPv4, so use the IPv4 address.
var untestable = func() *netipx.IPSet {
	var b netipx.IPSetBuilder
	for _, p := range []string{
		"0.0.0.0/8", "224.0.0.0/4", "255.255.255.255/32",
		"::1/128", "::ffff:0:0/96", "ff00::/8",
	} {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}()

// testable is the complement of untestable.
var testable = func() *netipx.IPSet {
	var b netipx.IPSetBuilder
	b.AddPrefix(netip.MustParsePrefix("0.0.0.0/0"))
	b.AddPrefix(netip.MustParsePrefix("::/0"))
	b.RemoveSet(untestable)
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}()

// Testable reports whether Check can tell the firewall's verdict for
// packets from source a: false for the zero Addr and for sources fw's
// kernel drops regardless of any firewall (0.0.0.0/8, 224.0.0.0/4,
// 255.255.255.255, ::1, ff00::/8) and for IPv4-mapped IPv6 addresses.
func Testable(a netip.Addr) bool {
	return a.IsValid() && testable.Contains(a.WithZone(""))
}

// TestableSet returns the part of s that Check can test.
func TestableSet(s *netipx.IPSet) *netipx.IPSet {
	var b netipx.IPSetBuilder
	b.AddSet(s)
	b.Intersect(testable)
	r, _ := b.IPSet() // cannot fail: only set algebra on valid sets
	return r
}

// RandomV4 returns n addresses drawn uniformly from the IPv4 space Check
// can test (all of it but 0.0.0.0/8, 224.0.0.0/4 and 255.255.255.255).
func RandomV4(r *rand.Rand, n int) []netip.Addr {
	out := make([]netip.Addr, 0, n)
	for len(out) < n {
		var b [4]byte
		v := r.Uint32()
		b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		if a := netip.AddrFrom4(b); Testable(a) {
			out = append(out, a)
		}
	}
	return out
}

// RandomV6 returns n addresses drawn uniformly from 2000::/3, the global
// unicast space.
func RandomV6(r *rand.Rand, n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		var b [16]byte
		hi, lo := r.Uint64(), r.Uint64()
		hi = hi>>3 | 1<<61 // 001x...
		for j := range 8 {
			b[j] = byte(hi >> (56 - 8*j))
			b[8+j] = byte(lo >> (56 - 8*j))
		}
		out[i] = netip.AddrFrom16(b)
	}
	return out
}

// RandomFromSet returns n addresses drawn from the testable part of s (see
// TestableSet); nil if that is empty. IPv4 and IPv6 address counts are not
// comparable (a single IPv6 /32 outweighs all of IPv4), so each draw
// first picks a family with probability proportional to its number of
// prefixes in s.Prefixes(), then:
//
//   - IPv4: an address uniformly from all IPv4 addresses of s, so ranges
//     are weighted by size;
//   - IPv6: a prefix uniformly from s's IPv6 prefixes, then an address
//     uniformly within it, so a /3 and a /128 are equally likely.
func RandomFromSet(r *rand.Rand, s *netipx.IPSet, n int) []netip.Addr {
	s = TestableSet(s)
	var ranges4 []netipx.IPRange
	var cum4 []uint64 // cumulative sizes of ranges4
	var total4 uint64
	var prefixes4, prefixes6 []netip.Prefix
	for _, p := range s.Prefixes() {
		if p.Addr().Is4() {
			prefixes4 = append(prefixes4, p)
		} else {
			prefixes6 = append(prefixes6, p)
		}
	}
	for _, rg := range s.Ranges() {
		if !rg.From().Is4() {
			continue
		}
		ranges4 = append(ranges4, rg)
		total4 += uint64(v4(rg.To())-v4(rg.From())) + 1
		cum4 = append(cum4, total4)
	}
	np := len(prefixes4) + len(prefixes6)
	if np == 0 || n <= 0 {
		return nil
	}
	out := make([]netip.Addr, n)
	for i := range out {
		if r.IntN(np) < len(prefixes4) {
			k := r.Uint64N(total4)
			j := sort.Search(len(cum4), func(j int) bool { return cum4[j] > k })
			lo := uint64(0)
			if j > 0 {
				lo = cum4[j-1]
			}
			out[i] = fromV4(v4(ranges4[j].From()) + uint32(k-lo))
			continue
		}
		p := prefixes6[r.IntN(len(prefixes6))]
		out[i] = randomIn(r, p)
	}
	return out
}

// Boundaries returns, for each range of s (s.Ranges()), its first and last
// address and their neighbours one below and above, sorted, without
// duplicates and keeping only Testable ones. These are where off-by-one
// errors in a set's encoding show.
func Boundaries(s *netipx.IPSet) []netip.Addr {
	var out []netip.Addr
	for _, rg := range s.Ranges() {
		for _, a := range []netip.Addr{rg.From(), rg.To()} {
			for _, b := range []netip.Addr{a.Prev(), a, a.Next()} {
				if Testable(b) {
					out = append(out, b)
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// randomIn returns an address drawn uniformly from IPv6 prefix p.
func randomIn(r *rand.Rand, p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	hi, lo := r.Uint64(), r.Uint64()
	for j := range 16 {
		var rb byte
		if j < 8 {
			rb = byte(hi >> (56 - 8*j))
		} else {
			rb = byte(lo >> (56 - 8*(j-8)))
		}
		keep := 8 * j // bits of the prefix before this byte
		switch {
		case keep >= p.Bits():
			b[j] = rb
		case keep+8 > p.Bits():
			m := byte(0xff) >> (p.Bits() - keep)
			b[j] = b[j]&^m | rb&m
		}
	}
	return netip.AddrFrom16(b)
}

func v4(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func fromV4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Zipf returns n addresses drawn from population with Zipf-distributed
// ranks: population[k] is drawn with probability proportional to
// 1/(k+1)^s (s > 1), so a few sources send most packets, as in an attack
// by a few heavy hitters and a long tail. Nil for an empty population.
func Zipf(r *rand.Rand, population []netip.Addr, s float64, n int) []netip.Addr {
	if len(population) == 0 || n <= 0 {
		return nil
	}
	z := rand.NewZipf(r, s, 1, uint64(len(population)-1))
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = population[z.Uint64()]
	}
	return out
}

// RandomFromRanges returns n addresses of one family (is4) drawn from the
// testable part of s range by range: a range of s.Ranges() uniformly, then
// an address uniformly within it. Every network is then equally busy
// whatever its size (a /24 weighs as much as a /8), as with many small
// sites behind their own allocations. Nil if s has no such range.
func RandomFromRanges(r *rand.Rand, s *netipx.IPSet, is4 bool, n int) []netip.Addr {
	var ranges []netipx.IPRange
	for _, rg := range TestableSet(s).Ranges() {
		if rg.From().Is4() == is4 {
			ranges = append(ranges, rg)
		}
	}
	if len(ranges) == 0 || n <= 0 {
		return nil
	}
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = randomInRange(r, ranges[r.IntN(len(ranges))])
	}
	return out
}

// randomInRange returns an address drawn uniformly from rg.
func randomInRange(r *rand.Rand, rg netipx.IPRange) netip.Addr {
	from, to := rg.From().As16(), rg.To().As16()
	lo, hi := u128(from), u128(to)
	size := hi.sub(lo) // size-1; the whole of IPv6 is never a range here
	var off [2]uint64
	switch {
	case size[0] == 0 && size[1] == ^uint64(0):
		off[1] = r.Uint64()
	case size[0] == 0:
		off[1] = r.Uint64N(size[1] + 1)
	default:
		for { // rejection: uniform over [0, size]
			off = [2]uint64{r.Uint64N(size[0] + 1), r.Uint64()}
			if off[0] < size[0] || off[1] <= size[1] {
				break
			}
		}
	}
	a := lo.add(off)
	var b [16]byte
	for j := range 8 {
		b[j] = byte(a[0] >> (56 - 8*j))
		b[8+j] = byte(a[1] >> (56 - 8*j))
	}
	if rg.From().Is4() {
		return netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrFrom16(b)
}

type u128v [2]uint64

func u128(b [16]byte) u128v {
	var u u128v
	for j := range 8 {
		u[0] = u[0]<<8 | uint64(b[j])
		u[1] = u[1]<<8 | uint64(b[8+j])
	}
	return u
}

func (u u128v) sub(v u128v) u128v {
	lo := u[1] - v[1]
	hi := u[0] - v[0]
	if u[1] < v[1] {
		hi--
	}
	return u128v{hi, lo}
}

func (u u128v) add(v u128v) u128v {
	lo := u[1] + v[1]
	hi := u[0] + v[0]
	if lo < u[1] {
		hi++
	}
	return u128v{hi, lo}
}
