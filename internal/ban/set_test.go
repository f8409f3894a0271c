package ban

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ban returns a ban of prefix or address s expiring after ttl (0:
// permanent; negative: already expired at t0).
func ban(s string, ttl time.Duration, origin, reason string) Ban {
	p, err := ParsePrefix(s)
	if err != nil {
		panic(err)
	}
	b := Ban{Prefix: p, Created: t0.Add(-time.Hour), Origin: origin, Reason: reason}
	if ttl != 0 {
		b.Expires = t0.Add(ttl)
	}
	return b
}

func prefixes(bans []Ban) []string {
	out := []string{}
	for _, b := range bans {
		out = append(out, b.Prefix.String())
	}
	return out
}

func TestSetPutGetDelete(t *testing.T) {
	s := NewSet()
	b1 := ban("192.0.2.1", time.Hour, "cli", "first")
	if _, existed := s.Put(b1); existed {
		t.Fatal("Put into an empty set replaced something")
	}
	b2 := ban("192.0.2.1", 2*time.Hour, "api", "second")
	old, existed := s.Put(b2)
	if !existed || old.Reason != "first" {
		t.Fatalf("Put replacing = %+v, %v; want the first ban", old, existed)
	}
	// Unmasked prefixes are masked.
	s.Put(Ban{Prefix: netip.MustParsePrefix("198.51.100.77/24"), Reason: "net"})
	if b, ok := s.Get(netip.MustParsePrefix("198.51.100.0/24")); !ok || b.Reason != "net" || b.Prefix.String() != "198.51.100.0/24" {
		t.Errorf("Get(198.51.100.0/24) = %+v, %v", b, ok)
	}
	if b, ok := s.Get(netip.MustParsePrefix("198.51.100.9/24")); !ok || b.Reason != "net" {
		t.Errorf("Get(198.51.100.9/24) = %+v, %v", b, ok)
	}
	if s.Len() != 2 {
		t.Errorf("Len = %d, want 2", s.Len())
	}
	if b, ok := s.Get(b1.Prefix); !ok || b.Reason != "second" {
		t.Errorf("Get = %+v, %v; want the second ban", b, ok)
	}
	if _, ok := s.Get(netip.MustParsePrefix("192.0.2.2/32")); ok {
		t.Error("Get of a missing prefix found something")
	}
	if _, ok := s.Get(netip.Prefix{}); ok {
		t.Error("Get of the zero prefix found something")
	}
	if b, ok := s.Delete(b1.Prefix); !ok || b.Reason != "second" {
		t.Errorf("Delete = %+v, %v", b, ok)
	}
	if _, ok := s.Delete(b1.Prefix); ok {
		t.Error("second Delete found something")
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d, want 1", s.Len())
	}
}

func TestSetPutInvalidPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Put of an invalid prefix did not panic")
		}
	}()
	NewSet().Put(Ban{})
}

// listSet is a set with bans of every kind for the List, Counts and Prune
// tests.
func listSet() *Set {
	s := NewSet()
	for _, b := range []Ban{
		ban("2001:db8::1", 0, "cli", "ssh brute force"),
		ban("10.0.0.0/8", time.Hour, "api", "scanner"),
		ban("10.1.0.0/16", 0, "cli", "scanner"),
		ban("10.1.2.3", time.Minute, "fail2ban", "sshd"),
		ban("9.9.9.9", -time.Minute, "fail2ban", "sshd"), // expired
		ban("10.0.0.0/24", 0, "cli", ""),
		ban("192.0.2.1", 0, "fail2ban", "sshd"),
		ban("2001:db8::/32", 0, "api", "spam"),
		ban("2001:db8::/48", time.Second, "api", "spam"),
		ban("2001:db9::/32", -1, "api", "expired"), // expired
	} {
		s.Put(b)
	}
	return s
}

