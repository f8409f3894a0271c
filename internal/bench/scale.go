package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// The scale scenario repeats the Red Hat nftables benchmark ("Benchmarking
// nftables", Red Hat Developer, 2017) on this kernel: at SCALE s every
// ruleset holds 10·s entries that the traffic does not match, so each
// packet pays for looking through them all; the ways of writing the same
// policy (one rule per entry, a set, ipset) are compared step by step.
// Its DDoS part drops traffic that matches, at each point of the receive
// path where a drop can be placed.

// ScaleOptions configure Scale.
type ScaleOptions struct {
	Steps    []int // SCALE values: 10 entries each
	Families []string
	PerPacketOptions
}

// QuickScale is a smoke run; FullScale the published one (SCALE 0 to 100
// in steps of 5, 10 rounds per point).
var (
	QuickScale = ScaleOptions{Steps: []int{0, 100}, Families: ScaleFamilies,
		PerPacketOptions: PerPacketOptions{Rounds: 2, Packets: 4000, Budget: 20 * time.Millisecond}}
	FullScale = ScaleOptions{Steps: steps(0, 100, 5), Families: ScaleFamilies,
		PerPacketOptions: PerPacketOptions{Rounds: 10, Packets: 20000, Budget: 150 * time.Millisecond}}
)

func steps(from, to, by int) []int {
	var out []int
	for s := from; s <= to; s += by {
		out = append(out, s)
	}
	return out
}

// ScaleFamilies are the policies of the scale scenario:
//
//   - addr: single source addresses (iptables rules, nft rules, an nft
//     set, ipset hash:ip);
//   - port: destination ports (15-port multiport rules, nft rules with
//     15-port anonymous sets, an nft set);
//   - addrport: source address and destination port pairs (rules, an nft
//     concatenated set, ipset hash:ip,port);
//   - jump: a chain per source address (a jump rule each, an nft verdict
//     map).
var ScaleFamilies = []string{"addr", "port", "addrport", "jump"}

// scaleConfigs returns the configs of family at n entries, baseline first.
func scaleConfigs(family string, n int) []Config {
	cfgs := []Config{{Name: "none"}}
	add := func(name string, l Loader) { cfgs = append(cfgs, Config{Name: name, Load: l}) }
	var ipt, nftRules strings.Builder
	switch family {
	case "addr":
		for i := range n {
			fmt.Fprintf(&ipt, "-A PREROUTING -s %s -j DROP\n", entryAddr(i))
			fmt.Fprintf(&nftRules, "ip saddr %s drop\n", entryAddr(i))
		}
		add("iptables", IPTables("legacy", rawTable(ipt.String())))
		add("nft-rules", NFTScript(preChain(nftRules.String())))
		add("nft-set", NFTScript(preChain("ip saddr @s drop", nftSet("s", "ipv4_addr", entries(n, entryAddr)))))
		add("ipset", All(IPSet(ipsetText("hash:ip", entries(n, entryAddr))),
			IPTables("legacy", rawTable("-A PREROUTING -m set --match-set s src -j DROP\n"))))
	case "port":
		for i := 0; i < n; i += 15 {
			ports := entries(min(n, i+15), entryPort)[i:]
			fmt.Fprintf(&ipt, "-A PREROUTING -p udp -m multiport --dports %s -j DROP\n", strings.Join(ports, ","))
			fmt.Fprintf(&nftRules, "udp dport { %s } drop\n", strings.Join(ports, ", "))
		}
		add("iptables-multiport", IPTables("legacy", rawTable(ipt.String())))
		add("nft-rules", NFTScript(preChain(nftRules.String())))
		add("nft-set", NFTScript(preChain("udp dport @s drop", nftSet("s", "inet_service", entries(n, entryPort)))))
	case "addrport":
		for i := range n {
			fmt.Fprintf(&ipt, "-A PREROUTING -s %s -p udp --dport %s -j DROP\n", entryAddr(i), entryPort(i))
			fmt.Fprintf(&nftRules, "ip saddr %s udp dport %s drop\n", entryAddr(i), entryPort(i))
		}
		pairs := func(sep string) []string {
			return entries(n, func(i int) string { return entryAddr(i) + sep + entryPort(i) })
		}
		add("iptables", IPTables("legacy", rawTable(ipt.String())))
		add("nft-rules", NFTScript(preChain(nftRules.String())))
		add("nft-set", NFTScript(preChain("ip saddr . udp dport @s drop", nftSet("s", "ipv4_addr . inet_service", pairs(" . ")))))
		add("ipset", All(IPSet(ipsetText("hash:ip,port", pairs(",udp:"))),
			IPTables("legacy", rawTable("-A PREROUTING -m set --match-set s src,dst -j DROP\n"))))
	case "jump":
		var chains, nftChains strings.Builder
		var vmap []string
		for i := range n {
			fmt.Fprintf(&chains, ":c%d - [0:0]\n", i)
			fmt.Fprintf(&ipt, "-A c%d -j DROP\n-A PREROUTING -s %s -j c%d\n", i, entryAddr(i), i)
			fmt.Fprintf(&nftChains, "chain c%d { drop; }\n", i)
			fmt.Fprintf(&nftRules, "ip saddr %s jump c%d\n", entryAddr(i), i)
			vmap = append(vmap, fmt.Sprintf("%s : jump c%d", entryAddr(i), i))
		}
		add("iptables", IPTables("legacy", rawTable(chains.String()+ipt.String())))
		add("nft-rules", NFTScript(preChain(nftRules.String(), nftChains.String())))
		add("nft-vmap", NFTScript(preChain("ip saddr vmap @m", nftChains.String(), nftMap("m", "ipv4_addr : verdict", vmap))))
	}
	return cfgs
}

