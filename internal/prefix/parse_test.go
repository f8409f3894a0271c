package prefix

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"go4.org/netipx"
)

func TestParseLine(t *testing.T) {
	tests := []struct {
		in   string
		want string // netipx.IPRange text; "" for a blank line
	}{
		// Blank and comments.
		{"", ""},
		{"   \t\r", ""},
		{"# comment", ""},
		{"; comment", ""},
		{"  # 1.2.3.4", ""},

		// IPv4 addresses, prefixes, ranges.
		{"1.2.3.4", "1.2.3.4-1.2.3.4"},
		{"  1.2.3.4\t\r", "1.2.3.4-1.2.3.4"},
		{"0.0.0.0", "0.0.0.0-0.0.0.0"},
		{"255.255.255.255", "255.255.255.255-255.255.255.255"},
		{"1.2.3.0/24", "1.2.3.0-1.2.3.255"},
		{"1.2.3.4/24", "1.2.3.0-1.2.3.255"}, // host bits: its network
		{"1.2.3.4/32", "1.2.3.4-1.2.3.4"},
		{"1.2.3.4/0", "0.0.0.0-255.255.255.255"},
		{"1.2.3.4/255.255.255.0", "1.2.3.0-1.2.3.255"},
		{"1.2.3.4/255.255.255.255", "1.2.3.4-1.2.3.4"},
		{"1.2.3.4/0.0.0.0", "0.0.0.0-255.255.255.255"},
		{"1.2.3.4-1.2.3.9", "1.2.3.4-1.2.3.9"},
		{"1.2.3.4 - 1.2.3.9", "1.2.3.4-1.2.3.9"},
		{"1.2.3.4\t-\t1.2.3.9", "1.2.3.4-1.2.3.9"},
		{"1.2.3.4-1.2.3.4", "1.2.3.4-1.2.3.4"},
		{"0.0.0.0-255.255.255.255", "0.0.0.0-255.255.255.255"},
		{"1.2.3.4/24 - 1.2.5.6/24", "1.2.3.0-1.2.5.255"},
		{"1.2.3.4/24-1.2.5.6", "1.2.3.0-1.2.5.6"},
		{"1.2.3.4 - 1.2.5.6/255.255.255.0", "1.2.3.4-1.2.5.255"},

		// Comments anywhere.
		{"1.2.3.4 # blocked 2024-01-01", "1.2.3.4-1.2.3.4"},
		{"1.2.3.4#x", "1.2.3.4-1.2.3.4"},
		{"1.2.3.4;x", "1.2.3.4-1.2.3.4"},
		{"1.2.3.0/24 ; spamhaus", "1.2.3.0-1.2.3.255"},
		{"1.2.3.4 - 1.2.3.9 # range", "1.2.3.4-1.2.3.9"},
		{"2001:db8::1 # v6", "2001:db8::1-2001:db8::1"},

		// IPv6.
		{"::", "::-::"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"2001:db8::/32", "2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"2001:db8::1/32", "2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"2001:db8::1/128", "2001:db8::1-2001:db8::1"},
		{"::/0", "::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"2001:DB8::A", "2001:db8::a-2001:db8::a"},
		{"2001:db8::1 - 2001:db8::9", "2001:db8::1-2001:db8::9"},
		{"2001:db8::/64-2001:db8:0:1::/64", "2001:db8::-2001:db8:0:1:ffff:ffff:ffff:ffff"},
		{"::ffff:1.2.3.4", "1.2.3.4-1.2.3.4"}, // IPv4-mapped is IPv4, as bans read it
		{"::ffff:1.2.3.4/120", "1.2.3.0-1.2.3.255"},
		{"::ffff:1.2.3.4-::ffff:1.2.3.9", "1.2.3.4-1.2.3.9"},
		{"::ffff:0:0/95", "::fffe:0:0-::ffff:255.255.255.255"}, // beyond ::ffff:0:0/96: IPv6
	}
	for _, tt := range tests {
		r, ok, err := ParseLine(tt.in)
		if err != nil {
			t.Errorf("ParseLine(%q): %v", tt.in, err)
			continue
		}
		if got := ""; ok != (tt.want != "") || ok && r.String() != tt.want {
			if ok {
				got = r.String()
			}
			t.Errorf("ParseLine(%q) = %q, %v; want %q", tt.in, got, ok, tt.want)
		}
	}
}

func TestParseLineErrors(t *testing.T) {
	tests := []struct {
		in, reason string // reason: a substring of the error
	}{
		{"foo", "hostnames are not resolved"},
		{"example.com", "hostnames are not resolved"},
		{"1.2.3", "four dotted decimal octets"},
		{"167772161", "four dotted decimal octets"}, // inet_aton's integer form
		{"1.2.3.4.5", "not an IP address"},
		{"1.2.3.256", "not an IP address"},
		{"1.2.3.-1", `"1.2.3." is not an IP address`}, // a range
		{"010.0.0.1", "leading zero"},                 // octal to iprange, decimal to others
		{"1.2.3.04", "leading zero"},
		{"1.2.3.4/33", "from 0 to 32"},
		{"1.2.3.4/-1", `prefix length ""`}, // a range from "1.2.3.4/"
		{"1.2.3.4/024", "from 0 to 32"},
		{"1.2.3.4/", "from 0 to 32"},
		{"1.2.3.4/2x", "from 0 to 32"},
		{"1.2.3.4/255.0.255.0", "netmask"}, // not contiguous
		{"1.2.3.4/255.255.255.256", "netmask"},
		{"/24", "no address before '/'"},
		{"1.2.3.4 1.2.3.5", "not an IP address"},
		{"1.2.3.4 foo", "not an IP address"},
		{"1.2.3.0 / 24", "not an IP address"},
		{"1.2.3.9-1.2.3.4", "ends at 1.2.3.4, before its start 1.2.3.9"},
		{"1.2.3.4-", "no last address"},
		{"-1.2.3.4", "no first address"},
		{"1.2.3.4-1.2.3.5-1.2.3.6", "not an IP address"},
		{"1.2.3.4-::1", "mixes IPv4 and IPv6"},
		{"::1-1.2.3.4", "mixes IPv4 and IPv6"},
		{"1.2.3.4,1.2.3.5", "not an IP address"},
		{"2001:db8::/129", "from 0 to 128"},
		{"2001:db8::/ffff::", "from 0 to 128"},
		{"fe80::1%eth0", "zone"},
		{"2001:db8:::1", "not an IPv6 address"},
		{"[2001:db8::1]", "not an IPv6 address"},
		{"2001:db8::9 - 2001:db8::1", "before its start"},
		{"1.2.3.4\x00", "not an IP address"},
		{"1.2.3.4\n5.6.7.8", "not an IP address"},
	}
	for _, tt := range tests {
		r, ok, err := ParseLine(tt.in)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("ParseLine(%q) = %v, %v, %v; want a *ParseError", tt.in, r, ok, err)
			continue
		}
		if ok || r != (netipx.IPRange{}) {
			t.Errorf("ParseLine(%q) = %v, %v with an error", tt.in, r, ok)
		}
		if !strings.Contains(err.Error(), tt.reason) {
			t.Errorf("ParseLine(%q) error %q does not say %q", tt.in, err, tt.reason)
		}
		if pe.File != "" || pe.Line != 0 || pe.Err == nil || errors.Unwrap(err) != pe.Err {
			t.Errorf("ParseLine(%q) error %#v: want no File and Line, and a reason", tt.in, pe)
		}
	}
}

