// Package apply is the one way a policy reaches the kernel, whoever
// loads it (`ipfence apply`, the daemon, a fleet agent): compile (pure:
// plan and lowering, no kernel touched) → host checks → every backend's
// part loaded in the order that never leaves a rule unenforced, one
// transaction per backend, what was in force put back when a later part
// fails → a record of exactly what was loaded (statedir.Applied, base
// chain heads included), from which bans, status and flush work without
// deriving anything again.
//
// The backends are a small sealed set behind Backend: nftables, XDP,
// ipset and iptables-split.
package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// CompileOptions say how Compile resolves what the policy leaves open.
type CompileOptions struct {
	// Backend overrides the policy's backend ("" keeps it).
	Backend plan.Backend
	// Host says what backend auto is on this host, and why (the doctor's
	// probe); nil takes nftables.
	Host func() (plan.Backend, string, error)
	// IPTables is the iptables flavour the iptables backends are lowered
	// for and loaded with: "legacy", "nft", or "" for the one `iptables`
	// is (legacy's sizes where there is no iptables: apply then says what
	// is missing).
	IPTables string
	// Logger gets the plan's warnings (slog.Default when nil).
	Logger *slog.Logger
	// Record keeps the layout chooser's choices in the plan (a fleet
	// publisher ships them: plan.Options.Record).
	Record bool
	// Consume lets Compile drop the input's rule sets as it goes
	// (plan.Options.Consume): for callers that do not read them after.
	Consume bool
	// Parallel builds both families of a rule at once
	// (plan.Options.Parallel): for a publisher.
	Parallel bool
}

// Compiled is a policy compiled for one backend, not loaded: pure data.
type Compiled struct {
	Plan *plan.Plan
	// NFT is the nftables table (backends nftables and xdp), its ban
	// sets empty; IPT the iptables program (ipset, iptables-split).
	NFT *nft.Program
	IPT *ipt.Program
	// Flavour is the iptables flavour IPT was lowered for ("" for nft).
	Flavour string
	// BackendWhy says how backend auto chose ("" when it did not).
	BackendWhy string
}

// Compile compiles in (its Backend resolved: o.Backend, and auto through
// o.Host) into the program of its backend. No kernel is touched, except
// by o.Host's probes.
func Compile(in *plan.Input, o CompileOptions) (*Compiled, error) {
	if o.Backend != "" {
		cp := *in
		cp.Backend = o.Backend
		in = &cp
	}
	c := &Compiled{}
	if in.Backend == plan.Auto {
		b, why := plan.NFTables, "nftables: the default"
		if o.Host != nil {
			var err error
			if b, why, err = o.Host(); err != nil {
				return nil, fmt.Errorf("backend auto: %w", err)
			}
		}
		cp := *in
		cp.Backend = b
		in, c.BackendWhy = &cp, why
	}
	p, err := plan.Compile(in, plan.Options{Record: o.Record, Consume: o.Consume, Parallel: o.Parallel})
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	for _, w := range p.Warnings {
		log.Warn(w)
	}
	for _, r := range p.Rules {
		if r.ReplayNote != "" {
			log.Info("the rule's layout is not the one the bundle chose", "rule", r.Name, "why", r.ReplayNote)
		}
	}
	c.Plan = p
	if !p.Backend.IPTables() {
		c.NFT = nft.FromPlan(p, nft.Dynamic{})
		p.Release() // the program holds the elements now
		return c, nil
	}
	fl, err := ipt.ResolveFlavour(o.IPTables)
	if errors.Is(err, ipt.ErrFlavour) {
		return nil, err
	}
	c.Flavour = fl
	// The ipset backend always has its ban sets: bans work wherever it
	// runs (iptables-split has no sets, and says so to a ban).
	if c.IPT, err = ipt.FromPlan(p, ipt.LowerOptions{RejectMark: in.RejectMark, Flavour: fl, Bans: p.Backend == plan.IPSet}); err != nil {
		return nil, err
	}
	return c, nil
}

