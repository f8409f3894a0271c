package plan

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"unsafe"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
)

// randomSet builds a random set of n prefixes of one family, with lengths
// spread so that every kind of bucket (full, empty, mixed at every level)
// occurs, and some prefixes clustered to create deep mixed buckets.
func randomSet(r *rand.Rand, is4 bool, n int) *prefix.Set {
	var b netipx.IPSetBuilder
	w := familyBits(is4)
	var base prefix.U128
	for i := 0; i < n; i++ {
		var a prefix.U128
		if i%3 == 0 || i == 0 {
			a = prefix.U128{Hi: r.Uint64(), Lo: r.Uint64()}
			if is4 {
				a = prefix.U128{Lo: uint64(r.Uint32())}
			}
			base = a
		} else { // near the previous cluster
			a = base.Add(prefix.U128{Lo: uint64(r.IntN(1 << 12))}.Shl(r.IntN(8)))
			if is4 {
				a.Lo &= 0xffffffff
				a.Hi = 0
			}
		}
		var l int
		if is4 {
			l = 4 + r.IntN(29)
		} else {
			l = 8 + r.IntN(121)
		}
		p := netip.PrefixFrom(a.Addr(w), l).Masked()
		if r.IntN(4) == 0 {
			b.RemovePrefix(p)
		} else {
			b.AddPrefix(p)
		}
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return prefix.FromIPSet(s)
}

// probes returns the boundary addresses of s (first and last of every
// range and of every gap, and their neighbours) plus random addresses.
func probes(r *rand.Rand, s *prefix.Set, is4 bool, random int) []netip.Addr {
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() && a.Is4() == is4 {
			out = append(out, a)
		}
	}
	for _, rg := range s.Ranges() {
		for _, a := range []netip.Addr{rg.From(), rg.To()} {
			add(a)
			add(a.Prev())
			add(a.Next())
		}
	}
	w := familyBits(is4)
	for i := 0; i < random; i++ {
		add(prefix.U128{Hi: r.Uint64(), Lo: r.Uint64() & (1<<uint(min(w, 64)) - 1 | -(uint64(w) >> 7))}.Addr(w))
	}
	return out
}

func checkLayout(t *testing.T, s *prefix.Set, l *Layout, ps []netip.Addr) {
	t.Helper()
	bad := 0
	for _, a := range ps {
		if got, want := l.Contains(a), s.Contains(a); got != want {
			if bad++; bad < 5 {
				t.Errorf("%s: layout %v (strides %v) says %v, set says %v", a, l.Kind, l.Strides(), got, want)
			}
		}
	}
}

func TestLayoutModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sawRest := 0
	defer func() {
		if sawRest == 0 {
			t.Error("no layout needed the Rest interval set: the depth limit is untested")
		}
	}()
	for iter := 0; iter < 60; iter++ {
		for _, is4 := range []bool{true, false} {
			s := randomSet(r, is4, 1+r.IntN(400))
			ps := probes(r, s, is4, 2000)
			for _, passIn := range []bool{false, true} {
				l, err := Build(s, is4, Options{PassIsIn: passIn, PlainMax: -1})
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				checkLayout(t, s, l, ps)
			}
			// Forced strides, including ones that end far below /32.
			w := familyBits(is4)
			var fine []int // more levels than MaxDepth: deep buckets use Rest
			for b := w / 32; b <= w; b += w / 32 {
				fine = append(fine, b)
			}
			for _, strides := range [][]int{{w}, {w / 2, w}, {8, w / 4, w / 2, 3 * w / 4, w}, fine} {
				l, err := Build(s, is4, Options{Strides4: strides, Strides6: strides, MaxEntries: 1 << 15})
				if err != nil {
					continue // too large for this set: fine
				}
				checkLayout(t, s, l, ps)
				if len(strides) == len(fine) && len(l.Rest) > 0 {
					sawRest++
				}
			}
			if t.Failed() {
				t.FailNow()
			}
		}
	}
}

