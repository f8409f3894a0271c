// Package agent is `ipfence agent`: a daemon (package daemon) whose
// policy is its group's signed revision in the fleet's JetStream
// (package broker), not a local file, loaded on this host's backend
// (nftables with the policy's XDP rules, ipset or iptables-split) through
// the apply layer (package apply).
//
// The agent watches the group's pointer, verifies it against the
// configured public key, fetches the bundle it names (after a random
// delay, so that a fleet does not fetch at once), checks its digest and
// hands it to the daemon, which sends the difference to the kernel in one
// transaction. The last good revision is kept in the state folder: with
// NATS unreachable, at boot or later, the agent enforces it and retries.
// Fleet bans arrive on the bans stream and go through the daemon's ban
// queue with the time they have left. The agent reports its status to
// the status bucket at every change and as a heartbeat.
package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/daemon"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/version"
)

// Config configures an Agent.
type Config struct {
	// Daemon is the local daemon's configuration (namespace, state
	// folder, API socket, metrics, XDP); its Policy and Input are the
	// agent's.
	Daemon daemon.Config
	NATS   broker.Options
	// Name is this host in the fleet (default: the host name); Group is
	// the host group whose policy it runs (default "default").
	Name, Group string
	// PubKey checks the pointers; BanKey the fleet bans (default PubKey).
	PubKey, BanKey ed25519.PublicKey
	// Jitter bounds the random delay before fetching a new bundle
	// (default 2s; negative: none).
	Jitter time.Duration
	// Heartbeat is how often the status is written without a change
	// (default 15s); Poll how often the pointer is read besides the watch
	// (default 30s).
	Heartbeat, Poll time.Duration
	// Watch is how often the pointer and new fleet bans are read
	// (default 1s): an agent subscribes to nothing but its own inbox.
	Watch time.Duration
	// Backend is where this host runs the revisions: nftables (with the
	// XDP rules the policy asks for), ipset or iptables-split; "" or auto
	// is what the host supports (doctor.Pick). IPTables is the iptables
	// flavour of the iptables backends ("" : the one `iptables` is).
	Backend  plan.Backend
	IPTables string
}

// Agent is a running `ipfence agent`.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	broker *broker.Hub
	d      *daemon.Daemon
	dir    string // where the last good revision is kept
	start  time.Time

	// mu guards what follows. Revisions are applied one at a time by
	// first, then followPointer's goroutine.
	mu      sync.Mutex
	cur     *revision // in force
	next    *revision // being applied
	seq     uint64    // the last pointer followed
	lastErr string
	failed  uint64 // the pointer lastErr is about
	mode    string
	took    time.Duration

	// The fleet's bans and allow entries, as they arrive, each kind
	// with the newest message applied per prefix.
	bans, allows    chan *fleet.Ban
	seen, allowSeen *seenBans
}

// revision is a bundle in force, and the pointer that led to it.
type revision struct {
	Group   string    `json:"group"`
	Seq     uint64    `json:"seq"` // the pointer's
	Digest  string    `json:"digest"`
	Applied time.Time `json:"applied"`
	// File is the digest of the bundle as kept on disk when it is not
	// Digest: rebuilt from a difference bundle, and encoded here.
	File string `json:"file,omitempty"`
	in   *plan.Input
	// base is the bundle, slim (fleet.Bundle.Slim): what the next
	// difference bundle applies to, without reading the bundle back from
	// disk and its prefixes again (a sixth of an agent's CPU for a 1%
	// change of a 400k-line feed).
	base *fleet.Bundle
	// Fetched is how many bytes the revision took to fetch, and Via
	// whether as the bundle or as a difference.
	Fetched int64  `json:"-"`
	Via     string `json:"-"`
}

// read sets rev's input and its slim base from b, its bundle.
func (rev *revision) read(b *fleet.Bundle) (err error) {
	if rev.in, err = b.Input(); err == nil {
		rev.base = b.Slim() // after Input: the sets it read
	}
	return err
}

