package nft

// Kernel tests of Diff and ApplyUpdate, in fresh namespaces (see
// kernel_test.go): what an Update leaves in the kernel must be what Apply
// of the new Program loads.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// cloneProgram is a deep copy of p.
func cloneProgram(p *Program) *Program {
	c := &Program{Table: p.Table}
	for _, s := range p.Sets {
		cs := *s
		cs.Elems = ElemsOf(s.Elems.List()...)
		c.Sets = append(c.Sets, &cs)
	}
	for _, ch := range p.Chains {
		cc := &Chain{Name: ch.Name, Rules: slices.Clone(ch.Rules)}
		if ch.Hook != nil {
			h := *ch.Hook
			cc.Hook = &h
		}
		for i := range cc.Rules {
			r := &cc.Rules[i]
			r.Ports = slices.Clone(r.Ports)
			if r.Lookup != nil {
				l := *r.Lookup
				r.Lookup = &l
			}
		}
		c.Chains = append(c.Chains, cc)
	}
	return c
}

// kernelOrder is new with its sets and chains in the order the kernel
// lists them after u turned a table loaded as cur into new: what stays in
// cur's order, then what u created. (The kernel lists objects in the
// order they were created; Apply creates them in Program order. Nothing
// else depends on it.)
func kernelOrder(cur, new *Program, u *Update) *Program {
	out := &Program{Table: new.Table}
	delSets, delChains := map[string]bool{}, map[string]bool{}
	for _, n := range u.DelSets {
		delSets[n] = true
	}
	for _, n := range u.DelChains {
		delChains[n] = true
	}
	for _, s := range cur.Sets {
		if !delSets[s.Name] {
			if ns := setOf(new, s.Name); ns != nil {
				s = ns
			}
			out.Sets = append(out.Sets, s)
		}
	}
	out.Sets = append(out.Sets, u.NewSets...)
	for _, c := range cur.Chains {
		if !delChains[c.Name] {
			out.Chains = append(out.Chains, chainOf(new, c.Name))
		}
	}
	out.Chains = append(out.Chains, u.NewChains...)
	return out
}

// checkDiff applies Diff(cur, new) in namespace a, which holds cur, and
// Apply of new in namespace b, and compares them. It returns new in the
// order the kernel now lists its objects, the cur of a next step.
func checkDiff(t *testing.T, a, b string, cur, new *Program) *Program {
	t.Helper()
	if err := new.Validate(); err != nil {
		t.Fatalf("new program: %v", err)
	}
	u, err := Diff(cur, new)
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	res, err := ApplyUpdate(context.Background(), u, ApplyOptions{NetNS: a})
	if err != nil {
		t.Fatalf("ApplyUpdate of\n  %s\n: %v", strings.Join(summary(u), "\n  "), err)
	}
	t.Logf("update: %d sets changed (+%d -%d elements), %d new sets, %d deleted, %d chains replaced, %d new, %d deleted; flush %v",
		len(u.Sets), res.Added, res.Deleted, res.NewSets, res.DelSets, len(u.Chains), res.NewChains, res.DelChains, res.Flush)
	want := kernelOrder(cur, new, u)
	mustApply(t, want, b)
	compareNamespaces(t, a, b, "handle")
	return want
}

