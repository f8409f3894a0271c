package plan

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

// replayCases are sets and options of every shape the chooser meets.
func replayCases(r *rand.Rand) []replayCase {
	var cases []replayCase
	for i := range 4 {
		for _, is4 := range []bool{true, false} {
			cases = append(cases,
				replayCase{fmt.Sprintf("random%d", i), randomSet(r, is4, 50+r.IntN(3000)), is4, Options{PassIsIn: i%2 == 0}},
				replayCase{fmt.Sprintf("small-networks%d", i), smallNetworks(r, is4, 200+r.IntN(2000)), is4, Options{PassIsIn: i%2 == 1}},
				replayCase{fmt.Sprintf("scattered%d", i), scattered(r, is4, 2000+r.IntN(4000)), is4, Options{PassIsIn: i%2 == 0}},
			)
		}
	}
	noBitmap := DefaultModel
	noBitmap.BitmapLookup = 0
	return append(cases,
		replayCase{"short-prefixes", set("0.0.0.0/3", "64.0.0.0/6", "96.1.2.0/24", "128.0.0.0/1", "10.0.0.7/32"), true, Options{PlainMax: -1}},
		replayCase{"no-bitmap", scattered(r, true, 3000), true, Options{Model: noBitmap, PassIsIn: true}},
		replayCase{"strides", scattered(r, true, 3000), true, Options{Strides4: []int{4, 16, 24, 32}}},
		replayCase{"strides6", scattered(r, false, 3000), false, Options{Strides6: []int{32, 48, 64, 128}}},
		replayCase{"element-limit", scattered(r, true, 3000), true, Options{MaxEntries: 6000}},
		replayCase{"deep", deepSet(), true, Options{Strides4: []int{8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 31, 32}}},
	)
}

type replayCase struct {
	name string
	s    *prefix.Set
	is4  bool
	opt  Options
}

// deepSet needs more levels than MaxDepth at one level per two bits:
// its deepest buckets go to the rest interval set.
func deepSet() *prefix.Set {
	return set("10.0.0.1/32", "10.0.0.4/31", "10.0.0.64/28", "10.200.3.0/24")
}

// TestReplay: the choices Build records, replayed on the same set (also
// after a trip through their text form), give the very layout Build
// chose, entry for entry: levels, root, bitmap order, rest set and cost
// estimate.
func TestReplay(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 3))
	for _, c := range replayCases(r) {
		t.Run(c.name+familyName(c.is4), func(t *testing.T) {
			opt := c.opt
			opt.Record = true
			want, err := Build(c.s, c.is4, opt)
			if err != nil {
				t.Fatal(err)
			}
			if want.Kind != KindTree {
				t.Fatalf("kind %s, want a tree", want.Kind)
			}
			text, err := want.Choices.MarshalText()
			if err != nil {
				t.Fatal(err)
			}
			var ch Choices
			if err := ch.UnmarshalText(text); err != nil {
				t.Fatalf("%v\n%s", err, text)
			}
			if !reflect.DeepEqual(&ch, want.Choices) {
				t.Fatalf("choices changed on their way through text")
			}
			opt.Record = false
			got, err := Replay(c.s, c.is4, opt, &ch)
			if err != nil {
				t.Fatal(err)
			}
			want.Choices, want.objective = nil, 0
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("replayed layout differs: %d elements, strides %v, root %d; want %d, %v, %d",
					got.Entries(), got.Strides(), got.Root, want.Entries(), want.Strides(), want.Root)
			}
			checkLayout(t, c.s, got, probes(r, c.s, c.is4, 300))
			t.Logf("%d choices, %d elements, %d bytes of text", len(ch.Descend), got.Entries(), len(text))
		})
	}
}

