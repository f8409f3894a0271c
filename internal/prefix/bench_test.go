package prefix

import (
	"bytes"
	"io"
	"slices"
	"testing"

	"go4.org/netipx"
)

// BenchmarkAggregate* measure the whole of `ipfence aggregate` on ~400k
// lines, from text in memory to text out: Read, Build, WriteCIDRs.

func BenchmarkAggregateSynthetic400k(b *testing.B) {
	benchAggregate(b, synthetic(400_000, 1, true))
}

func BenchmarkAggregateSynthetic400kIPv4(b *testing.B) {
	benchAggregate(b, synthetic(400_000, 1, false))
}

func BenchmarkAggregateCountry(b *testing.B) {
	benchAggregate(b, countryRanges(b))
}

func benchAggregate(b *testing.B, in []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var bld Builder
		if err := bld.Read(bytes.NewReader(in), "bench"); err != nil {
			b.Fatal(err)
		}
		s, err := bld.Build()
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteCIDRs(io.Discard, s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAggregateNetipx is the baseline Builder must beat: the same
// work with netipx.IPSetBuilder and IPSet.Prefixes.
func BenchmarkAggregateNetipx(b *testing.B) {
	in := synthetic(400_000, 1, true)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var bld netipx.IPSetBuilder
		err := Read(bytes.NewReader(in), "bench", func(r netipx.IPRange, _ int) { bld.AddRange(r) })
		if err != nil {
			b.Fatal(err)
		}
		s, err := bld.IPSet()
		if err != nil {
			b.Fatal(err)
		}
		var buf []byte
		for _, p := range s.Prefixes() {
			buf = p.AppendTo(buf[:0])
		}
	}
}

func BenchmarkRead400k(b *testing.B) {
	in := synthetic(400_000, 1, true)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		n := 0
		if err := Read(bytes.NewReader(in), "bench", func(netipx.IPRange, int) { n++ }); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuild400k(b *testing.B) {
	var rr []netipx.IPRange
	if err := Read(bytes.NewReader(synthetic(400_000, 1, true)), "bench", func(r netipx.IPRange, _ int) { rr = append(rr, r) }); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var bld Builder
		for _, r := range rr {
			bld.AddRange(r)
		}
		if _, err := bld.Build(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteCIDRs(b *testing.B) {
	s, err := ReadSet(bytes.NewReader(synthetic(400_000, 1, true)), "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteCIDRs(io.Discard, s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseLine(b *testing.B) {
	lines := []string{"192.0.2.7", "198.51.100.0/24", "203.0.113.9 - 203.0.113.200", "2001:db8::/48"}
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			if _, _, err := ParseLine(l); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkSort4(b *testing.B) {
	var bld Builder
	if err := bld.Read(bytes.NewReader(synthetic(400_000, 1, false)), "bench"); err != nil {
		b.Fatal(err)
	}
	in := bld.in4
	v := make([]uint64, len(in))
	b.Run("radix", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(v, in)
			sort4(v)
		}
	})
	b.Run("pdqsort", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(v, in)
			slices.Sort(v)
		}
	})
}
