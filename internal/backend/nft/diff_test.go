package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// Pure tests of Diff and of Update validation; update_kernel_test.go
// loads the Updates into the kernel.

// setOf returns the set of p named name, or nil.
func setOf(p *Program, name string) *Set {
	for _, s := range p.Sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// chainOf returns the chain of p named name, or nil.
func chainOf(p *Program, name string) *Chain {
	for _, c := range p.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// dropSet removes the set named name from p.
func dropSet(p *Program, name string) {
	p.Sets = slices.DeleteFunc(p.Sets, func(s *Set) bool { return s.Name == name })
}

// dropChain removes the chain named name from p.
func dropChain(p *Program, name string) {
	p.Chains = slices.DeleteFunc(p.Chains, func(c *Chain) bool { return c.Name == name })
}

// summary is an Update in short lines, one per change, sorted:
// "new set s (n)", "del set s", "set s +key:verdict -key", "ref s",
// "new chain c (n rules)", "chain c (n rules)", "del chain c".
func summary(u *Update) []string {
	var out []string
	elems := func(es []Elem) string {
		var parts []string
		for _, e := range es {
			s := e.Key.String()
			if e.Verdict != (Verdict{}) {
				s += ":" + string(appendVerdict(nil, e.Verdict))
			}
			if e.Timeout > 0 {
				s += "@" + e.Timeout.String()
			}
			parts = append(parts, s)
		}
		slices.Sort(parts)
		return strings.Join(parts, ",")
	}
	for _, s := range u.NewSets {
		out = append(out, fmt.Sprintf("new set %s (%d)", s.Name, s.Elems.Len()))
	}
	for _, n := range u.DelSets {
		out = append(out, "del set "+n)
	}
	for _, sc := range u.Sets {
		if len(sc.Add) == 0 && len(sc.Del) == 0 {
			out = append(out, "ref "+sc.Set.Name)
			continue
		}
		line := "set " + sc.Set.Name
		if len(sc.Add) > 0 {
			line += " +" + elems(sc.Add)
		}
		if len(sc.Del) > 0 {
			line += " -" + elems(sc.Del)
		}
		if a := sc.After; a != nil {
			line += fmt.Sprintf(" len=%d", a.Len)
			if a.FromZero {
				line += " zero"
			}
		}
		out = append(out, line)
	}
	for _, c := range u.NewChains {
		out = append(out, fmt.Sprintf("new chain %s (%d rules)", c.Name, len(c.Rules)))
	}
	for _, c := range u.Chains {
		out = append(out, fmt.Sprintf("chain %s (%d rules)", c.Name, len(c.Rules)))
	}
	for _, n := range u.DelChains {
		out = append(out, "del chain "+n)
	}
	slices.Sort(out)
	return out
}

func TestDiffIdentical(t *testing.T) {
	for name, p := range map[string]func() *Program{
		"shapes":    shapesProgram,
		"minimal":   minimalProgram,
		"generated": func() *Program { return generatedProgram(7, 300, 12, 8) },
		"empty":     func() *Program { return &Program{Table: "ipfence"} },
	} {
		t.Run(name, func(t *testing.T) {
			u, err := Diff(p(), p())
			if err != nil {
				t.Fatal(err)
			}
			if !u.Empty() || len(u.Sets) > 0 {
				t.Errorf("Diff of identical programs: %q", summary(u))
			}
			if err := u.validate(); err != nil {
				t.Errorf("the empty Update does not validate: %v", err)
			}
		})
	}
}

// shapesPort is the modification of shapesProgram the kernel tests also
// use: a port rule of chain services changed.
func shapesPort(p *Program) {
	chainOf(p, "services").Rules[1].Ports = []PortRange{{1000, 3000}}
}

// shapesDropChain removes chain v4_10_2 with its map and the entries of
// v4_16 that jump to it.
func shapesDropChain(p *Program) {
	dropChain(p, "v4_10_2")
	dropSet(p, "v4_10_2_24")
	m := setOf(p, "v4_16")
	m.Elems = ElemsOf(slices.DeleteFunc(m.Elems.List(), func(e Elem) bool { return e.Verdict.Chain == "v4_10_2" })...)
}

// shapesNewLevel adds a map and a chain below v6_32: 2001:db8::/32 now
// goes to a /48 level.
func shapesNewLevel(p *Program) {
	p.Sets = append(p.Sets, &Set{Name: "v6_2001_db8_48", Family: IPv6, KeyBits: 48, IsMap: true, Comment: "new level", Elems: ElemsOf(
		Elem{Key: pfx("2001:db8:1::/48"), Verdict: Verdict{Kind: Drop}},
		Elem{Key: pfx("2001:db8:2::/48"), Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
	)})
	p.Chains = append(p.Chains, &Chain{Name: "v6_2001_db8", Rules: []Rule{
		{Lookup: &Lookup{Family: IPv6, MaskBits: 48, Set: "v6_2001_db8_48", IsMap: true}},
		{Verdict: Verdict{Kind: Return}},
	}})
	m := setOf(p, "v6_32")
	editElem(&m.Elems, 0, func(e *Elem) { e.Verdict = Verdict{Kind: Goto, Chain: "v6_2001_db8"} })
}

// shapesElems changes elements: one added, one removed, one verdict
// changed in v4_16; allow4 loses one interval and gains two.
func shapesElems(p *Program) {
	m := setOf(p, "v4_16")
	m.Elems.Append(Elem{Key: pfx("10.3.0.0/16"), Verdict: Verdict{Kind: Drop}})
	m.Elems = ElemsOf(slices.DeleteFunc(m.Elems.List(), func(e Elem) bool { return e.Key == pfx("172.17.0.0/16") })...)
	editElem(&m.Elems, 0, func(e *Elem) { e.Verdict = Verdict{Kind: Accept} })
	a := setOf(p, "allow4")
	a.Elems = ElemsOf(slices.DeleteFunc(a.Elems.List(), func(e Elem) bool { return e.Key == pfx("192.0.2.1/32") })...)
	a.Elems.Append(Elem{Key: pfx("192.0.2.0/31")}, Elem{Key: pfx("198.18.0.0/15")})
}

// shapesGrow makes host4 hold more elements than its declared size.
func shapesGrow(p *Program) {
	h := setOf(p, "host4")
	for i := range 20 {
		h.Elems.Append(Elem{Key: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + i)}), 32)})
	}
}

