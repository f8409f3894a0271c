// Package bansets keeps the kernel's ban sets in step with ipfence's bans
// (package ban) in one namespace, and keeps the bans on disk: the one
// place where a ban goes from a request to the kernel, whoever asks (the
// daemon's API, `ipfence ban` without a daemon, fleet, fail2ban,
// CrowdSec) and whichever backend holds the sets.
//
// The desired state is a ban.Set, stored in a ban.Store. What the kernel
// holds is never read back (listing a million elements takes a minute):
// the Controller remembers the elements it put there, and each change
// sends only the difference to the backend's Sink, in one transaction:
// NFTSink (ipfence's table, with the base-chain rules that look the ban
// sets up, present only while a set is non-empty) or IPSetSink (the ipset
// backend's ban sets). The guard (protected and own addresses), the TTL
// limits and origins are checked here, for every sink alike.
package bansets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// Config says where a Controller works.
type Config struct {
	// Sink is the backend's ban sets; the Controller closes it.
	Sink Sink
	// Guard refuses bans of protected networks and own addresses.
	Guard ban.Guard
	// Store keeps the bans; the Controller does not close it.
	Store *ban.Store
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Policy is how bans aggregate (SetPolicy changes it).
	Policy ban.Policy
	// Logger gets what aggregation did and what failed of it (slog's
	// default when nil).
	Logger *slog.Logger
	// Allows makes the Controller keep allow entries (`ipfence allow`)
	// in the allow sets instead of bans: its messages say so; its Guard
	// is the zero one (only what is invalid or too broad is refused)
	// and its Policy the zero one.
	Allows bool
}

// Request is one ban to make.
type Request struct {
	Prefix netip.Prefix
	TTL    time.Duration // 0: for good
	Reason string
	Origin string
	// NoShorten keeps a ban of the prefix from another origin that lasts
	// at least as long: the request then changes nothing. Integrations
	// (fail2ban, CrowdSec) set it, so that they never cut short an
	// operator's ban, nor one another's. A ban of the same origin is
	// replaced as usual, so an origin can shorten its own bans.
	NoShorten bool
}

// Lift is one ban to lift: the ban of exactly Prefix, and only when
// Origin is empty or the ban's origin; an Origin ending in "*" matches
// every origin that starts with what precedes it ("fleet:*": a fleet
// ban, whoever made it).
type Lift struct {
	Prefix netip.Prefix
	Origin string
	// Forget forgets the prefix's strike too (see ban.Recidive): its
	// next ban is not escalated. Without it, a temporary ban lifted
	// leaves a strike as one that ran out does.
	Forget bool
	// Escalated also lifts the ban escalated (RecidiveOrigin) from a
	// ban of Origin: for lifts that are always deliberate (a fleet
	// unban, a CrowdSec decision deleted), not for an integration's
	// lift at the end of its own ban time (fail2ban's).
	Escalated bool
}

// Controller bans and unbans. It is safe for concurrent use; changes are
// serialized, each one transaction.
type Controller struct {
	cfg Config
	mu  sync.Mutex
	set *ban.Set
	// What the kernel holds, as last sent: every single-address ban of
	// set (an element each; addrs counts them per family), and nets.
	addrs [2]int
	nets  [2][]ban.Element
	// retry64 are the /64s whose aggregate bans a failed transaction left
	// out of line (reconcile64); aggOff: aggregation was turned off, and
	// the next Expire lifts the aggregate bans it made.
	retry64   map[netip.Prefix]bool
	retryLift map[netip.Prefix]bool // unbanned aggregates whose addresses still go
	aggOff    bool
	// pending are elements of bans that ran out while no Controller ran
	// (pruned by Open), deleted from the kernel with the next change: a
	// sink whose elements outlive their ban (ipset's, past its timeout
	// cap) needs that; for others deleting a gone element is no error.
	pending Snapshot
	// struckAt is when Expire last forgot the strikes that no longer
	// count.
	struckAt time.Time
}

// Close closes the Controller's sink (not the Store).
func (c *Controller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.Sink.Close()
}

// Snapshot is what the four ban sets hold (in the order of nft.BanSets:
// IPv4 and IPv6 addresses, then IPv4 and IPv6 prefix pieces), with
// absolute expiries.
type Snapshot [4][]ban.Element