// file is the digest of rev's bundle as kept on disk.
func (rev *revision) file() string {
	if rev.File != "" {
		return rev.File
	}
	return rev.Digest
}

// New returns an agent for cfg (nothing is started).
func New(cfg Config) (*Agent, error) {
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("naming this host: %w (give --name)", err)
		}
		cfg.Name = h
	}
	if cfg.Group == "" {
		cfg.Group = "default"
	}
	if err := errors.Join(broker.CheckName("host", cfg.Name), broker.CheckName("group", cfg.Group)); err != nil {
		return nil, err
	}
	if cfg.BanKey == nil {
		cfg.BanKey = cfg.PubKey
	}
	if cfg.Daemon.Logger == nil {
		cfg.Daemon.Logger = slog.Default()
	}
	switch cfg.Backend {
	case "", plan.Auto:
		b, why, err := doctor.Pick()
		if err != nil {
			return nil, fmt.Errorf("backend auto: %w", err)
		}
		cfg.Backend = b
		cfg.Daemon.Logger.Info("backend chosen", "backend", b, "why", why)
	case plan.NFTables, plan.IPSet, plan.IPTablesSplit:
	default:
		return nil, fmt.Errorf("agent backend %q: use nftables, ipset, iptables-split or auto (XDP rules come from the policy)", cfg.Backend)
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = 2 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 30 * time.Second
	}
	if cfg.Watch <= 0 {
		cfg.Watch = time.Second
	}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "ipfence agent " + cfg.Name
	}
	a := &Agent{cfg: cfg, log: cfg.Daemon.Logger, dir: statedir.Dir{Path: cfg.Daemon.StateDir}.FleetDir(cfg.Daemon.NetNS),
		bans: make(chan *fleet.Ban, 4096), allows: make(chan *fleet.Ban, 256)}
	a.cfg.Daemon.Policy = fmt.Sprintf("fleet group %s", cfg.Group)
	a.cfg.Daemon.Input = a.input
	a.cfg.Daemon.IPTables = cfg.IPTables
	return a, nil
}

// input is the engine's policy: the revision being applied, else the
// one in force, as this host's backend runs it.
func (a *Agent) input(context.Context) (*plan.Input, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return apply.ForHost(a.applying().in, a.cfg.Backend), nil
}

// applying is the revision being applied, else the one in force (a.mu
// held).
func (a *Agent) applying() *revision {
	if a.next != nil {
		return a.next
	}
	return a.cur
}

// Run runs the agent until ctx is done. The ruleset stays in force when
// it returns.
func (a *Agent) Run(ctx context.Context) error {
	a.start = time.Now()
	h, err := broker.Connect(a.cfg.NATS, true)
	if err != nil {
		return err
	}
	defer h.Close()
	a.broker = h
	if a.cur, err = a.loadSaved(); err != nil {
		a.log.Warn("the last good revision cannot be read; waiting for the group's", "err", err)
	}
	if a.cur != nil {
		a.seq = a.cur.Seq
		a.log.Info("enforcing the last good revision", "group", a.cur.Group, "seq", a.cur.Seq, "digest", a.cur.Digest)
	}
	saved := a.cur != nil
	if !saved {
		if err := a.first(ctx); err != nil {
			return err
		}
	}
	// Closed after every goroutine below is done (defers run last first).
	a.seen = a.openSeen("bans-seen.db")
	defer a.seen.Close()
	a.allowSeen = a.openSeen("allows-seen.db")
	defer a.allowSeen.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.d = daemon.New(a.cfg.Daemon)
	errc := make(chan error, 1)
	wg.Go(func() { errc <- a.d.Run(ctx) })
	select {
	case err := <-errc:
		// Said in the status too: the service manager starts the agent
		// again, a later revision may do better.
		a.fail(a.seq, err)
		a.report(ctx)
		return err
	case <-a.d.Ready():
	}
	a.mu.Lock()
	a.cur.Applied = time.Now()
	a.mu.Unlock()
	if !saved {
		if err := a.promote(a.cur); err != nil {
			a.log.Warn("recording the revision as last good", "err", err)
		}
	}
	wg.Go(func() { a.followPointer(ctx) })
	bans, allows := a.bansKind(), a.allowsKind()
	for _, k := range []*entryKind{bans, allows} {
		wg.Go(func() { a.followEntries(ctx, k) })
		wg.Go(func() { a.applyEntries(ctx, k) })
	}
	a.report(ctx)
	tick := time.NewTicker(a.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-tick.C:
			a.report(ctx)
		}
	}
}

