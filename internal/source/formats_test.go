package source

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

func TestFormats(t *testing.T) {
	for _, tc := range []struct {
		name, format, in string
		want             []string // rows(src)
		errLine          int      // a *ParseError (*prefix.ParseError for lists) at this line
		errText          string   // in the error message
	}{
		// country-csv
		{
			name: "csv ranges", format: FormatCountryCSV,
			in: "\uFEFF# header comment\n" +
				"1.0.0.0,1.0.0.255,AU\n" +
				"\n" +
				"  1.0.1.0 , 1.0.3.255 , cn  # trailing comment\r\n" +
				"2001:200::,2001:218:2000:51:ffff:ffff:ffff:ffff,JP\n" +
				"9.9.9.9,9.9.9.9,ZZ\n",
			want: []string{
				"f0:2 1.0.0.0-1.0.0.255 AU",
				"f0:4 1.0.1.0-1.0.3.255 CN",
				"f0:5 2001:200::-2001:218:2000:51:ffff:ffff:ffff:ffff JP",
				"f0:6 9.9.9.9-9.9.9.9 ZZ",
			},
		},
		{
			name: "csv cidr", format: FormatCountryCSV,
			in: "1.0.0.0/24,AU\n1.0.4.7/22,AU\n2001:db8::/32,EU\n1.2.3.4,IT\n5.5.5.0-5.5.5.9,IT\n",
			want: []string{
				"f0:1 1.0.0.0-1.0.0.255 AU",
				"f0:2 1.0.4.0-1.0.7.255 AU", // host bits: the whole network, as in lists
				"f0:3 2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff EU",
				"f0:4 1.2.3.4-1.2.3.4 IT",
				"f0:5 5.5.5.0-5.5.5.9 IT",
			},
		},
		{name: "csv empty", format: FormatCountryCSV, in: "# nothing\n\n", want: []string{}},
		{name: "csv one field", format: FormatCountryCSV, in: "1.0.0.0,1.0.0.255,AU\n1.0.0.0\n", errLine: 2, errText: `cannot parse "1.0.0.0": 1 comma-separated fields`},
		{name: "csv four fields", format: FormatCountryCSV, in: "1.0.0.0,1.0.0.255,AU,x\n", errLine: 1, errText: "more than 3"},
		{name: "csv bad first", format: FormatCountryCSV, in: "1.2.3,1.2.3.9,IT\n", errLine: 1, errText: `first address "1.2.3" is not an IP address`},
		{name: "csv bad last", format: FormatCountryCSV, in: "\n\n1.2.3.0,x,IT\n", errLine: 3, errText: `last address "x"`},
		{name: "csv mixed families", format: FormatCountryCSV, in: "1.2.3.0,::1,IT\n", errLine: 1, errText: "mixes IPv4 and IPv6"},
		{name: "csv reversed", format: FormatCountryCSV, in: "1.2.3.9,1.2.3.0,IT\n", errLine: 1, errText: "ends (1.2.3.0) before it starts (1.2.3.9)"},
		{name: "csv zone", format: FormatCountryCSV, in: "fe80::1%eth0,fe80::2,IT\n", errLine: 1, errText: "zone"},
		{name: "csv bad code", format: FormatCountryCSV, in: "1.0.0.0,1.0.0.255,AU\n1.0.1.0,1.0.1.255,Q1\n", errLine: 2, errText: `f0:2: unknown country code "Q1"`},
		{name: "csv long code", format: FormatCountryCSV, in: "1.0.0.0,1.0.0.255,ITA\n", errLine: 1, errText: `unknown country code "ITA"`},
		{name: "csv no code", format: FormatCountryCSV, in: "1.0.0.0,1.0.0.255,\n", errLine: 1, errText: `unknown country code ""`},
		{name: "csv bad cidr", format: FormatCountryCSV, in: "1.0.0.0/33,IT\n", errLine: 1, errText: `prefix length "33"`},
		{name: "csv no address", format: FormatCountryCSV, in: ",IT\n", errLine: 1, errText: "no address"},

		// rir-delegated
		{
			name: "rir", format: FormatRIRDelegated,
			in: "# comment\n" +
				"2|ripencc|20260101|5|19830705|20260101|+0100\n" +
				"ripencc|*|ipv4|*|3|summary\n" +
				"ripencc|*|asn|*|1|summary\n" +
				"ripencc|IT|ipv4|2.32.0.0|1048576|20100715|allocated\n" +
				"ripencc|DE|ipv4|10.0.0.0|768|20100715|assigned|abc123|e-stats\n" +
				"ripencc|IT|asn|3269|1|19940101|allocated\n" +
				"ripencc||ipv4|11.0.0.0|256||available\n" +
				"ripencc|ZZ|ipv4|12.0.0.0|256||reserved\n" +
				"ripencc|EU|ipv6|2001:db8::|32|19990826|ALLOCATED\n" +
				"ripencc|it|ipv4|255.255.255.0|256|20100715|allocated\n",
			want: []string{
				"f0:5 2.32.0.0-2.47.255.255 IT",
				"f0:6 10.0.0.0-10.0.2.255 DE", // not a power of two
				"f0:10 2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff EU",
				"f0:11 255.255.255.0-255.255.255.255 IT",
			},
		},
		{name: "rir too few fields", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|2.32.0.0|256\n", errLine: 1, errText: "5 '|'-separated fields"},
		{name: "rir bad type", format: FormatRIRDelegated, in: "ripencc|IT|ipv5|2.32.0.0|256|20100715|allocated\n", errLine: 1, errText: `type "ipv5"`},
		{name: "rir bad status", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|2.32.0.0|256|20100715|taken\n", errLine: 1, errText: `status "taken"`},
		{name: "rir zero count", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|2.32.0.0|0|20100715|allocated\n", errLine: 1, errText: `ipv4 value "0"`},
		{name: "rir count overflows", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|255.255.255.0|257|20100715|allocated\n", errLine: 1, errText: `ipv4 value "257"`},
		{name: "rir huge count", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|0.0.0.0|18446744073709551615|20100715|allocated\n", errLine: 1, errText: "ipv4 value"},
		{name: "rir v6 length", format: FormatRIRDelegated, in: "ripencc|IT|ipv6|2001:db8::|129|20100715|allocated\n", errLine: 1, errText: `ipv6 value "129"`},
		{name: "rir v6 unaligned", format: FormatRIRDelegated, in: "ripencc|IT|ipv6|2001:db8::1|32|20100715|allocated\n", errLine: 1, errText: "not the first address of a /32"},
		{name: "rir family", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|2001:db8::|32|20100715|allocated\n", errLine: 1, errText: "not an ipv4 address"},
		{name: "rir bad start", format: FormatRIRDelegated, in: "ripencc|IT|ipv4|2.32.0|256|20100715|allocated\n", errLine: 1, errText: `start address "2.32.0"`},
		{name: "rir bad code", format: FormatRIRDelegated, in: "ripencc|I1|ipv4|2.32.0.0|256|20100715|allocated\n", errLine: 1, errText: `f0:1: unknown country code "I1"`},
		{name: "rir no code", format: FormatRIRDelegated, in: "ripencc||ipv4|2.32.0.0|256|20100715|allocated\n", errLine: 1, errText: `unknown country code ""`},

		// list
		{
			name: "list", format: FormatList,
			in: "#\n# FireHOL netset\n#\n1.2.3.4\n10.0.0.0/8 # comment\n192.0.2.10 - 192.0.2.20\n2001:db8::/32\n",
			want: []string{
				"f0:4 1.2.3.4-1.2.3.4",
				"f0:5 10.0.0.0-10.255.255.255",
				"f0:6 192.0.2.10-192.0.2.20",
				"f0:7 2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
			},
		},
		{name: "list bad", format: FormatList, in: "1.2.3.4\n\n1.2.3\n", errLine: 3, errText: `f0:3: cannot parse "1.2.3"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, gz := range []bool{false, true} {
				in := []byte(tc.in)
				if gz {
					in = gzipped(in)
				}
				src, err := fromBytes(tc.format, in)
				if tc.errLine != 0 {
					line := 0
					var pe *ParseError
					var ppe *prefix.ParseError
					switch {
					case errors.As(err, &pe):
						line = pe.Line
					case errors.As(err, &ppe):
						line = ppe.Line
					}
					if line != tc.errLine || !strings.Contains(err.Error(), tc.errText) {
						t.Fatalf("gzip %v: error %v at line %d, want a parse error at line %d containing %q", gz, err, line, tc.errLine, tc.errText)
					}
					continue
				}
				if err != nil {
					t.Fatalf("gzip %v: %v", gz, err)
				}
				if got := rows(src); !slices.Equal(got, tc.want) {
					t.Errorf("gzip %v: rows:\n%s\nwant:\n%s", gz, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
			}
		})
	}
}

// TestLoadErrors checks the errors of Loader.Load before any row is read.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	list := writeFile(t, dir, "drop.txt", []byte("1.2.3.4\n"))
	bad := writeFile(t, dir, "bad.txt", []byte("1.2.3.4\n\n1.2.3\n"))
	for _, tc := range []struct {
		name     string
		stateDir string
		spec     Spec
		spec2    bool // a *SpecError
		want     string
	}{
		{"no name", "", Spec{Format: FormatList, Paths: []string{list}}, true, "source name"},
		{"bad name", "", Spec{Name: "../x", Format: FormatList, Paths: []string{list}}, true, "source name"},
		{"dot name", "", Spec{Name: ".x", Format: FormatList, Paths: []string{list}}, true, "source name"},
		{"bad format", "", Spec{Name: "feeds", Format: "csv", Paths: []string{list}}, true, `unknown format "csv"`},
		{"nothing", "", Spec{Name: "feeds", Format: FormatList}, true, "nothing to read"},
		{"builtin list", "", Spec{Name: "feeds", Format: FormatList, Paths: []string{"builtin:country-ipv4.csv.gz"}}, true, "has format country-csv"},
		{"unknown builtin", "", Spec{Name: "geo", Format: FormatCountryCSV, Paths: []string{"builtin:x.csv"}}, true, `unknown embedded file "builtin:x.csv"`},
		{"bad url", "/tmp", Spec{Name: "feeds", Format: FormatList, URLs: []string{"ftp://example.com/x"}}, true, "not an http or https URL"},
		{"url without state", "", Spec{Name: "feeds", Format: FormatList, URLs: []string{"https://example.com/x"}}, true, "state directory"},
		{"missing file", "", Spec{Name: "feeds", Format: FormatList, Paths: []string{list, filepath.Join(dir, "gone.txt")}}, false,
			"source feeds: opening " + filepath.Join(dir, "gone.txt") + ": no such file or directory"},
		{"bad line", "", Spec{Name: "feeds", Format: FormatList, Paths: []string{list, bad}}, false,
			"source feeds: " + bad + `:3: cannot parse "1.2.3"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Loader{StateDir: tc.stateDir}
			src, err := l.Load(context.Background(), tc.spec)
			if err == nil {
				t.Fatalf("Load succeeded: %v", src)
			}
			var se *SpecError
			if errors.As(err, &se) != tc.spec2 || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q (SpecError: %v), want one containing %q (SpecError: %v)", err, !tc.spec2, tc.want, tc.spec2)
			}
		})
	}
	l := Loader{}
	_, err := l.Load(context.Background(), Spec{Name: "feeds", Format: FormatList, Paths: []string{filepath.Join(dir, "gone.txt")}})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v is not fs.ErrNotExist", err)
	}
}

// TestListSource checks what a list source can and cannot do.
func TestListSource(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a.txt", []byte("10.0.0.0/24\n10.0.1.0/24\n2001:db8::/48\n"))
	b := writeFile(t, dir, "b.txt.gz", gzipped([]byte("10.0.0.128/25\n")))
	var l Loader
	src, err := l.Load(context.Background(), Spec{Name: "feeds", Format: FormatList, Paths: []string{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	if src.Name() != "feeds" || src.Format() != FormatList || src.IsCountry() {
		t.Errorf("Name, Format, IsCountry = %q, %q, %v", src.Name(), src.Format(), src.IsCountry())
	}
	if v4, v6 := src.Prefixes(); v4 != 1 || v6 != 1 {
		t.Errorf("Prefixes() = %d, %d; want 1, 1 (10.0.0.0/23, 2001:db8::/48)", v4, v6)
	}
	if _, err := src.Countries([]string{"IT"}, false); !errors.Is(err, ErrNotCountry) {
		t.Errorf("Countries on a list: error %v, want ErrNotCountry", err)
	}
	got := src.Explain(mustAddr("10.0.0.200"))
	if len(got) != 2 || got[0].Origin != a+":1" || got[1].Origin != b+":1" || got[0].Country != "" {
		t.Errorf("Explain(10.0.0.200) = %+v, want %s:1 then %s:1", got, a, b)
	}
	if stale, err := src.Stale(); stale || err != nil {
		t.Errorf("Stale() = %v, %v for a file source", stale, err)
	}
}

// TestLongLines checks that lines near the limit read, and longer ones
// fail naming their line.
func TestLongLines(t *testing.T) {
	pad := strings.Repeat(" ", maxLine-100)
	in := "1.0.0.0,1.0.0.255,AU\n" + pad + "1.0.1.0,1.0.1.255,AU\n" + "1.0.2.0,1.0.2.255,AU" + pad + pad + "\n"
	_, err := fromBytes(FormatCountryCSV, []byte(in))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 3 || !strings.Contains(err.Error(), "f0:3: ") {
		t.Errorf("error %v, want a *ParseError at line 3", err)
	}
	src, err := fromBytes(FormatCountryCSV, []byte(in[:strings.LastIndex(in, "1.0.2.0")]))
	if err != nil {
		t.Fatal(err)
	}
	if got := rows(src); len(got) != 2 || got[1] != "f0:2 1.0.1.0-1.0.1.255 AU" {
		t.Errorf("rows %v", got)
	}
}
