package prefix

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/radixsort"
)

func TestBuilderZero(t *testing.T) {
	var b Builder
	s, err := b.Build()
	if err != nil || s == nil || len(s.Ranges()) != 0 {
		t.Errorf("zero Builder: %v, %v", s, err)
	}
	if v4, v6 := b.Len(); v4 != 0 || v6 != 0 {
		t.Errorf("zero Builder Len = %d, %d", v4, v6)
	}
}

func TestBuilderErrors(t *testing.T) {
	var b Builder
	b.Add(netip.MustParseAddr("10.0.0.1"))
	b.Add(netip.Addr{})
	b.AddRange(netipx.IPRangeFrom(netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.0.5")))
	b.AddRange(netipx.IPRangeFrom(netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("::1")))
	b.AddPrefix(netip.Prefix{})
	b.Add(netip.MustParseAddr("fe80::1%eth0"))
	b.RemovePrefix(netip.Prefix{})
	s, err := b.Build()
	if err == nil {
		t.Fatal("Build: no error for invalid input")
	}
	for _, want := range []string{"adding invalid address: missing address", "ends before it starts", "mixes IPv4 and IPv6", "adding invalid prefix", "has an IPv6 zone", "removing invalid prefix"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Build error %q does not say %q", err, want)
		}
	}
	// The valid input is kept, the errors are cleared.
	if got := prefixText(s); got != "10.0.0.1/32" {
		t.Errorf("Build = %v, want the valid entry", got)
	}
	if _, err := b.Build(); err != nil {
		t.Errorf("second Build: %v, want errors cleared", err)
	}

	// Many errors: the first few, then a count.
	for range maxBuildErrs + 5 {
		b.Add(netip.Addr{})
	}
	_, err = b.Build()
	if err == nil || strings.Count(err.Error(), "missing address") != maxBuildErrs || !strings.Contains(err.Error(), "and 5 more") {
		t.Errorf("Build error with %d invalid entries: %v", maxBuildErrs+5, err)
	}
}

// TestBuilderOrder checks that removals apply whatever the order of calls,
// and that Build can be called between them.
func TestBuilderOrder(t *testing.T) {
	p := netip.MustParsePrefix
	var a, b Builder
	a.AddPrefix(p("10.0.0.0/8"))
	a.RemovePrefix(p("10.1.0.0/16"))
	a.AddPrefix(p("10.1.2.0/24")) // still removed
	a.AddPrefix(p("2001:db8::/32"))
	a.Remove(netip.MustParseAddr("2001:db8::"))
	b.Remove(netip.MustParseAddr("2001:db8::"))
	b.RemovePrefix(p("10.1.0.0/16"))
	b.AddPrefix(p("2001:db8::/32"))
	if _, err := b.Build(); err != nil { // Build in the middle changes nothing
		t.Fatal(err)
	}
	b.AddPrefix(p("10.1.2.0/24"))
	b.AddPrefix(p("10.0.0.0/8"))
	sa, _ := a.Build()
	sb, _ := b.Build()
	if !sa.Equal(sb) {
		t.Errorf("order matters: %v vs %v", prefixText(sa), prefixText(sb))
	}
	var ref netipx.IPSetBuilder
	ref.AddPrefix(p("10.0.0.0/8"))
	ref.AddPrefix(p("2001:db8::/32"))
	ref.RemovePrefix(p("10.1.0.0/16"))
	ref.Remove(netip.MustParseAddr("2001:db8::"))
	if want, _ := ref.IPSet(); !sa.Equal(FromIPSet(want)) || !slices.Equal(sa.Ranges(), want.Ranges()) {
		t.Errorf("got  %v\nwant %v", prefixText(sa), want.Prefixes())
	}
	if v4, v6 := a.Len(); v4 == 0 || v6 == 0 {
		t.Errorf("Len = %d, %d, want both families", v4, v6)
	}
}

func TestBuilderSets(t *testing.T) {
	x, _ := ReadSet(strings.NewReader("10.0.0.0/8\n2001:db8::/32\n"), "x")
	y, _ := ReadSet(strings.NewReader("10.0.0.0/9\n2001:db8::/33\n"), "y")
	var b Builder
	b.AddSet(x)
	b.AddSet(nil)
	b.RemoveSet(y)
	b.RemoveSet(nil)
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if got := prefixText(s); got != "10.128.0.0/9 2001:db8:8000::/33" {
		t.Errorf("x - y = %s", got)
	}
	if v4, v6 := Count(nil); v4 != 0 || v6 != 0 {
		t.Errorf("Count(nil) = %d, %d", v4, v6)
	}
}

// TestBuilderVsNetipx compares Builder with netipx.IPSetBuilder on large
// random inputs of both families, with removals.
func TestBuilderVsNetipx(t *testing.T) {
	for seed := range uint64(3) {
		var rr []netipx.IPRange
		in := synthetic(20_000, seed, true)
		if err := Read(strings.NewReader(string(in)), "synthetic", func(r netipx.IPRange, _ int) { rr = append(rr, r) }); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 9))
		var ours Builder
		var ref netipx.IPSetBuilder
		var removed []netipx.IPRange
		for _, r := range rr {
			if rng.IntN(10) == 0 {
				removed = append(removed, r)
				ours.RemoveRange(r)
				continue
			}
			ours.AddRange(r)
			ref.AddRange(r)
		}
		for _, r := range removed { // netipx: removals after the additions
			ref.RemoveRange(r)
		}
		got, err := ours.Build()
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.IPSet()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Ranges(), want.Ranges()) || !got.Equal(FromIPSet(want)) || !got.IPSet().Equal(want) {
			t.Fatalf("seed %d: Builder and netipx differ: %d vs %d ranges", seed, len(got.Ranges()), len(want.Ranges()))
		}
		if len(got.Ranges()) < 1000 {
			t.Fatalf("seed %d: only %d ranges: the input merges too much to test much", seed, len(got.Ranges()))
		}
	}
}

