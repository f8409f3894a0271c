package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/ipfence/ipfence/internal/bench/probe"
	"github.com/ipfence/ipfence/internal/netns"
)

// Ports of the probe servers in the firewall namespace.
const (
	probeUDPPort  = 5353
	probeHTTPPort = 8080
	probeTimeout  = 2 * time.Second
)

// LatencyRow is the latency of one probe through one config: percentiles
// over all rounds' samples, and the spread of the rounds' medians.
type LatencyRow struct {
	Set       string  `json:"set,omitempty"`
	Prefixes  int     `json:"prefixes,omitempty"`
	Config    string  `json:"config"`
	Probe     string  `json:"probe"` // udp-rtt or tcp-connect
	Samples   int     `json:"samples"`
	Lost      int     `json:"lost"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	MaxUs     float64 `json:"max_us"`
	MedianMin float64 `json:"round_median_min_us"`
	MedianMax float64 `json:"round_median_max_us"`
}

type probeServers struct {
	lab *netns.Lab
	*probe.Servers
}

func startProbes(lab *netns.Lab) (*probeServers, error) {
	s, err := probe.StartServers(lab, probeUDPPort, []int{probeHTTPPort})
	if err != nil {
		return nil, fmt.Errorf("starting the probe servers: %w", err)
	}
	return &probeServers{lab, s}, nil
}

// latencies collects probe samples per config over rounds.
type latencies struct {
	srv      *probeServers
	set      string
	prefixes int
	n        int
	order    []string
	samples  map[[2]string][]time.Duration
	medians  map[[2]string][]float64
	lost     map[[2]string]int
}

func newLatencies(srv *probeServers, set string, prefixes, n int) *latencies {
	return &latencies{srv: srv, set: set, prefixes: prefixes, n: n,
		samples: map[[2]string][]time.Duration{}, medians: map[[2]string][]float64{}, lost: map[[2]string]int{}}
}

var probeNames = []string{"udp-rtt", "tcp-connect"}

// probe runs both probes through the loaded config (a WhileLoaded hook).
func (l *latencies) probe(ctx context.Context, config string, round int) error {
	if l.n <= 0 {
		return nil
	}
	for _, name := range probeNames {
		var ds []time.Duration
		var lost int
		var err error
		switch name {
		case "udp-rtt":
			ds, lost, err = probe.UDPRoundTrips(ctx, l.srv.lab, probeUDPPort, l.n, probeTimeout)
		case "tcp-connect":
			ds, lost, err = probe.TCPConnects(ctx, l.srv.lab, probeHTTPPort, l.n, probeTimeout)
		}
		if err != nil {
			return fmt.Errorf("probing %s: %w", name, err)
		}
		k := [2]string{config, name}
		if _, ok := l.samples[k]; !ok && name == probeNames[0] {
			l.order = append(l.order, config)
		}
		l.samples[k] = append(l.samples[k], ds...)
		l.medians[k] = append(l.medians[k], us(Percentile(ds, 50)))
		l.lost[k] += lost
	}
	return nil
}

func (l *latencies) rows() []LatencyRow {
	var out []LatencyRow
	for _, c := range l.order {
		for _, name := range probeNames {
			k := [2]string{c, name}
			ds := l.samples[k]
			lo, _, hi := Spread(l.medians[k])
			out = append(out, LatencyRow{Set: l.set, Prefixes: l.prefixes, Config: c, Probe: name,
				Samples: len(ds), Lost: l.lost[k], P50us: us(Percentile(ds, 50)), P99us: us(Percentile(ds, 99)),
				MaxUs: us(Percentile(ds, 100)), MedianMin: lo, MedianMax: hi})
		}
	}
	return out
}