// TestDiffMatchesApply loads old, applies Diff(old, new) over it, and
// compares with Apply of new: the differential test of Diff and
// ApplyUpdate.
func TestDiffMatchesApply(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft")
	shapes := func(mods ...func(*Program)) func() *Program {
		return func() *Program {
			p := shapesProgram()
			for _, m := range mods {
				m(p)
			}
			return p
		}
	}
	gen := func(seed uint64, chains, per4, per6 int) func() *Program {
		return func() *Program { return generatedProgram(seed, chains, per4, per6) }
	}
	fromZero := func(p *Program) {
		a := setOf(p, "allow4")
		a.Elems.Append(Elem{Key: pfx("0.0.0.0/8")})
	}
	emptied := func(p *Program) { setOf(p, "allow6").Elems = Elems{} }
	filled := func(p *Program) {
		setOf(p, "empty6").Elems = ElemsOf(Elem{Key: pfx("::/3")}, Elem{Key: pfx("2001:db8:1::/48")})
	}
	for _, tc := range []struct {
		name     string
		old, new func() *Program
	}{
		{"identical", shapes(), shapes()},
		{"port rule", shapes(), shapes(shapesPort)},
		{"elements", shapes(), shapes(shapesElems)},
		{"chain and its map removed", shapes(), shapes(shapesDropChain)},
		{"chain and its map added", shapes(shapesDropChain), shapes()},
		{"new level", shapes(), shapes(shapesNewLevel)},
		{"level removed", shapes(shapesNewLevel), shapes()},
		{"set grows past its size", shapes(), shapes(shapesGrow)},
		{"set shrinks", shapes(shapesGrow), shapes()},
		{"interval set from zero", shapes(), shapes(fromZero)},
		{"interval set no longer from zero", shapes(fromZero), shapes()},
		{"interval set emptied", shapes(), shapes(emptied)},
		{"interval set filled", shapes(), shapes(filled)},
		{"everything", shapes(), shapes(shapesPort, shapesElems, shapesDropChain, shapesNewLevel, shapesGrow, fromZero, emptied, filled)},
		{"everything back", shapes(shapesPort, shapesElems, shapesDropChain, shapesNewLevel, shapesGrow, fromZero, emptied, filled), shapes()},
		{"generated, other seed", gen(7, 300, 12, 8), gen(8, 300, 12, 8)},
		{"generated, fewer chains and larger maps", gen(7, 300, 12, 8), gen(9, 200, 20, 10)},
		{"generated, more chains and smaller maps", gen(9, 200, 20, 10), gen(7, 300, 12, 8)},
		{"minimal to generated", minimalProgram, gen(7, 40, 12, 8)},
		{"generated to empty", gen(7, 40, 12, 8), func() *Program { return &Program{Table: "ipfence"} }},
		{"empty to shapes", func() *Program { return &Program{Table: "ipfence"} }, shapes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newNetns(t), newNetns(t)
			old := tc.old()
			mustApply(t, old, a)
			checkDiff(t, a, b, old, tc.new())
		})
	}
}

