package bansets

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
)

// lifts lifts ps whatever their origin.
func lifts(ps []netip.Prefix) []Lift {
	ls := make([]Lift, len(ps))
	for i, p := range ps {
		ls[i] = Lift{Prefix: p}
	}
	return ls
}

// TestOwnersAgainstModel bans with and without NoShorten from several
// origins, and lifts bans of one origin or of any, at random: after every
// step each prefix's ban (origin, expiry) must be what a model that
// applies the rules one request at a time says, and the kernel's ban
// sets must hold it.
func TestOwnersAgainstModel(t *testing.T) {
	lab, _, c := newLoaded(t, ban.Guard{})
	now := time.Unix(1_800_000_000, 0)
	c.cfg.Now = func() time.Time { return now }
	ctx := context.Background()
	type entry struct {
		origin  string
		expires time.Time
	}
	model := map[netip.Prefix]entry{}
	r := rand.New(rand.NewPCG(5, 6))
	prefixes := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32"),
		netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("2001:db8::1/128"),
	}
	origins := []string{"cli", "fail2ban/sshd", "crowdsec"}
	for step := range 300 {
		now = now.Add(time.Duration(r.IntN(20)) * time.Minute)
		for p, e := range model { // the model forgets what expired
			if !e.expires.IsZero() && !e.expires.After(now) {
				delete(model, p)
			}
		}
		if r.IntN(3) == 0 {
			var ls []Lift
			for range 1 + r.IntN(2) {
				ls = append(ls, Lift{Prefix: prefixes[r.IntN(len(prefixes))], Origin: []string{"", "cli", "crowdsec"}[r.IntN(3)]})
			}
			if _, err := c.Unban(ctx, ls); err != nil {
				t.Fatalf("step %d: unban %v: %v", step, ls, err)
			}
			for _, l := range ls {
				if e, ok := model[l.Prefix]; ok && (l.Origin == "" || l.Origin == e.origin) {
					delete(model, l.Prefix)
				}
			}
		} else {
			var reqs []Request
			for range 1 + r.IntN(3) {
				ttl := []time.Duration{0, 10 * time.Minute, time.Hour, 4 * time.Hour}[r.IntN(4)]
				reqs = append(reqs, Request{Prefix: prefixes[r.IntN(len(prefixes))], TTL: ttl,
					Origin: origins[r.IntN(len(origins))], NoShorten: r.IntN(2) == 0})
			}
			if _, err := c.Ban(ctx, reqs); err != nil {
				t.Fatalf("step %d: ban %v: %v", step, reqs, err)
			}
			for _, q := range reqs {
				want := entry{q.Origin, time.Time{}}
				if q.TTL != 0 {
					want.expires = now.Add(q.TTL)
				}
				old, ok := model[q.Prefix]
				keep := ok && q.NoShorten && old.origin != q.Origin &&
					(old.expires.IsZero() || (!want.expires.IsZero() && !old.expires.Before(want.expires)))
				if !keep {
					model[q.Prefix] = want
				}
			}
		}
		c.View(func(s *ban.Set) {
			for _, p := range prefixes {
				b, ok := s.Get(p)
				ok = ok && b.Live(now)
				e, want := model[p]
				if ok != want || (ok && (b.Origin != e.origin || !b.Expires.Equal(e.expires))) {
					t.Fatalf("step %d: %v is %+v (%v), the model says %+v (%v)", step, p, b, ok, e, want)
				}
			}
		})
	}
	// The kernel holds what the Controller has (expiry as the kernel's
	// timeouts: the clock here is fake, so only the members are compared).
	var want map[string][]string
	c.View(func(s *ban.Set) { want = modelSets(s, now) })
	got := kernelSets(t, lab.FW)
	for _, s := range nft.BanSets() {
		if !slices.Equal(got[s.Name], want[s.Name]) {
			t.Fatalf("set %s holds\n%q\nwant\n%q", s.Name, got[s.Name], want[s.Name])
		}
	}
}
