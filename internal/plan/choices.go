package plan

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ipfence/ipfence/internal/prefix"
)

// Choices are what the layout chooser decided for one family of one
// rule's set: the root's child length and default, whether the root is a
// Bitmap level, and each mixed bucket's child length and default. With
// them Replay builds the same tree from the same set in one pass, without
// the search (a fleet agent runs the layout its publisher chose).
//
// Choices cannot make a layout wrong: Replay emits the elements from the
// set itself, and the choices only say where each mixed bucket looks
// next. Choices that do not fit the set (another set, a bucket without a
// choice, a child length that does not go deeper) are refused, never
// guessed at.
type Choices struct {
	Is4 bool
	// Set is the digest of the family's addresses the choices were made
	// for (prefix.Digest).
	Set    string
	Root   int // the root's child length
	RootIn bool
	Bitmap bool
	// Cost is the chooser's estimate (Layout.Cost), and Order a Bitmap
	// root's rule order (Level.Order): both come from the traffic model,
	// which the replay does not evaluate.
	Cost  CostEstimate
	Order []EntryKind
	// Descend are the mixed buckets' choices in the order Replay meets
	// them: address order, a bucket before the buckets within it. The
	// set says which buckets are mixed, so the choices need no keys.
	Descend []Choice
}

// Choice is a mixed bucket's: look up its children at length Child,
// absent keys meaning In (else out). Top marks the buckets at the root's
// child length: each starts the choices of its part of the tree, which a
// fleet's difference bundle copies or replaces whole.
type Choice struct {
	Child uint8
	In    bool
	Top   bool
}

// ErrChoices is returned for choices that do not fit the set.
var ErrChoices = errors.New("layout choices do not fit the set")

// record is what l, a tree just built from s, chose.
func record(l *Layout, s *prefix.Set) *Choices {
	ch := &Choices{Is4: l.Is4, Set: prefix.Digest(s, l.Is4), Root: l.Levels[l.Root].Bits, RootIn: l.RootIn, Bitmap: l.BitmapRoot(),
		Cost: l.Cost, Order: slices.Clone(l.Levels[l.Root].Order)}
	var ds []Entry
	for _, lv := range l.Levels {
		for _, e := range lv.All() {
			if e.Kind == DescendIn || e.Kind == DescendOut {
				ds = append(ds, e)
			}
		}
	}
	slices.SortFunc(ds, func(a, b Entry) int {
		if c := bytes.Compare(a.addr[:], b.addr[:]); c != 0 {
			return c
		}
		return int(a.bits) - int(b.bits)
	})
	ch.Descend = make([]Choice, len(ds))
	for i, e := range ds {
		ch.Descend[i] = Choice{Child: e.next, In: e.Kind == DescendIn, Top: int(e.bits) == ch.Root}
	}
	return ch
}

// replay feeds a treeBuilder the recorded choices in the order it meets
// the mixed buckets.
type replay struct {
	choices []Choice
	k       int
	shared  uint8 // under a Bitmap root: the child length of every /16 bucket
	err     error
}

// next is the choice for the mixed bucket key (at depth) that starts at
// piece i.
func (r *replay) next(c *chooser, key netip.Prefix, i, depth int) (dpBucket, bool) {
	if r.k >= len(r.choices) {
		r.err = fmt.Errorf("%w: mixed bucket %s has no choice (%d choices for more buckets)", ErrChoices, key, len(r.choices))
		return dpBucket{}, false
	}
	e := r.choices[r.k]
	r.k++
	if e.Top != (depth == 1) {
		r.err = fmt.Errorf("%w: choice %d is for a bucket at depth 1 or not (%v), mixed bucket %s is at depth %d", ErrChoices, r.k, e.Top, key, depth)
		return dpBucket{}, false
	}
	if child := int(e.Child); child <= key.Bits() || child > c.w {
		r.err = fmt.Errorf("%w: mixed bucket %s would look up its children at /%d", ErrChoices, key, child)
		return dpBucket{}, false
	}
	if c.bitmap && depth == 1 {
		// Under a Bitmap root the mixed /16 buckets share one map.
		if r.shared == 0 {
			r.shared = e.Child
		} else if e.Child != r.shared {
			r.err = fmt.Errorf("%w: %s under a bitmap root looks up /%d, the others /%d", ErrChoices, key, e.Child, r.shared)
			return dpBucket{}, false
		}
	}
	return dpBucket{start: int32(i), end: int32(c.bucketEnd(key.Bits(), i)), child: e.Child, def: e.In}, true
}

