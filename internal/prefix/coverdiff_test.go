package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"go4.org/netipx"
)

// TestCoverDiff checks CoverDiff against sets built with netipx: random
// overlapping prefixes of both families.
func TestCoverDiff(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 2))
	random := func(n int) []netip.Prefix {
		var ps []netip.Prefix
		for range n {
			if r.IntN(4) == 0 {
				a := [16]byte{0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(4)), byte(r.IntN(256))}
				ps = append(ps, netip.PrefixFrom(netip.AddrFrom16(a), 32+r.IntN(17)).Masked())
				continue
			}
			a := [4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))}
			ps = append(ps, netip.PrefixFrom(netip.AddrFrom4(a), 14+r.IntN(19)).Masked())
		}
		return ps
	}
	set := func(ps []netip.Prefix) *netipx.IPSet {
		var b netipx.IPSetBuilder
		for _, p := range ps {
			b.AddPrefix(p)
		}
		s, _ := b.IPSet()
		return s
	}
	minus := func(a, b *netipx.IPSet) int {
		var x netipx.IPSetBuilder
		x.AddSet(a)
		x.RemoveSet(b)
		s, _ := x.IPSet()
		return len(s.Prefixes())
	}
	for round := range 300 {
		a, b := random(r.IntN(60)), random(r.IntN(60))
		if round%3 == 0 {
			b = append(b, a[:len(a)/2]...) // much in common
		}
		sa, sb := set(a), set(b)
		gotA, gotB := CoverDiff(a, b)
		if wantA, wantB := minus(sa, sb), minus(sb, sa); gotA != wantA || gotB != wantB {
			t.Fatalf("round %d: CoverDiff = %d, %d; want %d, %d\na=%v\nb=%v", round, gotA, gotB, wantA, wantB, a, b)
		}
		text := func(ps []netip.Prefix) []string {
			out := []string{"not a prefix"}
			for _, p := range ps {
				out = append(out, p.String())
			}
			return out
		}
		if tA, tB := CoverDiffText(text(a), text(b)); tA != gotA || tB != gotB {
			t.Fatalf("round %d: CoverDiffText = %d, %d; CoverDiff %d, %d", round, tA, tB, gotA, gotB)
		}
		if sA, sB := CoverDiffSets(FromIPSet(sa), FromIPSet(sb)); sA != gotA || sB != gotB {
			t.Fatalf("round %d: CoverDiffSets = %d, %d; CoverDiff %d, %d", round, sA, sB, gotA, gotB)
		}
		if sA, sB := CoverDiffSet(FromIPSet(sa), text(b)); sA != gotA || sB != gotB {
			t.Fatalf("round %d: CoverDiffSet = %d, %d; CoverDiff %d, %d", round, sA, sB, gotA, gotB)
		}
		// The array an applied record holds: what json.Marshal writes of
		// the cover's text.
		var buf bytes.Buffer
		if err := WriteJSONArray(&buf, FromIPSet(sa)); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(text(sa.Prefixes())[1:])
		if !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("round %d: WriteJSONArray = %s, want %s", round, buf.Bytes(), want)
		}
		// The string a fleet bundle holds: what json.Marshal writes of
		// WriteCIDRs' text.
		var lines, str bytes.Buffer
		if err := errors.Join(WriteCIDRs(&lines, FromIPSet(sa)), WriteJSONString(&str, FromIPSet(sa))); err != nil {
			t.Fatal(err)
		}
		if want, _ := json.Marshal(lines.String()); !bytes.Equal(str.Bytes(), want) {
			t.Fatalf("round %d: WriteJSONString = %s, want %s", round, str.Bytes(), want)
		}
	}
}