// TestReplayRefuses: choices for another set, or that do not fit it, are
// refused; choices with other defaults still give a layout of exactly
// the set (they cannot make it wrong, only slower).
func TestReplayRefuses(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 4))
	s := scattered(r, true, 3000)
	l, err := Build(s, true, Options{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	ch := l.Choices
	if !ch.Bitmap || len(ch.Descend) < 100 {
		t.Fatalf("want a bitmap root and many choices: %v, %d", ch.Bitmap, len(ch.Descend))
	}
	refused := func(name string, s *prefix.Set, ch *Choices) {
		t.Helper()
		if _, err := Replay(s, true, Options{}, ch); !errors.Is(err, ErrChoices) {
			t.Errorf("%s: %v, want ErrChoices", name, err)
		}
	}
	clone := func(edit func(*Choices)) *Choices {
		c := *ch
		c.Descend = slices.Clone(ch.Descend)
		edit(&c)
		return &c
	}
	refused("another set", scattered(r, true, 3000), ch)
	refused("the other family", s, clone(func(c *Choices) { c.Is4 = false }))
	refused("a choice missing", s, clone(func(c *Choices) { c.Descend = slices.Delete(c.Descend, 50, 51) }))
	refused("the last choice missing", s, clone(func(c *Choices) { c.Descend = c.Descend[:len(c.Descend)-1] }))
	refused("a choice too many", s, clone(func(c *Choices) { c.Descend = append(c.Descend, Choice{Child: 32}) }))
	refused("a choice not deeper", s, clone(func(c *Choices) { c.Descend[10].Child = 1 }))
	refused("a top choice below", s, clone(func(c *Choices) {
		for i := range c.Descend {
			if !c.Descend[i].Top {
				c.Descend[i].Top = true
				return
			}
		}
	}))
	// The first choice is a /16 bucket's under the bitmap root, which
	// every other /16 bucket shares.
	refused("bitmap children apart", s, clone(func(c *Choices) { c.Descend[0].Child++ }))
	refused("a bitmap root elsewhere", s, clone(func(c *Choices) { c.Root = 20 }))
	// The bitmap's order is the kernel's rules: a kind left out would
	// lose its packets.
	refused("a bitmap kind left out", s, clone(func(c *Choices) { c.Order = c.Order[1:] }))
	refused("a bitmap kind twice", s, clone(func(c *Choices) { c.Order = append(c.Order[1:], c.Order[0], c.Order[0]) }))
	refused("a bitmap kind absent", s, clone(func(c *Choices) { c.Order = append(slices.Clone(c.Order[:len(c.Order)-1]), DescendRest) }))
	// A set that differs by one address changes the digest: refused even
	// if every bucket's choice would still do.
	refused("one address more", prefixSetPlus(s, "1.0.0.0/32"), ch)
	// Choices that name the set's digest where it has no tree: an
	// empty family, or every address.
	refused("an empty family", set("2001:db8::/32"), clone(func(c *Choices) { c.Set = prefix.Digest(nil, true) }))
	refused("an empty family, no choices", set("2001:db8::/32"), clone(func(c *Choices) {
		c.Set, c.Root, c.RootIn, c.Bitmap, c.Order, c.Descend = prefix.Digest(nil, true), 8, false, false, nil, nil
	}))
	refused("every address", set("0.0.0.0/0"), clone(func(c *Choices) { c.Set = prefix.Digest(set("0.0.0.0/0"), true) }))

	// Other defaults below the root (without a bitmap root, whose order
	// names the kinds present) give another layout of exactly the set.
	noBitmap := DefaultModel
	noBitmap.BitmapLookup = 0
	plain, err := Build(s, true, Options{Record: true, Model: noBitmap})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		c := *plain.Choices
		c.Descend = slices.Clone(c.Descend)
		for k := range c.Descend {
			if r.IntN(3) == 0 {
				c.Descend[k].In = r.IntN(2) == 0
			}
		}
		got, err := Replay(s, true, Options{}, &c)
		if err != nil {
			t.Fatalf("defaults flipped %d: %v", i, err)
		}
		checkLayout(t, s, got, probes(r, s, true, 300))
	}
}

func prefixSetPlus(s *prefix.Set, p string) *prefix.Set {
	var b prefix.Builder
	b.AddSet(s)
	b.AddSet(set(p))
	out, _ := b.Build()
	return out
}

// TestChoicesText: malformed text is refused with the line at fault.
func TestChoicesText(t *testing.T) {
	head := "tree IPv4 root=16 in bitmap set=sha256-" + strings.Repeat("ab", 32) + " cost=0.5,1 order=in,descend-out\n"
	for _, c := range []struct{ name, text, want string }{
		{"empty", "", "want a header line"},
		{"no choices line", head, "want a header line"},
		{"two lines", head + "24i\n24i\n", "want a header line"},
		{"header", "tree IPv4 root=16 in\n\n", "header"},
		{"cost", strings.Replace(head, "cost=0.5,1", "cost=NaN,1", 1) + "24i\n", "cost"},
		{"cost too high", strings.Replace(head, "cost=0.5,1", "cost=0.5,99", 1) + "24i\n", "cost"},
		{"cost form", strings.Replace(head, "cost=0.5,1", "cost=0.50,1", 1) + "24i\n", "not in the form"},
		{"order", strings.Replace(head, "order=in,descend-out", "order=in,sideways", 1) + "24i\n", "order"},
		{"root", strings.Replace(head, "root=16", "root=33", 1) + "\n", "root length"},
		{"too deep", head + "24i33o\n", "choice 2 (byte 4)"},
		{"zero", head + "0i\n", "choice 1"},
		{"no verdict", head + "24i24\n", "choice 2"},
		{"verdict", head + "24x\n", "choice 1"},
		{"long number", head + "0024i\n", "choice 1"},
		{"leading space", head + " 24i\n", "choice 1"},
		{"two spaces", head + "24i  24i\n", "choice 2"},
		{"trailing space", head + "24i \n", "choice 2"},
		{"root sign", strings.Replace(head, "root=16", "root=+16", 1) + "24i\n", "not in the form"},
		{"root zero", strings.Replace(head, "root=16", "root=016", 1) + "24i\n", "not in the form"},
		{"header spaces", strings.Replace(head, " in ", "  in ", 1) + "24i\n", "not in the form"},
		{"digest", "tree IPv4 root=16 in bitmap set=sha256-zz cost=0,0 order=-\n24i\n", "set digest"},
	} {
		var ch Choices
		err := ch.UnmarshalText([]byte(c.text))
		if !errors.Is(err, ErrChoices) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrChoices with %q", c.name, err, c.want)
		}
	}
	var ch Choices
	if err := ch.UnmarshalText([]byte(head + "24i28o 20o\n")); err != nil || !reflect.DeepEqual(ch.Descend, []Choice{{24, true, true}, {28, false, false}, {20, false, true}}) {
		t.Fatalf("%v, %v", err, ch.Descend)
	}
	if err := ch.UnmarshalText([]byte("tree IPv6 root=32 out maps set=sha256-" + strings.Repeat("cd", 32) + " cost=1,1.25 order=-\n\n")); err != nil || ch.Is4 || ch.Root != 32 || ch.RootIn || len(ch.Descend) != 0 {
		t.Fatalf("%v, %+v", err, ch)
	}
}

