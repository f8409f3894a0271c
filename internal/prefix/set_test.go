package prefix

import (
	"crypto/sha256"
	"encoding/hex"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"go4.org/netipx"
)

// This file checks Set against netipx.IPSet as the reference model: the
// lookups, the iteration, the conversions both ways and the set algebra,
// on hand-made edge cases and random sets of both families.

// allOnes6 is ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff.
var allOnes6 = netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")

// nrange parses "a", "a-b" or a prefix with netip alone (unlike
// ParseLine, an IPv4-mapped IPv6 address stays IPv6).
func nrange(s string) netipx.IPRange {
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		return netipx.IPRangeFrom(netip.MustParseAddr(lo), netip.MustParseAddr(hi))
	}
	if strings.Contains(s, "/") {
		return netipx.RangeOfPrefix(netip.MustParsePrefix(s))
	}
	a := netip.MustParseAddr(s)
	return netipx.IPRangeFrom(a, a)
}

// ipsetOf returns the netipx set of the ranges, prefixes and addresses in
// text, separated by spaces.
func ipsetOf(text string) *netipx.IPSet {
	var b netipx.IPSetBuilder
	for _, f := range strings.Fields(text) {
		b.AddRange(nrange(f))
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}

// edgeSets are sets at the edges of the address spaces and of the
// packing: the first and last address of each family, whole families,
// ranges one address apart, IPv4-mapped and IPv4-compatible IPv6 ranges,
// ranges across the halves of a U128.
var edgeSets = []string{
	"",
	"0.0.0.0",
	"255.255.255.255",
	"0.0.0.0 255.255.255.255",
	"::",
	"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	":: ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	"0.0.0.0/0",
	"::/0",
	"0.0.0.0/0 ::/0",
	"0.0.0.1-255.255.255.254",
	"::1-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe",
	"10.0.0.0-255.255.255.255",
	"0.0.0.0-9.255.255.255",
	"10.0.0.0-255.255.255.255 2001:db8::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	"1.2.3.4 1.2.3.6",                           // one address apart
	"1.2.3.4 1.2.3.5",                           // touching: one range
	"1.2.3.0/24 1.2.5.0/24 1.2.4.255",           // touching the first
	"1.2.3.4 1.2.3.6 1.2.3.8 1.2.3.10 1.2.3.12", // a comb
	"2001:db8::1 2001:db8::3",
	"::ffff:0:0/96",                   // IPv4-mapped addresses, as IPv6
	"::ffff:1.2.3.0/120 1.2.4.0/24",   // both forms of neighbouring addresses
	"::/96",                           // IPv4-compatible addresses
	"::ffff:ffff:ffff:ffff-0:0:0:1::", // across the halves of a U128
	"::ffff:ffff:ffff:ffff 0:0:0:1::1",
	"8000::/1 0.0.0.0/1",
}

// testSets returns the reference sets the tests below run on: the edge
// sets, then n random ones (some nil).
func testSets(rng *rand.Rand, n int) []*netipx.IPSet {
	var out []*netipx.IPSet
	for _, text := range edgeSets {
		out = append(out, ipsetOf(text))
	}
	out = append(out, nil)
	for range n {
		out = append(out, randomSet2(rng))
	}
	return out
}

// setWindows add to windows the IPv4-mapped IPv6 addresses (which must
// not be taken for IPv4 ones) and the middle of the IPv6 space, where a
// U128 carries from Lo into Hi.
var setWindows = append(slices.Clone(windows),
	window{"::ffff:10.0.0.0", false, U128{0, 0xffff_0a00_0000}},
	window{"::ffff:ffff:ffff:f000", false, U128{0, 1<<64 - 1<<(windowBits-1)}},
)

// randomSet2 is randomSet over setWindows: nil one time in ten, else up
// to 15 entries, a whole family one time in twenty.
func randomSet2(rng *rand.Rand) *netipx.IPSet {
	if rng.IntN(10) == 0 {
		return nil
	}
	var b netipx.IPSetBuilder
	for range rng.IntN(16) {
		if rng.IntN(20) == 0 {
			b.AddPrefix([]netip.Prefix{fullPrefix4, fullPrefix6}[rng.IntN(2)])
			continue
		}
		w := setWindows[rng.IntN(len(setWindows))]
		lo, hi := randomRange(rng)
		if w.first.Lo+hi < w.first.Lo { // the window at the carry: keep within it
			lo, hi = lo/2, hi/2
		}
		b.AddRange(netipx.IPRangeFrom(w.addr(lo), w.addr(hi)))
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}

// probes returns the addresses to look up in a set of ranges rr: the
// bounds of each range and the addresses either side of them, the bounds
// of both families, the zero Addr, a few random addresses, and each of
// them in its other form (IPv4 as IPv4-mapped IPv6 and back).
func probes(rng *rand.Rand, rr []netipx.IPRange) []netip.Addr {
	as := []netip.Addr{{}, netip.IPv4Unspecified(), netip.AddrFrom4([4]byte{255, 255, 255, 255}), netip.IPv6Unspecified(), allOnes6,
		netip.MustParseAddr("::ffff:0.0.0.0"), netip.MustParseAddr("::ffff:255.255.255.255"), netip.MustParseAddr("::1.2.3.4")}
	for _, r := range rr {
		as = append(as, r.From(), r.To(), r.From().Prev(), r.To().Next())
		// One inside, at random.
		lo, hi := U128From(r.From()), U128From(r.To())
		var off U128 // in [0, hi-lo]
		switch d := hi.Sub(lo); {
		case d == max6:
			off = U128{rng.Uint64(), rng.Uint64()}
		case d.Hi == 0 && d.Lo < ^uint64(0):
			off = U128{0, rng.Uint64N(d.Lo + 1)}
		case d.Hi == 0:
			off = U128{0, rng.Uint64()}
		default:
			off = U128{rng.Uint64N(d.Hi), rng.Uint64()}
		}
		as = append(as, lo.Add(off).Addr(widthOf(r.From().Is4())))
	}
	for range 4 {
		as = append(as, U128{rng.Uint64(), rng.Uint64()}.Addr(128), U128{0, rng.Uint64()}.Addr(32))
	}
	n := len(as)
	for _, a := range as[:n] {
		switch {
		case a.Is4():
			as = append(as, netip.AddrFrom16(a.As16()))
		case a.Is4In6():
			as = append(as, a.Unmap())
		}
	}
	return as
}

// checkLists checks the invariant of s's lists: each family's ranges
// sorted, none empty, overlapping or touching.
func checkLists(t *testing.T, s *Set) {
	t.Helper()
	v4, v6 := s.lists()
	for i, x := range v4 {
		if x>>32 > x&mask32 {
			t.Errorf("IPv4 range %d (%#x) ends before it starts", i, x)
		}
		if i > 0 && x>>32 <= v4[i-1]&mask32+1 {
			t.Errorf("IPv4 ranges %d and %d (%#x, %#x) overlap, touch or are out of order", i-1, i, v4[i-1], x)
		}
	}
	for i, sp := range v6 {
		if sp.hi.Less(sp.lo) {
			t.Errorf("IPv6 range %d (%v) ends before it starts", i, sp)
		}
		if i > 0 && (v6[i-1].hi == max6 || !v6[i-1].hi.Add64(1).Less(sp.lo)) {
			t.Errorf("IPv6 ranges %d and %d (%v, %v) overlap, touch or are out of order", i-1, i, v6[i-1], sp)
		}
	}
}

// checkVsIPSet checks s against the netipx set n of the same addresses:
// ranges, their order and count, equality and conversion both ways,
// lookups, covers. It reports at most a few lookup errors.
func checkVsIPSet(t *testing.T, rng *rand.Rand, s *Set, n *netipx.IPSet) {
	t.Helper()
	want := rangesOf(n)
	n = orEmptyIPSet(n)
	checkLists(t, s)
	if got := s.Ranges(); !slices.Equal(got, want) {
		t.Errorf("Ranges = %v, want %v", got, want)
		return
	}
	// All in order, and it stops when asked to.
	i := 0
	for r := range s.All() {
		if i >= len(want) || r != want[i] {
			t.Errorf("All yields %v as range %d, want %v", r, i, want)
		}
		i++
	}
	if i != len(want) {
		t.Errorf("All yields %d ranges, want %d", i, len(want))
	}
	for stop := range min(len(want), 3) {
		i := 0
		for r := range s.All() {
			if r != want[i] {
				t.Errorf("All yields %v as range %d, want %v", r, i, want[i])
			}
			if i == stop {
				break
			}
			i++
		}
	}
	w4 := 0
	for _, r := range want {
		if r.From().Is4() {
			w4++
		}
	}
	if n4, n6 := s.Len(); n4 != w4 || n6 != len(want)-w4 {
		t.Errorf("Len = %d, %d, want %d, %d", n4, n6, w4, len(want)-w4)
	}
	if s.Empty() != (len(want) == 0) {
		t.Errorf("Empty = %v for %d ranges", s.Empty(), len(want))
	}
	if n4, n6 := s.Len(); s.Bytes() < 8*n4+32*n6 {
		t.Errorf("Bytes = %d for %d IPv4 and %d IPv6 ranges", s.Bytes(), n4, n6)
	}

	// Equal, and the conversions both ways.
	from := FromIPSet(n)
	if !s.Equal(from) || !from.Equal(s) {
		t.Errorf("Equal: %v and FromIPSet of the same %v differ", s.Ranges(), want)
	}
	back := s.IPSet()
	if back == nil || !back.Equal(orEmptyIPSet(n)) || !slices.Equal(back.Ranges(), want) {
		t.Errorf("IPSet = %v, want %v", rangesOf(back), want)
	}
	if !FromIPSet(back).Equal(s) {
		t.Errorf("FromIPSet(IPSet()) = %v, want %v", FromIPSet(back).Ranges(), want)
	}
	if s.Empty() != (*Set)(nil).Equal(s) || s.Empty() != s.Equal(nil) || s.Empty() != s.Equal(&Set{}) {
		t.Errorf("Equal with the empty set: %v", want)
	}

	// Lookups: netipx is the reference (it takes an IPv4-mapped IPv6
	// address for an IPv6 one).
	errs := 0
	for _, a := range probes(rng, want) {
		if got, ref := s.Contains(a), n.Contains(a); got != ref {
			t.Errorf("Contains(%v) = %v, netipx says %v; set %v", a, got, ref, want)
			if errs++; errs > 3 {
				return
			}
		}
		if a.Is6() && a.IsValid() {
			// An address with a zone is in no set, as in netipx.
			if got, ref := s.Contains(a.WithZone("eth0")), n.Contains(a.WithZone("eth0")); got || ref {
				t.Errorf("Contains(%v) = %v, netipx %v; set %v", a.WithZone("eth0"), got, ref, want)
			}
		}
		if !a.IsValid() {
			continue
		}
		for _, bits := range []int{a.BitLen(), a.BitLen() - 1, a.BitLen() - 8, a.BitLen() / 2, 1, 0} {
			p := netip.PrefixFrom(a, bits).Masked()
			if got, ref := s.ContainsPrefix(p), n.ContainsPrefix(p); got != ref {
				t.Errorf("ContainsPrefix(%v) = %v, netipx says %v; set %v", p, got, ref, want)
				if errs++; errs > 3 {
					return
				}
			}
			if got, ref := s.OverlapsPrefix(p), n.OverlapsPrefix(p); got != ref {
				t.Errorf("OverlapsPrefix(%v) = %v, netipx says %v; set %v", p, got, ref, want)
				if errs++; errs > 3 {
					return
				}
			}
		}
	}
	if s.ContainsPrefix(netip.Prefix{}) || s.OverlapsPrefix(netip.Prefix{}) {
		t.Errorf("the invalid prefix is in %v", want)
	}

	// What is computed from the lists agrees with netipx.
	if got, ref := Prefixes(s), orEmptyIPSet(n).Prefixes(); !slices.Equal(got, ref) {
		t.Errorf("Prefixes = %v, netipx %v", got, ref)
	}
	c4, c6 := Count(s)
	var r4, r6 int
	var a4 uint64
	a6 := new(big.Int)
	for _, p := range orEmptyIPSet(n).Prefixes() {
		if p.Addr().Is4() {
			r4++
			a4 += 1 << (32 - p.Bits())
		} else {
			r6++
			a6.Add(a6, new(big.Int).Lsh(big.NewInt(1), uint(128-p.Bits())))
		}
	}
	if n4, n6 := NumAddrs(s); c4 != r4 || c6 != r6 || n4 != a4 || n6.Cmp(a6) != 0 {
		t.Errorf("Count = %d, %d, NumAddrs = %d, %v; netipx's prefixes: %d, %d, holding %d, %v", c4, c6, n4, n6, r4, r6, a4, a6)
	}
}

func orEmptyIPSet(n *netipx.IPSet) *netipx.IPSet {
	if n == nil {
		return &netipx.IPSet{}
	}
	return n
}

// TestSetModel checks every method of Set against netipx.IPSet on the
// edge sets and random ones, as made by FromIPSet and by Builder.
func TestSetModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 7))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for _, ns := range testSets(rng, n) {
		s := toSet(ns)
		checkVsIPSet(t, rng, s, ns)
		// The same addresses through Builder.
		var b Builder
		for _, r := range rangesOf(ns) {
			b.AddRange(r)
		}
		bs, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		checkVsIPSet(t, rng, bs, ns)
		if t.Failed() {
			t.Fatalf("set %v", rangesOf(ns))
		}
	}
	// The zero and the nil Set are empty.
	for _, s := range []*Set{nil, {}} {
		checkVsIPSet(t, rng, s, nil)
		if s.Contains(netip.IPv4Unspecified()) || s.Contains(netip.IPv6Unspecified()) || len(s.Ranges()) != 0 || s.Bytes() != 0 {
			t.Errorf("%#v is not empty", s)
		}
	}
}

