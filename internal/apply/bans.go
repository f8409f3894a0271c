package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/statedir"
)

// Bans is a namespace's ban service opened without a daemon: its stores
// of bans and allow entries, and a Controller on each whose sink is the
// backend the last apply recorded.
type Bans struct {
	bansets.Lists
	stores [2]*ban.Store
}

// Close closes the Controllers and the stores (those opened: OpenBans
// closes what it opened when it fails half way).
func (b *Bans) Close() {
	for _, c := range []*bansets.Controller{b.Bans, b.Allows} {
		if c != nil {
			c.Close()
		}
	}
	for _, s := range b.stores {
		if s != nil {
			s.Close()
		}
	}
}

// OpenStore opens t's ban store, making its folder.
func (t *Target) OpenStore() (*ban.Store, error) {
	if err := t.State.MkdirBans(); err != nil {
		return nil, err
	}
	return ban.Open(t.State.BansPath(t.NetNS))
}

// OpenAllowStore opens t's store of allow entries, making its folder.
func (t *Target) OpenAllowStore() (*ban.Store, error) {
	if err := t.State.MkdirBans(); err != nil {
		return nil, err
	}
	return ban.Open(t.State.AllowsPath(t.NetNS))
}

// OpenAllows opens a Controller of allow entries on store (see
// bansets.Config.Allows), with sink.
func OpenAllows(store *ban.Store, sink bansets.Sink, log *slog.Logger) (*bansets.Controller, error) {
	return bansets.Open(bansets.Config{Sink: sink, Store: store, Logger: log, Allows: true})
}

// OpenBans opens t's ban and allow stores and a Controller on each for
// the ruleset the last apply recorded: the bans' guard (protected
// prefixes and the namespace's own addresses) and its backend's sets.
// With no record, it is a table named table with ipfence's built-in
// protection, and when ensure is set and no such table is loaded, a
// table holding only the ban and allow sets is loaded (and recorded).
// The caller holds the state lock.
func (t *Target) OpenBans(ctx context.Context, table string, ensure bool) (*Bans, error) {
	applied, err := t.State.LoadApplied(t.NetNS)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if applied == nil {
		applied = statedir.Summarize(&plan.Plan{Table: table, Priority: -300, Protect: prefixStrings(plan.Builtin())})
	}
	var pb prefix.Builder
	for _, s := range applied.Protect {
		if p, err := netip.ParsePrefix(s); err == nil {
			pb.AddPrefix(p)
		}
	}
	protect, _ := pb.Build()
	own, err := hostaddr.List(t.NetNS)
	if err != nil {
		return nil, err
	}
	b := &Bans{}
	fail := func(err error) (*Bans, error) {
		b.Close()
		return nil, err
	}
	if b.stores[0], err = t.OpenStore(); err != nil {
		return fail(err)
	}
	if b.stores[1], err = t.OpenAllowStore(); err != nil {
		return fail(err)
	}
	var ts nft.TableStatus
	if !applied.IPTables() {
		// Only which sets there are: no chain's rules.
		if ts, err = nft.StatusChains(ctx, applied.Table, t.NetNS, func(string) bool { return false }); err != nil {
			return fail(err)
		}
	}
	bs, as, sets := t.recordedSinks(applied, ts)
	if b.Bans, err = bansets.Open(bansets.Config{Sink: bs, Guard: ban.Guard{Protected: protect, Own: own}, Store: b.stores[0], Policy: applied.Bans, Logger: t.log()}); err != nil {
		return fail(err)
	}
	if b.Allows, err = OpenAllows(b.stores[1], as, t.log()); err != nil {
		return fail(err)
	}
	if sets != nil {
		pr := b.Present()
		if _, live := as.(*bansets.NFTSink); !live {
			pr.Allows = [4]bool{} // not loaded (or no such sets)
		}
		sets.Assume(pr)
	}
	if ensure && !applied.IPTables() {
		if err := t.ensureBanSets(ctx, b, applied, ts); err != nil {
			return fail(err)
		}
	}
	return b, nil
}

