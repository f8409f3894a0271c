package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/source"
)

// The geo scenario blocks real country data (the data bundled with
// ipfence) the ways operators do: one nft interval set, ipset hash:net,
// iptables rules split into a chain per /8 (legacy and nft variants), plain
// iptables rules one after another, ipfence's compiled layout, and an XDP
// LPM trie. It measures what a packet costs for legitimate traffic (from
// outside the set) and for blocked traffic, the latency of UDP
// request/response and of TCP connects from a legitimate host, and how long
// each takes to load.

// GeoSet is a set of countries whose IPv4 prefixes are blocked.
type GeoSet struct {
	Name      string   `json:"name"`
	Countries []string `json:"countries"`
	Prefixes  int      `json:"prefixes"` // IPv4 prefixes, filled in by Geo
}

// GeoOptions configure Geo.
type GeoOptions struct {
	Sets    []GeoSet
	Configs []string // names from GeoConfigs; nil: all
	// Probes is the UDP round trips and TCP connects per config and round.
	Probes int
	PerPacketOptions
}

// The country sets: about 50k, 100k and 160k IPv4 prefixes (the union of
// all countries' IPv4 data is only some 22k prefixes after merging, so
// large sets are those of many countries that do not border each other in
// address space).
var (
	GeoSmall   = GeoSet{Name: "CH+AT", Countries: []string{"CH", "AT"}}
	Geo50k     = GeoSet{Name: "6 countries", Countries: []string{"BR", "IN", "JP", "KR", "AU", "CA"}}
	Geo100k    = GeoSet{Name: "8 in Europe", Countries: []string{"DE", "GB", "FR", "IT", "NL", "RU", "ES", "PL"}}
	Geo160k    = GeoSet{Name: "US and 8 in Europe", Countries: []string{"US", "DE", "GB", "FR", "IT", "NL", "RU", "ES", "PL"}}
	QuickGeo   = GeoOptions{Sets: []GeoSet{GeoSmall}, Probes: 50, PerPacketOptions: PerPacketOptions{Rounds: 1, Packets: 4000, Budget: 20 * time.Millisecond}}
	FullGeo    = GeoOptions{Sets: []GeoSet{Geo50k, Geo100k, Geo160k}, Probes: 200, PerPacketOptions: PerPacketOptions{Rounds: 5, Packets: 20000, Budget: 150 * time.Millisecond}}
	GeoTraffic = []string{"legit", "blocked"}
)

// GeoConfigs are the ways of blocking a country set that Geo compares.
var GeoConfigs = []string{"nft-interval-set", "ipset-hash-net", "iptables-split8-legacy", "iptables-split8-nft", "iptables-linear", "ipfence", "xdp-lpm"}

// geoConfig returns the config name blocking prefixes (IPv4).
func geoConfig(name string, prefixes []netip.Prefix, set *netipx.IPSet) (Config, error) {
	strs := make([]string, len(prefixes))
	for i, p := range prefixes {
		strs[i] = p.String()
	}
	switch name {
	case "nft-interval-set":
		return Config{Name: name, Load: NFTScript(preChain("ip saddr @s drop", nftDecl("set", "s", "ipv4_addr\nflags interval", strs)))}, nil
	case "ipset-hash-net":
		return Config{Name: name, Load: All(IPSet(ipsetText("hash:net", strs)),
			IPTables("legacy", rawTable("-A PREROUTING -m set --match-set s src -j DROP\n")))}, nil
	case "iptables-split8-legacy", "iptables-split8-nft":
		return Config{Name: name, Load: IPTables(strings.TrimPrefix(name, "iptables-split8-"), rawTable(split8(prefixes)))}, nil
	case "iptables-linear":
		var b strings.Builder
		for _, p := range strs {
			fmt.Fprintf(&b, "-A PREROUTING -s %s -j DROP\n", p)
		}
		return Config{Name: name, Load: IPTables("legacy", rawTable(b.String()))}, nil
	case "ipfence":
		p, err := plan.Compile(&plan.Input{Rules: []plan.RuleInput{{Name: "geo", Action: plan.Drop, IPv4: true, Set: set}}}, plan.Options{})
		if err != nil {
			return Config{}, fmt.Errorf("compiling the block list: %w", err)
		}
		return Config{Name: name, Program: nft.FromPlan(p, nft.Bans{})}, nil
	case "xdp-lpm":
		return Config{Name: name, Load: XDPDropSet(prefixes)}, nil
	}
	return Config{}, fmt.Errorf("unknown geo config %q (have %s)", name, strings.Join(GeoConfigs, ", "))
}

