package apply

import (
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
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
