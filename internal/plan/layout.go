package plan

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"

	"go4.org/netipx"
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
)

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
	}
	return fmt.Sprintf("EntryKind(%d)", uint8(k))
}

// Entry is one element of a level's map.
type Entry struct {
	Key  netip.Prefix // Bits long, masked
	Kind EntryKind
}

// Level is one hash map of a tree layout.
type Level struct {
	Bits    int
	Entries []Entry
}

// Layout is how one address family of one rule's set is represented.
//
// A tree layout is looked up the way the kernel does it: start with
// RootIn as the verdict for absent keys; at each level look the address
// masked to Level.Bits up in that level's entries; an In/Out entry decides;
// a Descend entry sets the default for the next level and continues; an
// absent key decides the current default. Every bucket whose verdict
// differs from its parent's default has an entry, so each level holds only
// exceptions, and defaults are chosen per bucket from the data.
type Layout struct {
	Is4  bool
	Kind Kind
	// Prefixes is the size of the minimal CIDR cover of the set.
	Prefixes int
	// Plain holds the cover for KindPlain.
	Plain []netip.Prefix
	// RootIn is the verdict of addresses whose first-level key is absent.
	RootIn bool
	Levels []Level
	// Cost is the model's expected number of map lookups per packet for
	// traffic that passes the rule and for random traffic (tree only).
	Cost CostEstimate

	index []map[netip.Addr]EntryKind // built on first Contains
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
	n := 0
	for _, lv := range l.Levels {
		n += len(lv.Entries)
	}
	return n
}

// Strides lists the level lengths, e.g. [16 24 32].
func (l *Layout) Strides() []int {
	s := make([]int, len(l.Levels))
	for i, lv := range l.Levels {
		s[i] = lv.Bits
	}
	return s
}

// Contains reports whether the layout puts addr in the set, evaluating
// the layout exactly as the kernel will (the model the tests compare the
// set and the kernel against). Addresses of the other family are not in.
func (l *Layout) Contains(addr netip.Addr) bool {
	if addr.Is4() != l.Is4 || addr.Is4In6() {
		return false
	}
	switch l.Kind {
	case KindEmpty:
		return false
	case KindAll:
		return true
	case KindPlain:
		for _, p := range l.Plain {
			if p.Contains(addr) {
				return true
			}
		}
		return false
	}
	if l.index == nil {
		l.index = make([]map[netip.Addr]EntryKind, len(l.Levels))
		for i, lv := range l.Levels {
			m := make(map[netip.Addr]EntryKind, len(lv.Entries))
			for _, e := range lv.Entries {
				m[e.Key.Addr()] = e.Kind
			}
			l.index[i] = m
		}
	}
	def := l.RootIn
	for i, lv := range l.Levels {
		k, ok := l.index[i][netip.PrefixFrom(addr, lv.Bits).Masked().Addr()]
		if !ok {
			return def
		}
		switch k {
		case In:
			return true
		case Out:
			return false
		case DescendIn:
			def = true
		case DescendOut:
			def = false
		}
	}
	return def
}

// Options tune the layout chooser. The zero value gives the defaults.
type Options struct {
	// PlainMax: sets with at most this many prefixes use a plain
	// interval set. 0 means DefaultPlainMax; negative means never.
	PlainMax int
	// Strides forces the tree levels (for tests and experiments);
	// it must be increasing and end at or beyond the longest prefix.
	Strides []int
	// MaxEntries caps the elements of a tree; 0 means DefaultMaxEntries.
	MaxEntries int
	// PassIsIn says the traffic that passes the rule is the traffic in
	// the set (allow-only); otherwise it is the traffic outside it.
	PassIsIn bool
}

// Defaults of Options.
const (
	DefaultPlainMax   = 16
	DefaultMaxEntries = 4 << 20
)

// ErrTooLarge is returned when no tree layout fits in MaxEntries.
var ErrTooLarge = fmt.Errorf("no layout fits the element limit")

