package xdp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/ipfence/ipfence/internal/prefix"
)

// V6 is the IPv6 layout: a direct-indexed table for the first 16 bits,
// then hash tables at prefix lengths picked from the data.
//
//   - L1 has an entry per /16: a class that decides, or the level to look
//     the address up in next.
//   - A level looks up the first Bits bits of the address in an
//     open-addressing hash table (linear probing, multiply-shift hash).
//     A key found decides or names the next, longer level; a key absent
//     takes the class the entry that led there gave.
//
// Each node of the tree picks its own next length: the longest prefix
// length found under it whose expansion stays within a budget (see
// childBudget). So a /16 holding only /48s is looked up at /48 directly,
// and one mixing /29s, /32s and /48s at /32 then /48. Tables are filled to
// one half, so a key takes one or two probes on average and a miss ends on
// an empty slot after two or three; each level records the most probes any of its keys needs,
// and the program unrolls that many.
//
// The classes come from prefixes under longest-prefix match (see
// lpmPrefixes): an entry naming the next level also carries the class of
// the addresses that level does not hold.
type V6 struct {
	L1     [1 << 16]Entry
	Levels []Level
	// Next are the levels L1 entries name, most used first.
	Next []int
	// NarrowSlots and WideSlots are the slots of every level, each level
	// a power-of-two region of one of them (see Level.Base).
	NarrowSlots, WideSlots int
}

// NextLevel is the kind of an IPv6 Entry naming the level to look up next
// (its index in V6.Levels). It shares its value with Chunk, which only
// IPv4 entries use.
const NextLevel EntryKind = 1

// Level is one hash table of a V6 layout.
type Level struct {
	// Bits is the length of the prefixes it holds: its key is the first
	// Bits bits of an address.
	Bits int
	// Mult are the odd multipliers of the hash of the first 64 bits of the
	// key and (wide levels, Bits > 64) of the rest.
	Mult [2]uint64
	// Probes is the most probes any key of the level needs.
	Probes int
	// Base is where the level's slots start in its map (narrow or wide).
	Base  int
	Slots []Slot
	// Next are the levels its entries name, most used first.
	Next []int
}

// Slot is a slot of a level's hash table: a key, right-aligned (Hi the
// first min(Bits, 64) bits of the address, Lo the next Bits-64 bits), and
// its Entry; Entry 0 marks an empty slot.
type Slot struct {
	Hi, Lo uint64
	Entry  Entry
}

// Wide reports whether the level's keys are longer than 64 bits: its
// slots are 24 bytes in BPF, not 16.
func (lv *Level) Wide() bool { return lv.Bits > 64 }

// key returns the key of the address hi:lo at the level.
func (lv *Level) key(hi, lo uint64) (uint64, uint64) {
	if !lv.Wide() {
		return hi >> (64 - lv.Bits), 0
	}
	return hi, lo >> (128 - lv.Bits)
}

// home returns the slot where the probes for key k start: the top 32
// bits of the hash scaled to the number of slots.
func (lv *Level) home(khi, klo uint64) int {
	h := khi * lv.Mult[0]
	if lv.Wide() {
		h += klo * lv.Mult[1]
	}
	return int((h >> 32) * uint64(len(lv.Slots)) >> 32)
}

// find returns the entry of the key of hi:lo, 0 if the level has none,
// probing as the program does.
func (lv *Level) find(hi, lo uint64) Entry {
	khi, klo := lv.key(hi, lo)
	h := lv.home(khi, klo)
	for i := range lv.Probes {
		s := &lv.Slots[(h+i)%len(lv.Slots)]
		if s.Entry == 0 {
			return 0
		}
		if s.Hi == khi && s.Lo == klo {
			return s.Entry
		}
	}
	return 0
}

// Lookup returns the class of a, an IPv6 address, reading the tables the
// way the BPF program does: the model its verdicts are tested against.
func (t *V6) Lookup(a netip.Addr) Class {
	u := prefix.U128From(a)
	hi, lo := u.Hi, u.Lo
	e := t.L1[hi>>48]
	for e.Kind() == NextLevel {
		def := e.defaultClass()
		if e = t.Levels[e.level()].find(hi, lo); e == 0 {
			return def
		}
	}
	return Class(e.Index() & 0xff)
}

// Memory is the bytes the tables take in BPF maps: their values, each
// rounded up to 8 bytes as array maps store them.
func (t *V6) Memory() int { return 8*len(t.L1) + 16*t.NarrowSlots + 24*t.WideSlots }

