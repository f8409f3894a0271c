package ban

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"
)

// benchSet has 1M single-address bans (IPv4, some IPv6) and 1k nested and
// overlapping CIDR bans, with varied expiries.
func benchSet(b *testing.B) *Set {
	b.Helper()
	s := NewSet()
	for i, bn := range manyAddrBans(1_000_000) {
		if i%10 == 0 { // every tenth in IPv6
			a := bn.Prefix.Addr().As4()
			bn.Prefix = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 12: a[0], 13: a[1], 14: a[2], 15: a[3]}), 128)
		}
		s.Put(bn)
	}
	for i := range 1000 {
		x := uint32(i) * 2654435761
		var p netip.Prefix
		if i%4 == 3 {
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(x >> 24), byte(x >> 16)}), 32+int(x%33))
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8)}), 8+int(x%17))
		}
		bn := Ban{Prefix: p.Masked(), Created: t0}
		if i%5 != 0 {
			bn.Expires = t0.Add(time.Duration(1+i%7) * time.Hour)
		}
		s.Put(bn)
	}
	return s
}

func BenchmarkSetElements(b *testing.B) {
	s := benchSet(b)
	b.ReportAllocs()
	var addrs, nets []Element
	for b.Loop() {
		addrs, nets = s.Elements(t0)
	}
	b.ReportMetric(float64(len(addrs)), "addrs")
	b.ReportMetric(float64(len(nets)), "nets")
}

func BenchmarkSetList(b *testing.B) {
	s := benchSet(b)
	b.ReportAllocs()
	for b.Loop() {
		s.List(t0, Filter{}, 500_000, 100)
	}
}

func BenchmarkStorePut10k(b *testing.B) {
	bans := manyAddrBans(10_000)
	dir := b.TempDir()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		// A fresh file each time: the cost of storing 10k new bans.
		b.StopTimer()
		n++
		st, err := Open(filepath.Join(dir, fmt.Sprintf("bans%d.db", n)))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := st.Put(bans...); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		st.Close()
		b.StartTimer()
	}
}
