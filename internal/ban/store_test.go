package ban

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openTemp(t testing.TB) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bans.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

// sameBans compares bans by value, times by instant.
func sameBans(t *testing.T, got, want []Ban) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d bans %v, want %d %v", len(got), prefixes(got), len(want), prefixes(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Prefix != w.Prefix || !g.Expires.Equal(w.Expires) || !g.Created.Equal(w.Created) || g.Reason != w.Reason || g.Origin != w.Origin {
			t.Errorf("ban %d = %+v, want %+v", i, g, w)
		}
	}
}

// allBans lists every ban of s, live or not, in List order.
func allBans(s *Set) []Ban {
	page, _ := s.List(time.Time{}.Add(-time.Hour), Filter{}, 0, 0) // before any expiry
	return page
}

func TestStoreRoundTrip(t *testing.T) {
	st, path := openTemp(t)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("store file: %v, %v; want mode 0600", fi, err)
	}
	created := time.Date(2026, 2, 3, 4, 5, 6, 789, time.FixedZone("CET", 3600))
	bans := []Ban{
		{Prefix: netip.MustParsePrefix("203.0.113.5/32"), Created: created, Reason: "sshd", Origin: "fail2ban", Expires: created.Add(time.Hour)},
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Created: created, Origin: "cli"},
		{Prefix: netip.MustParsePrefix("2001:db8::/32"), Created: created, Expires: created.Add(-time.Hour)}, // expired: kept
		{Prefix: netip.MustParsePrefix("2001:db8::1/128"), Created: time.Now(), Reason: "ünïcode \"quoted\"\n"},
	}
	if err := st.Put(bans...); err != nil {
		t.Fatal(err)
	}
	s, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	want := []Ban{bans[1], bans[0], bans[2], bans[3]}
	sameBans(t, allBans(s), want)

	// Replace one, delete two (one missing), put an unmasked prefix.
	repl := bans[0]
	repl.Reason = "again"
	if err := st.Put(repl, Ban{Prefix: netip.MustParsePrefix("192.0.2.77/24"), Created: created}); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(bans[2].Prefix, netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("198.51.100.1/24")); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened, it still holds them.
	st2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	s, err = st2.Load()
	if err != nil {
		t.Fatal(err)
	}
	want = []Ban{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Created: created}, repl, bans[3]}
	sameBans(t, allBans(s), want)

	// Of several bans of one prefix in one call, the last wins.
	first := Ban{Prefix: netip.MustParsePrefix("198.51.100.9/32"), Created: created, Reason: "first"}
	last := first
	last.Reason = "last"
	if err := st2.Put(first, last); err != nil {
		t.Fatal(err)
	}
	s, err = st2.Load()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := s.Get(first.Prefix); b.Reason != "last" {
		t.Errorf("after Put(first, last): %q", b.Reason)
	}

	// Empty calls are fine.
	if err := st2.Put(); err != nil {
		t.Error(err)
	}
	if err := st2.Delete(); err != nil {
		t.Error(err)
	}
}

