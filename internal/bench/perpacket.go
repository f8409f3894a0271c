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

// Config is one ruleset to measure: an ipfence Program (loaded the way
// ipfence loads it, nft.Apply) or any other Loader. With neither it is the
// baseline: an empty firewall namespace.
type Config struct {
	Name    string
	Program *nft.Program
	Load    Loader
	// PassAll: the config passes every packet (rules in monitor mode,
	// which only count): its cells expect that, whatever the traffic's
	// Expect says.
	PassAll bool
}

func (c Config) baseline() bool { return c.Program == nil && c.Load == nil }

// loader returns how to load c.
func (c Config) loader() Loader {
	if c.Program != nil {
		return NFTProgram(c.Program)
	}
	return c.Load
}

// Traffic is a named set of source addresses, sent round robin.
type Traffic struct {
	Name string
	Srcs []netip.Addr
	// Local sends to the firewall's own address (through the input hook)
	// instead of the sink past prerouting.
	Local bool
	// Expect is what every config but the baseline is to do with this
	// traffic, checked round by round from the firewall's counters (the
	// baseline passes everything). ExpectAny checks nothing.
	Expect pktgen.Expect
}

// Cell is the result for one config and one traffic.
type Cell struct {
	Config  string `json:"config"`
	Traffic string `json:"traffic"`
	// NsPerPacket is the median over rounds of the CPU time per packet
	// through fw's receive path.
	NsPerPacket float64 `json:"ns_per_packet"`
	NsMin       float64 `json:"ns_per_packet_min"`
	NsMax       float64 `json:"ns_per_packet_max"`
	// OverheadNs is the median over rounds of (this config − baseline)
	// measured in the same round: what the ruleset adds per packet;
	// OverheadMin and OverheadMax its spread over the rounds.
	OverheadNs  float64   `json:"overhead_ns"`
	OverheadMin float64   `json:"overhead_min_ns"`
	OverheadMax float64   `json:"overhead_max_ns"`
	Rounds      []float64 `json:"rounds_ns_per_packet"`
	// Packets is the packets per measurement (fewer than asked for
	// configs too slow for the time budget).
	Packets int `json:"packets"`
}

// PerPacketOptions shape PerPacket.
type PerPacketOptions struct {
	// Rounds is the number of kept rounds; one warm-up round comes first.
	Rounds int
	// Packets per measurement.
	Packets int
	// Budget, when set, bounds a measurement's time: a config whose
	// warm-up shows it slower sends fewer packets (at least MinPackets).
	Budget time.Duration
	// Progress, when set, is called as each config is loaded.
	Progress func(string)
	// WhileLoaded, when set, runs in each kept round after a config's
	// packets, with the config still loaded: further probes.
	WhileLoaded func(ctx context.Context, config string, round int) error
	// Labs, when set, holds one lab per config (Labs[0] for the
	// baseline): each config is loaded once into its own lab, before the
	// first round, and stays loaded, so that the rounds measure the same
	// kernel objects instead of reloading them (less noise: the caches
	// and allocations do not change between rounds). PerPacket's lab
	// argument is then unused, and WhileLoaded must be nil.
	Labs []*netns.Lab
	// Prepare, when set, runs on each lab PerPacketLabs creates, before
	// any config is loaded: what every config's lab needs alike.
	Prepare func(*netns.Lab) error
}