// TestDiffIntervalSequence walks interval sets through every state of
// the interval-end element at the zero address: none, before a first
// interval, first interval at zero, emptied, timeouts.
func TestDiffIntervalSequence(t *testing.T) {
	a, b := newNetns(t), newNetns(t)
	prog := func(v4, v6 []string, timeouts bool) *Program {
		p := &Program{Table: "ipfence"}
		for _, f := range []struct {
			name string
			fam  Family
			ps   []string
		}{{"i4", IPv4, v4}, {"i6", IPv6, v6}} {
			s := &Set{Name: f.name, Family: f.fam, Interval: true, Timeout: timeouts}
			for i, k := range f.ps {
				e := Elem{Key: pfx(k)}
				if timeouts && i%2 == 0 {
					e.Timeout = time.Duration(i+1) * time.Hour
				}
				s.Elems.Append(e)
			}
			p.Sets = append(p.Sets, s)
		}
		p.Chains = []*Chain{{Name: "pre", Hook: &Hook{Priority: -300}, Rules: []Rule{
			{Lookup: &Lookup{Family: IPv4, Set: "i4"}, Verdict: Verdict{Kind: Drop}},
			{Lookup: &Lookup{Family: IPv6, Set: "i6"}, Verdict: Verdict{Kind: Drop}},
		}}}
		return p
	}
	steps := []*Program{
		prog([]string{"10.0.0.0/8"}, []string{"2001:db8::/32"}, false),
		prog([]string{"0.0.0.0/8", "10.0.0.0/8"}, []string{"::/8", "2001:db8::/32"}, false),
		prog([]string{"0.0.0.0/8", "20.0.0.0/8"}, []string{"::/8", "2001:db9::/32"}, false),
		prog([]string{"0.0.0.0/7", "10.0.0.0/9", "10.128.0.0/9"}, []string{"::/7", "ff00::/8"}, false),
		prog(nil, nil, false),
		prog([]string{"0.0.0.0/0"}, []string{"::/0"}, false),
		prog([]string{"255.0.0.0/8"}, []string{"ffff::/16"}, false),
		prog([]string{"10.0.0.0/8", "255.0.0.0/8"}, []string{"ffff::/16", "::1/128"}, false),
		prog(nil, nil, false),
	}
	mustApply(t, steps[0], a)
	cur := steps[0]
	for i, next := range steps[1:] {
		t.Run(fmt.Sprint(i+1), func(t *testing.T) { cur = checkDiff(t, a, b, cur, next) })
	}
	tsteps := []*Program{
		prog([]string{"10.0.0.0/8", "11.0.0.0/8"}, []string{"2001:db8::/32", "2001:db9::/32"}, true),
		prog([]string{"10.0.0.0/8", "11.0.0.0/8", "12.0.0.0/8"}, []string{"2001:db9::/32", "2001:db8::/32"}, true),
		prog([]string{"0.0.0.0/8", "10.0.0.0/8"}, nil, true),
	}
	mustApply(t, tsteps[0], a)
	cur = tsteps[0]
	for i, next := range tsteps[1:] {
		t.Run(fmt.Sprintf("timeouts %d", i+1), func(t *testing.T) { cur = checkDiff(t, a, b, cur, next) })
	}
}