func TestSetList(t *testing.T) {
	s := listSet()
	all := []string{
		"10.0.0.0/8", "10.0.0.0/24", "10.1.0.0/16", "10.1.2.3/32", "192.0.2.1/32",
		"2001:db8::/32", "2001:db8::/48", "2001:db8::1/128",
	}
	tests := []struct {
		name          string
		f             Filter
		offset, limit int
		want          []string
		total         int
	}{
		{name: "all", want: all, total: 8},
		{name: "limit", limit: 3, want: all[:3], total: 8},
		{name: "offset", offset: 3, want: all[3:], total: 8},
		{name: "page", offset: 2, limit: 2, want: all[2:4], total: 8},
		{name: "last page short", offset: 6, limit: 5, want: all[6:], total: 8},
		{name: "past the end", offset: 8, limit: 5, want: []string{}, total: 8},
		{name: "negative offset", offset: -5, limit: 1, want: all[:1], total: 8},
		{name: "within v4", f: Filter{Within: netip.MustParsePrefix("10.0.0.0/8")}, want: all[:4], total: 4},
		{name: "within unmasked", f: Filter{Within: netip.MustParsePrefix("10.1.9.9/16")}, want: []string{"10.1.0.0/16", "10.1.2.3/32"}, total: 2},
		{name: "within v6", f: Filter{Within: netip.MustParsePrefix("2001:db8::/33")}, want: []string{"2001:db8::/48", "2001:db8::1/128"}, total: 2},
		{name: "within address", f: Filter{Within: netip.MustParsePrefix("10.1.2.3/32")}, want: []string{"10.1.2.3/32"}, total: 1},
		{name: "origin", f: Filter{Origin: "fail2ban"}, want: []string{"10.1.2.3/32", "192.0.2.1/32"}, total: 2},
		{name: "reason substring", f: Filter{Reason: "ssh"}, want: []string{"10.1.2.3/32", "192.0.2.1/32", "2001:db8::1/128"}, total: 3},
		{name: "origin and reason", f: Filter{Origin: "api", Reason: "spam"}, offset: 1, want: []string{"2001:db8::/48"}, total: 2},
		{name: "nothing", f: Filter{Origin: "nobody"}, want: []string{}, total: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, total := s.List(t0, tt.f, tt.offset, tt.limit)
			if got := prefixes(page); !reflect.DeepEqual(got, tt.want) || total != tt.total {
				t.Errorf("List = %v, %d; want %v, %d", got, total, tt.want, tt.total)
			}
		})
	}
	// Later, the 1-minute, 1-second and 1-hour bans are gone too.
	page, total := s.List(t0.Add(time.Hour), Filter{}, 0, 0)
	want := []string{"10.0.0.0/24", "10.1.0.0/16", "192.0.2.1/32", "2001:db8::/32", "2001:db8::1/128"}
	if got := prefixes(page); !reflect.DeepEqual(got, want) || total != 5 {
		t.Errorf("List an hour later = %v, %d; want %v, 5", got, total, want)
	}
}

