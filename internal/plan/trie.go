package plan

import (
	"cmp"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"sort"

	"github.com/ipfence/ipfence/internal/prefix"
)

// The layout chooser. A mixed bucket (a prefix of the address space that
// holds both addresses in the set and outside it) is resolved by one map
// lookup at a longer length of its own choosing: its children there are
// uniform (an element for each child on the minority side, the default
// covering the rest) or mixed (an element saying where to look next).
// Every mixed bucket picks its child length separately, by dynamic
// programming over all buckets, bottom up, minimising
//
//	expected map lookups per packet + price × map elements
//
// Traffic is modelled per piece of the partition (TrafficModel,
// DefaultModel): legitimate traffic uniform over the addresses the rule
// lets through, over its ranges (every network equally busy whatever its
// size) and over the prefixes of its cover, in equal parts, and 10%
// uniform random sources (IPv6: from 2000::/3), which the first level
// mostly decides anyway. A bucket's lookup costs the traffic share
// reaching it, times the lookup's price: one for a one-word key, plus
// ExtraWord for each further 32-bit word an IPv6 key reads.
//
// Issue 23: this model cannot make range-uniform IPv4 traffic cheaper
// than about two lookups per packet at today's element price. Most
// ranges are smaller than the first level's buckets (/17../20), so they
// sit in mixed buckets and need a second lookup; deciding them in one
// takes a first level at /22../24, three to twenty times the elements
// (docs/benchmarks.md, "Layout on unseen data").

// dpBucket is a mixed bucket at some length: pieces[start:end]. Its
// cost and elements are kept in the chooser's sums.
type dpBucket struct {
	start, end int32
	child      uint8 // chosen child length
	def        bool  // default of its children (absent keys)
}

type chooser struct {
	w      int
	pieces []piece
	addr   []prefix.U128
	in     []bool // pieces[i].in, kept dense: evaluate reads it for every piece
	plen   []uint8
	cpl    []uint8
	wsum   []float64 // prefix sums of traffic weight (blend)
	wpass  []float64 // prefix sums of pass-traffic weight (for the estimate)
	wrand  []float64 // prefix sums of random-traffic weight
	// inU are prefix sums of the in pieces' sizes (addresses, modulo
	// 2**128): with sums they count a bucket's uniform children in O(1).
	inU []prefix.U128
	// lookupCost[o] is what a lookup keyed at length o costs, in
	// one-word lookups (TrafficModel.ExtraWord).
	lookupCost [129]float64
	maxLen     int
	cands      []int // candidate lengths, increasing, ending at maxLen
	// forced: when set, a bucket at cands[k] may only use cands[k+1].
	forced bool
	// bitmap: the root's children are /16 buckets (Level.Bitmap), whose
	// lookup costs bitmapCost and which are bitmap bits, not elements;
	// the mixed ones share one child length (shared).
	bitmap     bool
	bitmapCost float64
	buckets    [129][]dpBucket
	// sums[l][k] sums over buckets[l][:k], for evaluate to take a range
	// of children at once.
	sums [129][]childSum
}

// childSum is a sum over consecutive mixed buckets of one length: what
// they add to a parent's cost (the traffic reaching them, which pays one
// more lookup, and their own cost: lookups below them + price ×
// elements), their elements and their in addresses.
type childSum struct {
	cost, elems float64
	in          prefix.U128
}

