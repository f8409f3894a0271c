package xdp

import (
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
)

// TestStillXDP checks the order of an apply: XDP first unless a rule that
// ran in XDP now runs in nftables.
func TestStillXDP(t *testing.T) {
	p := &plan.Plan{Rules: []*plan.Rule{{Name: "a", Backend: plan.XDP}, {Name: "b", Backend: plan.NFTables}}}
	for _, tc := range []struct {
		before []string
		want   bool
	}{
		{nil, true},
		{[]string{"a"}, true},
		{[]string{"a", "b"}, false}, // b leaves XDP: nftables takes it first
		{[]string{"gone"}, true},    // removed: enforced nowhere
	} {
		if got := stillXDP(tc.before, p); got != tc.want {
			t.Errorf("stillXDP(%v) = %v, want %v", tc.before, got, tc.want)
		}
	}
}
