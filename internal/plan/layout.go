package plan

import (
	"encoding/json"
	"fmt"
	"iter"
	"net/netip"
	"slices"

	"github.com/ipfence/ipfence/internal/prefix"
)

// Kind is the shape chosen for one family of one rule's set.
type Kind string

const (
	// KindEmpty: the set has no address of this family; nothing is
	// emitted and no packet of the family is matched.
	KindEmpty Kind = "empty"
	// KindAll: the set is the whole family (only reachable for accept
	// rules; blocking rules refuse it at policy level).
	KindAll Kind = "all"
	// KindPlain: a plain nftables interval set (small sets).
	KindPlain Kind = "plain"
	// KindTree: hash verdict maps keyed on the source address masked to
	// each level's length; see Layout.
	KindTree Kind = "tree"
	// KindXDP: the rule runs in XDP, whose backend compiles its own
	// tables from the rule's set; only Prefixes is set.
	KindXDP Kind = "xdp"
	// KindIPSet and KindSplit: the rule runs in iptables, matching ipsets
	// or chains of plain rules; only Prefixes is set.
	KindIPSet Kind = "ipset"
	KindSplit Kind = "iptables-split"
)

// EntryKind is what a map entry of a tree level says.
type EntryKind uint8

const (
	// In: the whole bucket is in the set.
	In EntryKind = iota + 1
	// Out: the whole bucket is outside the set.
	Out
	// DescendIn: mixed bucket; look at the next level, where a key that
	// is absent means In.
	DescendIn
	// DescendOut: mixed bucket; at the next level an absent key means Out.
	DescendOut
	// DescendRest: mixed bucket too deep for more levels (the kernel
	// allows 16 nested chains); decided by the small interval set Rest.
	DescendRest
)

// MaxDepth is the most map lookups a packet does in one tree layout. With
// the jump from the base chain and the goto into the verdict chain it keeps
// well inside the kernel's limit of 16 nested chains.
const MaxDepth = 12

func (k EntryKind) String() string {
	switch k {
	case In:
		return "in"
	case Out:
		return "out"
	case DescendIn:
		return "descend-in"
	case DescendOut:
		return "descend-out"
	case DescendRest:
		return "descend-rest"
	}
	return fmt.Sprintf("EntryKind(%d)", uint8(k))
}

// Entry is one element of a level's map: 24 bytes and no pointers (a
// netip.Prefix key took 40, which the garbage collector scanned). An
// IPv4 level keeps its entries packed in 8 bytes each (see Level).
type Entry struct {
	addr [16]byte // the key's address (As16)
	bits uint8    // the key's length
	is4  bool
	Kind EntryKind
	next uint8 // child length, while building
	// Next is the index (in Layout.Levels) of the level a Descend entry
	// continues at: each mixed bucket picks its own.
	Next int32
}

// NewEntry is the entry of key (Bits long, masked) with kind, continuing
// at level next (Descend entries).
func NewEntry(key netip.Prefix, kind EntryKind, next int32) Entry {
	a := key.Addr()
	return Entry{addr: a.As16(), bits: uint8(key.Bits()), is4: a.Is4(), Kind: kind, Next: next}
}

// Key is the entry's key: a prefix of its level's Bits, masked.
func (e Entry) Key() netip.Prefix {
	a := netip.AddrFrom16(e.addr)
	if e.is4 {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, int(e.bits))
}

// Level is one hash map of a tree layout: the buckets of length Bits that
// packets look up as their Depth-th lookup (1 = first).
type Level struct {
	Bits  int
	Depth int
	// The entries (Len, Entry, All), in the order they were added. A
	// layout has one for every map element until it is lowered, and
	// IPv4 ones are most of them (689k for a 400k-line feed), so an
	// IPv4 level keeps each packed in one uint64 (packEntry4): 8 bytes
	// where an Entry takes 24. IPv6 entries are kept whole.
	e4 []uint64
	e6 []Entry
	// Bitmap (an IPv4 root level at /16 only) says the level is looked
	// up in bitmaps of the address's leading 16 bits (16 KiB each,
	// always in cache), one per verdict: In, Out, and Descend to the one
	// level every mixed /16 bucket continues at, with either default.
	Bitmap bool `json:",omitempty"`
	// Order (Bitmap levels) is the entry kinds in the order their
	// bitmap rules are tried: the most traffic under the chooser's
	// model first, since each packet pays for the rules before its own.
	Order []EntryKind `json:",omitempty"`
}

