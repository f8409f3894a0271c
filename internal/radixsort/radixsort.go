// Package radixsort sorts packed keys (addresses and the like in uint64s)
// faster than comparison sorts do on millions of them.
package radixsort

import (
	"cmp"
	"slices"
)

// Min is the length below which Sort hands over to slices.Sort: there
// pdqsort is as fast and needs no scratch space.
const Min = 1 << 12

// Sort sorts keys by their bits from lowBit (a multiple of 16) up,
// stably: an LSD radix sort, 16 bits a pass, skipping passes where every
// key has the same digit. Small inputs are sorted by slices.Sort, on all
// bits, which is also correct when the bits below lowBit do not matter.
func Sort(keys []uint64, lowBit uint) {
	if len(keys) < Min {
		slices.Sort(keys)
		return
	}
	// Func with the keys as their own: its call per key and pass costs
	// about 15% on 1M keys (21 against 18 ms), which one loop is worth.
	Func(keys, lowBit, func(k *uint64) uint64 { return *k })
}

// Func sorts s stably by key, as Sort sorts keys: by the key's bits from
// lowBit up, 16 bits a pass, skipping passes where every element has the
// same digit. Sorting by several keys is calling Func for each, the least
// significant first. Small inputs are sorted by slices.SortStableFunc on
// the same bits.
func Func[T any](s []T, lowBit uint, key func(*T) uint64) {
	if len(s) < Min {
		slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(key(&a)>>lowBit, key(&b)>>lowBit) })
		return
	}
	count := make([]int, 1<<16)
	src, dst := s, make([]T, len(s))
	for shift := lowBit; shift < 64; shift += 16 {
		clear(count)
		for i := range src {
			count[key(&src[i])>>shift&0xffff]++
		}
		if count[key(&src[0])>>shift&0xffff] == len(src) {
			continue
		}
		sum := 0
		for i, c := range count {
			count[i] = sum
			sum += c
		}
		for i := range src {
			d := key(&src[i]) >> shift & 0xffff
			dst[count[d]] = src[i]
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &s[0] {
		copy(s, src)
	}
}
