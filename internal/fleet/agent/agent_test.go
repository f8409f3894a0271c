package agent

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/daemon"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/fleet/broker/brokertest"
	"github.com/ipfence/ipfence/internal/plan"
)

// TestWatermark: a pointer refused itself (another key's, or another
// group's signed with the fleet's key, copied to this group's key) never
// raises the agent's replay watermark, so the group's next revision is
// still followed; a revision of the group refused (its bundle missing)
// does, so that an older one replayed is ignored. No kernel: the
// pointers name the bundle in force (nothing to reload) or none stored.
func TestWatermark(t *testing.T) {
	srv := brokertest.Start(t, "")
	h, err := broker.Connect(broker.Options{URL: srv.URL}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	_, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	a, err := New(Config{Daemon: daemon.Config{StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)},
		Name: "web1", Group: "web", PubKey: priv.Public().(ed25519.PublicKey), Jitter: -1, Backend: plan.NFTables})
	if err != nil {
		t.Fatal(err)
	}
	const running = "sha256-running"
	a.broker, a.cur, a.seq = h, &revision{Group: "web", Seq: 2, Digest: running}, 2
	ctx := context.Background()
	follow := func(p *fleet.Pointer, key ed25519.PrivateKey) fleet.Status {
		t.Helper()
		data, err := fleet.Sign(p, key)
		if err != nil {
			t.Fatal(err)
		}
		a.follow(ctx, data)
		return a.Status()
	}

	for name, st := range map[string]fleet.Status{
		"another group's pointer": follow(&fleet.Pointer{Group: "lab", Seq: 1000, Digest: "sha256-lab"}, priv),
		"another key's pointer":   follow(&fleet.Pointer{Group: "web", Seq: 2000, Digest: "sha256-evil"}, other),
	} {
		if a.seq != 2 || st.Seq != 2 || st.FailedSeq != 0 || st.Watermark != 2 || !strings.Contains(st.LastError, "refused") {
			t.Errorf("after %s: watermark %d, status %+v; want still 2, the pointer refused", name, a.seq, st)
		}
	}
	if st := follow(&fleet.Pointer{Group: "web", Seq: 3, Digest: running}, priv); st.Seq != 3 || st.LastError != "" {
		t.Fatalf("the group's revision 3 after the refused pointers: status %+v", st)
	}
	if st := follow(&fleet.Pointer{Group: "web", Seq: 5, Digest: "sha256-gone"}, priv); st.Seq != 3 || st.FailedSeq != 5 || st.Watermark != 5 {
		t.Fatalf("revision 5, its bundle missing: status %+v; want watermark 5, running 3", st)
	}
	if st := follow(&fleet.Pointer{Group: "web", Seq: 4, Digest: running}, priv); st.Seq != 3 {
		t.Fatalf("revision 4 after 5 was seen (a replay): status %+v, want it ignored", st)
	}
}