// TestSetContainsFamilies checks by hand that an IPv4 address is never
// found in an IPv6 range or the other way round, IPv4-mapped and
// IPv4-compatible ones included, and that the zero Addr is in no set.
func TestSetContainsFamilies(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		set     string
		in, out []string
	}{
		{"1.2.3.0/24", []string{"1.2.3.0", "1.2.3.4", "1.2.3.255"}, []string{"::ffff:1.2.3.4", "::ffff:1.2.3.0", "::1.2.3.4", "1.2.2.255", "1.2.4.0"}},
		{"::ffff:1.2.3.0/120", []string{"::ffff:1.2.3.4", "::ffff:1.2.3.0", "::ffff:1.2.3.255"}, []string{"1.2.3.4", "1.2.3.0", "::1.2.3.4"}},
		{"::/96", []string{"::", "::1.2.3.4", "::255.255.255.255"}, []string{"0.0.0.0", "1.2.3.4", "255.255.255.255", "::ffff:1.2.3.4"}},
		{"0.0.0.0/0", []string{"0.0.0.0", "1.2.3.4", "255.255.255.255"}, []string{"::", "::ffff:1.2.3.4", "::1.2.3.4", "2001:db8::"}},
		{"::/0", []string{"::", "::ffff:1.2.3.4", "::1.2.3.4", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, []string{"0.0.0.0", "1.2.3.4", "255.255.255.255"}},
		{"", nil, []string{"0.0.0.0", "::", "255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	}
	for _, tt := range tests {
		n := ipsetOf(tt.set)
		s := FromIPSet(n)
		for _, x := range tt.in {
			if !s.Contains(a(x)) || !n.Contains(a(x)) {
				t.Errorf("%q: Contains(%s) = %v (netipx %v), want true", tt.set, x, s.Contains(a(x)), n.Contains(a(x)))
			}
		}
		for _, x := range tt.out {
			if s.Contains(a(x)) || n.Contains(a(x)) {
				t.Errorf("%q: Contains(%s) = %v (netipx %v), want false", tt.set, x, s.Contains(a(x)), n.Contains(a(x)))
			}
		}
		if s.Contains(netip.Addr{}) {
			t.Errorf("%q: holds the zero Addr", tt.set)
		}
	}
}

// TestSetContainsTopRange checks lookups of the first address of a range
// that ends at the last address of its family, and prefixes around it.
func TestSetContainsTopRange(t *testing.T) {
	for _, text := range []string{"255.255.255.255", "10.0.0.0-255.255.255.255", "0.0.0.0/0", "1.2.3.4 128.0.0.0/1",
		"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::/0"} {
		n := ipsetOf(text)
		s := FromIPSet(n)
		rr := n.Ranges()
		last := rr[len(rr)-1]
		if !s.Contains(last.From()) || !s.Contains(last.To()) {
			t.Errorf("%q: Contains(%v) = %v, Contains(%v) = %v, want true", text, last.From(), s.Contains(last.From()), last.To(), s.Contains(last.To()))
		}
		p := netip.PrefixFrom(last.To(), last.To().BitLen())
		if !s.ContainsPrefix(p) || !s.OverlapsPrefix(p) {
			t.Errorf("%q: ContainsPrefix(%v) = %v, OverlapsPrefix = %v, want true", text, p, s.ContainsPrefix(p), s.OverlapsPrefix(p))
		}
		p = netip.PrefixFrom(last.To(), 0).Masked()
		if !s.OverlapsPrefix(p) {
			t.Errorf("%q: OverlapsPrefix(%v) = false, want true", text, p)
		}
	}
}

// TestSetOpsVsIPSet checks Union, Subtract, Intersect, Family and
// Complement against netipx.IPSetBuilder on all pairs of edge sets and on
// random pairs (disjoint ones too), and that results holding an operand's
// addresses are that operand or share its lists.
func TestSetOpsVsIPSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 8))
	sets := testSets(rng, 0)
	type pair struct{ a, b *netipx.IPSet }
	var pairs []pair
	for _, a := range sets {
		for _, b := range sets {
			pairs = append(pairs, pair{a, b})
		}
	}
	n := 5000
	if testing.Short() {
		n = 500
	}
	for range n {
		a, b := randomSet2(rng), randomSet2(rng)
		if rng.IntN(3) == 0 && b != nil { // disjoint
			b = refOp(b, a, (*netipx.IPSetBuilder).RemoveSet)
		}
		pairs = append(pairs, pair{a, b})
	}
	for _, p := range pairs {
		checkOps(t, p.a, p.b)
		if t.Failed() {
			t.Fatalf("a = %v\nb = %v", rangesOf(p.a), rangesOf(p.b))
		}
	}
}