func TestLayoutKinds(t *testing.T) {
	mk := func(ps ...string) *prefix.Set {
		var b prefix.Builder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		s, _ := b.Build()
		return s
	}
	for _, tc := range []struct {
		set  *prefix.Set
		is4  bool
		want Kind
	}{
		{mk(), true, KindEmpty},
		{mk("2001:db8::/32"), true, KindEmpty},
		{mk("0.0.0.0/0"), true, KindAll},
		{mk("10.0.0.0/8", "192.0.2.1/32"), true, KindPlain},
		{mk("2001:db8::/32"), false, KindPlain},
	} {
		l, err := Build(tc.set, tc.is4, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Kind != tc.want {
			t.Errorf("%v: kind %v, want %v", prefix.Prefixes(tc.set), l.Kind, tc.want)
		}
	}
}

func TestChooseSingleAddresses(t *testing.T) {
	// A feed of scattered single addresses is best as one /32 hash,
	// behind the /16 bitmaps where there are any.
	r := rand.New(rand.NewPCG(3, 4))
	var b prefix.Builder
	for i := 0; i < 5000; i++ {
		b.Add(prefix.U128{Lo: uint64(r.Uint32())}.Addr(32))
	}
	s, _ := b.Build()
	noBitmap := DefaultModel
	noBitmap.BitmapLookup = 0
	for _, tc := range []struct {
		m    TrafficModel
		want string
	}{{DefaultModel, "[16 32]"}, {noBitmap, "[32]"}} {
		l, err := Build(s, true, Options{Model: tc.m})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(l.Strides()) != tc.want {
			t.Errorf("bitmap lookup %g: strides %v, want %s", tc.m.BitmapLookup, l.Strides(), tc.want)
		}
	}
}

// TestChooserModel checks the dynamic programme against a direct model:
// every mixed bucket's chosen cost and elements must be the minimum, over
// every child length it may use, of what a piece-by-piece count of its
// children gives (solve counts them from prefix sums and stops at the
// first length without mixed children); the root's too, over every
// candidate length.
func TestChooserModel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := range 40 {
		for _, is4 := range []bool{true, false} {
			s := randomSet(r, is4, 1+r.IntN(600))
			pieces := partition(s, is4)
			if len(pieces) < 2 {
				continue
			}
			m := DefaultModel
			m.BitmapLookup = 0 // TestBitmapRoot checks that level
			c := newChooser(pieces, is4, iter%2 == 0, nil, m)
			price := DefaultElementPrice / 1e6
			root, rootCost, rootElems := c.solve(price)
			// The root: the best of every candidate length.
			best, bestElems := math.Inf(1), 0.0
			for _, o := range c.cands {
				if oc, oe := modelEvaluate(c, root, 0, o, price); oc < best {
					best, bestElems = oc, oe
				}
			}
			if math.Abs(rootCost-best) > 1e-9*max(1, best) || math.Abs(rootElems-bestElems) > 1e-9*max(1, bestElems) {
				t.Fatalf("iter %d: root at /%d costs %g with %g elements, model's best is %g, %g", iter, root.child, rootCost, rootElems, best, bestElems)
			}
			for l := range c.buckets {
				for k, b := range c.buckets[l] {
					cost, elems := math.Inf(1), 0.0
					for _, o := range c.options(l) {
						oc, oe := modelEvaluate(c, b, l, o, price)
						if oc < cost {
							cost, elems = oc, oe
						}
					}
					bc, be := bucketCost(c, l, k)
					if math.Abs(cost-bc) > 1e-9*max(1, cost) || math.Abs(elems-be) > 1e-9*max(1, elems) {
						t.Fatalf("iter %d: bucket /%d [%d,%d): chose cost %g elems %g (child /%d), model's best is %g, %g",
							iter, l, b.start, b.end, bc, be, b.child, cost, elems)
					}
				}
			}
		}
	}
}

// TestBitmapRootElementLimit: a Bitmap root's entries are bitmap bits,
// not charged against MaxEntries, as the chooser counts them: a set that
// fits the limit builds with the bitmaps too.
func TestBitmapRootElementLimit(t *testing.T) {
	var b prefix.Builder
	for i := range 20 {
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(20 + 2*i), 0, 0, 0}), 8))
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(100 + i), 7, 7, 0}), 24))
	}
	s, _ := b.Build()
	l, err := Build(s, true, Options{MaxEntries: 500})
	if err != nil {
		t.Fatal(err)
	}
	checkLayout(t, s, l, probes(rand.New(rand.NewPCG(1, 1)), s, true, 200))
}

