package bansets

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
)

// Sink is a backend's ban sets in the kernel. The Controller calls it
// with its lock held, one call at a time.
type Sink interface {
	// Send makes one change in one transaction, or none of it.
	Send(ctx context.Context, ch Change) error
	// Close releases what the sink holds open (a netlink connection).
	Close()
}

// Verifier is a Sink that can check the kernel's sets against what was
// sent and repair them (see Controller.Verify).
type Verifier interface {
	// Verify makes sure the single-address bans of probe (per family) are
	// in the kernel and that the prefix sets hold exactly nets; it
	// returns how many elements it added or removed.
	Verify(ctx context.Context, now time.Time, probe, nets [2][]ban.Element) (int, error)
}

// Change is what one transaction does to the ban sets, per set in
// Snapshot's order: the elements to add (with their time left at Now)
// and to delete; Present says which sets hold anything afterwards, Was
// which held anything before.
type Change struct {
	Now          time.Time
	Add, Del     Snapshot
	Present, Was [4]bool
}

// ErrNoBanSets is returned for bans on a backend that has no ban sets
// (iptables-split: chains only).
var ErrNoBanSets = errors.New("this backend has no ban sets: bans need nftables (backend nftables or xdp) or ipset (backend ipset); iptables-split has chains only")

// ErrNoAllowSets is returned for allow entries where the loaded policy
// has no allow sets that come before all of its rules: iptables-split,
// and policies with rules in XDP (ahead of the table).
var ErrNoAllowSets = errors.New("allow entries need the nftables backend (with no rule in XDP) or ipset")

// NoSink is the sink of a backend without ban (or allow) sets: every
// addition is refused with Err (ErrNoBanSets when nil), and never
// reaches the store.
type NoSink struct{ Err error }

// Send refuses additions; a change that only deletes (an unban, an
// expiry) has nothing to do in the kernel and succeeds, so that bans
// stored before the backend changed can still be lifted.
func (n NoSink) Send(_ context.Context, ch Change) error {
	for _, es := range ch.Add {
		if len(es) > 0 {
			if n.Err != nil {
				return n.Err
			}
			return ErrNoBanSets
		}
	}
	return nil
}

// Close does nothing.
func (NoSink) Close() {}

// NFTSets is ipfence's nftables table's dynamic sets, the ban sets
// (nft.BanSets) and the allow sets (nft.AllowSets), and the base chains'
// lookups of them. Its two sinks (Bans, Allows), one for each
// Controller, share one netlink connection and one view of which sets
// hold anything: a base chain looks up both kinds, so when one kind's
// sets fill or empty, the chains are written again with the other's
// lookups as they are. It is safe for concurrent use.
type NFTSets struct {
	NetNS string // "" = current
	Table string
	// Heads and Priority describe the loaded policy's base chains (see
	// nft.BaseChains), which are rewritten when a set becomes empty or
	// non-empty.
	Heads    []nft.RuleHead
	Priority int32
	// Adopt: the table may lack ipfence's mark (nft.ApplyOptions.Adopt)
	// when a change creates or deletes the base chain.
	Adopt bool

	mu      sync.Mutex
	present nft.Presence
	up      *nft.Updater // the open netlink connection, nil until used
}

// Bans is the ban sets' sink.
func (s *NFTSets) Bans() *NFTSink { return &NFTSink{sets: s} }

// Allows is the allow sets' sink.
func (s *NFTSets) Allows() *NFTSink { return &NFTSink{sets: s, allow: true} }

// Assume records which sets hold anything, as loaded (nft.Dynamic's
// Present) or as the Controllers' stores say (Lists.Present).
func (s *NFTSets) Assume(p nft.Presence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.present = p
}

// NFTSink is one kind of NFTSets' sets: the bans or the allows.
type NFTSink struct {
	sets  *NFTSets
	allow bool
}

var (
	_ Sink     = (*NFTSink)(nil)
	_ Verifier = (*NFTSink)(nil)
	_ Sink     = (*IPSetSink)(nil)
	_ Sink     = NoSink{}
)

// kind is the sink's four sets, in Snapshot's order.
func (k *NFTSink) kind() []*nft.Set {
	if k.allow {
		return nft.AllowSets()
	}
	return nft.BanSets()
}

