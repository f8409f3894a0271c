package bench

import (
	"context"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// BenchmarkServerPackets is the per-packet part of the server scenario
// alone, with more rounds and packets than `ipfence bench server`: the
// cost of a packet of an established connection, of a new allowed one
// and of a blocked one, through ipfence (connection-aware and
// stateless) and a plain interval set (before and after conntrack), each
// config in a lab of its own with conntrack and the same established
// connections. It ignores b.N:
//
//	go test ./internal/bench -run '^$' -bench ServerPackets -benchtime 1x
//
// ROUNDS and PACKETS (environment) override 25 rounds of 100000 packets.
func BenchmarkServerPackets(b *testing.B) {
	netnstest.Kernel(b, "ip", "nft")
	ctx := context.Background()
	sp, err := loadServerPolicy(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var res ServerResult
	o := PerPacketOptions{Rounds: envInt("ROUNDS", 25), Packets: envInt("PACKETS", 100000)}
	if err := serverPackets(ctx, sp, o, NewProgress(nil, 0), &res); err != nil {
		b.Fatal(err)
	}
	for _, r := range res.Packets {
		v := r.OverheadNs
		if r.Traffic == "new-blocked" {
			v = r.NsPerPacket // a drop has no baseline to subtract
		}
		b.ReportMetric(v, r.Config+"/"+r.Traffic+"_ns")
		b.Logf("%-26s %-12s %+6.0f ns (%+.0f..%+.0f over conntrack), %.0f ns in all", r.Config, r.Traffic, r.OverheadNs, r.OverheadMin, r.OverheadMax, r.NsPerPacket)
	}
}
