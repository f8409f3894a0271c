package pktgen_test

import (
	"fmt"
	"log"
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// Check one packet per source against whatever firewall is loaded in the
// lab's fw namespace (for instance by `ip netns exec <lab.FW> nft -f ...`).
func ExampleCheck() {
	lab, err := netns.NewLab("example")
	if err != nil {
		log.Fatal(err)
	}
	defer lab.Close()
	r := rand.New(rand.NewPCG(1, 2)) // seeded: the same sources every run
	srcs := append(pktgen.RandomV4(r, 10000), pktgen.RandomV6(r, 10000)...)
	srcs = append(srcs, netip.MustParseAddr("1.2.3.4"))
	passed, err := pktgen.Check(lab, srcs, 9999)
	if err != nil {
		log.Fatal(err) // errors.Is(err, pktgen.ErrLost): the run is void
	}
	fmt.Println("1.2.3.4 passed:", passed[len(passed)-1])
}

// The cost of a ruleset: interleaved rounds with and without it, medians.
func ExampleMeasure() {
	lab, err := netns.NewLab("example")
	if err != nil {
		log.Fatal(err)
	}
	defer lab.Close()
	r := rand.New(rand.NewPCG(1, 2))
	srcs := append(pktgen.RandomV4(r, 4096), pktgen.RandomV6(r, 4096)...)
	load := func(on bool) { /* nft -f ruleset / nft flush ruleset in lab.FW */ }
	var with, without []float64
	for range 7 {
		for _, on := range []bool{false, true} {
			load(on)
			res, err := pktgen.Measure(lab, srcs, 200000)
			if err != nil {
				log.Fatal(err)
			}
			if on {
				with = append(with, res.NsPerPacket)
			} else {
				without = append(without, res.NsPerPacket)
			}
		}
	}
	median := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	fmt.Printf("ruleset costs %.0f ns/packet\n", median(with)-median(without))
}