// NewLevel is a level of entries, all keys of length bits.
func NewLevel(bits, depth int, entries ...Entry) Level {
	lv := Level{Bits: bits, Depth: depth}
	for _, e := range entries {
		lv.add(e)
	}
	return lv
}

// Len is the number of the level's entries.
func (lv *Level) Len() int { return len(lv.e4) + len(lv.e6) }

// Entry returns entry i of the level.
func (lv *Level) Entry(i int) Entry {
	if lv.e4 != nil {
		return unpackEntry4(lv.e4[i], lv.Bits)
	}
	return lv.e6[i]
}

// All yields the level's entries with their index, in order.
func (lv *Level) All() iter.Seq2[int, Entry] {
	return func(yield func(int, Entry) bool) {
		for i := range lv.Len() {
			if !yield(i, lv.Entry(i)) {
				return
			}
		}
	}
}

// add appends e, whose key must be Bits long.
func (lv *Level) add(e Entry) {
	if e.is4 {
		lv.e4 = append(lv.e4, packEntry4(e))
	} else {
		lv.e6 = append(lv.e6, e)
	}
}

// setNext sets entry i's Next.
func (lv *Level) setNext(i int, next int32) {
	if lv.e4 != nil {
		if next < 0 || next > 1<<16-1 {
			panic(fmt.Sprintf("plan: IPv4 level index %d out of its packing", next))
		}
		lv.e4[i] = lv.e4[i]&^(1<<16-1) | uint64(next)
		return
	}
	lv.e6[i].Next = next
}

// spare is how many more entries the level holds without growing.
func (lv *Level) spare() int { return cap(lv.e4) - len(lv.e4) + cap(lv.e6) - len(lv.e6) }

// grow makes room for n entries in all (the family of the first: is4).
func (lv *Level) grow(n int, is4 bool) {
	if is4 {
		lv.e4 = withCap(lv.e4, n)
	} else {
		lv.e6 = withCap(lv.e6, n)
	}
}

// withCap is a copy of s with room for n (slices.Grow would round up to
// a quarter more).
func withCap[T any](s []T, n int) []T {
	out := make([]T, len(s), n)
	copy(out, s)
	return out
}

// fit copies the entries to their size when they keep much more room
// than that.
func (lv *Level) fit() {
	if n := lv.Len(); lv.spare() > n/4+1024 {
		lv.e4, lv.e6 = slices.Clone(lv.e4), slices.Clone(lv.e6)
	}
}

// release drops the entries.
func (lv *Level) release() { lv.e4, lv.e6 = nil, nil }

// packEntry4 packs an IPv4 entry: its key's address, kind, child length
// (while building) and Next, as addr<<32 | kind<<24 | next<<16 | Next.
// Next is a level index: an IPv4 layout has at most MaxDepth times 33
// levels.
func packEntry4(e Entry) uint64 {
	if e.Next < 0 || e.Next > 1<<16-1 {
		panic(fmt.Sprintf("plan: IPv4 entry's level index %d out of its packing", e.Next))
	}
	a := uint64(e.addr[12])<<24 | uint64(e.addr[13])<<16 | uint64(e.addr[14])<<8 | uint64(e.addr[15])
	return a<<32 | uint64(e.Kind)<<24 | uint64(e.next)<<16 | uint64(uint16(e.Next))
}

