// Package daemon is `ipfence daemon`: it loads a policy into one
// namespace, keeps its sources fresh on their schedules, takes bans over a
// local API (coalesced into batched transactions), expires them, repairs
// drift, and exports metrics.
//
// The kernel side is one ipfence table and, when the policy has XDP
// rules, ipfence's XDP program on the policy's interfaces. A full load
// replaces the table in one transaction; a feed refresh sends only what
// changed (nft.Diff) and never touches the ban sets; bans are transactions
// of their own on the ban sets (package bansets). The XDP program is
// rebuilt and swapped in one step only when its rules' sets, or the rules
// themselves, change. Every load goes through the apply layer (package
// apply), which also runs the ipset and iptables-split backends: there a
// change is a full load (sets swapped in, chains in one commit).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/memlimit"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/source"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/trial"
)

// Config configures a Daemon.
type Config struct {
	Policy string // policy file
	// Input, when set, gives the policy already resolved in place of the
	// file (a fleet agent's bundle): no source is read, and Reload asks
	// Input again. Policy then only names it in the status.
	Input    func(ctx context.Context) (*plan.Input, error)
	NetNS    string // "" = current namespace
	StateDir string
	Socket   string // API socket path
	// Metrics is the address the Prometheus endpoint listens on
	// ("127.0.0.1:9477"); "" turns it off.
	Metrics string
	// Pprof also serves Go's profiler (/debug/pprof/) on the metrics
	// address, for debugging.
	Pprof  bool
	Logger *slog.Logger
	// Tick is how often the daemon looks for due sources, expired bans
	// and drift (default 10s).
	Tick time.Duration
	// DriftEvery is how often the kernel is checked against the desired
	// state (default 1m).
	DriftEvery time.Duration
	// XDP says where XDP programs are pinned and how they attach; its
	// namespace and interfaces are the daemon's and the policy's.
	XDP xdp.Options
	// Backend overrides the policy's backend ("" keeps it); Host
	// resolves backend auto (nil: nftables); IPTables is the iptables
	// flavour of the iptables backends (see apply.CompileOptions).
	Backend  plan.Backend
	Host     func() (plan.Backend, string, error)
	IPTables string
}

// Daemon is a running `ipfence daemon`. Create it with New; Run runs it.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	metrics *metrics
	bans    *bansets.Queue

	// reloading serializes reloads: their sources are read and compiled
	// without mu (downloads can be slow), then loaded with it.
	reloading sync.Mutex
	// trialMu orders the steps of a reload on trial (ReloadTrial,
	// Confirm, its end), ahead of reloading; trialTimer ends it.
	trialMu      sync.Mutex
	trialTimer   *time.Timer
	trialStopped bool // Run returns: no trial ends here any more
	// refreshes are the timed refreshes running off the loop (one at a
	// time), which Run waits for.
	refreshes  sync.WaitGroup
	refreshing atomic.Bool
	// freeing: a collection that hands memory back is due (freeMemory).
	freeing atomic.Bool

	// mu guards what follows: the policy as loaded, and every full or
	// diff load (bans take the Controller's own lock).
	mu      sync.Mutex
	loader  *source.Loader
	pol     *policy.Policy
	res     *policy.Resolved
	plan    *plan.Plan
	prog    *nft.Program // as loaded, ban sets empty (nil on iptables backends)
	ac      *apply.Compiled
	target  *apply.Target
	own     []netip.Addr // the namespace's addresses, as at start
	applied time.Time
	sources map[string]*sourceState
	ctl     *bansets.Controller
	store   *ban.Store
	// allows are the allow entries (`ipfence allow`), in allowStore.
	allows     *bansets.Controller
	allowStore *ban.Store
	drift      int
	lastErr    string
	elements   int
	// xdpPlan is the plan whose XDP rules run (nil: none); it lags
	// behind plan when an XDP swap failed, so the next reload tries again.
	xdpPlan *plan.Plan
	// ready is closed once the policy is loaded and the API serves.
	ready chan struct{}
	// runCtx is Run's context while the ban queue runs (nil before):
	// the followers of crowdsec sources (by name) live in it.
	runCtx    context.Context
	followers map[string]*follower
}

// sourceState is what the daemon knows of one source.
type sourceState struct {
	refresh  time.Duration
	loaded   time.Time // last load in the kernel
	checked  time.Time // last attempt
	stale    bool
	lastErr  string
	v4, v6   int
	failures int
}