func newChooser(pieces []piece, is4, passIsIn bool, forced []int, m TrafficModel) *chooser {
	w := familyBits(is4)
	n := len(pieces)
	c := &chooser{w: w, pieces: pieces, addr: make([]prefix.U128, n), in: make([]bool, n), plen: make([]uint8, n), cpl: make([]uint8, n),
		wsum: make([]float64, n+1), wpass: make([]float64, n+1), wrand: make([]float64, n+1), inU: make([]prefix.U128, n+1)}
	for o := range c.lookupCost {
		c.lookupCost[o] = 1 + m.ExtraWord*float64(KeyWords(is4, o)-1)
	}
	var passAddr, passCnt, passRanges, randTot float64
	size := make([]float64, n)
	rsize := make([]float64, n)
	// rangeSize[i]: the size of the range (run of consecutive pass
	// pieces) piece i lies in.
	rangeSize := make([]float64, n)
	global := prefix.U128{Hi: 0x2000 << 48}
	for i, p := range pieces {
		c.addr[i] = p.addr
		c.in[i] = p.in
		l := int(p.bits)
		c.plen[i] = uint8(l)
		if i > 0 {
			c.cpl[i] = uint8(cpl(c.addr[i-1], c.addr[i], w))
		}
		c.maxLen = max(c.maxLen, l)
		size[i] = pow2[w-l]
		rsize[i] = size[i]
		if !is4 { // the share of 2000::/3
			switch {
			case l <= 3:
				rsize[i] = pow2[125]
			case cpl(c.addr[i], global, w) < 3:
				rsize[i] = 0
			}
		}
		if p.in == passIsIn {
			passAddr += size[i]
			passCnt++
			if i == 0 || pieces[i-1].in != passIsIn {
				passRanges++
			}
		}
		randTot += rsize[i]
	}
	for i := 0; i < n; {
		j, sum := i, 0.0
		for ; j < n && pieces[j].in == pieces[i].in; j++ {
			sum += size[j]
		}
		for k := i; k < j; k++ {
			rangeSize[k] = sum
		}
		i = j
	}
	legit := m.Addresses + m.Ranges + m.Prefixes
	for i, p := range pieces {
		var pass float64
		if p.in == passIsIn {
			pass = (m.Addresses*size[i]/max(passAddr, 1) + m.Ranges*size[i]/rangeSize[i]/max(passRanges, 1) + m.Prefixes/max(passCnt, 1)) / legit
		}
		r := rsize[i] / max(randTot, 1)
		c.wpass[i+1] = c.wpass[i] + pass
		c.wrand[i+1] = c.wrand[i] + r
		c.wsum[i+1] = c.wsum[i] + legit*pass + m.Random*r
		c.inU[i+1] = c.inU[i]
		if p.in {
			c.inU[i+1] = c.inU[i].Add(prefix.Pow2(w - int(c.plen[i])))
		}
	}
	if forced != nil {
		c.forced = true
		c.cands = forced
		return c
	}
	// IPv4: every length from /8. IPv6: every fourth, plus the lengths
	// that hold at least 1% of the pieces (allocations cluster at /29,
	// /32, /48, /64: a level at their own length avoids expanding them).
	hist := make([]int, w+1)
	for _, l := range c.plen {
		hist[l]++
	}
	for l := 8; l < c.maxLen; l++ {
		if is4 || l%4 == 0 || hist[l]*100 >= n {
			c.cands = append(c.cands, l)
		}
	}
	c.cands = append(c.cands, c.maxLen)
	c.bitmap = is4 && m.BitmapLookup > 0 && c.maxLen > BitmapBits
	c.bitmapCost = m.BitmapLookup
	return c
}

// options are the child lengths a bucket at length l may use.
func (c *chooser) options(l int) []int {
	i, _ := slices.BinarySearch(c.cands, l+1)
	if c.forced {
		if l == 0 {
			return c.cands[:1]
		}
		return c.cands[i:min(i+1, len(c.cands))]
	}
	if l == 0 {
		if c.bitmap {
			return []int{BitmapBits}
		}
		return c.cands
	}
	limit := 12 // bits one lookup may resolve below a bucket
	if c.w == 128 {
		limit = 24
	}
	j := i
	for j < len(c.cands) && c.cands[j] <= l+limit {
		j++
	}
	if j == i && i < len(c.cands) {
		j = i + 1
	}
	return c.cands[i:j]
}

