package prefix

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// countryFile is the bundled real data: "first,last,CC" per line.
const countryFile = "../../data/geo/country-ipv4.csv.gz"

// countryRanges returns the bundled IPv4 country ranges as "first-last"
// lines.
func countryRanges(tb testing.TB) []byte {
	tb.Helper()
	f, err := os.Open(countryFile)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(z)
	for sc.Scan() {
		first, rest, ok := strings.Cut(sc.Text(), ",")
		last, _, ok2 := strings.Cut(rest, ",")
		if !ok || !ok2 {
			tb.Fatalf("%s: bad row %q", countryFile, sc.Text())
		}
		fmt.Fprintf(&out, "%s-%s\n", first, last)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

// synthetic returns n lines of a block list in every syntax iprange also
// reads: addresses, prefixes (some with host bits set, some with dotted
// netmasks), ranges (some with spaces around '-'), comments; with IPv6
// lines too when v6. The same seed gives the same list.
func synthetic(n int, seed uint64, v6 bool) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x1f))
	var b bytes.Buffer
	for range n {
		if v6 && rng.IntN(10) == 0 {
			b.WriteString(randomLine6(rng))
		} else {
			b.WriteString(randomLine4(rng))
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func randomLine4(rng *rand.Rand) string {
	a := rng.Uint32()
	if rng.IntN(4) == 0 { // a quarter in 10.0.0.0/12, to overlap and touch
		a = 10<<24 | a&(1<<20-1)
	}
	ip := netip.AddrFrom4(be4(a))
	switch k := rng.IntN(100); {
	case k < 60:
		return ip.String()
	case k < 80:
		return fmt.Sprintf("%v/%d", ip, 32-rng.IntN(1+rng.IntN(17)))
	case k < 83:
		bits := 32 - rng.IntN(1+rng.IntN(17))
		return fmt.Sprintf("%v/%v", ip, netip.AddrFrom4(be4(uint32(uint64(1<<32-1)<<(32-bits)))))
	case k < 95:
		last := uint64(a) + uint64(rng.IntN(1<<(1+rng.IntN(14))))
		last = min(last, 1<<32-1)
		sep := "-"
		if rng.IntN(3) == 0 {
			sep = " - "
		}
		return fmt.Sprintf("%v%s%v", ip, sep, netip.AddrFrom4(be4(uint32(last))))
	case k < 98:
		return fmt.Sprintf("%v # comment %d", ip, k)
	default:
		return "# a comment line"
	}
}

func randomLine6(rng *rand.Rand) string {
	var a16 [16]byte
	hi := 0x2001_0db8_0000_0000 | rng.Uint64()&(1<<28-1)<<4
	for i := range 8 {
		a16[i] = byte(hi >> (56 - 8*i))
	}
	lo := rng.Uint64()
	for i := range 8 {
		a16[8+i] = byte(lo >> (56 - 8*i))
	}
	ip := netip.AddrFrom16(a16)
	switch k := rng.IntN(10); {
	case k < 4:
		return ip.String()
	case k < 8:
		return fmt.Sprintf("%v/%d", ip, 32+rng.IntN(97))
	default:
		last := a16
		last[15] |= 0xff
		last[14] |= byte(rng.IntN(256))
		return fmt.Sprintf("%v - %v", ip, netip.AddrFrom16(last))
	}
}