// refOp returns op(a, b) as netipx computes it; a nil is empty.
func refOp(a, b *netipx.IPSet, op func(*netipx.IPSetBuilder, *netipx.IPSet)) *netipx.IPSet {
	var x netipx.IPSetBuilder
	x.AddSet(orEmptyIPSet(a))
	op(&x, orEmptyIPSet(b))
	s, err := x.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}

func checkOps(t *testing.T, a, b *netipx.IPSet) {
	t.Helper()
	sa, sb := toSet(a), toSet(b)
	a4, a6 := listsOf(sa)
	b4, b6 := listsOf(sb)
	union, sub, inter := Union(sa, sb), Subtract(sa, sb), Intersect(sa, sb)
	for _, c := range []struct {
		name string
		got  *Set
		want *netipx.IPSet
	}{
		{"Union", union, refOp(a, b, (*netipx.IPSetBuilder).AddSet)},
		{"Subtract", sub, refOp(a, b, (*netipx.IPSetBuilder).RemoveSet)},
		{"Intersect", inter, refOp(a, b, (*netipx.IPSetBuilder).Intersect)},
	} {
		if c.got == nil {
			t.Errorf("%s = nil", c.name)
			continue
		}
		checkLists(t, c.got)
		if !slices.Equal(c.got.Ranges(), c.want.Ranges()) || !c.got.Equal(FromIPSet(c.want)) {
			t.Errorf("%s = %v, want %v", c.name, c.got.Ranges(), c.want.Ranges())
		}
	}

	// An operand comes back as itself when the other changes nothing.
	switch {
	case sa != nil && sb.Empty() && union != sa:
		t.Errorf("Union(a, empty) is not a")
	case sb != nil && sa.Empty() && !sb.Empty() && union != sb:
		t.Errorf("Union(empty, b) is not b")
	}
	disjoint := refOp(a, b, (*netipx.IPSetBuilder).Intersect).Equal(&netipx.IPSet{})
	if sa != nil && disjoint && sub != sa {
		t.Errorf("Subtract(a, b) of disjoint sets (or b empty) is not a")
	}
	if sa != nil && sb.Empty() && sub != sa {
		t.Errorf("Subtract(a, empty) is not a")
	}
	if disjoint && !inter.Empty() {
		t.Errorf("Intersect of disjoint sets is not empty")
	}

	// Family: netipx without the other family; the lists shared.
	for _, fam := range [][2]bool{{true, true}, {true, false}, {false, true}, {false, false}} {
		x := orEmptyIPSet(a)
		if !fam[0] {
			x = refOp(x, ipsetOf("0.0.0.0/0"), (*netipx.IPSetBuilder).RemoveSet)
		}
		if !fam[1] {
			x = refOp(x, ipsetOf("::/0"), (*netipx.IPSetBuilder).RemoveSet)
		}
		got := Family(sa, fam[0], fam[1])
		if got == nil || !slices.Equal(got.Ranges(), x.Ranges()) || !got.Equal(FromIPSet(x)) {
			t.Errorf("Family(a, %v, %v) = %v, want %v", fam[0], fam[1], got.Ranges(), x.Ranges())
			continue
		}
		g4, g6 := got.lists()
		s4, s6 := sa.lists()
		if len(g4) > 0 && unsafe.SliceData(g4) != unsafe.SliceData(s4) || len(g6) > 0 && unsafe.SliceData(g6) != unsafe.SliceData(s6) {
			t.Errorf("Family(a, %v, %v) copied a list", fam[0], fam[1])
		}
		n4, n6 := sa.Len()
		if sa != nil && (fam[0] || n4 == 0) && (fam[1] || n6 == 0) && got != sa {
			t.Errorf("Family(a, %v, %v) holds a but is not a", fam[0], fam[1])
		}
	}

	// Complement: netipx's whole families minus a.
	for _, fam := range [][2]bool{{true, true}, {true, false}, {false, true}, {false, false}} {
		var whole []string
		if fam[0] {
			whole = append(whole, "0.0.0.0/0")
		}
		if fam[1] {
			whole = append(whole, "::/0")
		}
		want := refOp(ipsetOf(strings.Join(whole, " ")), a, (*netipx.IPSetBuilder).RemoveSet)
		got := Complement(sa, fam[0], fam[1])
		if got == nil {
			t.Errorf("Complement = nil")
			continue
		}
		checkLists(t, got)
		if !slices.Equal(got.Ranges(), want.Ranges()) || !got.Equal(FromIPSet(want)) {
			t.Errorf("Complement(a, %v, %v) = %v, want %v", fam[0], fam[1], got.Ranges(), want.Ranges())
		}
	}

	// Nothing modified the operands.
	x4, x6 := sa.lists()
	y4, y6 := sb.lists()
	if !slices.Equal(x4, a4) || !slices.Equal(x6, a6) || !slices.Equal(y4, b4) || !slices.Equal(y6, b6) {
		t.Errorf("an operation modified an operand")
	}
}

