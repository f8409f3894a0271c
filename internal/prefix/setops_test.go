package prefix

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"go4.org/netipx"
)

// randomSet returns a random set of entries drawn in random windows of
// both families (at the ends of each family's space and in the middle),
// or nil.
func randomSet(rng *rand.Rand) *netipx.IPSet {
	if rng.IntN(10) == 0 {
		return nil
	}
	var b netipx.IPSetBuilder
	for range rng.IntN(12) {
		if rng.IntN(20) == 0 { // a whole family
			b.AddPrefix([]netip.Prefix{fullPrefix4, fullPrefix6}[rng.IntN(2)])
			continue
		}
		w := windows[rng.IntN(len(windows))]
		lo, hi := randomRange(rng)
		b.AddRange(netipx.IPRangeFrom(w.addr(lo), w.addr(hi)))
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}

// toSet returns n as a Set, nil for nil (so that the functions are also
// tested on nil operands).
func toSet(n *netipx.IPSet) *Set {
	if n == nil {
		return nil
	}
	return FromIPSet(n)
}

// listsOf returns copies of s's lists, to check later that nothing
// modified them.
func listsOf(s *Set) ([]uint64, []span) {
	v4, v6 := s.lists()
	return slices.Clone(v4), slices.Clone(v6)
}

// TestSetOps checks Union, Subtract, Intersect and Family against
// netipx.IPSetBuilder on random pairs of sets.
func TestSetOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	iterations := 20000
	if testing.Short() {
		iterations = 2000
	}
	ref := func(a, b *netipx.IPSet, op func(*netipx.IPSetBuilder, *netipx.IPSet)) *netipx.IPSet {
		var x netipx.IPSetBuilder
		if a != nil {
			x.AddSet(a)
		}
		if b == nil {
			b = &netipx.IPSet{}
		}
		op(&x, b)
		s, _ := x.IPSet()
		return s
	}
	for range iterations {
		a, b := randomSet(rng), randomSet(rng)
		sa, sb := toSet(a), toSet(b)
		a4, a6 := listsOf(sa)
		b4, b6 := listsOf(sb)
		for _, c := range []struct {
			name string
			got  *Set
			want *netipx.IPSet
		}{
			{"union", Union(sa, sb), ref(a, b, (*netipx.IPSetBuilder).AddSet)},
			{"subtract", Subtract(sa, sb), ref(a, b, (*netipx.IPSetBuilder).RemoveSet)},
			{"intersect", Intersect(sa, sb), ref(a, b, (*netipx.IPSetBuilder).Intersect)},
		} {
			if c.got == nil || !slices.Equal(c.got.Ranges(), c.want.Ranges()) || !c.got.Equal(FromIPSet(c.want)) {
				t.Fatalf("%s of\n%v\n%v\n= %v, want %v", c.name, rangesOf(a), rangesOf(b), c.got.Ranges(), c.want.Ranges())
			}
		}
		for _, fam := range [][2]bool{{true, true}, {true, false}, {false, true}, {false, false}} {
			var x netipx.IPSetBuilder
			if a != nil {
				x.AddSet(a)
			}
			if !fam[0] {
				x.RemovePrefix(fullPrefix4)
			}
			if !fam[1] {
				x.RemovePrefix(fullPrefix6)
			}
			want, _ := x.IPSet()
			if got := Family(sa, fam[0], fam[1]); got == nil || !slices.Equal(got.Ranges(), want.Ranges()) || !got.Equal(FromIPSet(want)) {
				t.Fatalf("family %v of %v = %v, want %v", fam, rangesOf(a), got.Ranges(), want.Ranges())
			}
		}
		x4, x6 := sa.lists()
		y4, y6 := sb.lists()
		if !slices.Equal(x4, a4) || !slices.Equal(x6, a6) || !slices.Equal(y4, b4) || !slices.Equal(y6, b6) ||
			!slices.Equal(sa.Ranges(), rangesOf(a)) || !slices.Equal(sb.Ranges(), rangesOf(b)) {
			t.Fatalf("an operation modified an operand: %v, %v; were %v, %v", sa.Ranges(), sb.Ranges(), rangesOf(a), rangesOf(b))
		}
	}
}

var fullPrefix4, fullPrefix6 = netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")
