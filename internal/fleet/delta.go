package fleet

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
)

// A Delta is a bundle written as its differences from another one, the
// base: what a revision that changes 1% of a feed ships to the hosts that
// run the base. Its long fields change by patches of the base's (of the
// rule of the same name): the protected prefixes and each rule's prefixes
// as the addresses removed and added, each rule's layouts as the choices
// of the buckets that changed. The rest is the new bundle's as it is.
//
// A host applies a delta only to a base it verified, and keeps the result
// only if it is the very bundle the publisher made: Result is the digest
// of the new bundle's canonical form (Bundle.Canonical); the signed
// pointer names the delta's own digest.
type Delta struct {
	Version int    `json:"version"`
	Base    string `json:"base"`   // the base bundle's digest
	Result  string `json:"result"` // the new bundle's canonical digest
	// Bundle is the new bundle without its long fields (Protect, the
	// rules' Prefixes and Layouts), which Protect and Rules patch.
	Bundle  Bundle      `json:"bundle"`
	Protect SetPatch    `json:"protect"`
	Rules   []RulePatch `json:"rules"` // Bundle.Rules', in order
}

// SetPatch is a set's change: the addresses it lost and gained, as
// prefix.Pack ranges (a few bytes a range, where the prefixes of the
// cover are a line each and change around every edit).
type SetPatch struct {
	Removed []byte `json:"removed,omitempty"`
	Added   []byte `json:"added,omitempty"`
}

// RulePatch is a rule's change: its set's, and its layouts' as patches of
// their text.
type RulePatch struct {
	Prefixes SetPatch `json:"prefixes"`
	Layout4  string   `json:"layout_v4,omitempty"`
	Layout6  string   `json:"layout_v6,omitempty"`
}

// DeltaVersion is the delta format this build writes and reads.
const DeltaVersion = 1

// ErrDelta is returned for a delta that cannot be applied (to this base).
var ErrDelta = errors.New("delta does not apply")

// Canonical is the digest of b's canonical form, its JSON: what a delta
// must rebuild (the stored bundle's gzip bytes may differ between
// builds). A bundle larger than MaxBundle has none: no host would read
// it back.
func (b *Bundle) Canonical() (string, error) {
	data, err := b.canonicalJSON()
	if err != nil {
		return "", err
	}
	return Digest(data), nil
}

// canonicalJSON is b's canonical form.
func (b *Bundle) canonicalJSON() ([]byte, error) {
	if b.slim {
		return nil, errSlim
	}
	data, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encoding the bundle: %w", err)
	}
	if len(data) > MaxBundle {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrBundleSize, len(data), MaxBundle)
	}
	return data, nil
}

// ErrBundleSize is returned for a bundle too large to read back.
var ErrBundleSize = errors.New("bundle too large")

// splitLayout cuts plan.Choices text into the items a patch copies or
// replaces: its header line, then the choices of each bucket at the
// root's child length (a space apart).
func splitLayout(s string) []string {
	head, rest, ok := strings.Cut(s, "\n")
	if !ok {
		return nil
	}
	return append([]string{head}, strings.Fields(rest)...)
}

// joinLayout is the text splitLayout cut.
func joinLayout(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return items[0] + "\n" + strings.Join(items[1:], " ") + "\n"
}

// A patch rewrites the items of a base field, one operation per line:
// "=N" copies the next N base items, "-N" skips N, "+ITEM" adds ITEM.
// Every base item is copied or skipped.

// diff is the patch that makes next of base, whose items are ordered by
// their keys: an item is copied where both have the same key and the
// same text.
func diff(base, next []string, baseKeys, nextKeys []netip.Prefix) string {
	var b strings.Builder
	var op byte
	n := 0
	flush := func() {
		if n > 0 {
			b.WriteByte(op)
			b.WriteString(strconv.Itoa(n))
			b.WriteByte('\n')
		}
		n = 0
	}
	run := func(o byte) {
		if op != o {
			flush()
			op = o
		}
		n++
	}
	add := func(item string) {
		flush()
		op = 0
		b.WriteByte('+')
		b.WriteString(item)
		b.WriteByte('\n')
	}
	i, j := 0, 0
	for i < len(base) || j < len(next) {
		c := 0
		switch {
		case i == len(base):
			c = 1
		case j == len(next):
			c = -1
		default:
			c = netipx.ComparePrefix(baseKeys[i], nextKeys[j])
		}
		switch {
		case c < 0:
			run('-')
			i++
		case c > 0:
			add(next[j])
			j++
		case base[i] == next[j]:
			run('=')
			i, j = i+1, j+1
		default:
			run('-')
			add(next[j])
			i, j = i+1, j+1
		}
	}
	flush()
	return b.String()
}