// Open loads the stored bans and drops expired ones. It assumes the
// kernel holds what the store says (as after a successful change or an
// apply); Load sends everything again.
func Open(cfg Config) (*Controller, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	set, err := cfg.Store.Load()
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, set: set, retry64: map[netip.Prefix]bool{}, retryLift: map[netip.Prefix]bool{}}
	set.Track64(cfg.Policy.Aggregate6 >= 2)
	// Aggregates of an earlier run are brought in line at the first
	// Expire (the policy may have turned aggregation off since; a fix
	// left to retry then was lost with that run).
	set.EachNet(func(b ban.Ban) bool {
		if b.Origin == AggregateOrigin {
			c.retry64[b.Prefix] = true
		}
		return true
	})
	c.struckAt = c.cfg.Now()
	if gone := set.PruneStrikes(c.struckAt); len(gone) > 0 {
		if err := cfg.Store.Delete(gone...); err != nil {
			return nil, err
		}
	}
	if gone := set.Prune(c.cfg.Now()); len(gone) > 0 {
		strikes, del := c.ended(gone, time.Time{})
		if err := cfg.Store.Commit(nil, strikes, del); err != nil {
			return nil, err
		}
		for _, b := range gone {
			i := family(b.Prefix)
			if !b.IsAddr() {
				i += 2
			}
			// With its (past) expiry: were it ever put back, it is dropped.
			c.pending[i] = append(c.pending[i], ban.Element{Prefix: b.Prefix, Expires: b.Expires})
		}
	}
	// What the kernel holds: counted, not listed (sorting a million
	// addresses on every `ipfence ban` would be wasted).
	t := set.Tally()
	c.addrs = [2]int{t.Addr4, t.Addr6}
	c.nets = c.netPieces(c.cfg.Now())
	return c, nil
}

func (s Snapshot) empty() bool {
	for _, es := range s {
		if len(es) > 0 {
			return false
		}
	}
	return true
}

// Present says which of the four sets hold anything, as the Controller
// last sent them.
func (c *Controller) Present() [4]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.present()
}

func (c *Controller) present() [4]bool { return presence(c.addrs, c.nets) }

// presence says which sets hold anything, for addrs single addresses
// and nets prefix pieces per family.
func presence(addrs [2]int, nets [2][]ban.Element) [4]bool {
	return [4]bool{addrs[0] > 0, addrs[1] > 0, len(nets[0]) > 0, len(nets[1]) > 0}
}

// noun and verb name what the Controller keeps, in messages.
func (c *Controller) noun() string {
	if c.cfg.Allows {
		return "allow"
	}
	return "ban"
}

func (c *Controller) verb() string {
	if c.cfg.Allows {
		return "allowing"
	}
	return "banning"
}

// assume records that the kernel holds s.
func (c *Controller) assume(s Snapshot) {
	c.addrs = [2]int{len(s[0]), len(s[1])}
	c.nets = [2][]ban.Element{s[2], s[3]}
}

// Load runs a full load: load gets the bans in force at now and puts
// them in the kernel with everything else of the load (the nftables
// table with its ban sets, or the ipset backend's sets), then sink
// becomes the Controller's sink (nil: the one it has). No ban or unban
// runs meanwhile (one made between reading the bans and loading them
// would be lost from the kernel). If load fails, nothing is recorded and
// the sink stays.
func (c *Controller) Load(sink Sink, load func(s Snapshot, now time.Time) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	s := c.desired(now)
	if err := load(s, now); err != nil {
		return err
	}
	c.assume(s)
	if sink != nil && sink != c.cfg.Sink {
		c.cfg.Sink.Close()
		c.cfg.Sink = sink
	}
	c.sendPending(now)
	return nil
}

// sendPending deletes the pending elements from the kernel, best effort
// (a refusal leaves them for the next change). Called with c.mu held.
func (c *Controller) sendPending(now time.Time) {
	if c.pending.empty() {
		return
	}
	p := c.present()
	if c.cfg.Sink.Send(context.Background(), Change{Now: now, Del: c.pendingFor(), Present: p, Was: p}) == nil {
		c.pending = Snapshot{}
	}
}

// pendingFor is what of pending the sink deletes: every address, and
// the prefixes only where the sets hold prefixes as they are (ipset's
// hash:net). An nftables interval set holds disjoint pieces whose ends
// a pruned prefix can share with a live one's: deleting it there could
// cut the live piece.
func (c *Controller) pendingFor() Snapshot {
	p := c.pending
	if _, ok := c.cfg.Sink.(*IPSetSink); !ok {
		p[2], p[3] = nil, nil
	}
	return p
}

// SetGuard replaces the guard (a policy loaded with other protected
// prefixes); bans in force are not checked again.
func (c *Controller) SetGuard(g ban.Guard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.Guard = g
}

// SetPolicy makes p the policy of the bans made from now on.
func (c *Controller) SetPolicy(p ban.Policy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.Policy.Aggregate6 >= 2 && p.Aggregate6 < 2 {
		c.aggOff = true // the next Expire lifts what it made
	}
	c.cfg.Policy = p
	c.set.Track64(p.Aggregate6 >= 2 || c.aggOff)
}

// View exposes the bans for reading (List, Counts); callers must not
// change it and must hold no reference across Controller calls.
func (c *Controller) View(fn func(s *ban.Set)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(c.set)
}

// Prepared are bans the guard and the TTL limits have let through,
// ready for BanPrepared. The zero value bans nothing.
type Prepared struct {
	bans []ban.Ban
	// noShorten[i] is bans[i]'s Request.NoShorten; nil when none is set.
	noShorten []bool
}

