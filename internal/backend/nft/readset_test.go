package nft

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"go4.org/netipx"
)

// TestReadSet reads address sets back (the shapes' sets, and two big
// ones that take many dump messages) and compares them with the Program.
func TestReadSet(t *testing.T) {
	ns := newNetns(t)
	p := shapesProgram()
	big := &Set{Name: "big4", Family: IPv4, KeyBits: 32, Timeout: true}
	bignets := &Set{Name: "bignets6", Family: IPv6, Interval: true}
	for i := range 100000 {
		big.Elems.Append(Elem{Key: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)})
		if i%2 == 0 {
			a := [16]byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 16), byte(i >> 8), byte(i)}
			bignets.Elems.Append(Elem{Key: netip.PrefixFrom(netip.AddrFrom16(a), 56)})
		}
	}
	p.Sets = append(p.Sets, big, bignets)
	mustApply(t, p, ns)
	checked := 0
	for _, s := range p.Sets {
		if s.IsMap || s.Key != KeyAddress {
			continue
		}
		got, err := ReadSet(context.Background(), "ipfence", ns, s.Name)
		if err != nil {
			t.Fatal(err)
		}
		var want, have netipx.IPSetBuilder
		for _, e := range s.Elems.All() {
			want.AddPrefix(e.Key)
		}
		for _, r := range got {
			have.AddRange(r)
		}
		w, _ := want.IPSet()
		h, _ := have.IPSet()
		if !w.Equal(h) {
			t.Errorf("set %s reads back as %d ranges, want %d", s.Name, len(h.Ranges()), len(w.Ranges()))
		}
		checked++
	}
	if checked < 7 {
		t.Errorf("checked %d sets", checked)
	}
}

func TestPresent(t *testing.T) {
	ns := newNetns(t)
	p := shapesProgram()
	big := &Set{Name: "big4", Family: IPv4, KeyBits: 32, Timeout: true}
	var keys []netip.Addr
	var want []bool
	for i := range 3000 {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		keys = append(keys, a)
		want = append(want, i%7 != 3)
		if i%7 != 3 {
			big.Elems.Append(Elem{Key: netip.PrefixFrom(a, 32)})
		}
	}
	p.Sets = append(p.Sets, big)
	mustApply(t, p, ns)
	got, err := Present(context.Background(), "ipfence", ns, "big4", keys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Error("Present disagrees with the set's content")
	}
}