// refDigest is Digest as it was defined when sets were netipx.IPSets:
// SHA-256 over the family's ranges, each as the 16 bytes of its first and
// of its last address (IPv4 ones IPv4-mapped, as As16 gives them).
func refDigest(n *netipx.IPSet, is4 bool) string {
	h := sha256.New()
	for _, r := range rangesOf(n) {
		if r.From().Is4() != is4 {
			continue
		}
		from, to := r.From().As16(), r.To().As16()
		h.Write(from[:])
		h.Write(to[:])
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}

// TestDigestUnchanged checks that Digest names sets as it did before sets
// were packed: the names are kept (in records, on disk), so they must not
// change.
func TestDigestUnchanged(t *testing.T) {
	const empty = "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" // SHA-256 of nothing
	for _, is4 := range []bool{true, false} {
		for _, s := range []*Set{nil, {}, FromIPSet(&netipx.IPSet{})} {
			if got := Digest(s, is4); got != empty {
				t.Errorf("Digest of an empty set, is4=%v: %s", is4, got)
			}
		}
	}
	// One by hand: 1.2.3.4-1.2.3.5 and 10.0.0.0/8, IPv4-mapped.
	h := sha256.New()
	for _, x := range []string{"::ffff:1.2.3.4", "::ffff:1.2.3.5", "::ffff:10.0.0.0", "::ffff:10.255.255.255"} {
		b := netip.MustParseAddr(x).As16()
		h.Write(b[:])
	}
	if got, want := Digest(FromIPSet(ipsetOf("1.2.3.4-1.2.3.5 10.0.0.0/8 2001:db8::/32")), true), "sha256-"+hex.EncodeToString(h.Sum(nil)); got != want {
		t.Errorf("Digest = %s, want %s", got, want)
	}

	rng := rand.New(rand.NewPCG(31, 9))
	seen := map[string]bool{}
	for _, n := range testSets(rng, 1000) {
		s := toSet(n)
		var b Builder
		b.AddSet(s)
		bs, _ := b.Build()
		for _, is4 := range []bool{true, false} {
			want := refDigest(n, is4)
			if got := Digest(s, is4); got != want {
				t.Fatalf("Digest(%v, %v) = %s, before %s", rangesOf(n), is4, got, want)
			}
			if got := Digest(bs, is4); got != want {
				t.Fatalf("Digest of Builder's %v, %v = %s, before %s", rangesOf(n), is4, got, want)
			}
			seen[want] = true
		}
	}
	if len(seen) < 500 {
		t.Errorf("only %d different digests: the sets are too alike to test much", len(seen))
	}
}

// TestBuildTwice checks that a set Build returned is not changed by what
// the builder does next: adding, removing, building again (which merges
// the builder's lists in place), or anything written over its lists.
func TestBuildTwice(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 10))
	n := 500
	if testing.Short() {
		n = 50
	}
	type step struct {
		r      netipx.IPRange
		remove bool
	}
	randomSteps := func() []step {
		var out []step
		for range rng.IntN(40) {
			w := setWindows[rng.IntN(len(setWindows))]
			lo, hi := randomRange(rng)
			if w.first.Lo+hi < w.first.Lo {
				lo, hi = lo/2, hi/2
			}
			out = append(out, step{netipx.IPRangeFrom(w.addr(lo), w.addr(hi)), rng.IntN(4) == 0})
		}
		return out
	}
	// ref is what Builder builds of steps: all additions minus all
	// removals, whatever their order.
	ref := func(steps []step) *netipx.IPSet {
		var b netipx.IPSetBuilder
		for _, s := range steps {
			if !s.remove {
				b.AddRange(s.r)
			}
		}
		for _, s := range steps {
			if s.remove {
				b.RemoveRange(s.r)
			}
		}
		set, _ := b.IPSet()
		return set
	}
	apply := func(b *Builder, steps []step) {
		for _, s := range steps {
			if s.remove {
				b.RemoveRange(s.r)
			} else {
				b.AddRange(s.r)
			}
		}
	}
	for range n {
		first, more := randomSteps(), randomSteps()
		var b Builder
		apply(&b, first)
		s1, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		want1 := ref(first)
		c4, c6 := listsOf(s1)

		// Read s1 while the builder goes on (go test -race sees any
		// sharing).
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 3 {
				_ = s1.Ranges()
				_ = Digest(s1, true)
			}
		})
		apply(&b, more)
		// Its own result, too: added (which changes nothing, as s1 is
		// what was added minus what is removed anyway) or removed.
		withS1 := rng.IntN(3)
		switch withS1 {
		case 0:
			b.AddSet(s1)
		case 1:
			b.RemoveSet(s1)
		}
		s2, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		want2 := ref(append(slices.Clone(first), more...))
		if withS1 == 1 {
			want2 = refOp(want2, want1, (*netipx.IPSetBuilder).RemoveSet)
		}
		x4, x6 := s1.lists()
		if !slices.Equal(x4, c4) || !slices.Equal(x6, c6) || !slices.Equal(s1.Ranges(), want1.Ranges()) {
			t.Fatalf("the second Build changed the first set: %v, want %v", s1.Ranges(), want1.Ranges())
		}
		if !slices.Equal(s2.Ranges(), want2.Ranges()) {
			t.Fatalf("second Build = %v, want %v", s2.Ranges(), want2.Ranges())
		}

		// Nothing written over the builder's lists reaches either set.
		c24, c26 := listsOf(s2)
		for i := range b.in4[:cap(b.in4)] {
			b.in4[:cap(b.in4)][i] = 0x0102_0304_0506_0708
		}
		for i := range b.out4[:cap(b.out4)] {
			b.out4[:cap(b.out4)][i] = 0
		}
		for i := range b.in6[:cap(b.in6)] {
			b.in6[:cap(b.in6)][i] = span{U128{1, 2}, U128{3, 4}}
		}
		for i := range b.out6[:cap(b.out6)] {
			b.out6[:cap(b.out6)][i] = span{}
		}
		x4, x6 = s1.lists()
		y4, y6 := s2.lists()
		if !slices.Equal(x4, c4) || !slices.Equal(x6, c6) || !slices.Equal(y4, c24) || !slices.Equal(y6, c26) {
			t.Fatalf("a set shares the builder's lists")
		}
	}
}