// Len is the number of bans.
func (p Prepared) Len() int { return len(p.bans) }

// Bans are the bans; callers must not change them.
func (p Prepared) Bans() []ban.Ban { return p.bans }

// Prepare checks reqs (guard, TTL limits) and turns them into bans
// created now, without taking the Controller's lock: callers on many
// goroutines prepare in parallel, and the one committing does less. A
// request the guard refuses fails them all.
func (c *Controller) Prepare(reqs []Request) (Prepared, error) {
	for _, r := range reqs {
		if err := c.check(r); err != nil {
			return Prepared{}, err
		}
	}
	return prepared(reqs, c.cfg.Now()), nil
}

// PrepareEach is Prepare for requests that stand alone: the ones the
// guard or the TTL limits refuse are left out, with their error in
// errs (nil for the others), instead of failing the rest. For feeds of
// bans from elsewhere (CrowdSec), where one decision on a protected
// address must not hold back the others.
func (c *Controller) PrepareEach(reqs []Request) (p Prepared, errs []error) {
	errs = make([]error, len(reqs))
	ok := make([]Request, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = c.check(r); errs[i] == nil {
			ok = append(ok, r)
		}
	}
	return prepared(ok, c.cfg.Now()), errs
}

// check applies the guard and the TTL limits to r.
func (c *Controller) check(r Request) error {
	p := r.Prefix.Masked()
	if err := c.cfg.Guard.Check(p); err != nil {
		return err
	}
	if r.TTL != 0 && (r.TTL < ban.MinTTL || r.TTL > ban.MaxTTL) {
		return fmt.Errorf("%s %s: %w: %v is outside %v to %v", c.verb(), p, ban.ErrTTL, r.TTL, ban.MinTTL, ban.MaxTTL)
	}
	return nil
}

// prepared turns checked requests into bans created at now.
func prepared(reqs []Request, now time.Time) Prepared {
	p := Prepared{bans: make([]ban.Ban, len(reqs))}
	for i, r := range reqs {
		p.bans[i] = ban.Ban{Prefix: r.Prefix.Masked(), Created: now, Reason: r.Reason, Origin: r.Origin}
		if r.TTL != 0 {
			p.bans[i].Expires = now.Add(r.TTL)
		}
		if r.NoShorten {
			if p.noShorten == nil {
				p.noShorten = make([]bool, len(reqs))
			}
			p.noShorten[i] = true
		}
	}
	return p
}

// Ban bans every request in one transaction, or none of them: a request
// the guard refuses fails them all and changes nothing. Banning a prefix
// that is banned already replaces its ban (new expiry, reason, origin).
func (c *Controller) Ban(ctx context.Context, reqs []Request) ([]ban.Ban, error) {
	p, err := c.Prepare(reqs)
	if err != nil {
		return nil, err
	}
	return c.BanPrepared(ctx, p)
}

