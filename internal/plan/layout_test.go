package plan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"go4.org/netipx"
)

// randomSet builds a random set of n prefixes of one family, with lengths
// spread so that every kind of bucket (full, empty, mixed at every level)
// occurs, and some prefixes clustered to create deep mixed buckets.
func randomSet(r *rand.Rand, is4 bool, n int) *netipx.IPSet {
	var b netipx.IPSetBuilder
	w := familyBits(is4)
	var base u128
	for i := 0; i < n; i++ {
		var a u128
		if i%3 == 0 || i == 0 {
			a = u128{hi: r.Uint64(), lo: r.Uint64()}
			if is4 {
				a = u128{lo: uint64(r.Uint32())}
			}
			base = a
		} else { // near the previous cluster
			a = base.addShift(uint64(r.IntN(1<<12)), r.IntN(8))
			if is4 {
				a.lo &= 0xffffffff
				a.hi = 0
			}
		}
		var l int
		if is4 {
			l = 4 + r.IntN(29)
		} else {
			l = 8 + r.IntN(121)
		}
		p := netip.PrefixFrom(a.addr(w), l).Masked()
		if r.IntN(4) == 0 {
			b.RemovePrefix(p)
		} else {
			b.AddPrefix(p)
		}
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}

// probes returns the boundary addresses of s (first and last of every
// range and of every gap, and their neighbours) plus random addresses.
func probes(r *rand.Rand, s *netipx.IPSet, is4 bool, random int) []netip.Addr {
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() && a.Is4() == is4 {
			out = append(out, a)
		}
	}
	for _, rg := range s.Ranges() {
		for _, a := range []netip.Addr{rg.From(), rg.To()} {
			add(a)
			add(a.Prev())
			add(a.Next())
		}
	}
	w := familyBits(is4)
	for i := 0; i < random; i++ {
		add(u128{hi: r.Uint64(), lo: r.Uint64() & (1<<uint(min(w, 64)) - 1 | -(uint64(w) >> 7))}.addr(w))
	}
	return out
}

func checkLayout(t *testing.T, s *netipx.IPSet, l *Layout, ps []netip.Addr) {
	t.Helper()
	bad := 0
	for _, a := range ps {
		if got, want := l.Contains(a), s.Contains(a); got != want {
			if bad++; bad < 5 {
				t.Errorf("%s: layout %v (strides %v) says %v, set says %v", a, l.Kind, l.Strides(), got, want)
			}
		}
	}
}

func TestLayoutModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sawRest := 0
	defer func() {
		if sawRest == 0 {
			t.Error("no layout needed the Rest interval set: the depth limit is untested")
		}
	}()
	for iter := 0; iter < 60; iter++ {
		for _, is4 := range []bool{true, false} {
			s := randomSet(r, is4, 1+r.IntN(400))
			ps := probes(r, s, is4, 2000)
			for _, passIn := range []bool{false, true} {
				l, err := Build(s, is4, Options{PassIsIn: passIn, PlainMax: -1})
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				checkLayout(t, s, l, ps)
			}
			// Forced strides, including ones that end far below /32.
			w := familyBits(is4)
			var fine []int // more levels than MaxDepth: deep buckets use Rest
			for b := w / 32; b <= w; b += w / 32 {
				fine = append(fine, b)
			}
			for _, strides := range [][]int{{w}, {w / 2, w}, {8, w / 4, w / 2, 3 * w / 4, w}, fine} {
				l, err := Build(s, is4, Options{Strides4: strides, Strides6: strides, MaxEntries: 1 << 15})
				if err != nil {
					continue // too large for this set: fine
				}
				checkLayout(t, s, l, ps)
				if len(strides) == len(fine) && len(l.Rest) > 0 {
					sawRest++
				}
			}
			if t.Failed() {
				t.FailNow()
			}
		}
	}
}

func TestLayoutKinds(t *testing.T) {
	mk := func(ps ...string) *netipx.IPSet {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		s, _ := b.IPSet()
		return s
	}
	for _, tc := range []struct {
		set  *netipx.IPSet
		is4  bool
		want Kind
	}{
		{mk(), true, KindEmpty},
		{mk("2001:db8::/32"), true, KindEmpty},
		{mk("0.0.0.0/0"), true, KindAll},
		{mk("10.0.0.0/8", "192.0.2.1/32"), true, KindPlain},
		{mk("2001:db8::/32"), false, KindPlain},
	} {
		l, err := Build(tc.set, tc.is4, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Kind != tc.want {
			t.Errorf("%v: kind %v, want %v", tc.set.Prefixes(), l.Kind, tc.want)
		}
	}
}

func TestChooseSingleAddresses(t *testing.T) {
	// A feed of scattered single addresses is best as one /32 hash.
	r := rand.New(rand.NewPCG(3, 4))
	var b netipx.IPSetBuilder
	for i := 0; i < 5000; i++ {
		b.Add(u128{lo: uint64(r.Uint32())}.addr(32))
	}
	s, _ := b.IPSet()
	l, err := Build(s, true, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(l.Strides()) != "[32]" {
		t.Errorf("strides %v, want [32]", l.Strides())
	}
}