// TestMerge4Model checks merge4 against netipx on random packed ranges,
// many at both ends of the space, nested, overlapping, touching and
// repeated, and that it merges in place.
func TestMerge4Model(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 11))
	for i := range 3000 {
		var v []uint64
		var b netipx.IPSetBuilder
		for range rng.IntN(40) {
			var lo, hi uint64
			switch rng.IntN(4) {
			case 0: // near 0.0.0.0
				lo, hi = rng.Uint64N(64), rng.Uint64N(64)
			case 1: // near 255.255.255.255
				lo, hi = mask32-rng.Uint64N(64), mask32-rng.Uint64N(64)
			case 2:
				lo, hi = rng.Uint64N(1<<32), rng.Uint64N(1<<32)
			default: // in a small window: overlapping and touching
				lo, hi = 1<<31+rng.Uint64N(256), 1<<31+rng.Uint64N(256)
			}
			lo, hi = min(lo, hi), max(lo, hi)
			v = append(v, lo<<32|hi)
			b.AddRange(netipx.IPRangeFrom(U128{0, lo}.Addr(32), U128{0, hi}.Addr(32)))
			if rng.IntN(8) == 0 {
				v = append(v, lo<<32|hi) // repeated
			}
		}
		if i%2 == 0 {
			slices.Sort(v) // the sorted path
		}
		in := slices.Clone(v)
		got := merge4(v)
		want, _ := b.IPSet()
		if s := setOfPacked(slices.Clone(got), nil); !slices.Equal(s.Ranges(), want.Ranges()) {
			t.Fatalf("merge4(%#x) = %#x, want %v", in, got, want.Ranges())
		}
		checkLists(t, &Set{v4: got})
		if len(got) > 0 && unsafe.SliceData(got) != unsafe.SliceData(v) {
			t.Fatalf("merge4 did not merge in place")
		}
	}
}