// unpackEntry4 is the entry packEntry4 packed, its key bits long.
func unpackEntry4(x uint64, bits int) Entry {
	a := netip.AddrFrom4([4]byte{byte(x >> 56), byte(x >> 48), byte(x >> 40), byte(x >> 32)})
	return Entry{addr: a.As16(), bits: uint8(bits), is4: true, Kind: EntryKind(x >> 24), next: uint8(x >> 16), Next: int32(uint16(x))}
}

// BitmapBits is the length of a Bitmap level.
const BitmapBits = 16

// Layout is how one address family of one rule's set is represented.
//
// A tree layout is looked up the way the kernel does it: start at level
// Root with RootIn as the verdict for absent keys; look the address masked
// to the level's length up in its entries; an In/Out entry decides; a
// Descend entry sets the default and the level (Next) to continue at; an
// absent key decides the current default. Every bucket whose verdict
// differs from its parent's default has an entry, so each level holds only
// exceptions, and both defaults and the next level's length are chosen
// per bucket from the data (see trie.go).
type Layout struct {
	Is4  bool
	Kind Kind
	// Prefixes is the size of the minimal CIDR cover of the set.
	Prefixes int
	// Plain holds the cover for KindPlain.
	Plain []netip.Prefix
	// Root is the index of the first level looked up; RootIn is the
	// verdict of addresses whose key is absent there.
	Root   int
	RootIn bool
	Levels []Level
	// Rest holds the in-set prefixes of buckets marked DescendRest.
	Rest []netip.Prefix
	// Cost is the model's expected number of map lookups per packet for
	// traffic that passes the rule and for random traffic (tree only).
	Cost CostEstimate
	// Choices are what the chooser decided (tree only, with
	// Options.Record): Release keeps them.
	Choices *Choices

	index []map[netip.Addr]Entry // built on first Contains
	// objective is the chooser's total: lookups per packet + price ×
	// elements (tree only).
	objective float64
	// released: Release dropped the elements, releasedN of them.
	released  bool
	releasedN int
}

// CostEstimate is the layout chooser's per-packet model.
type CostEstimate struct {
	// LookupsPass is the expected number of map lookups for packets
	// uniformly drawn from the addresses the rule lets through.
	LookupsPass float64 `json:"lookups_pass"`
	// LookupsRandom is the same for uniformly random sources (IPv6:
	// from 2000::/3).
	LookupsRandom float64 `json:"lookups_random"`
}

// Entries is the number of map elements of all levels.
func (l *Layout) Entries() int {
	if l.released {
		return l.releasedN
	}
	n := 0
	for _, lv := range l.Levels {
		n += lv.Len()
	}
	return n
}

// Release drops the map elements of the levels once they are lowered
// into a program, which holds its own: they take 40 bytes each, for as
// long as the plan lives (a daemon's). The levels stay, with their
// lengths, depths and bitmap order; Entries still counts the elements.
// Contains, Lookups and Trace panic on a released layout.
func (l *Layout) Release() {
	if l.released {
		return
	}
	l.releasedN = l.Entries()
	for i := range l.Levels {
		l.Levels[i].release()
	}
	l.index, l.released = nil, true
}

// Strides lists the distinct level lengths, e.g. [16 24 32] (a packet
// looks up only the levels its buckets lead to).
func (l *Layout) Strides() []int {
	var s []int
	for _, lv := range l.Levels {
		if !slices.Contains(s, lv.Bits) {
			s = append(s, lv.Bits)
		}
	}
	slices.Sort(s)
	return s
}

// Depth is the most lookups a packet does, a Bitmap level included.
func (l *Layout) Depth() int {
	d := 0
	for _, lv := range l.Levels {
		d = max(d, lv.Depth)
	}
	return d
}

// MaxLookups is the most map lookups a packet does: Depth but a Bitmap
// level.
func (l *Layout) MaxLookups() int {
	if l.BitmapRoot() {
		return l.Depth() - 1
	}
	return l.Depth()
}

// Contains reports whether the layout puts addr in the set, evaluating
// the layout exactly as the kernel will (the model the tests compare the
// set and the kernel against). Addresses of the other family are not in.
func (l *Layout) Contains(addr netip.Addr) bool {
	in, _ := l.lookup(addr, nil)
	return in
}

