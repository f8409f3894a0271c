package nft

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// randomElem returns an element of any shape Elems must keep as it is:
// IPv4, IPv6, IPv4-mapped IPv6, host bits set, invalid prefixes and the
// zero Elem, with or without a verdict and a timeout.
func randomElem(rng *rand.Rand) Elem {
	var e Elem
	var a [16]byte
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	switch rng.IntN(7) {
	case 0: // the zero Elem's key
	case 1, 2:
		e.Key = netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), rng.IntN(33))
	case 3:
		e.Key = netip.PrefixFrom(netip.AddrFrom16(a), rng.IntN(129))
	case 4:
		e.Key = netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), rng.IntN(33)).Masked()
		e.Key = netip.PrefixFrom(netip.AddrFrom16(e.Key.Addr().As16()), 96+e.Key.Bits()) // ::ffff:a.b.c.d/n
	case 5:
		e.Key = netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), 40) // invalid: too long
	case 6: // IPv6 with nothing past the 64th bit (8 bytes of address)
		clear(a[8:])
		e.Key = netip.PrefixFrom(netip.AddrFrom16(a), rng.IntN(129))
	}
	verdicts := []Verdict{{}, {Kind: Accept}, {Kind: Drop}, {Kind: Goto, Chain: "a"}, {Kind: Goto, Chain: "b"}, {Kind: Jump, Chain: "a"}}
	e.Verdict = verdicts[rng.IntN(len(verdicts))]
	if rng.IntN(2) == 0 {
		e.Timeout = time.Duration(rng.Int64N(int64(400 * 24 * time.Hour)))
	}
	return e
}

// TestElemsModel checks Elems against a []Elem: what goes in comes out,
// through Append, Put, Slice, All and List; and the diff's packed
// comparisons against the unpacked ones.
func TestElemsModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		var want []Elem
		var got Elems
		if rng.IntN(2) == 0 {
			got.Grow(rng.IntN(50))
		}
		for range rng.IntN(40) {
			if rng.IntN(10) == 0 {
				got.Grow(rng.IntN(10))
			}
			e := randomElem(rng)
			if len(want) > 0 && rng.IntN(4) == 0 { // the same key, maybe another value
				e.Key = want[rng.IntN(len(want))].Key
			}
			want = append(want, e)
			got.Append(e)
		}
		for range rng.IntN(5) {
			if len(want) == 0 {
				break
			}
			i, e := rng.IntN(len(want)), randomElem(rng)
			want[i] = e
			got.Put(i, e)
		}
		if got.Len() != len(want) || !slices.Equal(got.List(), want) {
			t.Fatalf("Elems hold\n%v\nwant\n%v", got.List(), want)
		}
		for i, e := range got.All() {
			if e != want[i] || got.At(i) != want[i] {
				t.Fatalf("element %d = %v, want %v", i, e, want[i])
			}
			if k := got.keyAt(i); k != keyOf(want[i].Key) {
				t.Fatalf("element %d (%v): keyAt = %v, want keyOf's %v", i, want[i], k, keyOf(want[i].Key))
			}
			j := rng.IntN(len(want))
			if got.equalAt(i, got, j) != (want[i] == want[j]) {
				t.Fatalf("equalAt(%v, %v) = %v", want[i], want[j], !(want[i] == want[j]))
			}
			if keyOf(want[i].Key) == keyOf(want[j].Key) && got.sameValueAt(i, got, j) != sameValue(want[i], want[j]) {
				t.Fatalf("sameValueAt(%v, %v) = %v", want[i], want[j], !sameValue(want[i], want[j]))
			}
		}
		if n := len(want); n > 0 {
			i := rng.IntN(n)
			j := i + rng.IntN(n-i+1)
			sub := got.Slice(i, j)
			if !slices.Equal(sub.List(), want[i:j]) {
				t.Fatalf("Slice(%d, %d) = %v, want %v", i, j, sub.List(), want[i:j])
			}
			// A new verdict appended to the slice must not change the
			// original's verdicts.
			sub.Append(Elem{Key: netip.MustParsePrefix("192.0.2.0/24"), Verdict: Verdict{Kind: Goto, Chain: "new"}})
			if !slices.Equal(got.List(), want) {
				t.Fatalf("appending to a Slice changed the original: %v, want %v", got.List(), want)
			}
		}
	}
}

// keyOf and sameValue are keyAt and sameValueAt on unpacked elements:
// the reference the packed ones are checked against.
func keyOf(p netip.Prefix) elemKey {
	a := p.Masked().Addr().As16()
	return elemKey{binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:]), uint8(p.Bits())}
}