// split8 is the body of an iptables raw table that jumps, for each /8
// holding prefixes, to a chain of that /8's prefixes; prefixes shorter
// than /8 are matched in PREROUTING itself.
func split8(prefixes []netip.Prefix) string {
	var chains, jumps, rules strings.Builder
	seen := map[byte]bool{}
	for _, p := range prefixes {
		if p.Bits() < 8 {
			fmt.Fprintf(&jumps, "-A PREROUTING -s %s -j DROP\n", p)
			continue
		}
		o := p.Addr().As4()[0]
		if !seen[o] {
			seen[o] = true
			fmt.Fprintf(&chains, ":g%d - [0:0]\n", o)
			fmt.Fprintf(&jumps, "-A PREROUTING -s %d.0.0.0/8 -j g%d\n", o, o)
		}
		fmt.Fprintf(&rules, "-A g%d -s %s -j DROP\n", o, p)
	}
	return chains.String() + jumps.String() + rules.String()
}

// GeoRow is the per-packet cost of one config on one country set.
type GeoRow struct {
	Set         string  `json:"set"`
	Prefixes    int     `json:"prefixes"`
	Config      string  `json:"config"`
	Traffic     string  `json:"traffic"` // legit or blocked
	OverheadNs  float64 `json:"overhead_ns"`
	OverheadMin float64 `json:"overhead_min_ns"`
	OverheadMax float64 `json:"overhead_max_ns"`
	NsPerPacket float64 `json:"ns_per_packet"`
	NsMin       float64 `json:"ns_per_packet_min"`
	NsMax       float64 `json:"ns_per_packet_max"`
	Packets     int     `json:"packets"`
}

// XDPRunRow is the time of one run of the XDP LPM program in the kernel
// without a device (BPF_PROG_TEST_RUN): the lookup itself, without what
// veth adds to XDP.
type XDPRunRow struct {
	Set      string  `json:"set"`
	Prefixes int     `json:"prefixes"`
	Traffic  string  `json:"traffic"`
	NsPerRun float64 `json:"ns_per_run"`
}

// GeoLoad is how long a config took to load (median over rounds).
type GeoLoad struct {
	Set      string  `json:"set"`
	Prefixes int     `json:"prefixes"`
	Config   string  `json:"config"`
	LoadMs   float64 `json:"load_ms"`
}

// GeoResult is what Geo measured.
type GeoResult struct {
	Rounds  int          `json:"rounds"`
	Sets    []GeoSet     `json:"sets"`
	Rows    []GeoRow     `json:"per_packet"`
	Loads   []GeoLoad    `json:"loads"`
	Latency []LatencyRow `json:"latency"`
	XDPRun  []XDPRunRow  `json:"xdp_prog_run"`
}

// GeoSteps is the number of progress steps Geo takes with o.
func GeoSteps(o GeoOptions) int {
	return len(o.Sets) * ((len(o.configs())+1)*(o.Rounds+1) + len(GeoTraffic))
}

func (o GeoOptions) configs() []string {
	if o.Configs == nil {
		return GeoConfigs
	}
	return o.Configs
}

