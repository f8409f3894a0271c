package bench

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/bench/probe"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// The http scenario times what web clients see. Its growth part makes
// sequential requests for 10 KiB, each on a new connection, from a host
// the rules do not match, while the block list grows (real country
// prefixes), split into connect, request sent, first byte and complete.
// Its per-port part allows 400 client addresses on 4 ports, written as
// 1,600 accept rules or as one set and 4 rules, and drives a fixed
// request rate from all 400 clients.

// HTTPOptions configure HTTP.
type HTTPOptions struct {
	Rules    []int // block list sizes of the growth part
	Requests int   // sequential requests per config, size and round
	// Clients × Ports allowed in the per-port part, requested at Rate
	// per second for Duration per config and round.
	Clients  int
	Ports    []int
	Rate     float64
	Duration time.Duration
	Rounds   int
}

// QuickHTTP is a smoke run; FullHTTP the published one.
var (
	QuickHTTP = HTTPOptions{Rules: []int{0, 2000}, Requests: 30, Clients: 400, Ports: []int{8081, 8082, 8083, 8084},
		Rate: 750, Duration: 1 * time.Second, Rounds: 1}
	FullHTTP = HTTPOptions{Rules: []int{0, 1000, 5000, 10000, 25000, 50000}, Requests: 300, Clients: 400, Ports: []int{8081, 8082, 8083, 8084},
		Rate: 750, Duration: 20 * time.Second, Rounds: 3}
)

// HTTPGrowthConfigs are the ways of writing the growing block list.
var HTTPGrowthConfigs = []string{"iptables-linear", "ipset", "nft-set", "ipfence"}

// HTTPPhases are the phases of a request, cumulative from its start.
var HTTPPhases = []string{"connect", "send", "first_byte", "complete"}

// HTTPGrowthRow is one phase's latency through one config at one size.
type HTTPGrowthRow struct {
	Rules  int     `json:"rules"`
	Config string  `json:"config"`
	Phase  string  `json:"phase"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	MaxUs  float64 `json:"max_us"`
	// MedianMin and MedianMax spread the rounds' medians.
	MedianMin float64 `json:"round_median_min_us"`
	MedianMax float64 `json:"round_median_max_us"`
	Requests  int     `json:"requests"`
	Failed    int     `json:"failed"`
}

// HTTPPortRow is the fixed-rate run through one config of the per-port
// part.
type HTTPPortRow struct {
	Config   string  `json:"config"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	P50us    float64 `json:"p50_us"`
	P95us    float64 `json:"p95_us"`
	P99us    float64 `json:"p99_us"`
	MaxUs    float64 `json:"max_us"`
}

// HTTPResult is what HTTP measured.
type HTTPResult struct {
	Rounds   int             `json:"rounds"`
	Rate     float64         `json:"rate_per_sec"`
	Clients  int             `json:"clients"`
	Ports    []int           `json:"ports"`
	Growth   []HTTPGrowthRow `json:"growth"`
	PerPort  []HTTPPortRow   `json:"per_port"`
	Duration time.Duration   `json:"duration_per_round_ns"`
}

// HTTPSteps is the number of progress steps HTTP takes with o.
func HTTPSteps(o HTTPOptions) int {
	return (len(o.Rules)*(len(HTTPGrowthConfigs)+1) + httpPortConfigCount) * (o.Rounds + 1)
}

// growthConfig returns config name blocking prefixes.
func growthConfig(name string, prefixes []netip.Prefix) (Config, error) {
	geoName := map[string]string{"iptables-linear": "iptables-linear", "ipset": "ipset-hash-net", "nft-set": "nft-interval-set", "ipfence": "ipfence"}[name]
	if geoName == "" {
		return Config{}, fmt.Errorf("unknown http config %q", name)
	}
	var set *netipx.IPSet
	if name == "ipfence" {
		var b netipx.IPSetBuilder
		for _, p := range prefixes {
			b.AddPrefix(p)
		}
		var err error
		if set, err = b.IPSet(); err != nil {
			return Config{}, fmt.Errorf("building the block list: %w", err)
		}
	}
	return geoConfig(geoName, prefixes, set, false)
}

// httpPortConfigCount is the number of configs httpPortConfigs returns.
const httpPortConfigCount = 5

