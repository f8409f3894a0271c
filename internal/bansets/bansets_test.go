package bansets

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/nft/nfttest"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// kernelSets reads the ban sets back with nft (small sets only) as
// "prefix perm" or "prefix temp" strings (the exact time left counts
// down), sorted.
func kernelSets(t *testing.T, ns string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, s := range nft.BanSets() {
		for _, e := range nfttest.Elements(t, ns, "set", "inet", "ipfence", s.Name) {
			kind := "perm"
			if key, _, ok := strings.Cut(e, " timeout "); ok {
				e, kind = key, "temp"
			}
			if a, err := netip.ParseAddr(e); err == nil {
				e = netip.PrefixFrom(a, a.BitLen()).String()
			}
			out[s.Name] = append(out[s.Name], e+" "+kind)
		}
		slices.Sort(out[s.Name])
	}
	return out
}

// modelSets is what the ban sets must hold for the live bans in s.
func modelSets(s *ban.Set, now time.Time) map[string][]string {
	addrs, nets := s.Elements(now)
	out := map[string][]string{}
	add := func(name string, e ban.Element) {
		kind := "perm"
		if !e.Expires.IsZero() {
			kind = "temp"
		}
		out[name] = append(out[name], e.Prefix.String()+" "+kind)
	}
	for _, e := range addrs {
		add(map[bool]string{true: nft.BanAddrs4, false: nft.BanAddrs6}[e.Prefix.Addr().Is4()], e)
	}
	for _, e := range nets {
		add(map[bool]string{true: nft.BanNets4, false: nft.BanNets6}[e.Prefix.Addr().Is4()], e)
	}
	for k := range out {
		slices.Sort(out[k])
	}
	return out
}

