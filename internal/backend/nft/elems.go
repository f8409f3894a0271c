package nft

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"time"
)

// Elems is the elements of a set or map, packed: 32 bytes an element and
// no pointers, where a []Elem takes 64 (a netip.Prefix and a verdict with
// its chain name) that the garbage collector scans. A daemon holds its
// program's elements for as long as it runs: 689k of them for a 400k-line
// feed. Each distinct verdict is kept once. The zero value is empty; an
// Elems is not safe for concurrent writes.
type Elems struct {
	e  []packedElem
	vs []Verdict // the distinct verdicts: packedElem.v-1 indexes it
}

// packedElem is an Elem packed: its key's address as 16 bytes, its
// family, its length, its timeout and its verdict's index.
type packedElem struct {
	addr    [16]byte
	timeout time.Duration
	v       uint32 // 0: the zero Verdict; else vs[v-1]
	bits    int16  // the key's length; -1 for an invalid prefix
	fam     uint8  // 0: no address (the zero netip.Prefix), 4 or 6
}

// ElemsOf packs es.
func ElemsOf(es ...Elem) Elems {
	var s Elems
	s.Append(es...)
	return s
}

// Len returns the number of elements.
func (s Elems) Len() int { return len(s.e) }

// At returns the i-th element.
func (s Elems) At(i int) Elem {
	p := &s.e[i]
	e := Elem{Timeout: p.timeout}
	if p.v > 0 {
		e.Verdict = s.vs[p.v-1]
	}
	switch p.fam {
	case 4:
		e.Key = netip.PrefixFrom(netip.AddrFrom16(p.addr).Unmap(), int(p.bits))
	case 6:
		e.Key = netip.PrefixFrom(netip.AddrFrom16(p.addr), int(p.bits))
	}
	return e
}

// All yields the elements in order with their indexes.
func (s Elems) All() iter.Seq2[int, Elem] {
	return func(yield func(int, Elem) bool) {
		for i := range s.e {
			if !yield(i, s.At(i)) {
				return
			}
		}
	}
}

// List returns the elements unpacked, in a slice of their own.
func (s Elems) List() []Elem {
	out := make([]Elem, len(s.e))
	for i := range s.e {
		out[i] = s.At(i)
	}
	return out
}

// Slice returns the elements i to j-1. It shares s's storage, as a slice
// expression does: appending to one may overwrite the other.
func (s Elems) Slice(i, j int) Elems { return Elems{e: s.e[i:j:j], vs: s.vs[:len(s.vs):len(s.vs)]} }

// Grow makes room for n more elements.
func (s *Elems) Grow(n int) {
	if n > cap(s.e)-len(s.e) {
		e := make([]packedElem, len(s.e), len(s.e)+n)
		copy(e, s.e)
		s.e = e
	}
}

// Append adds es at the end.
func (s *Elems) Append(es ...Elem) {
	for _, e := range es {
		s.e = append(s.e, s.pack(e))
	}
}

// Put replaces the i-th element with e.
func (s *Elems) Put(i int, e Elem) { s.e[i] = s.pack(e) }

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
	if n := len(s.e); n > 0 && s.e[n-1].v > 0 && s.vs[s.e[n-1].v-1] == v {
		return s.e[n-1].v
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

// verdictAt is the verdict of the i-th element.
func (s Elems) verdictAt(i int) Verdict {
	if v := s.e[i].v; v > 0 {
		return s.vs[v-1]
	}
	return Verdict{}
}

// equalAt reports whether s.At(i) == t.At(j), without unpacking them.
func (s Elems) equalAt(i int, t Elems, j int) bool {
	p, q := &s.e[i], &t.e[j]
	return p.addr == q.addr && p.bits == q.bits && p.fam == q.fam && p.timeout == q.timeout &&
		s.verdictAt(i) == t.verdictAt(j)
}

// keyAt is the i-th element's key (elemKey), without unpacking it.
func (s Elems) keyAt(i int) elemKey {
	p := &s.e[i]
	// Masked: clear the bits past the length (the 16-byte form of an
	// IPv4 address has 96 bits before it). An invalid prefix masks to
	// the zero Prefix, whose address is all zeros too.
	if p.fam == 0 || p.bits < 0 {
		return elemKey{bits: uint8(p.bits)}
	}
	bits := int(p.bits)
	if p.fam == 4 {
		bits += 96
	}
	k := elemKey{hi: binary.BigEndian.Uint64(p.addr[:8]), lo: binary.BigEndian.Uint64(p.addr[8:]), bits: uint8(p.bits)}
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
	return s.verdictAt(i) == t.verdictAt(j) && s.e[i].timeout.Milliseconds() == t.e[j].timeout.Milliseconds()
}

// sortedKeys reports whether the elements' keys (keyAt) increase
// strictly.
func (s Elems) sortedKeys() bool {
	for i := 1; i < s.Len(); i++ {
		if !s.keyAt(i - 1).less(s.keyAt(i)) {
			return false
		}
	}
	return true
}
