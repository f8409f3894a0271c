package prefix

import (
	"math"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// modulus is 2^128, which U128 arithmetic is modulo.
var modulus = new(big.Int).Lsh(big.NewInt(1), 128)

func toBig(u U128) *big.Int {
	b := new(big.Int).SetUint64(u.Hi)
	return b.Lsh(b, 64).Or(b, new(big.Int).SetUint64(u.Lo))
}

// fromBig returns b mod 2^128.
func fromBig(b *big.Int) U128 {
	m := new(big.Int).Mod(b, modulus)
	lo := new(big.Int).And(m, new(big.Int).SetUint64(math.MaxUint64)).Uint64()
	return U128{m.Rsh(m, 64).Uint64(), lo}
}

// randU128 draws from a mix of uniform values and the edges where carries,
// borrows and shifts across the halves go wrong: runs of ones and zeros,
// single bits, values next to 2^64 and 2^128.
func randU128(r *rand.Rand) U128 {
	switch r.IntN(6) {
	case 0:
		return U128{r.Uint64(), r.Uint64()}
	case 1:
		return Pow2(r.IntN(128))
	case 2:
		return Pow2(r.IntN(129)).Sub64(uint64(r.IntN(3))) // 2^k - d, wrapping
	case 3:
		return Pow2(r.IntN(128)).Add64(uint64(r.IntN(3)))
	case 4:
		return U128{0, r.Uint64() >> r.IntN(64)}
	}
	return U128{r.Uint64() >> r.IntN(64), r.Uint64() << r.IntN(64)}
}

// TestU128Model checks every operation against math/big on random and
// edge values.
func TestU128Model(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(op string, u, v U128, n int, got, want any) {
		t.Helper()
		if got != want {
			t.Fatalf("%s with u=%#x v=%#x n=%d: got %v, want %v", op, toBig(u), toBig(v), n, got, want)
		}
	}
	for range 200_000 {
		u, v := randU128(r), randU128(r)
		bu, bv := toBig(u), toBig(v)
		n := r.IntN(131) // shifts past 128 too
		n64 := r.Uint64()
		if r.IntN(2) == 0 {
			n64 = v.Lo
		}
		bn64 := new(big.Int).SetUint64(n64)

		check("Add", u, v, n, u.Add(v), fromBig(new(big.Int).Add(bu, bv)))
		check("Sub", u, v, n, u.Sub(v), fromBig(new(big.Int).Sub(bu, bv)))
		check("Add64", u, v, int(n64), u.Add64(n64), fromBig(new(big.Int).Add(bu, bn64)))
		check("Sub64", u, v, int(n64), u.Sub64(n64), fromBig(new(big.Int).Sub(bu, bn64)))
		check("Shl", u, v, n, u.Shl(n), fromBig(new(big.Int).Lsh(bu, uint(n))))
		check("Shr", u, v, n, u.Shr(n), fromBig(new(big.Int).Rsh(bu, uint(n))))
		check("Pow2", u, v, n, Pow2(n), fromBig(new(big.Int).Lsh(big.NewInt(1), uint(n))))
		check("Less", u, v, n, u.Less(v), bu.Cmp(bv) < 0)
		check("Cmp", u, v, n, u.Cmp(v), bu.Cmp(bv))
		check("Cmp self", u, u, n, u.Cmp(u), 0)
		check("Len", u, v, n, u.Len(), bu.BitLen())
		tz := 128
		if bu.Sign() != 0 {
			tz = int(bu.TrailingZeroBits())
		}
		check("TrailingZeros", u, v, n, u.TrailingZeros(), tz)
		// Float64 adds two rounded halves: within an ulp of the exact value.
		want, _ := new(big.Float).SetInt(bu).Float64()
		if got := u.Float64(); math.Abs(got-want) > 2*math.Abs(want)*0x1p-53 {
			t.Fatalf("Float64 of %#x: got %v, want %v", bu, got, want)
		}
		// Addresses: 16 bytes big-endian, or IPv4 in the low 32 bits.
		a6 := u.Addr(128)
		b := a6.As16()
		check("Addr(128)", u, v, n, toBig(u).Cmp(new(big.Int).SetBytes(b[:])), 0)
		check("U128From(Addr(128))", u, v, n, U128From(a6), u)
		a4 := u.Addr(32)
		check("Addr(32)", u, v, n, a4, netip.AddrFrom4(be4(uint32(u.Lo))))
		check("U128From(Addr(32))", u, v, n, U128From(a4), U128{0, u.Lo & math.MaxUint32})
	}
}

func TestU128Edges(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want U128
	}{
		{"max+1", max6.Add64(1), U128{}},
		{"0-1", U128{}.Sub64(1), max6},
		{"carry into Hi", U128{0, math.MaxUint64}.Add64(1), U128{1, 0}},
		{"borrow from Hi", U128{1, 0}.Sub(U128{0, 1}), U128{0, math.MaxUint64}},
		{"Shl 0", U128{1, 2}.Shl(0), U128{1, 2}},
		{"Shr 0", U128{1, 2}.Shr(0), U128{1, 2}},
		{"Shl 64", U128{1, 2}.Shl(64), U128{2, 0}},
		{"Shr 64", U128{1, 2}.Shr(64), U128{0, 1}},
		{"Shl 128", max6.Shl(128), U128{}},
		{"Shr 128", max6.Shr(128), U128{}},
		{"Pow2 127", Pow2(127), U128{1 << 63, 0}},
		{"Pow2 128", Pow2(128), U128{}},
		{"IPv4", U128From(netip.MustParseAddr("10.1.2.3")), U128{0, 0x0a010203}},
		{"IPv4-mapped", U128From(netip.MustParseAddr("::ffff:10.1.2.3")), U128{0, 0xffff_0a010203}},
		{"IPv6", U128From(netip.MustParseAddr("2001:db8::1")), U128{0x2001_0db8_0000_0000, 1}},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, toBig(c.got), toBig(c.want))
		}
	}
	if got := (U128{}).TrailingZeros(); got != 128 {
		t.Errorf("TrailingZeros(0) = %d, want 128", got)
	}
	if got := (U128{}).Len(); got != 0 {
		t.Errorf("Len(0) = %d, want 0", got)
	}
}

// TestU128Allocs checks that the operations layout and aggregation loops
// use allocate nothing.
func TestU128Allocs(t *testing.T) {
	u, v := U128{0x2001_0db8, 7}, U128{3, 1 << 63}
	a := netip.MustParseAddr("2001:db8::1")
	var sink U128
	var n int
	var f float64
	allocs := testing.AllocsPerRun(100, func() {
		sink = u.Add(v).Sub(v).Add64(3).Sub64(1).Shl(n&63 + 5).Shr(n&63 + 3).Add(Pow2(n&63 + 64))
		n += u.Cmp(v) + u.Len() + u.TrailingZeros()
		f += sink.Float64()
		sink = sink.Add(U128From(a)).Add(U128From(sink.Addr(128))).Add(U128From(sink.Addr(32)))
	})
	if allocs != 0 {
		t.Errorf("U128 operations allocated %v times per run, want 0", allocs)
	}
	_, _ = sink, f
}
