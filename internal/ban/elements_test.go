package ban

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"go4.org/netipx"
)

// The model tests draw bans within two small universes, 4096 addresses
// each, and check every address of both.
var (
	universe4 = netip.MustParsePrefix("10.0.0.0/20")
	universe6 = netip.MustParsePrefix("2001:db8::/116")
)

// expiries are the expiries bans are drawn from: few, so that equal
// expiries (which must merge) are common. The zero time is permanent;
// the first two are not live at t0.
var expiries = []time.Time{
	{}, t0.Add(-time.Hour), t0, t0.Add(time.Hour), t0.Add(2 * time.Hour), t0.Add(3 * time.Hour),
}

// randomBan returns a ban within u (or, rarely, covering it), single
// addresses included.
func randomBan(r *rand.Rand, u netip.Prefix) Ban {
	bits := u.Bits() + r.IntN(u.Addr().BitLen()-u.Bits()+1)
	if r.IntN(20) == 0 {
		bits = u.Bits() - 1 - r.IntN(4) // covering the universe
	}
	a := u.Addr().As16()
	if u.Addr().Is4() {
		a = netip.AddrFrom4(u.Addr().As4()).As16()
	}
	// Random low 12 bits.
	off := r.IntN(1 << 12)
	a[14] |= byte(off >> 8)
	a[15] |= byte(off)
	addr := netip.AddrFrom16(a)
	if u.Addr().Is4() {
		addr = addr.Unmap()
	}
	return Ban{
		Prefix:  netip.PrefixFrom(addr, bits).Masked(),
		Expires: expiries[r.IntN(len(expiries))],
		Created: t0,
	}
}

// expiryKey makes expiries comparable with ==: -1 for "not banned", 0
// for permanent, Unix nanoseconds otherwise.
func expiryKey(t time.Time, banned bool) int64 {
	switch {
	case !banned:
		return -1
	case t.IsZero():
		return 0
	}
	return t.UnixNano()
}

// universeAddrs returns every address of u (a /20 or /116).
func universeAddrs(u netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for a := u.Addr(); u.Contains(a); a = a.Next() {
		out = append(out, a)
	}
	return out
}

func TestElementsModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addrs4, addrs6 := universeAddrs(universe4), universeAddrs(universe6)
	for round := range 300 {
		s := NewSet()
		var bans []Ban
		n := 1 + r.IntN(40)
		if round%10 == 0 {
			n = 200 + r.IntN(300)
		}
		for range n {
			u := universe4
			if r.IntN(2) == 0 {
				u = universe6
			}
			b := randomBan(r, u)
			s.Put(b)
			bans = append(bans, b)
		}
		gotAddrs, nets := s.Elements(t0)

		// Reference: the latest expiry of the live bans (last Put wins
		// per prefix) covering each address.
		latest := map[netip.Prefix]Ban{}
		for _, b := range bans {
			latest[b.Prefix] = b
		}
		var wantAddrs []Element
		for _, b := range latest {
			if b.IsAddr() && b.Live(t0) {
				wantAddrs = append(wantAddrs, Element{b.Prefix, b.Expires})
			}
		}
		slices.SortFunc(wantAddrs, compareElement)
		if !reflect.DeepEqual(gotAddrs, wantAddrs) && (len(gotAddrs) > 0 || len(wantAddrs) > 0) {
			t.Fatalf("round %d: addrs = %v, want %v", round, gotAddrs, wantAddrs)
		}

		checkNets(t, nets)
		var live []Ban
		for _, b := range latest {
			if !b.IsAddr() && b.Live(t0) {
				live = append(live, b)
			}
		}
		for _, a := range append(addrs4, addrs6...) {
			var want time.Time
			wantBanned := false
			for _, b := range live {
				if b.Prefix.Contains(a) {
					if wantBanned {
						want = later(want, b.Expires)
					} else {
						want, wantBanned = b.Expires, true
					}
				}
			}
			// nets are sorted and disjoint (checkNets): the only one that
			// may hold a is the last starting at or before it.
			var got time.Time
			gotBanned := false
			i, _ := slices.BinarySearchFunc(nets, a, func(e Element, a netip.Addr) int {
				if e.Prefix.Addr().Compare(a) <= 0 {
					return -1
				}
				return 1
			})
			if i > 0 && nets[i-1].Prefix.Contains(a) {
				got, gotBanned = nets[i-1].Expires, true
			}
			if expiryKey(got, gotBanned) != expiryKey(want, wantBanned) {
				t.Fatalf("round %d: %v: elements give %v (banned %v), bans %v (banned %v)\nbans: %v\nnets: %v",
					round, a, got, gotBanned, want, wantBanned, bans, nets)
			}
		}
	}
}