// BanPrepared makes the prepared bans in one transaction, in order (of
// two bans of one prefix, the later one stands), and returns the ones
// made (a NoShorten request that gave way to a longer ban is not).
func (c *Controller) BanPrepared(ctx context.Context, ps ...Prepared) ([]ban.Ban, error) {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var ch change
	var adds [2]int // single addresses per family: at most what ch.add will hold
	n := 0
	for _, p := range ps {
		n += len(p.bans)
		for _, b := range p.bans {
			if b.IsAddr() {
				adds[family(b.Prefix)]++
			}
		}
	}
	for f, n := range adds {
		ch.add[f] = make([]ban.Element, 0, n)
	}
	// replaced are the bans that were in force before, by index into
	// bans (ascending): what undoing this call puts back.
	type prior struct {
		i   int
		old ban.Ban
	}
	var replaced []prior
	var struck []ban.Strike // the strikes the bans took the place of
	taken := map[netip.Prefix]time.Duration{}
	bans := make([]ban.Ban, 0, n) // the bans made
	for _, p := range ps {
		for j := range p.bans {
			if p.noShorten != nil && p.noShorten[j] {
				b := p.bans[j]
				if old, ok := c.set.Get(b.Prefix); ok && old.Live(now) && old.Origin != b.Origin && old.Origin != AggregateOrigin && old.Outlasts(b) {
					continue
				}
			}
			// A strike the ban takes the place of goes back if the
			// transaction fails, whether or not the ban escalates.
			if st, ok := c.set.Strike(p.bans[j].Prefix, time.Time{}); ok {
				struck = append(struck, st)
			}
			// Escalated in place: the callers (the Queue) report the
			// prepared bans as made.
			c.escalate(&p.bans[j], now, taken)
			b := p.bans[j]
			old, existed := c.set.Put(b)
			if existed {
				replaced = append(replaced, prior{len(bans), old})
			}
			bans = append(bans, b)
			if !b.IsAddr() {
				ch.nets = true
				continue
			}
			f := family(b.Prefix)
			if existed {
				ch.del[f] = append(ch.del[f], ban.Element{Prefix: old.Prefix, Expires: old.Expires})
			} else {
				ch.n[f]++
			}
			ch.add[f] = append(ch.add[f], ban.Element{Prefix: b.Prefix, Expires: b.Expires})
		}
	}
	if len(bans) == 0 {
		return nil, nil
	}
	save := func() error { return c.cfg.Store.Put(bans...) }
	hadStrike := make(map[netip.Prefix]bool, len(struck))
	for _, st := range struck {
		hadStrike[st.Prefix] = true
	}
	unsave := func() error { // the store as it was: as each prefix's first ban found it
		put := make([]ban.Ban, 0, len(replaced))
		var del []netip.Prefix
		seen := make(map[netip.Prefix]bool, len(bans))
		k := 0
		for i, b := range bans {
			first := !seen[b.Prefix]
			seen[b.Prefix] = true
			switch {
			case k < len(replaced) && replaced[k].i == i:
				if first {
					put = append(put, replaced[k].old)
				}
				k++
			case first && !hadStrike[b.Prefix]:
				del = append(del, b.Prefix)
			}
		}
		return c.cfg.Store.Commit(put, struck, del)
	}
	if err := c.commit(ctx, now, &ch, save, unsave); err != nil {
		k := len(replaced) - 1
		for i := len(bans) - 1; i >= 0; i-- {
			if k >= 0 && replaced[k].i == i {
				c.set.Put(replaced[k].old)
				k--
			} else {
				c.set.Delete(bans[i].Prefix)
			}
		}
		for _, st := range struck {
			c.set.PutStrike(st)
		}
		return nil, err
	}
	if c.aggregating() {
		touched := map[netip.Prefix]ban.Ban{}
		n := c.cfg.Policy.Aggregate6
		for _, b := range bans {
			if p, ok := ban.Net64(b.Prefix); !ok || n < 2 || c.set.Count64(p) >= n {
				touch64(touched, b, true)
			}
		}
		made, _ := c.reconcile64(ctx, now, touched, nil)
		bans = append(bans, made...)
	}
	return bans, nil
}

// aggregating reports whether aggregation has work: it is on, or aggregate
// bans may be left from when it was (c.mu held).
func (c *Controller) aggregating() bool {
	return c.cfg.Policy.Aggregate6 >= 2 || c.aggOff
}

// AggregateOrigin is the origin of a /64 ban that aggregation made.
const AggregateOrigin = "aggregate"

// touch64 notes in t the /64 of b, when b bans an IPv6 address, with b as
// the ban that touched it last (fill).
func touch64(t map[netip.Prefix]ban.Ban, b ban.Ban, fill bool) {
	p, ok := ban.Net64(b.Prefix)
	if !ok && b.Prefix.Addr().Is6() && b.Prefix.Bits() == 64 {
		p, ok, fill = b.Prefix, true, false // a /64 ban that went: its addresses may call for one
	}
	if !ok {
		return
	}
	if fill {
		t[p] = b
	} else if _, seen := t[p]; !seen {
		t[p] = ban.Ban{}
	}
}