func TestStoreInvalid(t *testing.T) {
	st, _ := openTemp(t)
	good := Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32")}
	if err := st.Put(good, Ban{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Put of an invalid ban = %v, want ErrInvalid", err)
	}
	if err := st.Delete(netip.Prefix{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Delete of an invalid prefix = %v, want ErrInvalid", err)
	}
	s, err := st.Load()
	if err != nil || s.Len() != 0 {
		t.Errorf("after a failed Put: %d bans, %v; want none", s.Len(), err)
	}
}

func TestStoreCorrupt(t *testing.T) {
	st, path := openTemp(t)
	st.Close()
	// Write records by hand: bad JSON, and a key that is not its prefix.
	for _, rec := range [][2]string{
		{"192.0.2.1/32", "{not json"},
		{"192.0.2.2/32", `{"prefix":"192.0.2.3/32","created":"2026-01-01T00:00:00Z"}`},
	} {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket(bucket)
			if err := bk.ForEach(func(k, _ []byte) error { return bk.Delete(k) }); err != nil {
				return err
			}
			return bk.Put([]byte(rec[0]), []byte(rec[1]))
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		st, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Load()
		st.Close()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Load of %q = %v, want ErrInvalid", rec[1], err)
		}
	}
}

func TestStoreLocked(t *testing.T) {
	_, path := openTemp(t)
	start := time.Now()
	st, err := Open(path)
	if err == nil {
		st.Close()
		t.Fatal("second Open of a held store succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if d := time.Since(start); d < lockTimeout/2 {
		t.Errorf("gave up after %v, before the %v timeout", d, lockTimeout)
	}
}

func TestStoreOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing", "bans.db")); err == nil || errors.Is(err, ErrLocked) {
		t.Errorf("Open in a missing directory = %v", err)
	}
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := Open(junk); err == nil {
		st.Close()
		t.Error("Open of a file that is not a database succeeded")
	}
}

func TestStoreBigPut(t *testing.T) {
	if testing.Short() {
		t.Skip("100k bans")
	}
	st, path := openTemp(t)
	bans := manyAddrBans(100_000)
	start := time.Now()
	if err := st.Put(bans...); err != nil {
		t.Fatal(err)
	}
	t.Logf("Put of %d bans: %v", len(bans), time.Since(start))
	if fi, err := os.Stat(path); err == nil {
		t.Logf("store file: %d bytes", fi.Size())
	}
	s, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != len(bans) {
		t.Fatalf("loaded %d bans, want %d", s.Len(), len(bans))
	}
	b, ok := s.Get(bans[12345].Prefix)
	if !ok || !reflect.DeepEqual(b.Reason, bans[12345].Reason) || !b.Expires.Equal(bans[12345].Expires) {
		t.Errorf("ban %v = %+v, %v", bans[12345].Prefix, b, ok)
	}
	// Deleting them all is one transaction too.
	ps := make([]netip.Prefix, len(bans))
	for i, b := range bans {
		ps[i] = b.Prefix
	}
	if err := st.Delete(ps...); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Load(); err != nil || s.Len() != 0 {
		t.Fatalf("after deleting all: %d bans, %v", s.Len(), err)
	}
}

// manyAddrBans returns n distinct IPv4 address bans in a scattered order,
// with varied expiries, as a daemon would collect them.
func manyAddrBans(n int) []Ban {
	bans := make([]Ban, n)
	for i := range bans {
		x := uint32(i) * 2654435761 // Knuth's multiplicative hash: a bijection
		a := netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
		bans[i] = Ban{
			Prefix:  netip.PrefixFrom(a, 32),
			Expires: t0.Add(time.Duration(1+i%1000) * time.Minute),
			Created: t0,
			Reason:  "sshd",
			Origin:  "fail2ban",
		}
	}
	return bans
}

// TestStoreRecords: the binary record round-trips every field, and a JSON
// record (the format of earlier versions) still loads.
func TestStoreRecords(t *testing.T) {
	now := time.Unix(1_800_000_000, 123456789)
	for _, b := range []Ban{
		{Prefix: netip.MustParsePrefix("192.0.2.7/32"), Expires: now.Add(time.Hour), Created: now, Reason: "ssh brute force", Origin: "fail2ban"},
		{Prefix: netip.MustParsePrefix("2001:db8::/48"), Created: now},
		{Prefix: netip.MustParsePrefix("198.51.100.0/24")},
	} {
		got, err := decodeBan(storeKey(b.Prefix), encodeBan(b))
		if err != nil || got.Prefix != b.Prefix || !got.Expires.Equal(b.Expires) || !got.Created.Equal(b.Created) ||
			got.Expires.IsZero() != b.Expires.IsZero() || got.Reason != b.Reason || got.Origin != b.Origin {
			t.Errorf("round trip of %+v: %+v, %v", b, got, err)
		}
	}
	old := Ban{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Expires: now, Created: now, Origin: "cli"}
	js, _ := json.Marshal(old)
	got, err := decodeBan(storeKey(old.Prefix), js)
	if err != nil || got.Prefix != old.Prefix || !got.Expires.Equal(old.Expires) || got.Origin != "cli" {
		t.Errorf("JSON record: %+v, %v", got, err)
	}
	for _, bad := range [][]byte{nil, {recordV1}, {recordV1, 2}, {9, 0, 0}, append(encodeBan(old)[:5:5], 0x7f)} {
		if _, err := decodeBan(storeKey(old.Prefix), bad); err == nil {
			t.Errorf("record %x decoded", bad)
		}
	}
}

