package plan

import (
	"cmp"
	"iter"
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

// The chooser never holds a whole family. A set of 300k scattered
// addresses cuts IPv4 into ten million pieces, and the dynamic programme
// keeps a bucket list for every length: held all at once, that took over
// a gigabyte (issue 25). Every level but the root lies within one
// /chunkBits, so the programme runs one chunk at a time (the pieces of one
// /8, or one piece shorter than that), keeps only each chunk's sums for
// the root's options and a byte for each bucket's choice, chooses the
// root from those, and reads the chunks again to emit the chosen tree
// with the recorded choices. A survey of every piece first gives what
// the traffic model needs of the whole family (its totals, the longest
// prefix, the candidate lengths). Each level's mixed buckets are derived
// from the next longer level's and the pieces in between (deriveLevel),
// not found by a scan of every piece at every length.
//
// IPv6 takes /16 chunks where the root allows (a chunk lies within one
// root bucket): its data sits in a few /8s (2a00::/8 holds most of
// Europe's), and the complement between scattered /48s in one /8 is
// millions of pieces, which a /8 chunk held at once (64 MB for a
// 20k-prefix feed, grown by appends). A replay's root is known, so a
// fleet agent's chunks are /16; the search itself keeps /8 while /8 is a
// candidate root length (cands[0]), as it is for most IPv6 sets.
var chunkBits, chunkBits6 = 8, 16 // variables for TestChunkedChooser, which sets 0: one chunk

// chunkBitsOf is the chunk length of a family w bits wide.
func chunkBitsOf(w int) int {
	if w == 128 {
		return chunkBits6
	}
	return chunkBits
}

// dpBucket is a mixed bucket at some length: pieces[start:end]. Its
// cost and elements are kept in the chooser's sums.
type dpBucket struct {
	start, end int32
	child      uint8 // chosen child length
	def        bool  // default of its children (absent keys)
}

// family is what the chooser knows of a whole family's pieces: their
// totals for the traffic model, and the lengths it may use.
type family struct {
	w        int
	passIsIn bool
	m        TrafficModel
	n, nIn   int // pieces, and in pieces (the set's cover)
	maxLen   int
	// Totals of the pieces on the pass side: addresses, pieces, runs;
	// and of the random traffic's weight.
	passAddr, passCnt, passRanges, randTot float64
	// lookupCost[o] is what a lookup keyed at length o costs, in
	// one-word lookups (TrafficModel.ExtraWord).
	lookupCost [129]float64
	cands      []int // candidate lengths, increasing, ending at maxLen
	// forced: when set, a bucket at cands[k] may only use cands[k+1].
	forced bool
	// canBitmap: the root may be a Bitmap level: its children are /16
	// buckets (Level.Bitmap), whose lookup costs bitmapCost and which
	// are bitmap bits, not elements; the mixed ones share one child
	// length (shared).
	canBitmap  bool
	bitmapCost float64
}

// pieceSeq yields pieces in address order, each with the size of its run
// (the range of the set, or the gap, it lies in).
type pieceSeq = iter.Seq2[piece, float64]

// setPieces is the partition of one family of s, as a pieceSeq.
func setPieces(s *prefix.Set, is4 bool) pieceSeq {
	return func(yield func(piece, float64) bool) {
		stop := false
		var runLo, runHi prefix.U128
		run := 0.0 // the size of [runLo, runHi]: a run's pieces come together
		prefix.Pieces(s, is4, func(a prefix.U128, bits int, in bool, lo, hi prefix.U128) {
			if lo != runLo || hi != runHi || run == 0 {
				runLo, runHi, run = lo, hi, hi.Sub(lo).Float64()+1
			}
			if !stop && !yield(piece{a, uint8(bits), in}, run) {
				stop = true
			}
		})
	}
}

// slicePieces yields ps, the runs measured within ps.
func slicePieces(ps []piece, w int) pieceSeq {
	return func(yield func(piece, float64) bool) {
		for i := 0; i < len(ps); {
			j, sum := i, 0.0
			for ; j < len(ps) && ps[j].in == ps[i].in; j++ {
				sum += pow2[w-int(ps[j].bits)]
			}
			for k := i; k < j; k++ {
				if !yield(ps[k], sum) {
					return
				}
			}
			i = j
		}
	}
}

// survey reads every piece once for the totals and lengths of family.
func survey(pieces pieceSeq, is4, passIsIn bool, forced []int, m TrafficModel) *family {
	w := familyBits(is4)
	f := &family{w: w, passIsIn: passIsIn, m: m}
	for o := range f.lookupCost {
		f.lookupCost[o] = 1 + m.ExtraWord*float64(KeyWords(is4, o)-1)
	}
	var hist [129]int
	prevPass := false
	for p := range pieces {
		l := int(p.bits)
		f.n++
		if p.in {
			f.nIn++
		}
		f.maxLen = max(f.maxLen, l)
		hist[l]++
		pass := p.in == passIsIn
		if pass {
			f.passAddr += pow2[w-l]
			f.passCnt++
			if !prevPass {
				f.passRanges++
			}
		}
		prevPass = pass
		f.randTot += f.randSize(p)
	}
	if forced != nil {
		f.forced = true
		f.cands = forced
		return f
	}
	// IPv4: every length from /8. IPv6: every fourth, plus the lengths
	// that hold at least 1% of the pieces (allocations cluster at /29,
	// /32, /48, /64: a level at their own length avoids expanding them).
	for l := 8; l < f.maxLen; l++ {
		if is4 || l%4 == 0 || hist[l]*100 >= f.n {
			f.cands = append(f.cands, l)
		}
	}
	f.cands = append(f.cands, f.maxLen)
	f.canBitmap = is4 && m.BitmapLookup > 0 && f.maxLen > BitmapBits
	f.bitmapCost = m.BitmapLookup
	return f
}

// randSize is the weight of p in random traffic: its size (IPv6: its
// share of 2000::/3).
func (f *family) randSize(p piece) float64 {
	l := int(p.bits)
	if f.w == 32 {
		return pow2[32-l]
	}
	switch {
	case l <= 3:
		return pow2[125]
	case cpl(p.addr, prefix.U128{Hi: 0x2000 << 48}, 128) < 3:
		return 0
	}
	return pow2[128-l]
}

type chooser struct {
	*family
	// bitmap: this solve prices the root as a Bitmap level (canBitmap).
	bitmap bool
	// shape: the pieces are shapeChunks' (a replay's): their lengths
	// and common prefixes, no traffic weights.
	shape  bool
	pieces []piece
	plen   []uint8
	cpl    []uint8
	wsum   []float64 // prefix sums of traffic weight (blend)
	wpass  []float64 // prefix sums of pass-traffic weight (for the estimate)
	wrand  []float64 // prefix sums of random-traffic weight
	// inU are prefix sums of the in pieces' sizes (addresses, modulo
	// 2**128): with sums they count a bucket's uniform children in O(1).
	inU []prefix.U128
	// byLen is the pieces' indexes ordered by length (in address order
	// within a length), lenAt[l] where length l starts in it: the
	// pieces a level adds to the buckets of the next longer one.
	byLen   []int32
	lenAt   [130]int32
	singles []int32
	buckets [129][]dpBucket
	// sums[l][k] sums over buckets[l][:k], for evaluate to take a range
	// of children at once.
	sums [129][]childSum
	// rec holds, with recording, every mixed bucket's choice as the
	// programme makes them (levels longest first, buckets in address
	// order, chunk after chunk): the emit pass takes them back
	// (replayLevels) instead of running the programme again. One byte
	// a bucket: the child's length above the bucket's (1 to 127: cands
	// start at /1 at least), and the default.
	rec       choiceLog
	recording bool
}

// choiceLog is the chooser's recorded choices: written in one pass, read
// back in order in the next. It is kept in blocks, and a block goes as
// soon as it is read, while the emit pass's entries grow: for a
// 400k-line feed the log is about 5 MB, and a daemon refreshing it held
// the whole log beside the whole layout.
type choiceLog struct {
	blocks [][]byte
	at     int // the next byte to read, from the first block
}

// choiceBlock is the size of a choiceLog block.
const choiceBlock = 64 << 10

// reset empties the log for writing.
func (l *choiceLog) reset() { l.blocks, l.at = nil, 0 }

// add appends a choice.
func (l *choiceLog) add(b byte) {
	n := len(l.blocks)
	if n == 0 || len(l.blocks[n-1]) == choiceBlock {
		l.blocks = append(l.blocks, make([]byte, 0, choiceBlock))
		n++
	}
	l.blocks[n-1] = append(l.blocks[n-1], b)
}

// next reads the next choice; the log must hold one.
func (l *choiceLog) next() byte {
	b := l.blocks[0][l.at]
	if l.at++; l.at == len(l.blocks[0]) {
		l.blocks[0] = nil // read: it goes
		l.blocks, l.at = l.blocks[1:], 0
	}
	return b
}

// childSum is a sum over consecutive mixed buckets of one length: what
// they add to a parent's cost (the traffic reaching them, which pays one
// more lookup, and their own cost: lookups below them + price ×
// elements), their elements and their in addresses.
type childSum struct {
	cost, elems float64
	in          prefix.U128
}

// plus is s + o.
func (s childSum) plus(o childSum) childSum {
	return childSum{cost: s.cost + o.cost, elems: s.elems + o.elems, in: s.in.Add(o.in)}
}

// newChooser is a chooser over the whole family of pieces.
func newChooser(pieces []piece, is4, passIsIn bool, forced []int, m TrafficModel) *chooser {
	seq := slicePieces(pieces, familyBits(is4))
	c := &chooser{family: survey(seq, is4, passIsIn, forced, m)}
	c.bitmap = c.canBitmap
	c.load(pieces, seq)
	return c
}

// load makes pieces (a chunk, or the whole family) the chooser's, their
// runs taken from seq (which yields pieces in order); the slices of the
// previous chunk are reused.
func (c *chooser) load(pieces []piece, seq pieceSeq) {
	n := len(pieces)
	c.pieces = pieces
	c.plen = resize(c.plen, n)
	c.cpl = resize(c.cpl, n)
	c.wsum, c.wpass, c.wrand = resize(c.wsum, n+1), resize(c.wpass, n+1), resize(c.wrand, n+1)
	c.inU = resize(c.inU, n+1)
	m := c.m
	legit := m.Addresses + m.Ranges + m.Prefixes
	i := 0
	for p, run := range seq {
		c.plen[i] = p.bits
		c.cpl[i] = 0
		if i > 0 {
			c.cpl[i] = uint8(cpl(pieces[i-1].addr, p.addr, c.w))
		}
		size := pow2[c.w-int(p.bits)]
		var pass float64
		if p.in == c.passIsIn {
			pass = (m.Addresses*size/max(c.passAddr, 1) + m.Ranges*size/run/max(c.passRanges, 1) + m.Prefixes/max(c.passCnt, 1)) / legit
		}
		r := c.randSize(p) / max(c.randTot, 1)
		c.wpass[i+1] = c.wpass[i] + pass
		c.wrand[i+1] = c.wrand[i] + r
		c.wsum[i+1] = c.wsum[i] + legit*pass + m.Random*r
		c.inU[i+1] = c.inU[i]
		if p.in {
			c.inU[i+1] = c.inU[i].Add(prefix.Pow2(c.w - int(p.bits)))
		}
		i++
	}
}

// shapeChunks calls fn with each chunk of family is4 of s (the pieces of
// one /chunkLen, or one shorter piece) loaded as shapes: their lengths
// and common prefixes, not the traffic's weights (a replay's, whose
// estimate its choices carry). It is chunks and load in one pass, with
// no runs and one copy of each piece (chunks made two): a fleet agent's
// replay.
func (c *chooser) shapeChunks(s *prefix.Set, is4 bool, chunkLen int, fn func()) {
	c.shape = true
	w := c.w
	c.pieces, c.plen, c.cpl = c.pieces[:0], c.plen[:0], c.cpl[:0]
	flush := func() {
		if len(c.pieces) > 0 {
			fn()
		}
		c.pieces, c.plen, c.cpl = c.pieces[:0], c.plen[:0], c.cpl[:0]
	}
	sp := chunkSplit{w: w, chunkLen: chunkLen}
	prefix.Pieces(s, is4, func(a prefix.U128, bits int, in bool, _, _ prefix.U128) {
		if sp.starts(a, bits, len(c.pieces)) {
			flush()
		}
		var common uint8
		if n := len(c.pieces); n > 0 {
			common = uint8(cpl(c.pieces[n-1].addr, a, w))
		}
		c.pieces = append(c.pieces, piece{a, uint8(bits), in})
		c.plen, c.cpl = append(c.plen, uint8(bits)), append(c.cpl, common)
		if sp.alone(bits) {
			flush()
		}
	})
	flush()
}

// resize is s with length n, reusing its array when it is big enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// chunks splits seq into chunks (the pieces of one /chunkLen, or one
// shorter piece) and calls fn with each, in order, as a slice and as a
// pieceSeq. Both are reused for the next chunk.
func chunks(seq pieceSeq, w, chunkLen int, fn func([]piece, pieceSeq)) {
	var ps []piece
	var runs []float64
	chunk := func(yield func(piece, float64) bool) {
		for i := range ps {
			if !yield(ps[i], runs[i]) {
				return
			}
		}
	}
	flush := func() {
		if len(ps) > 0 {
			fn(ps, chunk)
		}
		ps, runs = ps[:0], runs[:0]
	}
	sp := chunkSplit{w: w, chunkLen: chunkLen}
	for p, run := range seq {
		if sp.starts(p.addr, int(p.bits), len(ps)) {
			flush()
		}
		ps, runs = append(ps, p), append(runs, run)
		if sp.alone(int(p.bits)) {
			flush()
		}
	}
	flush()
}

// chunkSplit is where chunks of /chunkLen, w bits wide, begin and end
// (chunks, shapeChunks): a chunk is the pieces of one /chunkLen, or one
// piece shorter than that.
type chunkSplit struct {
	w, chunkLen int
	key         prefix.U128 // the current chunk's /chunkLen
}

// starts reports whether the piece at a, bits long, begins a new chunk
// after the n pieces of the current one, and makes its chunk current.
func (sp *chunkSplit) starts(a prefix.U128, bits, n int) bool {
	k := a.Shr(sp.w - sp.chunkLen)
	start := sp.alone(bits) || n > 0 && k != sp.key
	sp.key = k
	return start
}

// alone reports whether a piece bits long is a chunk by itself.
func (sp *chunkSplit) alone(bits int) bool { return bits < sp.chunkLen }

// options are the child lengths a bucket at length l (below the root)
// may use; the root's are root's.
func (c *chooser) options(l int) []int {
	i := c.after(l)
	if c.forced {
		return c.cands[i:min(i+1, len(c.cands))]
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

// sortByLen orders the pieces' indexes by length into byLen (a
// counting sort: stable, so address order within a length).
func (c *chooser) sortByLen() {
	var count [130]int32
	for _, l := range c.plen {
		count[l+1]++
	}
	for l := 1; l < len(count); l++ {
		count[l] += count[l-1]
	}
	c.lenAt = count
	c.byLen = resize(c.byLen, len(c.plen))
	for i, l := range c.plen {
		c.byLen[count[l]] = int32(i)
		count[l]++
	}
}

// deriveLevel lists the mixed buckets at cands[k], in address order, into
// c.buckets, from those at the next longer candidate (already listed) and
// the pieces of the lengths in between: a mixed bucket at l is a run of
// consecutive pieces longer than l within one /l, and every such piece
// lies in a mixed bucket at the next length or has a length up to it.
// Each piece is thus met once as a single, and the levels cost what their
// buckets number, not what the pieces do (sortByLen first).
func (c *chooser) deriveLevel(k int) {
	l := c.cands[k]
	out := c.buckets[l][:0]
	if l >= c.maxLen {
		c.buckets[l] = out
		return
	}
	next := c.cands[k+1]
	var longer []dpBucket
	if next < c.maxLen {
		longer = c.buckets[next]
	}
	singles := c.byLen[c.lenAt[l+1]:c.lenAt[next+1]]
	if next > l+1 {
		// Several lengths: merge them into address order.
		c.singles = append(c.singles[:0], singles...)
		slices.Sort(c.singles)
		singles = c.singles
	}
	add := func(start, end int32) {
		if n := len(out); n > 0 && out[n-1].end == start && int(c.cpl[start]) >= l {
			out[n-1].end = end
			return
		}
		out = append(out, dpBucket{start: start, end: end})
	}
	i, j := 0, 0
	for i < len(longer) || j < len(singles) {
		if j == len(singles) || i < len(longer) && longer[i].start < singles[j] {
			add(longer[i].start, longer[i].end)
			i++
			continue
		}
		add(singles[j], singles[j]+1)
		j++
	}
	c.buckets[l] = out
}

// bucketEnd is the end of the mixed bucket at length l that starts at
// piece i (a piece longer than l): the first piece outside it.
func (c *chooser) bucketEnd(l, i int) int {
	j := i + 1
	for j < len(c.pieces) && int(c.plen[j]) > l && int(c.cpl[j]) >= l {
		j++
	}
	return j
}

// solve runs the dynamic programme over the chooser's pieces as a whole
// family (one chunk), with the given price per element, and returns the
// root bucket with its cost and elements, chosen as buildTree chooses it.
func (c *chooser) solve(price float64) (root dpBucket, cost, elems float64) {
	c.solveLevels(price)
	r := &rootSums{}
	c.addRootSums(r, price)
	root, cost, elems, _ = c.root(r, price, c.bitmap)
	root.end = int32(len(c.pieces))
	return root, cost, elems
}

// solveLevels runs the programme for every candidate length, longest
// first: every level but the root.
func (c *chooser) solveLevels(price float64) {
	c.sortByLen()
	for k := len(c.cands) - 1; k >= 0; k-- {
		c.deriveLevel(k)
		c.solveLevel(c.cands[k], price)
	}
}

// replayLevels lists the mixed buckets of every candidate length as
// solveLevels does, with the choices it recorded (rec, read in turn), and
// their sums of in addresses (what sharedAt needs of them; no costs).
func (c *chooser) replayLevels() {
	c.sortByLen()
	for k := len(c.cands) - 1; k >= 0; k-- {
		l := c.cands[k]
		c.deriveLevel(k)
		bs := c.buckets[l]
		sums := append(c.sums[l][:0], childSum{})
		for bi := range bs {
			b := &bs[bi]
			r := c.rec.next()
			b.child, b.def = uint8(l)+r&0x7f, r&0x80 != 0
			sums = append(sums, c.add(sums[bi], *b, 0, 0))
		}
		c.sums[l] = sums
	}
}

// solveLevel chooses the child length of every mixed bucket at length l
// (the longer lengths done).
func (c *chooser) solveLevel(l int, price float64) {
	if l >= c.maxLen {
		c.buckets[l], c.sums[l] = c.buckets[l][:0], append(c.sums[l][:0], childSum{})
		return
	}
	bs := c.buckets[l]
	if c.bitmap && l == BitmapBits {
		// Every longer length: one map holds them all.
		c.buckets[l], c.sums[l] = c.shared(bs, c.cands[c.after(l):], price)
		return
	}
	opts := c.options(l)
	var cursor [129]int
	sums := append(c.sums[l][:0], childSum{})
	for bi := range bs {
		b := &bs[bi]
		cost, elems := math.Inf(1), 0.0
		for oi, o := range opts {
			oc, oe, def, leaf := c.evaluate(b, l, o, price, &cursor[oi])
			// The traffic reaching b pays its lookup, keyed at o.
			oc += (c.wsum[b.end] - c.wsum[b.start]) * c.lookupCost[o]
			if oc < cost {
				cost, elems, b.child, b.def = oc, oe, uint8(o), def
			}
			if leaf {
				// Every longer length only doubles the
				// elements: no better option follows.
				break
			}
		}
		sums = append(sums, c.add(sums[bi], *b, cost, elems))
		if c.recording {
			c.rec.add(byte(int(b.child)-l) | byte(b2i(b.def))<<7)
		}
	}
	c.sums[l] = sums
}

// after is the index in cands of the first length above l.
func (f *family) after(l int) int {
	i, _ := slices.BinarySearch(f.cands, l+1)
	return i
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
		cand, sums, total := c.sharedAt(bs, o, price, true)
		if total.cost < bestCost {
			bestCost, best, out = total.cost, sums, cand
		}
	}
	if best == nil {
		best = make([]childSum, len(bs)+1)
	}
	return out, best
}

// sharedAt is the /16 buckets bs all resolved at child length o: their
// total, and with keep a copy of them with child o and their sums.
func (c *chooser) sharedAt(bs []dpBucket, o int, price float64, keep bool) (out []dpBucket, sums []childSum, total childSum) {
	if keep {
		out, sums = slices.Clone(bs), make([]childSum, len(bs)+1)
	}
	cursor := 0
	for bi := range bs {
		b := bs[bi]
		oc, oe, def, _ := c.evaluate(&b, BitmapBits, o, price, &cursor)
		oc += (c.wsum[b.end] - c.wsum[b.start]) * c.lookupCost[o]
		b.child, b.def = uint8(o), def
		total = c.add(total, b, oc, oe)
		if keep {
			out[bi], sums[bi+1] = b, total
		}
	}
	return out, sums, total
}

// add is sum with bucket b, of the given cost and elements, added.
func (c *chooser) add(sum childSum, b dpBucket, cost, elems float64) childSum {
	return childSum{cost: sum.cost + cost, elems: sum.elems + elems, in: sum.in.Add(c.inU[b.end].Sub(c.inU[b.start]))}
}

// evaluate prices bucket b (at length l) resolved at child length o:
// its mixed children are the buckets of length o within it (every piece
// longer than o lies in one), and its pieces up to /o are uniform
// children, full or empty. cursor walks c.buckets[o] forward across the
// (ordered) calls for one length. leaf says no child is mixed.
func (c *chooser) evaluate(b *dpBucket, l, o int, price float64, cursor *int) (cost, elems float64, def, leaf bool) {
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
	kids := childSum{cost: s2.cost - s1.cost, elems: s2.elems - s1.elems, in: s2.in.Sub(s1.in)}
	cost, elems, def = c.resolve(kids, float64(k2-k1), c.inU[b.end].Sub(c.inU[b.start]), l, o, price, false)
	return cost, elems, def, k1 == k2
}

// resolve prices a bucket at length l that holds in addresses of the set,
// resolved at child length o, where its n mixed children add up to kids.
// Its pieces up to /o are uniform children, counted in /o blocks: the
// minority side gets elements (with bitmap, bits of a bitmap: none).
func (f *family) resolve(kids childSum, n float64, in prefix.U128, l, o int, price float64, bitmap bool) (cost, elems float64, def bool) {
	full := in.Sub(kids.in).Shr(f.w - o).Float64()
	empty := pow2[o-l] - n - full
	own := min(full, empty) + n
	if bitmap {
		own = 0 // the root's children, mixed or not, are bitmap bits
	}
	return kids.cost + price*own, kids.elems + own, full > empty
}

// rootSums is what the chunks add up to for the root: every option of
// the root, as solve would evaluate it over the whole family.
type rootSums struct {
	wsum float64     // the traffic, all of it
	in   prefix.U128 // the set's addresses
	// mixed[o] and nMixed[o]: the mixed buckets at length o, their sum
	// and number.
	mixed  [129]childSum
	nMixed [129]float64
	// shared[o]: the mixed /16 buckets all resolved at o (sharedAt).
	shared [129]childSum
}

// rootSums runs the programme over each chunk of seq and adds up what the
// root needs.
func (c *chooser) rootSums(seq pieceSeq, price float64) *rootSums {
	r := &rootSums{}
	chunks(seq, c.w, c.chunkLen(), func(ps []piece, cs pieceSeq) {
		c.load(ps, cs)
		c.bitmap = false
		c.solveLevels(price)
		c.addRootSums(r, price)
	})
	return r
}

// addRootSums adds to r what the chooser's pieces (solved) give the
// root's options.
func (c *chooser) addRootSums(r *rootSums, price float64) {
	n := len(c.pieces)
	r.wsum += c.wsum[n]
	r.in = r.in.Add(c.inU[n])
	for _, o := range c.cands {
		r.mixed[o] = r.mixed[o].plus(c.sums[o][len(c.buckets[o])])
		r.nMixed[o] += float64(len(c.buckets[o]))
	}
	if c.canBitmap {
		for _, o := range c.cands[c.after(BitmapBits):] {
			_, _, total := c.sharedAt(c.buckets[BitmapBits], o, price, false)
			r.shared[o] = r.shared[o].plus(total)
		}
	}
}

// root chooses the root's child length from r: the one of least cost
// (with a forced stride, the first), or with bitmap the Bitmap root and
// the one child length its mixed /16 buckets share (sharedLen).
func (f *family) root(r *rootSums, price float64, bitmap bool) (root dpBucket, cost, elems float64, sharedLen int) {
	cost = math.Inf(1)
	if bitmap {
		var kids childSum
		best := math.Inf(1)
		for _, o := range f.cands[f.after(BitmapBits):] {
			if r.shared[o].cost < best {
				best, kids, sharedLen = r.shared[o].cost, r.shared[o], o
			}
		}
		cost, elems, root.def = f.resolve(kids, r.nMixed[BitmapBits], r.in, 0, BitmapBits, price, true)
		root.child = BitmapBits
		return root, cost + r.wsum*f.bitmapCost, elems, sharedLen
	}
	opts := f.cands
	if f.forced {
		opts = f.cands[:1]
	}
	for _, o := range opts {
		oc, oe, def := f.resolve(r.mixed[o], r.nMixed[o], r.in, 0, o, price, false)
		oc += r.wsum * f.lookupCost[o]
		if oc < cost {
			cost, elems, root.child, root.def = oc, oe, uint8(o), def
		}
		if r.nMixed[o] == 0 {
			break // as in solveLevel: longer lengths only double the elements
		}
	}
	return root, cost, elems, 0
}

// chunkLen is the length of the chunks: every level but the root lies
// within one.
func (f *family) chunkLen() int { return min(chunkBitsOf(f.w), f.cands[0]) }

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
	expect int // the elements the chooser counted (reserve's bound; a replay's: its limit)
	pass   float64
	random float64
	rest   []netip.Prefix
	// share is the model's traffic (chooser.wsum) of a Bitmap root's
	// entries, by kind.
	share   [DescendRest + 1]float64
	present [DescendRest + 1]bool
	// replay, when set, makes the choices instead of the programme
	// (Replay).
	replay *replay
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
					t.weigh(kind, i, i+1)
				}
				for k := uint64(0); k < n; k++ {
					a := p.addr.Add(prefix.U128{Lo: k}.Shl(c.w - o))
					lv.add(NewEntry(netip.PrefixFrom(a.Addr(c.w), o), kind, 0))
				}
			}
			i++
			continue
		}
		key := netip.PrefixFrom(p.addr.Addr(c.w), o).Masked()
		var ch dpBucket
		switch {
		case t.replay == nil:
			ch = c.bucketAt(o, i)
		case depth+1 >= MaxDepth: // no choice: the rest below
			ch = dpBucket{start: int32(i), end: int32(c.bucketEnd(o, i))}
		default:
			var ok bool
			if ch, ok = t.replay.next(c, key, i, depth); !ok {
				t.left = -1
				return
			}
		}
		if !free {
			t.left--
		}
		if !c.shape {
			t.pass += c.wpass[ch.end] - c.wpass[ch.start]
			t.random += c.wrand[ch.end] - c.wrand[ch.start]
		}
		if depth+1 >= MaxDepth {
			// No room for more levels: the rest of this bucket goes
			// into the interval set.
			lv.add(NewEntry(key, DescendRest, 0))
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
			t.weigh(kind, int(ch.start), int(ch.end))
		}
		e := NewEntry(key, kind, 0)
		e.next = ch.child
		lv.add(e)
		t.build(ch, depth+1)
		i = int(ch.end)
	}
}