// reconcile64 brings the aggregate /64 bans (origin AggregateOrigin) of
// the /64s in touched in line with their address bans, in one more
// transaction, and returns the bans it made and the ones it lifted:
//   - a /64 holding Aggregate6 or more address bans and no live ban of its
//     own is banned (unless the guard refuses it: a protected address, or
//     one of this host's, inside), for as long as the ban that filled it
//     (touched's), or, with none, the longest of its addresses' (one pass
//     over the address bans finds them);
//   - an aggregate that a later ban of its addresses outlasts is extended;
//   - one whose addresses fell below Aggregate6 (lifted or expired), or
//     with aggregation off, is lifted;
//   - unbanned, an aggregate's addresses go with it (lifted, its /64s).
//
// The addresses' own bans stay, with their origins, so an integration
// lifts what it made. A failed transaction is logged, and its /64s are
// tried again at the next Expire. The caller holds c.mu.
func (c *Controller) reconcile64(ctx context.Context, now time.Time, touched map[netip.Prefix]ban.Ban, lifted []netip.Prefix) (made, gone []ban.Ban) {
	for p := range c.retry64 {
		if _, ok := touched[p]; !ok {
			touched[p] = ban.Ban{}
		}
	}
	for p := range c.retryLift {
		if !slices.Contains(lifted, p) {
			lifted = append(lifted, p)
		}
	}
	if len(touched)+len(lifted) == 0 {
		return nil, nil
	}
	n := c.cfg.Policy.Aggregate6
	// Bans that ran out count no more: pruned here, and deleted with this
	// transaction (as Expire would), so that the counts are of live bans.
	pruned := c.set.Prune(now)
	for _, b := range pruned {
		touch64(touched, b, false)
	}
	var del []netip.Prefix
	if len(lifted) > 0 {
		inside := make(map[netip.Prefix]bool, len(lifted))
		for _, p := range lifted {
			inside[p] = true
		}
		c.set.EachAddr(func(b ban.Ban) bool {
			if p, ok := ban.Net64(b.Prefix); ok && inside[p] {
				del = append(del, b.Prefix)
			}
			return true
		})
	}
	// The counts below are after the address lifts.
	removed := pruned
	for _, p := range del {
		if b, ok := c.set.Delete(p); ok {
			removed = append(removed, b)
		}
	}
	var put []ban.Ban
	longest := map[netip.Prefix]bool{} // made for as long as their addresses
	for p, fill := range touched {
		cur, has := c.set.Get(p)
		live := has && cur.Live(now)
		mine := live && cur.Origin == AggregateOrigin
		count := c.set.Count64(p)
		switch {
		case mine && (n < 2 || count < n || c.cfg.Guard.Check(p) != nil):
			if b, ok := c.set.Delete(p); ok {
				removed = append(removed, b)
			}
		case mine:
			if fill.Prefix.IsValid() && !fill.Expires.Equal(cur.Expires) && fill.Outlasts(cur) {
				cur.Expires = fill.Expires
				put = append(put, cur)
			}
		case live || n < 2 || count < n || c.cfg.Guard.Check(p) != nil:
		case fill.Prefix.IsValid():
			put = append(put, ban.Ban{Prefix: p, Created: now, Expires: fill.Expires, Origin: AggregateOrigin,
				Reason: fmt.Sprintf("%d addresses of %s banned (aggregate_v6: %d)", count, p, n)})
		default:
			longest[p] = true
		}
	}
	if len(longest) > 0 {
		exp := map[netip.Prefix]time.Time{}
		perm := map[netip.Prefix]bool{}
		c.set.EachAddr(func(b ban.Ban) bool {
			if p, ok := ban.Net64(b.Prefix); ok && longest[p] && b.Live(now) {
				if b.Expires.IsZero() {
					perm[p] = true
				} else if b.Expires.After(exp[p]) {
					exp[p] = b.Expires
				}
			}
			return true
		})
		for p := range longest {
			if !perm[p] && exp[p].IsZero() {
				continue // no address of it is live
			}
			a := ban.Ban{Prefix: p, Created: now, Expires: exp[p], Origin: AggregateOrigin,
				Reason: fmt.Sprintf("%d addresses of %s banned (aggregate_v6: %d)", c.set.Count64(p), p, n)}
			if perm[p] {
				a.Expires = time.Time{}
			}
			put = append(put, a)
		}
	}
	if len(put)+len(removed) == 0 {
		clear(c.retry64)
		clear(c.retryLift)
		return nil, nil
	}
	// The bans pruned here ran out: they leave strikes as Expire's do,
	// but for the prefixes an aggregate takes (put after them).
	strikes, ran := c.ended(pruned, time.Time{})
	aggregated := make(map[netip.Prefix]bool, len(put))
	for _, b := range put {
		aggregated[b.Prefix] = true
	}
	strikes = slices.DeleteFunc(strikes, func(s ban.Strike) bool { return aggregated[s.Prefix] })
	ran = slices.DeleteFunc(ran, func(p netip.Prefix) bool { return aggregated[p] })
	var old []ban.Ban // what put replaced
	for _, b := range put {
		if o, existed := c.set.Put(b); existed {
			old = append(old, o)
		}
	}
	var ch change
	for _, b := range removed {
		ch.remove(b)
	}
	ch.nets = ch.nets || len(put) > 0
	save := func() error {
		return c.cfg.Store.Commit(put, strikes, slices.Concat(ran, prefixes(removed[len(pruned):])))
	}
	unsave := func() error {
		back := slices.Concat(old, removed)
		var drop []netip.Prefix
		for _, b := range put {
			if !slices.ContainsFunc(old, func(o ban.Ban) bool { return o.Prefix == b.Prefix }) {
				drop = append(drop, b.Prefix)
			}
		}
		return c.cfg.Store.Change(back, drop)
	}
	if err := c.commit(ctx, now, &ch, save, unsave); err != nil {
		for _, b := range put {
			c.set.Delete(b.Prefix)
		}
		for _, b := range slices.Concat(old, removed[len(pruned):]) {
			c.set.Put(b) // the pruned stay pruned: the next Open drops them from the store
		}
		for p := range touched {
			c.retry64[p] = true
		}
		for _, p := range lifted {
			c.retryLift[p] = true // an operator's unban of an aggregate: its addresses still go
		}
		c.log().Warn("bringing the aggregate /64 bans in line (aggregate_v6) failed; tried again at the next expiry", "err", err)
		return nil, nil
	}
	clear(c.retry64)
	clear(c.retryLift)
	if len(put) > 0 {
		c.log().Info("aggregate /64 bans (aggregate_v6) made or extended", "count", len(put), "first", put[0].Prefix)
	}
	return put, removed
}