// TestCompileReplays: a rule given the choices of its set replays them;
// given choices of another set, it says so and searches, with the same
// result as without choices. Building a rule's families at once
// (Parallel, a publisher's) changes none of it.
func TestCompileReplays(t *testing.T) {
	for _, parallel := range []bool{false, true} {
		t.Run(fmt.Sprint("parallel=", parallel), func(t *testing.T) { testCompileReplays(t, Options{Parallel: parallel}) })
	}
}

func testCompileReplays(t *testing.T, opt Options) {
	r := rand.New(rand.NewPCG(25, 5))
	withRecord := opt
	withRecord.Record = true
	s4, s6 := scattered(r, true, 2000), scattered(r, false, 2000)
	var b prefix.Builder
	b.AddSet(s4)
	b.AddSet(s6)
	s, _ := b.Build()
	in := func(c4, c6 *Choices) *Input {
		return &Input{Rules: []RuleInput{{Name: "feed", Action: Drop, IPv4: true, IPv6: true, Set: s, Chosen4: c4, Chosen6: c6}}}
	}
	pub, err := Compile(in(nil, nil), withRecord)
	if err != nil {
		t.Fatal(err)
	}
	want := pub.Rules[0]
	if want.Replayed || want.V4.Choices == nil || want.V6.Choices == nil {
		t.Fatalf("publisher: replayed %v, choices %v %v", want.Replayed, want.V4.Choices, want.V6.Choices)
	}
	got, err := Compile(in(want.V4.Choices, want.V6.Choices), opt)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Rules[0]; !g.Replayed || g.ReplayNote != "" || !reflect.DeepEqual(g.V4.Levels, want.V4.Levels) || !reflect.DeepEqual(g.V6.Levels, want.V6.Levels) {
		t.Fatalf("replayed %v (%s), same levels %v %v", g.Replayed, g.ReplayNote,
			reflect.DeepEqual(g.V4.Levels, want.V4.Levels), reflect.DeepEqual(g.V6.Levels, want.V6.Levels))
	}
	other, err := Build(scattered(r, true, 2000), true, Options{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err = Compile(in(other.Choices, nil), opt)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Rules[0]; g.Replayed || !strings.Contains(g.ReplayNote, "another set") || !reflect.DeepEqual(g.V4.Levels, want.V4.Levels) {
		t.Fatalf("replayed %v (%q), same levels as searched %v", g.Replayed, g.ReplayNote, reflect.DeepEqual(g.V4.Levels, want.V4.Levels))
	}
	// Each family's own: IPv4 searched, IPv6 replayed, the notes in
	// family order.
	got, err = Compile(in(other.Choices, want.V4.Choices), opt)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Rules[0]; g.Replayed || !strings.HasPrefix(g.ReplayNote, "IPv4: ") || !strings.Contains(g.ReplayNote, "; IPv6: ") || !reflect.DeepEqual(g.V6.Levels, want.V6.Levels) {
		t.Fatalf("replayed %v (%q)", g.Replayed, g.ReplayNote)
	}
	got, err = Compile(in(other.Choices, want.V6.Choices), opt)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Rules[0]; !g.Replayed || strings.Contains(g.ReplayNote, "IPv6") || !reflect.DeepEqual(g.V6.Levels, want.V6.Levels) || !reflect.DeepEqual(g.V4.Levels, want.V4.Levels) {
		t.Fatalf("IPv6 replayed, IPv4 searched: replayed %v (%q)", g.Replayed, g.ReplayNote)
	}
	got, err = Compile(&Input{Backend: IPSet, Rules: in(want.V4.Choices, want.V6.Choices).Rules}, opt)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Rules[0]; g.Replayed || !strings.Contains(g.ReplayNote, "ipset") {
		t.Fatalf("ipset: replayed %v (%q)", g.Replayed, g.ReplayNote)
	}
}
