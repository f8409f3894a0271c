package prefix

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"go4.org/netipx"
)

// europe are the country codes data/geo/README.md calls Europe.
var europe = strings.Fields("AD AL AT AX BA BE BG BY CH CY CZ DE DK EE ES FI FO FR GB GG GI GR HR HU IE IM IS IT JE LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE SI SK SM UA VA XK")

// countrySets reads both bundled country files and returns, for the
// countries in ccs, their set, and the set of all other countries.
func countrySets(t *testing.T, ccs []string) (in, out *Set) {
	t.Helper()
	want := map[string]bool{}
	for _, cc := range ccs {
		want[cc] = true
	}
	var bin, bout Builder
	for _, name := range []string{"../../data/geo/country-ipv4.csv.gz", "../../data/geo/country-ipv6.csv.gz"} {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		z, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(z)
		for sc.Scan() {
			row := strings.Split(sc.Text(), ",")
			if len(row) != 3 {
				t.Fatalf("%s: bad row %q", name, sc.Text())
			}
			r := netipx.IPRangeFrom(netip.MustParseAddr(row[0]), netip.MustParseAddr(row[1]))
			if want[row[2]] {
				bin.AddRange(r)
			} else {
				bout.AddRange(r)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	in, err := bin.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, err = bout.Build()
	if err != nil {
		t.Fatal(err)
	}
	return in, out
}

// TestCountryReference checks Count against the figures data/geo/README.md
// gives, measured with Python's ipaddress module: an independent reference,
// for IPv6 too.
func TestCountryReference(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 550k rows")
	}
	it, _ := countrySets(t, []string{"IT"})
	if v4, v6 := Count(it); v4 != 10_557 || v6 != 3_087 {
		t.Errorf("Italy: %d IPv4 and %d IPv6 prefixes, want 10557 and 3087", v4, v6)
	}
	eu, rest := countrySets(t, europe)
	if v4, v6 := Count(eu); v4 != 84_738 || v6 != 115_781 {
		t.Errorf("Europe: %d IPv4 and %d IPv6 prefixes, want 84738 and 115781", v4, v6)
	}
	if v4, v6 := Count(rest); v4 != 95_452 || v6 != 100_833 {
		t.Errorf("outside Europe: %d IPv4 and %d IPv6 prefixes, want 95452 and 100833", v4, v6)
	}
	// Europe and its complement are disjoint and cover everything (checked
	// with netipx's own algebra).
	notEU := Complement(eu, true, true)
	neu, nnotEU := eu.IPSet(), notEU.IPSet()
	var all netipx.IPSetBuilder
	all.AddSet(neu)
	all.AddSet(nnotEU)
	var both netipx.IPSetBuilder
	both.AddSet(neu)
	both.Intersect(nnotEU) // (not IPSet.Overlaps: quadratic)
	s, _ := all.IPSet()
	if common, _ := both.IPSet(); len(common.Ranges()) != 0 || fmt.Sprint(s.Prefixes()) != "[0.0.0.0/0 ::/0]" {
		t.Errorf("Europe and its complement overlap or leave a gap")
	}
}