// ForHost returns in as a host whose backend is b runs it (a fleet
// agent's revision on its host). With an iptables backend the whole
// policy runs there (rules that ask for XDP too, which has no place
// beside iptables); with nftables a policy written for an iptables
// backend runs in nftables, and XDP rules stay.
func ForHost(in *plan.Input, b plan.Backend) *plan.Input {
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

// ConnectionAware counts the rules that rely on conntrack.
func (c *Compiled) ConnectionAware() int {
	n := 0
	for _, r := range c.Plan.Rules {
		if !r.Stateless {
			n++
		}
	}
	return n
}

// Counts are a compiled program's sets, elements and chains.
func (c *Compiled) Counts() (sets, elems, chains int) {
	if c.IPT != nil {
		for _, s := range c.IPT.Sets {
			elems += len(s.Elems)
		}
		for _, t := range c.IPT.Tables {
			chains += t.NumChains()
		}
		return len(c.IPT.Sets), elems, chains
	}
	for _, s := range c.NFT.Sets {
		elems += s.Elems.Len()
	}
	return len(c.NFT.Sets), elems, len(c.NFT.Chains)
}

// Target is one namespace's kernel side and its state folder.
type Target struct {
	NetNS string // "" = the current namespace
	State statedir.Dir
	// XDP says where XDP programs are pinned and how they attach; its
	// namespace is NetNS and its interfaces the plan's.
	XDP    xdp.Options
	Logger *slog.Logger

	// saved is the record this Target wrote last, and stamp its file's:
	// the next apply takes it while the file is still that one, where
	// reading the file back (a daemon's, at each refresh) scanned 400k
	// prefixes of JSON. unsure: the last save failed, so the file may
	// hold an older record than the plan in force.
	saved  *statedir.Applied
	stamp  statedir.Stamp
	unsure bool
}

func (t *Target) log() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}

// backend returns the Backend of kind k in t (flavour: the iptables
// flavour, for ipset and iptables-split; prev, the last apply's record,
// may vouch for chains or a table without ipfence's mark).
func (t *Target) backend(k plan.Backend, flavour string, prev *statedir.Applied) Backend {
	switch k {
	case plan.XDP:
		o := t.XDP
		o.NetNS = t.NetNS
		return &xdpBackend{opt: o}
	case plan.IPSet, plan.IPTablesSplit:
		return &iptBackend{kind: k, netns: t.NetNS, flavour: flavour, log: t.log(), prev: prev}
	}
	return t.nftables(prev)
}

// nftables is t's nftables backend. prev, the last apply's record, may
// vouch for a table without ipfence's mark (statedir.Applied.Vouches);
// with nil, such a table is refused.
func (t *Target) nftables(prev *statedir.Applied) *nftBackend {
	return &nftBackend{netns: t.NetNS, log: t.log(), prev: prev}
}

// main is c's backend for the rules that do not run in XDP (prev: the
// last apply's record).
func (t *Target) main(c *Compiled, prev *statedir.Applied) Backend {
	if c.Plan.Backend.IPTables() {
		return t.backend(c.Plan.Backend, c.Flavour, prev)
	}
	return t.nftables(prev)
}

// Report says what an apply did.
type Report struct {
	Backend plan.Backend `json:"backend"`
	// Changes are the differences against the last apply's record.
	Changes    []statedir.Change `json:"changes"`
	LoadMillis int64             `json:"load_ms"`
	XDP        *xdp.Report       `json:"xdp,omitempty"`
	IPTables   *ipt.Result       `json:"iptables,omitempty"`
	// Added and Deleted count the elements an update sent.
	Added   int `json:"-"`
	Deleted int `json:"-"`
	// Loaded: the rules that do not run in XDP are in force (also when
	// Apply then failed on XDP) and c is recorded as applied.
	Loaded bool `json:"-"`
	// Leftover is set when the backend of the last apply could not be
	// emptied (a *LeftoverError); Apply itself then succeeded.
	Leftover error `json:"-"`
	// Applied is the record written. The Target keeps it for its next
	// apply: do not change it.
	Applied *statedir.Applied `json:"-"`
}

// Options change what Apply does.
type Options struct {
	// Update, when set, is sent in place of a full load of the nftables
	// table: the difference between what was loaded and c (the daemon's
	// refresh; see nft.DiffKeeping). The ban sets are not touched.
	Update *nft.Update
	// KeepXDP leaves the XDP program as it is: it is c's already.
	KeepXDP bool
	// Repair puts back what was loaded before (the daemon's drift
	// repair): the host-address check it passed then is not made again,
	// so that an address the host gained since cannot keep a deleted
	// table from coming back.
	Repair bool
	// Previous is the plan in force, when the caller holds it (the
	// daemon): the last record's prefix lists are taken from its sets
	// instead of being read as text (statedir.Dir.LoadAppliedFor).
	Previous *plan.Plan
	// MonitorAll records that every blocking rule of c is in monitor
	// mode by the caller's choice (apply --monitor), not the policy's
	// (statedir.Applied.MonitorAll).
	MonitorAll bool
}

