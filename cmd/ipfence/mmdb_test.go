package main

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source/sourcetest"
)

const mmdbPolicy = `
sources:
  geo: {format: %s, paths: [%s]}
protect: [198.18.0.0/15, 2001:2::/48]
rules:
  - {name: rej,  action: reject, match: {source: geo, countries: [BR]}}
  - {name: only, action: allow-only, match: {source: geo, countries: [IT, DE]}}
`

// TestMMDBVerdicts applies an allow-only policy whose countries come from
// an mmdb (written from the built-in data) in a lab namespace, and
// checks the kernel's verdicts against the same policy on the built-in
// CSV: sources of five countries, IPv4 and IPv6, and others.
func TestMMDBVerdicts(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	csv := sourcetest.Builtin(t)
	codes := []string{"BR", "DE", "FR", "IT", "US"}
	sourcetest.WriteMMDB(t, csv, filepath.Join(dir, "geo.mmdb"), "maxmind", codes...)
	write(t, dir, "mmdb.yaml", fmt.Sprintf(mmdbPolicy, "mmdb", "geo.mmdb"))
	write(t, dir, "csv.yaml", fmt.Sprintf(mmdbPolicy, "country-csv", `"builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"`))
	if _, err := run(t, "apply", "--policy", filepath.Join(dir, "mmdb.yaml"), "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	model := compileFor(t, filepath.Join(dir, "csv.yaml"), t.TempDir())
	// A few addresses of each country (not of a row nested in another
	// country's, which an mmdb gives one of them), and some of none.
	var srcs []netip.Addr
	for _, cc := range append(codes, "ES", "JP") {
		set, err := csv.Countries([]string{cc}, false)
		if err != nil {
			t.Fatal(err)
		}
		ps := prefix.Prefixes(set)
		for i := 0; i < len(ps) && i < 4000; i += 500 {
			for _, a := range []netip.Addr{ps[i].Addr(), ps[len(ps)-1-i].Addr()} {
				if len(csv.Explain(a)) == 1 {
					srcs = append(srcs, a)
				}
			}
		}
	}
	pktgentest.ExpectModel(t, lab, model.Plan, srcs, 443)
}

const asnPolicy = `
sources:
  asn: {format: %s, paths: [%s]}
protect: [198.18.0.0/15, 2001:2::/48]
rules:
  - {name: hosting, action: reject, match: {source: asn, asns: [AS%d, %d, AS%d]}}
  - {name: others, action: drop, ports: [udp/443], match: {source: asn, asns: [AS%[3]d], invert: true}}
`

// TestASNVerdicts applies rules on autonomous systems read from an mmdb
// (GeoLite2-ASN's layout) in a lab namespace, and checks the kernel's
// verdicts against the same policy on an asn-csv file of the same rows:
// sources of the ASNs picked (rejected), of other ASNs (dropped by the
// inverted rule) and of none (passed), IPv4 and IPv6.
func TestASNVerdicts(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	rows := sourcetest.WriteASN(t, filepath.Join(dir, "asn.csv"), filepath.Join(dir, "asn.mmdb"), "maxmind", 8, 200)
	a, b, c := rows[0].ASN, rows[1].ASN, rows[2].ASN
	write(t, dir, "mmdb.yaml", fmt.Sprintf(asnPolicy, "mmdb", "asn.mmdb", a, b, c))
	write(t, dir, "csv.yaml", fmt.Sprintf(asnPolicy, "asn-csv", "asn.csv", a, b, c))
	if _, err := run(t, "apply", "--policy", filepath.Join(dir, "mmdb.yaml"), "--netns", lab.FW, "--state", dir); err != nil {
		t.Fatal(err)
	}
	model := compileFor(t, filepath.Join(dir, "csv.yaml"), t.TempDir())
	var srcs []netip.Addr
	for i := 0; i < len(rows); i += len(rows) / 400 {
		p := rows[i].Prefix
		srcs = append(srcs, p.Addr(), p.Addr().Prev()) // the one before: of another row, or of none
	}
	for _, r := range rows { // a few of each AS picked
		if (r.ASN == a || r.ASN == b || r.ASN == c) && len(srcs) < 1000 {
			srcs = append(srcs, r.Prefix.Addr())
		}
	}
	srcs = slices.DeleteFunc(srcs, func(a netip.Addr) bool { return !pktgen.Testable(a) })
	by := map[string]int{}
	for _, d := range pktgentest.ExpectModel(t, lab, model.Plan, srcs, 443) {
		by[d.Rule+" "+d.Verdict]++
	}
	if by["hosting reject"] == 0 || by["others drop"] == 0 || by[" accept"] == 0 {
		t.Errorf("the sample does not exercise every rule: %v", by)
	}
	out, err := run(t, "explain", "--policy", filepath.Join(dir, "mmdb.yaml"), "--state", dir, rows[0].Prefix.Addr().String())
	if err != nil || !strings.Contains(out, fmt.Sprintf("AS%d %q", a, rows[0].Org)) {
		t.Errorf("explain names no AS and organisation: %v\n%s", err, out)
	}
}
