package source

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

// loadJSON loads testdata/json/file as a source of format, picking
// services and regions.
func loadJSON(t *testing.T, format, file string, services, regions []string) (*Source, error) {
	t.Helper()
	l := &Loader{StateDir: t.TempDir()}
	return l.Load(context.Background(), Spec{Name: "j", Format: format, Paths: []string{filepath.Join("testdata", "json", file)},
		Services: services, Regions: regions})
}

// TestJSONFormats reads a sample of each JSON format, in the shape the
// publishers serve it, with and without picking services and regions,
// and checks the prefixes read and the line each comes from (where its
// record begins).
func TestJSONFormats(t *testing.T) {
	for _, tc := range []struct {
		name, format, file string
		services, regions  []string
		want               []string
		explain            string // an address and the line it comes from
	}{
		{"spamhaus v4", FormatSpamhausJSON, "drop_v4.json", nil, nil, []string{"1.10.16.0/20", "2.56.192.0/22", "5.134.128.0/19"}, "5.134.130.1 drop_v4.json:3"},
		{"spamhaus v6", FormatSpamhausJSON, "drop_v6.json", nil, nil, []string{"2001:678:738::/48", "2a06:5280::/29"}, "2a06:5280::1 drop_v6.json:2"},
		{"aws", FormatAWSJSON, "ip-ranges.json", nil, nil,
			[]string{"3.4.12.4/32", "3.5.140.0/22", "13.32.0.0/15", "18.184.0.0/15", "2600:9000:2000::/36", "2a05:d014::/36"}, "13.32.1.1 ip-ranges.json:23"},
		{"aws cloudfront", FormatAWSJSON, "ip-ranges.json", []string{"cloudfront"}, nil, []string{"13.32.0.0/15", "2600:9000:2000::/36"}, "2600:9000:2000::1 ip-ranges.json:37"},
		{"aws ec2 in eu-central-1", FormatAWSJSON, "ip-ranges.json", []string{"EC2", "S3"}, []string{"eu-central-1"}, []string{"18.184.0.0/15", "2a05:d014::/36"}, ""},
		{"google cloud", FormatGoogleJSON, "cloud.json", nil, nil, []string{"34.1.208.0/20", "34.35.0.0/16", "2600:1900:8000::/44"}, "34.35.1.1 cloud.json:12"},
		{"google cloud europe-west1", FormatGoogleJSON, "cloud.json", []string{"Google Cloud"}, []string{"europe-west1"}, []string{"34.35.0.0/16"}, ""},
		{"goog", FormatGoogleJSON, "goog.json", nil, nil, []string{"8.8.4.0/24", "8.8.8.0/24", "2001:4860::/32"}, "8.8.8.8 goog.json:6"},
		{"github", FormatGitHubMeta, "github-meta.json", nil, nil, []string{"20.201.28.148/32", "140.82.112.0/20", "185.199.108.0/22", "192.30.252.0/22", "2a0a:a440::/29"}, ""},
		{"github api", FormatGitHubMeta, "github-meta.json", []string{"api"}, nil, []string{"20.201.28.148/32", "140.82.112.0/20"}, "20.201.28.148 github-meta.json:22"},
		{"fastly", FormatFastlyJSON, "fastly.json", nil, nil, []string{"23.235.32.0/20", "43.249.72.0/22", "151.101.0.0/16", "2a04:4e40::/32", "2a04:4e42::/32"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := loadJSON(t, tc.format, tc.file, tc.services, tc.regions)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range prefix.Prefixes(src.Set()) {
				got = append(got, p.String())
			}
			want := slices.Clone(tc.want)
			slices.SortFunc(want, func(a, b string) int { return netip.MustParsePrefix(a).Addr().Compare(netip.MustParsePrefix(b).Addr()) })
			if !slices.Equal(got, want) {
				t.Errorf("prefixes %v, want %v", got, want)
			}
			if src.IsCountry() {
				t.Error("a JSON source has country data")
			}
			if tc.explain == "" {
				return
			}
			addr, origin, _ := strings.Cut(tc.explain, " ")
			ms := src.Explain(netip.MustParseAddr(addr))
			if len(ms) == 0 || filepath.Base(ms[0].Origin) != origin {
				t.Errorf("Explain(%s) = %+v, want from %s", addr, ms, origin)
			}
		})
	}
}

