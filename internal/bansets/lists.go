package bansets

import (
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
)

// Lists are a namespace's two Controllers: its bans, and its allow
// entries (Config.Allows), which beat every rule and ban. Allows may be
// nil (a caller that keeps no allow entries: tests, benchmarks); its
// sets are then loaded empty.
type Lists struct {
	Bans, Allows *Controller
}

// Present says which sets of both Controllers hold anything, as they
// last sent them.
func (l Lists) Present() nft.Presence {
	p := nft.Presence{Bans: l.Bans.Present()}
	if l.Allows != nil {
		p.Allows = l.Allows.Present()
	}
	return p
}

// Load runs a full load of both (see Controller.Load): load gets the
// bans and the allow entries in force at now and puts them in the
// kernel with everything else of the load; then bans and allows become
// the Controllers' sinks (nil: the ones they have). Neither Controller
// changes meanwhile. If load fails, nothing is recorded and the sinks
// stay.
func (l Lists) Load(bans, allows Sink, load func(b, a Snapshot, now time.Time) error) error {
	if l.Allows == nil {
		return l.Bans.Load(bans, func(b Snapshot, now time.Time) error { return load(b, Snapshot{}, now) })
	}
	// Always the allows' lock first, then the bans'.
	return l.Allows.Load(allows, func(a Snapshot, _ time.Time) error {
		return l.Bans.Load(bans, func(b Snapshot, now time.Time) error { return load(b, a, now) })
	})
}

// Len is the number of elements s holds.
func (s Snapshot) Len() int { return len(s[0]) + len(s[1]) + len(s[2]) + len(s[3]) }

// Dynamic is what the nftables sets hold for bans b and allow entries a
// at now (Snapshot.Nft of each).
func Dynamic(b, a Snapshot, now time.Time) nft.Dynamic {
	return nft.Dynamic{Bans: b.Nft(now), Allows: a.Nft(now)}
}

// Close closes both Controllers' sinks.
func (l Lists) Close() {
	l.Bans.Close()
	if l.Allows != nil {
		l.Allows.Close()
	}
}
