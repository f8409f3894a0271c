package statedir

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

func TestLock(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lock(); !errors.Is(err, ErrLocked) {
		t.Errorf("second lock: %v, want ErrLocked", err)
	}
	unlock()
	unlock2, err := d.Lock()
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}

func TestCompareAndSave(t *testing.T) {
	mk := func(action plan.Action, ps ...string) *plan.Plan {
		var b prefix.Builder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		s, _ := b.Build()
		return &plan.Plan{Rules: []*plan.Rule{{Name: "r", Action: action, Set: s,
			V4: &plan.Layout{Is4: true, Kind: plan.KindPlain}, V6: &plan.Layout{Kind: plan.KindEmpty}}}}
	}
	a := Summarize(mk(plan.Drop, "10.0.0.0/8", "192.0.2.0/24"))
	b := Summarize(mk(plan.Drop, "10.0.0.0/9", "198.51.100.0/24"))
	ch := Compare(a, b)
	if len(ch) != 1 || ch[0].Added != 1 || ch[0].Removed != 2 {
		t.Errorf("changes %+v, want +1 -2", ch)
	}
	if ch := Compare(nil, a); len(ch) != 1 || ch[0].Kind != "added" {
		t.Errorf("from nothing: %+v", ch)
	}
	if ch := Compare(a, a); len(ch) != 0 {
		t.Errorf("no change: %+v", ch)
	}
	if ch := Compare(a, Summarize(mk(plan.Reject, "10.0.0.0/8", "192.0.2.0/24"))); len(ch) != 1 || ch[0].Note == "" {
		t.Errorf("action change: %+v", ch)
	}
	d := Dir{Path: t.TempDir()}
	if err := d.SaveApplied("ns1", a); err != nil {
		t.Fatal(err)
	}
	got, err := d.LoadApplied("ns1")
	if err != nil || len(Compare(got, a)) != 0 {
		t.Errorf("round trip: %v %+v", err, got)
	}
	// Written from the set, the record reads as json.Marshal's of the
	// same record with its text; and one read from disk (text) writes
	// the same again.
	withText := *a
	withText.Rules = slices.Clone(a.Rules)
	withText.Rules[0].Prefixes, withText.Rules[0].set = a.Rules[0].PrefixList(), nil
	if !reflect.DeepEqual(*got, withText) {
		t.Errorf("read back %+v, want %+v", *got, withText)
	}
	if err := d.SaveApplied("ns2", got); err != nil {
		t.Fatal(err)
	}
	if again, err := d.LoadApplied("ns2"); err != nil || !reflect.DeepEqual(*again, withText) {
		t.Errorf("a record read and written again: %v %+v, want %+v", err, again, withText)
	}
	if ch := Compare(got, b); len(ch) != 1 || ch[0].Added != 1 || ch[0].Removed != 2 {
		t.Errorf("text to set: changes %+v, want +1 -2", ch)
	}
	if ch := Compare(b, got); len(ch) != 1 || ch[0].Added != 2 || ch[0].Removed != 1 {
		t.Errorf("set to text: changes %+v, want +2 -1", ch)
	}
	// Read for the plan it was made of (the daemon's): the same record,
	// its prefixes the plan's sets, not text.
	pa := mk(plan.Drop, "10.0.0.0/8", "192.0.2.0/24")
	rec, err := d.LoadAppliedFor("ns1", pa)
	if err != nil || rec.Rules[0].Prefixes != nil || rec.Rules[0].set != pa.Rules[0].Set {
		t.Fatalf("LoadAppliedFor: %v %+v", err, rec)
	}
	if ch := Compare(rec, b); len(ch) != 1 || ch[0].Added != 1 || ch[0].Removed != 2 {
		t.Errorf("set to set: changes %+v, want +1 -2", ch)
	}
	if !slices.Equal(rec.Rules[0].PrefixList(), withText.Rules[0].Prefixes) {
		t.Errorf("LoadAppliedFor: prefixes %v, want %v", rec.Rules[0].PrefixList(), withText.Rules[0].Prefixes)
	}
	rec.Rules[0].set = nil
	rec.Rules[0].Prefixes = withText.Rules[0].Prefixes
	if !reflect.DeepEqual(*rec, withText) {
		t.Errorf("LoadAppliedFor: %+v, want %+v", *rec, withText)
	}
	if err := d.ForgetApplied("ns1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.LoadApplied("ns1"); err == nil {
		t.Error("forgotten state still loads")
	}
}

// TestVouches: only a record from before the mark (no "marked" in its
// JSON), of an nftables apply of that very table, vouches for a table
// without the mark; what Summarize records never does.
func TestVouches(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	old := `{"time":"2026-11-20T10:00:00Z","table":"ipfence","priority":-300,"protect":[],"rules":[]}`
	if err := WriteFileAtomic(d.appliedPath(""), []byte(old)); err != nil {
		t.Fatal(err)
	}
	a, err := d.LoadApplied("")
	if err != nil {
		t.Fatal(err)
	}
	now := Summarize(&plan.Plan{Table: "ipfence", Backend: plan.NFTables})
	ipset := *a
	ipset.Backend = plan.IPSet
	for _, tc := range []struct {
		name  string
		a     *Applied
		table string
		want  bool
	}{
		{"older ipfence's record", a, "ipfence", true},
		{"another table", a, "mytable", false},
		{"no record", nil, "ipfence", false},
		{"today's record", now, "ipfence", false},
		{"an iptables backend's record", &ipset, "ipfence", false},
	} {
		if got := tc.a.Vouches(tc.table); got != tc.want {
			t.Errorf("%s: Vouches(%s) = %v, want %v", tc.name, tc.table, got, tc.want)
		}
	}
}

// TestAppliedHead reads a record's time, table and monitor_all without
// its rules: as SaveApplied writes it (rules last), and as json.Marshal
// wrote it once (rules in the middle, no monitor_all); none is none.
func TestAppliedHead(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if _, ok := d.AppliedHead("x"); ok {
		t.Error("a head with no record")
	}
	a := &Applied{Time: time.Unix(1700000000, 5).UTC(), Table: "tbl", MonitorAll: true, Protect: []string{"192.0.2.0/24"},
		Rules: []RuleApplied{{Name: "r", Action: plan.Drop, Prefixes: []string{"198.51.100.0/24", "203.0.113.7/32"}}}, Interfaces: []string{"eth0"}}
	if err := d.SaveApplied("x", a); err != nil {
		t.Fatal(err)
	}
	if h, ok := d.AppliedHead("x"); !ok || !h.Time.Equal(a.Time) || h.Table != "tbl" || !h.MonitorAll {
		t.Errorf("head of a saved record: %+v, %v", h, ok)
	}
	a.MonitorAll = false
	old, _ := json.Marshal(a)
	if err := WriteFileAtomic(d.appliedPath("y"), old); err != nil {
		t.Fatal(err)
	}
	if h, ok := d.AppliedHead("y"); !ok || !h.Time.Equal(a.Time) || h.Table != "tbl" || h.MonitorAll {
		t.Errorf("head of an old record: %+v, %v", h, ok)
	}
	if err := WriteFileAtomic(d.appliedPath("z"), []byte("[1,2]")); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.AppliedHead("z"); ok {
		t.Error("a head of a record that is no object")
	}
}