// MinPackets is the fewest packets a measurement sends under a Budget.
const MinPackets = 200

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
// rounds. Each round measures the baseline (cfgs[0]), then loads each
// other config in turn, in an order rotated round by round, measuring the
// baseline again right before each: a config's overhead is paired with
// the baseline measured next to it, so drift over a long round does not
// enter it. The first round is a warm-up and is discarded; under a Budget
// it sends MinPackets per measurement and sets the packet counts of the
// kept rounds. Each config is unloaded before the next is loaded (or,
// with Labs, loaded once into its own lab), and the namespaces are left
// empty, also on error. Load times count kept rounds only (with Labs,
// the one load).
func PerPacket(ctx context.Context, lab *netns.Lab, cfgs []Config, traffic []Traffic, o PerPacketOptions) (out *PerPacketResult, rerr error) {
	progress := o.Progress
	if progress == nil {
		progress = func(string) {}
	}
	if len(cfgs) == 0 || !cfgs[0].baseline() {
		return nil, errors.New("measuring per-packet cost: the first config must be the baseline")
	}
	labOf := func(int) *netns.Lab { return lab }
	if o.Labs != nil {
		if len(o.Labs) != len(cfgs) || o.WhileLoaded != nil {
			return nil, errors.New("measuring per-packet cost: Labs needs one lab per config, and no WhileLoaded")
		}
		labOf = func(ci int) *netns.Lab { return o.Labs[ci] }
	}
	type key struct{ c, t int }
	ns := map[key][]float64{}   // per config and traffic, one per kept round
	pair := map[key][]float64{} // the baseline measured right before
	packets := map[key]int{}
	loads := map[string][]time.Duration{}
	// run measures every traffic with config ci loaded, into to (nil:
	// ns), and calibrates the packet counts in the warm-up round.
	run := func(ci, round int, to map[key][]float64) error {
		c := cfgs[ci]
		for ti, tr := range traffic {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := key{ci, ti}
			n := packets[k]
			if round == 0 {
				n = o.Packets
				if o.Budget > 0 {
					n = min(n, MinPackets)
				}
			}
			mo := pktgen.MeasureOptions{Local: tr.Local, Expect: tr.Expect}
			if (c.baseline() || c.PassAll) && tr.Expect != pktgen.ExpectAny {
				mo.Expect = pktgen.ExpectPass
			}
			v, err := measure(labOf(ci), tr.Srcs, n, mo)
			if err != nil {
				return fmt.Errorf("measuring %s with %s traffic: %w", c.Name, tr.Name, err)
			}
			switch {
			case round == 0:
				if _, ok := packets[k]; !ok {
					packets[k] = o.Packets
					if o.Budget > 0 && v > 0 {
						packets[k] = min(o.Packets, max(MinPackets, int(float64(o.Budget)/v)))
					}
				}
			case to != nil:
				to[key{0, ti}] = append(to[key{0, ti}], v)
			default:
				ns[k] = append(ns[k], v)
			}
		}
		return nil
	}
	// load loads config ci (timed in kept rounds, or when loaded once).
	load := func(ci, round int) (func() error, error) {
		c := cfgs[ci]
		t0 := time.Now()
		unload, err := c.loader()(ctx, labOf(ci))
		if err != nil {
			return nil, fmt.Errorf("loading %s: %w", c.Name, err)
		}
		if round > 0 || o.Labs != nil {
			loads[c.Name] = append(loads[c.Name], time.Since(t0))
		}
		return unload, nil
	}
	if o.Labs != nil {
		for ci := 1; ci < len(cfgs); ci++ {
			progress("loading " + cfgs[ci].Name)
			unload, err := load(ci, 0)
			if err != nil {
				return nil, err
			}
			defer func() {
				if uerr := unload(); uerr != nil {
					out, rerr = nil, errors.Join(rerr, fmt.Errorf("unloading %s: %w", cfgs[ci].Name, uerr))
				}
			}()
		}
	}
	for round := 0; round <= o.Rounds; round++ {
		progress(fmt.Sprintf("round %d/%d: %s", round, o.Rounds, cfgs[0].Name))
		if err := run(0, round, nil); err != nil {
			return nil, err
		}
		if round > 0 && o.WhileLoaded != nil {
			if err := o.WhileLoaded(ctx, cfgs[0].Name, round); err != nil {
				return nil, fmt.Errorf("probing with %s (round %d): %w", cfgs[0].Name, round, err)
			}
		}
		rest := len(cfgs) - 1
		for i := range rest {
			ci := 1 + (i+round)%rest
			c := cfgs[ci]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			progress(fmt.Sprintf("round %d/%d: %s", round, o.Rounds, c.Name))
			// The baseline next to this config (the round's own for the
			// first).
			adjacent := map[key][]float64{}
			switch {
			case i > 0:
				if err := run(0, round, adjacent); err != nil {
					return nil, err
				}
			case round > 0:
				for ti := range traffic {
					b := ns[key{0, ti}]
					adjacent[key{0, ti}] = b[len(b)-1:]
				}
			}
			for ti := range traffic {
				if round > 0 {
					pair[key{ci, ti}] = append(pair[key{ci, ti}], adjacent[key{0, ti}]...)
				}
			}
			unload := func() error { return nil }
			if o.Labs == nil {
				var err error
				if unload, err = load(ci, round); err != nil {
					return nil, err
				}
			}
			err := run(ci, round, nil)
			if err == nil && round > 0 && o.WhileLoaded != nil {
				if err = o.WhileLoaded(ctx, c.Name, round); err != nil {
					err = fmt.Errorf("probing with %s (round %d): %w", c.Name, round, err)
				}
			}
			if uerr := unload(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unloading %s: %w", c.Name, uerr))
			}
			if err != nil {
				return nil, err
			}
		}
	}
	out = &PerPacketResult{Packets: o.Packets, Rounds: o.Rounds, LoadTimes: map[string]time.Duration{}}
	for name, ds := range loads {
		out.LoadTimes[name] = medianDur(ds)
	}
	for ci, c := range cfgs {
		for ti, tr := range traffic {
			v := ns[key{ci, ti}]
			base := pair[key{ci, ti}]
			if ci == 0 {
				base = v
			}
			diff := make([]float64, min(len(v), len(base)))
			for i := range diff {
				diff[i] = v[i] - base[i]
			}
			lo, med, hi := Spread(diff)
			vlo, vmed, vhi := Spread(v)
			out.Cells = append(out.Cells, Cell{Config: c.Name, Traffic: tr.Name, NsPerPacket: vmed, NsMin: vlo, NsMax: vhi,
				OverheadNs: med, OverheadMin: lo, OverheadMax: hi, Rounds: v, Packets: packets[key{ci, ti}]})
		}
	}
	return out, nil
}

