package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/backend/handover"
	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/daemon"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// engine applies the revisions and fleet bans on this host: the daemon
// (nftables and XDP), or iptEngine where the host runs iptables.
type engine interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
	Reload(ctx context.Context) (daemon.ReloadResult, error)
	Ban(ctx context.Context, reqs []bansets.Request) ([]ban.Ban, error)
	Unban(ctx context.Context, ls []bansets.Lift) ([]ban.Ban, error)
	Status() api.Status
}

var _ engine = (*daemon.Daemon)(nil)

// forHost returns in as a host whose backend is b runs it. With an
// iptables backend the whole policy runs there (rules that ask for XDP
// too, which has no place beside iptables); with nftables a policy
// written for an iptables backend runs in nftables, and XDP rules stay.
func forHost(in *plan.Input, b plan.Backend) *plan.Input {
	out := *in
	switch {
	case b.IPTables():
		out.Backend = b
		out.Rules = slices.Clone(in.Rules)
		for i := range out.Rules {
			out.Rules[i].Backend = ""
		}
	case in.Backend.IPTables() || in.Backend == plan.Auto:
		out.Backend = plan.NFTables
	}
	return &out
}

// iptEngine runs the revisions with the ipset or iptables-split backend,
// for hosts without nftables. A revision is loaded whole (the sets filled
// beside the live ones and swapped in, each family's chains replaced in
// one commit per table; see ipt.Apply). Fleet bans go into the ban sets
// with their time left, and the kernel lets them go when it is up (ipset
// backend; iptables-split has no sets and refuses bans).
type iptEngine struct {
	cfg     daemon.Config // NetNS, StateDir, Logger, Input, XDP (to detach an earlier program)
	backend plan.Backend
	flavour string
	mark    func() uint32 // the revision's reject mark
	ready   chan struct{}

	mu     sync.Mutex // one load or ban batch at a time; guards what follows
	table  string
	guard  ban.Guard
	status api.Status
}

func newIPTEngine(cfg daemon.Config, backend plan.Backend, flavour string, mark func() uint32) *iptEngine {
	return &iptEngine{cfg: cfg, backend: backend, flavour: flavour, mark: mark, ready: make(chan struct{}),
		status: api.Status{Policy: cfg.Policy, NetNS: cfg.NetNS}}
}

func (e *iptEngine) Ready() <-chan struct{} { return e.ready }

// Run loads the revision in force, then holds the state folder's lock
// until ctx is done. The rules stay in the kernel when it returns.
func (e *iptEngine) Run(ctx context.Context) error {
	e.status.Started = time.Now()
	unlock, err := (statedir.Dir{Path: e.cfg.StateDir}).Lock()
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := e.Reload(ctx); err != nil {
		return err
	}
	close(e.ready)
	<-ctx.Done()
	return nil
}

// Reload compiles the revision Input gives and loads it whole.
func (e *iptEngine) Reload(ctx context.Context) (daemon.ReloadResult, error) {
	t0 := time.Now()
	in, err := e.cfg.Input(ctx)
	if err != nil {
		return daemon.ReloadResult{}, err
	}
	p, err := plan.Compile(in, plan.Options{})
	if err != nil {
		return daemon.ReloadResult{}, err
	}
	for _, w := range p.Warnings {
		e.cfg.Logger.Warn(w)
	}
	if err := hostaddr.CheckPlan(p, e.cfg.NetNS); err != nil {
		return daemon.ReloadResult{}, err
	}
	own, err := hostaddr.List(e.cfg.NetNS)
	if err != nil {
		return daemon.ReloadResult{}, err
	}
	prog, err := ipt.FromPlan(p, ipt.LowerOptions{RejectMark: e.mark(), Flavour: e.flavour, Bans: e.backend == plan.IPSet})
	if err != nil {
		return daemon.ReloadResult{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := statedir.Dir{Path: e.cfg.StateDir}
	prev, _ := st.LoadApplied(e.cfg.NetNS) // none: nothing to hand over from
	r, err := handover.ToIPT(ctx, prog, ipt.Options{NetNS: e.cfg.NetNS, Flavour: e.flavour}, prev, e.cfg.XDP)
	if r == nil {
		return daemon.ReloadResult{}, err
	}
	if err := errors.Join(err, st.SaveApplied(e.cfg.NetNS, statedir.Summarize(p))); err != nil {
		e.cfg.Logger.Warn("after the load", "err", err)
	}
	e.table, e.guard = p.Table, ban.Guard{Protected: p.ProtectSet(), Own: own}
	e.status.Table, e.status.Applied, e.status.Elements, e.status.Rules = p.Table, time.Now(), r.Elements, nil
	for _, rule := range p.Rules {
		n4, n6 := rule.V4.Prefixes, rule.V6.Prefixes
		e.status.Rules = append(e.status.Rules, api.RuleStatus{Name: rule.Name, Action: string(rule.Action), Backend: string(rule.Backend), PrefixesV4: n4, PrefixesV6: n6})
	}
	return daemon.ReloadResult{Changed: true, Mode: "full", Duration: time.Since(t0)}, nil
}

// Ban adds bans to the ban sets, each with its TTL; a request the guard
// refuses (a protected or own address) is left out and reported.
func (e *iptEngine) Ban(ctx context.Context, reqs []bansets.Request) ([]ban.Ban, error) {
	if e.backend != plan.IPSet {
		return nil, ipt.ErrBans
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var add []ipt.BanEntry
	var done []ban.Ban
	var errs []error
	now := time.Now()
	for _, r := range reqs {
		if err := e.guard.Check(r.Prefix); err != nil {
			errs = append(errs, err)
			continue
		}
		add = append(add, ipt.BanEntry{Prefix: r.Prefix.Masked(), TTL: r.TTL})
		b := ban.Ban{Prefix: r.Prefix.Masked(), Reason: r.Reason, Origin: r.Origin, Created: now}
		if r.TTL > 0 {
			b.Expires = now.Add(r.TTL)
		}
		done = append(done, b)
	}
	if err := ipt.Ban(ctx, e.table, ipt.Options{NetNS: e.cfg.NetNS, Flavour: e.flavour}, add, nil); err != nil {
		return nil, err
	}
	return done, errors.Join(errs...)
}

// Unban lifts bans (those not there are ignored; ipset keeps no
// origins, and fleet lifts name none).
func (e *iptEngine) Unban(ctx context.Context, ls []bansets.Lift) ([]ban.Ban, error) {
	if e.backend != plan.IPSet {
		return nil, ipt.ErrBans
	}
	ps := make([]netip.Prefix, len(ls))
	for i, l := range ls {
		ps[i] = l.Prefix
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := ipt.Ban(ctx, e.table, ipt.Options{NetNS: e.cfg.NetNS, Flavour: e.flavour}, nil, ps); err != nil {
		return nil, err
	}
	return nil, nil
}

// Status is the loaded revision's rules, and the bans in the ban sets.
func (e *iptEngine) Status() api.Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.status
	if e.backend == plan.IPSet && e.table != "" {
		n, err := ipt.BanCount(context.Background(), e.table, ipt.Options{NetNS: e.cfg.NetNS})
		if err != nil {
			s.LastError = fmt.Sprint(err)
		}
		s.Bans.Total = n
	}
	return s
}