// Geo runs the geo scenario.
func Geo(ctx context.Context, lab *netns.Lab, o GeoOptions, p *Progress) (*GeoResult, error) {
	src, err := countryData(ctx)
	if err != nil {
		return nil, err
	}
	if err := registerLegacy(ctx, lab, "raw"); err != nil {
		return nil, err
	}
	probes, err := startProbes(lab)
	if err != nil {
		return nil, err
	}
	defer probes.Close()
	r := rand.New(rand.NewPCG(7, 11))
	res := &GeoResult{Rounds: o.Rounds}
	for _, gs := range o.Sets {
		set, err := src.Countries(gs.Countries, false)
		if err != nil {
			return nil, fmt.Errorf("selecting the countries of %s: %w", gs.Name, err)
		}
		prefixes := set.Prefixes()
		gs.Prefixes = len(prefixes)
		res.Sets = append(res.Sets, gs)
		cfgs := []Config{{Name: "none"}}
		for _, name := range o.configs() {
			c, err := geoConfig(name, prefixes, set)
			if err != nil {
				return nil, err
			}
			cfgs = append(cfgs, c)
		}
		traffic := []Traffic{
			{Name: "legit", Srcs: outside(r, set, 4096), Expect: pktgen.ExpectPass},
			{Name: "blocked", Srcs: pktgen.RandomFromSet(r, set, 4096), Expect: pktgen.ExpectDrop},
		}
		lat := newLatencies(probes, gs.Name, gs.Prefixes, o.Probes)
		po := o.PerPacketOptions
		po.Progress = p.Prefixed(fmt.Sprintf("geo %s (%d prefixes): ", gs.Name, gs.Prefixes))
		po.WhileLoaded = lat.probe
		pp, err := PerPacket(ctx, lab, cfgs, traffic, po)
		if err != nil {
			return nil, fmt.Errorf("geo %s: %w", gs.Name, err)
		}
		for _, c := range pp.Cells {
			res.Rows = append(res.Rows, GeoRow{Set: gs.Name, Prefixes: gs.Prefixes, Config: c.Config, Traffic: c.Traffic,
				OverheadNs: c.OverheadNs, OverheadMin: c.OverheadMin, OverheadMax: c.OverheadMax,
				NsPerPacket: c.NsPerPacket, NsMin: c.NsMin, NsMax: c.NsMax, Packets: c.Packets})
		}
		for _, tr := range traffic {
			p.Step(fmt.Sprintf("geo %s: XDP program runs, %s", gs.Name, tr.Name))
			ns, err := XDPRunNs(prefixes, tr.Srcs, lab.Sink4, 10000, tr.Expect == pktgen.ExpectDrop)
			if err != nil {
				return nil, fmt.Errorf("geo %s: %w", gs.Name, err)
			}
			res.XDPRun = append(res.XDPRun, XDPRunRow{Set: gs.Name, Prefixes: gs.Prefixes, Traffic: tr.Name, NsPerRun: ns})
		}
		for _, c := range cfgs[1:] {
			res.Loads = append(res.Loads, GeoLoad{Set: gs.Name, Prefixes: gs.Prefixes, Config: c.Name, LoadMs: ms(pp.LoadTimes[c.Name])})
		}
		res.Latency = append(res.Latency, lat.rows()...)
	}
	return res, nil
}

// countryData loads the IPv4 part of the country data built into
// ipfence.
func countryData(ctx context.Context) (*source.Source, error) {
	src, err := (&source.Loader{}).Load(ctx, source.Spec{Name: "geo", Format: source.FormatCountryCSV,
		Paths: []string{source.BuiltinPrefix + geo.IPv4}})
	if err != nil {
		return nil, fmt.Errorf("loading the built-in country data: %w", err)
	}
	return src, nil
}

// outside returns n IPv4 sources drawn uniformly from the testable
// addresses outside set.
func outside(r *rand.Rand, set *netipx.IPSet, n int) []netip.Addr {
	out := make([]netip.Addr, 0, n)
	for len(out) < n {
		for _, a := range pktgen.RandomV4(r, n) {
			if !set.Contains(a) && len(out) < n {
				out = append(out, a)
			}
		}
	}
	return out
}