// checkNets checks that nets are sorted, disjoint, and minimal: for each
// expiry, its prefixes are exactly the minimal CIDR cover of their union
// (as netipx computes it).
func checkNets(t *testing.T, nets []Element) {
	t.Helper()
	for i := 1; i < len(nets); i++ {
		a, b := nets[i-1].Prefix, nets[i].Prefix
		if !netipx.PrefixLastIP(a).Less(b.Addr()) {
			t.Fatalf("nets not sorted and disjoint: %v then %v", a, b)
		}
	}
	byExpiry := map[int64][]netip.Prefix{}
	for _, e := range nets {
		if e.Prefix != e.Prefix.Masked() {
			t.Fatalf("element %v not masked", e.Prefix)
		}
		k := expiryKey(e.Expires, true)
		byExpiry[k] = append(byExpiry[k], e.Prefix)
	}
	for k, ps := range byExpiry {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(p)
		}
		set, err := b.IPSet()
		if err != nil {
			t.Fatal(err)
		}
		if want := set.Prefixes(); !slices.Equal(ps, want) {
			t.Fatalf("expiry %d: nets %v, minimal cover %v", k, ps, want)
		}
	}
}

func TestElementsExamples(t *testing.T) {
	tests := []struct {
		name string
		bans []Ban
		want []string // prefix@ttl, ttl 0 for permanent
	}{
		{
			name: "nested longer expiry",
			bans: []Ban{ban("10.0.0.0/8", time.Hour, "", ""), ban("10.1.0.0/16", 24*time.Hour, "", "")},
			want: []string{
				"10.0.0.0/16@1h0m0s", "10.1.0.0/16@24h0m0s", "10.2.0.0/15@1h0m0s", "10.4.0.0/14@1h0m0s",
				"10.8.0.0/13@1h0m0s", "10.16.0.0/12@1h0m0s", "10.32.0.0/11@1h0m0s", "10.64.0.0/10@1h0m0s", "10.128.0.0/9@1h0m0s",
			},
		},
		{
			name: "nested shorter expiry vanishes",
			bans: []Ban{ban("10.0.0.0/8", 0, "", ""), ban("10.1.0.0/16", time.Hour, "", "")},
			want: []string{"10.0.0.0/8@0s"},
		},
		{
			name: "adjacent equal expiry merged",
			bans: []Ban{ban("10.0.0.0/25", time.Hour, "", ""), ban("10.0.0.128/25", time.Hour, "", ""), ban("10.0.1.0/24", time.Hour, "", "")},
			want: []string{"10.0.0.0/23@1h0m0s"},
		},
		{
			name: "adjacent but not alignable",
			bans: []Ban{ban("10.0.1.0/24", time.Hour, "", ""), ban("10.0.2.0/24", time.Hour, "", "")},
			want: []string{"10.0.1.0/24@1h0m0s", "10.0.2.0/24@1h0m0s"},
		},
		{
			name: "expired and addresses ignored",
			bans: []Ban{ban("10.0.0.0/8", -time.Hour, "", ""), ban("10.0.0.1", time.Hour, "", ""), ban("2001:db8::/32", time.Minute, "", "")},
			want: []string{"2001:db8::/32@1m0s"},
		},
		{
			name: "top of the address space",
			bans: []Ban{
				ban("255.255.255.248/29", time.Hour, "", ""), ban("255.255.255.254/31", 0, "", ""),
				ban("ffff::/16", 0, "", ""), ban("ffff:ffff::/32", time.Hour, "", ""),
			},
			want: []string{"255.255.255.248/30@1h0m0s", "255.255.255.252/31@1h0m0s", "255.255.255.254/31@0s", "ffff::/16@0s"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSet()
			for _, b := range tt.bans {
				s.Put(b)
			}
			_, nets := s.Elements(t0)
			got := []string{}
			for _, e := range nets {
				ttl := time.Duration(0)
				if !e.Expires.IsZero() {
					ttl = e.Expires.Sub(t0)
				}
				got = append(got, e.Prefix.String()+"@"+ttl.String())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("nets = %v\nwant   %v", got, tt.want)
			}
		})
	}
}

