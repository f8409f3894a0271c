package plan

import (
	"math"
	"slices"
)

// stats holds what the stride chooser needs to know about a partition:
// per candidate level, how many packets reach it and how many map
// elements each choice of levels costs.
//
// The model: every level is one hash lookup. A packet does the lookup of
// level L_j only when its bucket at L_{j-1} is mixed, so the expected
// lookups are the sum over levels of the traffic share in mixed buckets of
// the level above. Traffic is uniform over addresses: "pass" over the
// addresses the rule lets through (blended with uniform over its
// prefixes), "random" over the family (IPv6: over 2000::/3). The number of elements of level L under level Lp is, per
// mixed bucket at Lp, the uniform children of the minority side plus all
// mixed children (defaults are chosen per bucket), computed exactly.
type stats struct {
	w      int
	maxLen int
	cands  []int // candidate level lengths, increasing, ending at maxLen
	n      int
	addr   []u128
	plen   []int
	in     []bool
	cpl    []int // common prefix length with the previous piece's address

	reachPass, reachRand []float64 // by prefix length 0..w: share of traffic in pieces longer than that
}

func newStats(pieces []piece, is4, passIsIn bool) *stats {
	w := familyBits(is4)
	st := &stats{w: w, n: len(pieces)}
	st.addr = make([]u128, len(pieces))
	st.plen = make([]int, len(pieces))
	st.in = make([]bool, len(pieces))
	st.cpl = make([]int, len(pieces))
	passW := make([]float64, w+2)
	passN := make([]float64, w+2)
	randW := make([]float64, w+2)
	var passTot, passCnt, randTot float64
	global := u128{hi: 0x2000 << 48}
	for i, p := range pieces {
		st.addr[i] = u128From(p.p.Addr())
		l := p.p.Bits()
		st.plen[i] = l
		st.in[i] = p.in
		if i > 0 {
			st.cpl[i] = cpl(st.addr[i-1], st.addr[i], w)
		}
		st.maxLen = max(st.maxLen, l)
		size := math.Ldexp(1, w-l)
		if p.in == passIsIn {
			passW[l] += size
			passTot += size
			passN[l]++
			passCnt++
		}
		r := size
		if !is4 { // share of 2000::/3
			switch {
			case l <= 3:
				r = math.Ldexp(1, 125)
			case cpl(st.addr[i], global, w) < 3:
				r = 0
			}
		}
		randW[l] += r
		randTot += r
	}
	// reach[L] = share of traffic in pieces longer than L.
	st.reachPass = make([]float64, w+1)
	st.reachRand = make([]float64, w+1)
	// Pass traffic is half uniform over addresses, half uniform over the
	// pass side's prefixes (each network equally busy, whatever its
	// size): address weighting alone would let huge IPv6 prefixes hide
	// the many small customer networks behind deep levels.
	var accP, accN, accR float64
	for l := w; l >= 0; l-- {
		st.reachPass[l] = 0.5*accP/max(passTot, 1) + 0.5*accN/max(passCnt, 1)
		st.reachRand[l] = accR / max(randTot, 1)
		accP += passW[l]
		accN += passN[l]
		accR += randW[l]
	}
	step := 1
	if !is4 {
		step = 4
	}
	for c := 8; c < st.maxLen; c += step {
		st.cands = append(st.cands, c)
	}
	st.cands = append(st.cands, st.maxLen)
	return st
}

// maxStride bounds how many bits one level may add (it bounds the
// expansion of a prefix into a level's keys).
func (st *stats) maxStride() int {
	if st.w == 32 {
		return 24
	}
	return 32
}

// lookupWeight is the cost of a level whose parent level is lp: the share
// of packets that do its lookup, weighting pass traffic over random.
func (st *stats) lookupWeight(lp int) float64 {
	if lp == 0 {
		return 1
	}
	return 0.75*st.reachPass[lp] + 0.25*st.reachRand[lp]
}