// recordedSinks are the ban and allow sets of the backend a record says
// is loaded (ts: its nftables table), with the base chains' heads as
// recorded; sets is the nftables sets both sinks share (nil on other
// backends). The allows' sink is sets.Allows() only where the allow
// sets are loaded (AllowsEnforced, and a table that has them).
func (t *Target) recordedSinks(a *statedir.Applied, ts nft.TableStatus) (bans, allows bansets.Sink, sets *bansets.NFTSets) {
	refuse := bansets.NoSink{Err: bansets.ErrNoAllowSets}
	switch a.Backend {
	case plan.IPSet:
		return &bansets.IPSetSink{NetNS: t.NetNS, Prefix: a.Table}, &bansets.IPSetSink{NetNS: t.NetNS, Prefix: a.Table, Kind: ipt.KindAllow}, nil
	case plan.IPTablesSplit:
		return bansets.NoSink{}, refuse, nil
	}
	sets = &bansets.NFTSets{NetNS: t.NetNS, Table: a.Table, Heads: a.RuleHeads(), Priority: a.Priority, Adopt: a.Vouches(a.Table)}
	switch {
	case !AllowsEnforced(a.Backend, len(a.XDPRules())):
		allows = refuse
	case ts.Exists && !hasSet(ts, nft.AllowAddrs4):
		allows = bansets.NoSink{Err: fmt.Errorf("table inet %s has no allow sets (loaded by an older ipfence): run ipfence apply again", a.Table)}
	default:
		allows = sets.Allows()
	}
	return sets.Bans(), allows, sets
}

// AllowsEnforced reports whether allow entries are loaded, and beat
// every rule, on backend with xdpRules rules in XDP: nftables without
// rules in XDP (which run ahead of the table), and ipset
// (iptables-split has no sets).
func AllowsEnforced(backend plan.Backend, xdpRules int) bool {
	return backend == plan.IPSet || !backend.IPTables() && xdpRules == 0
}

// dynamic is what the nftables sets hold for bans b and allow entries a
// at now; the allow sets stay empty unless allows (AllowsEnforced).
func dynamic(b, a bansets.Snapshot, now time.Time, allows bool) nft.Dynamic {
	if !allows {
		a = bansets.Snapshot{}
	}
	return bansets.Dynamic(b, a, now)
}

// hasSet reports whether the table ts describes has a set of name.
func hasSet(ts nft.TableStatus, name string) bool {
	for _, s := range ts.Sets {
		if s.Name == name {
			return true
		}
	}
	return false
}

// ensureBanSets loads a table holding only the ban and allow sets when
// the namespace has no ipfence table yet (ts); a table without ban sets
// (loaded by an older ipfence) must be applied again.
func (t *Target) ensureBanSets(ctx context.Context, b *Bans, applied *statedir.Applied, ts nft.TableStatus) error {
	if ts.Exists {
		if hasSet(ts, nft.BanAddrs4) {
			return nil
		}
		return fmt.Errorf("table inet %s has no ban sets (loaded by an older ipfence): run ipfence apply again", applied.Table)
	}
	p := &plan.Plan{Table: applied.Table, Priority: applied.Priority}
	sets := &bansets.NFTSets{NetNS: t.NetNS, Table: p.Table, Priority: p.Priority}
	// XDP rules recorded may still run ahead of the table.
	live := AllowsEnforced(applied.Backend, len(applied.XDPRules()))
	allows := bansets.Sink(sets.Allows())
	if !live {
		allows = bansets.NoSink{Err: bansets.ErrNoAllowSets}
	}
	err := b.Load(sets.Bans(), allows, func(bs, as bansets.Snapshot, now time.Time) error {
		d := dynamic(bs, as, now, live)
		_, err := nft.Apply(ctx, nft.FromPlan(p, d), nft.ApplyOptions{NetNS: t.NetNS})
		if err == nil {
			sets.Assume(d.Present())
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating table inet %s for the bans: %w", applied.Table, err)
	}
	rec := *applied
	rec.Marked = true // the table it describes now has the mark
	return t.State.SaveApplied(t.NetNS, &rec)
}

func prefixStrings(s *prefix.Set) []string {
	var out []string
	for _, p := range prefix.Prefixes(s) {
		out = append(out, p.String())
	}
	return out
}
