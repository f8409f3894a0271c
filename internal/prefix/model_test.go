package prefix

import (
	"bytes"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go4.org/netipx"
)

// window is a block of 2^windowBits addresses in which the model test
// draws its entries, so that a bitmap can model every address exactly.
const windowBits = 12

type window struct {
	name  string
	is4   bool
	first U128
}

// windows sit at both ends of each family's space (where off-by-one and
// overflow bugs live) and in the middle.
var windows = []window{
	{"0.0.0.0", true, U128{}},
	{"10.1.0.0", true, U128{0, 10<<24 | 1<<16}},
	{"255.255.240.0", true, U128{0, 1<<32 - 1<<windowBits}},
	{"::", false, U128{}},
	{"2001:db8::", false, U128{0x2001_0db8_0000_0000, 0}},
	{"ffff:...:f000", false, U128{^uint64(0), 1<<64 - 1<<windowBits}},
}

func (w window) addr(off uint64) netip.Addr {
	a := U128{w.first.Hi, w.first.Lo + off}
	if w.is4 {
		return a.Addr(32)
	}
	return a.Addr(128)
}

// randomRange returns a random entry inside w, as offsets: a single
// address, an aligned prefix or a range, often at the window's edges.
func randomRange(rng *rand.Rand) (lo, hi uint64) {
	const size = 1 << windowBits
	edge := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return size - 1
		}
		return rng.Uint64N(size)
	}
	switch rng.IntN(3) {
	case 0:
		a := edge()
		return a, a
	case 1:
		n := rng.IntN(windowBits + 1) // host bits
		a := edge() &^ (1<<n - 1)
		return a, a + 1<<n - 1
	}
	a, b := edge(), edge()
	return min(a, b), max(a, b)
}

type op struct {
	r      netipx.IPRange
	remove bool
}

func (o op) String() string {
	if o.remove {
		return "-" + o.r.String()
	}
	return "+" + o.r.String()
}

// TestModel checks Builder, Complement, Count, NumAddrs, Prefixes,
// WriteCIDRs and WriteRanges against a bitmap of every address of a
// window, on random sets of addresses, prefixes and ranges added and
// removed in random order.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	iterations := 3000
	if testing.Short() {
		iterations = 300
	}
	for i := range iterations {
		w := windows[i%len(windows)]
		var model [1 << windowBits]bool
		var ops []op
		var in, out [1 << windowBits]bool
		for range 1 + rng.IntN(30) {
			lo, hi := randomRange(rng)
			remove := rng.IntN(4) == 0
			for a := lo; a <= hi; a++ {
				if remove {
					out[a] = true
				} else {
					in[a] = true
				}
			}
			ops = append(ops, op{netipx.IPRangeFrom(w.addr(lo), w.addr(hi)), remove})
		}
		for a := range model {
			model[a] = in[a] && !out[a]
		}

		var b Builder
		for _, o := range ops { // removals apply whatever the order
			if o.remove {
				b.RemoveRange(o.r)
			} else {
				b.AddRange(o.r)
			}
		}
		set, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		checkSet(t, w, set, model[:], false)

		var cmodel [1 << windowBits]bool
		for a := range model {
			cmodel[a] = !model[a]
		}
		c := Complement(set, w.is4, !w.is4)
		checkSet(t, w, c, cmodel[:], true)
		checkPartition(t, set, c, w.is4)
		if t.Failed() {
			t.Fatalf("iteration %d, window %s, ops (add/remove) %v", i, w.name, ops)
		}
	}
}

// checkPartition checks that Partition gives the prefixes of s (in) and
// of its complement c (out) of one family, in address order, tiling the
// family's space.
func checkPartition(t *testing.T, s, c *Set, is4 bool) {
	t.Helper()
	ref := s.IPSet()
	var want []string
	for _, p := range slices.Concat(Prefixes(s), Prefixes(c)) {
		if p.Addr().Is4() == is4 {
			want = append(want, p.String())
		}
	}
	slices.SortFunc(want, func(a, b string) int {
		return netip.MustParsePrefix(a).Addr().Compare(netip.MustParsePrefix(b).Addr())
	})
	var got []string
	next, done := familyFirst(is4), false
	Partition(s, is4, func(p netip.Prefix, in bool) {
		if done || p.Addr() != next || in != ref.ContainsPrefix(p) {
			t.Errorf("Partition: %s (in %v) does not follow on from %s", p, in, next)
		}
		got = append(got, p.String())
		last := netipx.PrefixLastIP(p)
		next, done = last.Next(), last == familyLast(is4)
	})
	if !done || !slices.Equal(got, want) {
		t.Errorf("Partition gave %v, want %v (to the family's end)", got, want)
	}
}

