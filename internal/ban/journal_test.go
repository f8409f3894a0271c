package ban

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// crash releases the store as a killed process would: the journal
// stays as written, nothing is folded.
func crash(t *testing.T, st *Store) {
	t.Helper()
	st.mu.Lock()
	st.closed = true
	if st.cur != nil {
		st.cur.f.Close()
		st.cur = nil
	}
	close(st.kick)
	close(st.quit)
	st.mu.Unlock()
	<-st.stopped
	if err := st.db.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustOpen(t *testing.T, path string) *Store {
	t.Helper()
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// loadMap loads st as prefix → reason.
func loadMap(t *testing.T, st *Store) map[netip.Prefix]string {
	t.Helper()
	s, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Prefix]string{}
	for _, b := range allBans(s) {
		out[b.Prefix] = b.Reason
	}
	return out
}

func sameMap(t *testing.T, what string, got, want map[netip.Prefix]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bans, want %d", what, len(got), len(want))
	}
	for p, r := range want {
		if g, ok := got[p]; !ok || g != r {
			t.Fatalf("%s: ban %v = %q (%v), want %q", what, p, g, ok, r)
		}
	}
}

// TestJournalModel puts and deletes at random, crashes, closes and
// reopens the store at random, with segments small enough to be folded
// often, and checks every load against a map.
func TestJournalModel(t *testing.T) {
	old, idle := compactAt, foldIdle
	compactAt, foldIdle = 4<<10, 0 // fold often, concurrently with writes
	t.Cleanup(func() { compactAt, foldIdle = old, idle })
	path := filepath.Join(t.TempDir(), "bans.db")
	st := mustOpen(t, path)
	model := map[netip.Prefix]string{}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() netip.Prefix {
		if rng.IntN(4) == 0 {
			return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 1, 0xd, 0xb8, 15: byte(rng.IntN(64))}), 128)
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(64))}), 24+rng.IntN(9)).Masked()
	}
	for step := range 600 {
		switch r := rng.IntN(20); {
		case r < 11:
			var bans []Ban
			for range 1 + rng.IntN(40) {
				b := Ban{Prefix: pick(), Created: t0, Expires: t0.Add(time.Hour), Reason: "r" + string(rune('a'+rng.IntN(26)))}
				bans = append(bans, b)
			}
			if err := st.Put(bans...); err != nil {
				t.Fatal(err)
			}
			for _, b := range bans {
				model[b.Prefix] = b.Reason
			}
		case r < 17:
			var ps []netip.Prefix
			for range 1 + rng.IntN(20) {
				ps = append(ps, pick())
			}
			if err := st.Delete(ps...); err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				delete(model, p)
			}
		case r < 18:
			sameMap(t, "load", loadMap(t, st), model)
		case r < 19:
			crash(t, st)
			st = mustOpen(t, path)
			sameMap(t, "after a crash", loadMap(t, st), model)
		default:
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if segs, _ := segments(path); len(segs) != 0 {
				t.Fatalf("step %d: segments %v left after Close", step, segs)
			}
			st = mustOpen(t, path)
			sameMap(t, "after Close", loadMap(t, st), model)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestJournalTornFrame: a frame cut short by a crash (never acknowledged)
// is dropped with everything after it in its segment; what came before
// stays, and the store takes writes again.
func TestJournalTornFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bans.db")
	st := mustOpen(t, path)
	a := Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Reason: "a"}
	b := Ban{Prefix: netip.MustParsePrefix("192.0.2.2/32"), Reason: "b"}
	if err := st.Put(a); err != nil {
		t.Fatal(err)
	}
	size := st.cur.size
	if err := st.Put(b); err != nil {
		t.Fatal(err)
	}
	crash(t, st)
	seg := segmentPath(path, 1)
	for _, cut := range []struct {
		name string
		do   func(f *os.File) error
	}{
		{"cut short", func(f *os.File) error { return f.Truncate(size + frameHeader + 3) }},
		{"checksum", func(f *os.File) error { _, err := f.WriteAt([]byte{0xff}, size+frameHeader+2); return err }},
	} {
		t.Run(cut.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "bans.db")
			for _, f := range [][2]string{{path, p}, {seg, segmentPath(p, 1)}} {
				data, err := os.ReadFile(f[0])
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f[1], data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f, err := os.OpenFile(segmentPath(p, 1), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := cut.do(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			st := mustOpen(t, p)
			sameMap(t, "after the torn frame", loadMap(t, st), map[netip.Prefix]string{a.Prefix: "a"})
			if err := st.Put(b); err != nil {
				t.Fatal(err)
			}
			want := map[netip.Prefix]string{a.Prefix: "a", b.Prefix: "b"}
			sameMap(t, "after a new write", loadMap(t, st), want)
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st = mustOpen(t, p)
			defer st.Close()
			sameMap(t, "after Close", loadMap(t, st), want)
		})
	}
}

// TestJournalFoldedNotReplayed: a segment folded into the bbolt file but
// not yet removed when the process died is not replayed (it would bring
// back a ban a later segment deleted).
func TestJournalFoldedNotReplayed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bans.db")
	st := mustOpen(t, path)
	a := Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Reason: "a"}
	if err := st.Put(a); err != nil { // segment 1
		t.Fatal(err)
	}
	crash(t, st)
	saved, err := os.ReadFile(segmentPath(path, 1))
	if err != nil {
		t.Fatal(err)
	}
	st = mustOpen(t, path)
	if err := st.Delete(a.Prefix); err != nil { // segment 2
		t.Fatal(err)
	}
	if err := st.Close(); err != nil { // folds both
		t.Fatal(err)
	}
	if err := os.WriteFile(segmentPath(path, 1), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	st = mustOpen(t, path)
	defer st.Close()
	sameMap(t, "with a folded segment left over", loadMap(t, st), map[netip.Prefix]string{})
}

// TestJournalFoldsWhenIdle: closed segments are folded into the bbolt
// file in the background once writes pause, without waiting for Close.
func TestJournalFoldsWhenIdle(t *testing.T) {
	old, idle := compactAt, foldIdle
	compactAt, foldIdle = 1<<10, 50*time.Millisecond
	t.Cleanup(func() { compactAt, foldIdle = old, idle })
	path := filepath.Join(t.TempDir(), "bans.db")
	st := mustOpen(t, path)
	defer st.Close()
	var told atomic.Int64 // records the folder said it folded (OnFold)
	st.OnFold(func(n int) { told.Add(int64(n)) })
	bans := manyAddrBans(200)
	for _, b := range bans {
		if err := st.Put(b); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		segs, err := segments(path)
		if err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		open := st.cur != nil
		st.mu.Unlock()
		if len(segs) == 0 || len(segs) == 1 && open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("segments %v still there after 10 s idle", segs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := loadMap(t, st); len(m) != len(bans) {
		t.Fatalf("after folding: %d bans, want %d", len(m), len(bans))
	}
	// Every record but those of the segment still open is told of, just
	// after its fold.
	st.mu.Lock()
	open := st.cur != nil
	st.mu.Unlock()
	for {
		n := told.Load()
		if n > int64(len(bans)) {
			t.Fatalf("OnFold was told of %d records, %d bans written", n, len(bans))
		}
		if n == int64(len(bans)) || open && n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("OnFold was told of %d records, %d bans written (a segment open: %v)", n, len(bans), open)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