// p6 is a prefix of a V6 layout: its address, length and class.
type p6 struct {
	addr  prefix.U128
	bits  int
	class Class
}

// v6Builder collects the entries of each level while the tree is built.
type v6Builder struct {
	levels  map[int]int   // index in t.Levels by Bits
	entries [][]Slot      // by level
	next    []map[int]int // uses of each next level, by level
	first   map[int]int   // uses of each level by L1
	t       *V6
}

// childBudget is the most entries a node may give its next level: one per
// prefix, and a few more so that small nodes may jump far.
func childBudget(n int) int { return n + 16 }

// buildV6 builds the IPv6 layout of ps: IPv6 prefixes and their classes
// under longest-prefix match (see lpmPrefixes), in address order, shorter
// first.
func buildV6(ps []ClassPrefix) (*V6, error) {
	var all []p6
	for _, p := range ps {
		if !p.Prefix.Addr().Is6() {
			continue
		}
		all = append(all, p6{prefix.U128From(p.Prefix.Addr()), p.Prefix.Bits(), p.Class})
	}
	b := &v6Builder{levels: map[int]int{}, first: map[int]int{}, t: &V6{}}
	b.fill(l1Level, 16, all, 0, 0, prefix.U128{}, prefix.U128{Lo: 1<<16 - 1})
	return b.t, b.finish()
}

// l1Level stands for V6.L1 where fill takes a level.
const l1Level = -1

// contains reports whether p contains q.
func (p *p6) contains(q *p6) bool {
	return q.bits >= p.bits && p.addr.Shr(128-p.bits) == q.addr.Shr(128-p.bits)
}

// fill adds the entries of level lv (keys of at bits) for the keys from
// through to, where the prefixes ps lie: outside them the class is cur, and
// a key absent from the level reads as nodeDef. A prefix no longer than at
// decides its keys (those of its own inner prefixes aside); prefixes
// longer than at that share a key make a node of the next level.
func (b *v6Builder) fill(lv, at int, ps []p6, cur, nodeDef Class, from, to prefix.U128) {
	pos := from
	for i := 0; i < len(ps); {
		p := &ps[i]
		ks := p.addr.Shr(128 - at)
		ke := ks
		if p.bits <= at {
			ke = ks.Add64(1<<(at-p.bits) - 1)
		}
		if pos.Less(ks) {
			b.decide(lv, at, pos, ks.Sub64(1), cur, nodeDef)
		}
		j := i + 1
		for j < len(ps) && p.contains(&ps[j]) {
			j++
		}
		if p.bits > at {
			for j < len(ps) && ps[j].addr.Shr(128-at) == ks {
				j++
			}
			b.put(lv, at, ks, b.node(at, ps[i:j], cur))
		} else {
			b.fill(lv, at, ps[i+1:j], p.class, nodeDef, ks, ke)
		}
		i = j
		if ke == to {
			return
		}
		pos = ke.Add64(1)
	}
	b.decide(lv, at, pos, to, cur, nodeDef)
}

// decide adds the keys from through to as class c, unless c is what
// absent keys read as.
func (b *v6Builder) decide(lv, at int, from, to prefix.U128, c, nodeDef Class) {
	if c == nodeDef {
		return
	}
	for k := from; ; k = k.Add64(1) {
		b.put(lv, at, k, entry(Decide, int(c)))
		if k == to {
			return
		}
	}
}

// put adds key k with entry e to level lv (or L1).
func (b *v6Builder) put(lv, at int, k prefix.U128, e Entry) {
	if lv == l1Level {
		b.t.L1[k.Lo] = e
		if e.Kind() == NextLevel {
			b.first[e.level()]++
		}
		return
	}
	if e.Kind() == NextLevel {
		b.next[lv][e.level()]++
	}
	a := k.Shl(128 - at) // the key's first address
	hi, lo := (&Level{Bits: at}).key(a.Hi, a.Lo)
	b.entries[lv] = append(b.entries[lv], Slot{hi, lo, e | occupied})
}

// occupied marks an entry in a slot, so that a slot holding class 0 is
// not empty.
const occupied = 1 << 29

// nextLevel is the entry naming level lv with def the class of the
// addresses absent from it.
func nextLevel(lv int, def Class) Entry { return entry(NextLevel, lv|int(def)<<8) }

func (e Entry) level() int          { return e.Index() & 0xff }
func (e Entry) defaultClass() Class { return Class(e.Index() >> 8 & 0xff) }