// due reports whether the source's refresh interval has passed at now.
func (ss *sourceState) due(now time.Time) bool {
	return ss.refresh > 0 && now.Sub(ss.checked) >= ss.refresh
}

// New returns a daemon for cfg (nothing is started).
func New(cfg Config) *Daemon {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 10 * time.Second
	}
	if cfg.DriftEvery <= 0 {
		cfg.DriftEvery = time.Minute
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, sources: map[string]*sourceState{}, ready: make(chan struct{}),
		followers: map[string]*follower{}}
	d.target = &apply.Target{NetNS: cfg.NetNS, State: statedir.Dir{Path: cfg.StateDir}, XDP: cfg.XDP, Logger: cfg.Logger}
	if host := cfg.Host; host != nil {
		// Backend auto is what the host runs, probed once: a probe that
		// fails at a later reload must not move the policy elsewhere.
		var once sync.Once
		var b plan.Backend
		var why string
		var err error
		d.cfg.Host = func() (plan.Backend, string, error) {
			once.Do(func() { b, why, err = host() })
			return b, why, err
		}
	}
	d.metrics = newMetrics(d)
	d.bans = bansets.NewQueue(func(n int, took time.Duration) {
		d.metrics.banBatch.Observe(float64(n))
		d.metrics.applySeconds.WithLabelValues("ban").Observe(took.Seconds())
		if n >= bulkBans {
			d.freeMemory() // a bulk load's request and netlink batch
		}
	})
	return d
}

// Run loads the policy, serves the API and keeps everything fresh until
// ctx is done. The ruleset stays in the kernel when Run returns: a
// firewall must not open when its daemon stops.
func (d *Daemon) Run(ctx context.Context) error {
	d.started = time.Now()
	unlock, err := d.target.State.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	resume, err := d.takeUpTrial(ctx)
	if err != nil {
		return fmt.Errorf("the trial found at start: %w", err)
	}

	store, err := d.target.OpenStore()
	if err != nil {
		return err
	}
	defer store.Close()
	store.OnFold(func(n int) { // folding a bulk load leaves its garbage behind
		if n >= bulkBans {
			d.freeMemory()
		}
	})
	d.store = store
	allowStore, err := d.target.OpenAllowStore()
	if err != nil {
		return err
	}
	defer allowStore.Close()
	d.allowStore = allowStore
	if err := d.start(ctx); err != nil {
		return err
	}
	defer d.lists().Close()
	if resume != nil {
		d.trialMu.Lock()
		d.watchTrial(resume)
		d.trialMu.Unlock()
	}
	defer func() {
		d.trialMu.Lock()
		d.trialStopped = true // taken up by the next start
		if d.trialTimer != nil {
			d.trialTimer.Stop()
		}
		d.trialMu.Unlock()
	}()

	ln, err := listenUnix(d.cfg.Socket)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d.handler(), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("API server: %w", err)
		}
	})
	var msrv *http.Server
	if d.cfg.Metrics != "" {
		mln, err := net.Listen("tcp", d.cfg.Metrics)
		if err != nil {
			srv.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		msrv = &http.Server{Handler: d.metrics.handler(d.cfg.Pprof), ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() {
			if err := msrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics server: %w", err)
			}
		})
	}
	bctx, stopBans := context.WithCancel(ctx)
	wg.Go(func() { d.bans.Run(bctx, d.ctl) })
	d.mu.Lock()
	d.runCtx = bctx
	d.syncFollowers()
	d.mu.Unlock()

	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		d.log.Warn("notifying systemd", "err", err)
	}
	d.log.Info("ready", "socket", d.cfg.Socket, "netns", d.cfg.NetNS, "metrics", d.cfg.Metrics)
	close(d.ready)
	err = d.loop(ctx, errc)

	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shut)
	if msrv != nil {
		_ = msrv.Shutdown(shut)
	}
	stopBans()
	wg.Wait()
	return err
}

// Ready is closed once Run has loaded the policy and serves the API:
// from then on Reload, Ban and Unban may be called.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// trials is the daemon's namespace's trials (apply --confirm).
func (d *Daemon) trials() trial.Store { return trial.Store{Dir: d.target.State, NetNS: d.cfg.NetNS} }

