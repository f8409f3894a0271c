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

// TestCatalog reads each catalog entry's sample, one file per URL in
// testdata/catalog/NAME/ named as the URL's last element, with the
// entry's format and input limits: every entry has one, it parses and
// holds prefixes of the entry's families. The samples are in the
// publishers' shapes (headers, comments, a missing final newline), not
// downloads: this machine has no internet.
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
			if e.Name == "spamhaus-drop" || e.Name == "cloudflare" {
				if v4 == 0 || v6 == 0 {
					t.Errorf("IPv4 and IPv6 expected: %d + %d prefixes", v4, v6)
				}
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
