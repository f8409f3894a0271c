package main

import (
	"context"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/stress"
)

// TestStressSmall runs a short `ipfence stress` (the daemon as a separate
// process, built here): latency rows, bulk and sustained bans, a mixed
// run of 13 workers, and the end check of the kernel's ban sets, which
// must find nothing lost and nothing phantom.
func TestStressSmall(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft")
	exe := buildIpfence(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := stress.Run(ctx, stress.Options{Exe: exe, Existing: []int{0, 3000}, Clients: []int{1, 4},
		Rates: []int{400}, Requests: 200, Duration: 5 * time.Second, Workers: 13})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Mixed
	if m == nil || m.Errors != 0 || m.Lost != 0 || m.Phantom != 0 || m.BansAtEnd < 3000 || m.Ops["ban"] == 0 || m.Ops["refresh"] == 0 {
		t.Errorf("mixed run: %+v", m)
	}
	if len(rep.Latency) != 6 || rep.Latency[2].Rate != 400 || rep.Latency[2].Clients != 4 || rep.Latency[2].P50us <= 0 ||
		rep.SustainedPerSec <= 0 || rep.CountAt == 0 {
		t.Errorf("report: %+v", rep)
	}
}
