package bansets

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// recordSink is a Sink that keeps what a kernel's ban sets would hold
// (per set, key → expiry), counts transactions, and refuses the ones
// whose additions include refuse.
type recordSink struct {
	mu     sync.Mutex
	sets   [4]map[netip.Prefix]time.Time
	sends  int
	refuse netip.Prefix
	hold   func() // when set, runs before each transaction
}

func newRecordSink() *recordSink {
	s := &recordSink{}
	for i := range s.sets {
		s.sets[i] = map[netip.Prefix]time.Time{}
	}
	return s
}

var errRefused = errors.New("refused by the test kernel")

func (s *recordSink) Send(_ context.Context, ch Change) error {
	if s.hold != nil {
		s.hold()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, es := range ch.Add {
		for _, e := range es {
			if e.Prefix == s.refuse {
				return errRefused
			}
		}
	}
	s.sends++
	for i := range ch.Del {
		for _, e := range ch.Del[i] {
			delete(s.sets[i], e.Prefix)
		}
		for _, e := range ch.Add[i] {
			s.sets[i][e.Prefix] = e.Expires
		}
	}
	return nil
}

func (s *recordSink) Close() {}

// TestQueueCoalesces sends concurrent bans through a Queue to a
// Controller on a recording sink: every call gets its own bans back, the
// sink ends holding exactly the bans (each in its set), a burst takes
// fewer transactions than calls, and a call the kernel refuses fails
// alone. Unbans through the queue lift exactly what they name.
func TestQueueCoalesces(t *testing.T) {
	const calls = 200
	store, err := ban.Open(filepath.Join(t.TempDir(), "bans.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sink := newRecordSink()
	c, err := Open(Config{Sink: sink, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := NewQueue(nil)
	// The first transaction waits until the other calls have queued up
	// behind it (as they do while a transaction is in the kernel).
	var once sync.Once
	sink.hold = func() {
		once.Do(func() {
			for deadline := time.Now().Add(5 * time.Second); len(q.ch) < calls-2 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go q.Run(ctx, c)

	var wg sync.WaitGroup
	errs := make([]error, calls)
	got := make([]Result, calls)
	for i := range calls {
		wg.Go(func() {
			p := netip.MustParsePrefix(fmt.Sprintf("198.18.%d.%d/32", i/250, i%250))
			if i%10 == 0 {
				p = netip.MustParsePrefix(fmt.Sprintf("2001:2::%x/128", i))
			}
			if i%25 == 1 {
				p = netip.MustParsePrefix(fmt.Sprintf("198.19.%d.0/24", i))
			}
			prep, err := c.Prepare([]Request{{Prefix: p, TTL: time.Hour, Origin: "test"}})
			if err != nil {
				errs[i] = err
				return
			}
			got[i], errs[i] = q.Ban(ctx, prep, false)
		})
	}
	wg.Wait()
	for i := range calls {
		switch {
		case errs[i] != nil:
			t.Errorf("call %d: %v", i, errs[i])
		case got[i].N != 1 || len(got[i].Bans) != 1:
			t.Errorf("call %d: %+v, want its one ban", i, got[i])
		}
	}
	total := 0
	for i, set := range sink.sets {
		for p := range set {
			if want := setOf(p); want != i {
				t.Errorf("%s in set %d, want %d", p, i, want)
			}
			total++
		}
	}
	if total != calls || c.set.Len() != calls {
		t.Errorf("sink holds %d, the Controller %d bans; want %d", total, c.set.Len(), calls)
	}
	// The first call, then the burst behind it: far fewer than one
	// transaction per call.
	if sink.sends > calls/10 {
		t.Errorf("%d transactions for %d calls: the burst was not coalesced", sink.sends, calls)
	}
	t.Logf("%d calls in %d transactions", calls, sink.sends)

	// A call the kernel refuses fails alone: its batch is retried call
	// by call.
	sink.refuse = netip.MustParsePrefix("198.18.99.99/32")
	more := []netip.Prefix{netip.MustParsePrefix("198.18.99.1/32"), sink.refuse, netip.MustParsePrefix("198.18.99.2/32")}
	moreErrs := make([]error, len(more))
	for i, p := range more {
		wg.Go(func() {
			prep, err := c.Prepare([]Request{{Prefix: p, TTL: time.Hour}})
			if err == nil {
				_, err = q.Ban(ctx, prep, true)
			}
			moreErrs[i] = err
		})
	}
	wg.Wait()
	if moreErrs[0] != nil || !errors.Is(moreErrs[1], errRefused) || moreErrs[2] != nil {
		t.Errorf("a burst with a refused call: %v; want only the second refused", moreErrs)
	}
	if c.set.Len() != calls+2 {
		t.Errorf("the Controller holds %d bans, want %d", c.set.Len(), calls+2)
	}

	r, err := q.Unban(ctx, []Lift{{Prefix: netip.MustParsePrefix("198.18.0.2/32")}, {Prefix: netip.MustParsePrefix("198.19.1.0/24"), Origin: "other"}})
	if err != nil || r.N != 1 {
		t.Fatalf("unban: %+v, %v: want one lifted (the other is another origin's)", r, err)
	}
	if _, ok := sink.sets[0][netip.MustParsePrefix("198.18.0.2/32")]; ok {
		t.Error("the lifted ban is still in the sink")
	}
}

// setOf is the ban set a ban of p goes to (Snapshot's order).
func setOf(p netip.Prefix) int {
	i := 0
	if !p.Addr().Is4() {
		i = 1
	}
	if p.Bits() != p.Addr().BitLen() {
		i += 2
	}
	return i
}

// TestExpiredBansLeaveTheSink checks that a ban's element goes from a
// sink that keeps elements past their ban (as ipset does past its
// timeout cap; the recording sink has no timeouts at all): at Expire
// while a Controller runs, and with the first change after Open when the
// ban ran out while none ran.
func TestExpiredBansLeaveTheSink(t *testing.T) {
	store, err := ban.Open(filepath.Join(t.TempDir(), "bans.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	sink := newRecordSink()
	c, err := Open(Config{Sink: sink, Store: store, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("2001:2::1/128")
	net := netip.MustParsePrefix("198.19.0.0/24")
	ctx := context.Background()
	if _, err := c.Ban(ctx, []Request{{Prefix: a, TTL: time.Minute}, {Prefix: b, TTL: time.Hour}, {Prefix: net, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if n, err := c.Expire(ctx); err != nil || n != 2 {
		t.Fatalf("Expire = %d, %v; want 2", n, err)
	}
	if _, ok := sink.sets[0][a]; ok {
		t.Errorf("%s still in the sink after it expired", a)
	}
	if _, ok := sink.sets[2][net]; ok {
		t.Errorf("%s still in the sink after it expired", net)
	}
	if _, ok := sink.sets[1][b]; !ok {
		t.Errorf("%s, still banned, left the sink", b)
	}
	c.Close()

	// b runs out while no Controller runs; the next one deletes it with
	// its first change.
	now = now.Add(2 * time.Hour)
	c, err = Open(Config{Sink: sink, Store: store, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := sink.sets[1][b]; !ok {
		t.Fatal("Open changed the sink")
	}
	if _, err := c.Ban(ctx, []Request{{Prefix: a, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := sink.sets[1][b]; ok {
		t.Errorf("%s, run out while no Controller ran, is still in the sink", b)
	}
	if _, ok := sink.sets[0][a]; !ok {
		t.Errorf("%s, banned again, is not in the sink", a)
	}
}

// TestLiftOrigins: a Lift lifts its origin's ban, or with a trailing "*"
// every origin that starts so (a fleet unban lifts fleet bans only).
func TestLiftOrigins(t *testing.T) {
	for _, tc := range []struct {
		lift, origin string
		want         bool
	}{
		{"", "cli", true},
		{"cli", "cli", true},
		{"cli", "fail2ban/sshd", false},
		{"fleet:*", "fleet:alice@pub", true},
		{"fleet:*", "fleet:", true},
		{"fleet:*", "cli", false},
		{"fleet:*", "fleetx", false},
		{"fail2ban/*", "fail2ban/sshd", true},
	} {
		l := Lift{Origin: tc.lift}
		if got := l.Origin == "" || l.matches(tc.origin); got != tc.want {
			t.Errorf("Lift{Origin: %q} lifts %q: %v, want %v", tc.lift, tc.origin, got, tc.want)
		}
	}
}
