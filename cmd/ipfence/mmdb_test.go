package main

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
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
