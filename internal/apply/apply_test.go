package apply

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/statedir"
)

// TestStillXDP checks the order of an apply: XDP first unless a rule that
// ran in XDP now runs in nftables.
func TestStillXDP(t *testing.T) {
	p := &plan.Plan{Rules: []*plan.Rule{{Name: "a", Backend: plan.XDP}, {Name: "b", Backend: plan.NFTables}}}
	rec := func(xdp ...string) *statedir.Applied {
		a := &statedir.Applied{}
		for _, n := range xdp {
			a.Rules = append(a.Rules, statedir.RuleApplied{Name: n, Backend: plan.XDP})
		}
		return a
	}
	for _, tc := range []struct {
		prev *statedir.Applied
		want bool
	}{
		{nil, true},
		{rec(), true},
		{rec("a"), true},
		{rec("a", "b"), false}, // b leaves XDP: nftables takes it first
		{rec("gone"), true},    // removed: enforced nowhere
	} {
		if got := stillXDP(tc.prev, p); got != tc.want {
			t.Errorf("stillXDP(%v) = %v, want %v", tc.prev, got, tc.want)
		}
	}
}

// TestRecordPrefixes: an apply reports what changed since the last one,
// prefix by prefix, and records its own prefixes for the next, although
// the last record's lists are let go while the kernel loads
// (DropPrefixes) and the new one is written from the plan's sets. In a
// lab namespace.
func TestRecordPrefixes(t *testing.T) {
	lab := netnstest.New(t, "nft")
	tg := &Target{NetNS: lab.FW, State: statedir.Dir{Path: t.TempDir()}}
	compile := func(ps ...string) *Compiled { return compileBlock(t, ps...) }
	for _, step := range []struct {
		prefixes []string
		change   string
	}{
		{[]string{"192.0.2.0/24", "2001:db8::/48"}, "rule block: new (2 prefixes)"},
		{[]string{"192.0.2.0/25", "198.51.100.7/32", "2001:db8::/48"}, "rule block: +1 -1 prefixes"},
		{[]string{"192.0.2.0/25", "198.51.100.7/32", "2001:db8::/48"}, ""},
	} {
		rep, err := applyTo(tg, compile(step.prefixes...))
		if err != nil {
			t.Fatal(err)
		}
		var changes []string
		for _, c := range rep.Changes {
			changes = append(changes, c.String())
		}
		if got := strings.Join(changes, "; "); got != step.change {
			t.Errorf("apply of %v: changes %q, want %q", step.prefixes, got, step.change)
		}
		rec := tg.Previous()
		if rec == nil || len(rec.Rules) != 1 || !slices.Equal(rec.Rules[0].Prefixes, step.prefixes) || !slices.Equal(rep.Applied.Rules[0].PrefixList(), step.prefixes) {
			t.Errorf("apply of %v: recorded %+v, reported %+v", step.prefixes, rec, rep.Applied)
		}
	}
}

// TestSavedRecord: an apply given the plan in force (a daemon's) takes
// the record this Target saved last from memory, but reads the file
// again once another apply rewrote it, and reports its changes against
// that one. In a lab namespace.
func TestSavedRecord(t *testing.T) {
	lab := netnstest.New(t, "nft")
	state := statedir.Dir{Path: t.TempDir()}
	tg := &Target{NetNS: lab.FW, State: state}
	compile := func(ps ...string) *Compiled { return compileBlock(t, ps...) }
	apply := func(tg *Target, c *Compiled, prev *Compiled) string {
		t.Helper()
		o := Options{}
		if prev != nil {
			o.Previous = prev.Plan
		}
		rep, err := applyWith(tg, c, o)
		if err != nil {
			t.Fatal(err)
		}
		var changes []string
		for _, ch := range rep.Changes {
			changes = append(changes, ch.String())
		}
		return strings.Join(changes, "; ")
	}
	a, other := compile("192.0.2.0/24"), compile("203.0.113.0/24")
	apply(tg, a, nil)
	if kept, _ := tg.lastSaved(); kept == nil {
		t.Fatal("the record just saved is not kept")
	}
	b := compile("192.0.2.0/24", "198.51.100.0/24", "198.51.100.7/32")
	// Given a plan that is not a's, the kept record still says a.
	if got, want := apply(tg, b, other), "rule block: +1 -0 prefixes"; got != want {
		t.Errorf("from the kept record: changes %q, want %q", got, want)
	}
	// Another apply (the command line's) rewrites the record: the kept
	// one no longer stands for the file.
	apply(&Target{NetNS: lab.FW, State: state}, other, nil)
	if kept, rewritten := tg.lastSaved(); kept != nil || !rewritten {
		t.Fatal("the kept record outlived a rewrite of its file")
	}
	// b's plan is not what the file records: the file says.
	if got, want := apply(tg, compile("203.0.113.0/24", "192.0.2.0/24"), b), "rule block: +1 -0 prefixes"; got != want {
		t.Errorf("after a rewrite: changes %q, want %q (against the file's record)", got, want)
	}
}

// compileBlock compiles a policy of one rule that drops ps.
func compileBlock(t *testing.T, ps ...string) *Compiled {
	t.Helper()
	var b prefix.Builder
	for _, p := range ps {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	set, _ := b.Build()
	c, err := Compile(&plan.Input{Table: "ipfence", Priority: -300, Protect: plan.Builtin(),
		Rules: []plan.RuleInput{{Name: "block", Action: plan.Drop, IPv4: true, IPv6: true, Set: set}}}, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