func TestSetCounts(t *testing.T) {
	s := listSet()
	got := s.Counts(t0)
	want := Counts{Addr4: 2, Addr6: 1, Net4: 3, Net6: 2, ByOrigin: map[string]int{"cli": 3, "api": 3, "fail2ban": 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Counts = %+v, want %+v", got, want)
	}
	if got.Total() != 8 {
		t.Errorf("Total = %d, want 8", got.Total())
	}
	got = NewSet().Counts(t0)
	if got.Total() != 0 || got.ByOrigin == nil {
		t.Errorf("Counts of an empty set = %+v", got)
	}
}

func TestSetPrune(t *testing.T) {
	s := listSet()
	gone := s.Prune(t0)
	if got, want := prefixes(gone), []string{"9.9.9.9/32", "2001:db9::/32"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Prune(t0) = %v, want %v", got, want)
	}
	if s.Len() != 8 {
		t.Errorf("Len after Prune = %d, want 8", s.Len())
	}
	if gone := s.Prune(t0); len(gone) != 0 {
		t.Errorf("second Prune(t0) = %v", prefixes(gone))
	}
	gone = s.Prune(t0.Add(time.Minute)) // the 1-second and exactly-1-minute bans
	if got, want := prefixes(gone), []string{"10.1.2.3/32", "2001:db8::/48"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Prune(t0+1m) = %v, want %v", got, want)
	}
	s.Prune(t0.Add(1000 * time.Hour))
	page, _ := s.List(t0, Filter{}, 0, 0)
	if got, want := prefixes(page), []string{"10.0.0.0/24", "10.1.0.0/16", "192.0.2.1/32", "2001:db8::/32", "2001:db8::1/128"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after pruning all temporary bans: %v, want %v", got, want)
	}
}

// TestSetListOrder checks the order on many bans against a sort of their
// text form by (family, address bytes, length).
func TestSetListOrder(t *testing.T) {
	s := NewSet()
	want := map[string]bool{}
	for i := range 300 {
		var p netip.Prefix
		if i%3 == 0 {
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i), 15: byte(i * 7)}), 112+i%17).Masked()
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i % 5), byte(i), byte(i * 3)}), 20+i%13).Masked()
		}
		s.Put(Ban{Prefix: p})
		want[p.String()] = true
	}
	page, total := s.List(t0, Filter{}, 0, 0)
	if total != len(want) || len(page) != total {
		t.Fatalf("List gave %d of %d, want %d", len(page), total, len(want))
	}
	for i := 1; i < len(page); i++ {
		a, b := page[i-1].Prefix, page[i].Prefix
		ok := a.Addr().Less(b.Addr()) || a.Addr() == b.Addr() && a.Bits() < b.Bits()
		if !ok || a.Addr().Is6() && b.Addr().Is4() {
			t.Fatalf("List out of order: %v before %v", a, b)
		}
	}
	got := map[string]bool{}
	for _, b := range page {
		got[b.Prefix.String()] = true
	}
	if !maps.Equal(got, want) {
		t.Error("List lost or added bans")
	}
}

// TestTallyMatchesCounts: the running tally equals a recount after any
// mix of puts, replacements, deletes and prunes.
func TestTallyMatchesCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	s := NewSet()
	now := time.Unix(1_000_000, 0)
	for i := range 5000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(8)), byte(r.IntN(256))}), []int{24, 28, 32, 32}[r.IntN(4)]).Masked()
		if r.IntN(3) == 0 {
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(r.IntN(64))}), []int{120, 128}[r.IntN(2)]).Masked()
		}
		switch r.IntN(10) {
		case 0, 1, 2:
			s.Delete(p)
		case 3:
			s.Prune(now.Add(time.Duration(i) * time.Second))
		default:
			// Origins and reasons share interned strings, which are freed
			// and their ids reused as bans come and go.
			origin, reason := fmt.Sprint("o", r.IntN(20)), fmt.Sprint("o", r.IntN(20))
			if r.IntN(4) == 0 {
				origin = ""
			}
			s.Put(Ban{Prefix: p, Origin: origin, Reason: reason, Expires: now.Add(time.Duration(r.IntN(20000)) * time.Second)})
		}
		if i%500 == 0 || i == 4999 {
			if got, want := s.Tally(), s.Counts(time.Time{}); !reflect.DeepEqual(got, want) {
				t.Fatalf("after %d changes: Tally %+v, Counts %+v", i+1, got, want)
			}
		}
	}
}