// loop runs the periodic work until ctx is done or a server fails.
func (d *Daemon) loop(ctx context.Context, errc <-chan error) error {
	tick := time.NewTicker(d.cfg.Tick)
	defer tick.Stop()
	var watchdog <-chan time.Time
	if every, err := daemon.SdWatchdogEnabled(false); err == nil && every > 0 {
		t := time.NewTicker(every / 3)
		defer t.Stop()
		watchdog = t.C
	}
	lastDrift := time.Now()
	defer d.refreshes.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-watchdog:
			_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		case now := <-tick.C:
			if n, err := d.ctl.Expire(ctx); err != nil {
				d.log.Warn("expiring bans", "err", err)
			} else if n > 0 {
				d.log.Debug("bans expired", "count", n)
			}
			if n, err := d.allows.Expire(ctx); err != nil {
				d.log.Warn("expiring allow entries", "err", err)
			} else if n > 0 {
				d.log.Info("allow entries expired", "count", n)
			}
			// Due sources are refreshed off this loop, which keeps
			// expiring bans and answering systemd's watchdog while a
			// slow feed downloads.
			if d.due(now) && d.refreshing.CompareAndSwap(false, true) {
				d.refreshes.Go(func() {
					defer d.refreshing.Store(false)
					if _, err := d.reload(ctx, true, false); err != nil {
						d.log.Warn("refreshing sources; the last good ruleset stays", "err", err)
					}
				})
			}
			if now.Sub(lastDrift) >= d.cfg.DriftEvery {
				lastDrift = now
				if err := d.checkDrift(ctx); err != nil {
					d.log.Warn("checking drift", "err", err)
				}
			}
		}
	}
}

// start compiles the policy and loads it with the stored bans (a full
// load: whatever the kernel held is replaced, which also repairs any
// drift since the last run).
func (d *Daemon) start(ctx context.Context) error {
	d.loader = &source.Loader{StateDir: d.cfg.StateDir, Logger: d.log, Namespace: d.cfg.NetNS}
	c, err := d.compile(ctx, false, false)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.own, err = hostaddr.List(d.cfg.NetNS); err != nil {
		return err
	}
	// The sink is the backend's, from the first load on.
	// The policy's bans from the start, so that the bans that ran out
	// while no daemon ran leave their strikes (recidive).
	ctl, err := bansets.Open(bansets.Config{Sink: bansets.NoSink{}, Guard: d.guard(c.plan), Store: d.store, Policy: c.plan.Bans, Logger: d.log})
	if err != nil {
		return err
	}
	allows, err := apply.OpenAllows(d.allowStore, bansets.NoSink{}, d.log)
	if err != nil {
		ctl.Close()
		return err
	}
	d.ctl, d.allows = ctl, allows
	return d.loadFull(ctx, c)
}

// lists are the daemon's bans and allow entries.
func (d *Daemon) lists() bansets.Lists {
	return bansets.Lists{Bans: d.ctl, Allows: d.allows}
}

// guard is the ban guard for p: its protected prefixes and the
// namespace's own addresses.
func (d *Daemon) guard(p *plan.Plan) ban.Guard {
	return ban.Guard{Protected: p.ProtectSet(), Own: d.own}
}

// compiled is a policy resolved and compiled, not yet loaded.
type compiled struct {
	pol  *policy.Policy
	res  *policy.Resolved
	plan *plan.Plan
	prog *nft.Program // nil on iptables backends
	ac   *apply.Compiled
	kept map[string]bool // sources a timed refresh did not read again
}

