package source

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/prefix"
)

// europe is the list of 52 codes of data/geo/README.md.
var europe = strings.Fields(`AD AL AT AX BA BE BG BY CH CY CZ DE DK EE ES FI FO FR GB
	GG GI GR HR HU IE IM IS IT JE LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE
	SI SK SM UA VA XK`)

var embeddedSpec = Spec{
	Name:   "geo",
	Format: FormatCountryCSV,
	Paths:  []string{BuiltinPrefix + geo.IPv4, BuiltinPrefix + geo.IPv6},
}

var (
	embeddedOnce sync.Once
	embeddedSrc  *Source
	embeddedErr  error
)

// loadEmbedded loads the embedded data once for all tests.
func loadEmbedded(t testing.TB) *Source {
	t.Helper()
	embeddedOnce.Do(func() {
		var l Loader
		embeddedSrc, embeddedErr = l.Load(context.Background(), embeddedSpec)
	})
	if embeddedErr != nil {
		t.Fatal(embeddedErr)
	}
	return embeddedSrc
}

// TestEmbeddedReference checks the figures of data/geo/README.md, which
// were measured with Python's ipaddress module.
func TestEmbeddedReference(t *testing.T) {
	if len(europe) != 52 {
		t.Fatalf("europe has %d codes, want 52", len(europe))
	}
	src := loadEmbedded(t)
	if r4, r6 := src.Rows(); r4 != 334373 || r6 != 216295 {
		t.Errorf("Rows() = %d, %d; want 334373, 216295 (data/geo/README.md)", r4, r6)
	}
	lower := make([]string, len(europe))
	for i, c := range europe {
		lower[i] = strings.ToLower(c)
	}
	for _, tc := range []struct {
		name     string
		codes    []string
		invert   bool
		want4    int
		want6    int
		contains []string
		excludes []string
	}{
		{"Italy", []string{"IT"}, false, 10557, 3087, nil, nil},
		{"italy lower case", []string{"it"}, false, 10557, 3087, nil, nil},
		{"outside Europe", europe, true, 95452, 100833, nil, nil},
		{"Europe", europe, false, 84738, 115781, nil, nil},
		{"Europe lower case", lower, false, 84738, 115781, nil, nil},
		{"nothing", nil, false, 0, 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := src.Countries(tc.codes, tc.invert)
			if err != nil {
				t.Fatal(err)
			}
			if v4, v6 := prefix.Count(set); v4 != tc.want4 || v6 != tc.want6 {
				t.Errorf("Countries(%d codes, invert=%v) has %d IPv4 and %d IPv6 prefixes, want %d and %d",
					len(tc.codes), tc.invert, v4, v6, tc.want4, tc.want6)
			}
		})
	}
}

func TestEmbeddedExplain(t *testing.T) {
	src := loadEmbedded(t)
	// First row of each file (data/geo/README.md).
	got := src.Explain(netip.MustParseAddr("1.0.0.7"))
	if len(got) != 1 || got[0].Origin != "country-ipv4.csv.gz:1" || got[0].Country != "AU" ||
		got[0].Range.String() != "1.0.0.0-1.0.0.255" {
		t.Errorf("Explain(1.0.0.7) = %+v, want the first row of country-ipv4.csv.gz, AU", got)
	}
	got = src.Explain(netip.MustParseAddr("2001:2::1"))
	if len(got) != 1 || got[0].Origin != "country-ipv6.csv.gz:1" || got[0].Country != "JP" {
		t.Errorf("Explain(2001:2::1) = %+v, want the first row of country-ipv6.csv.gz, JP", got)
	}
	if got := src.Explain(netip.MustParseAddr("10.1.2.3")); len(got) != 0 {
		t.Errorf("Explain(10.1.2.3) = %+v, want nothing (private address)", got)
	}
}

// TestEmbeddedCodes checks that every code of the data is accepted by a
// query, and that all but the withdrawn AN are ISO 3166-1 codes.
func TestEmbeddedCodes(t *testing.T) {
	src := loadEmbedded(t)
	n := 0
	for i, ok := range src.present {
		if !ok {
			continue
		}
		n++
		code := codeString(uint16(i))
		if !IsCountryCode(code) && code != "AN" {
			t.Errorf("data code %s is not ISO 3166-1 alpha-2", code)
		}
		if _, err := src.Countries([]string{code}, false); err != nil {
			t.Errorf("Countries(%s): %v", code, err)
		}
	}
	if n < 240 {
		t.Errorf("only %d distinct codes in the data", n)
	}
	var uc *UnknownCountryError
	if _, err := src.Countries([]string{"IT", "UK"}, false); !errors.As(err, &uc) || uc.Code != "UK" ||
		!strings.Contains(err.Error(), "did you mean GB?") {
		t.Errorf("Countries(UK) error = %v, want *UnknownCountryError suggesting GB", err)
	}
}
