package ipt_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// feedPrefixes returns a set of n random prefixes shaped like a big
// threat feed: 3/4 IPv4 (single addresses, /24s and /16-/23), 1/4 IPv6
// (/32-/64), almost none adjacent.
func feedPrefixes(b *testing.B, n int) *prefix.Set {
	r := rand.New(rand.NewPCG(uint64(n), 5))
	var sb prefix.Builder
	for range n {
		if r.IntN(4) > 0 {
			bits := []int{32, 32, 24, 16 + r.IntN(8)}[r.IntN(4)]
			a := netip.AddrFrom4([4]byte{byte(1 + r.IntN(223)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
			sb.AddPrefix(netip.PrefixFrom(a, bits).Masked())
			continue
		}
		var a [16]byte
		a[0], a[1] = 0x20, byte(r.IntN(256))
		for i := 2; i < 8; i++ {
			a[i] = byte(r.IntN(256))
		}
		sb.AddPrefix(netip.PrefixFrom(netip.AddrFrom16(a), 32+r.IntN(33)).Masked())
	}
	s, err := sb.Build()
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkLoad measures how long each backend takes to load a drop
// rule of about 100k and 200k feed prefixes (feedPrefixes)
// into an empty namespace ("first") and to replace it with the same
// rule again ("reload"): rounds interleaved across backends, medians
// reported.
//
//	sudo go test ./internal/backend/ipt -run '^$' -bench Load -benchtime 1x
func BenchmarkLoad(b *testing.B) {
	netnstest.Kernel(b, "nft", "ipset", "iptables-nft-restore", "iptables-legacy-restore")
	const rounds = 3
	type config struct {
		name    string
		backend plan.Backend
		flavour string
	}
	configs := []config{{"nftables", plan.NFTables, ""}, {"ipset-legacy", plan.IPSet, ipt.Legacy}, {"ipset-nft", plan.IPSet, ipt.NFT},
		{"iptables-split-legacy", plan.IPTablesSplit, ipt.Legacy}, {"iptables-split-nft", plan.IPTablesSplit, ipt.NFT}}
	labs := map[string]*netns.Lab{}
	for _, c := range configs {
		labs[c.name] = netnstest.New(b)
	}
	ctx := context.Background()
	for _, n := range []int{100_000, 200_000} {
		set := feedPrefixes(b, n)
		times := map[string][2][]time.Duration{}
		for range rounds {
			for _, c := range configs {
				p, err := plan.Compile(&plan.Input{Backend: c.backend, Rules: []plan.RuleInput{{Name: "feed", Action: plan.Drop, IPv4: true, IPv6: true, Set: set}}}, plan.Options{})
				if err != nil {
					b.Fatal(err)
				}
				lab := labs[c.name]
				var load func() error
				if c.backend == plan.NFTables {
					prog := nft.FromPlan(p, nft.Dynamic{})
					load = func() error { _, err := nft.Apply(ctx, prog, nft.ApplyOptions{NetNS: lab.FW}); return err }
					if _, err := nft.Flush(ctx, p.Table, nft.ApplyOptions{NetNS: lab.FW}); err != nil {
						b.Fatal(err)
					}
				} else {
					prog, err := ipt.FromPlan(p, ipt.LowerOptions{Flavour: c.flavour})
					if err != nil {
						b.Fatal(err)
					}
					o := ipt.Options{NetNS: lab.FW, Flavour: c.flavour}
					load = func() error { _, err := ipt.Apply(ctx, prog, o); return err }
					if _, err := ipt.Flush(ctx, p.Table, o); err != nil {
						b.Fatal(err)
					}
				}
				ts := times[c.name]
				for k := range 2 {
					t0 := time.Now()
					if err := load(); err != nil {
						b.Fatalf("%s: %v", c.name, err)
					}
					ts[k] = append(ts[k], time.Since(t0))
				}
				times[c.name] = ts
			}
		}
		for _, c := range configs {
			b.Run(fmt.Sprintf("%dk/%s", n/1000, c.name), func(b *testing.B) {
				n4, n6 := prefix.Count(set)
				b.ReportMetric(float64(n4+n6), "prefixes")
				ts := times[c.name]
				b.ReportMetric(float64(median(ts[0]).Milliseconds()), "first-ms")
				b.ReportMetric(float64(median(ts[1]).Milliseconds()), "reload-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