// checkSet checks that s holds exactly the addresses model marks in w,
// plus, if rest, every other address of w's family and none of the other.
func checkSet(t *testing.T, w window, s *Set, model []bool, rest bool) {
	t.Helper()
	ns := s.IPSet() // netipx's view, the reference below
	want := 0
	for _, in := range model {
		if in {
			want++
		}
	}
	var got [1 << windowBits]bool
	ps := Prefixes(s)
	wlo, whi := w.first, U128{w.first.Hi, w.first.Lo + 1<<windowBits - 1}
	for i, p := range ps {
		if p.Addr().Is4() != w.is4 {
			t.Errorf("prefix %v of the wrong family", p)
			continue
		}
		if p != p.Masked() {
			t.Errorf("prefix %v has host bits", p)
		}
		if i > 0 {
			prev := ps[i-1]
			if !netipx.PrefixLastIP(prev).Less(p.Addr()) {
				t.Errorf("prefixes %v and %v overlap or are out of order", prev, p)
			}
			if prev.Bits() == p.Bits() && prev.Bits() > 0 && mustPrefix(prev.Addr(), prev.Bits()-1) == mustPrefix(p.Addr(), p.Bits()-1) {
				t.Errorf("prefixes %v and %v should have been merged into one", prev, p)
			}
		}
		r := netipx.RangeOfPrefix(p)
		lo, hi := U128From(r.From()), U128From(r.To())
		if (lo.Less(wlo) || whi.Less(hi)) && !rest {
			t.Errorf("prefix %v leaves the window %s", p, w.name)
		}
		if lo.Less(wlo) {
			lo = wlo
		}
		if whi.Less(hi) {
			hi = whi
		}
		for a := lo; !hi.Less(a); a = a.Add64(1) {
			got[a.Sub(wlo).Lo] = true
			if a == hi {
				break
			}
		}
	}
	for a := range model {
		if got[a] != model[a] {
			t.Errorf("window %s offset %d (%v): in output %v, in model %v", w.name, a, w.addr(uint64(a)), got[a], model[a])
			return
		}
	}
	if rest {
		// Everything outside the window is in the set, nothing of the
		// other family.
		below := netipx.IPRangeFrom(familyFirst(w.is4), w.addr(0).Prev())
		above := netipx.IPRangeFrom(w.addr(1<<windowBits-1).Next(), familyLast(w.is4))
		for _, r := range []netipx.IPRange{below, above} {
			if r.IsValid() && !ns.ContainsRange(r) {
				t.Errorf("complement misses %v outside window %s", r, w.name)
			}
		}
		if ns.OverlapsPrefix(netip.PrefixFrom(familyFirst(!w.is4), 0)) {
			t.Errorf("complement holds addresses of the other family")
		}
	}

	// Count, NumAddrs, netipx, WriteCIDRs, WriteRanges agree.
	v4, v6 := Count(s)
	n4, n6 := NumAddrs(s)
	if w.is4 && (v4 != len(ps) || v6 != 0 || !rest && n4 != uint64(want) || n6.Sign() != 0) ||
		!w.is4 && (v6 != len(ps) || v4 != 0 || !rest && n6.Uint64() != uint64(want) || n4 != 0) {
		t.Errorf("Count = %d, %d, NumAddrs = %d, %v; want %d prefixes, %d addresses", v4, v6, n4, n6, len(ps), want)
	}
	if ref := ns.Prefixes(); !slices.Equal(ref, ps) {
		t.Errorf("Prefixes = %v\nnetipx    %v", ps, ref)
	}
	var cidrs, ranges bytes.Buffer
	if err := WriteCIDRs(&cidrs, s); err != nil {
		t.Fatal(err)
	}
	var wantText strings.Builder
	for _, p := range ps {
		wantText.WriteString(p.String() + "\n")
	}
	if cidrs.String() != wantText.String() {
		t.Errorf("WriteCIDRs:\n%s\nwant\n%s", cidrs.String(), wantText.String())
	}
	if err := WriteRanges(&ranges, s); err != nil {
		t.Fatal(err)
	}
	text := ranges.String()
	back, err := ReadSet(&ranges, "ranges")
	if err != nil || !back.Equal(s) || strings.Count(text, "\n") != len(s.Ranges()) {
		t.Errorf("WriteRanges wrote %q, reading back: %v", text, err)
	}
}

func mustPrefix(a netip.Addr, bits int) netip.Prefix {
	p, err := a.Prefix(bits)
	if err != nil {
		panic(err)
	}
	return p
}