// LeftoverError is a Report's Leftover: the new rules are in force and
// recorded, but what the last apply loaded in another backend could not
// be removed; its rules stay (duplicating the new ones) until the next
// apply or a flush.
type LeftoverError struct{ Err error }

func (e *LeftoverError) Error() string { return e.Err.Error() }
func (e *LeftoverError) Unwrap() error { return e.Err }

// Previous is what the last apply in t recorded (nil: none, or none
// readable: everything counts as new).
func (t *Target) Previous() *statedir.Applied {
	prev, _ := t.State.LoadApplied(t.NetNS)
	return prev
}

// Apply loads c into t's namespace with the bans and allow entries of
// l (whose sinks become c's backend's), after checking that no rule blocks one of the
// namespace's own addresses. The parts are loaded in the order that
// never leaves a rule unenforced: when rules move into XDP, or XDP only
// changes, the XDP program switches first and the table (or iptables)
// second; when rules leave XDP, the table takes them first. Everything
// that can fail before a switch (compiling, loading programs and maps)
// is done first; if the second part fails, the first is put back where
// the backend can (XDP's previous program). A backend the last apply
// used and c does not is emptied only once c's are in force. Then c is
// recorded as applied. The caller holds the state folder's lock.
func (t *Target) Apply(ctx context.Context, c *Compiled, l bansets.Lists, o Options) (*Report, error) {
	if !o.Repair {
		if err := hostaddr.CheckPlan(c.Plan, t.NetNS); err != nil {
			return nil, err
		}
	}
	var prev *statedir.Applied
	switch kept, rewritten := t.lastSaved(); {
	case kept != nil:
		prev = kept
	case o.Previous != nil && !rewritten:
		prev, _ = t.State.LoadAppliedFor(t.NetNS, o.Previous)
	default:
		// The command line's apply, or a record that is not
		// o.Previous's (rewritten by another apply, or not written by
		// the last): read whole.
		prev = t.Previous()
	}
	cur := statedir.Summarize(c.Plan)
	cur.Flavour = c.Flavour
	cur.MonitorAll = o.MonitorAll
	rep := &Report{Backend: c.Plan.Backend, Changes: statedir.Compare(prev, cur), Applied: cur}
	// Only Compare reads the last record's prefix lists (cur holds the
	// plan's sets, no text).
	prev.DropPrefixes()

	// Before a full load, the compile's garbage and the last record's
	// text go before the kernel's batch is built, which then reuses
	// their memory: a re-apply of a 400k-line feed peaked at 170 MB
	// without, 140 with, for a collection of a few milliseconds (the
	// live heap is mostly pointer-free). An update's batch is small: a
	// fleet agent's revision gains nothing, and 20 agents on two vCPUs
	// lost 30–50 ms of CPU each.
	if o.Update == nil {
		runtime.GC()
	}
	main := t.main(c, prev)
	ms, err := main.Prepare(ctx, c)
	if err != nil {
		return nil, err
	}
	if ns, ok := ms.(*nftStage); ok {
		ns.update = o.Update
	}
	stages := []Stage{ms}
	xdpFirst := false
	var xs Stage
	hasXDP := len(c.Plan.XDPRules()) > 0
	if !o.KeepXDP && main.Kind() == plan.NFTables {
		// Without XDP rules the stage detaches a program left by an
		// earlier apply (the record may be lost: it looks anyway).
		if xs, err = t.backend(plan.XDP, "", nil).Prepare(ctx, c); err != nil {
			return nil, err
		}
		defer xs.Close()
		xdpFirst = hasXDP && stillXDP(prev, c.Plan)
		if xdpFirst {
			stages = []Stage{xs, ms}
		} else {
			stages = append(stages, xs)
		}
	}
	var failed error
	for _, s := range stages {
		if err := s.Commit(ctx, l); err != nil {
			if !rep.Loaded {
				return nil, err // nothing changed: XDP's Close puts its previous program back
			}
			failed = err
			if hasXDP {
				failed = fmt.Errorf("the other rules are applied, but XDP kept its previous program: %w", err)
			}
			xs = nil
			break
		}
		rep.Loaded = rep.Loaded || s == ms
	}
	for _, s := range stages {
		if failed == nil {
			failed = s.Keep()
		}
	}
	t.report(rep, ms, xs)
	// c's rules are in force: the record says so, and the backend of the
	// last apply, if another, goes (if that fails its rules stay, and
	// only duplicate c's).
	t.save(cur)
	if err := t.handOver(ctx, prev, c, main); err != nil {
		rep.Leftover = &LeftoverError{err}
	}
	return rep, failed
}