// mutate changes p at random as feed refreshes do: verdicts, elements
// added and removed, chains with their maps added and removed, the
// allowlists, a rule of the base chain.
func mutate(p *Program, rng *rand.Rand) {
	top4, top6 := setOf(p, "v4_8"), setOf(p, "v6_16")
	verdicts := []Verdict{{Kind: Drop}, {Kind: Accept}, {Kind: Goto, Chain: "blocked"}}
	randKey := func(s *Set) netip.Prefix {
		var a netip.Addr
		if s.Family == IPv4 {
			a = netip.AddrFrom4([4]byte{byte(1 + rng.IntN(223)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		} else {
			var b [16]byte
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			b[0] = 0x20 | b[0]&0x0f
			a = netip.AddrFrom16(b)
		}
		return netip.PrefixFrom(a, s.KeyBits).Masked()
	}
	addElems := func(s *Set, n int) {
		have := map[netip.Prefix]bool{}
		for _, e := range s.Elems.All() {
			have[e.Key] = true
		}
		for range n {
			if k := randKey(s); !have[k] {
				have[k] = true
				s.Elems.Append(Elem{Key: k, Verdict: verdicts[rng.IntN(len(verdicts))]})
			}
		}
	}
	var subs []*Set // second-level maps
	for _, s := range p.Sets {
		if s.IsMap && s != top4 && s != top6 {
			subs = append(subs, s)
		}
	}
	for range 1 + rng.IntN(4) {
		op := rng.IntN(7)
		if len(subs) == 0 && op <= 3 {
			op = 4
		}
		switch op {
		case 0, 1: // verdicts
			s := subs[rng.IntN(len(subs))]
			for i := range s.Elems.All() {
				if rng.IntN(4) == 0 {
					editElem(&s.Elems, i, func(e *Elem) { e.Verdict = verdicts[rng.IntN(len(verdicts))] })
				}
			}
		case 2: // elements removed and added, sometimes past the declared size
			s := subs[rng.IntN(len(subs))]
			s.Elems = ElemsOf(slices.DeleteFunc(s.Elems.List(), func(Elem) bool { return rng.IntN(5) == 0 })...)
			addElems(s, rng.IntN(2*s.Elems.Len()+2))
		case 3: // a chain and its map removed, with the entries jumping to it
			s := subs[rng.IntN(len(subs))]
			var chain string
			for _, c := range p.Chains {
				if len(c.Rules) > 0 && c.Rules[0].Lookup != nil && c.Rules[0].Lookup.Set == s.Name {
					chain = c.Name
				}
			}
			dropSet(p, s.Name)
			dropChain(p, chain)
			for _, top := range []*Set{top4, top6} {
				top.Elems = ElemsOf(slices.DeleteFunc(top.Elems.List(), func(e Elem) bool { return e.Verdict.Chain == chain })...)
			}
			subs = slices.DeleteFunc(subs, func(x *Set) bool { return x == s })
		case 4: // a new chain and map below a free top-level key
			fam, top := IPv4, top4
			if rng.IntN(2) == 0 {
				fam, top = IPv6, top6
			}
			name := fmt.Sprintf("x%d", rng.Uint32())
			m := &Set{Name: name + "_m", Family: fam, KeyBits: 24, IsMap: true}
			if fam == IPv6 {
				m.KeyBits, m.Key = 40, KeyWords
			}
			addElems(m, 1+rng.IntN(30))
			k := randKey(&Set{Family: fam, KeyBits: top.KeyBits})
			if slices.ContainsFunc(top.Elems.List(), func(e Elem) bool { return e.Key == k }) {
				continue
			}
			top.Elems.Append(Elem{Key: k, Verdict: Verdict{Kind: Jump, Chain: name}})
			p.Sets = append(p.Sets, m)
			p.Chains = append(p.Chains, &Chain{Name: name, Rules: []Rule{
				{Lookup: &Lookup{Family: fam, MaskBits: m.KeyBits, Key: m.Key, Set: m.Name, IsMap: true}},
				{Counter: true, Verdict: Verdict{Kind: Return}},
			}})
			subs = append(subs, m)
		case 5: // the allowlist
			a := setOf(p, "allow4")
			a.Elems = ElemsOf(slices.DeleteFunc(a.Elems.List(), func(Elem) bool { return rng.IntN(3) == 0 })...)
			for range rng.IntN(3) {
				k := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(rng.IntN(2) * 100), byte(rng.IntN(256))}), 16)
				if !slices.ContainsFunc(a.Elems.List(), func(e Elem) bool { return e.Key.Overlaps(k) }) {
					a.Elems.Append(Elem{Key: k})
				}
			}
		case 6: // a rule of the base chain
			pre := chainOf(p, "pre")
			if i := slices.IndexFunc(pre.Rules, func(r Rule) bool { return r.Proto != 0 }); i >= 0 {
				pre.Rules = slices.Delete(pre.Rules, i, i+1)
			} else {
				pre.Rules = slices.Insert(pre.Rules, 2, Rule{Family: IPv4, Proto: ProtoTCP,
					Ports: []PortRange{{22, 22}, {uint16(1000 + rng.IntN(1000)), 3000}}, Verdict: Verdict{Kind: Jump, Chain: "blocked"}})
			}
		}
	}
}

var mutationSeed = flag.Uint64("seed", 0, "seed of TestDiffRandomMutations (0: the time)")

// TestDiffRandomMutations applies a chain of Diffs of random mutations,
// each checked against Apply of the mutated program.
func TestDiffRandomMutations(t *testing.T) {
	a, b := newNetns(t), newNetns(t)
	seed := *mutationSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (go test -run TestDiffRandomMutations -seed %[1]d repeats this run)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	cur := generatedProgram(21, 60, 20, 12)
	mustApply(t, cur, a)
	for i := range 10 {
		next := cloneProgram(cur)
		mutate(next, rng)
		ok := t.Run(fmt.Sprint(i), func(t *testing.T) { cur = checkDiff(t, a, b, cur, next) })
		if !ok {
			break // the namespaces no longer hold cur
		}
	}
}