// noun names the sink's kind in messages.
func (k *NFTSink) noun() string {
	if k.allow {
		return "allow"
	}
	return "ban"
}

// Send sends ch as one nftables transaction.
func (k *NFTSink) Send(ctx context.Context, ch Change) error {
	s := k.sets
	s.mu.Lock()
	defer s.mu.Unlock()
	u := &nft.Update{Table: s.Table}
	for i, set := range k.kind() {
		u.Sets = append(u.Sets, nft.SetChange{Set: set, Add: elems(ch.Add[i], ch.Now), Del: elems(ch.Del[i], time.Time{})})
	}
	was := s.present
	if k.allow {
		s.present.Allows = ch.Present
	} else {
		s.present.Bans = ch.Present
	}
	if ch.Present != ch.Was {
		// A base chain looks up only the sets that hold anything, and
		// the one before conntrack exists only while it has rules
		// (nft.FromPlan): created with the first ban, deleted with the
		// last one, unless stateless rules keep it. Bans are looked up
		// there only; allows in every base chain.
		chains := nft.BaseChains(s.Heads, s.Priority, s.present)
		if !k.allow {
			chains = chains[:1]
		}
		u.Ensure = chains
		// The other kind's sets these chains look up.
		other := nft.AllowSets()
		if k.allow {
			other = nft.BanSets()
		}
		for _, set := range other {
			u.Sets = append(u.Sets, nft.SetChange{Set: set})
		}
	}
	if err := s.apply(ctx, u); err != nil {
		s.present = was
		return err
	}
	return nil
}

// apply sends u on the shared connection, opening it when needed and
// dropping it after an error (the next call opens a fresh one). Called
// with s.mu held.
func (s *NFTSets) apply(ctx context.Context, u *nft.Update) error {
	if s.up == nil {
		up, err := nft.NewUpdater(nft.ApplyOptions{NetNS: s.NetNS, Adopt: s.Adopt})
		if err != nil {
			return err
		}
		s.up = up
	}
	if _, err := s.up.Apply(ctx, u); err != nil {
		s.up.Close()
		s.up = nil
		return err
	}
	return nil
}

// Close closes the shared netlink connection (the other kind's sink
// opens a fresh one when it next needs it).
func (k *NFTSink) Close() {
	s := k.sets
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up != nil {
		s.up.Close()
		s.up = nil
	}
}

// Verify asks the kernel for the probed addresses key by key (dumping a
// big set costs the kernel time quadratic in its size) and reads the
// prefix sets back whole (they are few), then adds what is missing and
// deletes what is not ours, in one transaction.
func (k *NFTSink) Verify(ctx context.Context, now time.Time, probe, nets [2][]ban.Element) (int, error) {
	s := k.sets
	sets := k.kind()
	u := &nft.Update{Table: s.Table}
	repaired := 0
	for f := range 2 {
		keys := make([]netip.Addr, len(probe[f]))
		for i, e := range probe[f] {
			keys[i] = e.Prefix.Addr()
		}
		present, err := nft.Present(ctx, s.Table, s.NetNS, sets[f].Name, keys)
		if err != nil {
			return 0, err
		}
		var add []ban.Element
		for i, ok := range present {
			if !ok {
				add = append(add, probe[f][i])
			}
		}
		repaired += len(add)
		u.Sets = append(u.Sets, nft.SetChange{Set: sets[f], Add: elems(add, now)})
	}
	for f := range 2 {
		rs, err := nft.ReadSet(ctx, s.Table, s.NetNS, sets[2+f].Name)
		if err != nil {
			return 0, err
		}
		have := make(map[netip.Prefix]bool, len(rs))
		var del []ban.Element
		want := make(map[netip.Prefix]bool, len(nets[f]))
		for _, e := range nets[f] {
			want[e.Prefix] = true
		}
		for _, r := range rs {
			p, ok := r.Prefix()
			switch {
			case !ok: // not one of ours: every piece is a prefix
				for _, q := range r.Prefixes() {
					del = append(del, ban.Element{Prefix: q})
				}
			case !want[p]:
				del = append(del, ban.Element{Prefix: p})
			default:
				have[p] = true
			}
		}
		var add []ban.Element
		for _, e := range nets[f] {
			if !have[e.Prefix] && (e.Expires.IsZero() || e.Expires.Sub(now) > time.Second) {
				add = append(add, e)
			}
		}
		repaired += len(add) + len(del)
		u.Sets = append(u.Sets, nft.SetChange{Set: sets[2+f], Add: elems(add, now), Del: elems(del, time.Time{})})
	}
	if repaired == 0 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.apply(ctx, u); err != nil {
		return 0, fmt.Errorf("repairing the %s sets: %w", k.noun(), err)
	}
	return repaired, nil
}