// patch applies p to base's items.
func patch(base []string, p string) ([]string, error) {
	out := make([]string, 0, len(base))
	i := 0
	for n, line := range strings.Split(strings.TrimSuffix(p, "\n"), "\n") {
		if line == "" {
			if p == "" {
				break
			}
			return nil, fmt.Errorf("%w: line %d is empty", ErrDelta, n+1)
		}
		if line[0] == '+' {
			out = append(out, line[1:])
			continue
		}
		k, err := strconv.Atoi(line[1:])
		if err != nil || k < 1 || k > len(base)-i || (line[0] != '=' && line[0] != '-') {
			return nil, fmt.Errorf("%w: line %d: %q (%d base items left)", ErrDelta, n+1, prefix.Clip(line), len(base)-i)
		}
		if line[0] == '=' {
			out = append(out, base[i:i+k]...)
		}
		i += k
	}
	if i != len(base) {
		return nil, fmt.Errorf("%w: %d base items neither copied nor skipped", ErrDelta, len(base)-i)
	}
	return out, nil
}

// MakeDelta is next written as a patch of base, whose digest it is.
// sets, when not nil, give the sets of next's rules (by name) whose
// layouts it holds, and base's likewise (plan.Sets), so that a layout's
// choices are copied bucket by bucket; without them layouts go whole.
func MakeDelta(base *Bundle, baseDigest string, next *Bundle, baseSets, nextSets map[string]*prefix.Set) (*Delta, error) {
	result, err := next.Canonical()
	if err != nil {
		return nil, err
	}
	d := &Delta{Version: DeltaVersion, Base: baseDigest, Result: result, Bundle: *next}
	d.Bundle.Protect, d.Bundle.Rules = "", append([]BundleRule(nil), next.Rules...)
	a, err := parseLines(base.Protect)
	if err != nil {
		return nil, fmt.Errorf("protected prefixes: %w", err)
	}
	b, err := parseLines(next.Protect)
	if err != nil {
		return nil, fmt.Errorf("protected prefixes: %w", err)
	}
	d.Protect = diffSet(a, b)
	baseRule := rulesByName(base)
	for i := range d.Bundle.Rules {
		r, old := &next.Rules[i], baseRule(next.Rules[i].Name)
		var rp RulePatch
		if a, err = old.prefixSet(); err == nil {
			b, err = r.prefixSet()
		}
		if err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.Name, err)
		}
		rp.Prefixes = diffSet(a, b)
		rp.Layout4 = diffLayout(old.Layout4, r.Layout4, baseSets[r.Name], nextSets[r.Name], true)
		rp.Layout6 = diffLayout(old.Layout6, r.Layout6, baseSets[r.Name], nextSets[r.Name], false)
		dr := &d.Bundle.Rules[i]
		dr.Prefixes, dr.Layout4, dr.Layout6, dr.set = "", "", "", nil
		d.Rules = append(d.Rules, rp)
	}
	return d, nil
}

// rulesByName finds b's rule of a name: an empty one when b has none.
func rulesByName(b *Bundle) func(name string) *BundleRule {
	m := make(map[string]*BundleRule, len(b.Rules))
	for i := range b.Rules {
		m[b.Rules[i].Name] = &b.Rules[i]
	}
	return func(name string) *BundleRule {
		if r := m[name]; r != nil {
			return r
		}
		return &BundleRule{}
	}
}

// diffSet is the patch from set a to set b.
func diffSet(a, b *prefix.Set) SetPatch {
	return SetPatch{Removed: packNonEmpty(prefix.Subtract(a, b)), Added: packNonEmpty(prefix.Subtract(b, a))}
}

func packNonEmpty(s *prefix.Set) []byte {
	if s.Empty() {
		return nil
	}
	return prefix.Pack(s)
}

