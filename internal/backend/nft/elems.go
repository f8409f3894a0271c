package nft

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"time"
)

// Elems is the elements of a set or map, packed into one byte slice
// without pointers, where a []Elem takes 64 bytes an element (a
// netip.Prefix and a verdict with its chain name) that the garbage
// collector scans. Each element takes only the bytes its Elems needs: a
// family and a length (2 bytes), the address (4 bytes while every
// address is IPv4, 8 while no IPv6 address has bits past the 64th, else
// 16), the timeout (8 bytes once one is set) and the verdict's index (1,
// 2 or 4 bytes, once there is one). A map of IPv4 keys takes 7 bytes an
// element, one of IPv6 keys up to /64 11; an IPv4 ban with a timeout, 14. A
// daemon holds its program's elements for as long as it runs: 689k of
// them for a 400k-line feed. Each distinct verdict is kept once. The
// zero value is empty; an Elems is not safe for concurrent writes.
type Elems struct {
	b    []byte    // the elements, each l.size() bytes
	l    layout    // the widths every element takes
	vs   []Verdict // the distinct verdicts: an element's index-1 indexes it
	grow int       // Grow's room, in elements, before the layout is known
}

// layout is the byte widths of an element's address, timeout and verdict
// index. It only widens: an element that needs more than an Elems's
// layout gives makes all of them wider.
type layout struct{ addr, timeout, v uint8 }

// size is the bytes an element takes: a family byte and a length byte,
// then the address, the timeout and the verdict's index.
func (l layout) size() int { return l.indexAt() + int(l.v) }

// timeoutAt and indexAt are the offsets of the timeout and of the
// verdict's index in an element.
func (l layout) timeoutAt() int { return 2 + int(l.addr) }
func (l layout) indexAt() int   { return 2 + int(l.addr) + int(l.timeout) }

// widen returns the layout wide enough for both l and m.
func (l layout) widen(m layout) layout {
	return layout{max(l.addr, m.addr), max(l.timeout, m.timeout), max(l.v, m.v)}
}

// packedElem is an element unpacked from the bytes, with its verdict as
// an index: the address as 16 bytes, the family (0: no address, the zero
// netip.Prefix; 4 or 6), the length (-1: an invalid prefix).
type packedElem struct {
	addr    [16]byte
	timeout time.Duration
	v       uint32 // 0: the zero Verdict; else vs[v-1]
	bits    int16
	fam     uint8
}

// needs is the layout p takes.
func (p *packedElem) needs() layout {
	var l layout
	switch p.fam {
	case 4:
		l.addr = 4
	case 6:
		l.addr = 8
		if binary.BigEndian.Uint64(p.addr[8:]) != 0 {
			l.addr = 16
		}
	}
	if p.timeout != 0 {
		l.timeout = 8
	}
	switch {
	case p.v > 0xffff:
		l.v = 4
	case p.v > 0xff:
		l.v = 2
	case p.v > 0:
		l.v = 1
	}
	return l
}

// put writes p into b, laid out by l (which p fits). An IPv4 address
// takes the last 4 bytes of the address's, an IPv6 one the first 8 or
// all 16; the rest are zero.
func (l layout) put(b []byte, p *packedElem) {
	b[0], b[1] = p.fam, uint8(p.bits+1)
	b = b[2:]
	clear(b[:l.addr])
	switch p.fam {
	case 4:
		copy(b[l.addr-4:], p.addr[12:])
	case 6:
		copy(b, p.addr[:l.addr])
	}
	b = b[l.addr:]
	if l.timeout > 0 {
		binary.LittleEndian.PutUint64(b, uint64(p.timeout))
	}
	b = b[l.timeout:]
	switch l.v {
	case 1:
		b[0] = uint8(p.v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(p.v))
	case 4:
		binary.LittleEndian.PutUint32(b, p.v)
	}
}

// get reads the element b holds, laid out by l.
func (l layout) get(b []byte) packedElem {
	p := packedElem{fam: b[0], bits: int16(b[1]) - 1}
	b = b[2:]
	switch p.fam {
	case 4:
		p.addr[10], p.addr[11] = 0xff, 0xff
		copy(p.addr[12:], b[l.addr-4:l.addr])
	case 6:
		copy(p.addr[:], b[:l.addr])
	}
	b = b[l.addr:]
	if l.timeout > 0 {
		p.timeout = time.Duration(binary.LittleEndian.Uint64(b))
	}
	p.v = l.index(b[l.timeout:])
	return p
}