// mixedBuckets lists the mixed buckets at length l, in address order.
func (c *chooser) mixedBuckets(l int) []dpBucket {
	var out []dpBucket
	n := len(c.pieces)
	for i := 0; i < n; {
		if int(c.plen[i]) <= l {
			i++
			continue
		}
		j := i + 1
		for j < n && int(c.plen[j]) > l && int(c.cpl[j]) >= l {
			j++
		}
		out = append(out, dpBucket{start: int32(i), end: int32(j)})
		i = j
	}
	return out
}

// solve runs the dynamic programme with the given price per element and
// returns the root bucket with its cost and elements.
func (c *chooser) solve(price float64) (root dpBucket, cost, elems float64) {
	lengths := append([]int{0}, c.cands...)
	for k := len(lengths) - 1; k >= 0; k-- {
		l := lengths[k]
		if l >= c.maxLen {
			c.buckets[l], c.sums[l] = nil, make([]childSum, 1)
			continue
		}
		bs := c.mixedBuckets(l)
		opts := c.options(l)
		bitmap := l == 0 && c.bitmap
		if c.bitmap && l == BitmapBits {
			// Every longer length: one map holds them all.
			i, _ := slices.BinarySearch(c.cands, l+1)
			c.buckets[l], c.sums[l] = c.shared(bs, c.cands[i:], price)
			continue
		}
		cursor := make([]int, len(opts))
		sums := make([]childSum, len(bs)+1)
		for bi := range bs {
			b := &bs[bi]
			cost, elems = math.Inf(1), 0
			for oi, o := range opts {
				oc, oe, def, leaf := c.evaluate(b, l, o, price, &cursor[oi], bitmap)
				// The traffic reaching b pays its lookup, keyed at o.
				lc := c.lookupCost[o]
				if bitmap {
					lc = c.bitmapCost
				}
				oc += (c.wsum[b.end] - c.wsum[b.start]) * lc
				if oc < cost {
					cost, elems, b.child, b.def = oc, oe, uint8(o), def
				}
				if leaf {
					// Every longer length only doubles the
					// elements: no better option follows.
					break
				}
			}
			sums[bi+1] = c.add(sums[bi], *b, cost, elems)
		}
		c.buckets[l], c.sums[l] = bs, sums
	}
	// The root is the one bucket at length 0: cost and elems are its.
	return c.buckets[0][0], cost, elems
}

// shared resolves the mixed /16 buckets under a Bitmap root: they are
// classified by bitmaps too, one per child length and default, each a
// rule that every packet reaching the later ones pays for, so they share
// one child length (and one map at that length), the one of least total
// cost.
func (c *chooser) shared(bs []dpBucket, opts []int, price float64) ([]dpBucket, []childSum) {
	var best []childSum
	bestCost := math.Inf(1)
	out := bs
	for _, o := range opts {
		cand := slices.Clone(bs)
		sums := make([]childSum, len(bs)+1)
		cursor := 0
		for bi := range cand {
			b := &cand[bi]
			oc, oe, def, _ := c.evaluate(b, BitmapBits, o, price, &cursor, false)
			oc += (c.wsum[b.end] - c.wsum[b.start]) * c.lookupCost[o]
			b.child, b.def = uint8(o), def
			sums[bi+1] = c.add(sums[bi], *b, oc, oe)
		}
		if total := sums[len(bs)].cost; total < bestCost {
			bestCost, best, out = total, sums, cand
		}
	}
	if best == nil {
		best = make([]childSum, len(bs)+1)
	}
	return out, best
}

// add is sum with bucket b, of the given cost and elements, added.
func (c *chooser) add(sum childSum, b dpBucket, cost, elems float64) childSum {
	return childSum{cost: sum.cost + cost, elems: sum.elems + elems, in: sum.in.Add(c.inU[b.end].Sub(c.inU[b.start]))}
}

