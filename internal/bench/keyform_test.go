package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// keyChain is a Program whose IPv6 packets pass through levels verdict
// maps in a row, each keyed on bits bits of the source in the given form,
// each holding the one key every source of keyFormSources matches: the
// cost of a lookup without cache misses (one small map per level).
func keyChain(levels, bits int, form nft.KeyForm) *nft.Program {
	p := &nft.Program{Table: "ipfence"}
	key := netip.PrefixFrom(netip.MustParseAddr("2001:2::"), bits)
	for i := range levels {
		next := nft.Verdict{Kind: nft.Return}
		if i < levels-1 {
			next = nft.Verdict{Kind: nft.Goto, Chain: fmt.Sprintf("c%d", i+1)}
		}
		m := fmt.Sprintf("m%d", i)
		p.Sets = append(p.Sets, &nft.Set{Name: m, Family: nft.IPv6, KeyBits: bits, Key: form, IsMap: true,
			Elems: nft.ElemsOf(nft.Elem{Key: key, Verdict: next})})
		p.Chains = append(p.Chains, &nft.Chain{Name: fmt.Sprintf("c%d", i), Rules: []nft.Rule{
			{Lookup: &nft.Lookup{Family: nft.IPv6, MaskBits: bits, Key: form, Set: m, IsMap: true}},
		}})
	}
	p.Chains = append([]*nft.Chain{{Name: "pre", Hook: &nft.Hook{Priority: -300}, Rules: []nft.Rule{
		{Family: nft.IPv6, Verdict: nft.Verdict{Kind: nft.Jump, Chain: "c0"}},
	}}}, p.Chains...)
	return p
}

// keyFormSources are addresses in the lab's 2001:2::/48 that differ only
// in their last 16 bits (so they all match a /112 key).
func keyFormSources(n int) []netip.Addr {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]netip.Addr, n)
	for i := range out {
		a := [16]byte{0x20, 0x01, 0, 2}
		a[14], a[15] = byte(r.IntN(256)), byte(r.IntN(254)+1)
		out[i] = netip.AddrFrom16(a)
	}
	return out
}

// BenchmarkKeyForm measures what one lookup level costs per IPv6 packet
// for each way of reading the key: the 16-byte "ip6 saddr & mask" and
// KeyWords with one to four words. Each form is loaded as a chain of 1
// and of 9 levels; ns/level is (9 levels − 1 level) / 8, medians of
// interleaved rounds. It ignores b.N (one measurement takes seconds):
//
//	go test ./internal/bench -run '^$' -bench KeyForm -benchtime 1x
//
// ROUNDS and PACKETS (environment) override 10 rounds of 200000 packets.
func BenchmarkKeyForm(b *testing.B) {
	netnstest.Kernel(b, "ip", "nft")
	rounds, packets := envInt("ROUNDS", 10), envInt("PACKETS", 200000)
	forms := []struct {
		name string
		bits int
		form nft.KeyForm
	}{
		{"ip6-saddr-48", 48, nft.KeyAddress},
		{"words1-24", 24, nft.KeyWords},
		{"words2-48", 48, nft.KeyWords},
		{"words3-80", 80, nft.KeyWords},
		{"words4-112", 112, nft.KeyWords},
	}
	cfgs := []Config{{Name: "none"}}
	for _, f := range forms {
		for _, n := range []int{1, 9} {
			cfgs = append(cfgs, Config{Name: fmt.Sprintf("%s/%d", f.name, n), Program: keyChain(n, f.bits, f.form)})
		}
	}
	lab, err := netns.NewLab("keyform")
	if err != nil {
		b.Fatal(err)
	}
	defer lab.Close()
	res, err := PerPacket(context.Background(), lab, cfgs, []Traffic{{Name: "v6", Srcs: keyFormSources(4096)}}, PerPacketOptions{Rounds: rounds, Packets: packets})
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range forms {
		one, nine := res.Cell(f.name+"/1", "v6").OverheadNs, res.Cell(f.name+"/9", "v6").OverheadNs
		b.ReportMetric((nine-one)/8, f.name+"_ns/level")
		b.Logf("%-14s 1 level %+5.0f ns, 9 levels %+5.0f ns: %3.0f ns per level", f.name, one, nine, (nine-one)/8)
	}
}

func envInt(name string, def int) int {
	var v int
	if _, err := fmt.Sscan(os.Getenv(name), &v); err != nil || v <= 0 {
		return def
	}
	return v
}