// preRefs are the sets chain pre of shapesProgram looks up.
var preRefs = []string{"ref allow4", "ref allow6", "ref ban4", "ref bannet4_empty", "ref bannet6", "ref empty6",
	"ref half4", "ref host4", "ref v4_16", "ref v6_32", "ref w6_24"}

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(p *Program)
		want   []string
	}{
		{"port rule", shapesPort, []string{"chain services (6 rules)"}},
		{"elements", shapesElems, []string{
			"set allow4 +192.0.2.0/31,198.18.0.0/15 -192.0.2.1/32 len=5",
			"set v4_16 +10.1.0.0/16:accept,10.3.0.0/16:drop -10.1.0.0/16,172.17.0.0/16",
		}},
		{"chain and its map removed", shapesDropChain, []string{
			"del chain v4_10_2", "del set v4_10_2_24",
			"set v4_16 -10.2.0.0/16,172.16.0.0/16",
		}},
		{"new level", shapesNewLevel, []string{
			"new chain v6_2001_db8 (2 rules)", "new set v6_2001_db8_48 (2)",
			"set v6_32 +2001:db8::/32:goto v6_2001_db8 -2001:db8::/32",
		}},
		{"timeout changed", func(p *Program) { editElem(&setOf(p, "ban4").Elems, 0, func(e *Elem) { e.Timeout = 2 * time.Hour }) }, []string{
			"set ban4 +198.51.100.20/32@2h0m0s -198.51.100.20/32",
		}},
		{"timeout changed below a millisecond", func(p *Program) {
			editElem(&setOf(p, "ban4").Elems, 0, func(e *Elem) { e.Timeout += time.Microsecond })
		}, nil},
		{"interval set emptied", func(p *Program) { setOf(p, "allow6").Elems = Elems{} }, []string{
			"set allow6 -2001:db8:ffff::/48,fe80::1/128 len=0",
		}},
		{"interval from zero", func(p *Program) {
			setOf(p, "allow4").Elems.Append(Elem{Key: pfx("0.0.0.0/8")})
		}, []string{"set allow4 +0.0.0.0/8 len=5 zero"}},
		{"set grows past its size", shapesGrow, append([]string{
			"chain pre (17 rules)", "del set host4", "new set host4 (22)",
		}, slices.DeleteFunc(slices.Clone(preRefs), func(s string) bool { return s == "ref host4" })...)},
		{"rule in the base chain", func(p *Program) { chainOf(p, "pre").Rules[16].Counter = false },
			append([]string{"chain pre (17 rules)"}, preRefs...)},
		{"new base chain", func(p *Program) {
			p.Chains = append(p.Chains, &Chain{Name: "pre2", Hook: &Hook{Priority: 10}, Rules: []Rule{
				{Lookup: &Lookup{Family: IPv4, Set: "allow4"}, Verdict: Verdict{Kind: Jump, Chain: "services"}},
			}})
		}, []string{"new chain pre2 (1 rules)", "ref allow4"}},
		{"set removed", func(p *Program) {
			dropSet(p, "empty6")
			pre := chainOf(p, "pre")
			pre.Rules = slices.DeleteFunc(pre.Rules, func(r Rule) bool { return r.Lookup != nil && r.Lookup.Set == "empty6" })
		}, append([]string{"chain pre (16 rules)", "del set empty6"},
			slices.DeleteFunc(slices.Clone(preRefs), func(s string) bool { return s == "ref empty6" })...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, new := shapesProgram(), shapesProgram()
			tc.modify(new)
			if err := new.Validate(); err != nil {
				t.Fatal(err)
			}
			u, err := Diff(old, new)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(u); !slices.Equal(got, tc.want) {
				t.Errorf("Diff:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if err := u.validate(); err != nil {
				t.Errorf("the Update does not validate: %v", err)
			}
			// And back: the reverse Diff undoes it.
			back, err := Diff(new, old)
			if err != nil {
				t.Fatal(err)
			}
			if err := back.validate(); err != nil {
				t.Errorf("the reverse Update does not validate: %v", err)
			}
			if u.Empty() != back.Empty() {
				t.Errorf("Diff is empty %v one way, %v the other", u.Empty(), back.Empty())
			}
		})
	}
}

