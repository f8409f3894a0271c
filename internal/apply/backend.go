package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// Backend is one of ipfence's kernel backends in one namespace: it loads
// its part of a compiled policy, holds (or refuses) the ban sets, reports
// its status and removes what ipfence made there. The set is sealed
// (nftables, XDP, ipset, iptables-split); a behaviour every backend must
// have is added here, once per backend.
type Backend interface {
	// Kind names the backend.
	Kind() plan.Backend
	// Prepare does everything of loading c's part that can fail before
	// anything in force changes (compiling, loading programs and maps);
	// the Stage puts it in force. A backend with nothing to load for c
	// returns a Stage that removes what an earlier load left.
	Prepare(ctx context.Context, c *Compiled) (Stage, error)
	// Sinks are the backend's ban and allow sets (bansets.NoSink where
	// it has none).
	Sinks(c *Compiled) (bans, allows bansets.Sink)
	// Flush removes what ipfence made in this backend (table, program,
	// chains and sets); false when there was nothing.
	Flush(ctx context.Context, table string) (bool, error)
	// Status reads the backend's part of the kernel into s.
	Status(ctx context.Context, table string, s *Status) error

	isBackend()
}

// Stage is a prepared load.
type Stage interface {
	// Commit puts the load in force, in one step (one transaction, one
	// link update), with the Controllers' bans and allow entries where
	// the backend holds their sets; if it fails, what was in force
	// stays.
	Commit(ctx context.Context, l bansets.Lists) error
	// Keep makes a committed load the one that stays (XDP: pins it).
	Keep() error
	// Close releases the stage; before Keep it puts back what Commit
	// replaced, where the backend can (XDP's previous program).
	Close()
}

var (
	_ Backend = (*nftBackend)(nil)
	_ Backend = (*xdpBackend)(nil)
	_ Backend = (*iptBackend)(nil)
)

// nftBackend is ipfence's nftables table: the rules that do not run in
// XDP, and the ban sets.
type nftBackend struct {
	netns string
	log   *slog.Logger
	// prev is the last apply's record (nil: none), which may vouch for
	// a table without ipfence's mark.
	prev *statedir.Applied
}

// options are the nft options for table.
func (b *nftBackend) options(table string) nft.ApplyOptions {
	return nft.ApplyOptions{NetNS: b.netns, Adopt: b.prev.Vouches(table)}
}

func (*nftBackend) isBackend()         {}
func (*nftBackend) Kind() plan.Backend { return plan.NFTables }

// sets are the ban and allow sets of c's table.
func (b *nftBackend) sets(c *Compiled) *bansets.NFTSets {
	return &bansets.NFTSets{NetNS: b.netns, Table: c.Plan.Table, Heads: nft.Heads(c.Plan), Priority: c.Plan.Priority,
		Adopt: b.prev.Vouches(c.Plan.Table)}
}

func (b *nftBackend) Sinks(c *Compiled) (bans, allows bansets.Sink) {
	return sinksOf(c, b.sets(c))
}

// sinksOf are sets' sinks for c: the allow sets refuse entries unless
// AllowsEnforced.
func sinksOf(c *Compiled, sets *bansets.NFTSets) (bans, allows bansets.Sink) {
	if !AllowsEnforced(c.Plan.Backend, len(c.Plan.XDPRules())) {
		return sets.Bans(), bansets.NoSink{Err: bansets.ErrNoAllowSets}
	}
	return sets.Bans(), sets.Allows()
}

func (b *nftBackend) Prepare(_ context.Context, c *Compiled) (Stage, error) {
	return &nftStage{b: b, c: c}, nil
}

func (b *nftBackend) Flush(ctx context.Context, table string) (bool, error) {
	return nft.Flush(ctx, table, b.options(table))
}

func (b *nftBackend) Status(ctx context.Context, table string, s *Status) error {
	ts, err := nft.Status(ctx, table, b.netns)
	if err != nil {
		return fmt.Errorf("reading the nftables table: %w", err)
	}
	s.Kernel = ts
	return nil
}

// nftStage loads the whole table with the bans in force, or sends the
// difference Update (the daemon's refresh).
type nftStage struct {
	b      *nftBackend
	c      *Compiled
	update *nft.Update
	result nft.ApplyResult
	added  int
	gone   int
}