func TestCovering(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := NewSet()
	for _, b := range []Ban{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		{Prefix: netip.MustParsePrefix("10.1.0.0/16"), Reason: "inner"},
		{Prefix: netip.MustParsePrefix("10.1.2.3/32"), Reason: "addr"},
		{Prefix: netip.MustParsePrefix("10.2.0.0/16"), Reason: "expired", Expires: now.Add(-time.Second)},
		{Prefix: netip.MustParsePrefix("2001:db8::/32"), Reason: "v6"},
	} {
		s.Put(b)
	}
	for _, tc := range []struct{ addr, want string }{
		{"10.1.2.3", "10.1.2.3/32"}, {"10.1.2.4", "10.1.0.0/16"}, {"10.2.0.1", "10.0.0.0/8"},
		{"10.3.0.1", "10.0.0.0/8"}, {"11.0.0.1", ""}, {"2001:db8::1", "2001:db8::/32"}, {"::ffff:10.1.2.3", "10.1.2.3/32"},
	} {
		b, ok := s.Covering(netip.MustParseAddr(tc.addr), now)
		got := ""
		if ok {
			got = b.Prefix.String()
		}
		if got != tc.want {
			t.Errorf("Covering(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// TestListInSteps: Match, Sort and Page give List's result, and a ban
// deleted between Match and Page is left out of the page.
func TestListInSteps(t *testing.T) {
	s := NewSet()
	for i := range 100 {
		s.Put(Ban{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 32)})
	}
	s.Put(Ban{Prefix: netip.MustParsePrefix("2001:db8::/32")})
	now := time.Now()
	want, total := s.List(now, Filter{}, 10, 20)
	k := s.Match(now, Filter{})
	k.Sort()
	if got := s.Page(k, 10, 20); !reflect.DeepEqual(got, want) || k.Len() != total || total != 101 {
		t.Errorf("steps gave %d bans of %d, List %d of %d", len(got), k.Len(), len(want), total)
	}
	s.Delete(netip.MustParsePrefix("10.0.0.15/32"))
	got := s.Page(k, 10, 20)
	if len(got) != 19 {
		t.Errorf("page after a delete has %d bans, want 19", len(got))
	}
	for _, b := range got {
		if b.Prefix == netip.MustParsePrefix("10.0.0.15/32") {
			t.Error("deleted ban listed")
		}
	}
}

// TestPruneModel: Prune, which looks only at the bans indexed for the
// seconds gone by, forgets exactly the bans a walk of all of them finds
// expired, through re-bans to earlier, later and no expiry, lifts, bans
// expired on arrival, and prunes within one second and after long gaps.
func TestPruneModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	s := NewSet()
	ref := map[netip.Prefix]Ban{}
	now := time.Unix(1_700_000_000, 0).UTC()
	for i := range 20000 {
		var p netip.Prefix
		switch r.IntN(3) {
		case 0:
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(4)), byte(r.IntN(256))}), 32)
		case 1:
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(r.IntN(200))}), 128)
		default:
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, byte(r.IntN(64)), 0}), 24)
		}
		switch k := r.IntN(20); {
		case k < 11:
			b := Ban{Prefix: p, Created: now, Origin: "o"}
			switch r.IntN(6) {
			case 0: // for good
			case 1: // expired on arrival
				b.Expires = now.Add(-time.Duration(r.IntN(5000)) * time.Millisecond)
			default:
				b.Expires = now.Add(time.Duration(r.IntN(20000)) * time.Millisecond)
			}
			s.Put(b)
			ref[p] = b
		case k < 14:
			s.Delete(p)
			delete(ref, p)
		case k == 14:
			s.reindex() // as Put does when stale entries pile up
		default:
			switch r.IntN(10) {
			case 0:
				now = now.Add(time.Duration(r.IntN(3600)) * time.Second) // a long gap
			default:
				now = now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
			}
			var exp []Ban
			for q, b := range ref {
				if !b.Expires.IsZero() && !b.Expires.After(now) {
					exp = append(exp, b)
					delete(ref, q)
				}
			}
			sort.Slice(exp, func(i, j int) bool { return comparePrefix(exp[i].Prefix, exp[j].Prefix) < 0 })
			if got, want := prefixes(s.Prune(now)), prefixes(exp); !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d: Prune(%v) = %v, want %v", i, now, got, want)
			}
			if s.Len() != len(ref) {
				t.Fatalf("step %d: %d bans left, want %d", i, s.Len(), len(ref))
			}
		}
	}
}