// node adds the entries under a node of depth d holding the prefixes ps
// (each longer than d, sharing their first d bits; addresses under none
// of them are class def) and returns the entry naming the level they went
// to.
func (b *v6Builder) node(d int, ps []p6, def Class) Entry {
	// The longest length whose expansion fits the budget; the shortest
	// length present always fits (it expands nothing).
	var lengths []int
	for _, p := range ps {
		lengths = append(lengths, p.bits)
	}
	slices.Sort(lengths)
	lengths = slices.Compact(lengths)
	at := lengths[0]
	for _, n := range lengths[1:] {
		if children(ps, n) > childBudget(len(ps)) {
			break
		}
		at = n
	}
	lv := b.level(at)
	first := ps[0].addr.Shr(128 - d).Shl(128 - d) // the node's first address
	last := first.Add(prefix.Pow2(128 - d).Sub64(1))
	b.fill(lv, at, ps, def, def, first.Shr(128-at), last.Shr(128-at))
	return nextLevel(lv, def)
}

// children is the number of entries ps give a level of length n: the
// expansion of those no longer than n, and the distinct first n bits of
// the others.
func children(ps []p6, n int) int {
	c := 0
	var last prefix.U128
	for i, p := range ps {
		if p.bits <= n {
			if n-p.bits >= 30 {
				return 1 << 30
			}
			c += 1 << (n - p.bits)
			continue
		}
		if k := p.addr.Shr(128 - n); i == 0 || k != last || ps[i-1].bits <= n {
			c++
			last = k
		}
	}
	return c
}

// level returns the index of the level of length n, adding it if new.
func (b *v6Builder) level(n int) int {
	if i, ok := b.levels[n]; ok {
		return i
	}
	b.levels[n] = len(b.t.Levels)
	b.t.Levels = append(b.t.Levels, Level{Bits: n})
	b.entries = append(b.entries, nil)
	b.next = append(b.next, map[int]int{})
	return len(b.t.Levels) - 1
}

// Probing limits: a table whose keys need more probes than maxProbes is
// hashed again with other multipliers, and after a few tries doubled.
const (
	maxProbes = 64
	rehashes  = 4
)

// finish builds each level's hash table and lays the levels out in the
// narrow and wide maps.
func (b *v6Builder) finish() error {
	b.t.Next = byUse(b.first)
	for i := range b.t.Levels {
		lv := &b.t.Levels[i]
		if err := lv.fill(b.entries[i]); err != nil {
			return err
		}
		lv.Next = byUse(b.next[i])
		if lv.Wide() {
			lv.Base, b.t.WideSlots = b.t.WideSlots, b.t.WideSlots+len(lv.Slots)
		} else {
			lv.Base, b.t.NarrowSlots = b.t.NarrowSlots, b.t.NarrowSlots+len(lv.Slots)
		}
	}
	return nil
}

// byUse returns the levels counted in uses, most used first.
func byUse(uses map[int]int) []int {
	var out []int
	for n := range uses {
		out = append(out, n)
	}
	slices.SortFunc(out, func(x, y int) int {
		if c := uses[y] - uses[x]; c != 0 {
			return c
		}
		return x - y
	})
	return out
}

// fill builds the level's hash table of the given entries: half full,
// and no key more than maxProbes probes from its home slot.
func (lv *Level) fill(entries []Slot) error {
	size := max(8, 2*len(entries))
	// Multipliers are drawn from a fixed seed: the same rules give the
	// same tables.
	r := rand.New(rand.NewPCG(uint64(lv.Bits), uint64(len(entries))))
	for try := 0; ; try++ {
		if size > 1<<31-1 {
			return fmt.Errorf("IPv6 level /%d: %d keys do not hash into %d slots", lv.Bits, len(entries), size)
		}
		lv.Mult = [2]uint64{r.Uint64() | 1, r.Uint64() | 1}
		lv.Slots = make([]Slot, size)
		lv.Probes = 1
		ok := true
		for _, e := range entries {
			h := lv.home(e.Hi, e.Lo)
			n := 0
			for lv.Slots[(h+n)%size].Entry != 0 {
				n++
			}
			if n >= maxProbes {
				ok = false
				break
			}
			lv.Slots[(h+n)%size] = e
			lv.Probes = max(lv.Probes, n+1)
		}
		if ok {
			return nil
		}
		if try%rehashes == rehashes-1 {
			size += size / 2
		}
	}
}