// httpPortConfigs allow clients on ports and drop all else to those
// ports: as one accept rule per client and port, as an ipset and a rule
// per port, as an nft set and a rule per port, and as ipfence's
// allow-only rule.
func httpPortConfigs(clients []netip.Addr, ports []int) ([]Config, error) {
	var each, perPort, nftPorts strings.Builder
	ps := make([]string, len(ports))
	for i, p := range ports {
		ps[i] = fmt.Sprint(p)
	}
	for _, c := range clients {
		for _, p := range ports {
			fmt.Fprintf(&each, "-A INPUT -s %s -p tcp --dport %d -j ACCEPT\n", c, p)
		}
	}
	for _, p := range ports {
		fmt.Fprintf(&perPort, "-A INPUT -p tcp --dport %d -m set --match-set s src -j ACCEPT\n", p)
		fmt.Fprintf(&nftPorts, "tcp dport %d ip saddr @c accept\n", p)
	}
	dropRest := fmt.Sprintf("-A INPUT -p tcp -m multiport --dports %s -j DROP\n", strings.Join(ps, ","))
	inputTable := func(body string) string { return "*filter\n:INPUT ACCEPT [0:0]\n" + body + dropRest + "COMMIT\n" }
	addrs := make([]string, len(clients))
	var b netipx.IPSetBuilder
	for i, c := range clients {
		addrs[i] = c.String()
		b.Add(c)
	}
	set, _ := b.IPSet()
	var planPorts []plan.Port
	for _, p := range ports {
		planPorts = append(planPorts, plan.Port{Proto: "tcp", First: uint16(p), Last: uint16(p)})
	}
	cfgs := []Config{
		{Name: "none"},
		{Name: fmt.Sprintf("iptables %d rules", len(clients)*len(ports)), Load: IPTables("legacy", inputTable(each.String()))},
		{Name: fmt.Sprintf("ipset + %d rules", len(ports)), Load: All(IPSet(ipsetText("hash:ip", addrs)), IPTables("legacy", inputTable(perPort.String())))},
		{Name: fmt.Sprintf("nft set + %d rules", len(ports)), Load: NFTScript("table ip bench {\n" + nftSet("c", "ipv4_addr", addrs) +
			"chain inp {\ntype filter hook input priority filter; policy accept;\n" + nftPorts.String() +
			"tcp dport { " + strings.Join(ps, ", ") + " } drop\n}\n}\n")},
	}
	p, err := plan.Compile(&plan.Input{Rules: []plan.RuleInput{{Name: "clients", Action: plan.AllowOnly, Ports: planPorts, IPv4: true, Set: prefix.FromIPSet(set)}}}, plan.Options{})
	if err != nil {
		return nil, fmt.Errorf("compiling the allow list: %w", err)
	}
	return append(cfgs, Config{Name: "ipfence allow-only", Program: nft.FromPlan(p, nft.Dynamic{})}), nil
}

// growthPrefixes returns n IPv4 prefixes of real country data, spread
// over the address space (every k-th of the countries' prefixes).
func growthPrefixes(ctx context.Context, n int) ([]netip.Prefix, error) {
	src, err := countryData(ctx, geo.IPv4)
	if err != nil {
		return nil, err
	}
	set, err := src.Countries(Geo160k.Countries, false)
	if err != nil {
		return nil, fmt.Errorf("selecting the countries of %s: %w", Geo160k.Name, err)
	}
	all := prefix.Prefixes(set)
	if n > len(all) {
		return nil, fmt.Errorf("%d prefixes asked, the data has %d", n, len(all))
	}
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = all[i*len(all)/max(n, 1)]
	}
	return out, nil
}

