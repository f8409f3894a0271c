package plan

import (
	"context"

	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// wholeFamily builds s's layout of family is4 with the chooser over the
// whole family at once (one chunk): the programme as it was before it ran
// chunk by chunk, the reference for TestChunkedChooser.
func wholeFamily(t *testing.T, s *prefix.Set, is4 bool, opt Options) (*Layout, error) {
	t.Helper()
	defer func(b, b6 int) { chunkBits, chunkBits6 = b, b6 }(chunkBits, chunkBits6)
	chunkBits, chunkBits6 = 0, 0
	return Build(s, is4, opt)
}

// TestChunkedChooser: the chooser run one /8 at a time chooses the layout
// the whole-family programme chooses, element for element, on random
// sets, scattered addresses (most pieces in the complement), small
// networks, sets with prefixes shorter than a chunk, IPv4 and IPv6, both
// kinds of rule, with and without a Bitmap root, at forced strides and
// under an element limit that makes the price go up.
func TestChunkedChooser(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 1))
	type tc struct {
		name string
		s    *prefix.Set
		is4  bool
		opt  Options
	}
	var cases []tc
	for i := range 6 {
		for _, is4 := range []bool{true, false} {
			cases = append(cases,
				tc{fmt.Sprintf("random%d", i), randomSet(r, is4, 50+r.IntN(3000)), is4, Options{PassIsIn: i%2 == 0}},
				tc{fmt.Sprintf("small-networks%d", i), smallNetworks(r, is4, 200+r.IntN(2000)), is4, Options{PassIsIn: i%2 == 1}},
				tc{fmt.Sprintf("scattered%d", i), scattered(r, is4, 2000+r.IntN(4000)), is4, Options{PassIsIn: i%2 == 0}},
			)
		}
	}
	noBitmap := DefaultModel
	noBitmap.BitmapLookup = 0
	cases = append(cases,
		tc{"short-prefixes", set("0.0.0.0/3", "64.0.0.0/6", "96.1.2.0/24", "128.0.0.0/1", "10.0.0.7/32"), true, Options{}},
		tc{"no-bitmap", scattered(r, true, 3000), true, Options{Model: noBitmap, PassIsIn: true}},
		tc{"strides", scattered(r, true, 3000), true, Options{Strides4: []int{4, 16, 24, 32}}},
		tc{"strides6", scattered(r, false, 3000), false, Options{Strides6: []int{32, 48, 64, 128}}},
		tc{"element-limit", scattered(r, true, 3000), true, Options{MaxEntries: 4000}},
	)
	for _, c := range cases {
		t.Run(c.name+familyName(c.is4), func(t *testing.T) {
			want, werr := wholeFamily(t, c.s, c.is4, c.opt)
			got, gerr := Build(c.s, c.is4, c.opt)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("chunked: %v, whole family: %v", gerr, werr)
			}
			if werr != nil {
				return
			}
			sameLayout(t, got, want)
			checkLayout(t, c.s, got, probes(r, c.s, c.is4, 300))
		})
	}
	if testing.Short() {
		return
	}
	// Real data: the built-in country mixes, and a 50k-line feed.
	for _, cc := range [][]string{{"IT"}, {"US", "CA"}, {"DE", "FR", "GB", "NL", "PL", "RU", "UA"}} {
		s := countrySet(t, cc...)
		for _, is4 := range []bool{true, false} {
			t.Run(fmt.Sprint(cc, familyName(is4)), func(t *testing.T) {
				want, err := wholeFamily(t, s, is4, Options{PassIsIn: true})
				if err != nil {
					t.Fatal(err)
				}
				got, err := Build(s, is4, Options{PassIsIn: true})
				if err != nil {
					t.Fatal(err)
				}
				sameLayout(t, got, want)
			})
		}
	}
}

