package prefix

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"go4.org/netipx"
)

// fuzzSeeds are the seed corpus of both fuzz tests: every form the parser
// knows, valid or not.
var fuzzSeeds = []string{
	"", " ", "# c", "; c", "1.2.3.4", " 1.2.3.4 ", "1.2.3.4\r", "0.0.0.0", "255.255.255.255",
	"1.2.3.0/24", "1.2.3.4/24", "1.2.3.4/0", "1.2.3.4/32", "1.2.3.4/33", "1.2.3.4/024",
	"1.2.3.4/255.255.255.0", "1.2.3.4/255.0.255.0", "1.2.3.4-1.2.3.9", "1.2.3.4 - 1.2.3.9",
	"1.2.3.9-1.2.3.4", "1.2.3.4/24 - 1.2.5.0/24", "1.2.3.4 # x", "1.2.3.4;x", "1.2.3.4-",
	"-1.2.3.4", "1.2.3.4-1.2.3.5-1.2.3.6", "010.0.0.1", "1.2.3", "1.2.3.4.5", "1.2.3.256",
	"167772161", "foo", "1.2.3.4 foo", "1.2.3.4-::1", "::", "::/0", "2001:db8::/32",
	"2001:db8::1/32", "2001:db8::1-2001:db8::9", "2001:db8::9-2001:db8::1", "fe80::1%eth0",
	"::ffff:1.2.3.4", "::ffff:1.2.3.4/120", "2001:db8::/129", "[::1]", "/24", "1.2.3.4/",
	"\uFEFF1.2.3.4", "1.2.3.4\n5.6.7.8", "1.2.3.4\x00", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
}

// FuzzParseLine checks that ParseLine never panics, returns valid ranges or
// a *ParseError, agrees with itself on []byte, with its general path
// where the fast path answers, with its own output written back, and with
// netip.ParseAddr on single addresses.
func FuzzParseLine(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, ok, err := ParseLine(s)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || ok || pe.Err == nil || len(pe.Text) > maxErrText {
				t.Fatalf("ParseLine(%q) = %v, %v, %#v", s, r, ok, err)
			}
		}
		if ok && (!r.IsValid() || r.From().Zone() != "") {
			t.Fatalf("ParseLine(%q) = invalid range %v", s, r)
		}

		// The []byte instance agrees.
		e, ok2, err2 := parseLine([]byte(s))
		if ok2 != ok || (err == nil) != (err2 == nil) || ok && e.ipRange() != r || err != nil && err.Error() != err2.Error() {
			t.Fatalf("ParseLine(%q) = %v, %v, %v; on []byte: %v, %v, %v", s, r, ok, err, e.ipRange(), ok2, err2)
		}
		// The fast path agrees with the general one.
		if fe, fok := parseFast4(s); fok {
			ge, gok, gerr := parseAny(s)
			if !gok || gerr != nil || ge != fe {
				t.Fatalf("%q: fast path %v, general path %v, %v, %v", s, fe.ipRange(), ge.ipRange(), gok, gerr)
			}
		}
		if !ok {
			return
		}
		// Writing the result back reads the same.
		for _, back := range []string{r.From().String() + "-" + r.To().String(), r.From().String() + " - " + r.To().String() + " # again"} {
			if r2, ok, err := ParseLine(back); !ok || err != nil || r2 != r {
				t.Fatalf("ParseLine(%q) = %v, but ParseLine(%q) = %v, %v, %v", s, r, back, r2, ok, err)
			}
		}
		if p, isPrefix := r.Prefix(); isPrefix {
			if r2, ok, err := ParseLine(p.String()); !ok || err != nil || r2 != r {
				t.Fatalf("ParseLine(%q) = %v, but ParseLine(%q) = %v, %v, %v", s, r, p, r2, ok, err)
			}
		}
	})
}

// FuzzParseAddr checks single addresses against netip.ParseAddr: the same
// addresses, except the zones and the IPv4 forms the package rejects.
func FuzzParseAddr(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsAny(s, "-#;/ \t\r\n\v\f") {
			return // not a single address
		}
		r, ok, _ := ParseLine(s)
		a, err := netip.ParseAddr(s)
		want := err == nil && a.Zone() == ""
		a = a.Unmap() // mapped addresses are read as IPv4
		if ok != want || ok && (r.From() != a || r.To() != a) {
			t.Fatalf("ParseLine(%q) = %v, %v; netip.ParseAddr = %v, %v", s, r, ok, a, err)
		}
	})
}

// FuzzRead checks Read against ParseLine applied to each line.
func FuzzRead(f *testing.F) {
	f.Add(strings.Join(fuzzSeeds[:10], "\n"))
	f.Add("\uFEFF1.2.3.4\r\n\r\n2001:db8::/64 # x\n1.2.3.4-1.2.3.5")
	f.Add("1.2.3.4\nfoo\n5.6.7.8\n")
	f.Fuzz(func(t *testing.T, data string) {
		type item struct {
			r    netipx.IPRange
			line int
		}
		var got []item
		err := Read(strings.NewReader(data), "f", func(r netipx.IPRange, line int) { got = append(got, item{r, line}) })

		var want []item
		var wantErr error
		lines := strings.Split(data, "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		for i, l := range lines {
			l = strings.TrimSuffix(l, "\r")
			if i == 0 {
				l = strings.TrimPrefix(l, "\uFEFF")
			}
			r, ok, err := ParseLine(l)
			if err != nil {
				pe := err.(*ParseError)
				pe.File, pe.Line = "f", i+1
				wantErr = pe
				break
			}
			if ok {
				want = append(want, item{r, i + 1})
			}
		}
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("Read error %v, want %v", err, wantErr)
		}
		if len(got) != len(want) {
			t.Fatalf("Read gave %d entries, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("entry %d = %v, want %v", i, got[i], want[i])
			}
		}

		// Builder.Read takes the same entries.
		var b, ref Builder
		berr := b.Read(bytes.NewReader([]byte(data)), "f")
		for _, it := range got {
			ref.AddRange(it.r)
		}
		s1, _ := b.Build()
		s2, _ := ref.Build()
		if (berr == nil) != (err == nil) || !s1.Equal(s2) {
			t.Fatalf("Builder.Read = %v, %v; Read gave %v", s1.Ranges(), berr, s2.Ranges())
		}
	})
}
