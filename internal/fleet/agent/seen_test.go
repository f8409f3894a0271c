package agent

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"
)

// TestSeenBans: the newest message per prefix survives a reopen; one
// older than seenFor is forgotten.
func TestSeenBans(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seen.db")
	now := time.Now()
	a, b := netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("2001:2::/64")
	s, err := openSeen(path, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.record(map[netip.Prefix]time.Time{a: now, b: now.Add(-seenFor - time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if !s.older(a, now.Add(-time.Second)) || !s.older(a, now) || s.older(a, now.Add(time.Nanosecond)) {
		t.Fatal("older, in memory")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openSeen(path, now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.older(a, now.Add(-time.Second)) || s.older(a, now.Add(time.Second)) {
		t.Error("a's record did not survive the reopen")
	}
	if s.older(b, now.Add(-seenFor-2*time.Hour)) || len(s.m) != 1 {
		t.Errorf("b's record, older than %v, was kept: %v", seenFor, s.m)
	}
}
