package source

import (
	"encoding/binary"
	"math/bits"
)

// wide is an address of either family as a 128-bit integer, for packing
// rows.
type wide struct{ hi, lo uint64 }

func (a wide) sub(b wide) wide {
	lo, borrow := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, borrow)
	return wide{hi, lo}
}

func (a wide) add(b wide) wide {
	lo, carry := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, carry)
	return wide{hi, lo}
}

// A row is packed as:
//
//   - its first address less the previous row's first address (rows are
//     sorted: never negative), then its size (last-first+1; 0 for the
//     whole IPv6 space), both as packed wides;
//   - its country, shifted left by one, as a uvarint whose low bit says
//     that its file differs from the previous row's; then the file as a
//     uvarint, only then;
//   - its line less the previous row's line, as a varint.
//
// A packed wide is one byte, 0xff for zero, else the count of trailing
// zero bits (0 to 127) with the high bit set when the rest needs more than
// 64 bits; then the rest's low 64 bits as a uvarint, and its high 64 bits
// when the bit says so. The rows of registries and feeds are prefixes and
// runs of them: their sizes are a power of two times a small number, and
// their gaps are too.

// rowWriter packs rows into b.
type rowWriter struct {
	b    []byte
	lo   wide
	line uint32
	file uint16
}

func (w *rowWriter) row(lo, hi wide, cc, file uint16, line uint32) {
	w.b = appendWide(w.b, lo.sub(w.lo))
	w.b = appendWide(w.b, hi.sub(lo).add(wide{lo: 1}))
	if file == w.file {
		w.b = binary.AppendUvarint(w.b, uint64(cc)<<1)
	} else {
		w.b = binary.AppendUvarint(binary.AppendUvarint(w.b, uint64(cc)<<1|1), uint64(file))
	}
	w.b = binary.AppendVarint(w.b, int64(line)-int64(w.line))
	w.lo, w.line, w.file = lo, line, file
}

// rowReader reads the rows a rowWriter packed, in order.
type rowReader struct {
	lo   wide
	line uint32
	file uint16
}

// row reads the row at the start of b and returns the rest of b. b is
// what a rowWriter wrote: it is not checked.
func (r *rowReader) row(b []byte) (rest []byte, lo, hi wide, cc, file uint16, line uint32) {
	var d, size wide
	b, d = readWide(b)
	b, size = readWide(b)
	c, n := binary.Uvarint(b)
	b = b[n:]
	if c&1 != 0 {
		f, n := binary.Uvarint(b)
		b = b[n:]
		r.file = uint16(f)
	}
	dl, n := binary.Varint(b)
	r.lo = r.lo.add(d)
	r.line = uint32(int64(r.line) + dl)
	return b[n:], r.lo, r.lo.add(size).sub(wide{lo: 1}), uint16(c >> 1), r.file, r.line
}

func appendWide(b []byte, v wide) []byte {
	if v == (wide{}) {
		return append(b, 0xff)
	}
	tz := bits.TrailingZeros64(v.lo)
	if v.lo == 0 {
		tz = 64 + bits.TrailingZeros64(v.hi)
	}
	m := v.shr(uint(tz))
	if m.hi == 0 {
		return binary.AppendUvarint(append(b, byte(tz)), m.lo)
	}
	return binary.AppendUvarint(binary.AppendUvarint(append(b, byte(tz)|0x80), m.lo), m.hi)
}

func readWide(b []byte) ([]byte, wide) {
	t := b[0]
	if t == 0xff {
		return b[1:], wide{}
	}
	var m wide
	var n int
	m.lo, n = binary.Uvarint(b[1:])
	b = b[1+n:]
	if t&0x80 != 0 {
		m.hi, n = binary.Uvarint(b)
		b = b[n:]
	}
	return b, m.shl(uint(t & 0x7f))
}

func (a wide) shr(n uint) wide {
	switch {
	case n == 0:
		return a
	case n < 64:
		return wide{a.hi >> n, a.lo>>n | a.hi<<(64-n)}
	default:
		return wide{0, a.hi >> (n - 64)}
	}
}

func (a wide) shl(n uint) wide {
	switch {
	case n == 0:
		return a
	case n < 64:
		return wide{a.hi<<n | a.lo>>(64-n), a.lo << n}
	default:
		return wide{a.lo << (n - 64), 0}
	}
}
