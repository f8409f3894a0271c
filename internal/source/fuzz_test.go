package source

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ipfence/ipfence/internal/prefix"
)

// The fuzz targets check, for any input: no panic; a failure is a parse
// error naming the file and a line of the input; a success reads the same
// rows from the gzipped input, every row is in Set and in the set of its
// country, and Explain finds it.

func FuzzCountryCSV(f *testing.F) {
	for _, s := range []string{
		"1.0.0.0,1.0.0.255,AU\n2001:200::,2001:218:2000:51:ffff:ffff:ffff:ffff,JP\n",
		"# c\n\n 1.0.1.0 , 1.0.3.255 , cn # x\r\n",
		"1.0.0.0/24,AU\n1.0.4.7/22,AU\n2001:db8::/32,EU\n1.2.3.4,IT\n5.5.5.0-5.5.5.9,IT\n",
		"\uFEFF0.0.0.0,255.255.255.255,ZZ\n::,ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff,ZZ\n",
		"1.2.3,1.2.3.9,IT\n", "1.2.3.9,1.2.3.0,IT\n", "1.2.3.0,::1,IT\n", "1.0.0.0,1.0.0.255,Q1\n",
		"fe80::1%eth0,fe80::2,IT\n", "::ffff:1.2.3.4,::ffff:1.2.3.5,IT\n", ",IT\n", "a,b,c,d\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) { checkFuzz(t, FormatCountryCSV, in) })
}

func FuzzRIRDelegated(f *testing.F) {
	for _, s := range []string{
		"2|ripencc|20260101|5|19830705|20260101|+0100\nripencc|*|ipv4|*|3|summary\n" +
			"ripencc|IT|ipv4|2.32.0.0|1048576|20100715|allocated\nripencc|DE|ipv4|10.0.0.0|768|20100715|assigned|abc|e-stats\n" +
			"ripencc|IT|asn|3269|1|19940101|allocated\nripencc||ipv4|11.0.0.0|256||available\n" +
			"ripencc|EU|ipv6|2001:db8::|32|19990826|allocated\n",
		"apnic|AU|ipv4|255.255.255.0|256|20100715|allocated\n",
		"apnic|AU|ipv4|255.255.255.0|257|20100715|allocated\n",
		"apnic|AU|ipv6|::|0|20100715|allocated\n",
		"apnic|AU|ipv6|2001:db8::1|32|20100715|allocated\n",
		"apnic|AU|ipv4|1.0.0.0|0|20100715|allocated\n",
		"apnic|A|ipv4|1.0.0.0|1|20100715|allocated\n",
		"apnic|AU|ipv4\n", "|||||||\n", "1.2|x\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) { checkFuzz(t, FormatRIRDelegated, in) })
}

func FuzzASNCSV(f *testing.F) {
	for _, s := range []string{
		"start_ip,end_ip,asn,name\n1.0.0.0,1.0.0.255,13335,CLOUDFLARENET\n2001:200::/32,AS2500,\"WIDE, Project\"\n",
		"1.0.0.0/24,0,Not routed\n1.2.3.4,as1\n5.5.5.0-5.5.5.9,4294967295,x\n",
		"1.2.3.0/24,AS\n", "1.2.3.9,1.2.3.0,1\n", "1.2.3.0,::1,1\n", "1.0.0.0/24\n", ",1\n", "a,b,c,d\n",
		"1.0.0.0/24,1,\x00\xff\"\"\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) { checkFuzz(t, FormatASNCSV, in) })
}

func FuzzList(f *testing.F) {
	for _, s := range []string{
		"#\n1.2.3.4\n10.0.0.0/8 # c\n192.0.2.10 - 192.0.2.20\n2001:db8::/32\n",
		"1.2.3\n", "0.0.0.0/0\n::/0\n", "1.2.3.4/255.255.0.0\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) { checkFuzz(t, FormatList, in) })
}

func checkFuzz(t *testing.T, format, in string) {
	src, err := fromBytes(format, []byte(in))
	if err != nil {
		line := 0
		var pe *ParseError
		var ppe *prefix.ParseError
		switch {
		case errors.As(err, &pe):
			line = pe.Line
		case errors.As(err, &ppe):
			line = ppe.Line
		default:
			t.Fatalf("error %v is not a parse error", err)
		}
		if lines := strings.Count(in, "\n") + 1; line < 1 || line > lines {
			t.Fatalf("error %v names line %d of %d", err, line, lines)
		}
		if !strings.HasPrefix(err.Error(), "f0:"+strconv.Itoa(line)+": ") {
			t.Fatalf("error %q does not start with f0:%d: ", err, line)
		}
		return
	}
	z, err := fromBytes(format, gzipped([]byte(in)))
	if err != nil {
		t.Fatalf("plain input reads, gzipped fails: %v", err)
	}
	got := rows(src)
	if !slices.Equal(got, rows(z)) {
		t.Fatalf("gzipped input reads differently:\n%v\n%v", got, rows(z))
	}
	{
		for m := range src.allMatches {
			if !src.Set().IPSet().ContainsRange(m.Range) {
				t.Fatalf("row %v not in Set", m)
			}
			if m.ASN != 0 {
				as, err := src.ASNs([]uint32{m.ASN}, false)
				if err != nil || !as.IPSet().ContainsRange(m.Range) {
					t.Fatalf("row %v not in ASNs(%d): %v", m, m.ASN, err)
				}
				if len(m.Org) > maxOrgName || !utf8.ValidString(m.Org) {
					t.Fatalf("row %v: organisation of %d bytes, or not UTF-8", m, len(m.Org))
				}
			}
			if m.Country != "" {
				cs, err := src.Countries([]string{m.Country}, false)
				if err != nil || !cs.IPSet().ContainsRange(m.Range) {
					t.Fatalf("row %v not in Countries(%s): %v", m, m.Country, err)
				}
			}
			if !slices.Contains(src.Explain(m.Range.From()), m) || !slices.Contains(src.Explain(m.Range.To()), m) {
				t.Fatalf("Explain does not find row %v", m)
			}
		}
	}
}

// allMatches yields every row of s as a Match.
func (s *Source) allMatches(yield func(m Match) bool) {
	for e := range s.v4.all() {
		if !yield(s.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line)) {
			return
		}
	}
	for e := range s.v6.all() {
		if !yield(s.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line)) {
			return
		}
	}
}