// Nft is s as set elements with their time left at now, for a full load
// of the table (nft.FromPlan, nft.WithBans); elements with less than a
// millisecond left (the kernel's unit) are left out.
func (s Snapshot) Nft(now time.Time) nft.Entries {
	var out [4]nft.Elems
	for i, es := range s {
		out[i].Grow(len(es))
		eachElem(es, now, func(e nft.Elem) { out[i].Append(e) })
	}
	return nft.Entries{Addrs4: out[0], Addrs6: out[1], Nets4: out[2], Nets6: out[3]}
}

// elems turns ban elements into set elements with their time left at now
// (a zero now: no timeouts, for deletes, which match on the key alone).
// Elements with less than a millisecond left are dropped.
func elems(es []ban.Element, now time.Time) []nft.Elem {
	out := make([]nft.Elem, 0, len(es))
	eachElem(es, now, func(e nft.Elem) { out = append(out, e) })
	return out
}

// eachElem calls fn with each of es as elems returns them.
func eachElem(es []ban.Element, now time.Time, fn func(nft.Elem)) {
	for _, e := range es {
		if e.Expires.IsZero() || now.IsZero() {
			fn(nft.Elem{Key: e.Prefix})
			continue
		}
		if left := e.Expires.Sub(now); left >= time.Millisecond {
			fn(nft.Elem{Key: e.Prefix, Timeout: left})
		}
	}
}

// IPSetSink is the ipset backend's ban sets (ipt.Program.BanSet), or
// its allow sets (Kind ipt.KindAllow): one hash:net set per family
// holding addresses and prefix pieces alike, each element with its own
// timeout (one longer than ipset's cap of 24.8 days is held without one
// until the Controller deletes it). The iptables rules that look them up
// are always there, so presence needs no rule change.
type IPSetSink struct {
	NetNS string // "" = current
	// Prefix is the program's name prefix (the policy's table).
	Prefix string
	// Kind is the sets' (the ban sets when empty).
	Kind ipt.SetKind
}

func (s *IPSetSink) kind() ipt.SetKind {
	if s.Kind == "" {
		return ipt.KindBan
	}
	return s.Kind
}

// Send sends ch as one `ipset restore`.
func (s *IPSetSink) Send(ctx context.Context, ch Change) error {
	var del []netip.Prefix
	for i := range ch.Del {
		for _, e := range ch.Del[i] {
			del = append(del, e.Prefix)
		}
	}
	return ipt.UpdateSets(ctx, s.Prefix, s.kind(), ipt.Options{NetNS: s.NetNS}, entries(ch.Add, ch.Now), del)
}

// entries are the elements of snap as ipset ban entries with their time
// left at now; those with less than a millisecond left are left out.
func entries(snap Snapshot, now time.Time) []ipt.BanEntry {
	var out []ipt.BanEntry
	for _, es := range snap {
		for _, e := range es {
			be := ipt.BanEntry{Prefix: e.Prefix}
			if !e.Expires.IsZero() {
				if be.TTL = e.Expires.Sub(now); be.TTL < time.Millisecond {
					continue
				}
				if be.TTL > ipt.MaxBanTimeout {
					// Past ipset's cap: held without a timeout, and
					// deleted by the Controller when the ban runs out.
					be.TTL = 0
				}
			}
			out = append(out, be)
		}
	}
	return out
}

// Close does nothing: every change is a process of its own.
func (s *IPSetSink) Close() {}

// Fill makes the sets hold exactly snap (after a load created them, or
// a reboot emptied them): filled beside the live ones and swapped in,
// so that elements the store does not hold go too.
func (s *IPSetSink) Fill(ctx context.Context, snap Snapshot, now time.Time) error {
	return ipt.FillSets(ctx, s.Prefix, s.kind(), ipt.Options{NetNS: s.NetNS}, entries(snap, now))
}