// TestStoreStrikes: a strike takes its prefix's record (a ban put
// later takes it back), survives a reopen through the journal and the
// folded file alike, and goes with a delete.
func TestStoreStrikes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bans.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	a, b, c := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/48"), netip.MustParsePrefix("198.51.100.0/24")
	if err := st.Put(Ban{Prefix: a, Created: now, Expires: now.Add(time.Hour)}, Ban{Prefix: b, Created: now}, Ban{Prefix: c, Created: now}); err != nil {
		t.Fatal(err)
	}
	strikes := []Strike{{Prefix: a, TTL: time.Hour, Until: now.Add(25 * time.Hour)}, {Prefix: c, TTL: 2 * time.Hour, Until: now.Add(30 * time.Hour)}}
	if err := st.Commit(nil, strikes, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(Ban{Prefix: c, Created: now, Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		set, err := st.Load()
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := set.Strike(a, now); !ok || s.Prefix != a || s.TTL != time.Hour || !s.Until.Equal(strikes[0].Until) {
			t.Errorf("round %d: strike of %s: %+v, %v", round, a, s, ok)
		}
		if _, ok := set.Get(a); ok {
			t.Errorf("round %d: %s has a ban and a strike", round, a)
		}
		if _, ok := set.Strike(c, now); ok || set.Strikes() != 1 {
			t.Errorf("round %d: %s's strike outlived its new ban (%d strikes)", round, c, set.Strikes())
		}
		if bn, ok := set.Get(c); !ok || bn.Reason != "again" {
			t.Errorf("round %d: the ban of %s: %+v, %v", round, c, bn, ok)
		}
		if _, ok := set.Strike(a, now.Add(26*time.Hour)); ok {
			t.Errorf("round %d: a strike past its window counts", round)
		}
		// Again once the journal is folded into the file.
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if st, err = Open(path); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Delete(a); err != nil {
		t.Fatal(err)
	}
	set, err := st.Load()
	if err != nil || set.Strikes() != 0 {
		t.Errorf("after delete: %d strikes, %v", set.Strikes(), err)
	}
	st.Close()
}

// TestRecidiveEscalate: Escalate multiplies the last ban's duration, caps
// it at Max, never shortens what is asked, and leaves permanent bans and
// an off Recidive alone.
func TestRecidiveEscalate(t *testing.T) {
	r := Recidive{Window: time.Hour, Factor: 1.5, Max: 10 * time.Hour}
	for _, tc := range []struct{ ask, last, want time.Duration }{
		{time.Hour, time.Hour, 90 * time.Minute},
		{time.Hour, 8 * time.Hour, 10 * time.Hour},
		{12 * time.Hour, 8 * time.Hour, 12 * time.Hour},
		{0, time.Hour, 0},
		{time.Hour, 0, time.Hour},
	} {
		if got := r.Escalate(tc.ask, tc.last); got != tc.want {
			t.Errorf("Escalate(%v, %v) = %v, want %v", tc.ask, tc.last, got, tc.want)
		}
	}
	if got := (Recidive{}).Escalate(time.Hour, time.Hour); got != time.Hour {
		t.Errorf("off: %v", got)
	}
	if err := (Recidive{Window: time.Hour, Factor: 2, Max: time.Hour}).Check(); err != nil {
		t.Error(err)
	}
}