// Replay builds the tree layout of family is4 of s that ch records (the
// layout Build chose for the same set, with opt's element limit), in one
// pass over the set: no search. It returns an error wrapping ErrChoices
// if ch was made for another set or does not fit it, and ErrTooLarge
// past the element limit.
func Replay(s *prefix.Set, is4 bool, opt Options, ch *Choices) (*Layout, error) {
	if ch.Is4 != is4 {
		return nil, fmt.Errorf("%w: they are %s choices", ErrChoices, familyName(ch.Is4))
	}
	d := prefix.Digest(s, is4)
	if d != ch.Set {
		return nil, fmt.Errorf("%w: they were made for another set (%s, this one is %s)", ErrChoices, short(ch.Set), short(d))
	}
	// No survey: the traffic model's totals only weigh the estimate and
	// the bitmap's order, which ch carries. The family is empty when its
	// digest is that of no addresses.
	if d == emptyDigest || s.ContainsPrefix(fullPrefix(is4)) {
		return nil, fmt.Errorf("%w: the set is empty or everything", ErrChoices)
	}
	f := &family{w: familyBits(is4)}
	if ch.Root < 1 || ch.Root > f.w || ch.Bitmap && (!is4 || ch.Root != BitmapBits) {
		return nil, fmt.Errorf("%w: a root at /%d (bitmap %v)", ErrChoices, ch.Root, ch.Bitmap)
	}
	maxEntries := opt.MaxEntries
	if maxEntries == 0 {
		maxEntries = DefaultMaxEntries
	}
	root := dpBucket{child: uint8(ch.Root), def: ch.RootIn}
	c := &chooser{family: f, bitmap: ch.Bitmap}
	// The elements are not known ahead (expect: no bound but the
	// limit): reserve projects each level's from the share of the set's
	// cover (its pieces in the set) emitted so far.
	t := &treeBuilder{c: c, levels: map[[2]int]*Level{}, left: maxEntries, expect: maxEntries, replay: &replay{choices: ch.Descend}}
	n4, n6 := prefix.Count(s)
	nIn := n4
	if !is4 {
		nIn = n6
	}
	done := 0
	// Every level lies within one bucket of the root.
	c.shapeChunks(s, is4, min(chunkBitsOf(f.w), ch.Root), func() {
		if t.left < 0 {
			return
		}
		t.reserve(done, nIn)
		for _, p := range c.pieces {
			if p.in {
				done++
			}
		}
		root.end = int32(len(c.pieces))
		t.build(root, 1)
	})
	switch {
	case t.replay.err != nil:
		return nil, t.replay.err
	case t.left < 0:
		return nil, fmt.Errorf("replaying %d %s prefixes: %w (%d elements)", nIn, familyName(is4), ErrTooLarge, maxEntries)
	case t.replay.k != len(ch.Descend):
		return nil, fmt.Errorf("%w: %d choices for buckets the set does not have", ErrChoices, len(ch.Descend)-t.replay.k)
	}
	l := &Layout{Is4: is4, Kind: KindTree, Prefixes: nIn}
	t.finish(l, root, ch.Bitmap)
	l.Cost = ch.Cost
	if ch.Bitmap {
		// The order is the kernel's rules: each kind present, once.
		present := t.order()
		if len(ch.Order) != len(present) || !sameKinds(ch.Order, present) {
			return nil, fmt.Errorf("%w: bitmap order %v, the layout has %v", ErrChoices, ch.Order, present)
		}
		l.Levels[l.Root].Order = slices.Clone(ch.Order)
	}
	return l, nil
}

// emptyDigest is prefix.Digest of a family without addresses.
var emptyDigest = prefix.Digest(nil, true)

// sameKinds reports whether a holds the kinds of b, each once.
func sameKinds(a, b []EntryKind) bool {
	var seen [DescendRest + 1]bool
	for _, k := range a {
		if k > DescendRest || seen[k] || !slices.Contains(b, k) {
			return false
		}
		seen[k] = true
	}
	return true
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19] + "…"
	}
	return digest
}

// MarshalText writes ch as text: a header line, then the choices on one
// line, each its child length and "i" (in) or "o" (out), a space before
// each Top one (after the first):
//
//	tree IPv4 root=16 in bitmap set=sha256-… cost=0.64,0.17 order=out,descend-in
//	24o20i28o 24i…
func (ch *Choices) MarshalText() ([]byte, error) {
	b := make([]byte, 0, 128+4*len(ch.Descend))
	b = fmt.Appendf(b, "tree %s root=%d %s %s set=%s cost=%s,%s order=%s\n", familyName(ch.Is4), ch.Root, inOut(ch.RootIn),
		map[bool]string{true: "bitmap", false: "maps"}[ch.Bitmap], ch.Set,
		strconv.FormatFloat(ch.Cost.LookupsPass, 'g', -1, 64), strconv.FormatFloat(ch.Cost.LookupsRandom, 'g', -1, 64), kindList(ch.Order))
	for i, c := range ch.Descend {
		if c.Top && i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, int64(c.Child), 10)
		b = append(b, "oi"[b2i(c.In)])
	}
	return append(b, '\n'), nil
}