// Build chooses and builds the layout of the addresses of one family
// (is4) of s.
func Build(s *netipx.IPSet, is4 bool, opt Options) (*Layout, error) {
	pieces := partition(s, is4)
	l := &Layout{Is4: is4}
	for _, p := range pieces {
		if p.in {
			l.Prefixes++
		}
	}
	switch {
	case l.Prefixes == 0:
		l.Kind = KindEmpty
		return l, nil
	case len(pieces) == 1:
		l.Kind = KindAll
		return l, nil
	}
	plainMax := opt.PlainMax
	if plainMax == 0 {
		plainMax = DefaultPlainMax
	}
	if l.Prefixes <= plainMax && opt.Strides == nil {
		l.Kind = KindPlain
		for _, p := range pieces {
			if p.in {
				l.Plain = append(l.Plain, p.p)
			}
		}
		return l, nil
	}
	maxEntries := opt.MaxEntries
	if maxEntries == 0 {
		maxEntries = DefaultMaxEntries
	}
	st := newStats(pieces, is4, opt.PassIsIn)
	strides := opt.Strides
	if strides == nil {
		strides = st.choose(maxEntries)
		if strides == nil {
			return nil, fmt.Errorf("building %d %s prefixes: %w (%d)", l.Prefixes, familyName(is4), ErrTooLarge, maxEntries)
		}
	} else if err := checkStrides(strides, st.maxLen, familyBits(is4)); err != nil {
		return nil, err
	}
	l.Kind = KindTree
	l.Cost = st.cost(strides)
	b := treeBuilder{w: familyBits(is4), strides: strides, levels: make([]Level, len(strides)), left: maxEntries}
	for i, s := range strides {
		b.levels[i].Bits = s
	}
	l.RootIn = b.chooseDefault(pieces, strides[0])
	b.group(pieces, 0, l.RootIn)
	l.Levels = b.levels
	if b.left < 0 {
		return nil, fmt.Errorf("building %d %s prefixes with strides %v: %w (%d)", l.Prefixes, familyName(is4), strides, ErrTooLarge, maxEntries)
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

// treeBuilder emits the entries of a tree layout.
type treeBuilder struct {
	w       int
	strides []int
	levels  []Level
	// left counts down the elements still allowed; below zero the build
	// stops early (forced strides can ask for an absurd expansion).
	left int
}

// chooseDefault picks the default for a mixed bucket's children at level
// bits: the side with fewer uniform child buckets gets the entries.
func (b *treeBuilder) chooseDefault(g []piece, bits int) bool {
	var full, empty float64
	for _, p := range g {
		if l := p.p.Bits(); l <= bits {
			n := math.Ldexp(1, bits-l)
			if p.in {
				full += n
			} else {
				empty += n
			}
		}
	}
	return full > empty
}

// group emits the entries for the pieces g of one mixed bucket, whose
// children live at level j, with default def for absent keys.
func (b *treeBuilder) group(g []piece, j int, def bool) {
	bits := b.strides[j]
	lv := &b.levels[j]
	for i := 0; i < len(g) && b.left >= 0; {
		p := g[i]
		if pl := p.p.Bits(); pl <= bits {
			if p.in != def {
				if bits-pl >= 62 || 1<<(bits-pl) > b.left {
					b.left = -1
					return
				}
				b.left -= 1 << (bits - pl)
				kind := Out
				if p.in {
					kind = In
				}
				base := u128From(p.p.Addr())
				n := uint64(1) << (bits - pl)
				for k := uint64(0); k < n; k++ {
					a := base.addShift(k, b.w-bits)
					lv.Entries = append(lv.Entries, Entry{netip.PrefixFrom(a.addr(b.w), bits), kind})
				}
			}
			i++
			continue
		}
		// A mixed child: the run of pieces sharing p's bits-long prefix.
		key := netip.PrefixFrom(p.p.Addr(), bits).Masked()
		k := i + 1
		for k < len(g) && key.Contains(g[k].p.Addr()) {
			k++
		}
		child := g[i:k]
		cdef := b.chooseDefault(child, b.strides[j+1])
		kind := DescendOut
		if cdef {
			kind = DescendIn
		}
		lv.Entries = append(lv.Entries, Entry{key, kind})
		b.left--
		b.group(child, j+1, cdef)
		i = k
	}
}

// layoutJSON is the stable JSON form of a layout (`compile --json`): the
// choice made, not the elements.
type layoutJSON struct {
	Kind     Kind          `json:"kind"`
	Prefixes int           `json:"prefixes"`
	Strides  []int         `json:"strides,omitempty"`
	Elements []int         `json:"elements_per_level,omitempty"`
	RootIn   bool          `json:"root_in,omitempty"`
	Cost     *CostEstimate `json:"model,omitempty"`
}

// MarshalJSON summarises the layout.
func (l *Layout) MarshalJSON() ([]byte, error) {
	j := layoutJSON{Kind: l.Kind, Prefixes: l.Prefixes}
	if l.Kind == KindTree {
		j.Strides = l.Strides()
		for _, lv := range l.Levels {
			j.Elements = append(j.Elements, len(lv.Entries))
		}
		j.RootIn = l.RootIn
		j.Cost = &l.Cost
	}
	return json.Marshal(j)
}