func familyFirst(is4 bool) netip.Addr {
	if is4 {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

func familyLast(is4 bool) netip.Addr {
	if is4 {
		return netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	return max6.Addr(128)
}

// TestEdges checks whole-space and one-off-the-edge sets by hand.
func TestEdges(t *testing.T) {
	tests := []struct {
		in         string
		cidrs      string // "*": not checked
		complement string // within the input's families; "": not checked
	}{
		{"0.0.0.0/0", "0.0.0.0/0", ""},
		{"::/0", "::/0", ""},
		{"0.0.0.0", "0.0.0.0/32", "0.0.0.1/32 0.0.0.2/31 0.0.0.4/30 0.0.0.8/29 0.0.0.16/28 0.0.0.32/27 0.0.0.64/26 0.0.0.128/25 0.0.1.0/24 0.0.2.0/23 0.0.4.0/22 0.0.8.0/21 0.0.16.0/20 0.0.32.0/19 0.0.64.0/18 0.0.128.0/17 0.1.0.0/16 0.2.0.0/15 0.4.0.0/14 0.8.0.0/13 0.16.0.0/12 0.32.0.0/11 0.64.0.0/10 0.128.0.0/9 1.0.0.0/8 2.0.0.0/7 4.0.0.0/6 8.0.0.0/5 16.0.0.0/4 32.0.0.0/3 64.0.0.0/2 128.0.0.0/1"},
		{"255.255.255.255", "255.255.255.255/32", "0.0.0.0/1 128.0.0.0/2 192.0.0.0/3 224.0.0.0/4 240.0.0.0/5 248.0.0.0/6 252.0.0.0/7 254.0.0.0/8 255.0.0.0/9 255.128.0.0/10 255.192.0.0/11 255.224.0.0/12 255.240.0.0/13 255.248.0.0/14 255.252.0.0/15 255.254.0.0/16 255.255.0.0/17 255.255.128.0/18 255.255.192.0/19 255.255.224.0/20 255.255.240.0/21 255.255.248.0/22 255.255.252.0/23 255.255.254.0/24 255.255.255.0/25 255.255.255.128/26 255.255.255.192/27 255.255.255.224/28 255.255.255.240/29 255.255.255.248/30 255.255.255.252/31 255.255.255.254/32"},
		{"0.0.0.0 255.255.255.255", "0.0.0.0/32 255.255.255.255/32", ""},
		{"0.0.0.1-255.255.255.254", "*", "0.0.0.0/32 255.255.255.255/32"},
		{"::1-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "*", "::/128 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"},
		{"::/1 8000::/1", "::/0", ""},
		{"1.2.3.4 1.2.3.5", "1.2.3.4/31", ""},                   // touching: merged
		{"1.2.3.5 1.2.3.6", "1.2.3.5/32 1.2.3.6/32", ""},        // touching, not one prefix
		{"1.2.3.0-1.2.3.10 1.2.3.5-1.2.3.15", "1.2.3.0/28", ""}, // overlapping
		{"1.2.3.0/24 1.2.3.128/25 1.2.3.7", "1.2.3.0/24", ""},   // nested
		{"0.0.0.0/1 128.0.0.0/1 ::", "0.0.0.0/0 ::/128", ""},    // both families
		{"1.2.3.4 1.2.3.4 1.2.3.4", "1.2.3.4/32", ""},           // duplicates
		{"", "", "0.0.0.0/0 ::/0"},                              // empty: both families
		{"::ffff:0.0.0.0/96", "0.0.0.0/0", ""},                  // mapped: IPv4
		{"2001:db8::/127 2001:db8::2", "2001:db8::/127 2001:db8::2/128", ""},
	}
	for _, tt := range tests {
		var b Builder
		for _, f := range strings.Fields(tt.in) {
			r, _, err := ParseLine(f)
			if err != nil {
				t.Fatal(err)
			}
			b.AddRange(r)
		}
		s, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		if got := prefixText(s); tt.cidrs != "*" && got != tt.cidrs {
			t.Errorf("%q: cidrs %q, want %q", tt.in, got, tt.cidrs)
		}
		if tt.complement == "" {
			continue
		}
		v4, v6 := b.Len()
		none := v4+v6 == 0
		if got := prefixText(Complement(s, v4 > 0 || none, v6 > 0 || none)); got != tt.complement {
			t.Errorf("%q: complement %q, want %q", tt.in, got, tt.complement)
		}
	}
}

func prefixText(s *Set) string {
	var b strings.Builder
	for i, p := range Prefixes(s) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p.String())
	}
	return b.String()
}

func TestComplementFamilies(t *testing.T) {
	s, err := ReadSet(strings.NewReader("10.0.0.0/8\n2001:db8::/32\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	full := Complement(Complement(s, true, true), true, true)
	if !full.Equal(s) {
		t.Errorf("complement of complement = %v", full.Ranges())
	}
	only4 := Complement(s, true, false)
	if v4, v6 := Count(only4); v4 != 8 || v6 != 0 {
		t.Errorf("IPv4-only complement has %d, %d prefixes: %v", v4, v6, Prefixes(only4))
	}
	if got := Complement(s, false, false); len(got.Ranges()) != 0 {
		t.Errorf("complement within no family = %v", got.Ranges())
	}
	if got := prefixText(Complement(nil, true, true)); got != "0.0.0.0/0 ::/0" {
		t.Errorf("complement of nil = %v", got)
	}
}

// TestForEachCIDRCount checks the prefix count of [0, n] against the
// closed form: one prefix per set bit of n+1 (n+1 < 2^32).
func TestForEachCIDRCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		n := rng.Uint64N(1<<32 - 1)
		if got, want := countCIDRs(U128{}, U128{0, n}, 32), bits.OnesCount64(n+1); got != want {
			t.Fatalf("countCIDRs(0, %d) = %d, want %d", n, got, want)
		}
	}
}