func TestParseErrorFormat(t *testing.T) {
	reason := errors.New("why")
	tests := []struct {
		err  *ParseError
		want string
	}{
		{&ParseError{File: "list.txt", Line: 7, Text: "foo", Err: reason},
			`list.txt:7: cannot parse "foo": why (expected an IP address, CIDR prefix or first-last range)`},
		{&ParseError{Text: "a\tb", Err: reason},
			`cannot parse "a\tb": why (expected an IP address, CIDR prefix or first-last range)`},
		{&ParseError{Line: 3, Text: "x", Err: reason},
			`line 3: cannot parse "x": why (expected an IP address, CIDR prefix or first-last range)`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %s\nwant      %s", got, tt.want)
		}
		if !errors.Is(tt.err, reason) {
			t.Errorf("errors.Is(%v, reason) = false", tt.err)
		}
	}

	// The text of a huge line is cut.
	_, _, err := ParseLine(strings.Repeat("x", 10000))
	var pe *ParseError
	if !errors.As(err, &pe) || len(pe.Text) != maxErrText {
		t.Errorf("error about a 10000-byte line: %v", err)
	}
}

type readEntry struct {
	r    string
	line int
}

func readAll(t *testing.T, in io.Reader, file string) ([]readEntry, error) {
	t.Helper()
	var got []readEntry
	err := Read(in, file, func(r netipx.IPRange, line int) { got = append(got, readEntry{r.String(), line}) })
	return got, err
}