// TestMerge checks the merging step itself on edge cases by hand (see
// TestMerge4Model for random input): touching, overlapping and nested
// ranges, and ranges at both ends of each family's space.
func TestMerge(t *testing.T) {
	v4 := merge4([]uint64{9<<32 | 12, 1<<32 | 4, 5<<32 | 5, 13<<32 | 13, 6<<32 | 7, 0xffff_fffe<<32 | 0xffff_fffe, 0xffff_ffff<<32 | 0xffff_ffff, 20<<32 | 40, 21<<32 | 22, 20<<32 | 30, 0})
	want4 := []uint64{7, 9<<32 | 13, 20<<32 | 40, 0xffff_fffe<<32 | 0xffff_ffff}
	if !slices.Equal(v4, want4) {
		t.Errorf("merge4 = %v, want %v", v4, want4)
	}
	v6 := merge([]span{{U128{0, 5}, U128{0, 5}}, {U128{0, 0}, U128{0, 4}}, {U128{1, 0}, max6}, {U128{0, ^uint64(0)}, U128{0, ^uint64(0)}}})
	want6 := []span{{U128{0, 0}, U128{0, 5}}, {U128{0, ^uint64(0)}, max6}}
	if !slices.Equal(v6, want6) {
		t.Errorf("merge = %v, want %v", v6, want6)
	}
	if got := merge4(nil); got != nil {
		t.Errorf("merge4(nil) = %v", got)
	}
	if got := merge4([]uint64{0<<32 | 0xffff_ffff, 5<<32 | 6}); !slices.Equal(got, []uint64{0<<32 | 0xffff_ffff}) {
		t.Errorf("merge4 of the whole space and a range in it = %v", got)
	}
}

// TestSort4 checks the radix sort against slices.Sort, on first addresses.
func TestSort4(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, radixsort.Min - 1, radixsort.Min, 50_000} {
		for _, spread := range []uint64{1 << 32, 1 << 24, 1 << 16, 1 << 8, 1} { // 4, 3, 2, 1, 0 bytes vary: even and odd passes
			v := make([]uint64, n)
			for i := range v {
				v[i] = rng.Uint64N(spread)<<32 | uint64(rng.Uint32())
			}
			want := slices.Clone(v)
			slices.Sort(want)
			sort4(v)
			for i := range v {
				if v[i]>>32 != want[i]>>32 {
					t.Fatalf("n=%d spread=%d: sort4 puts first address %d at %d, want %d", n, spread, v[i]>>32, i, want[i]>>32)
				}
			}
			slices.Sort(v)
			if !slices.Equal(v, want) {
				t.Fatalf("n=%d spread=%d: sort4 lost or changed entries", n, spread)
			}
		}
	}
}

func TestBuilderLen(t *testing.T) {
	var b Builder
	b.AddPrefix(netip.MustParsePrefix("10.0.0.0/24"))
	b.AddPrefix(netip.MustParsePrefix("10.0.1.0/24"))
	b.RemovePrefix(netip.MustParsePrefix("10.0.0.0/8"))
	if v4, v6 := b.Len(); v4 != 2 || v6 != 0 {
		t.Errorf("Len = %d, %d before Build", v4, v6)
	}
	s, _ := b.Build()
	if v4, v6 := b.Len(); v4 != 1 || v6 != 0 || len(s.Ranges()) != 0 {
		t.Errorf("Len = %d, %d after Build of %v: want 1, 0 (merged; removal does not count)", v4, v6, s.Ranges())
	}
}
