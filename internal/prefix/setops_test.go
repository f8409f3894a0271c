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
		beforeA, beforeB := slices.Clone(rangesOf(a)), slices.Clone(rangesOf(b))
		for _, c := range []struct {
			name      string
			got, want *netipx.IPSet
		}{
			{"union", Union(a, b), ref(a, b, (*netipx.IPSetBuilder).AddSet)},
			{"subtract", Subtract(a, b), ref(a, b, (*netipx.IPSetBuilder).RemoveSet)},
			{"intersect", Intersect(a, b), ref(a, b, (*netipx.IPSetBuilder).Intersect)},
		} {
			if c.got == nil || !slices.Equal(c.got.Ranges(), c.want.Ranges()) {
				t.Fatalf("%s of\n%v\n%v\n= %v, want %v", c.name, rangesOf(a), rangesOf(b), rangesOf(c.got), c.want.Ranges())
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
			if got := Family(a, fam[0], fam[1]); got == nil || !slices.Equal(got.Ranges(), want.Ranges()) {
				t.Fatalf("family %v of %v = %v, want %v", fam, rangesOf(a), rangesOf(got), want.Ranges())
			}
		}
		if !slices.Equal(rangesOf(a), beforeA) || !slices.Equal(rangesOf(b), beforeB) {
			t.Fatalf("an operation modified an operand: %v, %v; were %v, %v", rangesOf(a), rangesOf(b), beforeA, beforeB)
		}
	}
}

var fullPrefix4, fullPrefix6 = netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")
