package source

import (
	"cmp"
	"encoding/binary"
	"iter"
	"net/netip"
	"unsafe"

	"github.com/ipfence/ipfence/internal/prefix"
	"go4.org/netipx"
)

// The entries of a source are kept per address family in compact form: an
// IPv4 entry takes 16 bytes, an IPv6 entry 40 (a netipx.IPRange alone takes
// 48), and no set is built per row. Sets are built on demand by merging the
// entries, which are kept sorted by first address.

// key is the integer form of one family's addresses.
type key[K any] interface {
	comparable
	compare(K) int
	// next returns the following address; false when k is the last one.
	next() (K, bool)
	addr() netip.Addr
	// wide is k as a 128-bit integer, for packing rows; fromWide the
	// reverse (k is ignored).
	wide() prefix.U128
	fromWide(prefix.U128) K
}

// k4 is an IPv4 address as an integer.
type k4 uint32

func k4From(a netip.Addr) k4 { b := a.As4(); return k4(binary.BigEndian.Uint32(b[:])) }

func (k k4) compare(o k4) int { return cmp.Compare(k, o) }
func (k k4) next() (k4, bool) { return k + 1, k != ^k4(0) }

func (k k4) addr() netip.Addr {
	return netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)})
}

func (k k4) wide() prefix.U128       { return prefix.U128{Lo: uint64(k)} }
func (k4) fromWide(w prefix.U128) k4 { return k4(w.Lo) }
func (k k6) wide() prefix.U128       { return prefix.U128{Hi: k.hi, Lo: k.lo} }
func (k6) fromWide(w prefix.U128) k6 { return k6{w.Hi, w.Lo} }

// add returns k+n; false when that is past the last address.
func (k k4) add(n uint64) (k4, bool) {
	s := uint64(k) + n
	return k4(s), n <= uint64(^uint32(0)) && s <= uint64(^uint32(0))
}

// k6 is an IPv6 address as a 128-bit integer.
type k6 struct{ hi, lo uint64 }

func (k k6) compare(o k6) int {
	if c := cmp.Compare(k.hi, o.hi); c != 0 {
		return c
	}
	return cmp.Compare(k.lo, o.lo)
}

func (k k6) next() (k6, bool) {
	if k.lo != ^uint64(0) {
		return k6{k.hi, k.lo + 1}, true
	}
	return k6{k.hi + 1, 0}, k.hi != ^uint64(0)
}

func (k k6) addr() netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], k.hi)
	binary.BigEndian.PutUint64(b[8:], k.lo)
	return netip.AddrFrom16(b)
}

func k6From(a netip.Addr) k6 {
	b := a.As16()
	return k6{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// entry is one row of a source: an inclusive range, its country (or
// noCountry), its autonomous system (0: none) and where it was read.
type entry[K key[K]] struct {
	lo, hi K
	asn    uint32
	cc     uint16
	file   uint16 // index into Source.files
	line   uint32
}

// table holds one family's entries, sorted by first address, widest
// first, and packed: each row is written as its difference from the one
// before (rowWriter), about 7.5 bytes a row of the bundled country data,
// IPv4 or IPv6, instead of the 16 and 40 of an entry. Every use of the rows is
// a pass in order (building a set, explain), which reads them one by one.
type table[K key[K]] struct {
	b []byte
	n int // rows
}

// join returns the rows of all parts, each part without the
// rows that repeat or fall within another of the same country in that
// part (compact), sorted by first address, widest first. (Explain
// restores the file order from (file, line).)
func join[K key[K]](parts []chunks[K]) []entry[K] {
	if len(parts) == 1 {
		return parts[0].compacted()
	}
	n := 0
	kept := make([][]entry[K], len(parts))
	for i := range parts {
		kept[i] = parts[i].compacted()
		n += len(kept[i])
	}
	es := make([]entry[K], 0, n)
	for i, k := range kept {
		es, kept[i] = append(es, k...), nil
	}
	sortRows(es)
	return es
}

// pack sets the table to es, sorted by first address.
func (t *table[K]) pack(es []entry[K]) {
	// Room for what rows take at most in most tables (IPv4: 12 bytes a
	// row, where a 400k-line feed's take 11): growing by append took
	// six times the table's size in allocations.
	var w rowWriter
	w.b = make([]byte, 0, len(es)*int(unsafe.Sizeof(es[0])*3/4)+64)
	for i := range es {
		w.row(es[i].lo.wide(), es[i].hi.wide(), es[i].cc, es[i].asn, es[i].file, es[i].line)
	}
	// A copy of its size when the room was much more than that.
	t.b, t.n = w.b, len(es)
	if cap(t.b)-len(t.b) > len(t.b)/8 {
		t.b = append(make([]byte, 0, len(w.b)), w.b...)
	}
}

// all yields the rows in order.
func (t *table[K]) all() iter.Seq[entry[K]] {
	return func(yield func(entry[K]) bool) {
		var r rowReader
		var k K
		for b := t.b; len(b) > 0; {
			var lo, hi prefix.U128
			var e entry[K]
			b, lo, hi, e.cc, e.asn, e.file, e.line = r.row(b)
			e.lo, e.hi = k.fromWide(lo), k.fromWide(hi)
			if !yield(e) {
				return
			}
		}
	}
}

// selector picks rows by country or by autonomous system; a nil
// *selector picks every row.
type selector struct {
	cc *[numCodes]bool // the countries picked; nil: by ASN
	// asns are the autonomous systems picked (with invert: every other
	// one); a row of no ASN is never picked.
	asns   map[uint32]bool
	invert bool
}

func (s *selector) picks(cc uint16, asn uint32) bool {
	switch {
	case s == nil:
		return true
	case s.cc != nil:
		return cc < numCodes && s.cc[cc]
	}
	return asn != 0 && s.asns[asn] != s.invert
}

// addTo adds to b the union of the entries sel picks, merged into as
// few ranges as possible first so that b has little left to do.
func (t *table[K]) addTo(b *prefix.Builder, sel *selector) { t.ranges(sel, b.AddRange) }

// ranges calls fn with the ranges of the union of the entries sel picks,
// in order: the ranges of the set Source.build makes of them.
func (t *table[K]) ranges(sel *selector, fn func(netipx.IPRange)) {
	unionRanges(t.all(), sel, fn)
}

// unionRanges is ranges over the entries es yields, sorted by first
// address.
func unionRanges[K key[K]](es iter.Seq[entry[K]], sel *selector, fn func(netipx.IPRange)) {
	var lo, hi K
	open := false
	for e := range es {
		if !sel.picks(e.cc, e.asn) {
			continue
		}
		if open {
			if n, ok := hi.next(); !ok || e.lo.compare(n) <= 0 {
				// Overlapping or adjacent (or hi is the last address).
				if e.hi.compare(hi) > 0 {
					hi = e.hi
				}
				continue
			}
			fn(netipx.IPRangeFrom(lo.addr(), hi.addr()))
		}
		lo, hi, open = e.lo, e.hi, true
	}
	if open {
		fn(netipx.IPRangeFrom(lo.addr(), hi.addr()))
	}
}

// containing appends to out the entries that contain k, in sorted order.
func (t *table[K]) containing(k K, out []entry[K]) []entry[K] {
	for e := range t.all() {
		if e.lo.compare(k) > 0 {
			break // sorted by lo: no later entry starts at or before k
		}
		if e.hi.compare(k) >= 0 {
			out = append(out, e)
		}
	}
	return out
}
