package ban

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func TestKeys(t *testing.T) {
	for _, s := range []string{"0.0.0.0", "10.1.2.3", "255.255.255.255"} {
		a := netip.MustParseAddr(s)
		if k := key4(a, 17); addr4(k) != a || uint32(k) != 17 {
			t.Errorf("key4(%v) does not round-trip", a)
		}
	}
	for _, s := range []string{"::", "2001:db8::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::ffff:1.2.3.4"} {
		a := netip.MustParseAddr(s)
		if k := newKey6(a, 9); k.addr() != a || k.tail != 9 {
			t.Errorf("newKey6(%v) does not round-trip", a)
		}
	}
}

// TestSetListLarge checks List order and paging on enough bans for the
// radix sort, against a sort by comparePrefix.
func TestSetListLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	s := NewSet()
	model := map[netip.Prefix]bool{}
	for range 30_000 {
		var p netip.Prefix
		if r.IntN(4) == 0 {
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 14: byte(r.IntN(256)), 15: byte(r.IntN(256))}), 112+r.IntN(17))
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))}), 8+r.IntN(25))
		}
		s.Put(Ban{Prefix: p})
		model[p.Masked()] = true
	}
	var want []netip.Prefix
	for p := range model {
		want = append(want, p)
	}
	slices.SortFunc(want, comparePrefix)
	for _, pg := range []struct{ offset, limit int }{{0, 0}, {0, 10}, {len(want) / 2, 1000}, {len(want) - 5, 10}} {
		page, total := s.List(t0, Filter{}, pg.offset, pg.limit)
		end := len(want)
		if pg.limit > 0 {
			end = min(end, pg.offset+pg.limit)
		}
		var got []netip.Prefix
		for _, b := range page {
			got = append(got, b.Prefix)
		}
		if total != len(want) || !slices.Equal(got, want[pg.offset:end]) {
			t.Errorf("List(offset %d, limit %d): %d of %d bans, differing from the reference", pg.offset, pg.limit, len(got), total)
		}
	}
}
