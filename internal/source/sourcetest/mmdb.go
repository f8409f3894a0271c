// Package sourcetest writes the source files tests need that no text
// editor makes: MaxMind DB files.
package sourcetest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// Builtin is the built-in country data, both families, as a source.
func Builtin(t testing.TB) *source.Source {
	t.Helper()
	src, err := (&source.Loader{StateDir: t.TempDir()}).Load(context.Background(), source.Spec{Name: "geo", Format: source.FormatCountryCSV,
		Paths: []string{source.BuiltinPrefix + "country-ipv4.csv.gz", source.BuiltinPrefix + "country-ipv6.csv.gz"}})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// Aliased are the IPv6 networks that alias the IPv4 subtree in a MaxMind
// DB file (as MaxMind writes them): WriteMMDB leaves what a source has in
// them out, and a reader must not read the IPv4 networks again there.
var Aliased = []netip.Prefix{netip.MustParsePrefix("::ffff:0:0/96"), netip.MustParsePrefix("2001::/32"), netip.MustParsePrefix("2002::/16")}

// WriteMMDB writes what src says of each country as a MaxMind DB file at
// path (those of codes only, if any), in the layout layout names:
// "maxmind" (country.iso_code) or "ipinfo" (country_code), as the
// publishers lay their files out, with the IPv4 subtree aliased.
func WriteMMDB(t testing.TB, src *source.Source, path, layout string, codes ...string) {
	t.Helper()
	w, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "ipfence-test-Country", RecordSize: 28, IPVersion: 6, IncludeReservedNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	// Broader networks first: a network nested in another country's (a
	// CSV row inside a wider one) then wins, as in the publishers' files.
	type row struct {
		p  netip.Prefix
		cc string
	}
	var rows []row
	if codes == nil {
		codes = src.Codes()
	}
	for _, cc := range codes {
		set, err := src.Countries([]string{cc}, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range prefix.Prefixes(set) {
			if !slices.ContainsFunc(Aliased, func(a netip.Prefix) bool { return a.Overlaps(p) }) {
				rows = append(rows, row{p, cc})
			}
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int { return a.p.Bits() - b.p.Bits() })
	for _, r := range rows {
		var rec mmdbtype.Map
		switch layout {
		case "maxmind":
			rec = mmdbtype.Map{"country": mmdbtype.Map{"iso_code": mmdbtype.String(r.cc)}}
		default:
			rec = mmdbtype.Map{"country_code": mmdbtype.String(r.cc), "country": mmdbtype.String("name of " + r.cc)}
		}
		Insert(t, w, r.p, rec)
	}
	Save(t, w, path)
}

// Insert inserts rec for p into w.
func Insert(t testing.TB, w *mmdbwriter.Tree, p netip.Prefix, rec mmdbtype.DataType) {
	t.Helper()
	if err := w.Insert(&net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, rec); err != nil {
		t.Fatal(err)
	}
}

// Save writes w as the file at path.
func Save(t testing.TB, w *mmdbwriter.Tree, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := w.WriteTo(f); err != nil {
		t.Fatal(err)
	}
}

// ASNRow is a row of the synthetic ASN data WriteASN writes.
type ASNRow struct {
	Prefix netip.Prefix
	ASN    uint32
	Org    string
}

// WriteASN writes synthetic autonomous-system data, the same rows as an
// asn-csv file at csvPath and as a MaxMind DB at mmdbPath (the layout
// "maxmind", GeoLite2-ASN's autonomous_system_number, or "ipinfo", IPinfo
// lite's "AS15169" asn with a country_code of IT), and returns the rows:
// every every-th prefix of the built-in country data (both families),
// each of one of asns ASNs from 64512 on, named "Org N" (some with a
// comma, some quoted).
func WriteASN(t testing.TB, csvPath, mmdbPath, layout string, every, asns int) []ASNRow {
	t.Helper()
	var rows []ASNRow
	for i, p := range prefix.Prefixes(Builtin(t).Set()) {
		if i%every != 0 || slices.ContainsFunc(Aliased, func(a netip.Prefix) bool { return a.Overlaps(p) }) {
			continue
		}
		asn := 64512 + uint32(len(rows)*7919%asns)
		org := fmt.Sprintf("Org %d", asn)
		switch asn % 3 {
		case 1:
			org += ", Ltd."
		case 2:
			org = fmt.Sprintf(`The "%d" Company`, asn)
		}
		rows = append(rows, ASNRow{p, asn, org})
	}
	var b strings.Builder
	b.WriteString("ip_range_start,ip_range_end,autonomous_system_number,autonomous_system_organization\n")
	for i, r := range rows {
		org := r.Org
		if strings.ContainsAny(org, `",`) {
			org = `"` + strings.ReplaceAll(org, `"`, `""`) + `"`
		}
		if i%2 == 0 {
			fmt.Fprintf(&b, "%s,%s,%d,%s\n", r.Prefix.Addr(), netipx.PrefixLastIP(r.Prefix), r.ASN, org)
		} else {
			fmt.Fprintf(&b, "%s,AS%d,%s\n", r.Prefix, r.ASN, org)
		}
	}
	if err := os.WriteFile(csvPath, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "ipfence-test-ASN", RecordSize: 28, IPVersion: 6, IncludeReservedNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		rec := mmdbtype.Map{"autonomous_system_number": mmdbtype.Uint32(r.ASN), "autonomous_system_organization": mmdbtype.String(r.Org)}
		if layout == "ipinfo" {
			rec = mmdbtype.Map{"asn": mmdbtype.String(fmt.Sprintf("AS%d", r.ASN)), "as_name": mmdbtype.String(r.Org), "country_code": mmdbtype.String("IT")}
		}
		Insert(t, w, r.Prefix, rec)
	}
	Save(t, w, mmdbPath)
	return rows
}
