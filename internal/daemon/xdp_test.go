package daemon

import (
	"net/netip"
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// TestSameXDP checks when a reload must swap the XDP program: a rule's
// set, name or action, or the interfaces changed.
func TestSameXDP(t *testing.T) {
	compile := func(ifs []string, feed string, action plan.Action) *plan.Plan {
		t.Helper()
		var b prefix.Builder
		b.AddPrefix(netip.MustParsePrefix(feed))
		s, _ := b.Build()
		p, err := plan.Compile(&plan.Input{Backend: plan.XDP, Interfaces: ifs, Rules: []plan.RuleInput{
			{Name: "feed", Action: action, IPv4: true, Set: s, Where: "p.yaml:1"},
		}}, plan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := compile([]string{"eth0"}, "192.0.2.0/24", plan.Drop)
	if !sameXDP(a, compile([]string{"eth0"}, "192.0.2.0/24", plan.Drop)) {
		t.Error("the same plan compiled twice: not the same XDP")
	}
	for name, b := range map[string]*plan.Plan{
		"another set":     compile([]string{"eth0"}, "192.0.2.0/25", plan.Drop),
		"more interfaces": compile([]string{"eth0", "eth1"}, "192.0.2.0/24", plan.Drop),
		"allow-only":      compile([]string{"eth0"}, "192.0.2.0/24", plan.AllowOnly),
		"no XDP rules":    {Interfaces: []string{"eth0"}},
	} {
		if sameXDP(a, b) {
			t.Errorf("%s: same XDP, want a swap", name)
		}
	}
}