// compile reads the policy and its sources and compiles it; it records
// per source when it was checked and what went wrong.
func (d *Daemon) compile(ctx context.Context, dueOnly, fileOnly bool) (*compiled, error) {
	if d.cfg.Input != nil {
		in, err := d.cfg.Input(ctx)
		if err != nil {
			return nil, err
		}
		return d.compileInput(&policy.Policy{}, &policy.Resolved{Input: in})
	}
	// A timed refresh reads the sources of the policy as loaded: the
	// policy file is read at the start and at an operator's reload, not
	// behind their back (a file edited ahead of a reload on trial would
	// be in force, unconfirmed, before the trial begins).
	d.mu.Lock()
	pol := d.pol
	d.mu.Unlock()
	if !dueOnly || pol == nil || pol.File == "" {
		var in *plan.Input
		var err error
		if pol, in, err = d.readPolicy(fileOnly); err != nil {
			return nil, err
		}
		if in != nil {
			return d.compileInput(&policy.Policy{}, &policy.Resolved{Input: in})
		}
	}
	now := time.Now()
	d.mu.Lock()
	var reuse func(source.Spec) *source.Source
	if dueOnly && d.res != nil {
		reuse = d.reuser(now)
	}
	d.mu.Unlock()
	kept := map[string]bool{} // the sources not read again (committed already)
	res, err := pol.ResolveReusing(ctx, d.loader, func(s source.Spec) *source.Source {
		if reuse != nil {
			if src := reuse(s); src != nil {
				kept[s.Name] = true
				return src
			}
		}
		return nil
	})
	d.mu.Lock()
	for _, sd := range pol.Sources {
		ss := d.sources[sd.Spec.Name]
		if ss == nil {
			ss = &sourceState{}
			d.sources[sd.Spec.Name] = ss
		}
		// Read, or due and not reached because another failed: tried
		// again at its next refresh, not at every tick.
		ss.refresh = refreshOf(sd.Spec)
		if !kept[sd.Spec.Name] {
			ss.checked = now
		}
	}
	if err != nil {
		d.sourceFailed(pol, err)
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	c, err := d.compileInput(pol, res)
	if c != nil {
		c.kept = kept
	}
	return c, err
}

// readPolicy reads the policy to load: the file, or while the file is
// the one a trial was rolled back from (unless fileOnly: a trial of it
// again), what stands in for it: the policy text a daemon's trial put
// back, or a command line trial's last confirmed revision (in).
func (d *Daemon) readPolicy(fileOnly bool) (pol *policy.Policy, in *plan.Input, err error) {
	if p, _ := d.trials().Pending(); p != nil && p.Daemon {
		fileOnly = true // a reload on trial: the file is what is tried
	}
	if !fileOnly {
		in, rev, ref, err := d.trials().StandIn(d.cfg.Policy)
		switch {
		case err != nil:
			return nil, nil, err
		case ref != nil && ref.Instead != "":
			d.log.Warn("the policy file is the one a reload on trial was rolled back from: the policy in force before it is loaded in its place until the file changes",
				"policy", d.cfg.Policy, "rolled_back", ref.Time, "why", ref.Why)
			pol, err := policy.Parse([]byte(ref.Instead), d.cfg.Policy)
			return pol, nil, err
		case in != nil:
			d.log.Warn("the policy file is the one an unconfirmed trial was rolled back from: the last confirmed ruleset is loaded in its place until the file changes",
				"policy", d.cfg.Policy, "rolled_back", ref.Time, "why", ref.Why, "confirmed", rev.Policy, "applied", rev.Applied)
			return nil, in, nil
		}
	}
	pol, err = policy.Load(d.cfg.Policy)
	return pol, nil, err
}

// reuser returns which loaded sources a timed refresh keeps: those not
// due at now whose spec is unchanged. Called with d.mu held; the
// function it returns reads a snapshot.
func (d *Daemon) reuser(now time.Time) func(source.Spec) *source.Source {
	keep := map[string]*source.Source{}
	specs := map[string]source.Spec{}
	for _, sd := range d.pol.Sources {
		ss, src := d.sources[sd.Spec.Name], d.res.Sources[sd.Spec.Name]
		if ss != nil && src != nil && !ss.due(now) {
			keep[sd.Spec.Name], specs[sd.Spec.Name] = src, sd.Spec
		}
	}
	return func(s source.Spec) *source.Source {
		if src := keep[s.Name]; src != nil && reflect.DeepEqual(specs[s.Name], s) {
			return src
		}
		return nil
	}
}

// compileInput compiles what pol resolved to.
func (d *Daemon) compileInput(pol *policy.Policy, res *policy.Resolved) (*compiled, error) {
	// A policy's input is resolved afresh for each compile: its sets go
	// as the plan is made. A fleet agent's (Config.Input) is the
	// revision it keeps and compiles again at a reload: it stays whole.
	consume := d.cfg.Input == nil
	ac, err := apply.Compile(res.Input, apply.CompileOptions{Backend: d.cfg.Backend, Host: d.cfg.Host, IPTables: d.cfg.IPTables, Logger: d.log, Consume: consume})
	if err != nil {
		return nil, err
	}
	if err := hostaddr.CheckPlan(ac.Plan, d.cfg.NetNS); err != nil {
		return nil, err
	}
	// The sources stay (those not due are reused by the next load); the
	// rules' input sets went as the plan was made (consume), which holds
	// what it judges by: a refresh would keep them through the load.
	res = &policy.Resolved{Policy: res.Policy, Sources: res.Sources}
	return &compiled{pol: pol, res: res, plan: ac.Plan, prog: ac.NFT, ac: ac}, nil
}

// sourceFailed records err against the source it names (every source
// when it names none).
func (d *Daemon) sourceFailed(pol *policy.Policy, err error) {
	for _, sd := range pol.Sources {
		ss := d.sources[sd.Spec.Name]
		if source.ErrorNames(err, sd.Spec.Name) {
			ss.lastErr = err.Error()
			ss.failures++
			d.metrics.feedErrors.WithLabelValues(sd.Spec.Name).Inc()
		}
	}
}

// loadFull loads c whole with the current bans (the table, or the
// iptables backend's chains and sets, in one transaction each) and
// ipfence's XDP program unless the one in force is c's already. Called
// with d.mu held.
func (d *Daemon) loadFull(ctx context.Context, c *compiled) error {
	if _, err := d.load(ctx, c, "full", time.Now(), apply.Options{KeepXDP: d.plan != nil && d.xdpCurrent(c.plan)}); err != nil {
		return fmt.Errorf("loading the policy: %w", err)
	}
	return nil
}

// load applies c through the apply layer (see apply.Target.Apply). Once
// the table (or iptables) part is in, c is recorded as loaded, even if
// XDP then failed (xdpPlan lags, so the next reload or drift check tries
// XDP again). kind is for the apply metric ("" : not observed). Called
// with d.mu held.
func (d *Daemon) load(ctx context.Context, c *compiled, kind string, t0 time.Time, o apply.Options) (*apply.Report, error) {
	if d.plan != nil {
		o.Previous = d.plan // what the record holds, in memory already
	}
	rep, err := d.target.Apply(ctx, c.ac, d.lists(), o)
	if rep != nil && rep.Leftover != nil {
		d.log.Warn("the policy is loaded, but the last load's other backend could not be emptied", "err", rep.Leftover)
	}
	if rep != nil && rep.Loaded {
		d.loaded(c)
		if err == nil && !o.KeepXDP {
			d.xdpSwapped(c.plan, rep.XDP)
		}
	}
	if err != nil {
		d.lastErr = err.Error()
		return rep, err
	}
	if kind != "" {
		d.metrics.applySeconds.WithLabelValues(kind).Observe(time.Since(t0).Seconds())
	}
	return rep, nil
}

// xdpSwapped records that p's XDP program (or none) is in force.
func (d *Daemon) xdpSwapped(p *plan.Plan, rep *xdp.Report) {
	d.xdpPlan = nil
	if len(p.XDPRules()) > 0 {
		d.xdpPlan = p
	}
	switch {
	case rep == nil:
	case rep.Detached:
		d.log.Info("no XDP rules any more; the XDP program was detached")
	default:
		d.log.Info("XDP program swapped", "rules", rep.Rules, "interfaces", p.Interfaces, "memory_bytes", rep.MemoryBytes,
			"build_ms", rep.BuildMillis, "load_ms", rep.LoadMillis, "attach_ms", rep.AttachMillis)
	}
}

// loaded records c as what the kernel holds: sources committed as last
// good, state saved. Called with d.mu held.
func (d *Daemon) loaded(c *compiled) {
	d.pol, d.res, d.plan, d.prog, d.ac = c.pol, c.res, c.plan, c.prog, c.ac
	d.ctl.SetGuard(d.guard(c.plan))
	d.ctl.SetPolicy(c.plan.Bans)
	d.applied = time.Now()
	d.lastErr = ""
	_, d.elements, _ = c.ac.Counts()
	for name, src := range c.res.Sources {
		if c.kept[name] {
			continue // as committed when it was read
		}
		if err := d.loader.Commit(src); err != nil {
			d.log.Warn("recording last good source", "source", name, "err", err)
		}
		if ss := d.sources[name]; ss != nil {
			ss.loaded, ss.lastErr = d.applied, ""
			ss.stale, _ = src.Stale()
			ss.v4, ss.v6 = src.Prefixes()
		}
	}
	d.syncFollowers()
	// A load leaves the compile's and the netlink batch's garbage behind,
	// and the runtime hands such memory back to the kernel only slowly:
	// without this, idle RSS stayed at the load's peak (europe: 216 MB
	// idle, 110 MB with it; the 400k-line feed: 431 and 215 MB). The
	// collection runs beside the daemon's work, not under d.mu.
	d.freeMemory()
}

// bulkBans is the smallest batch of bans after which the daemon hands its
// garbage back to the kernel (freeMemory): fail2ban's single bans do not
// pay for a collection each.
const bulkBans = 10_000

// freeMemory collects and returns free memory to the kernel in the
// background, a second after it is first asked: the calls of a burst
// (bulk ban batches, a load and its reload) share one collection, made
// once their requests' buffers are garbage too.
func (d *Daemon) freeMemory() {
	if d.freeing.CompareAndSwap(false, true) {
		time.AfterFunc(time.Second, func() {
			d.freeing.Store(false)
			debug.FreeOSMemory()
		})
	}
}

// Reload reads the policy and its sources again and, if the ruleset
// changed, sends the difference in one transaction (a full load when the
// difference cannot be expressed as one). On any error the ruleset in
// force stays.
// While a reload is on trial (ReloadTrial) it is refused: it would end
// the trial unconfirmed.
func (d *Daemon) Reload(ctx context.Context) (ReloadResult, error) {
	if d.cfg.Input == nil {
		if p, err := d.trials().Pending(); err != nil || p != nil {
			if err == nil {
				err = fmt.Errorf("%w: a reload until %s: ipfence confirm (or confirm --rollback) first, or reload --confirm again to try the file as it is now",
					trial.ErrOnTrial, p.Deadline.Local().Format(time.TimeOnly))
			}
			return ReloadResult{}, err
		}
	}
	return d.reload(ctx, false, false)
}

// reload is Reload, reading only the sources that are due when dueOnly
// (the others as loaded last), and the policy file whatever a rolled back
// trial refused when fileOnly. Sources are read and compiled without
// d.mu: a slow download holds up no status, explain or drift check.
func (d *Daemon) reload(ctx context.Context, dueOnly, fileOnly bool) (ReloadResult, error) {
	d.reloading.Lock()
	defer d.reloading.Unlock()
	// A reload compiles beside the program in force, whose sets and
	// elements stay live until it is replaced: with the runtime's default
	// (a collection once the heap doubles), a 1% refresh of the 400k-line
	// feed peaked at 168 MB over a 53 MB idle. Collecting at half that
	// growth for the reload's span peaked at 139 MB for 2% more CPU (a
	// quarter: 130 MB, 14% more CPU).
	defer debug.SetGCPercent(collectSooner(reloadGCPercent))
	// What is live at the reload's peak (the loaded program and sets,
	// the new ones and the new layout) fits in half the idle RSS again
	// for a 1% refresh of the 400k-line feed, but the heap's growth
	// between collections did not (1.8 × idle). Held to 1.5 × idle, the
	// runtime collects harder (the heap is pointer-free, cheap to mark)
	// for about a third more of the reload's CPU.
	defer memlimit.Within(reloadRSSFactor)()
	t0 := time.Now()
	c, err := d.compile(ctx, dueOnly, fileOnly)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.lastErr = err.Error()
		return ReloadResult{}, err
	}
	res := ReloadResult{Mode: "none"}
	keepXDP := d.xdpCurrent(c.plan)
	if c.prog == nil || d.prog == nil {
		// An iptables backend, or a switch: loaded whole (sets filled
		// beside the live ones and swapped in) unless nothing changed.
		if d.ac.IPT != nil && c.ac.IPT != nil && d.ac.Flavour == c.ac.Flavour && reflect.DeepEqual(d.ac.IPT, c.ac.IPT) {
			d.loaded(c)
		} else {
			res.Mode = "full"
			if _, err := d.load(ctx, c, "full", t0, apply.Options{KeepXDP: keepXDP}); err != nil {
				return res, fmt.Errorf("loading the policy: %w", err)
			}
		}
		res.Duration = time.Since(t0)
		res.Changed = res.Mode != "none"
		return res, nil
	}
	u, err := nft.DiffKeeping(d.prog, c.prog, nft.IsDynamicSet)
	switch {
	case errors.Is(err, nft.ErrNeedsReload) || (err == nil && !sameHeads(d.plan, c.plan)):
		res.Mode = "full"
		if err := d.loadFull(ctx, c); err != nil {
			return res, err
		}
	case err != nil:
		return res, err
	case u.Empty() && keepXDP:
		d.loaded(c)
	default:
		res.Mode = "update"
		rep, err := d.load(ctx, c, "update", t0, apply.Options{Update: u, KeepXDP: keepXDP})
		if rep != nil {
			res.Added, res.Deleted = rep.Added, rep.Deleted
		}
		if err != nil {
			return res, err
		}
	}
	res.Duration = time.Since(t0)
	res.Changed = res.Mode != "none"
	return res, nil
}

