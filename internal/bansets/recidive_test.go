package bansets

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/nft/nfttest"
	"github.com/ipfence/ipfence/internal/ban"
)

// TestRecidive: under bans: {recidive: {window: 6h, factor: 2, max: 10h}},
// in a lab, an address banned again within the window of its last ban's
// end gets twice that ban (1h, 2h, 4h, 8h, then 10h at most), in the
// kernel (the element's timeout) and in what Ban returns, whether that
// ban ran out, ran out while no Controller ran (a restart), was lifted,
// or ran out and was not pruned yet; a ban while one is live, a
// permanent one, a repeat after the window and one after unban --forget
// are not escalated. A prefix keeps its strike in the store, and a strike
// past its window is forgotten there too.
func TestRecidive(t *testing.T) {
	lab, store, c := newLoaded(t, ban.Guard{})
	now := time.Now().Truncate(time.Second)
	clock := func() time.Time { return now }
	c.cfg.Now = clock
	pol := ban.Policy{Recidive: ban.Recidive{Window: 6 * time.Hour, Factor: 2, Max: 10 * time.Hour}}
	c.SetPolicy(pol)
	ctx := context.Background()
	addr := netip.MustParsePrefix("198.51.100.7/32")
	banFor := func(ttl, want time.Duration) {
		t.Helper()
		bs, err := c.Ban(ctx, []Request{{Prefix: addr, TTL: ttl, Origin: "test"}})
		if err != nil || len(bs) != 1 {
			t.Fatalf("ban: %v, %v", bs, err)
		}
		if got := bs[0].Expires.Sub(now); got != want {
			t.Fatalf("ban for %v: given %v, want %v", ttl, got, want)
		}
		el := nfttest.Elements(t, lab.FW, "set", "inet", "ipfence", nft.BanAddrs4)
		if wantEl := fmt.Sprintf("198.51.100.7 timeout %ds", int(want.Seconds())); !slices.Contains(el, wantEl) {
			t.Fatalf("kernel: %v, want %s", el, wantEl)
		}
	}
	expire := func(after time.Duration) {
		t.Helper()
		now = now.Add(after)
		if _, err := c.Expire(ctx); err != nil {
			t.Fatal(err)
		}
		if el := nfttest.Elements(t, lab.FW, "set", "inet", "ipfence", nft.BanAddrs4); len(el) != 0 {
			t.Fatalf("kernel after the ban ran out: %v", el)
		}
	}
	banFor(time.Hour, time.Hour)
	banFor(time.Hour, time.Hour) // again while live: the same incident
	expire(time.Hour + time.Second)
	banFor(time.Hour, 2*time.Hour)
	expire(2*time.Hour + time.Second)
	banFor(time.Hour, 4*time.Hour)

	// A restart while the ban runs out: Open prunes it, and its strike
	// is in the store.
	c.Close()
	now = now.Add(4*time.Hour + time.Second)
	c2, err := Open(Config{Sink: (&NFTSets{NetNS: lab.FW, Table: "ipfence", Priority: -300}).Bans(), Store: store, Now: clock, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	c = c2
	banFor(time.Hour, 8*time.Hour)

	// Ran out, not pruned yet: its record counts as its strike.
	now = now.Add(8*time.Hour + time.Second)
	banFor(time.Hour, 10*time.Hour) // at most max

	// Lifted: a strike as well, unless forgotten.
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr}}); err != nil {
		t.Fatal(err)
	}
	banFor(time.Hour, 10*time.Hour)
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr, Forget: true}}); err != nil {
		t.Fatal(err)
	}
	banFor(time.Hour, time.Hour)

	// Past the window: forgotten, in memory and in the store.
	expire(time.Hour + time.Second)
	set, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Strike(addr, now); !ok {
		t.Error("the store has no strike of the ban that ran out")
	}
	expire(6*time.Hour + strikePruneEvery)
	if set, err = store.Load(); err != nil || set.Strikes() != 0 || set.Len() != 0 {
		t.Errorf("the store after the window: %d strikes, %d bans, %v", set.Strikes(), set.Len(), err)
	}
	banFor(time.Hour, time.Hour)

	// A permanent ban leaves no strike, and a permanent request stays.
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr, Forget: true}}); err != nil {
		t.Fatal(err)
	}
	if bs, err := c.Ban(ctx, []Request{{Prefix: addr, Origin: "test"}}); err != nil || !bs[0].Expires.IsZero() {
		t.Fatalf("permanent ban: %v, %v", bs, err)
	}
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr}}); err != nil {
		t.Fatal(err)
	}
	banFor(time.Hour, time.Hour)
	// The origin that asked cannot undo the escalation: its unban at the
	// end of its own ban time and its re-sends (NoShorten) leave the
	// escalated ban, whose origin is recidive, in force; two bans of the
	// prefix in one transaction are both escalated; the prepared bans
	// say what was given (the daemon's queue reports them).
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr}}); err != nil {
		t.Fatal(err)
	}
	f2b := Request{Prefix: addr, TTL: time.Hour, Origin: "fail2ban/sshd", Reason: "sshd"}
	p, err := c.Prepare([]Request{f2b, f2b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.BanPrepared(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, b := range p.Bans() {
		if b.Expires.Sub(now) != 2*time.Hour || b.Origin != RecidiveOrigin || b.Reason != "repeat (fail2ban/sshd): sshd" {
			t.Errorf("prepared ban after escalation: %+v", b)
		}
	}
	now = now.Add(time.Hour)
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr, Origin: "fail2ban/sshd"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ban(ctx, []Request{{Prefix: addr, TTL: time.Minute, Origin: "fail2ban/sshd", NoShorten: true}}); err != nil {
		t.Fatal(err)
	}
	c.View(func(s *ban.Set) {
		if b, ok := s.Get(addr); !ok || b.Origin != RecidiveOrigin || b.Expires.Sub(now) != time.Hour {
			t.Errorf("the escalated ban after fail2ban's unban and re-ban: %+v, %v", b, ok)
		}
	})
	if _, err := c.Unban(ctx, []Lift{{Prefix: addr, Forget: true}}); err != nil {
		t.Fatal(err)
	}

	// A CIDR ban escalates too.
	net := netip.MustParsePrefix("203.0.113.0/24")
	for _, want := range []time.Duration{time.Hour, 2 * time.Hour} {
		bs, err := c.Ban(ctx, []Request{{Prefix: net, TTL: time.Hour, Origin: "other"}})
		if err != nil || bs[0].Expires.Sub(now) != want {
			t.Fatalf("CIDR ban: %v, %v; want %v", bs, err, want)
		}
		if _, err := c.Unban(ctx, []Lift{{Prefix: net}}); err != nil {
			t.Fatal(err)
		}
	}

	// A restart past the window forgets the strikes, in the store too.
	c.Close()
	now = now.Add(7 * time.Hour)
	c3, err := Open(Config{Sink: (&NFTSets{NetNS: lab.FW, Table: "ipfence", Priority: -300}).Bans(), Store: store, Now: clock, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c3.Close)
	if set, err := store.Load(); err != nil || set.Strikes() != 0 {
		t.Errorf("the store after a restart past the window: %d strikes, %v", set.Strikes(), err)
	}
	c = c3

	// With aggregate_v6 on, a ban that ran out and that reconciling the
	// aggregates prunes (before Expire) leaves its strike too.
	pol.Aggregate6 = 2
	c.SetPolicy(pol)
	a6 := netip.MustParsePrefix("2001:db8:1::1/128")
	if _, err := c.Ban(ctx, []Request{{Prefix: a6, TTL: time.Hour, Origin: "test"}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour + time.Second)
	if _, err := c.Ban(ctx, []Request{{Prefix: netip.MustParsePrefix("2001:db8:2::1/128"), TTL: time.Hour, Origin: "test"},
		{Prefix: netip.MustParsePrefix("2001:db8:2::2/128"), TTL: time.Hour, Origin: "test"}}); err != nil {
		t.Fatal(err)
	}
	if bs, err := c.Ban(ctx, []Request{{Prefix: a6, TTL: time.Hour, Origin: "test"}}); err != nil || bs[0].Expires.Sub(now) != 2*time.Hour {
		t.Errorf("repeat ban after the aggregates pruned the first: %v, %v", bs, err)
	}

	// A /64 ban that ran out and whose /64 the aggregates take at once
	// leaves the aggregate in force (not its strike).
	n64 := netip.MustParsePrefix("2001:db8:5::/64")
	if _, err := c.Ban(ctx, []Request{{Prefix: n64, TTL: time.Hour, Origin: "cli"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ban(ctx, []Request{{Prefix: netip.MustParsePrefix("2001:db8:5::1/128"), TTL: 10 * time.Hour, Origin: "test"},
		{Prefix: netip.MustParsePrefix("2001:db8:5::2/128"), TTL: 10 * time.Hour, Origin: "test"}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour + time.Second)
	if _, err := c.Ban(ctx, []Request{{Prefix: netip.MustParsePrefix("2001:db8:5::3/128"), TTL: 10 * time.Hour, Origin: "test"}}); err != nil {
		t.Fatal(err)
	}
	c.View(func(s *ban.Set) {
		if b, ok := s.Get(n64); !ok || b.Origin != AggregateOrigin || !b.Live(now) {
			t.Errorf("the /64 after its ban ran out with 3 addresses banned: %+v, %v", b, ok)
		}
	})
	if el := nfttest.Elements(t, lab.FW, "set", "inet", "ipfence", nft.BanNets6); !slices.Contains(el, "2001:db8:5::/64 timeout 35999s") && !slices.Contains(el, "2001:db8:5::/64 timeout 36000s") {
		t.Errorf("kernel prefix bans: %v", el)
	}
	if set, err := store.Load(); err != nil {
		t.Fatal(err)
	} else if b, ok := set.Get(n64); !ok || b.Origin != AggregateOrigin {
		t.Errorf("the store's /64: %+v, %v", b, ok)
	}

	// Lifts that are always deliberate (a fleet unban, a CrowdSec
	// decision deleted) lift the ban escalated from theirs; others do
	// not.
	fleetAddr := netip.MustParsePrefix("192.0.2.99/32")
	for range 2 {
		if _, err := c.Ban(ctx, []Request{{Prefix: fleetAddr, TTL: time.Hour, Origin: "fleet:k1"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Unban(ctx, []Lift{{Prefix: fleetAddr, Origin: "fleet:*"}}); err != nil {
			t.Fatal(err)
		}
	}
	c.View(func(s *ban.Set) {
		if b, ok := s.Get(fleetAddr); !ok || b.Origin != RecidiveOrigin {
			t.Errorf("an escalated fleet ban after a plain fleet lift: %+v, %v", b, ok)
		}
	})
	if ls, err := c.Unban(ctx, []Lift{{Prefix: fleetAddr, Origin: "fail2ban/*", Escalated: true}}); err != nil || len(ls) != 0 {
		t.Errorf("another origin's lift: %v, %v", ls, err)
	}
	if ls, err := c.Unban(ctx, []Lift{{Prefix: fleetAddr, Origin: "fleet:*", Escalated: true}}); err != nil || len(ls) != 1 {
		t.Errorf("a fleet unban of the ban escalated from a fleet ban: %v, %v", ls, err)
	}
}
