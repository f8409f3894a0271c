package source_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
	"github.com/ipfence/ipfence/internal/source/sourcetest"
)

// TestMMDB reads an mmdb written from the built-in country data, in
// MaxMind's layout and in IPinfo's, and checks it against the CSV,
// IPv4 and IPv6: the same addresses have a country; an address of one
// country in the CSV has it in the mmdb; one of several (a CSV row nested
// in another country's) has one of them (the nested one, as publishers
// write their files). A rule's set, and so every verdict, is then the
// same from either where the CSV is unambiguous. Explain names the file
// and the country.
func TestMMDB(t *testing.T) {
	csv := sourcetest.Builtin(t)
	// What the CSV gives any country, and to more than one.
	all, amb := &prefix.Set{}, &prefix.Set{}
	sets := map[string]*prefix.Set{}
	for _, cc := range csv.Codes() {
		s, err := csv.Countries([]string{cc}, false)
		if err != nil {
			t.Fatal(err)
		}
		sets[cc] = s
		amb = prefix.Union(amb, prefix.Intersect(all, s))
		all = prefix.Union(all, s)
	}
	if amb.Empty() {
		t.Log("the CSV has no nested rows of other countries")
	}
	dir := t.TempDir()
	// Every country in MaxMind's layout; a few in IPinfo's (its records
	// differ, not its networks).
	for _, tc := range []struct {
		layout string
		codes  []string
	}{{"maxmind", nil}, {"ipinfo", []string{"CN", "DE", "IT", "US"}}} {
		layout := tc.layout
		path := filepath.Join(dir, layout+".mmdb")
		sourcetest.WriteMMDB(t, csv, path, layout, tc.codes...)
		src, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "mm", Format: source.FormatMMDB, Paths: []string{path}})
		if err != nil {
			t.Fatal(err)
		}
		codes := tc.codes
		if codes == nil {
			codes = csv.Codes()
			if got := src.Set(); !got.Equal(all) {
				t.Errorf("%s: the addresses with a country differ from the CSV's", layout)
			}
		}
		if !src.IsCountry() || !slices.Equal(src.Codes(), codes) {
			t.Fatalf("%s: country data %v, codes %v; want %v", layout, src.IsCountry(), src.Codes(), codes)
		}
		for _, cc := range codes {
			got, err := src.Countries([]string{cc}, false)
			if err != nil {
				t.Fatal(err)
			}
			if extra := prefix.Subtract(got, sets[cc]); !extra.Empty() {
				t.Fatalf("%s: %s has %v, which the CSV does not give it", layout, cc, prefix.Prefixes(extra)[:1])
			}
			if lost := prefix.Subtract(prefix.Subtract(sets[cc], amb), got); !lost.Empty() {
				t.Fatalf("%s: %s lacks %v, which the CSV gives it alone", layout, cc, prefix.Prefixes(lost)[:1])
			}
		}
		m := src.Explain(netip.MustParseAddr("151.1.1.1"))
		if len(m) != 1 || m[0].Country != "IT" || m[0].Origin != path {
			t.Errorf("%s: explain 151.1.1.1: %+v", layout, m)
		}
	}
	// A file that is not an mmdb is refused, with what to do.
	bad := filepath.Join(dir, "bad.mmdb")
	if err := os.WriteFile(bad, []byte("1.2.3.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "mm", Format: source.FormatMMDB, Paths: []string{bad}}); err == nil {
		t.Error("a text file read as an mmdb")
	}
}

// BenchmarkLoadCountries loads the built-in country data (both families)
// as the CSV ipfence ships and as an mmdb written from it, side by side:
// go test ./internal/source -run '^$' -bench LoadCountries -benchmem.
func BenchmarkLoadCountries(b *testing.B) {
	csv := sourcetest.Builtin(b)
	path := filepath.Join(b.TempDir(), "countries.mmdb")
	sourcetest.WriteMMDB(b, csv, path, "maxmind")
	for _, tc := range []source.Spec{
		{Name: "geo", Format: source.FormatCountryCSV, Paths: []string{source.BuiltinPrefix + "country-ipv4.csv.gz", source.BuiltinPrefix + "country-ipv6.csv.gz"}},
		{Name: "geo", Format: source.FormatMMDB, Paths: []string{path}},
	} {
		b.Run(tc.Format, func(b *testing.B) {
			l := &source.Loader{StateDir: b.TempDir()}
			for b.Loop() {
				if _, err := l.Load(context.Background(), tc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