func sameValue(a, b Elem) bool {
	return a.Verdict == b.Verdict && a.Timeout.Milliseconds() == b.Timeout.Milliseconds()
}

// TestElemSize: the point of Elems. Each element takes the bytes its
// Elems needs, and a wider element widens the ones before it.
func TestElemSize(t *testing.T) {
	v4 := Elem{Key: netip.MustParsePrefix("192.0.2.0/24"), Verdict: Verdict{Kind: Goto, Chain: "l1"}}
	ban := Elem{Key: netip.MustParsePrefix("192.0.2.1/32"), Timeout: time.Hour}
	v6 := Elem{Key: netip.MustParsePrefix("2001:db8::/32"), Verdict: Verdict{Kind: Drop}}
	v6long := Elem{Key: netip.MustParsePrefix("2001:db8::1/128"), Verdict: Verdict{Kind: Drop}}
	for _, c := range []struct {
		name string
		es   []Elem
		max  int // bytes an element
	}{
		{"IPv4 map", []Elem{v4, v4}, 7},
		{"IPv4 bans", []Elem{ban, ban}, 14},
		{"IPv6 map up to /64", []Elem{v6, v6}, 11},
		{"IPv6 map", []Elem{v6, v6long}, 19},
		{"mixed", []Elem{v4, ban, v6}, 2 + 8 + 8 + 1},
		{"mixed, long", []Elem{v4, ban, v6, v6long}, 2 + 16 + 8 + 1},
	} {
		var s Elems
		s.Grow(1000)
		s.Append(c.es...)
		if n := len(s.b) / s.Len(); n > c.max {
			t.Errorf("%s: an element takes %d bytes, want at most %d", c.name, n, c.max)
		}
		if !slices.Equal(s.List(), c.es) {
			t.Errorf("%s: %v, want %v", c.name, s.List(), c.es)
		}
		if cap(s.b) < 1000*len(s.b)/len(c.es) {
			t.Errorf("%s: Grow(1000) before the first element left room for %d bytes", c.name, cap(s.b))
		}
	}
	var s Elems
	for i := range 300 { // 300 verdicts: the index widens to 2 bytes
		s.Append(Elem{Key: netip.MustParsePrefix("192.0.2.0/24"), Verdict: Verdict{Kind: Goto, Chain: fmt.Sprint("l", i)}})
	}
	if s.l.v != 2 || s.At(0).Verdict.Chain != "l0" || s.At(299).Verdict.Chain != "l299" {
		t.Errorf("300 verdicts: index width %d, first %v, last %v", s.l.v, s.At(0), s.At(299))
	}
}

// TestMergeDiff: on elements sorted by key, the one-pass diff gives what
// the map's does, in the same order; the diff takes it only then.
func TestMergeDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	verdicts := []Verdict{{Kind: Accept}, {Kind: Drop}, {Kind: Goto, Chain: "a"}}
	sorted := func(n int) Elems {
		var es []Elem
		for k := range n {
			if rng.IntN(3) == 0 {
				continue // keys apart, so that the two lists differ
			}
			a := netip.AddrFrom4([4]byte{10, byte(k >> 8), byte(k), 0})
			e := Elem{Key: netip.PrefixFrom(a, 24), Verdict: verdicts[rng.IntN(len(verdicts))]}
			if rng.IntN(2) == 0 {
				e.Timeout = time.Duration(rng.IntN(3)) * time.Second
			}
			es = append(es, e)
		}
		return ElemsOf(es...)
	}
	for range 500 {
		olds, news := sorted(rng.IntN(300)), sorted(rng.IntN(300))
		if !olds.sortedKeys() || !news.sortedKeys() {
			t.Fatal("sortedKeys: sorted elements are not")
		}
		add, del := mergeDiff(olds, news)
		wantAdd, wantDel := mapDiff(olds, news)
		if !slices.Equal(add, wantAdd) || !slices.Equal(del, wantDel) {
			t.Fatalf("mergeDiff = +%v -%v\nmapDiff  = +%v -%v", add, del, wantAdd, wantDel)
		}
	}
	if es := ElemsOf(Elem{Key: netip.MustParsePrefix("10.0.1.0/24")}, Elem{Key: netip.MustParsePrefix("10.0.0.0/24")}); es.sortedKeys() {
		t.Error("sortedKeys: keys out of order count as sorted")
	}
	if es := ElemsOf(Elem{Key: netip.MustParsePrefix("10.0.0.0/24")}, Elem{Key: netip.MustParsePrefix("10.0.0.1/24")}); es.sortedKeys() {
		t.Error("sortedKeys: a repeated key (after masking) counts as sorted")
	}
}
