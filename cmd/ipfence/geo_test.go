package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/data/geo"
)

// writeGeoFile writes a file in a temporary folder, gzipped if name ends
// in .gz.
func writeGeoFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	b := []byte(content)
	if strings.HasSuffix(name, ".gz") {
		var buf bytes.Buffer
		z := gzip.NewWriter(&buf)
		z.Write(b)
		z.Close()
		b = buf.Bytes()
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const geoCSV = `# test data
10.0.0.0,10.0.0.255,IT
10.0.1.0,10.0.1.255,it
10.0.2.0/24,DE
10.0.3.0,10.0.3.127,FR
2001:db8::,2001:db8::ffff,IT
2001:db8:1::/48,DE
`

func TestGeoCommand(t *testing.T) {
	csv := writeGeoFile(t, "geo.csv.gz", geoCSV)
	rir := writeGeoFile(t, "delegated", `2|ripencc|20260101|4|19830705|20260101|+0100
ripencc|*|ipv4|*|3|summary
ripencc|IT|ipv4|10.0.0.0|512|20100101|allocated
ripencc|DE|ipv4|10.0.2.0|256|20100101|assigned
ripencc||ipv4|10.0.3.0|256||available
ripencc|IT|asn|3269|1|19940101|allocated
ripencc|IT|ipv6|2001:db8::|48|20100101|allocated
`)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one country", []string{"geo", "--data", csv, "--countries", "IT"},
			"10.0.0.0/23\n2001:db8::/112\n"},
		{"two countries, lower case", []string{"geo", "--data", csv, "--countries", "it,de"},
			"10.0.0.0/23\n10.0.2.0/24\n2001:db8::/112\n2001:db8:1::/48\n"},
		{"invert", []string{"geo", "--data", csv, "--countries", "IT", "--invert"},
			"10.0.2.0/24\n10.0.3.0/25\n2001:db8:1::/48\n"},
		{"valid code without data", []string{"geo", "--data", csv, "--countries", "JP"}, ""},
		{"count", []string{"geo", "--data", csv, "--countries", "IT,DE", "--count"},
			"ipv4: 2 prefixes\nipv6: 2 prefixes\n"},
		{"rir-delegated", []string{"geo", "--data", rir, "--format", "rir-delegated", "--countries", "IT"},
			"10.0.0.0/23\n2001:db8::/48\n"},
		{"count json", []string{"geo", "--data", csv, "--countries", "IT", "--count", "--json"},
			`{"countries":["IT"],"invert":false,"data":["` + csv + `"],"ipv4":{"prefixes":1},"ipv6":{"prefixes":1}}` + "\n"},
		{"json", []string{"geo", "--data", csv, "--countries", "DE", "--invert", "--json"},
			`{"countries":["DE"],"invert":true,"data":["` + csv + `"],"ipv4":["10.0.0.0/23","10.0.3.0/25"],"ipv6":["2001:db8::/112"]}` + "\n"},
		{"json empty", []string{"geo", "--data", csv, "--countries", "JP", "--json"},
			`{"countries":["JP"],"invert":false,"data":["` + csv + `"],"ipv4":[],"ipv6":[]}` + "\n"},
		{"builtin count", []string{"geo", "--countries", "IT", "--count"},
			"ipv4: 10557 prefixes\nipv6: 3087 prefixes\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := run(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("ipfence %s\ngot:\n%s\nwant:\n%s", strings.Join(tc.args, " "), got, tc.want)
			}
		})
	}
}

func TestGeoCommandBuiltinJSON(t *testing.T) {
	got, err := run(t, "geo", "--countries", "IT", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Countries   []string `json:"countries"`
		Invert      bool     `json:"invert"`
		Data        []string `json:"data"`
		Attribution string   `json:"attribution"`
		IPv4        []string `json:"ipv4"`
		IPv6        []string `json:"ipv6"`
	}
	if err := json.Unmarshal([]byte(got), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.IPv4) != 10557 || len(doc.IPv6) != 3087 || doc.Attribution != geo.Attribution ||
		strings.Join(doc.Data, " ") != "builtin:country-ipv4.csv.gz builtin:country-ipv6.csv.gz" {
		t.Errorf("geo --countries IT --json: %d IPv4 and %d IPv6 prefixes, data %q, attribution %q; want 10557, 3087, the built-in files and %q",
			len(doc.IPv4), len(doc.IPv6), doc.Data, doc.Attribution, geo.Attribution)
	}
}

func TestGeoCommandErrors(t *testing.T) {
	bad := writeGeoFile(t, "bad.csv", "10.0.0.0,10.0.0.255,IT\n10.0.1.0,10.0.1.255,I1\n")
	csv := writeGeoFile(t, "geo.csv", geoCSV)
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool     // exit status 2
		want  []string // in the message
	}{
		{"unknown code", []string{"geo", "--countries", "IT,QQ"}, true, []string{`unknown country code "QQ"`}},
		{"UK", []string{"geo", "--countries", "uk"}, true, []string{`"UK"`, "did you mean GB?"}},
		{"malformed code", []string{"geo", "--data", csv, "--countries", "I1"}, true, []string{`unknown country code "I1"`, "two letters"}},
		{"no countries", []string{"geo"}, true, []string{"--countries"}},
		{"bad format", []string{"geo", "--countries", "IT", "--format", "csv"}, true, []string{`"csv"`}},
		{"rir without data", []string{"geo", "--countries", "IT", "--format", "rir-delegated"}, true, []string{"needs --data"}},
		{"bad row", []string{"geo", "--data", bad, "--countries", "IT"}, false, []string{bad + `:2: unknown country code "I1"`}},
		{"missing file", []string{"geo", "--data", bad + ".missing", "--countries", "IT"}, false, []string{"opening " + bad + ".missing", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.args...)
			if err == nil {
				t.Fatalf("ipfence %s succeeded, want an error", strings.Join(tc.args, " "))
			}
			if out != "" {
				t.Errorf("printed %q before failing", out)
			}
			var ue usageError
			if errors.As(err, &ue) != tc.usage {
				t.Errorf("error %v: usage error = %v, want %v", err, !tc.usage, tc.usage)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