// weigh counts the pieces [i, j) of a Bitmap root's entry of kind: the
// kind is present, with their traffic (none in a replay: its choices
// carry the order).
func (t *treeBuilder) weigh(kind EntryKind, i, j int) {
	t.present[kind] = true
	if !t.c.shape {
		t.share[kind] += t.c.wsum[j] - t.c.wsum[i]
	}
}

// reserve grows the levels' entries ahead of the appends to a tenth
// more than the pieces emitted so far (done of total) project, when a
// level holds less than that: the entries of a 400k-line feed's layout
// took five times their size in allocations growing by append, and kept
// an eighth spare. Early on (the first sixteenth) append's own growth
// stands. A level never reserves more than the elements the chooser
// counted and not yet emitted (and a Bitmap root's 65,536 bits): a
// level whose entries all come early would otherwise keep many times
// its size. A replay has no count (its bound is the element limit): it
// projects from the pieces in the set (its cover) rather than all
// pieces, and a level's excess is cut back by finish.
func (t *treeBuilder) reserve(done, total int) {
	if total == 0 || done*16 < total {
		return
	}
	emitted := 0
	for _, lv := range t.levels {
		emitted += lv.Len()
	}
	room := max(0, t.expect-emitted) + 1<<16
	for _, lv := range t.levels {
		n := lv.Len()
		proj := min(int(float64(n)*float64(total)/float64(done))+64, n+room)
		if n+lv.spare() >= proj {
			continue
		}
		lv.grow(proj+proj/10, t.c.w == 32)
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

// buildTree chooses and emits a tree layout of the pieces of seq, which
// f surveyed, into l. It returns false when nothing fits in maxEntries.
func buildTree(l *Layout, seq pieceSeq, f *family, maxEntries int, price float64) bool {
	c := &chooser{family: f}
	for ; price < 1e3; price *= 4 {
		p := price / 1e6
		c.rec.reset()
		c.recording = true
		r := c.rootSums(seq, p)
		c.recording = false
		root, cost, elems, _ := f.root(r, p, false)
		// A Bitmap root only where the model says it pays.
		bitmap, sharedLen := false, 0
		if f.canBitmap {
			if r2, c2, e2, o2 := f.root(r, p, true); c2 < cost {
				root, cost, elems, bitmap, sharedLen = r2, c2, e2, true, o2
			}
		}
		if math.IsInf(cost, 1) {
			return false
		}
		if elems > float64(maxEntries) {
			if f.forced {
				return false
			}
			continue
		}
		t := &treeBuilder{c: c, levels: map[[2]int]*Level{}, left: maxEntries, expect: int(elems)}
		done := 0
		chunks(seq, f.w, f.chunkLen(), func(ps []piece, cs pieceSeq) {
			if t.left < 0 {
				return
			}
			t.reserve(done, f.n)
			done += len(ps)
			c.load(ps, cs)
			c.bitmap = false
			c.replayLevels()
			if bitmap {
				c.buckets[BitmapBits], c.sums[BitmapBits], _ = c.sharedAt(c.buckets[BitmapBits], sharedLen, p, true)
				c.bitmap = true
			}
			t.c = c
			t.build(dpBucket{end: int32(len(ps)), child: root.child, def: root.def}, 1)
		})
		if t.left < 0 {
			return false
		}
		t.finish(l, root, bitmap)
		l.objective = cost
		return true
	}
	return false
}

// finish makes the levels t emitted, from root, l's.
func (t *treeBuilder) finish(l *Layout, root dpBucket, bitmap bool) {
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
		// The entries keep the room reserve left (a tenth): they
		// live only until the plan is lowered (Plan.Release), and
		// a copy would cost more on the way. A level whose entries
		// came early, reserved for more, is copied to its size.
		lv := *t.levels[k]
		lv.fit()
		l.Levels = append(l.Levels, lv)
	}
	for i := range l.Levels {
		lv := &l.Levels[i]
		for k, e := range lv.All() {
			if e.Kind == DescendIn || e.Kind == DescendOut {
				lv.setNext(k, int32(index[[2]int{lv.Depth + 1, int(e.next)}]))
			}
		}
	}
	l.Rest = t.rest
	l.Root = index[[2]int{1, int(root.child)}]
	if bitmap {
		l.Levels[l.Root].Bitmap = true
		l.Levels[l.Root].Order = t.order()
	}
	l.RootIn = root.def
	root0 := 1.0 // the root's lookup; a bitmap is none
	if bitmap {
		root0 = 0
	}
	l.Cost = CostEstimate{LookupsPass: root0 + t.pass, LookupsRandom: root0 + t.random}
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