// reloadGCPercent is the runtime's GOGC while a reload runs (see reload).
const reloadGCPercent = 50

// reloadRSSFactor bounds a reload's resident memory, as a multiple of
// the daemon's at its start (see reload and memlimit.Within).
const reloadRSSFactor = 1.5

// collectSooner sets the runtime's GOGC to percent unless it is lower
// already, or off (GOGC=off, an operator's choice), and returns the one it
// replaced, for debug.SetGCPercent to put back. GOGC is the process's: a
// process runs one daemon (d.reloading orders its reloads); daemons
// reloading at once in one process (tests) may leave it at percent.
func collectSooner(percent int) (old int) {
	old = debug.SetGCPercent(percent)
	if old >= 0 && old < percent || old < 0 {
		debug.SetGCPercent(old)
	}
	return old
}

// ReloadResult says what a Reload did.
type ReloadResult struct {
	Changed        bool
	Mode           string // "none", "update", "full"
	Added, Deleted int
	Duration       time.Duration
}

// xdpCurrent reports whether the XDP program in force is p's.
func (d *Daemon) xdpCurrent(p *plan.Plan) bool {
	if d.xdpPlan == nil {
		return len(p.XDPRules()) == 0
	}
	return sameXDP(d.xdpPlan, p)
}

// xdpNames returns the names of p's XDP rules (none for nil).
func xdpNames(p *plan.Plan) []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, r := range p.XDPRules() {
		out = append(out, r.Name)
	}
	return out
}