func TestElementsAddrsSorted(t *testing.T) {
	s := NewSet()
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 { // enough IPv4 ones for the radix sort
		var a netip.Addr
		if r.IntN(3) == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 13: byte(r.IntN(256)), 14: byte(r.IntN(256)), 15: byte(r.IntN(256))})
		} else {
			a = netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		}
		s.Put(Ban{Prefix: netip.PrefixFrom(a, a.BitLen()), Expires: expiries[r.IntN(len(expiries))]})
	}
	addrs, _ := s.Elements(t0)
	if !slices.IsSortedFunc(addrs, compareElement) {
		t.Fatal("addrs not sorted")
	}
	live := 0
	for _, b := range allBans(s) {
		if b.IsAddr() && b.Live(t0) {
			live++
			if !b.Expires.IsZero() {
				i, ok := slices.BinarySearchFunc(addrs, Element{Prefix: b.Prefix}, compareElement)
				if !ok || !addrs[i].Expires.Equal(b.Expires) {
					t.Fatalf("%v: element %v", b.Prefix, addrs[i])
				}
			}
		}
	}
	if live != len(addrs) {
		t.Fatalf("%d addrs for %d live address bans", len(addrs), live)
	}
}

func TestDiffRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	randomElements := func() []Element {
		m := map[netip.Prefix]time.Time{}
		for range r.IntN(50) {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(4)), byte(r.IntN(8))}), 32-r.IntN(2)).Masked()
			exp := expiries[r.IntN(len(expiries))]
			if r.IntN(2) == 0 {
				exp = exp.In(time.FixedZone("X", 3600)) // same instant, other zone: identical
			}
			m[p] = exp
		}
		var out []Element
		for p, e := range m {
			out = append(out, Element{p, e})
		}
		slices.SortFunc(out, compareElement)
		return out
	}
	asSet := func(es []Element) map[elemKey]bool {
		m := map[elemKey]bool{}
		for _, e := range es {
			m[keyOf(e)] = true
		}
		return m
	}
	for range 2000 {
		old, new := randomElements(), randomElements()
		add, del := Diff(old, new)
		got := asSet(old)
		for _, e := range del {
			if !got[keyOf(e)] {
				t.Fatalf("del %v not in old", e)
			}
			delete(got, keyOf(e))
		}
		for _, e := range add {
			if got[keyOf(e)] {
				t.Fatalf("add %v already there after del", e)
			}
			got[keyOf(e)] = true
		}
		if want := asSet(new); !reflect.DeepEqual(got, want) {
			t.Fatalf("old %v\nnew %v\nadd %v\ndel %v\ngives %v", old, new, add, del, got)
		}
		// Nothing identical is touched.
		oldSet, newSet := asSet(old), asSet(new)
		for _, e := range add {
			if oldSet[keyOf(e)] {
				t.Fatalf("add %v identical to an old element", e)
			}
		}
		for _, e := range del {
			if newSet[keyOf(e)] {
				t.Fatalf("del %v identical to a new element", e)
			}
		}
	}
}

func TestDiffExpiryChange(t *testing.T) {
	p := netip.MustParsePrefix("192.0.2.1/32")
	q := netip.MustParsePrefix("192.0.2.2/32")
	old := []Element{{p, t0}, {q, time.Time{}}}
	new := []Element{{p, t0.Add(time.Hour)}, {q, time.Time{}}}
	add, del := Diff(old, new)
	if !reflect.DeepEqual(add, new[:1]) || !reflect.DeepEqual(del, old[:1]) {
		t.Errorf("Diff = add %v, del %v; want the changed element in both", add, del)
	}
	// A monotonic clock reading does not make an element different.
	now := time.Now()
	add, del = Diff([]Element{{p, now}}, []Element{{p, now.Round(0)}})
	if len(add)+len(del) != 0 {
		t.Errorf("Diff of identical instants = add %v, del %v", add, del)
	}
}
