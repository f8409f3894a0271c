package plan

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

// BenchmarkBuildFeed chooses and builds the layouts of a 200k-line
// threat feed (IPv4 /20 to /32, a tenth IPv6 /40 to /64), as
// BenchmarkFleetRollout's feed: the CPU an apply or agent spends in the
// layout search.
func BenchmarkBuildFeed(b *testing.B) {
	s := feedSet()
	for b.Loop() {
		for _, is4 := range []bool{true, false} {
			if _, err := Build(s, is4, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// feedSet is the set of BenchmarkBuildFeed.
func feedSet() *prefix.Set {
	r := rand.New(rand.NewPCG(11, 11))
	var sb prefix.Builder
	for range 200_000 {
		if r.IntN(10) == 0 {
			a := [16]byte{0x2a, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}
			sb.AddPrefix(netip.PrefixFrom(netip.AddrFrom16(a), 40+r.IntN(25)).Masked())
			continue
		}
		a := [4]byte{byte(1 + r.IntN(126)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}
		sb.AddPrefix(netip.PrefixFrom(netip.AddrFrom4(a), 20+r.IntN(13)).Masked())
	}
	s, _ := sb.Build()
	return s
}

// BenchmarkReplayFeed replays the layouts BenchmarkBuildFeed chooses:
// what a fleet agent spends when its bundle carries the publisher's
// choices.
func BenchmarkReplayFeed(b *testing.B) {
	s := feedSet()
	var chosen []*Choices
	for _, is4 := range []bool{true, false} {
		l, err := Build(s, is4, Options{Record: true})
		if err != nil {
			b.Fatal(err)
		}
		chosen = append(chosen, l.Choices)
	}
	for b.Loop() {
		for _, ch := range chosen {
			if _, err := Replay(s, ch.Is4, Options{}, ch); err != nil {
				b.Fatal(err)
			}
		}
	}
}