// Lookups is how many map lookups the kernel does for addr (tree layouts;
// 0 for the others): what a packet from addr costs. A Bitmap root level
// is not a map lookup and is not counted.
func (l *Layout) Lookups(addr netip.Addr) int {
	_, n := l.lookup(addr, nil)
	return n - l.bitmapRoot(n)
}

// BitmapRoot reports whether a tree layout starts with a Bitmap level.
func (l *Layout) BitmapRoot() bool {
	return l.Kind == KindTree && l.Levels[l.Root].Bitmap
}

// Maps is the number of hash maps of a tree layout: its levels but a
// Bitmap one.
func (l *Layout) Maps() int {
	if l.BitmapRoot() {
		return len(l.Levels) - 1
	}
	return len(l.Levels)
}

// bitmapRoot is 1 when a packet that did n lookups (n > 0) started at a
// Bitmap root level, else 0.
func (l *Layout) bitmapRoot(n int) int {
	if n > 0 && l.BitmapRoot() {
		return 1
	}
	return 0
}

// Trace is Lookups with the detail of the cost: the 32-bit key words the
// lookups read (IPv4: one per lookup; IPv6: the fewest words holding
// each level's bits, see KeyWords) and whether the packet ended in the
// rest interval set (counted as one lookup, no words).
func (l *Layout) Trace(addr netip.Addr) (words, lookups int, rest bool) {
	var t trace
	_, lookups = l.lookup(addr, &t)
	return t.words, lookups - l.bitmapRoot(lookups), t.rest
}

type trace struct {
	words int
	rest  bool
}

// KeyWords is how many 32-bit words of the source a level of the given
// length reads as its key (IPv4: always one).
func KeyWords(is4 bool, bits int) int {
	if is4 {
		return 1
	}
	return max(1, (bits+31)/32)
}

func (l *Layout) lookup(addr netip.Addr, t *trace) (in bool, lookups int) {
	if l.released {
		panic("plan: lookup in a released layout (Layout.Release)")
	}
	if addr.Is4() != l.Is4 || addr.Is4In6() {
		return false, 0
	}
	switch l.Kind {
	case KindEmpty:
		return false, 0
	case KindAll:
		return true, 0
	case KindPlain:
		for _, p := range l.Plain {
			if p.Contains(addr) {
				return true, 0
			}
		}
		return false, 0
	case KindXDP, KindIPSet, KindSplit:
		panic("plan: a rule that runs in " + string(l.Kind) + " has no nftables layout to look up; use Rule.Set")
	}
	if l.index == nil {
		l.index = make([]map[netip.Addr]Entry, len(l.Levels))
		for i, lv := range l.Levels {
			m := make(map[netip.Addr]Entry, lv.Len())
			for _, e := range lv.All() {
				m[e.Key().Addr()] = e
			}
			l.index[i] = m
		}
	}
	def, i := l.RootIn, l.Root
	for n := 1; n <= len(l.Levels); n++ {
		if t != nil && !l.Levels[i].Bitmap {
			t.words += KeyWords(l.Is4, l.Levels[i].Bits)
		}
		e, ok := l.index[i][netip.PrefixFrom(addr, l.Levels[i].Bits).Masked().Addr()]
		if !ok {
			return def, n
		}
		switch e.Kind {
		case In:
			return true, n
		case Out:
			return false, n
		case DescendIn:
			def = true
		case DescendOut:
			def = false
		case DescendRest:
			if t != nil {
				t.rest = true
			}
			for _, p := range l.Rest {
				if p.Contains(addr) {
					return true, n + 1
				}
			}
			return false, n + 1
		}
		i = int(e.Next)
	}
	return def, len(l.Levels)
}