// log is the Controller's logger.
func (c *Controller) log() *slog.Logger {
	if c.cfg.Logger != nil {
		return c.cfg.Logger
	}
	return slog.Default()
}

// change is what one transaction does to the ban sets: single-address
// elements to delete and add, and the change in their number, per family
// (0 IPv4, 1 IPv6); nets says the CIDR bans changed.
type change struct {
	add, del [2][]ban.Element
	n        [2]int
	nets     bool
}

// remove adds to ch the removal of ban b.
func (ch *change) remove(b ban.Ban) {
	if !b.IsAddr() {
		ch.nets = true
		return
	}
	f := family(b.Prefix)
	ch.del[f] = append(ch.del[f], ban.Element{Prefix: b.Prefix, Expires: b.Expires})
	ch.n[f]--
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 0
	}
	return 1
}

// Unban lifts the bans of ls (exactly these prefixes, of the origin a
// Lift names; one not banned is no error) in one transaction, and
// returns the bans lifted.
func (c *Controller) Unban(ctx context.Context, ls []Lift) ([]ban.Ban, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	var lifted []ban.Ban
	var forgotten []ban.Strike // strikes forgotten without a ban lifted
	forget := map[netip.Prefix]bool{}
	var ch change
	for _, l := range ls {
		p := l.Prefix.Masked()
		if l.Forget {
			forget[p] = true
			if st, ok := c.set.Strike(p, time.Time{}); ok {
				forgotten = append(forgotten, st)
			}
		}
		if l.Origin != "" {
			if b, ok := c.set.Get(p); !ok || !l.lifts(b) {
				continue
			}
		}
		b, ok := c.set.Delete(p)
		if !ok {
			continue
		}
		lifted = append(lifted, b)
		ch.remove(b)
	}
	if len(lifted) == 0 {
		if len(forgotten) == 0 {
			return nil, nil
		}
		ps := make([]netip.Prefix, len(forgotten))
		for i, st := range forgotten {
			ps[i] = st.Prefix
		}
		if err := c.cfg.Store.Delete(ps...); err != nil {
			return nil, err
		}
		for _, p := range ps {
			c.set.ForgetStrike(p)
		}
		return nil, nil
	}
	// A lifted temporary ban leaves a strike, unless forgotten (an
	// integration's unban at the end of its own ban time is a lift).
	var strikes []ban.Strike
	var del []netip.Prefix
	for _, b := range lifted {
		if st, ok := c.cfg.Policy.Recidive.StrikeOf(b, now); ok && !forget[b.Prefix] && b.Origin != AggregateOrigin {
			strikes = append(strikes, st)
		} else {
			del = append(del, b.Prefix)
		}
	}
	for _, st := range forgotten {
		del = append(del, st.Prefix) // a prefix with a strike has no ban: not lifted
	}
	save := func() error { return c.cfg.Store.Commit(nil, strikes, del) }
	unsave := func() error { return c.cfg.Store.Commit(lifted, forgotten, nil) }
	if err := c.commit(ctx, now, &ch, save, unsave); err != nil {
		for _, b := range lifted {
			c.set.Put(b)
		}
		return nil, err
	}
	for _, st := range strikes {
		c.set.PutStrike(st)
	}
	for _, st := range forgotten {
		c.set.ForgetStrike(st.Prefix)
	}
	if c.aggregating() {
		touched := map[netip.Prefix]ban.Ban{}
		var aggs []netip.Prefix
		for _, b := range lifted {
			touch64(touched, b, false)
			if b.Origin == AggregateOrigin {
				aggs = append(aggs, b.Prefix)
			}
		}
		_, more := c.reconcile64(ctx, now, touched, aggs)
		lifted = append(lifted, more...)
	}
	return lifted, nil
}

// Expire forgets bans that have run out (the kernel removed their
// elements itself) and drops the base-chain rules of ban sets that
// became empty. The daemon calls it now and then.
func (c *Controller) Expire(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	c.pruneStrikes(now)
	gone := c.set.Prune(now)
	if len(gone) == 0 {
		c.expire64(ctx, now, nil)
		return 0, nil
	}
	// Their elements go: the kernel has removed most itself (deleting
	// a gone element is no error), but a sink's element may outlive its
	// ban (ipset's timeouts are capped).
	var ch change
	for _, b := range gone {
		if b.IsAddr() {
			f := family(b.Prefix)
			ch.n[f]--
			ch.del[f] = append(ch.del[f], ban.Element{Prefix: b.Prefix, Expires: b.Expires})
		} else {
			ch.nets = true
		}
	}
	// Expired bans stay expired: if the kernel refuses, they need not
	// come back to the store. Those that escalate a repeat leave a
	// strike.
	strikes, del := c.ended(gone, time.Time{})
	err := c.commit(ctx, now, &ch, func() error { return c.cfg.Store.Commit(nil, strikes, del) }, nil)
	// Expired bans stay expired, sent or not: the aggregates follow.
	c.expire64(ctx, now, gone)
	return len(gone), err
}