// HTTP runs the http scenario.
func HTTP(ctx context.Context, lab *netns.Lab, o HTTPOptions, p *Progress) (*HTTPResult, error) {
	if err := registerLegacy(ctx, lab, "raw", "filter"); err != nil {
		return nil, err
	}
	srv, err := probe.StartServers(lab, probeUDPPort, append([]int{probeHTTPPort}, o.Ports...))
	if err != nil {
		return nil, fmt.Errorf("starting the servers: %w", err)
	}
	defer srv.Close()
	res := &HTTPResult{Rounds: o.Rounds, Rate: o.Rate, Clients: o.Clients, Ports: o.Ports, Duration: o.Duration}
	maxRules := 0
	for _, n := range o.Rules {
		maxRules = max(maxRules, n)
	}
	pool, err := growthPrefixes(ctx, maxRules)
	if err != nil {
		return nil, err
	}
	for _, n := range o.Rules {
		prefixes := pool[:n]
		if n < maxRules {
			prefixes = make([]netip.Prefix, n)
			for i := range prefixes {
				prefixes[i] = pool[i*maxRules/n]
			}
		}
		cfgs := []Config{{Name: "none"}}
		for _, name := range HTTPGrowthConfigs {
			c, err := growthConfig(name, prefixes)
			if err != nil {
				return nil, err
			}
			cfgs = append(cfgs, c)
		}
		phases := map[[2]string][]time.Duration{}
		medians := map[[2]string][]float64{}
		failed := map[string]int{}
		var order []string
		po := PerPacketOptions{Rounds: o.Rounds, Progress: p.Prefixed(fmt.Sprintf("http growth, %d rules: ", n)),
			WhileLoaded: func(ctx context.Context, config string, round int) error {
				ps, bad, err := probe.HTTPSequential(ctx, lab, probeHTTPPort, o.Requests, probeTimeout)
				if err != nil {
					return err
				}
				if _, ok := failed[config]; !ok {
					order = append(order, config)
				}
				failed[config] += bad
				for _, ph := range HTTPPhases {
					k := [2]string{config, ph}
					var ds []time.Duration
					for _, x := range ps {
						ds = append(ds, phaseOf(x, ph))
					}
					phases[k] = append(phases[k], ds...)
					medians[k] = append(medians[k], us(Percentile(ds, 50)))
				}
				return nil
			}}
		if _, err := PerPacket(ctx, lab, cfgs, nil, po); err != nil {
			return nil, fmt.Errorf("http growth at %d rules: %w", n, err)
		}
		for _, c := range order {
			for _, ph := range HTTPPhases {
				k := [2]string{c, ph}
				lo, _, hi := Spread(medians[k])
				ds := phases[k]
				res.Growth = append(res.Growth, HTTPGrowthRow{Rules: n, Config: c, Phase: ph, P50us: us(Percentile(ds, 50)),
					P99us: us(Percentile(ds, 99)), MaxUs: us(Percentile(ds, 100)), MedianMin: lo, MedianMax: hi,
					Requests: len(ds) + failed[c], Failed: failed[c]})
			}
		}
	}

	clients, err := probe.AddClients(lab, o.Clients)
	if err != nil {
		return nil, fmt.Errorf("adding the clients: %w", err)
	}
	lat := map[string][]time.Duration{}
	errs := map[string]int{}
	var order []string
	po := PerPacketOptions{Rounds: o.Rounds, Progress: p.Prefixed(fmt.Sprintf("http per-port, %d clients × %d ports at %.0f/s: ", o.Clients, len(o.Ports), o.Rate)),
		WhileLoaded: func(ctx context.Context, config string, round int) error {
			ds, bad, err := probe.OpenLoop(ctx, lab, clients, o.Ports, o.Rate, o.Duration, probeTimeout)
			if err != nil {
				return err
			}
			if _, ok := errs[config]; !ok {
				order = append(order, config)
			}
			lat[config] = append(lat[config], ds...)
			errs[config] += bad
			return nil
		}}
	cfgs, err := httpPortConfigs(clients, o.Ports)
	if err != nil {
		return nil, err
	}
	if _, err := PerPacket(ctx, lab, cfgs, nil, po); err != nil {
		return nil, fmt.Errorf("http per-port: %w", err)
	}
	for _, c := range order {
		ds := lat[c]
		res.PerPort = append(res.PerPort, HTTPPortRow{Config: c, Requests: len(ds) + errs[c], Errors: errs[c],
			P50us: us(Percentile(ds, 50)), P95us: us(Percentile(ds, 95)), P99us: us(Percentile(ds, 99)), MaxUs: us(Percentile(ds, 100))})
	}
	return res, nil
}

func phaseOf(x probe.Phases, phase string) time.Duration {
	switch phase {
	case "connect":
		return x.Connect
	case "send":
		return x.Send
	case "first_byte":
		return x.FirstByte
	}
	return x.Complete
}
