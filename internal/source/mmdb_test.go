package source_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
	"github.com/oschwald/maxminddb-golang/v2"

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
	// What the CSV gives any country, and to more than one, outside the
	// networks that alias IPv4 in an IPv6 tree (which an mmdb has no
	// IPv6 data in).
	var ab prefix.Builder
	for _, p := range sourcetest.Aliased {
		ab.AddPrefix(p)
	}
	aliased, _ := ab.Build()
	all, amb := &prefix.Set{}, &prefix.Set{}
	sets := map[string]*prefix.Set{}
	for _, cc := range csv.Codes() {
		s, err := csv.Countries([]string{cc}, false)
		if err != nil {
			t.Fatal(err)
		}
		s = prefix.Subtract(s, aliased)
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
		if in := prefix.Intersect(src.Set(), aliased); !in.Empty() {
			t.Errorf("%s: IPv4 networks read again where IPv6 aliases them: %v", layout, prefix.Prefixes(in)[:1])
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
	// A file whose search tree shares nodes (2^32 networks from 32
	// nodes) is refused at once, not walked; one without countries is
	// refused too.
	chain := filepath.Join(dir, "chain.mmdb")
	writeChain(t, chain, "country")
	data, err := os.ReadFile(chain)
	if err != nil {
		t.Fatal(err)
	}
	for _, empty := range []bool{false, true} {
		bomb := slices.Clone(data)
		shareNodes(t, bomb, empty)
		shared := filepath.Join(dir, "shared.mmdb")
		if err := os.WriteFile(shared, bomb, 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "mm", Format: source.FormatMMDB, Paths: []string{shared}})
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, source.ErrMMDBTree) {
				t.Errorf("a tree of shared nodes (leaves empty: %v): %v", empty, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("a tree of shared nodes (leaves empty: %v) is still being walked after 20s", empty)
		}
	}
	// A file of ASNs and no countries is an ASN source; one of neither
	// is refused.
	asn := filepath.Join(dir, "asn.mmdb")
	writeChain(t, asn, "asn")
	src, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "mm", Format: source.FormatMMDB, Paths: []string{asn}})
	if err != nil {
		t.Fatal(err)
	}
	if src.IsCountry() || !src.IsASN() {
		t.Errorf("an ASN file: IsCountry %v, IsASN %v", src.IsCountry(), src.IsASN())
	}
	if _, err := src.Countries([]string{"IT"}, false); !errors.Is(err, source.ErrNotCountry) {
		t.Errorf("countries of an ASN file: %v", err)
	}
	if set, err := src.ASNs([]uint32{64500}, false); err != nil || fmt.Sprint(prefix.Prefixes(set)) != "[1.2.3.4/32]" {
		t.Errorf("AS64500 of an ASN file: %v, %v", set, err)
	}
	none := filepath.Join(dir, "none.mmdb")
	writeChain(t, none, "none")
	if _, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "mm", Format: source.FormatMMDB, Paths: []string{none}}); err == nil || !strings.Contains(err.Error(), "none with a country or an autonomous system") {
		t.Errorf("a file without countries or ASNs: %v", err)
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

// writeChain writes an IPv4 mmdb of one network, 1.2.3.4/32 (a chain of
// 32 nodes, 24-bit records), whose record is a country's, an ASN's (no
// country) or neither's.
func writeChain(t *testing.T, path, kind string) {
	t.Helper()
	w, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "ipfence-test", RecordSize: 24, IPVersion: 4})
	if err != nil {
		t.Fatal(err)
	}
	rec := mmdbtype.Map{"country": mmdbtype.Map{"iso_code": mmdbtype.String("IT")}}
	switch kind {
	case "asn":
		rec = mmdbtype.Map{"autonomous_system_number": mmdbtype.Uint32(64500)}
	case "none":
		rec = mmdbtype.Map{"city": mmdbtype.String("Rome")}
	}
	sourcetest.Insert(t, w, netip.MustParsePrefix("1.2.3.4/32"), rec)
	sourcetest.Save(t, w, path)
}

// shareNodes makes both children of every node of an mmdb of 24-bit
// records the node's child, where it has one: every node then has two
// parents, and the tree 2^depth networks. With empty, the leaves hold no
// data either: the walk then never hands a network back.
func shareNodes(t *testing.T, data []byte, empty bool) {
	t.Helper()
	db, err := maxminddb.OpenBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	nodes := int(db.Metadata.NodeCount)
	db.Close()
	for n := range nodes {
		b := data[n*6 : n*6+6]
		left := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		right := int(b[3])<<16 | int(b[4])<<8 | int(b[5])
		switch {
		case left < nodes:
			copy(b[3:], b[:3])
		case right < nodes:
			copy(b[:3], b[3:])
		case empty:
			b[0], b[1], b[2] = byte(nodes>>16), byte(nodes>>8), byte(nodes)
			copy(b[3:], b[:3])
		}
	}
}