func TestDiffNeedsReload(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(p *Program)
		want   string
	}{
		{"set comment", func(p *Program) { setOf(p, "v4_16").Comment = "other" }, `set v4_16: its definition changed (comment "blocklist v4 by /16" to "other")`},
		{"set key bits", func(p *Program) {
			s := setOf(p, "v4_10_2_24")
			s.KeyBits = 32
			s.Elems = Elems{}
		}, "set v4_10_2_24: its definition changed (key bits 24 to 32)"},
		{"set becomes interval", func(p *Program) {
			s := setOf(p, "host4")
			s.Interval, s.KeyBits = true, 0
		}, "set host4: its definition changed (interval false to true)"},
		{"set gets timeouts", func(p *Program) { setOf(p, "host4").Timeout = true }, "set host4: its definition changed (timeout false to true)"},
		{"priority", func(p *Program) { chainOf(p, "pre").Hook.Priority = -150 }, "chain pre: its hook changed (prerouting priority -300 to prerouting priority -150)"},
		{"base chain becomes regular", func(p *Program) { chainOf(p, "pre").Hook = nil }, "chain pre: its hook changed (prerouting priority -300 to none)"},
		{"regular chain becomes base", func(p *Program) { chainOf(p, "blocked").Hook = &Hook{Priority: 0} }, "chain blocked: its hook changed (none to prerouting priority 0)"},
		{"kept set definition", func(p *Program) { setOf(p, "ban4").Comment = "" }, "set ban4: its definition changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			new := shapesProgram()
			tc.modify(new)
			u, err := DiffKeeping(shapesProgram(), new, func(name string) bool { return name == "ban4" })
			if !errors.Is(err, ErrNeedsReload) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Diff = %v, %v; want an error wrapping ErrNeedsReload containing %q", u, err, tc.want)
			}
		})
	}

	other := shapesProgram()
	other.Table = "other"
	if _, err := Diff(shapesProgram(), other); err == nil || errors.Is(err, ErrNeedsReload) {
		t.Errorf("Diff to another table = %v, want an error that is not ErrNeedsReload", err)
	}
	dup := shapesProgram()
	dup.Chains = append(dup.Chains, &Chain{Name: "blocked"})
	if _, err := Diff(shapesProgram(), dup); !errors.Is(err, ErrInvalidProgram) {
		t.Errorf("Diff to a program with a chain defined twice = %v, want ErrInvalidProgram", err)
	}
}