// sameXDP reports whether two plans run the same XDP program: the same
// rules with the same sets on the same interfaces.
func sameXDP(a, b *plan.Plan) bool {
	ra, rb := a.XDPRules(), b.XDPRules()
	if len(ra) != len(rb) || !slices.Equal(a.Interfaces, b.Interfaces) {
		return false
	}
	for i := range ra {
		if ra[i].Name != rb[i].Name || ra[i].Action != rb[i].Action || ra[i].Stateless != rb[i].Stateless ||
			!ra[i].Set.Equal(rb[i].Set) {
			return false
		}
	}
	return true
}

// sameHeads reports whether two plans have the same base chains,
// whatever the bans and allow entries: the sinks, which rewrite them
// from the heads of the last full load, then write what b's heads
// would. A rule switched between monitor and enforce keeps them, unless
// it moves the bans. Plans that differ in whether allow entries are
// enforced (apply.AllowsEnforced) need a full load too, which loads
// them or leaves them out, and gives the allows their sink.
func sameHeads(a, b *plan.Plan) bool {
	return a != nil && b != nil && a.Priority == b.Priority && allowsEnforced(a) == allowsEnforced(b) &&
		nft.SameChains(nft.Heads(a), nft.Heads(b), a.Priority)
}

// allowsEnforced reports whether p's load holds the allow entries.
func allowsEnforced(p *plan.Plan) bool { return apply.AllowsEnforced(p.Backend, len(p.XDPRules())) }

