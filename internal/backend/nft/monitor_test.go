package nft

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// TestMonitorDiff: a rule in monitor mode differs from the enforcing one
// only by its hit chain, which counts and ends without a verdict (the
// packet returns to the base chain); switching modes is an Update that
// replaces that chain and sends no element.
func TestMonitorDiff(t *testing.T) {
	var b prefix.Builder
	for i := range 3000 {
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), 32))
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 8), byte(i)}), 48))
	}
	set, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	prog := func(a plan.Action, monitor bool) *Program {
		p, err := plan.Compile(&plan.Input{Rules: []plan.RuleInput{{Name: "feed", Action: a, Monitor: monitor, IPv4: true, IPv6: true, Set: set}}}, plan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return FromPlan(p, Dynamic{})
	}
	for _, a := range []plan.Action{plan.Drop, plan.Reject, plan.AllowOnly} {
		t.Run(string(a), func(t *testing.T) {
			enforce, monitor := prog(a, false), prog(a, true)
			if err := monitor.Validate(); err != nil {
				t.Fatal(err)
			}
			hit := HitChain(0, "feed")
			rules := chainOf(monitor, hit).Rules
			last := rules[len(rules)-1]
			want := MonitorComment + "drop"
			if a == plan.Reject {
				want = MonitorComment + "reject"
			}
			if !last.Counter || last.Verdict.Kind != Continue || last.Reject != NoReject || last.Comment != want {
				t.Errorf("the monitor hit chain ends with %+v, want a counter and no verdict", last)
			}
			for _, r := range rules[:len(rules)-1] {
				if r.Verdict.Kind != Return {
					t.Errorf("exempt packets get %+v in monitor mode, want a return", r.Verdict)
				}
			}
			for _, pair := range [][2]*Program{{enforce, monitor}, {monitor, enforce}} {
				u, err := Diff(pair[0], pair[1])
				if err != nil {
					t.Fatal(err)
				}
				if len(u.Chains) != 1 || u.Chains[0].Name != hit || len(u.NewSets)+len(u.NewChains)+len(u.DelSets)+len(u.DelChains) > 0 {
					t.Errorf("the switch is %q, want the hit chain replaced and nothing else", summary(u))
				}
				for _, sc := range u.Sets {
					if len(sc.Add)+len(sc.Del) > 0 || sc.After != nil {
						t.Errorf("the switch changes set %s: %s", sc.Set.Name, fmt.Sprint(summary(u)))
					}
				}
			}
		})
	}
}
