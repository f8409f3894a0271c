package prefix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Pack writes the ranges of s compactly, for a fleet's difference
// bundles, where a few thousand scattered ranges cost a few bytes each:
// per family (IPv4, then IPv6) the number of ranges, then each as the
// gap from the end of the previous one and its size less one, as
// varints (IPv6 values as two: high and low 64 bits).
func Pack(s *Set) []byte {
	n4, n6 := s.Len()
	b := make([]byte, 0, 8*(n4+n6)+4)
	for _, f := range []struct {
		n   int
		is4 bool
	}{{n4, true}, {n6, false}} {
		w := widthOf(f.is4)
		b = binary.AppendUvarint(b, uint64(f.n))
		next := U128{}
		s.each(f.is4, func(sp span) {
			b = appendU128(b, sp.lo.Sub(next), w)
			b = appendU128(b, sp.hi.Sub(sp.lo), w)
			next = sp.hi.Add64(1)
		})
	}
	return b
}

func appendU128(b []byte, u U128, w int) []byte {
	if w == 128 {
		b = binary.AppendUvarint(b, u.Hi)
	}
	return binary.AppendUvarint(b, u.Lo)
}

// ErrPacked is returned for bytes Pack did not write.
var ErrPacked = errors.New("malformed packed ranges")

// Unpack reads what Pack wrote: ranges in order, apart (not touching),
// within their family, every byte used.
// Like Pack, it writes every value in the fewest bytes: any other
// encoding of the same ranges is refused.
func Unpack(data []byte) (*Set, error) {
	b := data
	var v [2][]span
	for k, w := range []int{32, 128} {
		n, err := uvarint(&b)
		least := uint64(2) // bytes a range takes at least
		if w == 128 {
			least = 4
		}
		if err != nil || n > uint64(len(b))/least {
			return nil, fmt.Errorf("%w: %s count", ErrPacked, map[int]string{32: "IPv4", 128: "IPv6"}[w])
		}
		top := max6
		if w == 32 {
			top = max4
		}
		ss := make([]span, 0, n)
		next, first := U128{}, true
		for i := range n {
			gap, err1 := readU128(&b, w)
			size, err2 := readU128(&b, w)
			lo := next.Add(gap)
			hi := lo.Add(size)
			if err := errors.Join(err1, err2); err != nil || lo.Less(next) || hi.Less(lo) || top.Less(hi) || (!first && gap == (U128{})) {
				return nil, fmt.Errorf("%w: range %d of %d", ErrPacked, i+1, n)
			}
			ss = append(ss, span{lo, hi})
			first = false
			if hi == top && i+1 < n {
				return nil, fmt.Errorf("%w: range %d of %d ends the family", ErrPacked, i+1, n)
			}
			next = hi.Add64(1)
		}
		v[k] = ss
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("%w: %d bytes left over", ErrPacked, len(b))
	}
	s := setOf(v[0], v[1])
	if !bytes.Equal(Pack(s), data) {
		return nil, fmt.Errorf("%w: values not in their shortest form", ErrPacked)
	}
	return s, nil
}

func uvarint(b *[]byte) (uint64, error) {
	v, n := binary.Uvarint(*b)
	if n <= 0 {
		return 0, ErrPacked
	}
	*b = (*b)[n:]
	return v, nil
}

func readU128(b *[]byte, w int) (U128, error) {
	var u U128
	var err error
	if w == 128 {
		if u.Hi, err = uvarint(b); err != nil {
			return u, err
		}
	}
	if u.Lo, err = uvarint(b); err != nil {
		return u, err
	}
	if w == 32 && u.Lo > 1<<32-1 {
		return u, ErrPacked
	}
	return u, nil
}
