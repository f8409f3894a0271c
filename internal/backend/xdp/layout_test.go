package xdp

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/pktgen"
)

// model is the reference: the class of the first rule whose set holds a.
func model(rules []Rule, a netip.Addr) Class {
	for i, r := range rules {
		if r.Drop != nil && r.Drop.Contains(a) {
			return Class(i + 1)
		}
	}
	return 0
}

// randomRules returns n rules of random prefixes of both families, some
// overlapping, with lengths spread so that every level and both leaf kinds
// are exercised.
func randomRules(r *rand.Rand, n, prefixes int) []Rule {
	bs := make([]netipx.IPSetBuilder, n)
	for i := range bs {
		for range prefixes {
			a := pktgen.RandomV4(r, 1)[0]
			if r.IntN(4) == 0 {
				a = pktgen.RandomV6(r, 1)[0]
			}
			bits := []int{8, 12, 16, 20, 23, 24, 25, 27, 30, 31, 32}[r.IntN(11)]
			if a.Is6() {
				bits = []int{16, 29, 32, 48, 56, 64, 127, 128}[r.IntN(8)]
			}
			bs[i].AddPrefix(netip.PrefixFrom(a, bits).Masked())
			// A neighbour in the same /24, in any rule, for leaves of
			// two and three classes.
			if a.Is4() && r.IntN(2) == 0 {
				v := a.As4()
				v[3] ^= byte(r.IntN(256))
				bs[r.IntN(n)].AddPrefix(netip.PrefixFrom(netip.AddrFrom4(v), 30).Masked())
			}
		}
	}
	rules := make([]Rule, n)
	for i := range rules {
		s, _ := bs[i].IPSet()
		rules[i] = Rule{Name: string(rune('a' + i)), Drop: s}
	}
	return rules
}

// probes returns random addresses and the boundaries of every rule's
// ranges, of the family is4.
func probes(r *rand.Rand, rules []Rule, n int, is4 bool) []netip.Addr {
	var out []netip.Addr
	for _, rl := range rules {
		for _, a := range pktgen.Boundaries(rl.Drop) {
			if a.Is4() == is4 {
				out = append(out, a)
			}
		}
		for _, a := range pktgen.RandomFromSet(r, rl.Drop, n/len(rules)/2) {
			if a.Is4() == is4 {
				out = append(out, a)
			}
		}
	}
	if is4 {
		return append(out, pktgen.RandomV4(r, n/2)...)
	}
	return append(out, pktgen.RandomV6(r, n/2)...)
}

func TestV4Model(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name            string
		rules, prefixes int
	}{
		{"empty", 0, 0},
		{"one rule", 1, 500},
		{"three rules", 3, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := randomRules(r, tc.rules, tc.prefixes)
			v4, err := BuildV4(rules)
			if err != nil {
				t.Fatal(err)
			}
			if tc.rules == 3 {
				kinds := map[bool]int{} // bit leaves by whether Else drops
				for _, l := range v4.Bits {
					kinds[l.Else != 0]++
				}
				if kinds[false] == 0 || kinds[true] == 0 || len(v4.Bytes) == 0 {
					t.Errorf("bit leaves of one rule %d, of two %d, byte leaves %d: want every kind exercised",
						kinds[false], kinds[true], len(v4.Bytes))
				}
			}
			as := append(probes(r, rules, 100000, true), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"))
			bad := 0
			for _, a := range as {
				if got, want := v4.Lookup(a), model(rules, a); got != want && bad < 10 {
					bad++
					t.Errorf("Lookup(%s) = %d, want %d", a, got, want)
				}
			}
		})
	}
}