// sameLayout fails unless a is as good a layout as b, the reference, by
// the chooser's own measure: the same objective (lookups + price ×
// elements) and the same number of elements, to rounding. Where two
// child lengths tie, which one wins depends on the rounding of the
// traffic's prefix sums, which differs between a chunk and the family.
// Most layouts come out identical; sameLayout logs how many levels do.
func sameLayout(t *testing.T, a, b *Layout) {
	t.Helper()
	if a.Kind != b.Kind || a.Prefixes != b.Prefixes || a.RootIn != b.RootIn {
		t.Fatalf("layouts differ: %v kind %s, %d prefixes, root in %v; want %v kind %s, %d prefixes, root in %v",
			a.Strides(), a.Kind, a.Prefixes, a.RootIn, b.Strides(), b.Kind, b.Prefixes, b.RootIn)
	}
	if math.Abs(a.objective-b.objective) > 1e-9*max(1, b.objective) {
		t.Fatalf("objective %.12g, want %.12g", a.objective, b.objective)
	}
	if d := a.Entries() - b.Entries(); d < -2 || d > 2 || !slices.Equal(a.Rest, b.Rest) || !slices.Equal(a.Plain, b.Plain) {
		t.Fatalf("%d elements and %d rest prefixes, want %d and %d", a.Entries(), len(a.Rest), b.Entries(), len(b.Rest))
	}
	same := len(a.Levels) == len(b.Levels)
	for i := 0; same && i < len(a.Levels); i++ {
		same = slices.Equal(entriesOf(&a.Levels[i]), entriesOf(&b.Levels[i]))
	}
	t.Logf("objective %.9g, %d elements, identical: %v", a.objective, a.Entries(), same)
}

// scattered is n single addresses and /24s (IPv6: /128s and /64s) spread
// over the address space, as a threat feed: most pieces of its partition
// are in the complement.
func scattered(r *rand.Rand, is4 bool, n int) *prefix.Set {
	var b prefix.Builder
	for i := range n {
		if is4 {
			a := netip.AddrFrom4([4]byte{byte(1 + r.IntN(223)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
			b.AddPrefix(netip.PrefixFrom(a, []int{32, 32, 32, 24}[i%4]).Masked())
			continue
		}
		var a [16]byte
		a[0], a[1] = 0x20|byte(r.IntN(16)), byte(r.IntN(256))
		for k := 2; k < 16; k++ {
			a[k] = byte(r.IntN(256))
		}
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom16(a), []int{128, 128, 128, 64}[i%4]).Masked())
	}
	s, _ := b.Build()
	return s
}

// countrySet is the built-in country data's set of the given countries.
func countrySet(t *testing.T, cc ...string) *prefix.Set {
	t.Helper()
	var l source.Loader
	src, err := l.Load(context.Background(), source.Spec{Name: "geo", Format: source.FormatCountryCSV,
		Paths: []string{source.BuiltinPrefix + geo.IPv4, source.BuiltinPrefix + geo.IPv6}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Countries(cc, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// entriesOf is the entries of lv, in order.
func entriesOf(lv *Level) []Entry {
	out := make([]Entry, 0, lv.Len())
	for _, e := range lv.All() {
		out = append(out, e)
	}
	return out
}

// TestChoiceLog: the log reads back what was written, in order, across
// blocks, and lets each block go once it is read.
func TestChoiceLog(t *testing.T) {
	var l choiceLog
	for _, n := range []int{0, 1, choiceBlock, 3*choiceBlock + 17} {
		l.reset()
		for i := range n {
			l.add(byte(i * 7))
		}
		if want := (n + choiceBlock - 1) / choiceBlock; len(l.blocks) != want {
			t.Fatalf("n=%d: %d blocks, want %d", n, len(l.blocks), want)
		}
		for i := range n {
			if b := l.next(); b != byte(i*7) {
				t.Fatalf("n=%d: choice %d = %d, want %d", n, i, b, byte(i*7))
			}
			left := (n+choiceBlock-1)/choiceBlock - (i+1)/choiceBlock
			if i+1 == n {
				left = 0
			}
			if len(l.blocks) != left {
				t.Fatalf("n=%d: after %d read, %d blocks kept, want %d", n, i+1, len(l.blocks), left)
			}
		}
	}
}