// apply is the prefix field old, whose set is oldSet (nil: not read
// yet), with p's changes: its text and its set (nil when nothing
// changed and old's set was not read). old may be "" where oldSet is
// given (a slim base's): the text is then written from the set.
func (p SetPatch) apply(old string, oldSet *prefix.Set) (string, *prefix.Set, error) {
	if p.Removed == nil && p.Added == nil && (old != "" || oldSet == nil) {
		return old, oldSet, nil
	}
	s := oldSet
	if s == nil {
		var err error
		if s, err = parseLines(old); err != nil {
			return "", nil, err
		}
	}
	for _, f := range []struct {
		data []byte
		op   func(a, b *prefix.Set) *prefix.Set
	}{{p.Removed, prefix.Subtract}, {p.Added, prefix.Union}} {
		if f.data == nil {
			continue
		}
		x, err := prefix.Unpack(f.data)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrDelta, err)
		}
		s = f.op(s, x)
	}
	return prefixLines(s), s, nil
}

// diffLayout is the patch of a rule's layout text: the choices of each
// bucket at the root's child length copied where the base made the same
// ones for the same bucket (both sets give the buckets), else sent.
func diffLayout(old, next string, oldSet, nextSet *prefix.Set, is4 bool) string {
	base, items := splitLayout(old), splitLayout(next)
	bk, nk := layoutKeys(base, oldSet, is4), layoutKeys(items, nextSet, is4)
	if bk == nil || nk == nil || layoutRoot(base) != layoutRoot(items) {
		return replaceAll(base, items)
	}
	return diff(base, items, bk, nk)
}

// replaceAll is the patch that skips every base item and adds items.
func replaceAll(base, items []string) string {
	var b strings.Builder
	if len(base) > 0 {
		fmt.Fprintf(&b, "-%d\n", len(base))
	}
	for _, it := range items {
		b.WriteString("+" + it + "\n")
	}
	return b.String()
}

// layoutKeys are the keys of a layout's items: the header's the zero
// prefix (first), then the mixed buckets at the root's child length of
// set, which the items follow one for one (nil when they do not).
func layoutKeys(items []string, set *prefix.Set, is4 bool) []netip.Prefix {
	root := layoutRoot(items)
	if set == nil || root == 0 {
		return nil
	}
	bs := prefix.MixedBuckets(set, is4, root)
	if len(bs) != len(items)-1 {
		return nil // a set other than the choices': sent whole
	}
	return append([]netip.Prefix{{}}, bs...)
}

// layoutRoot is the root child length a layout's header names (0: none).
func layoutRoot(items []string) int {
	if len(items) == 0 {
		return 0
	}
	for _, f := range strings.Fields(items[0]) {
		if v, ok := strings.CutPrefix(f, "root="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// Apply rebuilds the bundle d makes of base, checked against d.Result.
func (d *Delta) Apply(base *Bundle) (*Bundle, error) {
	if d.Version != DeltaVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrDelta, d.Version, DeltaVersion)
	}
	if len(d.Rules) != len(d.Bundle.Rules) {
		return nil, fmt.Errorf("%w: %d rule patches for %d rules", ErrDelta, len(d.Rules), len(d.Bundle.Rules))
	}
	b := d.Bundle
	b.Rules = append([]BundleRule(nil), d.Bundle.Rules...)
	var err error
	if b.Protect, _, err = d.Protect.apply(base.Protect, nil); err != nil {
		return nil, fmt.Errorf("protected prefixes: %w", err)
	}
	baseRule := rulesByName(base)
	for i := range b.Rules {
		r, rp, old := &b.Rules[i], d.Rules[i], baseRule(b.Rules[i].Name)
		// The set is kept for Input, which need not read the text again.
		if r.Prefixes, r.set, err = rp.Prefixes.apply(old.Prefixes, old.set); err == nil {
			if r.Layout4, err = patchLayout(old.Layout4, rp.Layout4); err == nil {
				r.Layout6, err = patchLayout(old.Layout6, rp.Layout6)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.Name, err)
		}
	}
	data, err := b.canonicalJSON()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDelta, err)
	}
	if got := Digest(data); got != d.Result {
		return nil, fmt.Errorf("%w: it makes %s, not %s (another base?)", ErrDelta, got, d.Result)
	}
	b.canon = data // for EncodeLocal
	return &b, nil
}

func patchLayout(base, p string) (string, error) {
	items, err := patch(splitLayout(base), p)
	if err != nil {
		return "", err
	}
	return joinLayout(items), nil
}

// Encode is d as stored: gzipped JSON.
func (d *Delta) Encode() ([]byte, error) { return encodeGzip(d, "delta", gzip.DefaultCompression) }

// DecodeDelta reads a delta Encode wrote. Check its digest against a
// verified Pointer first.
func DecodeDelta(data []byte) (*Delta, error) { return decodeGzip[Delta](data, ErrDelta) }