// kindList is ks as "in,descend-out", or "-" for none.
func kindList(ks []EntryKind) string {
	if len(ks) == 0 {
		return "-"
	}
	var s []string
	for _, k := range ks {
		s = append(s, k.String())
	}
	return strings.Join(s, ",")
}

// parseKinds reads kindList's text.
func parseKinds(s string) ([]EntryKind, bool) {
	if s == "-" {
		return nil, true
	}
	var out []EntryKind
	for _, name := range strings.Split(s, ",") {
		k := In
		for k <= DescendRest && k.String() != name {
			k++
		}
		if k > DescendRest {
			return nil, false
		}
		out = append(out, k)
	}
	return out, true
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func inOut(in bool) string {
	if in {
		return "in"
	}
	return "out"
}

// UnmarshalText reads what MarshalText wrote, strictly: a known header,
// child lengths within the family, at most DefaultMaxEntries choices.
func (ch *Choices) UnmarshalText(text []byte) error {
	*ch = Choices{}
	head, rest, ok := bytes.Cut(text, []byte("\n"))
	rest, ok2 := bytes.CutSuffix(rest, []byte("\n"))
	if !ok || !ok2 || bytes.IndexByte(rest, '\n') >= 0 {
		return fmt.Errorf("%w: want a header line and a line of choices", ErrChoices)
	}
	f := strings.Fields(string(head))
	if len(f) != 8 || f[0] != "tree" || (f[1] != "IPv4" && f[1] != "IPv6") || !strings.HasPrefix(f[2], "root=") ||
		(f[3] != "in" && f[3] != "out") || (f[4] != "bitmap" && f[4] != "maps") || !strings.HasPrefix(f[5], "set=sha256-") ||
		!strings.HasPrefix(f[6], "cost=") || !strings.HasPrefix(f[7], "order=") {
		return fmt.Errorf("%w: header %q: want \"tree IPv4|IPv6 root=N in|out bitmap|maps set=sha256-… cost=P,R order=KINDS\"", ErrChoices, prefix.Clip(string(head)))
	}
	pass, random, _ := strings.Cut(strings.TrimPrefix(f[6], "cost="), ",")
	var err1, err2 error
	ch.Cost.LookupsPass, err1 = strconv.ParseFloat(pass, 64)
	ch.Cost.LookupsRandom, err2 = strconv.ParseFloat(random, 64)
	if errors.Join(err1, err2) != nil || !(ch.Cost.LookupsPass >= 0 && ch.Cost.LookupsPass <= MaxDepth+1 && ch.Cost.LookupsRandom >= 0 && ch.Cost.LookupsRandom <= MaxDepth+1) {
		return fmt.Errorf("%w: header: cost %q", ErrChoices, prefix.Clip(f[6]))
	}
	if ch.Order, ok = parseKinds(strings.TrimPrefix(f[7], "order=")); !ok {
		return fmt.Errorf("%w: header: order %q", ErrChoices, prefix.Clip(f[7]))
	}
	ch.Is4, ch.RootIn, ch.Bitmap, ch.Set = f[1] == "IPv4", f[3] == "in", f[4] == "bitmap", strings.TrimPrefix(f[5], "set=")
	if sum, err := hex.DecodeString(strings.TrimPrefix(ch.Set, "sha256-")); err != nil || len(sum) != 32 {
		return fmt.Errorf("%w: header: set digest %q", ErrChoices, prefix.Clip(ch.Set))
	}
	w := familyBits(ch.Is4)
	root, err := strconv.Atoi(strings.TrimPrefix(f[2], "root="))
	if err != nil || root < 1 || root > w {
		return fmt.Errorf("%w: header: root length %q", ErrChoices, f[2])
	}
	ch.Root = root
	ch.Descend = make([]Choice, 0, len(rest)/3)
	for i := 0; i < len(rest); {
		top := i == 0
		if rest[i] == ' ' && i > 0 && i+1 < len(rest) && rest[i+1] != ' ' {
			top = true
			i++
		}
		n, j := 0, i
		for ; j < len(rest) && j-i < 3 && rest[j] >= '0' && rest[j] <= '9'; j++ {
			n = 10*n + int(rest[j]-'0')
		}
		if j == i || n < 1 || n > w || j == len(rest) || (rest[j] != 'i' && rest[j] != 'o') {
			return fmt.Errorf("%w: choice %d (byte %d): want a child length from 1 to %d and i or o", ErrChoices, len(ch.Descend)+1, i+1, w)
		}
		if len(ch.Descend) == DefaultMaxEntries {
			return fmt.Errorf("%w: more than %d choices", ErrChoices, DefaultMaxEntries)
		}
		ch.Descend = append(ch.Descend, Choice{Child: uint8(n), In: rest[j] == 'i', Top: top})
		i = j + 1
	}
	if again, _ := ch.MarshalText(); !bytes.Equal(again, text) {
		return fmt.Errorf("%w: not in the form MarshalText writes (leading zeros, signs, other spaces)", ErrChoices)
	}
	return nil
}