// TestBitmapRoot checks the chooser's Bitmap root level against the
// direct model: the root's children are /16 buckets whose lookup costs
// BitmapLookup and which are no elements; the mixed ones all use the one
// child length that costs least in total; and the layout built from it
// decides every address as the set does.
func TestBitmapRoot(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ran := 0
	defer func() {
		if ran < 20 {
			t.Errorf("only %d of 30 sets had a bitmap root", ran)
		}
	}()
	for iter := range 30 {
		s := randomSet(r, true, 50+r.IntN(2000))
		pieces := partition(s, true)
		c := newChooser(pieces, true, iter%2 == 0, nil, DefaultModel)
		if !c.bitmap {
			continue
		}
		ran++
		price := DefaultElementPrice / 1e6
		root, cost, elems := c.solve(price)
		if root.child != BitmapBits {
			t.Fatalf("iter %d: root child /%d, want /%d", iter, root.child, BitmapBits)
		}
		bs := c.buckets[BitmapBits]
		best := math.Inf(1)
		for _, o := range c.cands {
			if o <= BitmapBits {
				continue
			}
			var total float64
			for _, b := range bs {
				oc, _ := modelEvaluate(c, b, BitmapBits, o, price)
				total += oc
			}
			best = min(best, total)
		}
		var got, gotElems float64
		for k, b := range bs {
			if b.child != bs[0].child {
				t.Fatalf("iter %d: mixed /16 buckets use /%d and /%d", iter, bs[0].child, b.child)
			}
			bc, be := bucketCost(c, BitmapBits, k)
			got += bc
			gotElems += be
		}
		if math.Abs(got-best) > 1e-9*max(1, best) {
			t.Fatalf("iter %d: the /16 buckets cost %g at /%d, the best length %g", iter, got, bs[0].child, best)
		}
		if want := got + c.wsum[len(pieces)]*DefaultModel.BitmapLookup; math.Abs(cost-want) > 1e-9*max(1, want) || elems != gotElems {
			t.Fatalf("iter %d: root cost %g elems %g, want %g and %g (bitmap bits are no elements)", iter, cost, elems, want, gotElems)
		}
		l, err := Build(s, true, Options{PassIsIn: iter%2 == 0})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Levels[l.Root].Bitmap || l.Levels[l.Root].Bits != BitmapBits {
			t.Fatalf("iter %d: root level /%d, bitmap %v", iter, l.Levels[l.Root].Bits, l.Levels[l.Root].Bitmap)
		}
		next := int32(-1)
		for _, e := range l.Levels[l.Root].All() {
			if e.Kind == DescendIn || e.Kind == DescendOut {
				if next >= 0 && e.Next != next {
					t.Fatalf("iter %d: root entries descend to levels %d and %d", iter, next, e.Next)
				}
				next = e.Next
			}
		}
		for i, lv := range l.Levels {
			if lv.Bitmap && i != l.Root {
				t.Fatalf("iter %d: level %d (/%d) is a bitmap but not the root", iter, i, lv.Bits)
			}
		}
		ps := probes(r, s, true, 300)
		checkLayout(t, s, l, ps)
		for _, a := range ps {
			if _, n := l.lookup(a, nil); l.Lookups(a) != n-1 {
				t.Fatalf("iter %d: %v: %d lookups counted of %d levels visited (the bitmap is no map lookup)", iter, a, l.Lookups(a), n)
			}
		}
	}
}

// bucketCost is the cost (its own lookup included) and elements solve
// chose for c.buckets[l][k].
func bucketCost(c *chooser, l, k int) (cost, elems float64) {
	s := c.sums[l]
	return s[k+1].cost - s[k].cost, s[k+1].elems - s[k].elems
}

// modelEvaluate prices bucket b at length l resolved at length o by
// walking its pieces: each piece up to /o is a uniform child, each longer
// one lies in a mixed child bucket of length o. The traffic reaching b
// pays its lookup, keyed at /o (one word more than IPv4's costs
// ExtraWord), and its mixed children's.
func modelEvaluate(c *chooser, b dpBucket, l, o int, price float64) (cost, elems float64) {
	var full, empty, mixed float64
	for i := int(b.start); i < int(b.end); {
		pl := int(c.plen[i])
		if pl <= o {
			if c.pieces[i].in {
				full += pow2[o-pl]
			} else {
				empty += pow2[o-pl]
			}
			i++
			continue
		}
		k := sort.Search(len(c.buckets[o]), func(k int) bool { return int(c.buckets[o][k].start) >= i })
		ch := c.buckets[o][k]
		if int(ch.start) != i {
			panic("a piece longer than the child length is not at the start of a mixed child")
		}
		mixed++
		chCost, chElems := bucketCost(c, o, k)
		cost += chCost
		elems += chElems
		i = int(ch.end)
	}
	if full+empty+mixed != pow2[o-l] && o-l < 53 {
		panic(fmt.Sprintf("bucket /%d at /%d: %g full, %g empty, %g mixed children", l, o, full, empty, mixed))
	}
	own := min(full, empty) + mixed
	lookup := 1 + DefaultModel.ExtraWord*float64((o+31)/32-1)
	if c.w == 32 {
		lookup = 1
	}
	return cost + (c.wsum[b.end]-c.wsum[b.start])*lookup + price*own, elems + own
}

