package prefix

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"go4.org/netipx"
)

// TestMixedBuckets compares MixedBuckets with the buckets of every length
// that overlap s without lying in it, found by brute force over the
// buckets that hold an edge of a range, on random sets of both families.
func TestMixedBuckets(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 9))
	for i := range 300 {
		is4 := i%2 == 0
		var b netipx.IPSetBuilder
		for range 1 + r.IntN(40) {
			p := randomPrefix(r, is4)
			if r.IntN(4) == 0 {
				b.RemovePrefix(p)
			} else {
				b.AddPrefix(p)
			}
		}
		s, _ := b.IPSet()
		width := map[bool]int{true: 32, false: 128}[is4]
		bits := 1 + r.IntN(width)
		var want []netip.Prefix
		for _, rg := range s.Ranges() {
			if rg.From().Is4() != is4 {
				continue
			}
			for _, a := range []netip.Addr{rg.From(), rg.To()} {
				bk := netip.PrefixFrom(a, bits).Masked()
				if s.OverlapsPrefix(bk) && !s.ContainsPrefix(bk) && !slices.Contains(want, bk) {
					want = append(want, bk)
				}
			}
		}
		slices.SortFunc(want, netipx.ComparePrefix)
		if got := MixedBuckets(FromIPSet(s), is4, bits); !slices.Equal(got, want) {
			t.Fatalf("set %v at /%d: %v, want %v", s.Prefixes(), bits, got, want)
		}
	}
	if d4, d6 := Digest(nil, true), Digest(nil, false); d4 != d6 || len(d4) != 71 {
		t.Errorf("empty digests %s %s", d4, d6)
	}
}

func randomPrefix(r *rand.Rand, is4 bool) netip.Prefix {
	if is4 {
		a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, 8+r.IntN(25)).Masked()
	}
	var a [16]byte
	a[0], a[1], a[2] = 0x20, 0x01, byte(r.IntN(4))
	for k := 3; k < 16; k++ {
		a[k] = byte(r.IntN(256))
	}
	return netip.PrefixFrom(netip.AddrFrom16(a), 16+r.IntN(113)).Masked()
}

// TestPack: Unpack(Pack(s)) is s for random sets of both families and the
// edge cases; bytes Pack did not write are refused, never misread.
func TestPack(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 10))
	var sets []*netipx.IPSet
	for _, ps := range [][]string{nil, {"0.0.0.0/0"}, {"::/0"}, {"0.0.0.0/0", "::/0"}, {"255.255.255.255/32", "0.0.0.0/32"}, {"::/128", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"}} {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		s, _ := b.IPSet()
		sets = append(sets, s)
	}
	for range 200 {
		var b netipx.IPSetBuilder
		for range r.IntN(50) {
			b.AddPrefix(randomPrefix(r, r.IntN(2) == 0))
		}
		s, _ := b.IPSet()
		sets = append(sets, s)
	}
	for _, s := range sets {
		data := Pack(FromIPSet(s))
		got, err := Unpack(data)
		if err != nil || !got.Equal(FromIPSet(s)) || !slices.Equal(got.Ranges(), s.Ranges()) {
			t.Fatalf("%v: %v, %v", s.Prefixes(), err, got)
		}
		// Every truncation and a byte too many are refused.
		for n := range len(data) {
			if _, err := Unpack(data[:n]); err == nil {
				t.Fatalf("%v: %d of %d bytes read", s.Prefixes(), n, len(data))
			}
		}
		if _, err := Unpack(append(data, 0)); err == nil {
			t.Fatalf("%v: a byte too many read", s.Prefixes())
		}
	}
	// Touching or overlapping ranges, and IPv4 values past 32 bits.
	// Values in more bytes than they need, too.
	for _, bad := range [][]byte{{2, 0, 0, 0, 0, 0}, {1, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0}, {1, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0}, {1, 0x80, 0x00, 0, 0}} {
		if _, err := Unpack(bad); err == nil {
			t.Errorf("%v read", bad)
		}
	}
}
