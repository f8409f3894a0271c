package source

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
)

// BenchmarkLoadEmbedded loads both embedded files: decompressing, parsing
// 550k rows, sorting them and building the set of everything.
// It also reports the heap the loaded source keeps (retained-B).
func BenchmarkLoadEmbedded(b *testing.B) {
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var src *Source
	for b.Loop() {
		var l Loader
		var err error
		if src, err = l.Load(context.Background(), embeddedSpec); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "retained-B")
	runtime.KeepAlive(src)
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