// bitmapOrderSet is 10 whole /16s and 200 /16s holding one /24 each: by
// addresses the whole /16s carry most of the traffic, by ranges the
// mixed ones.
func bitmapOrderSet() *prefix.Set {
	var b prefix.Builder
	for i := range 10 {
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{20, byte(2 * i), 0, 0}), 16))
	}
	for i := range 200 {
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{30 + byte(i/100), byte(i % 100), 7, 0}), 24))
	}
	s, _ := b.Build()
	return s
}

// TestBitmapOrder: a Bitmap root's rules are tried busiest first under
// the chooser's model, since a packet pays for every rule before its own.
func TestBitmapOrder(t *testing.T) {
	s := bitmapOrderSet()
	for _, tc := range []struct {
		name string
		m    TrafficModel
		want []EntryKind
	}{
		{"addresses", TrafficModel{Addresses: 1, Random: 1, BitmapLookup: 0.5}, []EntryKind{In, DescendOut}},
		{"ranges", TrafficModel{Ranges: 1, Random: 1, BitmapLookup: 0.5}, []EntryKind{DescendOut, In}},
		{"default", DefaultModel, []EntryKind{DescendOut, In}},
	} {
		// Elements dear, so that the whole /16s stay bitmap bits.
		l, err := Build(s, true, Options{Model: tc.m, PassIsIn: true, ElementPrice: 100})
		if err != nil {
			t.Fatal(err)
		}
		if !l.BitmapRoot() {
			t.Fatalf("%s: no bitmap root: strides %v", tc.name, l.Strides())
		}
		if got := l.Levels[l.Root].Order; !slices.Equal(got, tc.want) {
			t.Errorf("%s: order %v, want %v", tc.name, got, tc.want)
		}
		checkLayout(t, s, l, probes(rand.New(rand.NewPCG(1, 1)), s, true, 200))
	}
}

// TestRelease: a released layout keeps what it says of itself (counts,
// strides, JSON) without its elements, and refuses lookups.
func TestRelease(t *testing.T) {
	s := randomSet(rand.New(rand.NewPCG(9, 9)), true, 3000)
	l, err := Build(s, true, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(l)
	n := l.Entries()
	l.Release()
	l.Release() // twice: the same
	after, _ := json.Marshal(l)
	if l.Entries() != n || string(after) != string(before) {
		t.Fatalf("after Release: %d entries, %s; want %d, %s", l.Entries(), after, n, before)
	}
	for _, lv := range l.Levels {
		if lv.Len() != 0 || lv.spare() != 0 {
			t.Fatalf("level /%d keeps %d entries (room for %d more)", lv.Bits, lv.Len(), lv.spare())
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Contains on a released layout did not panic")
		}
	}()
	l.Contains(netip.MustParseAddr("192.0.2.1"))
}

// TestEntryKey: an Entry keeps its key exactly, in 24 bytes.
func TestEntryKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range 2000 {
		var a [16]byte
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		p := netip.PrefixFrom(netip.AddrFrom16(a), rng.IntN(129)).Masked()
		if rng.IntN(2) == 0 {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), rng.IntN(33)).Masked()
		}
		e := NewEntry(p, DescendIn, int32(rng.IntN(12)))
		if e.Key() != p || e.Kind != DescendIn {
			t.Fatalf("NewEntry(%v).Key() = %v", p, e.Key())
		}
	}
	if n := unsafe.Sizeof(Entry{}); n > 24 {
		t.Errorf("an Entry takes %d bytes, want at most 24", n)
	}
}