// TestJSONErrors: a record that is not a prefix, bad JSON, a filter
// value no record has (the error lists those it has), a filter on a
// format without it, and a broad prefix.
func TestJSONErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := writeFileForTest(p, text); err != nil {
			t.Fatal(err)
		}
		return p
	}
	load := func(format, path string, services, regions []string) error {
		_, err := (&Loader{StateDir: t.TempDir()}).Load(context.Background(), Spec{Name: "j", Format: format, Paths: []string{path}, Services: services, Regions: regions})
		return err
	}
	var pe *ParseError
	err := load(FormatSpamhausJSON, write("d.json", "{\"cidr\":\"1.10.16.0/20\"}\n{\"cidr\":\"1.10.16\"}\n"), nil, nil)
	if !errors.As(err, &pe) || pe.Line != 2 || !strings.Contains(err.Error(), "d.json:2") {
		t.Errorf("bad cidr: %v, want a ParseError at d.json:2", err)
	}
	err = load(FormatSpamhausJSON, write("e.json", "{\"cidr\":\"1.10.16.0/20\"}\nnot json\n"), nil, nil)
	if !errors.As(err, &pe) || pe.Line != 2 {
		t.Errorf("bad JSON: %v, want a ParseError at line 2", err)
	}
	err = load(FormatAWSJSON, write("a.json", "{\n \"prefixes\": [\n  {\"ip_prefix\": \"3.5.140.0/22\", \"service\": \"S3\"},\n  {\"ip_prefix\": \"3.5.140.0/33\", \"service\": \"S3\"}\n ]\n}\n"), nil, nil)
	if !errors.As(err, &pe) || pe.Line != 4 {
		t.Errorf("bad AWS prefix: %v, want a ParseError at line 4", err)
	}
	err = load(FormatAWSJSON, filepath.Join("testdata", "json", "ip-ranges.json"), []string{"CLOUDFRONTT"}, nil)
	if err == nil || !strings.Contains(err.Error(), `no record has service "CLOUDFRONTT"`) || !strings.Contains(err.Error(), "AMAZON, CLOUDFRONT, EC2, S3") {
		t.Errorf("unknown service: %v", err)
	}
	if err := load(FormatFastlyJSON, filepath.Join("testdata", "json", "fastly.json"), []string{"cdn"}, nil); err == nil || !strings.Contains(err.Error(), "no services") {
		t.Errorf("services on fastly-json: %v", err)
	}
	if err := load(FormatList, filepath.Join("testdata", "json", "fastly.json"), nil, []string{"eu"}); err == nil || !strings.Contains(err.Error(), "services and regions") {
		t.Errorf("regions on a list: %v", err)
	}
	var be *BroadError
	if err := load(FormatFastlyJSON, write("f.json", `{"addresses":["10.0.0.0/7"]}`), nil, nil); !errors.As(err, &be) || be.Line != 1 {
		t.Errorf("broad prefix: %v, want a BroadError", err)
	}
	// Files that would load partly, or empty: refused.
	for _, tc := range []struct{ format, name, text string }{
		{FormatAWSJSON, "cut.json", "{\"prefixes\": [{\"ip_prefix\": \"3.5.140.0/22\"}]"},
		{FormatAWSJSON, "tail.json", "{\"prefixes\": [{\"ip_prefix\": \"3.5.140.0/22\"}]} {\"x\": 1}"},
		{FormatAWSJSON, "forbidden.json", `{"message": "Forbidden"}`},
		{FormatFastlyJSON, "other.json", `{"hooks": ["192.30.252.0/22"]}`},
		{FormatSpamhausJSON, "meta.json", "\n\n{\"type\":\"metadata\",\"records\":0}\n"},
		{FormatSpamhausJSON, "blank.json", strings.Repeat("\n", 1<<20)},
	} {
		if err := load(tc.format, write(tc.name, tc.text), nil, nil); !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a ParseError", tc.name, err)
		}
	}
	// A list of prefixes in GitHub's meta is read whole: a bad element
	// is an error, at its line.
	err = load(FormatGitHubMeta, write("meta.json", "{\n \"ssh_keys\": [\"ssh-ed25519 AAAA\"],\n \"hooks\": [\n  \"192.30.252.0/22\",\n  \"192.0.2.0/33\"\n ]\n}\n"), nil, nil)
	if !errors.As(err, &pe) || pe.Line != 5 || strings.Count(err.Error(), "cannot parse") != 1 {
		t.Errorf("bad GitHub prefix: %v, want one ParseError at line 5", err)
	}
	// A bad record is reported where it begins.
	err = load(FormatGoogleJSON, write("g.json", "{\"prefixes\": [\n {\"ipv4Prefix\": \"8.8.4.0/24\"},\n {\"ipv4Prefix\": 7}\n]}\n"), nil, nil)
	if !errors.As(err, &pe) || pe.Line != 3 {
		t.Errorf("bad Google record: %v, want a ParseError at line 3", err)
	}
	// goog.json has no services: a pick takes nothing from it, and is
	// no error there.
	src, err := loadJSON(t, FormatGoogleJSON, "goog.json", []string{"Google Cloud"}, nil)
	if err != nil || !src.Set().Empty() {
		t.Errorf("goog.json with a service pick: %v", err)
	}
}

func writeFileForTest(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

// FuzzJSON: any input to a JSON format either parses into rows within
// its limits or fails with an error; it never panics.
func FuzzJSON(f *testing.F) {
	for _, name := range []string{"drop_v4.json", "ip-ranges.json", "cloud.json", "github-meta.json", "fastly.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", "json", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"prefixes": [{"ip_prefix": "::/0"}], "hooks": [1, {"a": []}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range []string{FormatSpamhausJSON, FormatAWSJSON, FormatGoogleJSON, FormatGitHubMeta, FormatFastlyJSON} {
			lim := Spec{MaxEntries: 100}.limits()
			if p, err := readPart(bytes.NewReader(data), format, "f", 0, lim); err == nil && p.rows() > 100 {
				t.Fatalf("%s: %d rows past a limit of 100", format, p.rows())
			}
		}
	})
}
