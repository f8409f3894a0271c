package apply

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/statedir"
)

// Bans is a namespace's ban service opened without a daemon: its store
// and a Controller whose sink is the backend the last apply recorded.
type Bans struct {
	*bansets.Controller
	store *ban.Store
}

// Close closes the Controller and the store.
func (b *Bans) Close() {
	b.Controller.Close()
	b.store.Close()
}

// OpenStore opens t's ban store, making its folder.
func (t *Target) OpenStore() (*ban.Store, error) {
	if err := t.State.MkdirBans(); err != nil {
		return nil, err
	}
	return ban.Open(t.State.BansPath(t.NetNS))
}

// OpenBans opens t's ban store and a Controller on it for the ruleset
// the last apply recorded: its guard (protected prefixes and the
// namespace's own addresses) and its backend's ban sets. With no record,
// it is a table named table with ipfence's built-in protection, and when
// ensure is set and no such table is loaded, a table holding only the
// ban sets is loaded (and recorded). The caller holds the state lock.
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
	store, err := t.OpenStore()
	if err != nil {
		return nil, err
	}
	c, err := bansets.Open(bansets.Config{Sink: t.recordedSink(applied), Guard: ban.Guard{Protected: protect, Own: own}, Store: store, Policy: applied.Bans, Logger: t.log()})
	if err != nil {
		store.Close()
		return nil, err
	}
	b := &Bans{Controller: c, store: store}
	if ensure && !applied.IPTables() {
		if err := t.ensureBanSets(ctx, b, applied); err != nil {
			b.Close()
			return nil, err
		}
	}
	return b, nil
}

// recordedSink is the ban sets of the backend a record says is loaded,
// with the base chain's heads as recorded.
func (t *Target) recordedSink(a *statedir.Applied) bansets.Sink {
	switch a.Backend {
	case plan.IPSet:
		return &bansets.IPSetSink{NetNS: t.NetNS, Prefix: a.Table}
	case plan.IPTablesSplit:
		return bansets.NoSink{}
	}
	return &bansets.NFTSink{NetNS: t.NetNS, Table: a.Table, Heads: a.RuleHeads(), Priority: a.Priority, Adopt: a.Vouches(a.Table)}
}

// ensureBanSets loads a table holding only the ban sets when the
// namespace has no ipfence table yet; a table without ban sets (loaded
// by an older ipfence) must be applied again.
func (t *Target) ensureBanSets(ctx context.Context, b *Bans, applied *statedir.Applied) error {
	ts, err := nft.Status(ctx, applied.Table, t.NetNS)
	if err != nil {
		return err
	}
	if ts.Exists {
		for _, s := range ts.Sets {
			if s.Name == nft.BanAddrs4 {
				return nil
			}
		}
		return fmt.Errorf("table inet %s has no ban sets (loaded by an older ipfence): run ipfence apply again", applied.Table)
	}
	p := &plan.Plan{Table: applied.Table, Priority: applied.Priority}
	err = b.Load(nil, func(snap bansets.Snapshot, now time.Time) error {
		_, err := nft.Apply(ctx, nft.FromPlan(p, snap.Nft(now)), nft.ApplyOptions{NetNS: t.NetNS})
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