// evaluate prices bucket b (at length l) resolved at child length o:
// its mixed children are the buckets of length o within it (every piece
// longer than o lies in one), and its pieces up to /o are uniform
// children, full or empty. cursor walks c.buckets[o] forward across the
// (ordered) calls for one length. leaf says no child is mixed. With
// bitmap the uniform children are bits of a bitmap, not elements.
func (c *chooser) evaluate(b *dpBucket, l, o int, price float64, cursor *int, bitmap bool) (cost, elems float64, def, leaf bool) {
	children := c.buckets[o]
	k1 := *cursor
	for k1 < len(children) && children[k1].start < b.start {
		k1++
	}
	k2 := k1
	for k2 < len(children) && children[k2].start < b.end {
		k2++
	}
	*cursor = k2
	s1, s2 := c.sums[o][k1], c.sums[o][k2]
	nMixed := float64(k2 - k1)
	// The pieces up to /o: their in addresses, counted in /o blocks.
	full := c.inU[b.end].Sub(c.inU[b.start]).Sub(s2.in.Sub(s1.in)).Shr(c.w - o).Float64()
	empty := pow2[o-l] - nMixed - full
	own := min(full, empty) + nMixed
	if bitmap {
		own = 0 // the root's children, mixed or not, are bitmap bits
	}
	return s2.cost - s1.cost + price*own, s2.elems - s1.elems + own, full > empty, k1 == k2
}

// bucketAt finds the mixed bucket at length l starting at piece i.
func (c *chooser) bucketAt(l, i int) dpBucket {
	bs := c.buckets[l]
	k := sort.Search(len(bs), func(k int) bool { return int(bs[k].start) >= i })
	return bs[k]
}

// treeBuilder emits the elements of the chosen structure.
type treeBuilder struct {
	c *chooser
	// levels are keyed by depth and length: a level's map then only
	// leads to levels one deeper, so the kernel's check of chain nesting
	// (over every element of every map) sees the depth packets see.
	levels map[[2]int]*Level
	left   int // elements still allowed; below zero: stop
	pass   float64
	random float64
	rest   []netip.Prefix
	// share is the model's traffic (chooser.wsum) of a Bitmap root's
	// entries, by kind.
	share   [DescendRest + 1]float64
	present [DescendRest + 1]bool
}

// build emits bucket b's elements (at length b.child) and recurses into
// its mixed children; depth is the number of lookups a packet has done
// when it looks b's key up.
func (t *treeBuilder) build(b dpBucket, depth int) {
	c := t.c
	o := int(b.child)
	// The entries of a Bitmap root are bits of its bitmaps, as the
	// chooser counted them: not charged against the element limit.
	free := depth == 1 && c.bitmap
	lv := t.levels[[2]int{depth, o}]
	if lv == nil {
		lv = &Level{Bits: o, Depth: depth}
		t.levels[[2]int{depth, o}] = lv
	}
	for i := int(b.start); i < int(b.end) && t.left >= 0; {
		p := c.pieces[i]
		l := int(c.plen[i])
		if l <= o {
			if p.in != b.def {
				if o-l >= 62 || 1<<(o-l) > t.left {
					t.left = -1
					return
				}
				kind := Out
				if p.in {
					kind = In
				}
				n := uint64(1) << (o - l)
				if !free {
					t.left -= int(n)
				} else {
					t.share[kind] += c.wsum[i+1] - c.wsum[i]
					t.present[kind] = true
				}
				for k := uint64(0); k < n; k++ {
					a := c.addr[i].Add(prefix.U128{Lo: k}.Shl(c.w - o))
					lv.Entries = append(lv.Entries, Entry{Key: netip.PrefixFrom(a.Addr(c.w), o), Kind: kind})
				}
			}
			i++
			continue
		}
		ch := c.bucketAt(o, i)
		key := netip.PrefixFrom(p.addr.Addr(c.w), o).Masked()
		if !free {
			t.left--
		}
		t.pass += c.wpass[ch.end] - c.wpass[ch.start]
		t.random += c.wrand[ch.end] - c.wrand[ch.start]
		if depth+1 >= MaxDepth {
			// No room for more levels: the rest of this bucket goes
			// into the interval set.
			lv.Entries = append(lv.Entries, Entry{Key: key, Kind: DescendRest})
			for k := ch.start; k < ch.end; k++ {
				if c.pieces[k].in {
					t.rest = append(t.rest, c.pieces[k].prefix(c.w))
				}
			}
			i = int(ch.end)
			continue
		}
		kind := DescendOut
		if ch.def {
			kind = DescendIn
		}
		if free {
			t.share[kind] += c.wsum[ch.end] - c.wsum[ch.start]
			t.present[kind] = true
		}
		lv.Entries = append(lv.Entries, Entry{Key: key, Kind: kind, next: int(ch.child)})
		t.build(ch, depth+1)
		i = int(ch.end)
	}
}

