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
	store, err := ban.Open(filepath.Join(t.TempDir(), "bans.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sink := newRecordSink()
	sink.refuse = netip.MustParsePrefix("198.18.99.99/32")
	c, err := Open(Config{Sink: sink, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := NewQueue(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go q.Run(ctx, c)

	const calls = 200
	var wg sync.WaitGroup
	errs := make([]error, calls)
	got := make([]Result, calls)
	for i := range calls {
		wg.Go(func() {
			p := netip.MustParsePrefix(fmt.Sprintf("198.18.%d.%d/32", i/250, i%250))
			if i == 7 {
				p = sink.refuse
			}
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
		case i == 7:
			if !errors.Is(errs[i], errRefused) {
				t.Errorf("call %d: %v, want the kernel's refusal", i, errs[i])
			}
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
	if total != calls-1 || c.set.Len() != calls-1 {
		t.Errorf("sink holds %d, the Controller %d bans; want %d", total, c.set.Len(), calls-1)
	}
	if sink.sends >= calls {
		t.Errorf("%d transactions for %d calls: nothing was coalesced", sink.sends, calls)
	}
	t.Logf("%d calls in %d transactions", calls, sink.sends)

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