// entryAddr is the i-th entry's address: 10.0.0.1 up, never sent from.
func entryAddr(i int) string {
	i++
	return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
}

// entryPort is the i-th entry's port: 10000 up, never sent to.
func entryPort(i int) string { return fmt.Sprint(10000 + i) }

func entries(n int, f func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// rawTable is an iptables-restore text of the raw table's PREROUTING
// chain.
func rawTable(body string) string {
	return "*raw\n:PREROUTING ACCEPT [0:0]\n" + body + "COMMIT\n"
}

// preChain is an nft script of table ip bench with a prerouting chain at
// raw priority holding rules, and decls (sets, maps, chains) beside it.
func preChain(rules string, decls ...string) string {
	return familyChain("ip", rules, decls...)
}

// familyChain is preChain for a table of the nft family given.
func familyChain(family, rules string, decls ...string) string {
	return "table " + family + " bench {\n" + strings.Join(decls, "") +
		"chain pre {\ntype filter hook prerouting priority raw; policy accept;\n" + rules + "\n}\n}\n"
}

func nftSet(name, typ string, elems []string) string {
	return nftDecl("set", name, typ, elems)
}

func nftMap(name, typ string, elems []string) string {
	return nftDecl("map", name, typ, elems)
}

func nftDecl(kind, name, typ string, elems []string) string {
	s := fmt.Sprintf("%s %s {\ntype %s\n", kind, name, typ)
	if len(elems) > 0 {
		s += "elements = { " + strings.Join(elems, ",\n") + " }\n"
	}
	return s + "}\n"
}

func ipsetText(typ string, elems []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "create s %s maxelem %d\n", typ, max(65536, 2*len(elems)))
	for _, e := range elems {
		fmt.Fprintf(&b, "add s %s\n", e)
	}
	return b.String()
}

// ScaleRow is one config of one family at one SCALE.
type ScaleRow struct {
	Family  string `json:"family"`
	Config  string `json:"config"`
	Scale   int    `json:"scale"`
	Entries int    `json:"entries"`
	// Overhead over the baseline in ns per packet: median, min and max
	// over the rounds.
	OverheadNs  float64 `json:"overhead_ns"`
	OverheadMin float64 `json:"overhead_min_ns"`
	OverheadMax float64 `json:"overhead_max_ns"`
	NsPerPacket float64 `json:"ns_per_packet"`
	LoadMs      float64 `json:"load_ms"`
	Packets     int     `json:"packets"`
}

// DDoSRow is where matching traffic is dropped, and what a packet costs
// there in all (not over a baseline: the baseline delivers to UDP).
type DDoSRow struct {
	Hook        string  `json:"hook"`
	NsPerPacket float64 `json:"ns_per_packet"`
	Min         float64 `json:"min_ns"`
	Max         float64 `json:"max_ns"`
}

// ScaleResult is what Scale measured.
type ScaleResult struct {
	Rounds int        `json:"rounds"`
	Rows   []ScaleRow `json:"rows"`
	DDoS   []DDoSRow  `json:"ddos"`
	// LegacyTableNs is what an empty legacy iptables raw table costs a
	// packet, which the iptables and ipset rows exclude.
	LegacyTableNs float64  `json:"legacy_table_ns"`
	Notes         []string `json:"notes,omitempty"`
}

// attacker is where the DDoS part's traffic comes from.
var attacker = netip.MustParsePrefix("198.19.0.0/16")

