package broker_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/fleet/broker/brokertest"
)

func connect(t *testing.T, url string) *broker.Hub {
	t.Helper()
	h, err := broker.Connect(broker.Options{URL: url}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// rawKV is bucket as any client of the server sees it, without a key.
func rawKV(t *testing.T, url, bucket string) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

// TestPublishRollback moves a group's pointer through publishes, a
// canary, a rollback: seqs grow, each pointer names a stored bundle, the
// canary's other hosts stay on the revision before, and a rollback is a
// new revision with the old bundle.
func TestPublishRollback(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	priv := key(t)
	pub := priv.Public().(ed25519.PublicKey)
	now := time.Now()
	bundles := [][]byte{[]byte("one"), []byte("two"), []byte("three")}

	if _, err := h.Publish(ctx, "web", bundles[0], priv, 10, now); !errors.Is(err, broker.ErrNoRevision) {
		t.Fatalf("a canary as the first revision: %v, want ErrNoRevision", err)
	}
	p1, err := h.Publish(ctx, "web", bundles[0], priv, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := h.Publish(ctx, "web", bundles[1], priv, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	p3, err := h.Publish(ctx, "web", bundles[2], priv, 25, now)
	if err != nil {
		t.Fatal(err)
	}
	if p1.Seq != 1 || p2.Seq != 2 || p3.Seq != 3 {
		t.Fatalf("seqs %d %d %d, want 1 2 3", p1.Seq, p2.Seq, p3.Seq)
	}
	if p3.Canary != 25 || p3.Stable == nil || p3.Stable.Digest != fleet.Digest(bundles[1]) {
		t.Fatalf("canary pointer %+v: its other hosts must stay on bundle two", p3)
	}
	// A second canary keeps the same hosts' fallback.
	p4, err := h.Publish(ctx, "web", bundles[0], priv, 50, now)
	if err != nil {
		t.Fatal(err)
	}
	if p4.Stable.Digest != fleet.Digest(bundles[1]) {
		t.Fatalf("a canary over a canary falls back to %s, want bundle two", p4.Stable.Digest)
	}
	for i, b := range bundles {
		got, err := h.Bundle(ctx, fleet.Digest(b), int64(len(b)))
		if err != nil || string(got) != string(b) {
			t.Fatalf("bundle %d: %q, %v", i, got, err)
		}
	}
	// Rollback: to the last full revision with another bundle (two).
	rb, err := h.Rollback(ctx, "web", 0, priv, now)
	if err != nil {
		t.Fatal(err)
	}
	if rb.Seq != 5 || rb.Digest != fleet.Digest(bundles[1]) || rb.Canary != 0 {
		t.Fatalf("rollback %+v, want seq 5 to bundle two for everyone", rb)
	}
	rb, err = h.Rollback(ctx, "web", 1, priv, now)
	if err != nil || rb.Seq != 6 || rb.Digest != fleet.Digest(bundles[0]) {
		t.Fatalf("rollback to 1: %+v, %v", rb, err)
	}
	if _, err := h.Rollback(ctx, "web", 99, priv, now); !errors.Is(err, broker.ErrNoRevision) {
		t.Fatalf("rollback to a revision never made: %v", err)
	}
	hist, err := h.History(ctx, "web", pub)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, p := range hist {
		seqs = append(seqs, p.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("history seqs %v", seqs)
	}
	ps, err := h.Pointers(ctx, pub)
	if err != nil || len(ps) != 1 || ps["web"].Seq != 6 {
		t.Fatalf("pointers: %v, %v", ps, err)
	}
	// Another key (to the fleet's key, a forger) has no revision of the
	// group: it replaces the pointer, saying so; agents refuse it, and
	// the fleet's key goes on from its own revisions.
	m, err := h.Publish(ctx, "web", bundles[0], key(t), 0, now)
	if err != nil || !strings.Contains(m.Replaced, "signature") {
		t.Fatalf("publish with another key: %+v, %v; want a pointer, the fleet key's replaced", m, err)
	}
	if _, err := h.Pointers(ctx, pub); !errors.Is(err, fleet.ErrSignature) {
		t.Fatalf("pointers after another key's publish: %v, want ErrSignature", err)
	}
	if m, err = h.Publish(ctx, "web", bundles[1], priv, 0, now); err != nil || m.Seq != 7 || !strings.Contains(m.Replaced, "signature") {
		t.Fatalf("publish after another key's: %+v, %v; want seq 7, the other key's replaced", m, err)
	}
}

// TestPublishConcurrent publishes from several goroutines at once: every
// publish either moves the pointer to a seq of its own or fails with
// ErrConflict, never two with the same seq.
func TestPublishConcurrent(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	priv := key(t)
	ctx := context.Background()
	if _, err := h.Publish(ctx, "db", []byte("base"), priv, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[uint64]int{}
	conflicts := 0
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p, err := h.Publish(ctx, "db", []byte{byte(i)}, priv, 0, time.Now())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, broker.ErrConflict):
				conflicts++
			case err != nil:
				t.Error(err)
			default:
				seen[p.Seq]++
			}
		})
	}
	wg.Wait()
	for seq, n := range seen {
		if n > 1 {
			t.Errorf("seq %d given to %d publishes", seq, n)
		}
	}
	if len(seen)+conflicts != 8 || len(seen) == 0 {
		t.Errorf("%d published, %d conflicts, of 8", len(seen), conflicts)
	}
}

// TestBans publishes bans and unbans: a follower sees the bans in force,
// the last message per prefix, and messages of the wrong kind or key
// are refused.
func TestBans(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	priv := key(t)
	pub := priv.Public().(ed25519.PublicKey)
	ctx := context.Background()
	now := time.Now()
	a, b := netip.MustParsePrefix("198.18.0.7/32"), netip.MustParsePrefix("2001:2::/64")
	for _, ban := range []*fleet.Ban{
		{Prefix: a, Created: now, Expires: now.Add(time.Hour), Origin: "t"},
		{Prefix: b, Created: now, Reason: "for good"},
		{Prefix: a, Created: now.Add(time.Millisecond), Unban: true},
	} {
		if err := h.PublishBan(ctx, ban, priv); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.PublishBan(ctx, &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.9.0/24"), Created: now, Unban: true}, priv); !errors.Is(err, broker.ErrNoRevision) {
		t.Fatalf("unban of a prefix never banned: %v", err)
	}
	fctx, cancel := context.WithCancel(ctx)
	got := make(chan *fleet.Ban, 10)
	go func() {
		h.FollowBans(fctx, 100*time.Millisecond, func(data []byte) {
			bn, err := fleet.VerifyBan(data, pub)
			if err != nil {
				t.Error(err)
				return
			}
			got <- bn
		}, func(err error) { t.Log(err) })
	}()
	defer cancel()
	var first []*fleet.Ban
	for range 2 {
		select {
		case bn := <-got:
			first = append(first, bn)
		case <-time.After(10 * time.Second):
			t.Fatal("no ban delivered")
		}
	}
	if first[0].Prefix != b || first[1].Prefix != a || !first[1].Unban {
		t.Fatalf("catch-up: %+v %+v, want b's ban then a's unban", first[0], first[1])
	}
	if left, live := first[0].Remaining(now); !live || left != 0 {
		t.Fatalf("a ban for good: %v %v", left, live)
	}
	// A new ban arrives while following.
	c := netip.MustParsePrefix("198.18.1.0/24")
	if err := h.PublishBan(ctx, &fleet.Ban{Prefix: c, Created: now, Expires: now.Add(time.Minute)}, priv); err != nil {
		t.Fatal(err)
	}
	select {
	case bn := <-got:
		if bn.Prefix != c {
			t.Fatalf("live ban %v, want %v", bn.Prefix, c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("live ban not delivered")
	}
}

// TestPublishOverForged: a pointer written with another key (agents
// refuse it) or an older revision replayed does not block the publisher:
// the next revision follows the last one signed with the fleet's key,
// and rollback skips the forgery.
func TestPublishOverForged(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	priv := key(t)
	var first []byte
	for _, b := range []string{"one", "two"} {
		if _, err := h.Publish(ctx, "web", []byte(b), priv, 0, time.Now()); err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first, _ = h.Pointer(ctx, "web")
		}
	}
	forged, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: 1000, Digest: fleet.Digest([]byte("evil"))}, key(t))
	kv := rawKV(t, srv.URL, broker.PolicyBucket)
	if _, err := kv.Put(ctx, "group.web", forged); err != nil {
		t.Fatal(err)
	}
	p, err := h.Publish(ctx, "web", []byte("three"), priv, 0, time.Now())
	if err != nil || p.Seq != 3 || !strings.Contains(p.Replaced, "signature") {
		t.Fatalf("publish over a forged pointer: %+v, %v; want seq 3, the forgery replaced", p, err)
	}
	if _, err := kv.Put(ctx, "group.web", forged); err != nil {
		t.Fatal(err)
	}
	rb, err := h.Rollback(ctx, "web", 0, priv, time.Now())
	if err != nil || rb.Seq != 4 || rb.Digest != fleet.Digest([]byte("two")) {
		t.Fatalf("rollback over a forged pointer: %+v, %v; want seq 4 to bundle two", rb, err)
	}
	// Revision 1 replayed: not the group's latest, nor a second 1.
	if _, err := kv.Put(ctx, "group.web", first); err != nil {
		t.Fatal(err)
	}
	p, err = h.Publish(ctx, "web", []byte("four"), priv, 0, time.Now())
	if err != nil || p.Seq != 5 || !strings.Contains(p.Replaced, "replayed") {
		t.Fatalf("publish over revision 1 replayed: %+v, %v; want seq 5, the replay replaced", p, err)
	}
	hist, err := h.History(ctx, "web", priv.Public().(ed25519.PublicKey))
	if err != nil || len(hist) != 5 || hist[4].Seq != 5 {
		t.Fatalf("history after a replay: %d revisions, %v; want 1 to 5", len(hist), err)
	}
	if p, err = h.Publish(ctx, "web", []byte("five"), priv, 0, time.Now()); err != nil || p.Seq != 6 || p.Replaced != "" {
		t.Fatalf("publish over the group's latest: %+v, %v; want seq 6, nothing replaced", p, err)
	}
}

// TestForeignGroupPointer: group lab's signed pointer copied to group
// web's key (any client can) is not a revision of web: publish (its
// canary's other hosts), rollback, history and fleet status all go by
// web's own pointers.
func TestForeignGroupPointer(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	priv := key(t)
	pub := priv.Public().(ed25519.PublicKey)
	for _, b := range []string{"lab1", "lab2", "lab3", "lab4", "lab5", "web1", "web2"} {
		if _, err := h.Publish(ctx, b[:3], []byte(b), priv, 0, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	lab, err := h.Pointer(ctx, "lab")
	if err != nil {
		t.Fatal(err)
	}
	kv := rawKV(t, srv.URL, broker.PolicyBucket)
	copyLab := func() {
		t.Helper()
		if _, err := kv.Put(ctx, "group.web", lab); err != nil {
			t.Fatal(err)
		}
	}
	copyLab()
	for _, pk := range []ed25519.PublicKey{pub, nil} {
		if ps, err := h.Pointers(ctx, pk); !errors.Is(err, fleet.ErrGroup) {
			t.Errorf("pointers (key %v) with lab's at group.web: %v, %v; want ErrGroup", pk != nil, ps, err)
		}
	}
	p, err := h.Publish(ctx, "web", []byte("web3"), priv, 10, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p.Seq != 3 || p.Stable == nil || p.Stable.Digest != fleet.Digest([]byte("web2")) {
		t.Fatalf("web's canary over lab's pointer: %+v (others on %+v); want seq 3, the others on web2", p, p.Stable)
	}
	copyLab()
	if _, err := h.Rollback(ctx, "web", 5, priv, time.Now()); !errors.Is(err, broker.ErrNoRevision) {
		t.Fatalf("web's rollback to lab's revision 5: %v, want ErrNoRevision", err)
	}
	rb, err := h.Rollback(ctx, "web", 0, priv, time.Now())
	if err != nil || rb.Seq != 4 || rb.Digest != fleet.Digest([]byte("web2")) {
		t.Fatalf("web's rollback over lab's pointer: %+v, %v; want seq 4 to web2", rb, err)
	}
	hist, err := h.History(ctx, "web", pub)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, p := range hist {
		if p.Group != "web" {
			t.Errorf("web's history holds group %s's revision %d", p.Group, p.Seq)
		}
		seqs = append(seqs, p.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4}) {
		t.Errorf("web's history seqs %v, want 1 2 3 4", seqs)
	}
	if ps, err := h.Pointers(ctx, pub); err != nil || ps["web"].Seq != 4 || ps["lab"].Seq != 5 {
		t.Errorf("pointers: %v, %v", ps, err)
	}
}

// TestPublishOverFlood: with nothing signed with the fleet's key left in
// the group's history (64 forged pointers pushed it out), a publish to
// the whole group still goes through, above every revision the group's
// hosts report (running, refused, or seen); a canary, with no revision
// for the other hosts, is refused; a status claiming an absurd revision
// is refused, not wrapped around.
func TestPublishOverFlood(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	priv := key(t)
	pub := priv.Public().(ed25519.PublicKey)
	for _, b := range []string{"one", "two", "three"} {
		if _, err := h.Publish(ctx, "web", []byte(b), priv, 0, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	status := func(host, group string, seq, failed, mark uint64) {
		t.Helper()
		if err := h.PutStatus(ctx, &fleet.Status{Host: host, Group: group, Seq: seq, FailedSeq: failed, Watermark: mark}); err != nil {
			t.Fatal(err)
		}
	}
	status("web1", "web", 3, 0, 3)
	status("web2", "web", 2, 7, 7)
	status("web3", "web", 3, 0, 9)
	status("lab1", "lab", 500, 0, 500) // another group's
	kv := rawKV(t, srv.URL, broker.PolicyBucket)
	other := key(t)
	flood := func() {
		t.Helper()
		for i := range 64 {
			forged, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: 1_000_000 + uint64(i), Digest: fleet.Digest([]byte("evil"))}, other)
			if _, err := kv.Put(ctx, "group.web", forged); err != nil {
				t.Fatal(err)
			}
		}
		if hist, err := h.History(ctx, "web", pub); err != nil || len(hist) != 0 {
			t.Fatalf("history after the flood: %d revisions, %v; want none", len(hist), err)
		}
	}
	flood()
	if _, err := h.Publish(ctx, "web", []byte("four"), priv, 10, time.Now()); !errors.Is(err, broker.ErrNoRevision) {
		t.Fatalf("a canary over a flooded history: %v, want ErrNoRevision", err)
	}
	p, err := h.Publish(ctx, "web", []byte("four"), priv, 0, time.Now())
	if err != nil || p.Seq != 10 || !strings.Contains(p.Replaced, "signature") {
		t.Fatalf("publish over a flooded history: %+v, %v; want seq 10 (web3 saw 9), the forgery replaced", p, err)
	}
	if p, err = h.Publish(ctx, "web", []byte("five"), priv, 0, time.Now()); err != nil || p.Seq != 11 || p.Replaced != "" {
		t.Fatalf("the next publish: %+v, %v; want seq 11, nothing replaced", p, err)
	}

	// A status claiming a revision no publisher could have reached does
	// not count: it would use up the group's seqs.
	status("web4", "web", math.MaxUint64, 1<<40, 0)
	flood()
	if p, err := h.Publish(ctx, "web", []byte("six"), priv, 0, time.Now()); err != nil || p.Seq != 10 {
		t.Fatalf("a host reporting revision 2^64-1: %+v, %v; want seq 10, the claim ignored", p, err)
	}
	status("web4", "web", 0, 1<<32-1, 0)
	flood()
	if p, err = h.Publish(ctx, "web", []byte("seven"), priv, 0, time.Now()); err != nil || p.Seq != 1<<32 {
		t.Fatalf("a host reporting revision 2^32-1: %+v, %v; want seq 2^32", p, err)
	}
}

// TestPublishOverForgedFirst: a group whose first pointer was written
// with another key, or is another group's, has no revision of the
// fleet's key: the first publish to the whole group replaces it, above
// what the group's hosts report.
func TestPublishOverForgedFirst(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	priv := key(t)
	if _, err := h.Publish(ctx, "lab", []byte("lab"), priv, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	lab, err := h.Pointer(ctx, "lab")
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: 1000, Digest: fleet.Digest([]byte("evil"))}, key(t))
	kv := rawKV(t, srv.URL, broker.PolicyBucket)
	for group, first := range map[string][]byte{"web": forged, "db": lab} {
		if err := h.PutStatus(ctx, &fleet.Status{Host: group + "1", Group: group, Seq: 4}); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, "group."+group, first); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Publish(ctx, group, []byte(group), priv, 50, time.Now()); !errors.Is(err, broker.ErrNoRevision) {
			t.Fatalf("group %s: a canary over a forged first pointer: %v, want ErrNoRevision", group, err)
		}
		p, err := h.Publish(ctx, group, []byte(group), priv, 0, time.Now())
		if err != nil || p.Seq != 5 || p.Replaced == "" {
			t.Fatalf("group %s: publish over a forged first pointer: %+v, %v; want seq 5, the forgery replaced", group, p, err)
		}
	}
}

// TestUnreadableStatus: what an agent writes under its key is reported
// (failing, with why) when it is no status or names another host; it
// neither breaks the listing nor counts for a group's revisions.
func TestUnreadableStatus(t *testing.T) {
	srv := brokertest.Start(t, "")
	h := connect(t, srv.URL)
	ctx := context.Background()
	if err := h.PutStatus(ctx, &fleet.Status{Host: "web1", Group: "web", Seq: 3}); err != nil {
		t.Fatal(err)
	}
	kv := rawKV(t, srv.URL, broker.StatusBucket)
	if _, err := kv.Put(ctx, "host.web2", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "host.web3", []byte(`{"host":"web1","group":"web","seq":99}`)); err != nil {
		t.Fatal(err)
	}
	st, err := h.Statuses(ctx)
	if err != nil || len(st) != 3 {
		t.Fatalf("statuses: %+v, %v", st, err)
	}
	slices.SortFunc(st, func(a, b fleet.Status) int { return strings.Compare(a.Host, b.Host) })
	if st[0].Unreadable != "" || st[1].Unreadable == "" || st[2].Unreadable == "" || st[2].Seq != 0 || st[2].LastError == "" {
		t.Errorf("statuses: %+v", st)
	}
	p, err := h.Publish(ctx, "web", []byte("one"), key(t), 0, time.Now())
	if err != nil || p.Seq != 4 {
		t.Errorf("first publish: %+v, %v; want seq 4 (web1 runs 3; web3's claim of 99 is web1's)", p, err)
	}
}
