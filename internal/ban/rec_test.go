package ban

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestSetStrings: reasons and origins come back as put, replaced and
// deleted bans release theirs, and a freed slot is reused.
func TestSetStrings(t *testing.T) {
	s := NewSet()
	p := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32)
	}
	for i := range 100 {
		s.Put(Ban{Prefix: p(i), Reason: fmt.Sprint("reason ", i), Origin: "o" + fmt.Sprint(i%3), Created: t0})
	}
	for i := range 100 {
		b, ok := s.Get(p(i))
		if !ok || b.Reason != fmt.Sprint("reason ", i) || b.Origin != "o"+fmt.Sprint(i%3) || !b.Created.Equal(t0) {
			t.Fatalf("ban %d = %+v, %v", i, b, ok)
		}
	}
	if got := len(s.strs.ids); got != 103 {
		t.Errorf("%d strings interned, want 103", got)
	}
	for i := range 50 {
		s.Put(Ban{Prefix: p(i), Reason: "same", Origin: "o0"}) // replaces
		s.Delete(p(50 + i))
	}
	if got := len(s.strs.ids); got != 2 {
		t.Errorf("%d strings interned after replacing and deleting, want 2 (same, o0)", got)
	}
	n := len(s.strs.strs)
	s.Put(Ban{Prefix: p(200), Reason: "new", Expires: t0.Add(time.Hour)})
	if len(s.strs.strs) != n {
		t.Errorf("a new string grew the table instead of reusing a free slot")
	}
	if b, _ := s.Get(p(200)); b.Reason != "new" || !b.Expires.Equal(t0.Add(time.Hour)) {
		t.Errorf("ban in a reused slot = %+v", b)
	}
	for i := range 50 {
		s.Delete(p(i))
	}
	s.Delete(p(200))
	if len(s.strs.ids) != 0 || s.Len() != 0 {
		t.Errorf("after deleting all: %d strings, %d bans", len(s.strs.ids), s.Len())
	}
}