// ended leaves the strikes (ban.Recidive) of bans that ended, in the
// set, and returns them and the prefixes of the others, whose records
// go. A ban ends at its expiry, or at end when that is not zero (a
// lift). Aggregates leave none: their addresses' bans do (c.mu held).
func (c *Controller) ended(gone []ban.Ban, end time.Time) (strikes []ban.Strike, del []netip.Prefix) {
	now := c.cfg.Now()
	for _, b := range gone {
		at := end
		if at.IsZero() {
			at = b.Expires
		}
		if st, ok := c.cfg.Policy.Recidive.StrikeOf(b, at); ok && b.Origin != AggregateOrigin && st.Until.After(now) {
			c.set.PutStrike(st)
			strikes = append(strikes, st)
			continue
		}
		del = append(del, b.Prefix)
	}
	return strikes, del
}

// strikePruneEvery is how often Expire forgets the strikes that no
// longer count (a pass over all of them).
const strikePruneEvery = time.Minute

// pruneStrikes forgets the strikes that no longer count, at most once
// every strikePruneEvery; a failure to delete their records is logged
// (the next load forgets them again) (c.mu held).
func (c *Controller) pruneStrikes(now time.Time) {
	if c.set.Strikes() == 0 || now.Sub(c.struckAt) < strikePruneEvery {
		return
	}
	c.struckAt = now
	if gone := c.set.PruneStrikes(now); len(gone) > 0 {
		if err := c.cfg.Store.Delete(gone...); err != nil {
			c.log().Warn("forgetting the strikes past the recidive window", "count", len(gone), "err", err)
		}
	}
}

// escalate lengthens b, a ban about to be made at now, when its prefix
// was banned before within the recidive window (ban.Recidive): from its
// strike, or from its last ban if that ran out and Expire has not pruned
// it yet (c.mu held).
//
// An escalated ban is made with the origin RecidiveOrigin (its reason
// names the origin that asked): the one that asked lifts, shortens or
// re-sends its own bans (fail2ban's unban at the end of its ban time,
// CrowdSec's decisions pulled again) and would otherwise undo the
// escalation. taken are the prefixes this transaction escalated, with
// the duration each escalated from: a second ban of one in the same
// transaction is escalated alike.
func (c *Controller) escalate(b *ban.Ban, now time.Time, taken map[netip.Prefix]time.Duration) {
	rc := c.cfg.Policy.Recidive
	if !rc.On() || b.Expires.IsZero() || b.Origin == AggregateOrigin {
		return
	}
	var last time.Duration
	st, struck := c.set.Strike(b.Prefix, now)
	if l, ok := taken[b.Prefix]; ok {
		last = l
	} else {
		switch old, ok := c.set.Get(b.Prefix); {
		case ok && old.Live(now):
			return // the same incident: no repeat
		case ok && old.Origin != AggregateOrigin:
			if s, ok := rc.StrikeOf(old, old.Expires); ok && s.Until.After(now) {
				last = s.TTL
			}
		case struck:
			last = st.TTL
		}
	}
	ask := b.Expires.Sub(b.Created)
	if ttl := min(rc.Escalate(ask, last), ban.MaxTTL); ttl > ask {
		taken[b.Prefix] = last
		b.Expires = b.Created.Add(ttl)
		if b.Origin != RecidiveOrigin {
			b.Reason = strings.TrimSpace(fmt.Sprintf("repeat (%s): %s", b.Origin, b.Reason))
			b.Origin = RecidiveOrigin
		}
		c.log().Info("repeat ban escalated (recidive)", "prefix", b.Prefix, "asked", ask, "given", ttl, "last", last)
	}
}

// RecidiveOrigin is the origin of the bans escalated as repeats
// (ban.Recidive): lifted by an unban of no origin or of this one.
const RecidiveOrigin = "recidive"

// expire64 brings the aggregates in line with the bans gone, and with the
// /64s tried before; once aggregation is turned off, it lifts what it
// left (c.mu held).
func (c *Controller) expire64(ctx context.Context, now time.Time, gone []ban.Ban) {
	if !c.aggregating() && len(c.retry64)+len(c.retryLift) == 0 {
		return
	}
	touched := map[netip.Prefix]ban.Ban{}
	for _, b := range gone {
		touch64(touched, b, false)
	}
	if c.aggOff {
		c.set.EachNet(func(b ban.Ban) bool {
			if b.Origin == AggregateOrigin {
				touched[b.Prefix] = ban.Ban{}
			}
			return true
		})
	}
	c.reconcile64(ctx, now, touched, nil)
	c.aggOff = false
}