// save records a as applied in t (a failure is logged: the next apply
// compares with whatever record the file holds, read whole).
func (t *Target) save(a *statedir.Applied) {
	t.saved, t.unsure = nil, true
	if err := t.State.SaveApplied(t.NetNS, a); err != nil {
		t.log().Warn("recording what was applied", "err", err)
		return
	}
	t.unsure = false
	if st, ok := t.State.AppliedStamp(t.NetNS); ok {
		t.saved, t.stamp = a, st
	}
}

// lastSaved is a copy of the record t saved last, if its file is still
// the one written then; otherwise nil, and whether the file is known
// not to be the last apply's record: rewritten (or removed) by another
// apply since, or not written by t's last.
func (t *Target) lastSaved() (kept *statedir.Applied, rewritten bool) {
	if t.saved == nil {
		return nil, t.unsure
	}
	if st, ok := t.State.AppliedStamp(t.NetNS); !ok || st != t.stamp {
		return nil, true
	}
	a := *t.saved
	a.Rules = slices.Clone(a.Rules)
	return &a, false
}

// report fills rep from the stages that ran.
func (t *Target) report(rep *Report, ms, xs Stage) {
	switch s := ms.(type) {
	case *nftStage:
		rep.LoadMillis = (s.result.Build + s.result.Flush).Milliseconds()
		rep.Added, rep.Deleted = s.added, s.gone
	case *iptStage:
		r := s.result
		rep.IPTables, rep.LoadMillis = &r, r.Load.Milliseconds()
	}
	switch s := xs.(type) {
	case *xdpStage:
		rep.XDP = s.rep
	case *xdpDetach:
		if s.detached {
			rep.XDP = &xdp.Report{Detached: true}
		}
	}
}

// handOver empties the backend the last apply (prev) ran its rules in,
// when c runs them in another, or the last apply's table when c's has
// another name.
func (t *Target) handOver(ctx context.Context, prev *statedir.Applied, c *Compiled, main Backend) error {
	table := c.Plan.Table
	if prev != nil && prev.Table != "" {
		table = prev.Table // what the last apply made is under its name
	}
	var old Backend
	switch {
	case main.Kind() != plan.NFTables:
		// Whatever an nftables apply left (a record may be lost: the
		// table is looked for anyway, and without the record removed
		// only when it has ipfence's mark).
		old = t.nftables(prev)
		if prev != nil && prev.HasXDP() {
			if _, err := t.backend(plan.XDP, "", nil).Flush(ctx, table); err != nil {
				return fmt.Errorf("the %s rules are in force, but detaching the XDP program of the last apply failed: %w", main.Kind(), err)
			}
		}
	case prev != nil && prev.IPTables():
		old = t.backend(prev.Backend, prev.Flavour, prev)
	case prev != nil && prev.Table != "" && prev.Table != c.Plan.Table:
		// The policy renamed the table: the old one would go on
		// enforcing the last apply's rules beside c's.
		old = t.nftables(prev)
	default:
		return nil
	}
	if _, err := old.Flush(ctx, table); err != nil {
		return fmt.Errorf("the %s rules are in force, but removing the %s rules of the last apply failed: %w", main.Kind(), old.Kind(), err)
	}
	return nil
}

// stillXDP reports whether no rule that ran in XDP at the last apply
// (prev) runs in nftables in p (rules gone from p need enforcing
// nowhere): then XDP switches first. When rules leave XDP and others
// enter it in one apply, the ones entering are unenforced between the
// two switches (milliseconds: both parts are built beforehand).
func stillXDP(prev *statedir.Applied, p *plan.Plan) bool {
	if prev == nil {
		return true
	}
	before := prev.XDPRules()
	for _, r := range p.Rules {
		if r.Backend != plan.XDP && slices.Contains(before, r.Name) {
			return false
		}
	}
	return true
}