func TestPartition(t *testing.T) {
	s := func(ps ...string) *netipx.IPSet {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		set, _ := b.IPSet()
		return set
	}
	rules := []Rule{
		{Name: "a", Drop: s("10.0.0.0/8", "2001:db8::/32")},
		{Name: "b", Drop: s("10.1.0.0/16", "11.0.0.0/8", "255.255.255.255/32")},
	}
	got, err := partition(rules, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []span{
		{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("9.255.255.255"), 0},
		{netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.255.255.255"), 1},
		{netip.MustParseAddr("11.0.0.0"), netip.MustParseAddr("11.255.255.255"), 2},
		{netip.MustParseAddr("12.0.0.0"), netip.MustParseAddr("255.255.255.254"), 0},
		{netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("255.255.255.255"), 2},
	}
	if len(got) != len(want) {
		t.Fatalf("partition = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("span %d = %v, want %v", i, got[i], want[i])
		}
	}
	if _, err := partition(make([]Rule, MaxRules+1), true); err == nil {
		t.Error("partition of too many rules: no error")
	}
}

// TestStatelessOrder refuses a stateless rule after a connection-aware
// one, and counts the leading stateless rules.
func TestStatelessOrder(t *testing.T) {
	set := setOf(t, "192.0.2.0/24")
	l, err := BuildLayout([]Rule{{Name: "edge", Drop: set, Stateless: true}, {Name: "geo", Drop: set}})
	if err != nil || l.Stateless != 1 {
		t.Fatalf("stateless then connection-aware: %v, %d stateless; want 1", err, l.Stateless)
	}
	_, err = BuildLayout([]Rule{{Name: "geo", Drop: set}, {Name: "edge", Drop: set, Stateless: true}})
	if !errors.Is(err, ErrStatelessOrder) || !strings.Contains(err.Error(), `"edge"`) {
		t.Errorf("connection-aware then stateless: %v, want ErrStatelessOrder naming edge", err)
	}
}

func TestV6Model(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name            string
		rules, prefixes int
	}{
		{"empty", 0, 0},
		{"one rule", 1, 2000},
		{"three rules", 3, 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := randomRules(r, tc.rules, tc.prefixes)
			l, err := BuildLayout(rules)
			if err != nil {
				t.Fatal(err)
			}
			v6 := l.V6
			if tc.rules == 3 {
				wide, deep := false, false
				for _, lv := range v6.Levels {
					wide = wide || lv.Wide()
					deep = deep || len(lv.Next) > 0
				}
				if !wide || !deep {
					t.Errorf("levels %v: want wide levels and levels that lead to others", v6.Levels)
				}
			}
			as := append(probes(r, rules, 100000, false), netip.IPv6Unspecified(), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
			bad := 0
			for _, a := range as {
				if got, want := v6.Lookup(a), model(rules, a); got != want && bad < 10 {
					bad++
					t.Errorf("Lookup(%s) = %d, want %d", a, got, want)
				}
			}
		})
	}
}

// TestV6Edges covers what random rules rarely give: prefixes shorter than
// L1's 16 bits, a catch-all rule behind others, and prefixes expanded into
// a level longer than 64 bits across the two halves of the key.
func TestV6Edges(t *testing.T) {
	set := func(ps ...string) *netipx.IPSet {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(netip.MustParsePrefix(p))
		}
		s, _ := b.IPSet()
		return s
	}
	rules := []Rule{
		{Name: "a", Drop: set("2001:db8::/63", "2001:db8:0:2::/65", "2001:db8:0:3::1/128", "3000::/4", "2001:db8:1::/48")},
		{Name: "b", Drop: set("2001:db8:1:0:8000::/65", "2001:db9::/32")},
		{Name: "all", Drop: set("::/0")},
	}
	l, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	as := probes(r, rules, 20000, false)
	for _, p := range []string{"2001:db8::/63", "2001:db8:0:2::/65", "2001:db8:0:3::1/128", "2001:db8:1:0:8000::/65"} {
		pp := netip.MustParsePrefix(p)
		as = append(as, pp.Addr(), netipx.PrefixLastIP(pp), pp.Addr().Prev(), netipx.PrefixLastIP(pp).Next())
	}
	for _, a := range as {
		if got, want := l.V6.Lookup(a), model(rules, a); got != want {
			t.Errorf("Lookup(%s) = %d, want %d", a, got, want)
		}
	}
}