// Options tune the layout chooser. The zero value gives the defaults.
type Options struct {
	// PlainMax: sets with at most this many prefixes use a plain
	// interval set. 0 means DefaultPlainMax; negative means never.
	PlainMax int
	// Strides4 and Strides6 force the tree levels of a family (for
	// tests and experiments); they must increase and end at or beyond
	// the longest prefix.
	Strides4, Strides6 []int
	// ElementPrice is what a million map elements are worth in lookups
	// per packet when choosing levels: more elements cost kernel memory
	// and load time. 0 means DefaultElementPrice.
	ElementPrice float64
	// MaxEntries caps the elements of a tree; 0 means DefaultMaxEntries.
	MaxEntries int
	// PassIsIn says the traffic that passes the rule is the traffic in
	// the set (allow-only); otherwise it is the traffic outside it.
	PassIsIn bool
	// Model is the traffic the chooser minimises lookups for; the zero
	// value means DefaultModel.
	Model TrafficModel
	// Record keeps what the chooser decided for each tree layout
	// (Layout.Choices), for Replay elsewhere: a fleet's publisher.
	Record bool
	// Consume lets Compile drop each rule's input set (RuleInput.Set =
	// nil) once it has made the rule's own, for callers that do not read
	// the input's sets afterwards: the layouts are then chosen without
	// the input beside the rule's set (18 MB for a 400k-line feed).
	Consume bool
	// Parallel builds a rule's two families at once, on two cores: for
	// a publisher, whose publish every agent waits for, not for a
	// daemon on a busy host, where the chooser's state of both would
	// be live at once.
	Parallel bool
}

// TrafficModel is the traffic the layout chooser expects, as shares of
// all packets (they need not add up to 1: only ratios matter), and what a
// lookup costs.
type TrafficModel struct {
	// Legitimate traffic (the addresses the rule lets through), drawn
	// uniformly over those addresses (big networks weigh most), over
	// their ranges (maximal runs; then an address in the range: every
	// network equally busy), or over the prefixes of their minimal CIDR
	// cover (a range cut into many prefixes weighs more).
	Addresses, Ranges, Prefixes float64
	// Random is uniformly random traffic (IPv6: from 2000::/3).
	Random float64
	// ExtraWord is what each 32-bit key word after the first adds to a
	// lookup, in one-word lookups (IPv6 keys read up to four words).
	ExtraWord float64
	// BitmapLookup is the price, in map lookups, of an IPv4 root level
	// at /16 looked up in bitmaps (Level.Bitmap: two or three rules,
	// ~60 ns each, always in cache, where a lookup in a large map
	// misses it); 0 means no such level.
	BitmapLookup float64
}

// Traffic models: DefaultModel is what Build uses; ModelV1 is the model
// before issue 23 (address- and prefix-uniform legitimate traffic, key
// width ignored), kept to compare layouts side by side.
var (
	DefaultModel = TrafficModel{Addresses: 0.3, Ranges: 0.3, Prefixes: 0.3, Random: 0.1, ExtraWord: 0.15, BitmapLookup: 0.5}
	ModelV1      = TrafficModel{Addresses: 0.45, Prefixes: 0.45, Random: 0.1}
)

// Defaults of Options.
const (
	DefaultPlainMax   = 16
	DefaultMaxEntries = 4 << 20
)

// DefaultElementPrice: a million elements are worth 2 lookups per packet.
const DefaultElementPrice = 2.0

// ErrTooLarge is returned when no tree layout fits in MaxEntries.
var ErrTooLarge = fmt.Errorf("no layout fits the element limit")

// BuildCounts returns the layouts of a rule whose backend builds its own
// tables (kind KindXDP, KindIPSet or KindSplit), IPv4 and IPv6: kind with
// the prefix count, or KindEmpty or KindAll.
func BuildCounts(s *prefix.Set, kind Kind) (v4, v6 *Layout) {
	n4, n6 := prefix.Count(s)
	layout := func(is4 bool, n int) *Layout {
		l := &Layout{Is4: is4, Kind: kind, Prefixes: n}
		switch {
		case n == 0:
			l.Kind = KindEmpty
		case n == 1 && s.ContainsPrefix(fullPrefix(is4)):
			l.Kind = KindAll
		}
		return l
	}
	return layout(true, n4), layout(false, n6)
}