// first waits for the group's first revision this host can run, with
// nothing in force yet (the kernel is not touched until then).
func (a *Agent) first(ctx context.Context) error {
	a.log.Info("no revision yet: waiting for the group's pointer", "group", a.cfg.Group, "nats", a.cfg.NATS.URL)
	wait := time.Second
	for {
		data, err := a.broker.Pointer(ctx, a.cfg.Group)
		switch {
		case err != nil:
			a.log.Warn("reading the group's pointer; trying again", "err", err)
		case data != nil:
			rev, seq, err := a.fetch(ctx, data)
			if err == nil {
				a.cur, a.seq = rev, seq
				return nil
			}
			a.fail(seq, err)
			wait = min(2*wait, a.cfg.Poll) // a refused revision is not fetched again at once
		}
		a.report(ctx)
		sleep(ctx, wait)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// errOld is fetch's answer to a pointer this host ran already.
var errOld = errors.New("revision followed already")

// fetch verifies a stored pointer, fetches and checks the bundle it
// names for this host, and returns it with the pointer's seq (errOld:
// nothing to do). A pointer refused itself (not signed with the key,
// another group's) names no revision of the group: its seq is 0.
func (a *Agent) fetch(ctx context.Context, data []byte) (*revision, uint64, error) {
	p, err := fleet.Verify(data, a.cfg.Group, a.cfg.PubKey)
	if err != nil {
		return nil, 0, fmt.Errorf("group %s's pointer refused: %w", a.cfg.Group, err)
	}
	a.mu.Lock()
	seq, cur, retry := a.seq, a.cur, a.lastErr != ""
	a.mu.Unlock()
	if p.Seq < seq || (p.Seq == seq && !retry) {
		if p.Seq < seq {
			a.log.Warn("ignoring an older revision of the group (replayed?)", "seq", p.Seq, "running", seq)
		}
		return nil, p.Seq, errOld
	}
	t := p.For(a.cfg.Name)
	if cur != nil && t.Digest == cur.Digest {
		return &revision{Group: p.Group, Seq: p.Seq, Digest: t.Digest, File: cur.File, in: cur.in, base: cur.base}, p.Seq, nil
	}
	if a.cfg.Jitter > 0 {
		select {
		case <-ctx.Done():
			return nil, p.Seq, ctx.Err()
		case <-time.After(rand.N(a.cfg.Jitter)):
		}
	}
	rev := &revision{Group: p.Group, Seq: p.Seq, Digest: t.Digest}
	if ref := p.DeltaFrom(curDigest(cur), t); ref != nil {
		err := a.fetchDelta(ctx, ref, cur, rev)
		if err == nil {
			return rev, p.Seq, nil
		}
		a.log.Warn("the difference bundle did not apply; fetching the whole bundle", "seq", p.Seq, "err", err)
	}
	raw, err := a.broker.Bundle(ctx, t.Digest, t.Size)
	if err != nil {
		return nil, p.Seq, err
	}
	b, err := t.Check(raw)
	if err != nil {
		return nil, p.Seq, fmt.Errorf("revision %d refused: %w", p.Seq, err)
	}
	if err := rev.read(b); err != nil {
		return nil, p.Seq, fmt.Errorf("revision %d refused: %w", p.Seq, err)
	}
	if err := a.save(raw, rev, "candidate"); err != nil {
		return nil, p.Seq, err
	}
	rev.Fetched, rev.Via = int64(len(raw)), "bundle"
	return rev, p.Seq, nil
}

func curDigest(cur *revision) string {
	if cur == nil {
		return ""
	}
	return cur.Digest
}

// fetchDelta makes rev's bundle of the one in force, cur, and the
// difference bundle ref names: fetched, checked against the signed
// pointer, applied to cur's slim base in memory (or the bundle kept on
// disk, checked against its digest), and the result checked against the
// digest the delta names. rev is changed only when all of it worked.
func (a *Agent) fetchDelta(ctx context.Context, ref *fleet.DeltaRef, cur, out *revision) error {
	rev := *out
	raw, err := a.broker.Bundle(ctx, ref.Digest, ref.Size)
	if err != nil {
		return err
	}
	d, err := ref.CheckDelta(raw)
	if err != nil {
		return err
	}
	var b *fleet.Bundle
	if cur.base != nil {
		b, err = d.Apply(cur.base)
	}
	if cur.base == nil || err != nil {
		// A slim base writes an unchanged rule's text from its set:
		// text another build wrote differently is read from disk.
		base, rerr := a.readBundle("good", cur)
		if rerr != nil {
			return errors.Join(err, rerr)
		}
		if b, err = d.Apply(base); err != nil {
			return err
		}
	}
	if err := rev.read(b); err != nil {
		return err
	}
	data, err := b.EncodeLocal()
	if err != nil {
		return err
	}
	// Kept as encoded here: its digest is the file's, not the pointer's.
	rev.File = fleet.Digest(data)
	if err := a.save(data, &rev, "candidate"); err != nil {
		return err
	}
	rev.Fetched, rev.Via = int64(len(raw)), "delta"
	*out = rev
	return nil
}

// followPointer applies every new pointer of the group: on the watch's
// updates, and every Poll in case an update was missed while away.
func (a *Agent) followPointer(ctx context.Context) {
	updates := make(chan []byte, 1)
	push := func(data []byte) {
		select { // only the newest matters
		case <-updates:
		default:
		}
		updates <- data
	}
	go func() {
		for ctx.Err() == nil {
			if err := a.broker.WatchPointer(ctx, a.cfg.Group, a.cfg.Watch, push); err != nil {
				a.log.Debug("watching the pointer; trying again", "err", err)
			}
			sleep(ctx, time.Second)
		}
	}()
	poll := time.NewTicker(a.cfg.Poll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case data := <-updates:
			a.follow(ctx, data)
		case <-poll.C:
			if data, err := a.broker.Pointer(ctx, a.cfg.Group); err != nil {
				a.log.Debug("reading the pointer", "err", err)
			} else if data != nil {
				a.follow(ctx, data)
			}
		}
	}
}

// follow applies the revision a pointer names for this host.
func (a *Agent) follow(ctx context.Context, data []byte) {
	t0 := time.Now()
	rev, seq, err := a.fetch(ctx, data)
	if errors.Is(err, errOld) {
		return
	}
	if err != nil {
		a.fail(seq, err)
		a.report(ctx)
		return
	}
	a.mu.Lock()
	same := rev.Digest == a.cur.Digest
	a.next = rev
	a.mu.Unlock()
	mode := "none"
	if !same {
		var r daemon.ReloadResult
		r, err = a.d.Reload(ctx)
		mode = r.Mode
	}
	a.mu.Lock()
	a.next = nil
	if err == nil {
		rev.Applied = time.Now()
		if same {
			rev.Applied = a.cur.Applied
		}
		a.cur, a.seq, a.lastErr, a.failed = rev, seq, "", 0
		a.mode, a.took = mode, time.Since(t0)
	}
	a.mu.Unlock()
	if err != nil {
		a.fail(seq, fmt.Errorf("applying revision %d: %w (the last good revision stays)", seq, err))
	} else {
		if !same {
			if err := a.promote(rev); err != nil {
				a.log.Warn("recording the revision as last good", "err", err)
			}
		}
		a.log.Info("revision applied", "group", rev.Group, "seq", seq, "digest", rev.Digest, "mode", mode, "ms", time.Since(t0).Milliseconds())
	}
	a.report(ctx)
}

// fail records err as the reason this host is not on pointer seq (0:
// the pointer was refused itself, and names no revision of the group).
func (a *Agent) fail(seq uint64, err error) {
	a.log.Error("revision not applied", "seq", seq, "err", err)
	a.mu.Lock()
	a.lastErr, a.failed = err.Error(), seq
	if seq > a.seq && a.cur != nil {
		// A revision of the group, seen and refused: a later poll retries
		// it, a replay of an older one is ignored. Only fetch's verified
		// pointers get here with a seq: a forged or another group's
		// pointer must not raise it.
		a.seq = seq
	}
	a.mu.Unlock()
}

// report writes the status (best effort: NATS may be away).
func (a *Agent) report(ctx context.Context) {
	s := a.Status()
	if err := a.broker.PutStatus(ctx, &s); err != nil {
		a.log.Debug("writing the status", "err", err)
	}
}

// Status is what the agent reports.
func (a *Agent) Status() fleet.Status {
	s := fleet.Status{Host: a.cfg.Name, Group: a.cfg.Group, Kernel: kernel(), Version: version.String(), Started: a.start, Heartbeat: time.Now()}
	var ds *api.Status
	if a.d != nil {
		select {
		case <-a.d.Ready():
			st := a.d.Status()
			ds = &st
		default:
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s.LastError, s.FailedSeq, s.Watermark, s.Mode, s.ApplyMillis = a.lastErr, a.failed, a.seq, a.mode, a.took.Milliseconds()
	if a.cur != nil {
		s.Seq, s.Digest, s.Applied = a.cur.Seq, a.cur.Digest, a.cur.Applied
		s.Fetched, s.Via = a.cur.Fetched, a.cur.Via
	}
	if ds != nil {
		s.Backend, s.Elements, s.Bans, s.Rules = string(a.cfg.Backend), ds.Elements, ds.Bans.Total, len(ds.Rules)
		for _, r := range ds.Rules {
			if r.Layout != "" && (s.Layout == "" || s.Layout == "replayed") {
				s.Layout = r.Layout // the first rule not replayed says why
			}
			s.PrefixesV4 += r.PrefixesV4
			s.PrefixesV6 += r.PrefixesV6
			if r.Backend == string(plan.XDP) {
				s.Backend = "nftables+xdp"
			}
		}
	}
	return s
}

// entryKind is one kind of the fleet's signed entries, bans or allow
// entries, and how this host applies them.
type entryKind struct {
	what   string // in messages: "bans", "allow entries"
	follow func(ctx context.Context, period time.Duration, fn func([]byte), failed func(error))
	verify func([]byte) (*fleet.Ban, error)
	ch     chan *fleet.Ban
	seen   *seenBans
	// add makes the entries of reqs, each on its own (a refused one
	// does not hold back the others); remove removes the fleet's
	// entry of a prefix (only the fleet's: this host's own stay).
	add    func(context.Context, []bansets.Request) ([]error, error)
	remove func(context.Context, netip.Prefix) error
	// noShorten: additions leave a longer entry of this host's own as
	// it is.
	noShorten bool
	// retry: a message refused here is not recorded as applied, so the
	// next restart applies it again (an allow entry refused for want of
	// allow sets, which a later revision may bring).
	retry bool
}

// bansKind is the fleet's bans: signed with the ban key, through the
// daemon's ban queue.
func (a *Agent) bansKind() *entryKind {
	return &entryKind{what: "bans", follow: a.broker.FollowBans, ch: a.bans, seen: a.seen, noShorten: true,
		verify: func(data []byte) (*fleet.Ban, error) { return fleet.VerifyBan(data, a.cfg.BanKey) },
		add: func(ctx context.Context, reqs []bansets.Request) ([]error, error) {
			_, errs, err := a.d.BanEach(ctx, reqs)
			return errs, err
		},
		remove: func(ctx context.Context, p netip.Prefix) error {
			// One escalated from a fleet ban goes too (bans: recidive).
			_, err := a.d.Unban(ctx, []bansets.Lift{{Prefix: p, Origin: FleetOrigin + "*", Escalated: true}})
			return err
		}}
}

// allowsKind is the fleet's allow entries: signed with the policy key
// (an allow opens what every rule and ban closes: ban writers may not).
func (a *Agent) allowsKind() *entryKind {
	// noShorten: a longer allow entry of this host's own stays, and
	// the fleet's removal leaves it.
	return &entryKind{what: "allow entries", follow: a.broker.FollowAllows, ch: a.allows, seen: a.allowSeen, noShorten: true, retry: true,
		verify: func(data []byte) (*fleet.Ban, error) { return fleet.VerifyAllow(data, a.cfg.PubKey) },
		add: func(ctx context.Context, reqs []bansets.Request) ([]error, error) {
			_, errs, err := a.d.AllowEach(ctx, reqs)
			return errs, err
		},
		remove: func(ctx context.Context, p netip.Prefix) error {
			_, err := a.d.Unallow(ctx, []bansets.Lift{{Prefix: p, Origin: FleetOrigin + "*"}})
			return err
		}}
}

// followEntries feeds k's stream to applyEntries, from the entries in
// force on, and follows it again after a failure.
func (a *Agent) followEntries(ctx context.Context, k *entryKind) {
	var refused, failed int
	var warned, warnedFail time.Time
	k.follow(ctx, a.cfg.Watch, func(data []byte) {
		b, err := k.verify(data)
		if err != nil {
			// Anyone with write credentials can store junk: said once a
			// minute at most.
			if refused++; time.Since(warned) > time.Minute {
				a.log.Warn("fleet "+k.what+" refused", "count", refused, "last", err)
				refused, warned = 0, time.Now()
			}
			return
		}
		select {
		case k.ch <- b:
		case <-ctx.Done():
		}
	}, func(err error) {
		// Once a minute at most: a server older than this agent has
		// no allows stream, and refuses every read of it.
		if failed++; time.Since(warnedFail) > time.Minute {
			a.log.Warn("reading the fleet "+k.what+"; trying again", "count", failed, "err", err)
			failed, warnedFail = 0, time.Now()
		}
	})
}

// maxClockSkew is how far in the future a fleet ban may be created.
const maxClockSkew = 5 * time.Minute

// FleetOrigin starts the origin of the bans (and allow entries) a fleet
// message makes on a host.
const FleetOrigin = "fleet:"

// applyEntries applies k's entries in order, as many as are waiting in
// one call to the daemon (one transaction for a catch-up of thousands).
func (a *Agent) applyEntries(ctx context.Context, k *entryKind) {
	for {
		var batch []*fleet.Ban
		select {
		case <-ctx.Done():
			return
		case b := <-k.ch:
			batch = append(batch, b)
		}
	more:
		for len(batch) < 65536 {
			select {
			case b := <-k.ch:
				batch = append(batch, b)
			default:
				break more
			}
		}
		a.entryBatch(ctx, k, batch)
	}
}

// entryBatch applies batch: runs of additions in one call each, removals
// between.
func (a *Agent) entryBatch(ctx context.Context, k *entryKind, batch []*fleet.Ban) {
	now := time.Now()
	var reqs []bansets.Request
	seen := make(map[netip.Prefix]time.Time, len(batch))
	applied := make(map[netip.Prefix]time.Time, len(batch)) // what is recorded
	var pending []time.Time                                 // reqs' messages' times
	flush := func() {
		if len(reqs) == 0 {
			return
		}
		errs, err := k.add(ctx, reqs)
		if err := errors.Join(append(errs, err)...); err != nil {
			a.log.Warn("fleet "+k.what+" refused here", "count", len(reqs), "err", err)
		}
		for i, r := range reqs {
			if !k.retry || err == nil && (i >= len(errs) || errs[i] == nil) {
				applied[r.Prefix] = pending[i]
			}
		}
		reqs, pending = reqs[:0], pending[:0]
	}
	defer func() {
		if err := k.seen.record(applied); err != nil {
			a.log.Warn("recording the fleet "+k.what+" applied", "err", err)
		}
	}()
	for _, b := range batch {
		b.Prefix = b.Prefix.Masked()
		if b.Created.After(now.Add(maxClockSkew)) {
			// It would hide every later message of the prefix until then.
			a.log.Warn("fleet "+k.what+": one refused, created in the future (check the clock of who wrote it)", "prefix", b.Prefix, "created", b.Created)
			continue
		}
		if last, ok := seen[b.Prefix]; k.seen.older(b.Prefix, b.Created) || ok && !b.Created.After(last) {
			continue // an older message replayed, or one applied already
		}
		seen[b.Prefix] = b.Created
		if b.Unban {
			flush()
			if err := k.remove(ctx, b.Prefix); err != nil {
				a.log.Warn("fleet "+k.what+": removing one", "prefix", b.Prefix, "err", err)
				if k.retry {
					continue
				}
			}
			applied[b.Prefix] = b.Created
			continue
		}
		left, live := b.Remaining(now)
		if !live {
			applied[b.Prefix] = b.Created
			continue
		}
		reqs = append(reqs, bansets.Request{Prefix: b.Prefix, TTL: left, Reason: b.Reason, Origin: FleetOrigin + b.Origin, NoShorten: k.noShorten})
		pending = append(pending, b.Created)
	}
	flush()
}

// openSeen opens the record of fleet messages applied, file in a.dir;
// if it cannot, replays are recognised until the agent restarts only.
func (a *Agent) openSeen(file string) *seenBans {
	err := os.MkdirAll(a.dir, 0o700)
	if err == nil {
		var s *seenBans
		if s, err = openSeen(filepath.Join(a.dir, file), time.Now()); err == nil {
			return s
		}
	}
	a.log.Error("fleet messages: replays are recognised until a restart only", "file", file, "err", err)
	return &seenBans{m: map[netip.Prefix]time.Time{}}
}

// The last good revision lives in a.dir: bundle and revision.json, and
// the one being tried as candidate.bundle.
func (a *Agent) save(raw []byte, rev *revision, name string) error {
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return fmt.Errorf("keeping the revision: %w", err)
	}
	meta, _ := json.Marshal(rev)
	return errors.Join(statedir.WriteFileAtomic(filepath.Join(a.dir, name+".bundle"), raw),
		statedir.WriteFileAtomic(filepath.Join(a.dir, name+".json"), meta))
}

// promote makes the candidate the last good revision.
func (a *Agent) promote(rev *revision) error {
	meta, _ := json.Marshal(rev)
	return errors.Join(os.Rename(filepath.Join(a.dir, "candidate.bundle"), filepath.Join(a.dir, "good.bundle")),
		statedir.WriteFileAtomic(filepath.Join(a.dir, "good.json"), meta))
}

// loadSaved reads the last good revision (nil: none).
func (a *Agent) loadSaved() (*revision, error) {
	meta, err := os.ReadFile(filepath.Join(a.dir, "good.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rev revision
	if err := json.Unmarshal(meta, &rev); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(a.dir, "good.json"), err)
	}
	if rev.Group != a.cfg.Group {
		return nil, fmt.Errorf("the last good revision is group %s's, this agent runs group %s", rev.Group, a.cfg.Group)
	}
	b, err := a.readBundle("good", &rev)
	if err != nil {
		return nil, err
	}
	if err := rev.read(b); err != nil {
		return nil, err
	}
	return &rev, nil
}

// readBundle reads rev's bundle as kept on disk under name, if it is.
func (a *Agent) readBundle(name string, rev *revision) (*fleet.Bundle, error) {
	raw, err := os.ReadFile(filepath.Join(a.dir, name+".bundle"))
	if err != nil {
		return nil, err
	}
	if fleet.Digest(raw) != rev.file() {
		return nil, fmt.Errorf("%w: the %s bundle on disk changed", fleet.ErrDigest, name)
	}
	return fleet.DecodeLocal(raw)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