// FlushReport says what Flush removed.
type FlushReport struct {
	Table    bool `json:"removed"`
	XDP      bool `json:"xdp_detached"`
	IPTables bool `json:"iptables_removed"`
	// StalePins are the XDP pins of namespaces that are gone.
	StalePins []xdp.Pin `json:"stale_pins_removed"`
}

// Flush removes everything ipfence made in t's namespace under table
// (every backend's part, whatever the record says) and forgets the
// record. In the current namespace it also removes the XDP pins of
// namespaces that are gone (xdp.RemoveStale). An nftables table of that
// name without ipfence's mark, which the record does not vouch for
// (statedir.Applied.Vouches), is refused before anything is removed
// (nft.ErrNotOwned). The caller holds the state folder's lock.
func (t *Target) Flush(ctx context.Context, table string) (FlushReport, error) {
	var r FlushReport
	var err error
	if r.Table, err = t.nftables(t.Previous()).Flush(ctx, table); err != nil {
		return r, fmt.Errorf("flushing: %w", err)
	}
	if r.XDP, err = t.backend(plan.XDP, "", nil).Flush(ctx, table); err != nil {
		return r, fmt.Errorf("flushing XDP: %w", err)
	}
	if r.IPTables, err = t.backend(plan.IPSet, "", t.Previous()).Flush(ctx, table); err != nil {
		return r, fmt.Errorf("flushing the iptables chains and ipsets: %w", err)
	}
	if err := t.State.ForgetApplied(t.NetNS); err != nil {
		t.log().Warn("forgetting what was applied", "err", err)
	}
	if t.NetNS == "" {
		// The flush itself is done: a failure here is only a warning.
		if r.StalePins, err = xdp.RemoveStale(t.XDP.PinDir); err != nil {
			t.log().Warn("removing the XDP pins of namespaces that are gone", "err", err)
		}
	}
	return r, nil
}

// Conntrack is the fill level of the namespace's connection tracking
// table, which connection-aware rules rely on.
type Conntrack struct {
	Entries int `json:"entries"`
	Max     int `json:"max"`
}

// ReadConntrack reads the conntrack table's fill level in ns; nil when
// conntrack is not loaded (no rule has needed it yet).
func ReadConntrack(ns string) *Conntrack {
	n, m, ok := netns.Conntrack(ns)
	if !ok {
		return nil
	}
	return &Conntrack{Entries: n, Max: m}
}

// Status is what the kernel holds of ipfence in one namespace.
type Status struct {
	// Conntrack is the conntrack table's fill level, when the applied
	// policy has connection-aware rules.
	Conntrack *Conntrack `json:"conntrack,omitempty"`
	// Kernel is the nftables table (Exists false when there is none).
	Kernel   nft.TableStatus   `json:"kernel"`
	XDP      *XDPStatus        `json:"xdp,omitempty"`
	IPTables *ipt.Status       `json:"iptables,omitempty"`
	Applied  *statedir.Applied `json:"applied,omitempty"`
}

// XDPStatus is the XDP part of the status: the pinned program, its
// interfaces, and per rule what it dropped.
type XDPStatus struct {
	xdp.Status
	Rules []XDPRuleStatus `json:"rules"`
}

// XDPRuleStatus is one class of the XDP program's counters.
type XDPRuleStatus struct {
	Name    string         `json:"name"` // "" for class 0: passed
	Total   xdp.Counters   `json:"total"`
	PerCPU  []xdp.Counters `json:"per_cpu"`
	Dropped bool           `json:"dropped"`
}

// Status reads every backend's part that the record says is loaded
// (nftables' table always, as it may hold bans).
func (t *Target) Status(ctx context.Context, table string) (*Status, error) {
	s := &Status{Applied: t.Previous()}
	if s.Applied != nil && s.Applied.ConnectionAware() {
		s.Conntrack = ReadConntrack(t.NetNS)
	}
	if err := t.backend(plan.NFTables, "", nil).Status(ctx, table, s); err != nil {
		return nil, err
	}
	if err := t.backend(plan.XDP, "", nil).Status(ctx, table, s); err != nil {
		return nil, err
	}
	if s.Applied != nil && s.Applied.IPTables() {
		if err := t.backend(s.Applied.Backend, s.Applied.Flavour, nil).Status(ctx, table, s); err != nil {
			return nil, err
		}
	}
	return s, nil
}
