package source_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
	"github.com/ipfence/ipfence/internal/source/sourcetest"
	"go4.org/netipx"
)

// TestASN reads the same synthetic autonomous-system data as an asn-csv
// file and as MaxMind DB files in GeoLite2-ASN's layout and in IPinfo
// lite's (which holds countries too), and checks that every way of
// reading agrees with the rows written: each ASN's set, an inverted
// selection, and explain's AS and organisation.
func TestASN(t *testing.T) {
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "asn.csv")
	rows := sourcetest.WriteASN(t, csvPath, filepath.Join(dir, "maxmind.mmdb"), "maxmind", 4, 300)
	sourcetest.WriteASN(t, filepath.Join(dir, "again.csv"), filepath.Join(dir, "ipinfo.mmdb"), "ipinfo", 4, 300)
	load := func(format, path string) *source.Source {
		t.Helper()
		src, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "asn", Format: format, Paths: []string{path}})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	srcs := map[string]*source.Source{
		"csv":     load(source.FormatASNCSV, csvPath),
		"maxmind": load(source.FormatMMDB, filepath.Join(dir, "maxmind.mmdb")),
		"ipinfo":  load(source.FormatMMDB, filepath.Join(dir, "ipinfo.mmdb")),
	}
	want := map[uint32]*netipx.IPSetBuilder{}
	org := map[uint32]string{}
	for _, r := range rows {
		if want[r.ASN] == nil {
			want[r.ASN] = new(netipx.IPSetBuilder)
		}
		want[r.ASN].AddPrefix(r.Prefix)
		org[r.ASN] = r.Org
	}
	if len(want) < 250 || len(rows) < 10000 {
		t.Fatalf("%d rows of %d ASNs: too few for a test", len(rows), len(want))
	}
	for name, src := range srcs {
		if !src.IsASN() || src.IsCountry() != (name == "ipinfo") {
			t.Errorf("%s: IsASN %v, IsCountry %v", name, src.IsASN(), src.IsCountry())
		}
		n := 0
		for asn, b := range want {
			if n++; n%10 != 0 {
				continue
			}
			w, _ := b.IPSet()
			got, err := src.ASNs([]uint32{asn}, false)
			if err != nil {
				t.Fatal(err)
			}
			if !got.IPSet().Equal(w) {
				t.Fatalf("%s: AS%d: %d prefixes, want %d", name, asn, len(prefix.Prefixes(got)), len(w.Prefixes()))
			}
			if src.ASName(asn) != org[asn] {
				t.Errorf("%s: AS%d is named %q, want %q", name, asn, src.ASName(asn), org[asn])
			}
		}
		// Every AS but two: all rows less theirs.
		a, b := rows[0].ASN, rows[1].ASN
		var rest netipx.IPSetBuilder
		for asn, s := range want {
			if asn != a && asn != b {
				w, _ := s.IPSet()
				rest.AddSet(w)
			}
		}
		w, _ := rest.IPSet()
		if got, err := src.ASNs([]uint32{a, b}, true); err != nil || !got.IPSet().Equal(w) {
			t.Errorf("%s: every AS but %d and %d: %v", name, a, b, err)
		}
		for _, r := range rows[:200] {
			ms := src.Explain(r.Prefix.Addr())
			if len(ms) != 1 || ms[0].ASN != r.ASN || ms[0].Org != r.Org {
				t.Fatalf("%s: explain %s: %+v, want AS%d %q", name, r.Prefix.Addr(), ms, r.ASN, r.Org)
			}
		}
	}
	it, err := srcs["ipinfo"].Countries([]string{"IT"}, false)
	if err != nil || !it.IPSet().Equal(srcs["ipinfo"].Set().IPSet()) {
		t.Errorf("ipinfo's countries: %v", err)
	}

	// What the policy's rules select by is all that is read of an mmdb:
	// IPinfo's file read for countries has no ASNs (and merges its
	// networks by country alone); a label no network has is refused.
	spec := func(path string, l source.Labels) source.Spec {
		return source.Spec{Name: "asn", Format: source.FormatMMDB, Paths: []string{filepath.Join(dir, path)}, Labels: l}
	}
	cc, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), spec("ipinfo.mmdb", source.LabelCountry))
	if err != nil {
		t.Fatal(err)
	}
	r4, _ := cc.Rows()
	b4, _ := srcs["ipinfo"].Rows()
	if cc.IsASN() || !cc.IsCountry() || r4 > b4 {
		t.Errorf("ipinfo read for countries: IsASN %v, IsCountry %v, %d IPv4 rows (%d with ASNs)", cc.IsASN(), cc.IsCountry(), r4, b4)
	}
	if _, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), spec("maxmind.mmdb", source.LabelCountry|source.LabelASN)); err == nil || !strings.Contains(err.Error(), "none with a country") {
		t.Errorf("an ASN database read for countries: %v", err)
	}
}

// TestASNErrors: bad rows of an asn-csv file are refused with file, line
// and what is wrong; a header is skipped on the first line only; rows of
// ASN 0 select nothing.
func TestASNErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, data, want string }{
		{"bad asn", "192.0.2.0/24,ASX\n", `:1: cannot parse "192.0.2.0/24,ASX"`},
		{"reversed", "192.0.2.9,192.0.2.1,64496\n", "ends (192.0.2.1) before it starts"},
		{"mixed", "192.0.2.1,2001:db8::1,64496\n", "mixes IPv4 and IPv6"},
		{"no asn", "192.0.2.0/24\n", "no comma"},
		{"big asn", "192.0.2.0/24,4294967296\n", "not an AS number"},
		{"header late", "192.0.2.0/24,64496\nfirst,last,asn\n", ":2:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".csv")
			writeData(t, path, tc.data)
			_, err := (&source.Loader{}).Load(context.Background(), source.Spec{Name: "asn", Format: source.FormatASNCSV, Paths: []string{path}})
			var pe *source.ParseError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want a *ParseError containing %q", err, tc.want)
			}
		})
	}
	path := filepath.Join(dir, "ok.csv")
	writeData(t, path, "start_ip,end_ip,asn,as_name\n192.0.2.0,192.0.2.255,0,Not routed\n198.51.100.0/24,AS64496\n")
	src, err := (&source.Loader{}).Load(context.Background(), source.Spec{Name: "asn", Format: source.FormatASNCSV, Paths: []string{path}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(prefix.Prefixes(src.Set())); got != "[198.51.100.0/24]" {
		t.Errorf("set %s, want only the row of an AS", got)
	}
	if _, err := src.Countries([]string{"IT"}, false); !errors.Is(err, source.ErrNotCountry) {
		t.Errorf("countries of an asn-csv source: %v", err)
	}
}

func writeData(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
