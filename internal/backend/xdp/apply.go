package xdp

import (
	"fmt"
	"slices"
	"time"

	"github.com/ipfence/ipfence/internal/plan"
)

// Report is what Apply did.
type Report struct {
	Rules        int         `json:"rules"`
	Interfaces   []Interface `json:"interfaces,omitempty"`
	MemoryBytes  int         `json:"memory_bytes,omitempty"`
	BuildMillis  int64       `json:"build_ms"`
	LoadMillis   int64       `json:"load_ms"`
	AttachMillis int64       `json:"attach_ms"`
	// Detached: the plan has no XDP rules any more and the previous
	// program was removed.
	Detached bool `json:"detached,omitempty"`
}

// Apply runs the XDP rules of p on opt's interfaces together with other,
// the transaction that loads p's other rules, in the order that never
// leaves a rule unenforced: when rules move into XDP (or XDP only
// changes) XDP switches first and other runs second; when rules leave XDP
// (before lists the rules that ran there), other takes them first. Each
// part is atomic; if other fails after XDP switched, XDP is switched
// back. Compiling and loading happen before either switches, so a table
// that does not compile or load leaves everything as it was.
//
// Without XDP rules other runs and ipfence's program, if any, is
// detached; the report is nil when there was none.
func Apply(p *plan.Plan, opt Options, before []string, other func() error) (*Report, error) {
	rules := FromPlan(p)
	if len(rules) == 0 {
		if err := other(); err != nil {
			return nil, err
		}
		detached, err := Flush(opt)
		if err != nil {
			return nil, fmt.Errorf("the other rules are applied, but removing the previous XDP program failed: %w", err)
		}
		if detached {
			return &Report{Detached: true}, nil
		}
		return nil, nil
	}
	if err := Check(opt); err != nil {
		return nil, err
	}
	rep := &Report{Rules: len(rules)}
	t0 := time.Now()
	l, err := BuildLayout(rules)
	if err != nil {
		return nil, fmt.Errorf("compiling the XDP rules: %w", err)
	}
	rep.BuildMillis, rep.MemoryBytes = time.Since(t0).Milliseconds(), l.Memory()
	swap, err := Prepare(l, opt)
	if err != nil {
		return nil, err
	}
	defer swap.Close() // before Commit: puts the old program back
	rep.LoadMillis = swap.Load.Milliseconds()
	attach := func() error {
		t := time.Now()
		err := swap.Attach()
		rep.AttachMillis = time.Since(t).Milliseconds()
		return err
	}
	if stillXDP(before, p) {
		if err := attach(); err != nil {
			return nil, err
		}
		if err := other(); err != nil {
			return nil, err
		}
	} else {
		if err := other(); err != nil {
			return nil, err
		}
		if err := attach(); err != nil {
			return nil, fmt.Errorf("the other rules are applied, but XDP kept its previous program: %w", err)
		}
	}
	rep.Interfaces = swap.Interfaces()
	if err := swap.Commit(); err != nil {
		return rep, fmt.Errorf("the XDP program runs, but pinning it failed (`ipfence status` may not show it): %w", err)
	}
	return rep, nil
}

// stillXDP reports whether no rule of before runs in nftables in p (rules
// gone from p need enforcing nowhere). When rules leave XDP and others
// enter it in one apply, the ones entering are unenforced between the two
// switches (milliseconds: both parts are built beforehand).
func stillXDP(before []string, p *plan.Plan) bool {
	for _, r := range p.Rules {
		if r.Backend != plan.XDP && slices.Contains(before, r.Name) {
			return false
		}
	}
	return true
}
