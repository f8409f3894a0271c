package source

import (
	"encoding/binary"

	"github.com/ipfence/ipfence/internal/prefix"
)

// A row is packed as:
//
//   - its first address less the previous row's first address (rows are
//     sorted: never negative), then its size (last-first+1; 0 for the
//     whole IPv6 space), both as packed 128-bit integers;
//   - its country, shifted left by two, as a uvarint whose low bit says
//     that its file differs from the previous row's and whose next bit
//     says that its autonomous system does; then the file as a uvarint,
//     only then, and the ASN as a uvarint, only then;
//   - its line less the previous row's line, as a varint.
//
// A packed 128-bit integer (appendWide) is one byte, 0xff for zero, else
// the count of trailing zero bits (0 to 127) with the high bit set when
// the rest needs more than 64 bits; then the rest's low 64 bits as a uvarint, and its high 64 bits
// when the bit says so. The rows of registries and feeds are prefixes and
// runs of them: their sizes are a power of two times a small number, and
// their gaps are too.

// rowWriter packs rows into b.
type rowWriter struct {
	b    []byte
	lo   prefix.U128
	line uint32
	asn  uint32
	file uint16
}

func (w *rowWriter) row(lo, hi prefix.U128, cc uint16, asn uint32, file uint16, line uint32) {
	w.b = appendWide(w.b, lo.Sub(w.lo))
	w.b = appendWide(w.b, hi.Sub(lo).Add64(1))
	head := uint64(cc) << 2
	if file != w.file {
		head |= 1
	}
	if asn != w.asn {
		head |= 2
	}
	w.b = binary.AppendUvarint(w.b, head)
	if file != w.file {
		w.b = binary.AppendUvarint(w.b, uint64(file))
	}
	if asn != w.asn {
		w.b = binary.AppendUvarint(w.b, uint64(asn))
	}
	w.b = binary.AppendVarint(w.b, int64(line)-int64(w.line))
	w.lo, w.line, w.file, w.asn = lo, line, file, asn
}

// rowReader reads the rows a rowWriter packed, in order.
type rowReader struct {
	lo   prefix.U128
	line uint32
	asn  uint32
	file uint16
}

// row reads the row at the start of b and returns the rest of b. b is
// what a rowWriter wrote: it is not checked.
func (r *rowReader) row(b []byte) (rest []byte, lo, hi prefix.U128, cc uint16, asn uint32, file uint16, line uint32) {
	var d, size prefix.U128
	b, d = readWide(b)
	b, size = readWide(b)
	c, n := binary.Uvarint(b)
	b = b[n:]
	if c&1 != 0 {
		f, n := binary.Uvarint(b)
		b = b[n:]
		r.file = uint16(f)
	}
	if c&2 != 0 {
		a, n := binary.Uvarint(b)
		b = b[n:]
		r.asn = uint32(a)
	}
	dl, n := binary.Varint(b)
	r.lo = r.lo.Add(d)
	r.line = uint32(int64(r.line) + dl)
	return b[n:], r.lo, r.lo.Add(size).Sub64(1), uint16(c >> 2), r.asn, r.file, r.line
}

func appendWide(b []byte, v prefix.U128) []byte {
	if v == (prefix.U128{}) {
		return append(b, 0xff)
	}
	tz := v.TrailingZeros()
	m := v.Shr(tz)
	if m.Hi == 0 {
		return binary.AppendUvarint(append(b, byte(tz)), m.Lo)
	}
	return binary.AppendUvarint(binary.AppendUvarint(append(b, byte(tz)|0x80), m.Lo), m.Hi)
}

func readWide(b []byte) ([]byte, prefix.U128) {
	t := b[0]
	if t == 0xff {
		return b[1:], prefix.U128{}
	}
	var m prefix.U128
	var n int
	m.Lo, n = binary.Uvarint(b[1:])
	b = b[1+n:]
	if t&0x80 != 0 {
		m.Hi, n = binary.Uvarint(b)
		b = b[n:]
	}
	return b, m.Shl(int(t & 0x7f))
}