func TestDiffKeeping(t *testing.T) {
	bans := func(name string) bool { return name == "ban4" || name == "bannet6" || name == "bans_new" }
	old, new := shapesProgram(), shapesProgram()
	// Bans changed meanwhile: the programs disagree, the kernel has its own.
	setOf(new, "ban4").Elems = setOf(new, "ban4").Elems.Slice(0, 1)
	setOf(new, "bannet6").Elems.Append(Elem{Key: pfx("2001:db8:c0::/48")})
	// A kept set only in old stays; one only in new is created.
	dropSet(new, "bannet4_empty")
	pre := chainOf(new, "pre")
	pre.Rules = slices.DeleteFunc(pre.Rules, func(r Rule) bool { return r.Lookup != nil && r.Lookup.Set == "bannet4_empty" })
	new.Sets = append(new.Sets, &Set{Name: "bans_new", Family: IPv4, KeyBits: 32, Timeout: true, Elems: ElemsOf(Elem{Key: pfx("192.0.2.9/32")})})
	// A feed element changes too.
	editElem(&setOf(new, "host4").Elems, 0, func(e *Elem) { e.Key = pfx("198.51.100.8/32") })

	u, err := DiffKeeping(old, new, func(name string) bool { return bans(name) || name == "bannet4_empty" })
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{
		"chain pre (16 rules)", "new set bans_new (1)",
		"set host4 +198.51.100.8/32 -198.51.100.7/32",
	}, slices.DeleteFunc(slices.Clone(preRefs), func(s string) bool { return s == "ref host4" || s == "ref bannet4_empty" })...)
	slices.Sort(want)
	if got := summary(u); !slices.Equal(got, want) {
		t.Errorf("DiffKeeping:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, sc := range u.Sets {
		if bans(sc.Set.Name) && (len(sc.Add) > 0 || len(sc.Del) > 0 || sc.After != nil) {
			t.Errorf("kept set %s is changed: %+v", sc.Set.Name, sc)
		}
	}

	// Without keep, the same programs change the ban sets.
	u, err = Diff(old, new)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(summary(u), "\n"); !strings.Contains(got, "set ban4 -") || !strings.Contains(got, "del set bannet4_empty") {
		t.Errorf("Diff without keep leaves the ban sets alone:\n%s", got)
	}
}

func TestUpdateValidate(t *testing.T) {
	s4 := &Set{Name: "m4", Family: IPv4, KeyBits: 16, IsMap: true}
	base := func() *Update {
		return &Update{Table: "ipfence",
			Sets:      []SetChange{{Set: s4, Add: []Elem{{Key: pfx("10.1.0.0/16"), Verdict: Verdict{Kind: Jump, Chain: "c_new"}}}}},
			NewSets:   []*Set{{Name: "s_new", Family: IPv6, Interval: true, Elems: ElemsOf(Elem{Key: pfx("2001:db8::/32")})}},
			NewChains: []*Chain{{Name: "c_new", Rules: []Rule{{Lookup: &Lookup{Family: IPv6, Set: "s_new"}, Verdict: Verdict{Kind: Drop}}}}},
			Chains:    []*Chain{{Name: "c_old", Rules: []Rule{{Lookup: &Lookup{Family: IPv4, MaskBits: 16, Set: "m4", IsMap: true}}}}},
			DelSets:   []string{"s_gone"},
			DelChains: []string{"c_gone"},
		}
	}
	if err := base().validate(); err != nil {
		t.Fatalf("valid Update: %v", err)
	}
	for _, tc := range []struct {
		name   string
		modify func(u *Update)
		want   string
	}{
		{"bad table", func(u *Update) { u.Table = "" }, "table has no name"},
		{"bad deleted set name", func(u *Update) { u.DelSets[0] = "a b" }, "name must match"},
		{"chain deleted twice", func(u *Update) { u.DelChains = append(u.DelChains, "c_gone") }, "chain c_gone: deleted twice"},
		{"set deleted twice", func(u *Update) { u.DelSets = append(u.DelSets, "s_gone") }, "set s_gone: deleted twice"},
		{"chain created twice", func(u *Update) { u.NewChains = append(u.NewChains, &Chain{Name: "c_old"}) }, "chain c_old: in the update twice"},
		{"chain deleted and replaced", func(u *Update) { u.DelChains = append(u.DelChains, "c_old") }, "both deleted and created or replaced"},
		{"set deleted and changed", func(u *Update) { u.DelSets = append(u.DelSets, "m4") }, "set m4: both deleted and changed"},
		{"set created and changed", func(u *Update) { u.NewSets = append(u.NewSets, s4) }, "set m4: in the update twice"},
		{"new set element", func(u *Update) { editElem(&u.NewSets[0].Elems, 0, func(e *Elem) { e.Key = pfx("10.0.0.0/8") }) }, "is not an ipv6 prefix"},
		{"added element of a wrong length", func(u *Update) { u.Sets[0].Add[0].Key = pfx("10.0.0.0/8") }, "is not a /16 prefix"},
		{"map element without verdict", func(u *Update) { u.Sets[0].Add[0].Verdict = Verdict{} }, "map element without a verdict"},
		{"jump to a deleted chain", func(u *Update) { u.Sets[0].Add[0].Verdict.Chain = "c_gone" }, `jump to chain "c_gone", which the update deletes`},
		{"rule jumps to a deleted chain", func(u *Update) { u.Chains[0].Rules = []Rule{{Verdict: Verdict{Kind: Goto, Chain: "c_gone"}}} }, "which the update deletes"},
		{"jump to a new base chain", func(u *Update) { u.NewChains[0].Hook = &Hook{} }, `jump to base chain "c_new"`},
		{"lookup of a deleted set", func(u *Update) { u.NewChains[0].Rules[0].Lookup.Set = "s_gone" }, `lookup in set "s_gone", which the update neither creates nor lists in Sets`},
		{"lookup shape", func(u *Update) { u.Chains[0].Rules[0].Lookup.MaskBits = 24 }, "lookup masks to /24 but set m4 holds /16 keys"},
		{"empty rule", func(u *Update) { u.Chains[0].Rules = []Rule{{}} }, "empty rule"},
		{"after shorter than adds", func(u *Update) { u.Sets[0].After = &SetState{Len: 0} }, "0 elements after adding 1"},
		{"change without a set", func(u *Update) { u.Sets = append(u.Sets, SetChange{}) }, "names no set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := base()
			tc.modify(u)
			err := u.validate()
			if !errors.Is(err, ErrInvalidProgram) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate = %v, want ErrInvalidProgram containing %q", err, tc.want)
			}
		})
	}
}

