package pktgen

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"go4.org/netipx"
)

func set(t *testing.T, prefixes ...string) *netipx.IPSet {
	t.Helper()
	var b netipx.IPSetBuilder
	for _, p := range prefixes {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, err := b.IPSet()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTestable(t *testing.T) {
	for s, want := range map[string]bool{
		"1.2.3.4": true, "127.0.0.1": true, "240.0.0.1": true, "255.255.255.254": true,
		"0.0.0.0": false, "0.1.2.3": false, "224.0.0.1": false, "239.255.255.255": false, "255.255.255.255": false,
		"2001:db8::1": true, "::": true, "fe80::1": true, "fe80::1%eth0": true,
		"::1": false, "ff02::1": false, "::ffff:1.2.3.4": false,
	} {
		if got := Testable(netip.MustParseAddr(s)); got != want {
			t.Errorf("Testable(%s) = %v, want %v", s, got, want)
		}
	}
	if Testable(netip.Addr{}) {
		t.Error("Testable(zero Addr) = true")
	}
}

func TestRandomReproducible(t *testing.T) {
	draw := func() []netip.Addr {
		r := rand.New(rand.NewPCG(7, 7))
		return append(RandomV4(r, 100), RandomV6(r, 100)...)
	}
	a, b := draw(), draw()
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different draws")
	}
	slices.SortFunc(a, netip.Addr.Compare)
	if len(slices.Compact(a)) < 195 {
		t.Errorf("draws repeat suspiciously")
	}
}

func TestRandomV4V6(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	global := netip.MustParsePrefix("2000::/3")
	var top [8]int // first three bits of the IPv4 draws
	for _, a := range RandomV4(r, 20000) {
		if !a.Is4() || !Testable(a) {
			t.Fatalf("RandomV4 gave %s", a)
		}
		top[a.As4()[0]>>5]++
	}
	for i, c := range top[:7] { // 224/3 is mostly untestable
		if c < 2000 || c > 3300 {
			t.Errorf("RandomV4: %d draws in %d.0.0.0/3, want about 2600", c, i<<5)
		}
	}
	for _, a := range RandomV6(r, 20000) {
		if !global.Contains(a) {
			t.Fatalf("RandomV6 gave %s, not in %s", a, global)
		}
	}
}

func TestRandomFromSet(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := set(t, "10.0.0.0/8", "11.0.0.0/24", "224.0.0.0/4", "2001:db8::/32", "2001:db9::1/128")
	var in8, in24, v6, host128 int
	for _, a := range RandomFromSet(r, s, 30000) {
		switch {
		case !s.Contains(a) || !Testable(a):
			t.Fatalf("RandomFromSet gave %s, outside the testable set", a)
		case a.Is6() && a == netip.MustParseAddr("2001:db9::1"):
			host128++
			v6++
		case a.Is6():
			v6++
		case netip.MustParsePrefix("10.0.0.0/8").Contains(a):
			in8++
		default:
			in24++
		}
	}
	// Testable prefixes: 10/8, 11.0.0/24 (v4); db8::/32, db9::1 (v6): the
	// families split about evenly, IPv4 by size, IPv6 by prefix.
	if v6 < 13500 || v6 > 16500 {
		t.Errorf("%d IPv6 draws of 30000, want about 15000", v6)
	}
	if in24 > 100 {
		t.Errorf("%d draws from the /24, want ~0 (weighted by size)", in24)
	}
	if host128 < 6500 || host128 > 8500 {
		t.Errorf("%d draws of the /128, want about 7500 (IPv6 prefixes equally likely)", host128)
	}
	if RandomFromSet(r, set(t, "224.0.0.0/4"), 10) != nil {
		t.Error("RandomFromSet of an untestable set is not nil")
	}
}

func TestBoundaries(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want []string
	}{{
		set: []string{"1.0.0.0/8", "5.5.5.5/32", "2001:db8::/32"},
		want: []string{
			// 0.255.255.255 is in untestable 0/8.
			"1.0.0.0", "1.0.0.1", "1.255.255.254", "1.255.255.255", "2.0.0.0",
			"5.5.5.4", "5.5.5.5", "5.5.5.6",
			"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::", "2001:db8::1",
			"2001:db8:ffff:ffff:ffff:ffff:ffff:fffe", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::",
		},
	}, {
		// Untestable boundaries are left out: 0/8 and 1/8 merge into one
		// range starting at 0.0.0.0; 224/4 is untestable but its
		// neighbours are not.
		set:  []string{"0.0.0.0/8", "1.0.0.0/8", "224.0.0.0/4", "255.255.255.255/32"},
		want: []string{"1.255.255.254", "1.255.255.255", "2.0.0.0", "223.255.255.255", "240.0.0.0", "255.255.255.254"},
	}} {
		var want []netip.Addr
		for _, a := range c.want {
			want = append(want, netip.MustParseAddr(a))
		}
		if got := Boundaries(set(t, c.set...)); !slices.Equal(got, want) {
			t.Errorf("Boundaries(%v)\n got %v\nwant %v", c.set, got, want)
		}
	}
}

// TestZipf checks Zipf against its law: every draw is from the
// population, and each of the first ranks is drawn about as often as
// 1/(k+1)^s over the normalising sum predicts.
func TestZipf(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pop := RandomV4(r, 1000)
	const s, n = 1.2, 200000
	got := Zipf(r, pop, s, n)
	if len(got) != n {
		t.Fatalf("%d draws, want %d", len(got), n)
	}
	index := map[netip.Addr]int{}
	for i, a := range pop {
		index[a] = i
	}
	counts := make([]int, len(pop))
	for _, a := range got {
		k, ok := index[a]
		if !ok {
			t.Fatalf("%s is not in the population", a)
		}
		counts[k]++
	}
	norm := 0.0
	for k := range pop {
		norm += math.Pow(float64(k+1), -s)
	}
	for k := range 5 {
		want := n * math.Pow(float64(k+1), -s) / norm
		if math.Abs(float64(counts[k])-want) > 0.05*want {
			t.Errorf("rank %d drawn %d times, want about %.0f", k, counts[k], want)
		}
	}
	if Zipf(r, nil, s, 10) != nil {
		t.Error("empty population: want nil")
	}
}

// TestRandomFromRanges: every draw lies in s and in the family asked for,
// and ranges are equally likely whatever their size.
func TestRandomFromRanges(t *testing.T) {
	s := set(t, "10.0.0.0/8", "192.0.2.7/32", "198.51.100.0/30", "2001:db8::/32", "2001:db9::5/128", "2001:dba::/127")
	r := rand.New(rand.NewPCG(1, 2))
	for _, is4 := range []bool{true, false} {
		got := RandomFromRanges(r, s, is4, 30000)
		counts := map[netipx.IPRange]int{}
		for _, a := range got {
			if !s.Contains(a) || a.Is4() != is4 {
				t.Fatalf("%v: outside the set or the family", a)
			}
			for _, rg := range s.Ranges() {
				if rg.Contains(a) {
					counts[rg]++
				}
			}
		}
		if len(counts) != 3 {
			t.Fatalf("IPv4 %v: ranges drawn %v, want 3", is4, counts)
		}
		for rg, c := range counts {
			if math.Abs(float64(c)-10000) > 500 {
				t.Errorf("range %v drawn %d times of 30000, want about 10000", rg, c)
			}
		}
	}
	if RandomFromRanges(r, set(t, "10.0.0.0/8"), false, 5) != nil {
		t.Error("no IPv6 range: want nil")
	}
}