func TestRead(t *testing.T) {
	in := "\uFEFF# FireHOL-style header\r\n" +
		"1.2.3.4\r\n" +
		"\n" +
		"10.0.0.0/8 ; private\n" +
		"  2001:db8::/127\n" +
		"5.6.7.8-5.6.7.9" // no final newline
	got, err := readAll(t, strings.NewReader(in), "list.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := []readEntry{
		{"1.2.3.4-1.2.3.4", 2},
		{"10.0.0.0-10.255.255.255", 4},
		{"2001:db8::-2001:db8::1", 5},
		{"5.6.7.8-5.6.7.9", 6},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Read = %v\nwant %v", got, want)
	}

	// A BOM on the first line only.
	if _, err := readAll(t, strings.NewReader("\uFEFF1.2.3.4"), "bom.txt"); err != nil {
		t.Errorf("BOM then address: %v", err)
	}
	if _, err := readAll(t, strings.NewReader("1.2.3.4\n\uFEFF1.2.3.4"), "bom.txt"); err == nil {
		t.Errorf("BOM on line 2: no error")
	}
}

func TestReadError(t *testing.T) {
	in := "1.2.3.4\n# ok\n5.6.7.8\n1.2.3.256 # typo\n9.9.9.9\n"
	got, err := readAll(t, strings.NewReader(in), "feeds/bad.netset")
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Read = %v, want a *ParseError", err)
	}
	if pe.File != "feeds/bad.netset" || pe.Line != 4 || pe.Text != "1.2.3.256" {
		t.Errorf("ParseError = %+v, want feeds/bad.netset line 4 text 1.2.3.256", pe)
	}
	want := `feeds/bad.netset:4: cannot parse "1.2.3.256": "1.2.3.256" is not an IP address (expected an IP address, CIDR prefix or first-last range)`
	if err.Error() != want {
		t.Errorf("error:\n got %s\nwant %s", err, want)
	}
	if len(got) != 2 { // entries before the error were passed on, none after
		t.Errorf("entries before the error: %v", got)
	}

	// A line too long to read is a ParseError too, after the lines before it.
	long := "1.2.3.4\n" + strings.Repeat("#", maxLine+1) + "\n5.6.7.8\n"
	got, err = readAll(t, strings.NewReader(long), "long.txt")
	if !errors.As(err, &pe) || pe.Line != 2 || len(got) != 1 {
		t.Errorf("over-long line: %v, %v", got, err)
	}
	// A long comment is fine.
	if _, err := readAll(t, strings.NewReader("#"+strings.Repeat("x", maxLine/2)+"\n1.2.3.4\n"), "c.txt"); err != nil {
		t.Errorf("long comment: %v", err)
	}

	// The reader's error is returned, naming the file.
	boom := errors.New("boom")
	_, err = readAll(t, io.MultiReader(strings.NewReader("1.2.3.4\n"), iotest.ErrReader(boom)), "pipe")
	if !errors.Is(err, boom) || errors.As(err, &pe) || !strings.Contains(err.Error(), "pipe") {
		t.Errorf("reader error: %v", err)
	}
}

func TestReadSet(t *testing.T) {
	s, err := ReadSet(strings.NewReader("10.0.0.0/9\n10.128.0.0/9\n::1\n::/128\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.IPSet().Prefixes(); len(got) != 2 || got[0].String() != "10.0.0.0/8" || got[1].String() != "::/127" {
		t.Errorf("ReadSet = %v", got)
	}
	if s, err := ReadSet(strings.NewReader("10.0.0.0/9\nnope\n"), "x"); s != nil || err == nil {
		t.Errorf("ReadSet of bad input = %v, %v; want nil and an error", s, err)
	}
}