// due reports whether a source's refresh interval has passed.
func (d *Daemon) due(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pol == nil {
		return false
	}
	// The policy's sources only: d.sources also holds crowdsec sources
	// (their followers pull on their own) and sources a policy edit
	// removed, which no reload would ever mark checked.
	for _, sd := range d.pol.Sources {
		if ss := d.sources[sd.Spec.Name]; ss != nil && ss.due(now) {
			return true
		}
	}
	return false
}

// refreshOf is how often a source is read again: its refresh setting, or
// an hour for URLs and a minute for files; never for built-in data only.
func refreshOf(s source.Spec) time.Duration {
	switch {
	case s.Refresh != 0:
		return max(s.Refresh, 0)
	case len(s.URLs) > 0:
		return time.Hour
	}
	for _, p := range s.Paths {
		if !source.IsBuiltin(p) {
			return time.Minute
		}
	}
	return 0
}

// verifySample is how many address bans each drift check asks the kernel
// for.
const verifySample = 2000

// checkDrift compares the kernel's table with what was loaded (chains and
// sets, no elements read) and loads it all again when they differ;
// otherwise it checks the ban sets' elements and repairs them.
func (d *Daemon) checkDrift(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Join(d.checkTable(ctx), d.checkXDP(ctx))
}

// checkTable is checkDrift for the table. Called with d.mu held.
func (d *Daemon) checkTable(ctx context.Context) error {
	if d.prog == nil {
		// iptables backends: chains, jumps and sets as loaded, else
		// everything again (which also fills the ban sets).
		ok, err := ipt.InForce(ctx, d.ac.IPT, ipt.Options{NetNS: d.cfg.NetNS, Flavour: d.ac.Flavour})
		if err != nil || ok {
			return err
		}
		d.drift++
		d.metrics.drift.Inc()
		d.log.Warn("ipfence's iptables chains or sets differ from what was loaded; loading them again")
		if _, err := d.load(ctx, d.current(), "", time.Now(), apply.Options{Repair: true}); err != nil {
			return fmt.Errorf("loading the policy again: %w", err)
		}
		return nil
	}
	ts, err := nft.Status(ctx, d.plan.Table, d.cfg.NetNS)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, s := range d.prog.Sets {
		want["set "+s.Name] = true
	}
	for _, c := range d.prog.Chains {
		want["chain "+c.Name] = true
	}
	got := map[string]bool{}
	for _, s := range ts.Sets {
		got["set "+s.Name] = true
	}
	for _, c := range ts.Chains {
		got["chain "+c.Name] = true
	}
	if base := "chain " + nft.BaseChainName; !want[base] {
		// Without stateless rules the base chain before conntrack comes
		// and goes with the bans (the ban sink makes it): it must be
		// there while a ban is, and may be there after the last one
		// (gone with the next change of the bans).
		banned := false
		d.ctl.View(func(s *ban.Set) { banned = s.Len() > 0 })
		if banned {
			want[base] = true
		} else {
			delete(got, base)
		}
	}
	drift := !ts.Exists || len(got) != len(want)
	for k := range want {
		drift = drift || !got[k]
	}
	if !drift {
		// The structure is there; check the bans' elements (a sample of
		// the addresses, all prefix pieces) and put back what is off.
		n, err := d.ctl.Verify(ctx, verifySample)
		if err != nil {
			return err
		}
		na, err := d.allows.Verify(ctx, verifySample)
		if err != nil {
			return err
		}
		n += na
		if n > 0 {
			d.drift++
			d.metrics.drift.Inc()
			d.log.Warn("ban elements were missing from the kernel or not ours; repaired", "elements", n)
		}
		return nil
	}
	d.drift++
	d.metrics.drift.Inc()
	d.log.Warn("the kernel's ipfence table differs from what was loaded; loading it again", "exists", ts.Exists)
	if _, err := d.load(ctx, d.current(), "", time.Now(), apply.Options{KeepXDP: true, Repair: true}); err != nil {
		return fmt.Errorf("loading the table again: %w", err)
	}
	return nil
}