// Build chooses and builds the layout of the addresses of one family
// (is4) of s.
func Build(s *prefix.Set, is4 bool, opt Options) (*Layout, error) {
	strides := opt.Strides4
	if !is4 {
		strides = opt.Strides6
	}
	model := opt.Model
	if model == (TrafficModel{}) {
		model = DefaultModel
	}
	// The pieces are read as a stream, never held: a survey first, then
	// the chooser's passes, one chunk at a time.
	seq := setPieces(s, is4)
	f := survey(seq, is4, opt.PassIsIn, strides, model)
	l := &Layout{Is4: is4, Prefixes: f.nIn}
	switch {
	case f.nIn == 0:
		l.Kind = KindEmpty
		return l, nil
	case f.n == 1:
		l.Kind = KindAll
		return l, nil
	}
	plainMax := opt.PlainMax
	if plainMax == 0 {
		plainMax = DefaultPlainMax
	}
	if l.Prefixes <= plainMax && strides == nil {
		l.Kind = KindPlain
		for p := range seq {
			if p.in {
				l.Plain = append(l.Plain, p.prefix(familyBits(is4)))
			}
		}
		return l, nil
	}
	maxEntries := opt.MaxEntries
	if maxEntries == 0 {
		maxEntries = DefaultMaxEntries
	}
	price := opt.ElementPrice
	if price == 0 {
		price = DefaultElementPrice
	}
	if strides != nil {
		if err := checkStrides(strides, f.maxLen, familyBits(is4)); err != nil {
			return nil, err
		}
	}
	l.Kind = KindTree
	if !buildTree(l, seq, f, maxEntries, price) {
		return nil, fmt.Errorf("building %d %s prefixes: %w (%d elements)", l.Prefixes, familyName(is4), ErrTooLarge, maxEntries)
	}
	if opt.Record {
		l.Choices = record(l, s)
	}
	return l, nil
}

func familyName(is4 bool) string {
	if is4 {
		return "IPv4"
	}
	return "IPv6"
}

func checkStrides(strides []int, maxLen, w int) error {
	prev := 0
	for _, s := range strides {
		if s <= prev || s > w {
			return fmt.Errorf("strides %v: must increase and stay within 1..%d", strides, w)
		}
		prev = s
	}
	if prev < maxLen {
		return fmt.Errorf("strides %v: the last level (/%d) is shorter than the longest prefix (/%d)", strides, prev, maxLen)
	}
	return nil
}

// layoutJSON is the stable JSON form of a layout (`compile --json`): the
// choice made, not the elements.
type layoutJSON struct {
	Kind     Kind          `json:"kind"`
	Prefixes int           `json:"prefixes"`
	Strides  []int         `json:"strides,omitempty"`
	Depth    int           `json:"max_lookups,omitempty"`
	Bitmap   bool          `json:"bitmap_root,omitempty"`
	Maps     int           `json:"maps,omitempty"`
	Elements int           `json:"elements,omitempty"`
	Root     int           `json:"root_level,omitempty"`
	RootIn   bool          `json:"root_in,omitempty"`
	Rest     int           `json:"rest_interval_prefixes,omitempty"`
	Cost     *CostEstimate `json:"model,omitempty"`
}

// MarshalJSON summarises the layout.
func (l *Layout) MarshalJSON() ([]byte, error) {
	j := layoutJSON{Kind: l.Kind, Prefixes: l.Prefixes}
	if l.Kind == KindTree {
		j.Strides, j.Depth, j.Maps, j.Elements = l.Strides(), l.MaxLookups(), l.Maps(), l.Entries()
		j.Bitmap = l.BitmapRoot()
		j.Root, j.RootIn, j.Rest = l.Root, l.RootIn, len(l.Rest)
		j.Cost = &l.Cost
	}
	return json.Marshal(j)
}
