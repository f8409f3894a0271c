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
	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// The geo scenario blocks real country data (the data bundled with
// ipfence) the ways operators do: one nft interval set, ipset hash:net,
// iptables rules split into a chain per /8 (per /16 for IPv6; legacy and
// nft variants), plain iptables rules one after another, ipfence's compiled
// layout, ipfence's XDP tables and, as their reference, the same XDP
// program with the kernel's LPM trie. It measures what a packet costs for
// legitimate traffic (from other countries) and for blocked traffic (drawn
// uniformly from the set, and Zipf-distributed over a few thousand
// attackers, as floods are), the latency of UDP request/response and of TCP
// connects from a legitimate host, and how long each takes to load.

// GeoSet is a set of countries whose prefixes of one family are blocked.
type GeoSet struct {
	Name      string   `json:"name"`
	Countries []string `json:"countries"`
	IPv6      bool     `json:"ipv6"`     // block the IPv6 prefixes, not the IPv4 ones
	Prefixes  int      `json:"prefixes"` // prefixes of the family, filled in by Geo
}

// family is "IPv4" or "IPv6".
func (gs GeoSet) family() string {
	if gs.IPv6 {
		return "IPv6"
	}
	return "IPv4"
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
// address space), and the IPv6 prefixes of the 50k set's countries (52k).
var (
	GeoSmall  = GeoSet{Name: "CH+AT", Countries: []string{"CH", "AT"}}
	GeoSmall6 = GeoSet{Name: "CH+AT, IPv6", Countries: GeoSmall.Countries, IPv6: true}
	Geo50k    = GeoSet{Name: "6 countries", Countries: []string{"BR", "IN", "JP", "KR", "AU", "CA"}}
	Geo50k6   = GeoSet{Name: "6 countries, IPv6", Countries: Geo50k.Countries, IPv6: true}
	Geo100k   = GeoSet{Name: "8 in Europe", Countries: []string{"DE", "GB", "FR", "IT", "NL", "RU", "ES", "PL"}}
	Geo160k   = GeoSet{Name: "US and 8 in Europe", Countries: []string{"US", "DE", "GB", "FR", "IT", "NL", "RU", "ES", "PL"}}
	QuickGeo  = GeoOptions{Sets: []GeoSet{GeoSmall, GeoSmall6}, Probes: 50, PerPacketOptions: PerPacketOptions{Rounds: 1, Packets: 4000, Budget: 20 * time.Millisecond}}
	FullGeo   = GeoOptions{Sets: []GeoSet{Geo50k, Geo100k, Geo160k, Geo50k6}, Probes: 200, PerPacketOptions: PerPacketOptions{Rounds: 5, Packets: 20000, Budget: 150 * time.Millisecond}}
	// GeoTraffic: legit from outside the set, blocked drawn uniformly from
	// it, blocked-zipf from geoAttackers addresses in it with Zipf(s=1.1)
	// weights (a few sources send most packets).
	GeoTraffic = []string{"legit", "blocked", "blocked-zipf"}
)

const geoAttackers = 4096

// GeoConfigs are the ways of blocking a country set that Geo compares.
// ipfence-monitor is ipfence's layout with the rule in monitor mode: it
// passes the blocked traffic, counted.
var GeoConfigs = []string{"nft-interval-set", "ipset-hash-net", "iptables-split-legacy", "iptables-split-nft", "iptables-linear", "ipfence", "ipfence-monitor", "ipfence-xdp", "xdp-lpm", "ipfence-ipset", "ipfence-split"}

// geoConfig returns the config name blocking prefixes, all of one family
// (v6: IPv6).
func geoConfig(name string, prefixes []netip.Prefix, set *netipx.IPSet, v6 bool) (Config, error) {
	strs := make([]string, len(prefixes))
	for i, p := range prefixes {
		strs[i] = p.String()
	}
	nftFamily, addrType, saddr, ipsetFamily, xt := "ip", "ipv4_addr", "ip saddr", "inet", IPTables
	if v6 {
		nftFamily, addrType, saddr, ipsetFamily, xt = "ip6", "ipv6_addr", "ip6 saddr", "inet6", IP6Tables
	}
	switch name {
	case "nft-interval-set":
		return Config{Name: name, Load: NFTScript(familyChain(nftFamily, saddr+" @s drop", nftDecl("set", "s", addrType+"\nflags interval", strs)))}, nil
	case "ipset-hash-net":
		return Config{Name: name, Load: All(IPSet(ipsetText("hash:net family "+ipsetFamily, strs)),
			xt("legacy", rawTable("-A PREROUTING -m set --match-set s src -j DROP\n")))}, nil
	case "iptables-split-legacy", "iptables-split-nft":
		return Config{Name: name, Load: xt(strings.TrimPrefix(name, "iptables-split-"), rawTable(splitChains(prefixes)))}, nil
	case "iptables-linear":
		var b strings.Builder
		for _, p := range strs {
			fmt.Fprintf(&b, "-A PREROUTING -s %s -j DROP\n", p)
		}
		return Config{Name: name, Load: xt("legacy", rawTable(b.String()))}, nil
	case "ipfence", "ipfence-monitor":
		monitor := name == "ipfence-monitor"
		p, err := plan.Compile(&plan.Input{Rules: []plan.RuleInput{{Name: "geo", Action: plan.Drop, Monitor: monitor, IPv4: !v6, IPv6: v6, Set: prefix.FromIPSet(set)}}}, plan.Options{})
		if err != nil {
			return Config{}, fmt.Errorf("compiling the block list: %w", err)
		}
		return Config{Name: name, Program: nft.FromPlan(p, nft.Dynamic{}), PassAll: monitor}, nil
	case "ipfence-ipset", "ipfence-split":
		b := plan.IPSet
		if name == "ipfence-split" {
			b = plan.IPTablesSplit
		}
		p, err := plan.Compile(&plan.Input{Backend: b, Rules: []plan.RuleInput{{Name: "geo", Action: plan.Drop, IPv4: !v6, IPv6: v6, Set: prefix.FromIPSet(set)}}}, plan.Options{})
		if err != nil {
			return Config{}, fmt.Errorf("compiling the block list: %w", err)
		}
		prog, err := ipt.FromPlan(p, ipt.LowerOptions{})
		if err != nil {
			return Config{}, err
		}
		return Config{Name: name, Load: IPTBackend(prog, ipt.Legacy)}, nil
	case "ipfence-xdp", "xdp-lpm":
		return Config{Name: name, Load: XDPTables(set, name == "xdp-lpm")}, nil
	}
	return Config{}, fmt.Errorf("unknown geo config %q (have %s)", name, strings.Join(GeoConfigs, ", "))
}

// splitChains is the body of an iptables raw table that jumps, for each
// /8 (IPv4; /16 for IPv6) holding prefixes, to a chain of that block's
// prefixes; shorter prefixes are matched in PREROUTING itself.
func splitChains(prefixes []netip.Prefix) string {
	var chains, jumps, rules strings.Builder
	seen := map[netip.Prefix]string{}
	for _, p := range prefixes {
		bits := 8
		if p.Addr().Is6() {
			bits = 16
		}
		if p.Bits() < bits {
			fmt.Fprintf(&jumps, "-A PREROUTING -s %s -j DROP\n", p)
			continue
		}
		block := netip.PrefixFrom(p.Addr(), bits).Masked()
		chain, ok := seen[block]
		if !ok {
			chain = fmt.Sprintf("g%d", len(seen))
			seen[block] = chain
			fmt.Fprintf(&chains, ":%s - [0:0]\n", chain)
			fmt.Fprintf(&jumps, "-A PREROUTING -s %s -j %s\n", block, chain)
		}
		fmt.Fprintf(&rules, "-A %s -s %s -j DROP\n", chain, p)
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

// XDPRunRow is the time of one run of an XDP config's program in the
// kernel without a device (BPF_PROG_TEST_RUN): the lookup itself, without
// what veth adds to XDP.
type XDPRunRow struct {
	Set      string  `json:"set"`
	Prefixes int     `json:"prefixes"`
	Config   string  `json:"config"`
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
func Geo(ctx context.Context, lab *netns.Lab, o GeoOptions, p *Progress) (res *GeoResult, err error) {
	var srcs [2]*source.Source // IPv4, IPv6
	for i, file := range []string{geo.IPv4, geo.IPv6} {
		if srcs[i], err = countryData(ctx, file); err != nil {
			return nil, err
		}
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
	res = &GeoResult{Rounds: o.Rounds}
	for _, gs := range o.Sets {
		src := srcs[0]
		if gs.IPv6 {
			src = srcs[1]
		}
		sel, err := src.Countries(gs.Countries, false)
		if err != nil {
			return nil, fmt.Errorf("selecting the countries of %s: %w", gs.Name, err)
		}
		set := sel.IPSet() // for the traffic generator and XDP's LPM trie
		prefixes := set.Prefixes()
		if len(prefixes) == 0 {
			return nil, fmt.Errorf("geo %s: the country data has no %s prefixes for %v", gs.Name, gs.family(), gs.Countries)
		}
		gs.Prefixes = len(prefixes)
		res.Sets = append(res.Sets, gs)
		cfgs := []Config{{Name: "none"}}
		for _, name := range o.configs() {
			c, err := geoConfig(name, prefixes, set, gs.IPv6)
			if err != nil {
				return nil, err
			}
			cfgs = append(cfgs, c)
		}
		legit, err := others(src, gs, set)
		if err != nil {
			return nil, err
		}
		traffic := []Traffic{
			{Name: "legit", Srcs: pktgen.RandomFromSet(r, legit, 4096), Expect: pktgen.ExpectPass},
			{Name: "blocked", Srcs: pktgen.RandomFromSet(r, set, 4096), Expect: pktgen.ExpectDrop},
			{Name: "blocked-zipf", Srcs: pktgen.Zipf(r, pktgen.RandomFromSet(r, set, geoAttackers), 1.1, 4096), Expect: pktgen.ExpectDrop},
		}
		// The latency probes are IPv4: through IPv6 rules they would pass
		// no rule at all.
		probesPerRound := o.Probes
		if gs.IPv6 {
			probesPerRound = 0
		}
		lat := newLatencies(probes, gs.Name, gs.Prefixes, probesPerRound)
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
			runs := []XDPRun{{Name: "ipfence-xdp"}, {Name: "xdp-lpm", LPM: true}}
			if err := XDPRunNs(lab, set, runs, tr.Srcs, 10000, tr.Expect == pktgen.ExpectDrop); err != nil {
				return nil, fmt.Errorf("geo %s: %w", gs.Name, err)
			}
			for _, run := range runs {
				res.XDPRun = append(res.XDPRun, XDPRunRow{Set: gs.Name, Prefixes: gs.Prefixes, Config: run.Name, Traffic: tr.Name, NsPerRun: run.NsPerRun})
			}
		}
		for _, c := range cfgs[1:] {
			res.Loads = append(res.Loads, GeoLoad{Set: gs.Name, Prefixes: gs.Prefixes, Config: c.Name, LoadMs: ms(pp.LoadTimes[c.Name])})
		}
		res.Latency = append(res.Latency, lat.rows()...)
	}
	return res, nil
}

// countryData loads one file (geo.IPv4, geo.IPv6) of the country data
// built into ipfence.
func countryData(ctx context.Context, file string) (*source.Source, error) {
	src, err := (&source.Loader{}).Load(ctx, source.Spec{Name: "geo", Format: source.FormatCountryCSV,
		Paths: []string{source.BuiltinPrefix + file}})
	if err != nil {
		return nil, fmt.Errorf("loading the built-in country data: %w", err)
	}
	return src, nil
}

// others returns the addresses the country data gives to countries other
// than gs's, less set (gs's own prefixes; a few hundred ranges are claimed
// by two countries): where legitimate traffic comes from. For IPv6 this
// matters: uniform draws from 2000::/3 would almost all come from
// unallocated space, far from any rule.
func others(src *source.Source, gs GeoSet, set *netipx.IPSet) (*netipx.IPSet, error) {
	o, err := src.Countries(gs.Countries, true)
	if err != nil {
		return nil, fmt.Errorf("selecting the countries other than %s's: %w", gs.Name, err)
	}
	return prefix.Subtract(o, prefix.FromIPSet(set)).IPSet(), nil
}