func TestHashSize(t *testing.T) {
	for _, tc := range []struct {
		n       int
		timeout bool
		want    uint32
	}{
		{0, false, 16}, {1, false, 16}, {16, false, 16}, {17, false, 32}, {99, false, 128},
		{128, false, 128}, {129, false, 256}, {200_000, false, 262144}, {1 << 20, false, 1 << 20},
		{0, true, 0}, {1000, true, 0},
	} {
		if got := sizeFor(&Set{Timeout: tc.timeout}, tc.n); got != tc.want {
			t.Errorf("size of a set of %d elements (timeout %v) = %d, want %d", tc.n, tc.timeout, got, tc.want)
		}
	}
}

// changeElems changes about one element in every every: its verdict, or
// (one time in three each) it is removed or a new key is added in its
// place. Sets named in skip are left alone.
func changeElems(p *Program, every int, skip ...string) int {
	n := 0
	for _, s := range p.Sets {
		if slices.Contains(skip, s.Name) || !s.IsMap {
			continue
		}
		var out []Elem
		for i, e := range s.Elems.All() {
			if i%every != every/2 {
				out = append(out, e)
				continue
			}
			n++
			switch (i / every) % 3 {
			case 0: // verdict
				if e.Verdict.Kind == Drop {
					e.Verdict = Verdict{Kind: Accept}
				} else {
					e.Verdict = Verdict{Kind: Drop}
				}
				out = append(out, e)
			case 1: // removed
			case 2: // a new key next to it (one that no element has)
				k := e.Key.Masked()
				for next := nextPrefix(k); next.IsValid() && next.Addr().Is4() == k.Addr().Is4(); next = nextPrefix(next) {
					if !slices.ContainsFunc(s.Elems.List(), func(o Elem) bool { return o.Key == next }) {
						out = append(out, e, Elem{Key: next, Verdict: Verdict{Kind: Drop}})
						break
					}
				}
			}
		}
		s.Elems = ElemsOf(out...)
	}
	return n
}

// nextPrefix is the prefix of the same length right after p (invalid past
// the end of the address space).
func nextPrefix(p netip.Prefix) netip.Prefix {
	a := lastAddr(p).Next()
	if !a.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(a, p.Bits())
}

// BenchmarkDiff diffs the 200k-element program against a copy with 5% of
// its elements changed, an identical copy, and a copy with the same
// elements in another order (no change, but every map is built).
func BenchmarkDiff(b *testing.B) {
	old := largeProgram()
	changed, same, shuffled := largeProgram(), largeProgram(), largeProgram()
	n := changeElems(changed, 20)
	for _, s := range shuffled.Sets {
		es := s.Elems.List()
		slices.Reverse(es)
		s.Elems = ElemsOf(es...)
	}
	for _, bc := range []struct {
		name    string
		new     *Program
		changed int
	}{
		{"5pct_changed", changed, n},
		{"unchanged", same, 0},
		{"reordered", shuffled, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var u *Update
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if u, err = Diff(old, bc.new); err != nil {
					b.Fatal(err)
				}
			}
			sent := 0
			for _, sc := range u.Sets {
				sent += len(sc.Add) + len(sc.Del)
			}
			for _, s := range u.NewSets {
				sent += s.Elems.Len()
			}
			b.ReportMetric(float64(programElements(old)), "elements")
			b.ReportMetric(float64(bc.changed), "changed")
			b.ReportMetric(float64(sent), "sent")
		})
	}
}