// mixed returns how many buckets of length l are mixed.
func (st *stats) mixed(l int) float64 {
	n := 0
	for i := 0; i < st.n; i++ {
		if st.plen[i] > l && (i == 0 || st.plen[i-1] <= l || st.cpl[i] < l) {
			n++
		}
	}
	return float64(n)
}

// uniformEntries returns, for each candidate l after lp (within the
// stride bound), the sum over mixed buckets at lp of the minority count of
// uniform children at l.
func (st *stats) uniformEntries(lp int, next []int) []float64 {
	out := make([]float64, len(next))
	full := make([]float64, len(next))
	empty := make([]float64, len(next))
	flush := func() {
		for k := range next {
			out[k] += min(full[k], empty[k])
			full[k], empty[k] = 0, 0
		}
	}
	open := false
	for i := 0; i < st.n; i++ {
		l := st.plen[i]
		if l <= lp {
			if open {
				flush()
				open = false
			}
			continue
		}
		if open && (st.plen[i-1] <= lp || st.cpl[i] < lp) {
			flush()
		}
		open = true
		for k, c := range next {
			if l <= c {
				n := pow2[c-l]
				if st.in[i] {
					full[k] += n
				} else {
					empty[k] += n
				}
			}
		}
	}
	if open {
		flush()
	}
	return out
}

// choose picks the level lengths minimising expected lookups plus a small
// price per element, within maxEntries. It returns nil when nothing fits.
func (st *stats) choose(maxEntries int) []int {
	nodes := append([]int{0}, st.cands...)
	mixed := make(map[int]float64, len(nodes))
	for _, c := range st.cands {
		mixed[c] = st.mixed(c)
	}
	// edge[a][b]: elements of level nodes[b] under level nodes[a].
	edge := make([][]float64, len(nodes))
	for a, lp := range nodes {
		var next []int
		var idx []int
		for b := a + 1; b < len(nodes); b++ {
			if lp == 0 || nodes[b]-lp <= st.maxStride() {
				next = append(next, nodes[b])
				idx = append(idx, b)
			}
		}
		edge[a] = make([]float64, len(nodes))
		for k := range edge[a] {
			edge[a][k] = math.Inf(1)
		}
		u := st.uniformEntries(lp, next)
		for k, b := range idx {
			edge[a][b] = u[k] + mixed[nodes[b]]
		}
	}
	// Price per element: a million elements cost as much as one lookup
	// per packet; raised until the result fits.
	for price := 1.0 / (1 << 20); price < 1; price *= 4 {
		best := make([]float64, len(nodes))
		elems := make([]float64, len(nodes))
		from := make([]int, len(nodes))
		for b := 1; b < len(nodes); b++ {
			best[b] = math.Inf(1)
			for a := 0; a < b; a++ {
				e := edge[a][b]
				if math.IsInf(e, 1) || math.IsInf(best[a], 1) {
					continue
				}
				c := best[a] + st.lookupWeight(nodes[a]) + price*e
				if c < best[b] {
					best[b], elems[b], from[b] = c, elems[a]+e, a
				}
			}
		}
		last := len(nodes) - 1
		if math.IsInf(best[last], 1) {
			return nil
		}
		if elems[last] <= float64(maxEntries) {
			var path []int
			for b := last; b != 0; b = from[b] {
				path = append(path, nodes[b])
			}
			slices.Reverse(path)
			return path
		}
	}
	return nil
}

// cost evaluates the model for the given strides.
func (st *stats) cost(strides []int) CostEstimate {
	var c CostEstimate
	parent := 0
	for _, s := range strides {
		if parent == 0 {
			c.LookupsPass++
			c.LookupsRandom++
		} else {
			c.LookupsPass += st.reachPass[parent]
			c.LookupsRandom += st.reachRand[parent]
		}
		parent = s
	}
	return c
}

// pow2[k] is 2**k.
var pow2 = func() (t [129]float64) {
	for k := range t {
		t[k] = math.Ldexp(1, k)
	}
	return t
}()
