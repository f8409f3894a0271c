package prefix

import (
	"bytes"
	"slices"
	"testing"

	"go4.org/netipx"
)

// TestIPSetLayout fails when netipx.IPSet is no longer laid out as
// ipsetLayout (after a netipx upgrade): the package then still works, through
// IPSetBuilder, but much more slowly. Check the new layout and update
// ipset.go.
func TestIPSetLayout(t *testing.T) {
	if !ipsetDirect {
		t.Fatal("netipx.IPSet is not laid out as ipsetLayout: sets are built the slow way; see ipset.go")
	}
}

// TestIPSetDirect checks that the netipx sets made directly (Set.IPSet)
// are those IPSetBuilder makes, that reading them directly (FromIPSet)
// gives back the same set, and that the fallback paths work.
func TestIPSetDirect(t *testing.T) {
	in := synthetic(5000, 7, true)
	var ref netipx.IPSetBuilder
	if err := Read(bytes.NewReader(in), "x", func(r netipx.IPRange, _ int) { ref.AddRange(r) }); err != nil {
		t.Fatal(err)
	}
	want, err := ref.IPSet()
	if err != nil {
		t.Fatal(err)
	}
	set, err := ReadSet(bytes.NewReader(in), "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, direct := range []bool{true, false} {
		saved := ipsetDirect
		ipsetDirect = direct && saved
		got := set.IPSet()
		back := FromIPSet(want)
		ipsetDirect = saved
		if !got.Equal(want) || !slices.Equal(got.Ranges(), want.Ranges()) || !slices.Equal(set.Ranges(), want.Ranges()) {
			t.Errorf("direct=%v: Builder's set differs from IPSetBuilder's", direct)
		}
		if !back.Equal(set) || !slices.Equal(back.Ranges(), want.Ranges()) {
			t.Errorf("direct=%v: FromIPSet differs from Builder's set", direct)
		}
		if !slices.Equal(rangesOf(want), want.Ranges()) || !slices.Equal(rangesOf(got), want.Ranges()) {
			t.Errorf("rangesOf differs from Ranges")
		}
		// The set works as a netipx set: lookups, algebra.
		for _, r := range want.Ranges()[:100] {
			if !got.ContainsRange(r) || !got.Contains(r.To()) || got.Contains(r.To().Next()) && !want.Contains(r.To().Next()) {
				t.Fatalf("direct=%v: lookups on %v disagree", direct, r)
			}
		}
		var u netipx.IPSetBuilder
		u.AddSet(got)
		u.RemoveSet(want)
		if diff, _ := u.IPSet(); len(diff.Ranges()) != 0 {
			t.Errorf("direct=%v: got - want = %v", direct, diff.Ranges())
		}
	}
	if rangesOf(nil) != nil {
		t.Errorf("rangesOf(nil) != nil")
	}
}

// BenchmarkNewIPSet compares making a netipx set of ~690k ranges directly
// with making it through netipx.IPSetBuilder (see ipset.go).
func BenchmarkNewIPSet(b *testing.B) {
	var bld Builder
	if err := bld.Read(bytes.NewReader(synthetic(1_000_000, 1, false)), "x"); err != nil {
		b.Fatal(err)
	}
	s, err := bld.Build()
	if err != nil {
		b.Fatal(err)
	}
	n4, _ := s.Len()
	for _, direct := range []bool{true, false} {
		name := "direct"
		if !direct {
			name = "IPSetBuilder"
		}
		b.Run(name, func(b *testing.B) {
			saved := ipsetDirect
			ipsetDirect = direct && saved
			defer func() { ipsetDirect = saved }()
			b.ReportAllocs()
			b.ReportMetric(float64(n4), "ranges")
			for b.Loop() {
				s.IPSet()
			}
		})
	}
}
