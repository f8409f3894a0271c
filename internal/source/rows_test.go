package source

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPackedRows: a table gives back the rows it packed, in order, for
// both families, at the edges of the address space (the first and last
// addresses, the whole space, single addresses) and for random rows.
func TestPackedRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	r4 := func() k4 {
		switch rng.IntN(5) {
		case 0:
			return 0
		case 1:
			return ^k4(0)
		}
		return k4(rng.Uint32())
	}
	r6 := func() k6 {
		switch rng.IntN(6) {
		case 0:
			return k6{}
		case 1:
			return k6{^uint64(0), ^uint64(0)}
		case 2:
			return k6{rng.Uint64(), 0} // a /64 boundary
		}
		return k6{rng.Uint64(), rng.Uint64()}
	}
	for range 500 {
		checkPacked(t, rng, r4)
		checkPacked(t, rng, r6)
	}
}

func checkPacked[K key[K]](t *testing.T, rng *rand.Rand, addr func() K) {
	t.Helper()
	var es []entry[K]
	for range rng.IntN(50) {
		lo, hi := addr(), addr()
		if lo.compare(hi) > 0 {
			lo, hi = hi, lo
		}
		if rng.IntN(4) == 0 {
			hi = lo
		}
		es = append(es, entry[K]{lo: lo, hi: hi, cc: uint16(rng.IntN(numCodes + 1)), file: uint16(rng.IntN(3) * rng.IntN(2)), line: rng.Uint32()})
	}
	slices.SortFunc(es, byFirst)
	var tb table[K]
	tb.pack(slices.Clone(es))
	var got []entry[K]
	for e := range tb.all() {
		got = append(got, e)
	}
	if tb.n != len(es) || !slices.Equal(got, es) {
		t.Fatalf("packed\n%v\nread back (%d rows)\n%v", es, tb.n, got)
	}
}
