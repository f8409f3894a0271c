package source

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortRows: IPv4 rows take a radix sort; it orders them as byFirst
// does (first address, widest first, file, line), on inputs large enough
// for the radix sort and with many equal addresses.
func TestSortRows(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 25))
	for _, n := range []int{0, 1, 300, 5000, 70_000} {
		for _, span := range []uint32{1 << 8, 1 << 31} {
			es := make([]entry[k4], n)
			for i := range es {
				lo := k4(r.Uint32N(span))
				es[i] = entry[k4]{lo: lo, hi: lo + k4(r.Uint32N(4)), cc: uint16(r.IntN(3)), file: uint16(r.IntN(3)), line: uint32(i)} // a row per line, as read
			}
			r.Shuffle(n, func(i, j int) { es[i], es[j] = es[j], es[i] })
			want := slices.Clone(es)
			slices.SortFunc(want, byFirst)
			sortRows(es)
			if !slices.Equal(es, want) {
				t.Fatalf("n=%d span=%d: sortRows differs from byFirst", n, span)
			}
		}
	}
}