// TestDiffKeepingBans: bans made after the old program was loaded
// survive a DiffKeeping of the ban sets.
func TestDiffKeepingBans(t *testing.T) {
	a, b := newNetns(t), newNetns(t)
	ctx := context.Background()
	old := shapesProgram()
	mustApply(t, old, a)
	// Meanwhile: a ban added, one lifted.
	ban4 := setOf(old, "ban4")
	added := Elem{Key: pfx("198.51.100.50/32"), Timeout: 3 * time.Hour}
	if _, err := ApplyUpdate(ctx, &Update{Table: "ipfence", Sets: []SetChange{
		{Set: ban4, Add: []Elem{added}, Del: []Elem{{Key: pfx("198.51.100.21/32")}}},
	}}, ApplyOptions{NetNS: a}); err != nil {
		t.Fatal(err)
	}
	// The refresh's program has the bans of old, and feed changes.
	new := shapesProgram()
	shapesElems(new)
	shapesNewLevel(new)
	bans := func(name string) bool { return name == "ban4" || name == "bannet6" || name == "bannet4_empty" }
	u, err := DiffKeeping(old, new, bans)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyUpdate(ctx, u, ApplyOptions{NetNS: a}); err != nil {
		t.Fatal(err)
	}
	want := kernelOrder(old, new, u)
	setOf(want, "ban4").Elems = ElemsOf(ban4.Elems.At(0), ban4.Elems.At(2), added)
	mustApply(t, want, b)
	compareNamespaces(t, a, b, "handle")
}

// TestRejectedUpdateChangesNothing hands the kernel Updates it must
// refuse, each with many valid changes besides, and checks that the
// table is untouched.
func TestRejectedUpdateChangesNothing(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	mustApply(t, shapesProgram(), ns)
	before := normalizedJSON(t, ns)

	// Valid changes of every kind, to which each case adds a bad one.
	valid := func(t *testing.T) *Update {
		new := shapesProgram()
		shapesElems(new)
		shapesNewLevel(new)
		shapesDropChain(new)
		shapesPort(new)
		u, err := Diff(shapesProgram(), new)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	changeOf := func(u *Update, name string) *SetChange {
		for i := range u.Sets {
			if u.Sets[i].Set.Name == name {
				return &u.Sets[i]
			}
		}
		t.Fatalf("no change of set %s", name)
		return nil
	}
	for _, tc := range []struct {
		name string
		bad  func(u *Update)
	}{
		{"element jumps to a missing chain", func(u *Update) {
			sc := changeOf(u, "v4_16")
			sc.Add = append(sc.Add, Elem{Key: pfx("10.9.0.0/16"), Verdict: Verdict{Kind: Jump, Chain: "nochain"}})
		}},
		{"new set's element jumps to a missing chain", func(u *Update) {
			u.NewSets[0].Elems = ElemsOf(append(u.NewSets[0].Elems.List(), Elem{Key: pfx("2001:db8:9::/48"), Verdict: Verdict{Kind: Goto, Chain: "nochain"}})...)
		}},
		{"deleted set still looked up", func(u *Update) { u.DelSets = append(u.DelSets, "allow6") }},
		{"deleted chain still jumped to", func(u *Update) { u.DelChains = append(u.DelChains, "w6_deep") }},
		{"replaced chain missing", func(u *Update) {
			u.Chains = append(u.Chains, &Chain{Name: "nochain", Rules: []Rule{{Verdict: Verdict{Kind: Drop}}}})
		}},
		{"set grows past its size in place", func(u *Update) {
			sc := SetChange{Set: setOf(shapesProgram(), "host4"), After: &SetState{Len: 22}}
			for i := range 20 {
				sc.Add = append(sc.Add, Elem{Key: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + i)}), 32)})
			}
			u.Sets = append(u.Sets, sc)
		}},
		{"jump loop", func(u *Update) {
			u.NewChains = append(u.NewChains, &Chain{Name: "loop", Rules: []Rule{{Verdict: Verdict{Kind: Jump, Chain: "v6_2001_db8"}}}})
			for _, c := range u.NewChains {
				if c.Name == "v6_2001_db8" {
					c.Rules = append(slices.Clone(c.Rules[:1]), Rule{Counter: true, Verdict: Verdict{Kind: Jump, Chain: "loop"}})
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := valid(t)
			tc.bad(u)
			if err := u.validate(); err != nil {
				t.Fatalf("the bad Update fails validation, the kernel is not asked: %v", err)
			}
			_, err := ApplyUpdate(ctx, u, ApplyOptions{NetNS: ns})
			if err == nil || !strings.Contains(err.Error(), "kernel rejected the transaction, nothing was changed") {
				t.Fatalf("ApplyUpdate = %v, want the kernel to reject it", err)
			}
			t.Logf("error: %v", err)
			if after := normalizedJSON(t, ns); after != before {
				t.Errorf("a rejected update changed the kernel:\n%s", lineDiff(before, after))
			}
		})
	}

	// The valid part alone goes through (the cases failed for their bad part).
	if _, err := ApplyUpdate(ctx, valid(t), ApplyOptions{NetNS: ns}); err != nil {
		t.Errorf("the valid Update: %v", err)
	}
}