// TestExpiryIndexBounded: banning the same addresses again and again with
// ever later expiries leaves stale index entries; the index is rebuilt
// before they outnumber the bans, and pruning stays exact.
func TestExpiryIndexBounded(t *testing.T) {
	s := NewSet()
	now := time.Unix(1_700_000_000, 0)
	a := netip.MustParsePrefix("198.51.100.7/32")
	b := netip.MustParsePrefix("2001:db8::7/128")
	for i := range 100000 {
		s.Put(Ban{Prefix: a, Expires: now.Add(time.Hour + time.Duration(i)*time.Second)})
		s.Put(Ban{Prefix: b, Expires: now.Add(time.Duration(i+1) * time.Second)})
		if s.exp.n > 2*s.Len()+reindexSlack {
			t.Fatalf("after %d re-bans: %d index entries for %d bans", i+1, s.exp.n, s.Len())
		}
	}
	if gone := s.Prune(now.Add(100000 * time.Second)); len(gone) != 1 || gone[0].Prefix != b {
		t.Errorf("Prune = %v, want only %v", prefixes(gone), b)
	}
	if gone := s.Prune(now.Add(time.Hour + 100000*time.Second)); len(gone) != 1 || gone[0].Prefix != a {
		t.Errorf("Prune = %v, want only %v", prefixes(gone), a)
	}
	if s.Len() != 0 {
		t.Errorf("%d bans left", s.Len())
	}
}

// TestPruneClockBack: after the clock steps back (or before 1970), bans
// due at the earlier times are still found.
func TestPruneClockBack(t *testing.T) {
	s := NewSet()
	late := time.Date(2037, 1, 1, 0, 0, 0, 0, time.UTC)
	s.Put(Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Expires: late.Add(-time.Second)})
	if gone := s.Prune(late); len(gone) != 1 {
		t.Fatalf("Prune(2037) = %v", prefixes(gone))
	}
	for _, now := range []time.Time{time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), time.Unix(-100, 0)} {
		p := netip.MustParsePrefix("192.0.2.2/32")
		s.Put(Ban{Prefix: p, Expires: now.Add(time.Minute)})
		if gone := s.Prune(now); len(gone) != 0 {
			t.Errorf("Prune(%v) = %v, want nothing yet", now, prefixes(gone))
		}
		if gone := s.Prune(now.Add(time.Hour)); len(gone) != 1 || gone[0].Prefix != p {
			t.Errorf("Prune(%v + 1h) = %v, want %v", now, prefixes(gone), p)
		}
	}
}

// TestCount64Model puts, replaces, deletes and prunes IPv6 address bans
// in a few /64s at random, the /64 count turned on, off and on again part
// way, and checks Count64 against a count of every record after each
// step.
func TestCount64Model(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 4))
	s := NewSet()
	t0 := time.Unix(1_700_000_000, 0)
	nets := []string{"2001:db8:1::", "2001:db8:2::", "2001:db8:2:0:1::"}
	for step := range 3000 {
		now := t0.Add(time.Duration(step) * time.Second)
		switch step {
		case 500, 2000:
			s.Track64(true)
		case 1500:
			s.Track64(false)
		}
		a := netip.MustParseAddr(nets[r.IntN(len(nets))]).As16()
		a[15] = byte(r.IntN(16))
		p := netip.PrefixFrom(netip.AddrFrom16(a), 128)
		switch r.IntN(4) {
		case 0:
			s.Delete(p)
		case 1:
			s.Prune(now)
		default:
			b := Ban{Prefix: p, Created: now}
			if r.IntN(2) == 0 {
				b.Expires = now.Add(time.Duration(1+r.IntN(30)) * time.Second)
			}
			s.Put(b)
			s.Put(Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Created: now}) // IPv4: in no /64
		}
		if step < 500 || step >= 1500 && step < 2000 {
			continue
		}
		for _, n := range nets {
			n64 := netip.PrefixFrom(netip.MustParseAddr(n), 64)
			want := 0
			s.EachAddr(func(b Ban) bool {
				if n64.Contains(b.Prefix.Addr()) {
					want++
				}
				return true
			})
			if got := s.Count64(n64); got != want {
				t.Fatalf("step %d, %s: Count64 %d, want %d", step, n64, got, want)
			}
		}
	}
}