// TestDeriveLevels checks the mixed buckets the chooser derives level from
// level against a scan of the pieces at each length (a bucket at l: a run
// of consecutive pieces longer than l within one /l), with every length a
// candidate, IPv6's sparse candidates, and forced strides.
func TestDeriveLevels(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 25))
	for iter := range 60 {
		is4 := iter%2 == 0
		s := randomSet(r, is4, 1+r.IntN(800))
		pieces := partition(s, is4)
		if len(pieces) < 2 {
			continue
		}
		var forced []int
		if iter%3 == 0 {
			maxLen := 0
			for _, p := range pieces {
				maxLen = max(maxLen, int(p.bits))
			}
			forced = []int{1 + r.IntN(max(1, maxLen-1)), maxLen + r.IntN(familyBits(is4)-maxLen+1)}
			if forced[0] >= forced[1] {
				forced = forced[1:]
			}
		}
		c := newChooser(pieces, is4, false, forced, DefaultModel)
		c.sortByLen()
		for k := len(c.cands) - 1; k >= 0; k-- {
			c.deriveLevel(k)
			l := c.cands[k]
			var want []dpBucket
			for i := 0; i < len(pieces); {
				if int(pieces[i].bits) <= l {
					i++
					continue
				}
				j := i + 1
				for j < len(pieces) && int(pieces[j].bits) > l && cpl(pieces[j-1].addr, pieces[j].addr, c.w) >= l {
					j++
				}
				want = append(want, dpBucket{start: int32(i), end: int32(j)})
				i = j
			}
			if !slices.Equal(c.buckets[l], want) {
				t.Fatalf("iter %d (cands %v): /%d buckets %v, the scan finds %v", iter, c.cands, l, c.buckets[l], want)
			}
		}
	}
}

// TestEntriesRoom: the layout's entries keep little spare room (they are
// reserved from the pieces' progress), also when one level's entries
// all come early (every other /24 of 1.0.0.0/8) and another's late
// (every other /32 of the first /16 of 100/8 to 115/8).
func TestEntriesRoom(t *testing.T) {
	var b prefix.Builder
	for i := 0; i < 1<<16; i += 2 {
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{1, byte(i >> 8), byte(i), 0}), 24))
	}
	for o := 100; o < 116; o++ {
		for i := 0; i < 1<<16; i += 2 {
			b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(o), 0, byte(i >> 8), byte(i)}), 32))
		}
	}
	skewed, _ := b.Build()
	for name, s := range map[string]*prefix.Set{"skewed": skewed, "scattered": randomSet(rand.New(rand.NewPCG(3, 25)), true, 200_000)} {
		l, err := Build(s, true, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, lv := range l.Levels {
			if n := lv.Len(); lv.spare() > n/4+1024 {
				t.Errorf("%s: level /%d at depth %d: %d entries, room for %d more", name, lv.Bits, lv.Depth, n, lv.spare())
			}
		}
	}
}

// TestEntryPacking: an IPv4 level's packed entries read back as they were
// added (key, kind, child length and Next), and an IPv6 level's whole.
func TestEntryPacking(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 8))
	for _, is4 := range []bool{true, false} {
		bits := 1 + r.IntN(32)
		if !is4 {
			bits = 1 + r.IntN(128)
		}
		lv := Level{Bits: bits, Depth: 3}
		var want []Entry
		for i := range 2000 {
			var a netip.Addr
			if is4 {
				a = netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())})
			} else {
				var b [16]byte
				for k := range b {
					b[k] = byte(r.Uint32())
				}
				a = netip.AddrFrom16(b)
			}
			if i == 0 {
				a = netip.IPv4Unspecified()
				if !is4 {
					a = netip.IPv6Unspecified()
				}
			}
			e := NewEntry(netip.PrefixFrom(a, bits).Masked(), EntryKind(1+r.IntN(5)), int32(r.IntN(1<<16)))
			e.next = uint8(r.IntN(129))
			if i == 1 {
				e.Next, e.next = 1<<16-1, 255
			}
			lv.add(e)
			want = append(want, e)
			if i%7 == 0 {
				next := int32(r.IntN(1 << 16))
				lv.setNext(i, next)
				want[i].Next = next
			}
		}
		if lv.Len() != len(want) {
			t.Fatalf("is4=%v: %d entries, want %d", is4, lv.Len(), len(want))
		}
		for i, e := range lv.All() {
			if e != want[i] || lv.Entry(i) != e || e.Key() != want[i].Key() {
				t.Fatalf("is4=%v: entry %d = %+v (key %v), want %+v (key %v)", is4, i, e, e.Key(), want[i], want[i].Key())
			}
		}
	}
}
