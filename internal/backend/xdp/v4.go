package xdp

import (
	"net/netip"
	"slices"
)

// V4 is the IPv4 layout: a direct-indexed table in three levels, the
// DIR-24-8 idea cut 16-8-8 so that no level needs more than 256 KiB for
// nothing:
//
//   - L1 has an entry per /16 (65,536);
//   - an L1 entry that does not decide points to a chunk of L2, an entry
//     per /24 of that /16 (256 per chunk);
//   - an L2 entry that does not decide points to a leaf for that /24:
//     a 256-bit bitmap with a class for its set bits and one for its
//     clear bits, or, when three classes or more meet inside one /24
//     (passing counts as one), a class per address.
//
// A lookup is at most three array reads: in BPF, array map lookups that
// the verifier inlines, so a packet costs a few nanoseconds whatever the
// number of prefixes. Memory grows with the number of /16s and /24s the
// rules cut, not with the number of prefixes.
type V4 struct {
	L1    [1 << 16]Entry
	L2    [][256]Entry // chunks
	Bits  []BitLeaf    // leaves of two classes
	Bytes [][256]byte  // leaves of three classes or more: a Class per address
}

// Entry is an element of V4's L1 and L2: a class that decides, or where to
// look next. The top two bits say which (see EntryKind); the rest is the
// class or the index of the chunk or leaf.
type Entry uint32

// EntryKind is what an Entry says.
type EntryKind uint32

const (
	Decide   EntryKind = 0 // the low bits are the Class
	Chunk    EntryKind = 1 // L1: the L2 chunk at the index
	BitsLeaf EntryKind = 2 // L2: the Bits leaf at the index
	ByteLeaf EntryKind = 3 // L2: the Bytes leaf at the index
)

const (
	kindShift = 30
	indexMask = 1<<kindShift - 1
)

func entry(k EntryKind, v int) Entry { return Entry(uint32(k)<<kindShift | uint32(v)) }

// Kind is what e says; Index its class, chunk or leaf.
func (e Entry) Kind() EntryKind { return EntryKind(e >> kindShift) }
func (e Entry) Index() int      { return int(e & indexMask) }

// BitLeaf is a /24 of two classes: addresses whose bit is set are Class,
// the others Else. Bit i of word i/32 is the address with last byte i.
// Classes are 32 bits wide to keep the BPF value aligned.
type BitLeaf struct {
	Words [8]uint32
	Class uint32
	Else  uint32
}

// BuildV4 builds the IPv4 layout of rules.
func BuildV4(rules []Rule) (*V4, error) {
	spans, err := partition(rules, true)
	if err != nil {
		return nil, err
	}
	return buildV4(spans), nil
}

// buildV4 builds the IPv4 layout of the IPv4 spans of a partition.
func buildV4(spans []span) *V4 {
	t := &V4{}
	c := cursor{spans: spans}
	for hi := range uint32(1 << 16) {
		base := hi << 16
		if cl, ok := c.uniform(base, base|0xffff); ok {
			t.L1[hi] = entry(Decide, int(cl))
			continue
		}
		t.L1[hi] = entry(Chunk, len(t.L2))
		var chunk [256]Entry
		for mid := range uint32(256) {
			b := base | mid<<8
			if cl, ok := c.uniform(b, b|0xff); ok {
				chunk[mid] = entry(Decide, int(cl))
				continue
			}
			chunk[mid] = t.leaf(&c, b)
		}
		t.L2 = append(t.L2, chunk)
	}
	return t
}

// leaf adds the leaf of the /24 at base and returns the L2 entry for it.
func (t *V4) leaf(c *cursor, base uint32) Entry {
	var classes [256]byte
	var seen []Class // distinct classes in address order, up to three
	for lo := range uint32(256) {
		cl := c.at(base | lo)
		classes[lo] = byte(cl)
		if len(seen) < 3 && !slices.Contains(seen, cl) {
			seen = append(seen, cl)
		}
	}
	if len(seen) > 2 {
		t.Bytes = append(t.Bytes, classes)
		return entry(ByteLeaf, len(t.Bytes)-1)
	}
	// Not uniform (L2 would have decided), so two classes: the first
	// address's is Else.
	l := BitLeaf{Class: uint32(seen[1]), Else: uint32(seen[0])}
	for i, cl := range classes {
		if Class(cl) == seen[1] {
			l.Words[i/32] |= 1 << (i % 32)
		}
	}
	t.Bits = append(t.Bits, l)
	return entry(BitsLeaf, len(t.Bits)-1)
}

// Lookup returns the class of a, an IPv4 address, reading the tables the
// way the BPF program does: the model its verdicts are tested against.
func (t *V4) Lookup(a netip.Addr) Class {
	v := u32(a)
	e := t.L1[v>>16]
	if e.Kind() == Decide {
		return Class(e.Index())
	}
	e = t.L2[e.Index()][v>>8&0xff]
	switch e.Kind() {
	case BitsLeaf:
		l := &t.Bits[e.Index()]
		if l.Words[v&0xff/32]>>(v%32)&1 != 0 {
			return Class(l.Class)
		}
		return Class(l.Else)
	case ByteLeaf:
		return Class(t.Bytes[e.Index()][v&0xff])
	}
	return Class(e.Index())
}

// Memory is the bytes the tables take in BPF maps: their values, each
// rounded up to 8 bytes as array maps store them (an L2 chunk is one
// value).
func (t *V4) Memory() int {
	return 8*len(t.L1) + 1024*len(t.L2) + 40*len(t.Bits) + 256*len(t.Bytes)
}

// cursor walks a family's spans in address order.
type cursor struct {
	spans []span
	i     int
}

// at returns the class of v; v never decreases from call to call.
func (c *cursor) at(v uint32) Class {
	for u32(c.spans[c.i].to) < v {
		c.i++
	}
	return c.spans[c.i].class
}

// uniform returns the class of [lo, hi] if it has one class; lo never
// decreases from call to call.
func (c *cursor) uniform(lo, hi uint32) (Class, bool) {
	cl := c.at(lo)
	return cl, u32(c.spans[c.i].to) >= hi
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
