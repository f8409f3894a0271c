package source

import (
	"context"
	"net/netip"
	"testing"
)

// BenchmarkLoadEmbedded loads both embedded files: decompressing, parsing
// 550k rows, sorting them and building the set of everything.
func BenchmarkLoadEmbedded(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var l Loader
		if _, err := l.Load(context.Background(), embeddedSpec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCountriesItaly builds the set of one country.
func BenchmarkCountriesItaly(b *testing.B) {
	src := loadEmbedded(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := src.Countries([]string{"IT"}, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCountriesOutsideEurope builds the largest set: every country
// but 52.
func BenchmarkCountriesOutsideEurope(b *testing.B) {
	src := loadEmbedded(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := src.Countries(europe, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExplain looks up one address among the 334k IPv4 rows.
func BenchmarkExplain(b *testing.B) {
	src := loadEmbedded(b)
	addr := netip.MustParseAddr("151.1.1.1")
	b.ReportAllocs()
	for b.Loop() {
		if len(src.Explain(addr)) == 0 {
			b.Fatal("no match")
		}
	}
}
