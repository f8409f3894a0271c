// Package radixsort sorts packed keys (addresses and the like in uint64s)
// faster than comparison sorts do on millions of them.
package radixsort

import "slices"

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
	count := make([]int, 1<<16)
	src, dst := keys, make([]uint64, len(keys))
	for shift := lowBit; shift < 64; shift += 16 {
		clear(count)
		for _, k := range src {
			count[k>>shift&0xffff]++
		}
		if count[src[0]>>shift&0xffff] == len(src) {
			continue
		}
		sum := 0
		for i, c := range count {
			count[i] = sum
			sum += c
		}
		for _, k := range src {
			d := k >> shift & 0xffff
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}