func (s *nftStage) Commit(ctx context.Context, l bansets.Lists) error {
	if s.update != nil {
		if s.update.Empty() {
			return nil
		}
		r, err := nft.ApplyUpdate(ctx, s.update, s.b.options(s.update.Table))
		if err != nil {
			return fmt.Errorf("updating the ruleset: %w", err)
		}
		s.added, s.gone, s.result.Flush = r.Added, r.Deleted, r.Flush
		return nil
	}
	p := s.c.Plan
	heads := nft.Heads(p)
	sets := s.b.sets(s.c)
	bs, as := sinksOf(s.c, sets)
	err := l.Load(bs, as, func(b, a bansets.Snapshot, now time.Time) (err error) {
		live := AllowsEnforced(p.Backend, len(p.XDPRules()))
		if n := a.Len(); n > 0 && !live {
			// Not loaded at all, rather than beating some rules only
			// (the allows' sink refuses new ones meanwhile).
			s.b.log.Warn("allow entries in the store are not enforced: the policy runs rules in XDP, ahead of the table", "allows", n)
		}
		d := dynamic(b, a, now, live)
		s.result, err = applyRetrying(ctx, nft.WithDynamic(s.c.NFT, heads, p.Priority, d), s.b.options(p.Table), s.b.log)
		if err == nil {
			sets.Assume(d.Present())
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("applying to the kernel (nothing was changed): %w", err)
	}
	return nil
}

func (*nftStage) Keep() error { return nil }
func (*nftStage) Close()      {}

// applyRetrying applies p; when another program changed the ruleset
// between reading its generation and committing (the kernel refused the
// whole batch), it tries again, up to 3 times.
func applyRetrying(ctx context.Context, p *nft.Program, opts nft.ApplyOptions, log *slog.Logger) (nft.ApplyResult, error) {
	for try := 1; ; try++ {
		r, err := nft.Apply(ctx, p, opts)
		var cc *nft.ConcurrentChangeError
		if !errors.As(err, &cc) || try == 3 {
			return r, err
		}
		log.Warn("the ruleset changed while applying; trying again", "try", try)
	}
}

// xdpBackend is ipfence's XDP program on the policy's interfaces: the
// leading rules that can run there. It holds no ban sets (bans are in
// the nftables table, right behind it).
type xdpBackend struct {
	opt xdp.Options // NetNS, PinDir, Generic; Interfaces come from the plan
}

func (*xdpBackend) isBackend()         {}
func (*xdpBackend) Kind() plan.Backend { return plan.XDP }
func (*xdpBackend) Sinks(*Compiled) (bansets.Sink, bansets.Sink) {
	return bansets.NoSink{}, bansets.NoSink{Err: bansets.ErrNoAllowSets}
}
func (b *xdpBackend) options(p *plan.Plan) xdp.Options {
	o := b.opt
	o.Interfaces = p.Interfaces
	return o
}

// Prepare builds the program and its tables and loads them beside the
// one in force; without XDP rules the stage detaches ipfence's program.
func (b *xdpBackend) Prepare(_ context.Context, c *Compiled) (Stage, error) {
	rules := xdp.FromPlan(c.Plan)
	if len(rules) == 0 {
		return &xdpDetach{b: b}, nil
	}
	opt := b.options(c.Plan)
	if err := xdp.Check(opt); err != nil {
		return nil, err
	}
	rep := &xdp.Report{Rules: len(rules)}
	t0 := time.Now()
	l, err := xdp.BuildLayout(rules)
	if err != nil {
		return nil, fmt.Errorf("compiling the XDP rules: %w", err)
	}
	rep.BuildMillis, rep.MemoryBytes = time.Since(t0).Milliseconds(), l.Memory()
	swap, err := xdp.Prepare(l, opt)
	if err != nil {
		return nil, err
	}
	rep.LoadMillis = swap.Load.Milliseconds()
	return &xdpStage{swap: swap, rep: rep}, nil
}

func (b *xdpBackend) Flush(_ context.Context, _ string) (bool, error) {
	return xdp.Flush(b.opt)
}

// Status reads the pinned program's interfaces and per-rule counters;
// classes come from s.Applied's XDP rules.
func (b *xdpBackend) Status(_ context.Context, _ string, s *Status) error {
	var names []string
	if s.Applied != nil {
		names = s.Applied.XDPRules()
	}
	st, err := xdp.ReadStatus(b.opt, len(names))
	if errors.Is(err, xdp.ErrNotLoaded) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the XDP status: %w", err)
	}
	out := &XDPStatus{Status: st}
	for c, per := range st.Counters {
		rs := XDPRuleStatus{Total: xdp.Sum(per), PerCPU: per, Dropped: c > 0}
		if c > 0 && c <= len(names) {
			rs.Name = names[c-1]
		}
		out.Rules = append(out.Rules, rs)
	}
	s.XDP = out
	return nil
}

// xdpStage switches the interfaces to a prepared program.
type xdpStage struct {
	swap *xdp.Swap
	rep  *xdp.Report
}

func (s *xdpStage) Commit(context.Context, bansets.Lists) error {
	t := time.Now()
	err := s.swap.Attach()
	s.rep.AttachMillis = time.Since(t).Milliseconds()
	return err
}

func (s *xdpStage) Keep() error {
	s.rep.Interfaces = s.swap.Interfaces()
	if err := s.swap.Commit(); err != nil {
		return fmt.Errorf("the XDP program runs, but pinning it failed (`ipfence status` may not show it): %w", err)
	}
	return nil
}

func (s *xdpStage) Close() { s.swap.Close() }

// xdpDetach removes ipfence's XDP program once the rules it ran are in
// force elsewhere.
type xdpDetach struct {
	b        *xdpBackend
	detached bool
}

func (s *xdpDetach) Commit(context.Context, bansets.Lists) (err error) {
	if s.detached, err = xdp.Flush(s.b.opt); err != nil {
		return fmt.Errorf("the other rules are applied, but removing the previous XDP program failed: %w", err)
	}
	return nil
}

func (*xdpDetach) Keep() error { return nil }
func (*xdpDetach) Close()      {}

// iptBackend is the ipset or iptables-split backend: ipfence's chains in
// the raw table (and filter, for rejects) of iptables and ip6tables, and
// for ipset its sets, with the ban sets.
type iptBackend struct {
	kind    plan.Backend
	netns   string
	flavour string
	log     *slog.Logger
	// prev is the last apply's record (nil: none), which may vouch for
	// chains without ipfence's mark.
	prev *statedir.Applied
}

func (*iptBackend) isBackend()           {}
func (b *iptBackend) Kind() plan.Backend { return b.kind }

func (b *iptBackend) options(table string) ipt.Options {
	return ipt.Options{NetNS: b.netns, Flavour: b.flavour, Adopt: b.prev.VouchesChains(table)}
}

func (b *iptBackend) Sinks(c *Compiled) (bans, allows bansets.Sink) {
	if b.kind != plan.IPSet {
		return bansets.NoSink{}, bansets.NoSink{Err: bansets.ErrNoAllowSets}
	}
	return &bansets.IPSetSink{NetNS: b.netns, Prefix: c.Plan.Table}, &bansets.IPSetSink{NetNS: b.netns, Prefix: c.Plan.Table, Kind: ipt.KindAllow}
}

func (b *iptBackend) Prepare(_ context.Context, c *Compiled) (Stage, error) {
	return &iptStage{b: b, c: c}, nil
}

func (b *iptBackend) Flush(ctx context.Context, table string) (bool, error) {
	o := b.options(table)
	o.Flavour = "" // every flavour installed
	return ipt.Flush(ctx, table, o)
}

func (b *iptBackend) Status(ctx context.Context, table string, s *Status) error {
	is, err := ipt.ReadStatus(ctx, table, b.options(table))
	if err != nil {
		return fmt.Errorf("reading the iptables status: %w", err)
	}
	s.IPTables = is
	return nil
}

// iptStage loads the program (sets swapped in, each family's chains in
// one iptables-restore commit; see ipt.Apply) and fills the ban sets.
type iptStage struct {
	b      *iptBackend
	c      *Compiled
	result ipt.Result
}

func (s *iptStage) Commit(ctx context.Context, l bansets.Lists) error {
	sink, allows := s.b.Sinks(s.c)
	return l.Load(sink, allows, func(snap, a bansets.Snapshot, now time.Time) (err error) {
		if s.result, err = ipt.Apply(ctx, s.c.IPT, s.b.options(s.c.Plan.Table)); err != nil {
			return fmt.Errorf("applying to the kernel: %w", err)
		}
		is, ok := sink.(*bansets.IPSetSink)
		if !ok {
			if n := snap.Len() + a.Len(); n > 0 {
				s.b.log.Warn("bans and allow entries in the store are not enforced: iptables-split has no sets (use ipset or nftables)", "entries", n)
			}
			return nil
		}
		if err := is.Fill(ctx, snap, now); err != nil {
			return fmt.Errorf("the rules are in force, but filling the ban sets failed: %w", err)
		}
		if err := allows.(*bansets.IPSetSink).Fill(ctx, a, now); err != nil {
			return fmt.Errorf("the rules and bans are in force, but filling the allow sets failed: %w", err)
		}
		return nil
	})
}

func (*iptStage) Keep() error { return nil }
func (*iptStage) Close()      {}