// TestSetNil checks the package's functions on a nil set, which is empty.
func TestSetNil(t *testing.T) {
	var s *Set
	if got, want := Pack(s), Pack(&Set{}); !slices.Equal(got, want) {
		t.Errorf("Pack(nil) = %v, Pack of the empty set %v", got, want)
	}
	if u, err := Unpack(Pack(s)); err != nil || !u.Empty() {
		t.Errorf("Unpack(Pack(nil)) = %v, %v", u, err)
	}
	if p := Prefixes(s); len(p) != 0 {
		t.Errorf("Prefixes(nil) = %v", p)
	}
	if m := MixedBuckets(s, true, 8); len(m) != 0 {
		t.Errorf("MixedBuckets(nil) = %v", m)
	}
	var out strings.Builder
	if err := WriteCIDRs(&out, s); err != nil || out.Len() != 0 {
		t.Errorf("WriteCIDRs(nil) wrote %q, %v", out.String(), err)
	}
	if err := WriteJSON(&out, s, false); err != nil || out.String() != `{"ipv4":[],"ipv6":[]}`+"\n" {
		t.Errorf("WriteJSON(nil) wrote %q, %v", out.String(), err)
	}
	x := FromIPSet(ipsetOf("10.0.0.0/8 10.255.255.255-11.0.0.1 2001:db8::/32"))
	c4, c6 := Count(x)
	if a, b := CoverDiffSets(s, x); a != 0 || b != c4+c6 {
		t.Errorf("CoverDiffSets(nil, x) = %d, %d, want 0, %d", a, b, c4+c6)
	}
	if a, b := CoverDiffSets(x, nil); a != c4+c6 || b != 0 {
		t.Errorf("CoverDiffSets(x, nil) = %d, %d, want %d, 0", a, b, c4+c6)
	}
	if a, b := CoverDiffSet(s, []string{"10.0.0.0/8"}); a != 0 || b != 1 {
		t.Errorf("CoverDiffSet(nil, 10.0.0.0/8) = %d, %d, want 0, 1", a, b)
	}
	if FromIPSet(nil) == nil || !FromIPSet(nil).Empty() {
		t.Errorf("FromIPSet(nil) = %v", FromIPSet(nil))
	}
	if n := s.IPSet(); n == nil || len(n.Ranges()) != 0 {
		t.Errorf("IPSet of nil = %v", n)
	}
}