// measure returns the CPU time per packet (sending thread plus deferred
// softirq work: the cost of the packet, unlike wall time not inflated
// while the machine is busy). A round that lost packets because the
// kernel's backlog overflowed under load is tried again, up to 3 times.
func measure(lab *netns.Lab, srcs []netip.Addr, n int, o pktgen.MeasureOptions) (float64, error) {
	var err error
	for try := 0; try < 3; try++ {
		var res pktgen.Result
		if res, err = pktgen.MeasureWith(lab, srcs, n, o); err == nil {
			return res.CPUNsPerPacket, nil
		}
		if !errors.Is(err, pktgen.ErrLost) {
			break
		}
	}
	return 0, err
}

// Spread is the minimum, median and maximum of xs (zeros for none).
func Spread(xs []float64) (lo, med, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	return slices.Min(xs), Median(xs), slices.Max(xs)
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

// NewLabs creates n labs named name0 … name(n-1), for
// PerPacketOptions.Labs; closing them all is the caller's, also when
// NewLabs fails part way (the labs made so far are returned).
func NewLabs(name string, n int) ([]*netns.Lab, error) {
	labs := make([]*netns.Lab, 0, n)
	for i := range n {
		lab, err := netns.NewLab(fmt.Sprintf("%s%d", name, i))
		if err != nil {
			return labs, err
		}
		labs = append(labs, lab)
	}
	return labs, nil
}

// PerPacketLabs is PerPacket with each config in a lab of its own
// (PerPacketOptions.Labs), named name0, name1, …: it creates the labs and
// removes them, also on error.
func PerPacketLabs(ctx context.Context, name string, cfgs []Config, traffic []Traffic, o PerPacketOptions) (out *PerPacketResult, err error) {
	labs, err := NewLabs(name, len(cfgs))
	defer func() {
		if cerr := CloseLabs(labs); cerr != nil && err == nil {
			out, err = nil, fmt.Errorf("removing the labs: %w", cerr)
		}
	}()
	if err != nil {
		return nil, fmt.Errorf("creating the labs: %w", err)
	}
	for _, lab := range labs {
		if o.Prepare == nil {
			break
		}
		if err := o.Prepare(lab); err != nil {
			return nil, fmt.Errorf("preparing lab %s: %w", lab.Name, err)
		}
	}
	o.Labs = labs
	return PerPacket(ctx, nil, cfgs, traffic, o)
}

// CloseLabs closes labs, joining their errors.
func CloseLabs(labs []*netns.Lab) error {
	var errs []error
	for _, l := range labs {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}