// checkXDP checks that ipfence's XDP program runs on every interface of
// the plan and attaches the pinned program again where it does not (an
// interface made again, a link pin removed); it builds the program again
// when none is pinned or the last swap failed. Called with d.mu held.
func (d *Daemon) checkXDP(ctx context.Context) error {
	if len(d.plan.XDPRules()) == 0 {
		return nil
	}
	opt := d.cfg.XDP
	opt.NetNS, opt.Interfaces = d.cfg.NetNS, d.plan.Interfaces
	fixed, err := xdp.Reattach(opt)
	if d.xdpCurrent(d.plan) && err == nil {
		if len(fixed) > 0 {
			d.drift++
			d.metrics.drift.Inc()
			d.log.Warn("ipfence's XDP program had left interfaces of the policy; attached it again", "interfaces", fixed)
		}
		return nil
	}
	if err != nil && !errors.Is(err, xdp.ErrNotLoaded) {
		d.lastErr = err.Error()
		return fmt.Errorf("checking the XDP program: %w", err)
	}
	// The program in force is not the plan's (no program, or a swap that
	// failed): build it.
	if _, err := d.load(ctx, d.current(), "", time.Now(), apply.Options{Repair: true}); err != nil {
		return fmt.Errorf("loading the XDP program again: %w", err)
	}
	d.drift++
	d.metrics.drift.Inc()
	d.log.Warn("ipfence's XDP program was not the policy's; loaded it again")
	return nil
}

// current is the policy as loaded. Called with d.mu held.
func (d *Daemon) current() *compiled {
	return &compiled{pol: d.pol, res: d.res, plan: d.plan, prog: d.prog, ac: d.ac}
}

// listenUnix listens on a root-only Unix socket at path, replacing a
// stale socket file.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the socket folder: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("another daemon listens on %s", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