// BenchmarkApplyDiff measures sending a Diff of 5% of the elements of
// the 200k-element program, back and forth (as root).
func BenchmarkApplyDiff(b *testing.B) {
	ns := newNetns(b)
	old, new := largeProgram(), largeProgram()
	changeElems(new, 20)
	mustApply(b, old, ns)
	fwd, err := Diff(old, new)
	if err != nil {
		b.Fatal(err)
	}
	back, err := Diff(new, old)
	if err != nil {
		b.Fatal(err)
	}
	var flush time.Duration
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		u := fwd
		if i%2 == 1 {
			u = back
		}
		i++
		res, err := ApplyUpdate(context.Background(), u, ApplyOptions{NetNS: ns})
		if err != nil {
			b.Fatal(err)
		}
		flush += res.Flush
	}
	b.ReportMetric(float64(flush.Milliseconds())/float64(b.N), "flush-ms/op")
}

// TestDiffLarge applies a Diff of 5% of the elements of the 200k-element
// program, and back, and compares with Apply; it logs the timings (the
// targets live in BenchmarkDiff and BenchmarkApplyDiff).
func TestDiffLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("compares two 200k-element tables")
	}
	a, b := newNetns(t), newNetns(t)
	old, new := largeProgram(), largeProgram()
	changeElems(new, 20)
	res := mustApply(t, old, a)
	t.Logf("Apply: build %v, flush %v", res.Build, res.Flush)
	cur := old
	for i, next := range []*Program{new, old} {
		start := time.Now()
		u, err := Diff(cur, next)
		if err != nil {
			t.Fatal(err)
		}
		diffed := time.Since(start)
		res, err := ApplyUpdate(context.Background(), u, ApplyOptions{NetNS: a})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("step %d: Diff %v, ApplyUpdate %v (flush %v): %d sets changed (+%d -%d elements), %d replaced",
			i, diffed, time.Since(start)-diffed, res.Flush, len(u.Sets), res.Added, res.Deleted, res.NewSets)
		cur = next
	}
	// What the kernel holds, over netlink and in nft's terse listing
	// (compareNamespaces would also list 200k elements as JSON, twice).
	mustApply(t, old, b)
	start := time.Now()
	if la, lb := nft(t, a, "", "-t", "list", "ruleset"), nft(t, b, "", "-t", "list", "ruleset"); la != lb {
		t.Errorf("nft -t list ruleset differs:\n%s", lineDiff(lb, la))
	}
	if ka, kb := readKernel(t, a, "ipfence"), readKernel(t, b, "ipfence"); !reflect.DeepEqual(ka, kb) {
		t.Error("the kernel holds other objects after the updates than after Apply")
	}
	t.Logf("compared in %v", time.Since(start))
}