// index reads the verdict index at the start of b.
func (l layout) index(b []byte) uint32 {
	switch l.v {
	case 1:
		return uint32(b[0])
	case 2:
		return uint32(binary.LittleEndian.Uint16(b))
	case 4:
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// ElemsOf packs es.
func ElemsOf(es ...Elem) Elems {
	var s Elems
	s.Append(es...)
	return s
}

// Len returns the number of elements.
func (s Elems) Len() int { return len(s.b) / s.l.size() }

// at returns the bytes of the i-th element.
func (s Elems) at(i int) []byte {
	n := s.l.size()
	return s.b[i*n : i*n+n : i*n+n]
}

// At returns the i-th element.
func (s Elems) At(i int) Elem {
	p := s.l.get(s.at(i))
	e := Elem{Timeout: p.timeout}
	if p.v > 0 {
		e.Verdict = s.vs[p.v-1]
	}
	switch p.fam {
	case 4:
		e.Key = netip.PrefixFrom(netip.AddrFrom4([4]byte(p.addr[12:])), int(p.bits))
	case 6:
		e.Key = netip.PrefixFrom(netip.AddrFrom16(p.addr), int(p.bits))
	}
	return e
}

// All yields the elements in order with their indexes.
func (s Elems) All() iter.Seq2[int, Elem] {
	return func(yield func(int, Elem) bool) {
		for i := range s.Len() {
			if !yield(i, s.At(i)) {
				return
			}
		}
	}
}

// List returns the elements unpacked, in a slice of their own.
func (s Elems) List() []Elem {
	out := make([]Elem, s.Len())
	for i := range out {
		out[i] = s.At(i)
	}
	return out
}

// Slice returns the elements i to j-1. It shares s's storage, as a slice
// expression does: appending to one may overwrite the other, and a Put
// writes through, unless the element needs a wider layout (then the one
// put to moves to storage of its own).
func (s Elems) Slice(i, j int) Elems {
	n := s.l.size()
	return Elems{b: s.b[i*n : j*n : j*n], l: s.l, vs: s.vs[:len(s.vs):len(s.vs)]}
}

// Grow makes room for n more elements.
func (s *Elems) Grow(n int) {
	if len(s.b) == 0 {
		// The layout may still widen with the first elements: keep
		// the room until they come.
		s.grow = max(s.grow, n)
		return
	}
	if m := n * s.l.size(); m > cap(s.b)-len(s.b) {
		s.b = append(make([]byte, 0, len(s.b)+m), s.b...)
	}
}

// Append adds es at the end.
func (s *Elems) Append(es ...Elem) {
	for _, e := range es {
		p := s.pack(e)
		s.fit(&p)
		n := s.l.size()
		if len(s.b) == 0 && s.grow > 0 {
			s.b, s.grow = make([]byte, 0, s.grow*n), 0
		}
		s.b = append(s.b, make([]byte, n)...)
		s.l.put(s.b[len(s.b)-n:], &p)
	}
}

// Put replaces the i-th element with e.
func (s *Elems) Put(i int, e Elem) {
	p := s.pack(e)
	s.fit(&p)
	s.l.put(s.at(i), &p)
}

// fit widens s's layout, and every element it holds, to take p.
func (s *Elems) fit(p *packedElem) {
	l := s.l.widen(p.needs())
	if l == s.l {
		return
	}
	n := s.Len()
	room := max(cap(s.b)/s.l.size(), s.grow) // what the old layout had room for, in elements
	b := make([]byte, n*l.size(), max(n+1, room)*l.size())
	for i := range n {
		q := s.l.get(s.at(i))
		l.put(b[i*l.size():], &q)
	}
	s.b, s.l, s.grow = b, l, 0
}

// pack packs e, adding its verdict to s's when it is new.
func (s *Elems) pack(e Elem) packedElem {
	p := packedElem{timeout: e.Timeout, bits: int16(e.Key.Bits())}
	if a := e.Key.Addr(); a.IsValid() {
		p.addr, p.fam = a.As16(), 6
		if a.Is4() {
			p.fam = 4
		}
	}
	if e.Verdict != (Verdict{}) {
		p.v = s.verdict(e.Verdict)
	}
	return p
}

// verdict returns v's index in s.vs plus one, adding it if need be. A
// program's maps hold a few verdicts each (accept, drop, and a goto per
// level), and elements come in runs of the same one: the last one found
// is tried first.
func (s *Elems) verdict(v Verdict) uint32 {
	if n := s.Len(); n > 0 {
		if last := s.indexAt(n - 1); last > 0 && s.vs[last-1] == v {
			return last
		}
	}
	for i, w := range s.vs {
		if w == v {
			return uint32(i + 1)
		}
	}
	// A copy of the table, never an append in place: copies of an Elems
	// (a struct copy of a Set) share it, and another's new verdict must
	// not take this one's index.
	s.vs = append(s.vs[:len(s.vs):len(s.vs)], v)
	return uint32(len(s.vs))
}

// indexAt is the verdict index of the i-th element.
func (s Elems) indexAt(i int) uint32 {
	if s.l.v == 0 {
		return 0
	}
	return s.l.index(s.b[i*s.l.size()+s.l.indexAt():])
}

// timeoutAt is the timeout of the i-th element.
func (s Elems) timeoutAt(i int) time.Duration {
	if s.l.timeout == 0 {
		return 0
	}
	return time.Duration(binary.LittleEndian.Uint64(s.b[i*s.l.size()+s.l.timeoutAt():]))
}

// verdictAt is the verdict of the i-th element.
func (s Elems) verdictAt(i int) Verdict {
	if v := s.indexAt(i); v > 0 {
		return s.vs[v-1]
	}
	return Verdict{}
}

// equalAt reports whether s.At(i) == t.At(j), without unpacking them.
func (s Elems) equalAt(i int, t Elems, j int) bool {
	if s.l == t.l { // the same bytes before the verdict's index
		k := s.l.indexAt()
		if string(s.at(i)[:k]) != string(t.at(j)[:k]) {
			return false
		}
	} else if p, q := s.l.get(s.at(i)), t.l.get(t.at(j)); p.addr != q.addr || p.bits != q.bits || p.fam != q.fam || p.timeout != q.timeout {
		return false
	}
	return s.verdictAt(i) == t.verdictAt(j)
}

// keyAt is the i-th element's key (elemKey), without unpacking it.
func (s Elems) keyAt(i int) elemKey {
	off := i * s.l.size()
	fam, bits := s.b[off], int(s.b[off+1])-1
	// Masked: clear the bits past the length (the 16-byte form of an
	// IPv4 address has 96 bits before it). An invalid prefix masks to
	// the zero Prefix, whose address is all zeros too.
	if fam == 0 || bits < 0 {
		return elemKey{bits: uint8(bits)}
	}
	k := elemKey{bits: uint8(bits)}
	a := s.b[off+2 : off+2+int(s.l.addr)]
	switch {
	case fam == 4:
		k.lo = 0xffff<<32 | uint64(binary.BigEndian.Uint32(a[len(a)-4:]))
		bits += 96
	case len(a) == 16:
		k.hi, k.lo = binary.BigEndian.Uint64(a), binary.BigEndian.Uint64(a[8:])
	default:
		k.hi = binary.BigEndian.Uint64(a)
	}
	if bits <= 64 {
		k.hi &= ^uint64(0) << (64 - bits) // all of it at 64, none at 0
		k.lo = 0
	} else {
		k.lo &= ^uint64(0) << (128 - bits)
	}
	return k
}

// sameValueAt reports whether s's i-th element and t's j-th, of the same
// key, hold the same verdict and timeout (in milliseconds, as the kernel
// keeps it).
func (s Elems) sameValueAt(i int, t Elems, j int) bool {
	return s.verdictAt(i) == t.verdictAt(j) && s.timeoutAt(i).Milliseconds() == t.timeoutAt(j).Milliseconds()
}

// sortedKeys reports whether the elements' keys (keyAt) increase
// strictly.
func (s Elems) sortedKeys() bool {
	n := s.Len()
	if n == 0 {
		return true
	}
	prev := s.keyAt(0)
	for i := 1; i < n; i++ {
		k := s.keyAt(i)
		if !prev.less(k) {
			return false
		}
		prev = k
	}
	return true
}