// commit sends ch (and, when the CIDR bans changed, the difference of
// their disjoint pieces) in one transaction, with the base chain when a
// ban set became empty or non-empty, and meanwhile persists the change
// with save (a journal sync and a kernel transaction take about as long;
// the call returns when both are done). If save fails the kernel is put
// back as it was; if the kernel refuses, unsave (when not nil) puts the
// store back.
func (c *Controller) commit(ctx context.Context, now time.Time, ch *change, save, unsave func() error) error {
	oldAddrs, oldNets := c.addrs, c.nets
	newAddrs := [2]int{c.addrs[0] + ch.n[0], c.addrs[1] + ch.n[1]}
	newNets := oldNets
	if ch.nets {
		newNets = c.netPieces(now)
	}
	// Per ban set: the elements to add and to delete.
	var add, del Snapshot
	for f := range 2 {
		add[f], del[f] = ch.add[f], ch.del[f]
		add[2+f], del[2+f] = ban.Diff(oldNets[f], newNets[f])
	}
	pending := c.pendingFor()
	for i := range del {
		del[i] = append(del[i], pending[i]...)
	}
	before, after := presence(oldAddrs, oldNets), presence(newAddrs, newNets)
	saved := make(chan error, 1)
	go func() { saved <- save() }()
	kerr := c.cfg.Sink.Send(ctx, Change{Now: now, Add: add, Del: del, Present: after, Was: before})
	serr := <-saved
	switch {
	case kerr != nil && serr == nil && unsave != nil:
		if uerr := unsave(); uerr != nil {
			return errors.Join(fmt.Errorf("updating the %s sets: %w", c.noun(), kerr), fmt.Errorf("and putting the %s store back failed: %w", c.noun(), uerr))
		}
		fallthrough
	case kerr != nil:
		return fmt.Errorf("updating the %s sets: %w", c.noun(), kerr)
	case serr != nil:
		back := Change{Now: now, Add: del, Del: add, Present: before, Was: after}
		if uerr := c.cfg.Sink.Send(ctx, back); uerr != nil {
			return errors.Join(serr, fmt.Errorf("and putting the kernel back failed: %w", uerr))
		}
		return serr
	}
	c.addrs, c.nets = newAddrs, newNets
	c.pending = Snapshot{} // sent with this change
	return nil
}

// desired is what the ban sets must hold at now.
func (c *Controller) desired(now time.Time) Snapshot {
	var s Snapshot
	for _, e := range c.set.AddrElements(now) {
		f := family(e.Prefix)
		s[f] = append(s[f], e)
	}
	nets := c.netPieces(now)
	s[2], s[3] = nets[0], nets[1]
	return s
}

// netPieces is what the prefix ban sets must hold at now, per family.
func (c *Controller) netPieces(now time.Time) [2][]ban.Element {
	var out [2][]ban.Element
	for _, e := range c.set.NetElements(now) {
		f := family(e.Prefix)
		out[f] = append(out[f], e)
	}
	return out
}

func prefixes(bs []ban.Ban) []netip.Prefix {
	ps := make([]netip.Prefix, len(bs))
	for i, b := range bs {
		ps[i] = b.Prefix
	}
	return ps
}

// Verify checks the kernel's ban sets against what the Controller put
// there and repairs the difference, where the sink can (a Verifier): up
// to sample single-address bans must be there (a different sample each
// time), and the prefix pieces must be exactly what was sent. It returns
// how many elements it added or removed.
func (c *Controller) Verify(ctx context.Context, sample int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.cfg.Sink.(Verifier)
	if !ok {
		return 0, nil
	}
	now := c.cfg.Now()
	var probe [2][]ban.Element
	n := 0
	c.set.EachAddr(func(b ban.Ban) bool {
		if b.Live(now) && b.Remaining(now) != 0 && b.Remaining(now) < time.Second {
			return true // may expire in the kernel while we look
		}
		if b.Live(now) {
			f := family(b.Prefix)
			probe[f] = append(probe[f], ban.Element{Prefix: b.Prefix, Expires: b.Expires})
			n++
		}
		return n < sample
	})
	return v.Verify(ctx, now, probe, c.nets)
}

// lifts reports whether l lifts b: a ban of its origin, or with
// Escalated one escalated from a ban of its origin.
func (l Lift) lifts(b ban.Ban) bool {
	if l.matches(b.Origin) {
		return true
	}
	if !l.Escalated || b.Origin != RecidiveOrigin {
		return false
	}
	rest, ok := strings.CutPrefix(b.Reason, "repeat (")
	asked, _, ok2 := strings.Cut(rest, "):")
	return ok && ok2 && l.matches(asked)
}

// matches reports whether origin is one that l lifts.
func (l Lift) matches(origin string) bool {
	if pre, ok := strings.CutSuffix(l.Origin, "*"); ok {
		return strings.HasPrefix(origin, pre)
	}
	return origin == l.Origin
}