// newLoaded returns a lab, a ban store and a Controller on them that has
// loaded a table with no policy rules, only the (empty) ban sets.
func newLoaded(t *testing.T, g ban.Guard) (*netns.Lab, *ban.Store, *Controller) {
	t.Helper()
	lab := netnstest.New(t)
	store, err := ban.Open(filepath.Join(t.TempDir(), "bans.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c, err := Open(Config{Sink: (&NFTSets{NetNS: lab.FW, Table: "ipfence", Priority: -300}).Bans(), Guard: g, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	err = c.Load(nil, func(snap Snapshot, now time.Time) error {
		_, err := nft.Apply(context.Background(), nft.FromPlan(&plan.Plan{Table: "ipfence", Priority: -300}, nft.Dynamic{Bans: snap.Nft(now)}), nft.ApplyOptions{NetNS: lab.FW})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return lab, store, c
}

// TestControllerAgainstModel bans and unbans at random (overlapping
// prefixes, mixed lifetimes, re-bans, refused requests) and checks after
// every step that the kernel's ban sets hold exactly what the model says:
// no lost and no phantom element.
func TestControllerAgainstModel(t *testing.T) {
	var pb prefix.Builder
	pb.AddPrefix(netip.MustParsePrefix("10.9.0.0/16"))
	protect, _ := pb.Build()
	lab, store, c := newLoaded(t, ban.Guard{Protected: protect})
	ctx := context.Background()

	r := rand.New(rand.NewPCG(3, 4))
	randPrefix := func() netip.Prefix {
		if r.IntN(3) == 0 {
			a := [16]byte{0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(4)), byte(r.IntN(256))}
			return netip.PrefixFrom(netip.AddrFrom16(a), []int{32, 40, 44, 48, 128}[r.IntN(5)]).Masked()
		}
		a := [4]byte{10, byte(r.IntN(12)), byte(r.IntN(256)), byte(r.IntN(256))}
		return netip.PrefixFrom(netip.AddrFrom4(a), []int{12, 14, 16, 20, 24, 32, 32, 32}[r.IntN(8)]).Masked()
	}
	var banned []netip.Prefix
	for step := range 150 {
		switch {
		case r.IntN(4) == 0 && len(banned) > 0:
			var ps []netip.Prefix
			for range 1 + r.IntN(3) {
				ps = append(ps, banned[r.IntN(len(banned))])
			}
			if _, err := c.Unban(ctx, lifts(ps)); err != nil {
				t.Fatalf("step %d: unban %v: %v", step, ps, err)
			}
		default:
			var reqs []Request
			for range 1 + r.IntN(4) {
				ttl := []time.Duration{0, time.Hour, 2 * time.Hour, 24 * time.Hour}[r.IntN(4)]
				reqs = append(reqs, Request{Prefix: randPrefix(), TTL: ttl, Origin: "test"})
			}
			_, err := c.Ban(ctx, reqs)
			refused := false
			for _, q := range reqs {
				refused = refused || protect.OverlapsPrefix(q.Prefix)
			}
			switch {
			case refused && !errors.Is(err, ban.ErrProtected):
				t.Fatalf("step %d: ban %v of a protected network: %v", step, reqs, err)
			case !refused && err != nil:
				t.Fatalf("step %d: ban %v: %v", step, reqs, err)
			case err == nil:
				for _, q := range reqs {
					banned = append(banned, q.Prefix)
				}
			}
		}
		var want map[string][]string
		c.View(func(s *ban.Set) { want = modelSets(s, time.Now()) })
		got := kernelSets(t, lab.FW)
		for _, s := range nft.BanSets() {
			if !slices.Equal(got[s.Name], want[s.Name]) {
				t.Fatalf("step %d: set %s holds\n%q\nwant\n%q", step, s.Name, got[s.Name], want[s.Name])
			}
		}
	}

	// The store has what the Controller has: a new Controller agrees.
	c2, err := Open(Config{Sink: (&NFTSets{NetNS: lab.FW, Table: "ipfence", Priority: -300}).Bans(), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var a, b map[string][]string
	c.View(func(s *ban.Set) { a = modelSets(s, time.Now()) })
	c2.View(func(s *ban.Set) { b = modelSets(s, time.Now()) })
	for _, s := range nft.BanSets() {
		if !slices.Equal(a[s.Name], b[s.Name]) {
			t.Errorf("reopened store: set %s %q, want %q", s.Name, b[s.Name], a[s.Name])
		}
	}
}

// TestVerifyRepairs: elements deleted behind the Controller's back, and
// a prefix element added behind it, are found and repaired.
func TestVerifyRepairs(t *testing.T) {
	lab, _, c := newLoaded(t, ban.Guard{})
	ctx := context.Background()
	var reqs []Request
	for i := range 50 {
		reqs = append(reqs, Request{Prefix: netip.MustParsePrefix(fmt.Sprintf("10.0.0.%d/32", i+1)), TTL: time.Hour})
	}
	reqs = append(reqs, Request{Prefix: netip.MustParsePrefix("10.1.0.0/16")}, Request{Prefix: netip.MustParsePrefix("2001:db8::/48")})
	if _, err := c.Ban(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Verify(ctx, 1000); err != nil || n != 0 {
		t.Fatalf("Verify of an untouched kernel: %d repairs, %v", n, err)
	}
	for _, args := range [][]string{
		{"delete", "element", "inet", "ipfence", nft.BanAddrs4, "{ 10.0.0.7, 10.0.0.9 }"},
		{"delete", "element", "inet", "ipfence", nft.BanNets6, "{ 2001:db8::/48 }"},
		{"add", "element", "inet", "ipfence", nft.BanNets4, "{ 10.2.0.0/16 }"},
	} {
		if out, err := netns.Exec(lab.FW, append([]string{"nft"}, args...)...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	if n, err := c.Verify(ctx, 1000); err != nil || n != 4 {
		t.Errorf("Verify: %d repairs, %v; want 4", n, err)
	}
	var want map[string][]string
	c.View(func(s *ban.Set) { want = modelSets(s, time.Now()) })
	got := kernelSets(t, lab.FW)
	for _, s := range nft.BanSets() {
		if !slices.Equal(got[s.Name], want[s.Name]) {
			t.Errorf("after Verify, set %s holds %q, want %q", s.Name, got[s.Name], want[s.Name])
		}
	}
}

// storedReasons loads store as prefix → reason.
func storedReasons(t *testing.T, store *ban.Store) map[netip.Prefix]string {
	t.Helper()
	s, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Prefix]string{}
	page, _ := s.List(time.Now(), ban.Filter{}, 0, 0)
	for _, b := range page {
		out[b.Prefix] = b.Reason
	}
	return out
}

// TestCommitFailures: the kernel and the store change together or not at
// all. A transaction the kernel refuses leaves the store as it was (the
// journal write ran alongside and is undone); a store that cannot write
// leaves the kernel as it was.
func TestCommitFailures(t *testing.T) {
	lab, store, c := newLoaded(t, ban.Guard{})
	ctx := context.Background()
	a := netip.MustParsePrefix("10.0.0.1/32")
	b := netip.MustParsePrefix("10.0.0.2/32")
	if _, err := c.Ban(ctx, []Request{{Prefix: a, TTL: time.Hour, Reason: "first"}}); err != nil {
		t.Fatal(err)
	}
	before := storedReasons(t, store)

	// The kernel refuses: ipfence's table is gone.
	if out, err := netns.Exec(lab.FW, "nft", "delete", "table", "inet", "ipfence"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// b twice: undone, the store holds neither of its bans.
	_, err := c.Ban(ctx, []Request{{Prefix: a, TTL: time.Hour, Reason: "second"}, {Prefix: b, Reason: "new"}, {Prefix: b, Reason: "again"}})
	if err == nil {
		t.Fatal("Ban into a missing table succeeded")
	}
	if got := storedReasons(t, store); !maps.Equal(got, before) {
		t.Errorf("store after a refused transaction = %v, want %v", got, before)
	}
	c.View(func(s *ban.Set) {
		if g, _ := s.Get(a); g.Reason != "first" || s.Len() != 1 {
			t.Errorf("set after a refused transaction: %d bans, %v = %+v", s.Len(), a, g)
		}
	})
	if _, err := c.Unban(ctx, lifts([]netip.Prefix{a})); err == nil {
		t.Fatal("Unban in a missing table succeeded")
	}
	if got := storedReasons(t, store); !maps.Equal(got, before) {
		t.Errorf("store after a refused unban = %v, want %v", got, before)
	}

	// The store cannot write: the kernel goes back.
	err = c.Load(nil, func(snap Snapshot, now time.Time) error {
		_, err := nft.Apply(ctx, nft.FromPlan(&plan.Plan{Table: "ipfence", Priority: -300}, nft.Dynamic{Bans: snap.Nft(now)}), nft.ApplyOptions{NetNS: lab.FW})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	kernel := kernelSets(t, lab.FW)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ban(ctx, []Request{{Prefix: b, TTL: time.Hour}}); err == nil {
		t.Fatal("Ban with a closed store succeeded")
	}
	if got := kernelSets(t, lab.FW); !maps.EqualFunc(got, kernel, slices.Equal) {
		t.Errorf("kernel after a failed store write = %v, want %v", got, kernel)
	}
}

// countingSink counts the transactions sent through it, and refuses the
// failAt-th.
type countingSink struct {
	Sink
	n, failAt int
}

func (s *countingSink) Send(ctx context.Context, ch Change) error {
	s.n++
	if s.n == s.failAt {
		return errors.New("refused (test)")
	}
	return s.Sink.Send(ctx, ch)
}

// TestAggregate6: with aggregate_v6: 3, the third address of a /64
// banned bans the /64 too (origin aggregate, as long as that third ban),
// in the kernel and the store, and the addresses keep their own bans;
// the /64 goes when its addresses fall below 3, and unbanning it lifts
// them; a /64 holding a protected address is not banned whole; a bulk
// ban of many /64s aggregates them in one more transaction.
func TestAggregate6(t *testing.T) {
	g := ban.Guard{Protected: prefixSetOf(t, "2001:db8:9::ff/128")}
	lab, store, c := newLoaded(t, g)
	sink := &countingSink{Sink: c.cfg.Sink}
	c.cfg.Sink = sink
	c.SetPolicy(ban.Policy{Aggregate6: 3})
	ctx := context.Background()
	req := func(p string, ttl time.Duration) Request {
		return Request{Prefix: netip.MustParsePrefix(p), TTL: ttl, Origin: "test"}
	}
	agg := netip.MustParsePrefix("2001:db8:1::/64")
	check := func(wantAgg bool, addrs ...string) {
		t.Helper()
		now := time.Now()
		c.View(func(s *ban.Set) {
			if want := modelSets(s, now); !equalSets(kernelSets(t, lab.FW), want) {
				t.Errorf("kernel %v, want %v", kernelSets(t, lab.FW), want)
			}
			b, ok := s.Get(agg)
			if ok != wantAgg || ok && b.Origin != AggregateOrigin {
				t.Errorf("the /64's ban: %+v, %v; want one: %v", b, ok, wantAgg)
			}
			for _, a := range addrs {
				if _, ok := s.Get(netip.MustParsePrefix(a)); !ok {
					t.Errorf("%s's own ban is gone", a)
				}
			}
		})
		set, err := store.Load()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := set.Get(agg); ok != wantAgg {
			t.Errorf("the store's /64 ban: %v, want %v", ok, wantAgg)
		}
	}
	if _, err := c.Ban(ctx, []Request{req("2001:db8:1::1/128", time.Hour), req("2001:db8:1::2/128", 2*time.Hour),
		req("2001:db8:2::1/128", time.Hour), req("192.0.2.1/32", time.Hour), req("192.0.2.2/32", time.Hour), req("192.0.2.3/32", time.Hour),
		req("2001:db8:9::1/128", time.Hour), req("2001:db8:9::2/128", time.Hour)}); err != nil {
		t.Fatal(err)
	}
	check(false)
	made, err := c.Ban(ctx, []Request{req("2001:db8:1::3/128", 30*time.Minute), req("2001:db8:9::3/128", time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 3 || made[2].Prefix != agg || !made[2].Expires.Equal(made[0].Expires) || !strings.Contains(made[2].Reason, "3 addresses") {
		t.Fatalf("bans made: %+v", made)
	}
	check(true, "2001:db8:1::1/128", "2001:db8:1::2/128", "2001:db8:1::3/128", "2001:db8:9::3/128")
	// An address lifted: 2 left, the /64 goes; banned again, it comes.
	if _, err := c.Unban(ctx, []Lift{{Prefix: netip.MustParsePrefix("2001:db8:1::2/128")}}); err != nil {
		t.Fatal(err)
	}
	check(false, "2001:db8:1::1/128", "2001:db8:1::3/128")
	if _, err := c.Ban(ctx, []Request{req("2001:db8:1::2/128", time.Hour)}); err != nil {
		t.Fatal(err)
	}
	check(true)
	// The /64 lifted: its addresses with it.
	if _, err := c.Unban(ctx, []Lift{{Prefix: agg}}); err != nil {
		t.Fatal(err)
	}
	check(false)
	c.View(func(s *ban.Set) {
		if s.Count64(agg) != 0 {
			t.Errorf("%d addresses of the lifted /64 stay banned", s.Count64(agg))
		}
	})

	// 1000 /64s of 3 addresses in one call: two transactions.
	var bulk []Request
	for i := range 1000 {
		for j := 1; j <= 3; j++ {
			bulk = append(bulk, req(fmt.Sprintf("2001:db8:100:%x::%d/128", i, j), time.Hour))
		}
	}
	before := sink.n
	made, err = c.Ban(ctx, bulk)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 4000 || sink.n-before != 2 {
		t.Errorf("a bulk ban: %d bans made, %d transactions; want 4000 and 2", len(made), sink.n-before)
	}
}

// TestAggregate6Lifecycle follows aggregate /64 bans over time (a clock
// of the test's): extended by a later ban that outlasts them; replaced by
// an integration's /64 ban (NoShorten does not give way to them), and made
// again when that one expires while the addresses stay; an operator's /64
// ban never lifted for its addresses; a refused transaction tried again
// at the next Expire; and lifted once aggregation is turned off.
func TestAggregate6Lifecycle(t *testing.T) {
	lab, _, c := newLoaded(t, ban.Guard{})
	sink := &countingSink{Sink: c.cfg.Sink}
	c.cfg.Sink = sink
	clock := time.Now()
	c.cfg.Now = func() time.Time { return clock }
	c.SetPolicy(ban.Policy{Aggregate6: 3})
	ctx := context.Background()
	ban1 := func(p, origin string, ttl time.Duration, noShorten bool) {
		t.Helper()
		if _, err := c.Ban(ctx, []Request{{Prefix: netip.MustParsePrefix(p), TTL: ttl, Origin: origin, NoShorten: noShorten}}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(p string) (ban.Ban, bool) {
		var b ban.Ban
		var ok bool
		c.View(func(s *ban.Set) {
			b, ok = s.Get(netip.MustParsePrefix(p))
			ok = ok && b.Live(clock)
		})
		return b, ok
	}
	consistent := func() {
		t.Helper()
		c.View(func(s *ban.Set) {
			if want := modelSets(s, clock); !equalSets(kernelSets(t, lab.FW), want) {
				t.Errorf("kernel %v, want %v", kernelSets(t, lab.FW), want)
			}
		})
	}
	expire := func(d time.Duration) {
		t.Helper()
		clock = clock.Add(d)
		if _, err := c.Expire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const p1 = "2001:db8:1::/64"
	ban1("2001:db8:1::1/128", "a", 2*time.Hour, false)
	ban1("2001:db8:1::2/128", "a", 2*time.Hour, false)
	ban1("2001:db8:1::3/128", "a", 10*time.Minute, false)
	if b, ok := get(p1); !ok || b.Origin != AggregateOrigin || b.Remaining(clock) != 10*time.Minute {
		t.Fatalf("the aggregate: %+v, %v", b, ok)
	}
	ban1("2001:db8:1::4/128", "b", time.Hour, false)
	if b, _ := get(p1); b.Remaining(clock) != time.Hour {
		t.Errorf("the aggregate was not extended by a longer ban: %v left", b.Remaining(clock))
	}
	// An integration's /64 ban (NoShorten) replaces the aggregate; when it
	// expires, the three addresses left bring the aggregate back, for as
	// long as the longest of them.
	ban1(p1, "fail2ban", 15*time.Minute, true)
	if b, ok := get(p1); !ok || b.Origin != "fail2ban" {
		t.Fatalf("the integration's /64 ban gave way to the aggregate: %+v, %v", b, ok)
	}
	expire(16 * time.Minute)
	if b, ok := get(p1); !ok || b.Origin != AggregateOrigin || b.Remaining(clock) != 2*time.Hour-16*time.Minute {
		t.Errorf("the aggregate after the integration's /64 ban expired: %+v, %v", b, ok)
	}
	consistent()

	// An operator's own /64 ban stays when its addresses go.
	const p2 = "2001:db8:2::/64"
	ban1(p2, "cli", 0, false)
	for _, a := range []string{"2001:db8:2::1/128", "2001:db8:2::2/128", "2001:db8:2::3/128"} {
		ban1(a, "a", time.Hour, false)
	}
	if _, err := c.Unban(ctx, []Lift{{Prefix: netip.MustParsePrefix("2001:db8:2::1/128")}}); err != nil {
		t.Fatal(err)
	}
	if b, ok := get(p2); !ok || b.Origin != "cli" {
		t.Errorf("the operator's /64 ban: %+v, %v", b, ok)
	}

	// A refused transaction: tried again at the next Expire, the
	// aggregate then lasting as long as the longest of its addresses.
	const p3 = "2001:db8:3::/64"
	ban1("2001:db8:3::1/128", "a", time.Hour, false)
	ban1("2001:db8:3::2/128", "a", 3*time.Hour, false)
	sink.failAt = sink.n + 2 // the ban's transaction goes, the aggregate's is refused
	ban1("2001:db8:3::3/128", "a", time.Hour, false)
	if _, ok := get(p3); ok {
		t.Fatal("an aggregate whose transaction was refused")
	}
	expire(time.Minute)
	if b, ok := get(p3); !ok || b.Remaining(clock) != 3*time.Hour-time.Minute {
		t.Errorf("the aggregate after the retry: %+v, %v", b, ok)
	}
	consistent()

	// An unbanned aggregate whose addresses' transaction is refused: they
	// go at the next Expire, and the aggregate does not come back.
	sink.failAt = sink.n + 2
	if _, err := c.Unban(ctx, []Lift{{Prefix: netip.MustParsePrefix(p3)}}); err != nil {
		t.Fatal(err)
	}
	expire(time.Second)
	if b, ok := get(p3); ok {
		t.Errorf("the unbanned aggregate came back: %+v", b)
	}
	if _, ok := get("2001:db8:3::2/128"); ok {
		t.Error("an address of the unbanned aggregate is still banned")
	}
	consistent()

	// An address that ran out counts no more, before any Expire; a ban
	// that changes nothing of an aggregate sends one transaction only.
	const p4 = "2001:db8:4::/64"
	ban1("2001:db8:4::1/128", "a", time.Minute, false)
	ban1("2001:db8:4::2/128", "a", 0, false)
	clock = clock.Add(2 * time.Minute)
	ban1("2001:db8:4::3/128", "a", 0, false)
	if b, ok := get(p4); ok {
		t.Errorf("an aggregate counting an address that ran out: %+v", b)
	}
	ban1("2001:db8:4::4/128", "a", 0, false)
	if b, ok := get(p4); !ok || !b.Expires.IsZero() {
		t.Fatalf("the aggregate of permanent bans: %+v, %v", b, ok)
	}
	before := sink.n
	ban1("2001:db8:4::5/128", "a", 0, false)
	if sink.n-before != 1 {
		t.Errorf("a permanent ban inside a permanent aggregate: %d transactions", sink.n-before)
	}
	// A guard that protects an address of it: the aggregate goes at its
	// next ban.
	c.SetGuard(ban.Guard{Protected: prefixSetOf(t, "2001:db8:4::ff/128")})
	ban1("2001:db8:4::6/128", "a", time.Hour, false)
	if b, ok := get(p4); ok {
		t.Errorf("an aggregate over a protected address: %+v", b)
	}
	c.SetGuard(ban.Guard{})
	consistent()

	// Turned off: the aggregates go at the next Expire, the addresses stay.
	c.SetPolicy(ban.Policy{})
	expire(time.Second)
	for _, p := range []string{p1, p3} {
		if b, ok := get(p); ok {
			t.Errorf("%s still banned with aggregation off: %+v", p, b)
		}
	}
	if _, ok := get("2001:db8:1::1/128"); !ok {
		t.Error("an address ban went with the aggregates")
	}
	if b, ok := get(p2); !ok || b.Origin != "cli" {
		t.Errorf("the operator's /64 ban with aggregation off: %+v, %v", b, ok)
	}
	consistent()

	// A Controller opened on a store with aggregates, aggregation off (a
	// restart with another policy): they go at its first Expire.
	c.SetPolicy(ban.Policy{Aggregate6: 3})
	ban1("2001:db8:5::1/128", "a", 0, false)
	ban1("2001:db8:5::2/128", "a", 0, false)
	ban1("2001:db8:5::3/128", "a", 0, false)
	if _, ok := get("2001:db8:5::/64"); !ok {
		t.Fatal("no aggregate")
	}
	c2, err := Open(Config{Sink: c.cfg.Sink, Store: c.cfg.Store, Now: c.cfg.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Expire(ctx); err != nil {
		t.Fatal(err)
	}
	c2.View(func(s *ban.Set) {
		if b, ok := s.Get(netip.MustParsePrefix("2001:db8:5::/64")); ok {
			t.Errorf("an aggregate outlived a restart with aggregation off: %+v", b)
		}
	})
}

// prefixSetOf is the set of ps.
func prefixSetOf(t *testing.T, ps ...string) *prefix.Set {
	t.Helper()
	var b prefix.Builder
	for _, p := range ps {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// equalSets compares kernelSets and modelSets results, set by set.
func equalSets(a, b map[string][]string) bool {
	for _, s := range nft.BanSets() {
		if !slices.Equal(a[s.Name], b[s.Name]) {
			return false
		}
	}
	return true
}
