package fleet_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// feedLines is a feed of n random IPv4 and IPv6 prefixes, as a list.
func feedLines(r *rand.Rand, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		if r.IntN(10) == 0 {
			a := netip.AddrFrom16([16]byte{0x2a, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
			out[i] = netip.PrefixFrom(a, 32+r.IntN(33)).Masked()
			continue
		}
		a := netip.AddrFrom4([4]byte{byte(1 + r.IntN(120)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		out[i] = netip.PrefixFrom(a, 20+r.IntN(13)).Masked()
	}
	return out
}

func setOf(ps []netip.Prefix) *prefix.Set {
	var b prefix.Builder
	for _, p := range ps {
		b.AddPrefix(p)
	}
	s, _ := b.Build()
	return s
}

// published is the bundle a publisher makes of in, with its layouts, and
// the sets they were chosen for.
func published(t *testing.T, in *plan.Input) (*fleet.Bundle, []byte, map[string]*prefix.Set) {
	t.Helper()
	p, err := plan.Compile(in, plan.Options{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	b := fleet.NewBundle(in, 0, "p.yaml", "", time.Unix(1e9, 0))
	if err := b.AddLayouts(p); err != nil {
		t.Fatal(err)
	}
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string]*prefix.Set{}
	for _, r := range p.Rules {
		sets[r.Name] = r.Set
	}
	return b, data, sets
}

// TestDelta: a revision that changes 1% of a feed, drops a rule and adds
// one ships as a delta a small part of the bundle's size; applied to the
// base it rebuilds the new bundle exactly, whose layouts the agent
// replays. Applied to another base, or tampered with, it is refused.
func TestDelta(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 7))
	feed := feedLines(r, 30000)
	geo := feedLines(r, 3000)
	in := func(feed []netip.Prefix, rules ...string) *plan.Input {
		in := &plan.Input{Table: "ipfence", Protect: setOf([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")})}
		for _, name := range rules {
			ri := plan.RuleInput{Name: name, Action: plan.Drop, IPv4: true, IPv6: true, Set: setOf(feed)}
			switch name {
			case "geo":
				ri.Action, ri.Set = plan.AllowOnly, setOf(geo)
			case "old", "new":
				ri.Set = setOf(geo[:50])
			}
			in.Rules = append(in.Rules, ri)
		}
		return in
	}
	base, baseData, baseSets := published(t, in(feed, "feed", "geo", "old"))
	next := append([]netip.Prefix(nil), feed...)
	for range len(next) / 100 {
		next[r.IntN(len(next))] = feedLines(r, 1)[0]
	}
	nb, nextData, nextSets := published(t, in(next, "feed", "geo", "new"))
	// An agent keeps its base slim: the sets of the bundle it read, no
	// prefix text (an unchanged rule's text is written from its set).
	read, err := fleet.DecodeBundle(baseData)
	if err != nil {
		t.Fatal(err)
	}
	// A fetched bundle is kept as fetched: DecodeLocal reads it too.
	if fetched, err := fleet.DecodeLocal(baseData); err != nil {
		t.Fatal(err)
	} else if c, _ := fetched.Canonical(); c != mustCanonical(t, base) {
		t.Fatalf("a fetched bundle kept on disk reads back as %s", c)
	}
	if _, err := read.Input(); err != nil {
		t.Fatal(err)
	}
	slim := read.Slim()
	if _, err := slim.Encode(); err == nil {
		t.Error("a slim bundle encoded")
	}
	if _, err := slim.Canonical(); err == nil {
		t.Error("a slim bundle has a canonical digest")
	}
	if _, err := slim.EncodeLocal(); err == nil {
		t.Error("a slim bundle encoded for the local disk")
	}

	check := func(name string, d *fleet.Delta) []byte {
		t.Helper()
		data, err := d.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := fleet.DecodeDelta(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []*fleet.Bundle{base, slim} {
			got, err := back.Apply(b)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want, _ := nb.Canonical()
			if c, _ := got.Canonical(); c != want {
				t.Fatalf("%s: rebuilt %s, want %s", name, c, want)
			}
			// The copy an agent keeps is that canonical form as it
			// is, read back only from the local disk.
			local, err := got.EncodeLocal()
			if err != nil {
				t.Fatal(err)
			}
			if fleet.Digest(local) != want {
				t.Fatalf("%s: the local copy is not the canonical form", name)
			}
			if _, err := fleet.DecodeBundle(local); err == nil {
				t.Fatalf("%s: a bundle from the network read as plain JSON", name)
			}
			kept, err := fleet.DecodeLocal(local)
			if err != nil {
				t.Fatal(err)
			}
			if c, _ := kept.Canonical(); c != want {
				t.Fatalf("%s: the local copy reads back as %s, want %s", name, c, want)
			}
		}
		return data
	}
	d, err := fleet.MakeDelta(base, fleet.Digest(baseData), nb, baseSets, nextSets)
	if err != nil {
		t.Fatal(err)
	}
	data := check("delta", d)
	t.Logf("bundle %d bytes, delta %d bytes (1/%d)", len(nextData), len(data), len(nextData)/len(data))
	if len(data)*20 > len(nextData) {
		t.Errorf("the delta of a 1%% change is %d bytes, the bundle %d", len(data), len(nextData))
	}
	// Without the sets the layouts go whole: larger, as good.
	whole, err := fleet.MakeDelta(base, fleet.Digest(baseData), nb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w := check("layouts whole", whole); len(w) <= len(data) {
		t.Errorf("layouts sent whole: %d bytes, bucket by bucket %d", len(w), len(data))
	}

	// The agent replays the layouts of the bundle it rebuilt.
	got, _ := d.Apply(base)
	gin, err := got.Input()
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Compile(gin, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Rules {
		if r.ReplayNote != "" {
			t.Errorf("rule %s: %s", r.Name, r.ReplayNote)
		}
	}

	// Another base: refused.
	other, _, _ := published(t, in(feedLines(r, 30000), "feed", "geo", "old"))
	if _, err := d.Apply(other); !errors.Is(err, fleet.ErrDelta) {
		t.Errorf("another base: %v", err)
	}
	// A patch that copies past the base's end, or leaves base items, or
	// packed ranges that do not read: refused.
	for _, edit := range []func(*fleet.RulePatch){
		func(p *fleet.RulePatch) { p.Layout4 += "=999999\n" },
		func(p *fleet.RulePatch) { p.Layout4 = strings.Replace(p.Layout4, "=", "-", 1) },
		func(p *fleet.RulePatch) { p.Layout4 += "=x\n" },
		func(p *fleet.RulePatch) { p.Layout4 = strings.TrimSuffix(p.Layout4, "\n") + "\n\n" },
		func(p *fleet.RulePatch) { p.Prefixes.Added = p.Prefixes.Added[:len(p.Prefixes.Added)-1] },
		func(p *fleet.RulePatch) { p.Prefixes.Removed = append(p.Prefixes.Removed, 0) },
	} {
		bad := *d
		bad.Rules = append([]fleet.RulePatch(nil), d.Rules...)
		edit(&bad.Rules[0])
		for _, b := range []*fleet.Bundle{base, slim} {
			if _, err := bad.Apply(b); !errors.Is(err, fleet.ErrDelta) {
				t.Errorf("tampered patch: %v", err)
			}
		}
	}
	// Patches that apply but make another bundle: refused too.
	bad := *d
	bad.Rules = append([]fleet.RulePatch(nil), d.Rules...)
	bad.Rules[0].Prefixes.Removed = nil
	for _, b := range []*fleet.Bundle{base, slim} {
		if _, err := bad.Apply(b); !errors.Is(err, fleet.ErrDelta) || !strings.Contains(err.Error(), "another base") {
			t.Errorf("a patch that makes another bundle: %v", err)
		}
	}
	bad = *d
	bad.Version = 2
	if _, err := bad.Apply(base); !errors.Is(err, fleet.ErrDelta) {
		t.Errorf("format 2: %v", err)
	}
}

func mustCanonical(t *testing.T, b *fleet.Bundle) string {
	t.Helper()
	c, err := b.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
