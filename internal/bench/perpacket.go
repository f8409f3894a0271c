// Package bench measures what rulesets cost in the kernel, in a lab of
// network namespaces (internal/netns), never on the host.
package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// Config is one ruleset to measure; a nil Program means no ipfence table
// at all (the baseline).
type Config struct {
	Name    string
	Program *nft.Program
}

// Traffic is a named set of source addresses, sent round robin.
type Traffic struct {
	Name string
	Srcs []netip.Addr
}

// Cell is the result for one config and one traffic.
type Cell struct {
	Config  string `json:"config"`
	Traffic string `json:"traffic"`
	// NsPerPacket is the median over rounds of the CPU time per packet
	// through fw's receive path.
	NsPerPacket float64 `json:"ns_per_packet"`
	// OverheadNs is the median over rounds of (this config − baseline)
	// measured in the same round: what the ruleset adds per packet.
	OverheadNs float64   `json:"overhead_ns"`
	Rounds     []float64 `json:"rounds_ns_per_packet"`
}

// PerPacketResult holds all cells and how the run was made.
type PerPacketResult struct {
	Packets int    `json:"packets_per_measurement"`
	Rounds  int    `json:"rounds"`
	Cells   []Cell `json:"cells"`
	// LoadTimes is each config's load time (median over rounds).
	LoadTimes map[string]time.Duration `json:"-"`
}

// Cell returns the cell of config c and traffic tr.
func (r *PerPacketResult) Cell(c, tr string) Cell {
	for _, x := range r.Cells {
		if x.Config == c && x.Traffic == tr {
			return x
		}
	}
	return Cell{}
}

// PerPacket measures every config against every traffic in interleaved
// rounds: each round loads each config in turn (the first is the
// baseline) and sends n packets of each traffic. The first round is a
// warm-up and is discarded; rounds counts the kept ones.
func PerPacket(ctx context.Context, lab *netns.Lab, cfgs []Config, traffic []Traffic, rounds, n int, progress func(string)) (*PerPacketResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	type key struct{ c, t int }
	ns := map[key][]float64{}
	loads := map[string][]time.Duration{}
	for round := 0; round <= rounds; round++ {
		for ci, c := range cfgs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			progress(fmt.Sprintf("round %d/%d: loading %s", round, rounds, c.Name))
			d, err := load(ctx, lab.FW, c.Program)
			if err != nil {
				return nil, fmt.Errorf("loading %s: %w", c.Name, err)
			}
			loads[c.Name] = append(loads[c.Name], d)
			for ti, tr := range traffic {
				v, err := measure(lab, tr.Srcs, n)
				if err != nil {
					return nil, fmt.Errorf("measuring %s with %s traffic: %w", c.Name, tr.Name, err)
				}
				if round > 0 {
					ns[key{ci, ti}] = append(ns[key{ci, ti}], v)
				}
			}
		}
	}
	_, _ = nft.Flush(ctx, "ipfence", lab.FW)
	out := &PerPacketResult{Packets: n, Rounds: rounds, LoadTimes: map[string]time.Duration{}}
	for name, ds := range loads {
		out.LoadTimes[name] = medianDur(ds)
	}
	for ci, c := range cfgs {
		for ti, tr := range traffic {
			v := ns[key{ci, ti}]
			base := ns[key{0, ti}]
			diff := make([]float64, len(v))
			for i := range v {
				diff[i] = v[i] - base[i]
			}
			out.Cells = append(out.Cells, Cell{Config: c.Name, Traffic: tr.Name, NsPerPacket: Median(v), OverheadNs: Median(diff), Rounds: v})
		}
	}
	return out, nil
}

// measure returns the CPU time per packet (sending thread plus deferred
// softirq work: the cost of the packet, unlike wall time not inflated
// while the machine is busy). A round that lost packets because the
// kernel's backlog overflowed under load is tried again, up to 3 times.
func measure(lab *netns.Lab, srcs []netip.Addr, n int) (float64, error) {
	var err error
	for try := 0; try < 3; try++ {
		var res pktgen.Result
		if res, err = pktgen.Measure(lab, srcs, n); err == nil {
			return res.CPUNsPerPacket, nil
		}
		if !errors.Is(err, pktgen.ErrLost) {
			break
		}
	}
	return 0, err
}

func load(ctx context.Context, ns string, p *nft.Program) (time.Duration, error) {
	t0 := time.Now()
	if p == nil {
		_, err := nft.Flush(ctx, "ipfence", ns)
		return time.Since(t0), err
	}
	_, err := nft.Apply(ctx, p, nft.ApplyOptions{NetNS: ns})
	return time.Since(t0), err
}

// Median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDur(ds []time.Duration) time.Duration {
	f := make([]float64, len(ds))
	for i, d := range ds {
		f[i] = float64(d)
	}
	return time.Duration(Median(f))
}
