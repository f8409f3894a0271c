package radixsort

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSort checks Sort against slices.SortStableFunc on the same
// bits, on inputs below and above Min, with few and many distinct
// digits.
func TestSort(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{0, 1, 2, 100, Min - 1, Min, 50_000} {
		for _, lowBit := range []uint{0, 16, 32, 48} {
			for _, mask := range []uint64{^uint64(0), 0xff00_00ff_0000_ff0f, 0xffff_0000_0000_0000} {
				keys := make([]uint64, n)
				for i := range keys {
					keys[i] = r.Uint64() & mask
				}
				want := slices.Clone(keys)
				if n < Min {
					slices.Sort(want) // all bits, as documented
				} else {
					slices.SortStableFunc(want, func(a, b uint64) int { return cmp.Compare(a>>lowBit, b>>lowBit) })
				}
				Sort(keys, lowBit)
				if !slices.Equal(keys, want) {
					t.Fatalf("n=%d lowBit=%d mask=%x: Sort differs", n, lowBit, mask)
				}
			}
		}
	}
}

// TestFunc checks Func against slices.SortStableFunc on the same bits,
// with a payload that shows the order of equal keys.
func TestFunc(t *testing.T) {
	type row struct {
		key uint64
		at  int
	}
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{0, 1, 2, 100, Min - 1, Min, 50_000} {
		for _, lowBit := range []uint{0, 16, 48} {
			for _, mask := range []uint64{^uint64(0), 0xff00_00ff_0000_ff0f, 0xffff_0000_0000_0000, 0} {
				rows := make([]row, n)
				for i := range rows {
					rows[i] = row{r.Uint64() & mask, i}
				}
				want := slices.Clone(rows)
				slices.SortStableFunc(want, func(a, b row) int { return cmp.Compare(a.key>>lowBit, b.key>>lowBit) })
				Func(rows, lowBit, func(x *row) uint64 { return x.key })
				if !slices.Equal(rows, want) {
					t.Fatalf("n=%d lowBit=%d mask=%x: Func differs", n, lowBit, mask)
				}
			}
		}
	}
}
