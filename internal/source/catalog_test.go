package source

import (
	"context"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// bothFamilies are the feeds that publish IPv4 and IPv6 prefixes.
var bothFamilies = map[string]bool{"spamhaus-drop": true, "blocklist-de": true, "cloudflare": true, "fastly": true,
	"google-cloud": true, "google": true, "aws": true, "github": true}

// TestCatalog reads each catalog entry's sample, one file per URL in
// testdata/catalog/NAME/ named as the URL's last element, with the
// entry's format and input limits: every entry has one, it parses and
// holds prefixes of the entry's families. The samples are written in
// the publishers' formats (their headers and comments, CRLF line ends,
// a missing final newline), with documentation addresses: they are not
// downloads, which TestCatalogLive makes where there is a network.
func TestCatalog(t *testing.T) {
	names := map[string]bool{}
	for _, e := range Catalog() {
		t.Run(e.Name, func(t *testing.T) {
			if names[e.Name] {
				t.Fatal("listed twice")
			}
			names[e.Name] = true
			if e.Use != UseBlock && e.Use != UseAllow {
				t.Errorf("use %q", e.Use)
			}
			if !slices.Contains(Formats(), e.Format) {
				t.Errorf("format %q", e.Format)
			}
			if e.Refresh < time.Minute || e.Title == "" || !strings.Contains(e.Licence, "https://") {
				t.Errorf("refresh %v, title %q, licence %q", e.Refresh, e.Title, e.Licence)
			}
			spec := Spec{Name: e.Name, Format: e.Format, AllowBroad: e.AllowBroad}
			for _, u := range e.URLs {
				pu, err := url.Parse(u)
				if err != nil || pu.Scheme != "https" {
					t.Fatalf("URL %q: not https (%v)", u, err)
				}
				sample := filepath.Join("testdata", "catalog", e.Name, path.Base(pu.Path))
				if _, err := os.Stat(sample); err != nil {
					t.Fatalf("no sample for %s: %v", u, err)
				}
				spec.Paths = append(spec.Paths, sample)
			}
			src, err := (&Loader{StateDir: t.TempDir()}).Load(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			v4, v6 := src.Prefixes()
			if v4+v6 == 0 {
				t.Error("the sample holds no prefix")
			}
			if bothFamilies[e.Name] && (v4 == 0 || v6 == 0) {
				t.Errorf("IPv4 and IPv6 expected: %d + %d prefixes", v4, v6)
			}
			if e.MinRefresh <= 0 || e.MinRefresh > e.Refresh {
				t.Errorf("min refresh %v, refresh %v", e.MinRefresh, e.Refresh)
			}
		})
	}
	if _, ok := LookupCatalog("spamhaus-drop"); !ok {
		t.Error("LookupCatalog(spamhaus-drop)")
	}
	if _, ok := LookupCatalog("nope"); ok {
		t.Error("LookupCatalog(nope)")
	}
}

// TestCatalogLive downloads each feed of the catalog and reads it with its
// entry's format, when IPFENCE_LIVE_FEEDS=1 (it needs the internet, and
// fetches from every publisher once): a URL that moved, or a format a
// publisher changed, fails here.
func TestCatalogLive(t *testing.T) {
	if os.Getenv("IPFENCE_LIVE_FEEDS") != "1" {
		t.Skip("set IPFENCE_LIVE_FEEDS=1 to download the catalog's feeds")
	}
	for _, e := range Catalog() {
		t.Run(e.Name, func(t *testing.T) {
			spec := Spec{Name: e.Name, Format: e.Format, URLs: e.URLs, AllowBroad: e.AllowBroad}
			src, err := (&Loader{StateDir: t.TempDir()}).Load(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			if v4, v6 := src.Prefixes(); v4+v6 == 0 || bothFamilies[e.Name] && (v4 == 0 || v6 == 0) {
				t.Errorf("%d IPv4 + %d IPv6 prefixes", v4, v6)
			}
		})
	}
}