// ddosConfigs drop everything from attacker, each at one hook; the
// baseline delivers it to UDP (no socket). tc u32 is left out when the
// kernel has no drop action for it (tcDrop false).
func ddosConfigs(tcDrop bool) []Config {
	src := attacker.String()
	cfgs := []Config{
		{Name: "none (to UDP)"},
		{Name: "iptables raw prerouting", Load: IPTables("legacy", rawTable("-A PREROUTING -s "+src+" -j DROP\n"))},
		{Name: "nft prerouting", Load: NFTScript(preChain("ip saddr " + src + " drop"))},
		{Name: "nft input", Load: NFTScript("table ip bench { chain inp { type filter hook input priority filter; ip saddr " + src + " drop; }\n}\n")},
		{Name: "nft netdev ingress", Load: func(ctx context.Context, lab *netns.Lab) (func() error, error) {
			return NFTScript("table netdev bench { chain ingr { type filter hook ingress device \""+lab.FWIf+
				"\" priority -500; ip saddr "+src+" drop; }\n}\n")(ctx, lab)
		}},
		{Name: "tc bpf (tcx)", Load: TCDropPrefix(attacker)},
		{Name: "xdp", Load: XDPDropPrefix(attacker)},
	}
	if tcDrop {
		cfgs = append(cfgs, Config{Name: "tc u32", Load: TC(u32Drop)})
	}
	return cfgs
}

var u32Drop = []string{"protocol", "ip", "u32", "match", "ip", "src", attacker.String(), "action", "drop"}

// tcDropWorks checks that tc can load a u32 filter with the drop action
// (act_gact) in lab's firewall namespace.
func tcDropWorks(ctx context.Context, lab *netns.Lab) error {
	unload, err := TC(u32Drop)(ctx, lab)
	if err != nil {
		return err
	}
	return unload()
}

// scaleTraffic is 256 sources in attacker (198.19.0.0/16, in the
// benchmarking range): the families' entries never match them, the DDoS
// part's rules all do.
func scaleTraffic(r *rand.Rand) []netip.Addr {
	out := make([]netip.Addr, 256)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{198, 19, byte(r.IntN(256)), byte(r.IntN(254) + 1)})
	}
	return out
}

// ScaleSteps is the number of progress steps Scale takes with o.
func ScaleSteps(o ScaleOptions) int {
	n := 0
	for _, f := range o.Families {
		n += len(o.Steps) * len(scaleConfigs(f, 0))
	}
	return 1 + (n+len(ddosConfigs(true)))*(o.Rounds+1)
}

// Scale runs the scale scenario.
func Scale(ctx context.Context, lab *netns.Lab, o ScaleOptions, p *Progress) (*ScaleResult, error) {
	r := rand.New(rand.NewPCG(5, 17))
	srcs := scaleTraffic(r)
	res := &ScaleResult{Rounds: o.Rounds}
	p.Step("scale: the empty legacy iptables table's own cost")
	var err error
	if res.LegacyTableNs, err = legacyTableCost(ctx, lab, srcs, o.Rounds, o.Packets); err != nil {
		return nil, err
	}
	res.Notes = append(res.Notes, fmt.Sprintf("Legacy iptables tables cannot be removed from a namespace once loaded, so the baseline passes an empty legacy raw table too: the iptables and ipset rows exclude its own cost, %.0f ns per packet (measured before and after registering it).", res.LegacyTableNs))
	for _, f := range o.Families {
		for _, s := range o.Steps {
			n := 10 * s
			po := o.PerPacketOptions
			po.Progress = p.Prefixed(fmt.Sprintf("scale %s, SCALE %d: ", f, s))
			pp, err := PerPacket(ctx, lab, scaleConfigs(f, n), []Traffic{{Name: "miss", Srcs: srcs, Expect: pktgen.ExpectPass}}, po)
			if err != nil {
				return nil, fmt.Errorf("scale %s at SCALE %d: %w", f, s, err)
			}
			for _, c := range pp.Cells[1:] {
				res.Rows = append(res.Rows, ScaleRow{Family: f, Config: c.Config, Scale: s, Entries: n,
					OverheadNs: c.OverheadNs, OverheadMin: c.OverheadMin, OverheadMax: c.OverheadMax,
					NsPerPacket: c.NsPerPacket, LoadMs: ms(pp.LoadTimes[c.Config]), Packets: c.Packets})
			}
		}
	}
	po := o.PerPacketOptions
	po.Progress = p.Prefixed("scale ddos: ")
	tcDrop := true
	if err := tcDropWorks(ctx, lab); err != nil {
		tcDrop = false
		res.Notes = append(res.Notes, fmt.Sprintf("tc u32 not measured: a u32 filter with the drop action does not load here (%v); on Linux 6.18 built without CONFIG_NET_ACT_GACT tc has no drop action. tc bpf (tcx) drops at the same hook.", err))
		p.Add(-(o.Rounds + 1))
	}
	pp, err := PerPacket(ctx, lab, ddosConfigs(tcDrop), []Traffic{{Name: "attack", Srcs: srcs, Local: true, Expect: pktgen.ExpectDrop}}, po)
	if err != nil {
		return nil, fmt.Errorf("scale ddos: %w", err)
	}
	for _, c := range pp.Cells {
		res.DDoS = append(res.DDoS, DDoSRow{Hook: c.Config, NsPerPacket: c.NsPerPacket, Min: c.NsMin, Max: c.NsMax})
	}
	return res, nil
}