// order is the kinds of a Bitmap root's entries, busiest first (ties in
// kind order).
func (t *treeBuilder) order() []EntryKind {
	var ks []EntryKind
	for k := In; k <= DescendOut; k++ {
		if t.present[k] {
			ks = append(ks, k)
		}
	}
	slices.SortStableFunc(ks, func(a, b EntryKind) int { return cmp.Compare(t.share[b], t.share[a]) })
	return ks
}

// buildTree chooses and emits a tree layout into l. It returns false when
// nothing fits in maxEntries.
func buildTree(l *Layout, pieces []piece, is4, passIsIn bool, forced []int, maxEntries int, price float64, m TrafficModel) bool {
	c := newChooser(pieces, is4, passIsIn, forced, m)
	bitmap := c.bitmap
	for ; price < 1e3; price *= 4 {
		// A Bitmap root only where the model says it pays. A solve
		// replaces the chooser's bucket and sum slices without writing
		// into them, so the first one's are kept by copying the arrays.
		c.bitmap = false
		root, cost, elems := c.solve(price / 1e6)
		if bitmap {
			buckets, sums := c.buckets, c.sums
			c.bitmap = true
			if r2, c2, e2 := c.solve(price / 1e6); c2 < cost {
				root, cost, elems = r2, c2, e2
			} else {
				c.bitmap = false
				c.buckets, c.sums = buckets, sums
			}
		}
		if math.IsInf(cost, 1) {
			return false
		}
		if elems > float64(maxEntries) {
			if forced != nil {
				return false
			}
			continue
		}
		t := &treeBuilder{c: c, levels: map[[2]int]*Level{}, left: maxEntries}
		t.build(root, 1)
		if t.left < 0 {
			return false
		}
		keys := make([][2]int, 0, len(t.levels))
		for k := range t.levels {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b [2]int) int {
			if a[0] != b[0] {
				return a[0] - b[0]
			}
			return a[1] - b[1]
		})
		index := map[[2]int]int{}
		for i, k := range keys {
			index[k] = i
			l.Levels = append(l.Levels, *t.levels[k])
		}
		for i := range l.Levels {
			for k := range l.Levels[i].Entries {
				e := &l.Levels[i].Entries[k]
				if e.Kind == DescendIn || e.Kind == DescendOut {
					e.Next = index[[2]int{l.Levels[i].Depth + 1, e.next}]
				}
			}
		}
		l.Rest = t.rest
		l.Root = index[[2]int{1, int(root.child)}]
		if c.bitmap {
			l.Levels[l.Root].Bitmap = true
			l.Levels[l.Root].Order = t.order()
		}
		l.RootIn = root.def
		root0 := 1.0 // the root's lookup; a bitmap is none
		if c.bitmap {
			root0 = 0
		}
		l.Cost = CostEstimate{LookupsPass: root0 + t.pass, LookupsRandom: root0 + t.random}
		return true
	}
	return false
}

// cpl is the common prefix length of a and b as addresses of width w.
func cpl(a, b prefix.U128, w int) int {
	if w == 32 {
		return bits.LeadingZeros32(uint32(a.Lo ^ b.Lo))
	}
	if x := a.Hi ^ b.Hi; x != 0 {
		return bits.LeadingZeros64(x)
	}
	return 64 + bits.LeadingZeros64(a.Lo^b.Lo)
}

// pow2[k] is 2**k.
var pow2 = func() (t [129]float64) {
	for k := range t {
		t[k] = math.Ldexp(1, k)
	}
	return t
}()
