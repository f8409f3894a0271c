package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/ipfence/ipfence/internal/plan"
)

// BaseChainName is the name of ipfence's prerouting base chain before
// conntrack (the policy's priority, raw by default): the bans, and the
// stateless rules. ConnChainName is the one after conntrack, at
// ConnPriority: the connection-aware rules, which packets of known
// connections skip.
const (
	BaseChainName = "prerouting"
	ConnChainName = "inbound"
	// ConnPriority runs after conntrack (-200) and before DNAT (-100),
	// so that rules see the address a packet was sent from and to.
	ConnPriority = -150
)

// FromPlan lowers a plan into the nftables objects that implement it.
//
// The base chain jumps, per rule and family (and per protocol when the rule
// has ports), into the rule's root chain: nothing else, since every rule a
// legitimate packet passes costs it tens of nanoseconds. Loopback and IPv6
// neighbour discovery are accepted where a packet would otherwise be
// blocked: first thing in each blocking rule's hit chain, which only
// packets on their way to a drop or reject reach. A tree layout becomes one verdict map per level and at
// most two chains per level: one whose absent keys mean "in the set" and
// one where they mean "not in the set". Map entries of a level are the
// terminal verdict of uniform buckets or a goto into the next level's
// chain with that bucket's default. The terminal verdict of a rule is a
// goto into its hit chain, which counts and drops/rejects/accepts; "no
// match" is a return to the base chain, which goes on with the next rule.
func FromPlan(p *plan.Plan, d Dynamic) *Program {
	prog := &Program{Table: p.Table}
	for i, r := range p.Rules {
		if r.Backend == plan.XDP {
			continue // in the XDP program, ahead of this table
		}
		for _, d := range []struct {
			on  bool
			dst bool // keyed on the destination: an outbound rule
		}{{r.Direction.In(), false}, {r.Direction.Out(), true}} {
			if !d.on {
				continue
			}
			prefix, hit := rulePrefix(i, r.Name, d.dst), hitName(i, r.Name, d.dst)
			used, v6 := false, false
			for _, l := range []*plan.Layout{r.V4, r.V6} {
				if l.Kind == plan.KindEmpty {
					continue
				}
				fam, name := IPv4, prefix+"_v4"
				if !l.Is4 {
					fam, name, v6 = IPv6, prefix+"_v6", true
				}
				used = true
				c0, s0 := len(prog.Chains), len(prog.Sets)
				lowerLayout(prog, l, fam, name, r.Action, hit)
				if d.dst {
					keyOnDestination(prog.Chains[c0:], prog.Sets[s0:])
				}
			}
			if used {
				prog.Chains = append(prog.Chains, hitChain(hit, r.Hit(), r.Monitor, v6, d.dst))
			}
		}
	}
	for i, s := range BanSets() {
		s.Elems = d.Bans.of(i)
		prog.Sets = append(prog.Sets, s)
	}
	for i, s := range AllowSets() {
		s.Elems = d.Allows.of(i)
		prog.Sets = append(prog.Sets, s)
	}
	prog.Chains = append(prog.Chains, hitChain(BanChain, plan.Drop, false, true, false))
	heads := Heads(p)
	var base []*Chain
	for _, c := range BaseChains(heads, p.Priority, d.Present()) {
		if len(c.Rules) > 0 {
			base = append(base, c)
		}
	}
	if ConnChain(heads, Presence{}) == nil && xdpConnAware(p) {
		// The XDP program looks flows up in conntrack, which tracks a
		// namespace's packets only while some rule needs it.
		base = append(base, &Chain{Name: ConnChainName, Hook: &Hook{Priority: ConnPriority},
			Rules: []Rule{{Known: true, Verdict: Verdict{Kind: Accept}, Comment: "known connections (conntrack for XDP)"}}})
	}
	prog.Chains = append(base, prog.Chains...)
	return prog
}

// BaseChains are the base chains of rule heads at priority with the
// dynamic sets present as pr says: BaseChain (with no rules when it has
// none: a Program leaves it out, an Update's Ensure deletes it), then
// ConnChain and OutChains where the heads make them.
func BaseChains(heads []RuleHead, priority int32, pr Presence) []*Chain {
	out := []*Chain{BaseChain(heads, priority, pr)}
	if c := ConnChain(heads, pr); c != nil {
		out = append(out, c)
	}
	return append(out, OutChains(heads, priority, pr)...)
}

// xdpConnAware reports whether a connection-aware rule runs in XDP.
func xdpConnAware(p *plan.Plan) bool {
	for _, r := range p.Rules {
		if r.Backend == plan.XDP && !r.Stateless {
			return true
		}
	}
	return false
}

// keyOnDestination makes an outbound rule's chains and maps look the
// destination address up.
func keyOnDestination(chains []*Chain, sets []*Set) {
	for _, c := range chains {
		for i := range c.Rules {
			if l := c.Rules[i].Lookup; l != nil {
				l.Dst = true
			}
		}
	}
	for _, s := range sets {
		s.Dst = true
	}
}

// The ban sets and their hit chain. Bans live in sets of their own, apart
// from the compiled layout: single addresses in hash sets, prefixes in
// interval sets, every element with its own timeout.
const (
	BanAddrs4 = "bans_v4"
	BanAddrs6 = "bans_v6"
	BanNets4  = "bannets_v4"
	BanNets6  = "bannets_v6"
	BanChain  = "bans_hit"
)

// BanSets returns the four (empty) ban sets, in the order of Entries'
// fields.
func BanSets() []*Set { return dynamicSets("bans", "bannets", "ipfence ban") }

// The allow sets: entries that beat every rule and ban (`ipfence
// allow`), looked up first in every base chain while they hold
// anything. Like the ban sets, single addresses in hash sets and
// prefixes in interval sets, each element with its own timeout: an
// allowed prefix inside a blocked one is one element, whatever its
// size, never a complement of the block around it.
const (
	AllowAddrs4 = "allows_v4"
	AllowAddrs6 = "allows_v6"
	AllowNets4  = "allownets_v4"
	AllowNets6  = "allownets_v6"
)

// AllowSets returns the four (empty) allow sets, in the order of
// Entries' fields.
func AllowSets() []*Set { return dynamicSets("allows", "allownets", "ipfence allow") }

// dynamicSets are four sets in the order of Entries' fields, named
// addrs_v4, addrs_v6, nets_v4, nets_v6.
func dynamicSets(addrs, nets, comment string) []*Set {
	return []*Set{
		{Name: addrs + "_v4", Family: IPv4, KeyBits: 32, Timeout: true, Comment: comment + ": addresses"},
		{Name: addrs + "_v6", Family: IPv6, KeyBits: 128, Timeout: true, Comment: comment + ": addresses"},
		{Name: nets + "_v4", Family: IPv4, Interval: true, Timeout: true, Comment: comment + ": prefixes"},
		{Name: nets + "_v6", Family: IPv6, Interval: true, Timeout: true, Comment: comment + ": prefixes"},
	}
}

// IsDynamicSet reports whether name is one of the ban or allow sets,
// whose elements come and go apart from the compiled policy.
func IsDynamicSet(name string) bool {
	for _, s := range slices.Concat(BanSets(), AllowSets()) {
		if s.Name == name {
			return true
		}
	}
	return false
}

// Presence says which of the dynamic sets hold anything, each in the
// order of Entries' fields: what the base chains look up (an empty set
// costs every packet a lookup for nothing).
type Presence struct {
	Bans, Allows [4]bool
}

// SameChains reports whether the rule heads a and b make the same base
// chains (BaseChains) at priority, whichever ban and allow sets hold
// elements: heads that differ only in what the chains do not show, such
// as a rule's mode where it does not move the bans.
func SameChains(a, b []RuleHead, priority int32) bool {
	for mask := range 256 {
		var pr Presence
		for i := range 4 {
			pr.Bans[i], pr.Allows[i] = mask&(1<<i) != 0, mask&(16<<i) != 0
		}
		if !reflect.DeepEqual(BaseChains(a, priority, pr), BaseChains(b, priority, pr)) {
			return false
		}
	}
	return true
}

// Entries is what four dynamic sets (ban or allow) hold: single
// addresses (/32, /128) and disjoint prefixes, each with its remaining
// time (Timeout 0: for good).
type Entries struct {
	Addrs4, Addrs6, Nets4, Nets6 Elems
}

func (e Entries) of(i int) Elems {
	return [...]Elems{e.Addrs4, e.Addrs6, e.Nets4, e.Nets6}[i]
}

func (e Entries) present() [4]bool {
	var p [4]bool
	for i := range p {
		p[i] = e.of(i).Len() > 0
	}
	return p
}

// Dynamic is what the ban and allow sets hold.
type Dynamic struct {
	Bans, Allows Entries
}

// Present says which of d's sets hold anything.
func (d Dynamic) Present() Presence {
	return Presence{Bans: d.Bans.present(), Allows: d.Allows.present()}
}

// WithDynamic returns a copy of a Program made by FromPlan whose ban and
// allow sets hold d and whose base chains (heads and priority as
// FromPlan had them) look up the non-empty ones. The copy shares every
// other set and chain with prog, which is left as it was.
func WithDynamic(prog *Program, heads []RuleHead, priority int32, d Dynamic) *Program {
	out := &Program{Table: prog.Table, Sets: slices.Clone(prog.Sets), Chains: slices.Clone(prog.Chains)}
	for j, s := range out.Sets {
		for _, k := range []struct {
			sets []*Set
			es   Entries
		}{{BanSets(), d.Bans}, {AllowSets(), d.Allows}} {
			for i, ds := range k.sets {
				if s.Name == ds.Name {
					cp := *s
					cp.Elems = k.es.of(i)
					out.Sets[j] = &cp
				}
			}
		}
	}
	for _, c := range BaseChains(heads, priority, d.Present()) {
		i := slices.IndexFunc(out.Chains, func(o *Chain) bool { return o.Name == c.Name })
		switch {
		case len(c.Rules) == 0 && i >= 0:
			out.Chains = slices.Delete(out.Chains, i, i+1)
		case len(c.Rules) == 0:
		case i >= 0:
			out.Chains[i] = c
		default:
			out.Chains = append([]*Chain{c}, out.Chains...)
		}
	}
	return out
}

// RuleHead is what the base chain needs to know of a policy rule.
type RuleHead struct {
	Name   string      `json:"name"`
	Action plan.Action `json:"action"`
	Ports  []plan.Port `json:"ports,omitempty"`
	// V4 and V6: the base chain jumps to the rule's chains of the family.
	V4 bool `json:"ipv4,omitempty"`
	V6 bool `json:"ipv6,omitempty"`
	// Stateless: the rule runs in the base chain before conntrack;
	// otherwise in ConnChain, after it.
	Stateless bool `json:"stateless,omitempty"`
	// Direction: inbound rules run in the prerouting chains, outbound
	// ones in OutChains ("" is inbound).
	Direction plan.Direction `json:"direction,omitempty"`
	// Monitor: the rule only counts (plan.Rule.Monitor); it stops
	// nothing, so it does not end the leading accept rules.
	Monitor bool `json:"monitor,omitempty"`
}

// Heads returns the rule heads of a plan. Rules that run in XDP have
// heads of no family: the base chain does not jump to them.
func Heads(p *plan.Plan) []RuleHead {
	hs := make([]RuleHead, len(p.Rules))
	for i, r := range p.Rules {
		nft := r.Backend != plan.XDP
		hs[i] = RuleHead{Name: r.Name, Action: r.Action, Ports: r.Ports, Stateless: r.Stateless, Direction: r.Direction, Monitor: r.Monitor,
			V4: nft && r.V4.Kind != plan.KindEmpty, V6: nft && r.V6.Kind != plan.KindEmpty}
	}
	return hs
}

// BaseChain is the prerouting base chain before conntrack, for rules
// heads at priority (a Program has none when it would have no rules: an
// empty base chain costs every packet the hook's traversal, ~80 ns):
// first the allow sets' lookups (allowLookups) when anything else is
// there, then the lookups of each ban set that holds anything (an
// empty one costs every packet a lookup for nothing), and a jump per rule
// and family (and per protocol when the rule has ports) into the root
// chains of every inbound rule up to the last stateless one. Bans are
// absolute: they drop packets of every connection, and come after the
// leading accept rules only (rules in monitor mode, which stop nothing,
// do not end them), so that an allowlist ahead of everything
// else also wins over bans; those accept rules are here only when bans or
// stateless rules follow them. The plan puts stateless rules before every
// connection-aware blocking rule, so what runs here is accept rules and
// stateless rules, in policy order; accept rules run again in ConnChain
// (an accept ends one base chain only).
func BaseChain(heads []RuleHead, priority int32, pr Presence) *Chain {
	base := &Chain{Name: BaseChainName, Hook: &Hook{Priority: priority}}
	var lookups []Rule
	for i, s := range BanSets() {
		if pr.Bans[i] {
			lookups = append(lookups, Rule{Lookup: &Lookup{Family: s.Family, Set: s.Name},
				Verdict: Verdict{Kind: Goto, Chain: BanChain}, Comment: "ban"})
		}
	}
	last := lastStateless(heads, plan.Direction.In)
	banned := false
	tail := -1 // where the last rule head's jumps start, when they end the chain
	for i, h := range heads {
		if i > last && (banned || len(lookups) == 0) {
			break
		}
		if !h.Direction.In() {
			continue
		}
		if h.Action != plan.Accept && !h.Monitor && !banned {
			banned = true
			base.Rules = append(base.Rules, lookups...)
			tail = -1 // the bans follow the jumps before them
		}
		if i <= last || h.Action == plan.Accept {
			tail = len(base.Rules)
			base.Rules = append(base.Rules, jumps(i, h, false)...)
		}
	}
	if !banned && len(lookups) > 0 {
		base.Rules = append(base.Rules, lookups...)
		tail = -1
	}
	if tail >= 0 {
		endWithGotos(base.Rules[tail:])
	}
	if len(lookups) == 0 && last < 0 {
		base.Rules = nil // leading accept rules alone decide nothing here
	} else {
		base.Rules = append(allowLookups(pr, false), base.Rules...)
	}
	return base
}

// allowLookups are the lookups of the allow sets that hold anything,
// each accepting what it holds (the source address, or with dst the
// destination): first in every base chain that can stop a packet, so
// that an allow entry beats every rule and ban, also inside a blocked
// prefix. An accept ends one base chain only: each one looks them up.
func allowLookups(pr Presence, dst bool) []Rule {
	var out []Rule
	for i, s := range AllowSets() {
		if pr.Allows[i] {
			out = append(out, Rule{Lookup: &Lookup{Family: s.Family, Set: s.Name, Dst: dst},
				Verdict: Verdict{Kind: Accept}, Comment: "allow"})
		}
	}
	return out
}

// lastStateless is the index of the last stateless rule of the
// direction dir asks for, -1 when there is none.
func lastStateless(heads []RuleHead, dir Direction) int {
	last := -1
	for i, h := range heads {
		if dir(h.Direction) && h.Stateless {
			last = i
		}
	}
	return last
}

// ConnChain is the prerouting base chain after conntrack: packets of
// connections conntrack knows (established, related: replies to this
// host's own connections and ICMP errors about them) are accepted first,
// then a jump per connection-aware inbound rule and family judges the
// others (new connections, and packets of none). Nil when no inbound
// rule is connection-aware.
func ConnChain(heads []RuleHead, pr Presence) *Chain {
	return connChain(ConnChainName, &Hook{Priority: ConnPriority}, nil, allowLookups(pr, false), heads, plan.Direction.In, false)
}

// Outbound base chains: OutRawChainName (output, before conntrack) runs
// the stateless outbound rules; OutChainName (output, after conntrack)
// the connection-aware ones for this host's own connections; and
// ForwardChainName both kinds for the clients this host forwards for.
const (
	OutRawChainName  = "output_raw"
	OutChainName     = "outbound"
	ForwardChainName = "forward"
)

// Direction is how a rule's direction is asked about.
type Direction = func(plan.Direction) bool

// OutChains are the base chains of the outbound rules (none when there
// is none): a jump per rule and family into the rule's chains keyed on
// the destination address. As inbound, the allow entries come first
// (keyed on the destination too), then the stateless rules (and the
// accept rules before them), before conntrack where there is one
// (output at priority); then packets of known connections pass; then
// the connection-aware rules judge the new connections.
func OutChains(heads []RuleHead, priority int32, pr Presence) []*Chain {
	last := lastStateless(heads, plan.Direction.Out)
	allow := allowLookups(pr, true)
	lead := slices.Clone(allow) // the allow entries, then the rules up to the last stateless one: accept and stateless rules
	for i, h := range heads[:last+1] {
		if h.Direction.Out() {
			lead = append(lead, jumps(i, h, true)...)
		}
	}
	var out []*Chain
	if last >= 0 {
		out = append(out, &Chain{Name: OutRawChainName, Hook: &Hook{Num: Output, Priority: priority}, Rules: lead})
	}
	if c := connChain(OutChainName, &Hook{Num: Output, Priority: ConnPriority}, nil, allow, heads, plan.Direction.Out, true); c != nil {
		out = append(out, c)
	}
	if c := connChain(ForwardChainName, &Hook{Num: Forward, Priority: ConnPriority}, lead, nil, heads, plan.Direction.Out, true); c != nil {
		out = append(out, c)
	} else if last >= 0 {
		out = append(out, &Chain{Name: ForwardChainName, Hook: &Hook{Num: Forward, Priority: ConnPriority}, Rules: lead})
	}
	return out
}

// connChain is a base chain that runs first, then accepts the packets
// of known connections, then runs allow (the allow entries' lookups: a
// known connection's packets skip them), then jumps into the
// connection-aware rules of the direction dir asks for (keyed on the
// destination when dst) and every accept rule (a stateless one too: its
// accept before conntrack ended that chain only); nil when no rule is
// connection-aware.
func connChain(name string, hook *Hook, first, allow []Rule, heads []RuleHead, dir Direction, dst bool) *Chain {
	var rules []Rule
	aware, lastHead := false, 0
	for i, h := range heads {
		if dir(h.Direction) && (!h.Stateless || h.Action == plan.Accept) {
			lastHead = len(rules)
			rules = append(rules, jumps(i, h, dst)...)
			aware = aware || !h.Stateless
		}
	}
	endWithGotos(rules[lastHead:])
	if !aware {
		return nil
	}
	if len(rules) == 0 {
		return nil
	}
	known := Rule{Known: true, Verdict: Verdict{Kind: Accept}, Comment: "known connections"}
	c := &Chain{Name: name, Hook: hook, Rules: slices.Clone(first)}
	c.Rules = append(append(append(c.Rules, known), allow...), rules...)
	return c
}

// endWithGotos makes the jumps of the last rule head of a base chain,
// the chain's last rules, gotos. Each matches its own family (and
// protocol): once a packet's rule chains let it through and return,
// the base chain would only try the others, which cannot match it; with
// a goto their return ends the base chain at once (its policy, accept),
// saving the packet a rule (~60 ns, BenchmarkRuleShapes).
func endWithGotos(last []Rule) {
	for i := range last {
		last[i].Verdict.Kind = Goto
	}
}

// jumps are the base-chain rules that jump into rule i's chains (its
// outbound ones when dst): one per family it has prefixes of (and per
// protocol of its ports).
func jumps(i int, h RuleHead, dst bool) []Rule {
	var out []Rule
	prefix := rulePrefix(i, h.Name, dst)
	for _, f := range []struct {
		on   bool
		fam  Family
		name string
	}{{h.V4, IPv4, prefix + "_v4"}, {h.V6, IPv6, prefix + "_v6"}} {
		if !f.on {
			continue
		}
		for _, m := range portMatches(h.Ports) {
			out = append(out, Rule{Family: f.fam, Proto: m.proto, Ports: m.ports,
				Verdict: Verdict{Kind: Jump, Chain: f.name}, Comment: h.Name})
		}
	}
	return out
}

// rulePrefix names the chains of rule i: its inbound ones, or with dst
// its outbound ones.
func rulePrefix(i int, name string, dst bool) string {
	if dst {
		return ruleChainPrefix(i, name) + "_out"
	}
	return ruleChainPrefix(i, name)
}

// hitName is rule i's hit chain for inbound packets, or with dst for
// outbound ones (each counts its direction).
func hitName(i int, name string, dst bool) string {
	if dst {
		return ruleChainPrefix(i, name) + "_out_hit"
	}
	return HitChain(i, name)
}

// ruleChainPrefix names the chains of rule i.
func ruleChainPrefix(i int, name string) string { return fmt.Sprintf("r%d_%s", i, sanitize(name)) }

// HitChain is the name of the chain that counts and applies the action of
// rule i (named name) of a plan.
func HitChain(i int, name string) string { return ruleChainPrefix(i, name) + "_hit" }

type portMatch struct {
	proto Proto
	ports []PortRange
}

// portMatches groups a rule's ports by protocol; no ports means one match
// of everything.
func portMatches(ps []plan.Port) []portMatch {
	if len(ps) == 0 {
		return []portMatch{{}}
	}
	var tcp, udp []PortRange
	for _, p := range ps {
		pr := PortRange{p.First, p.Last}
		if p.Proto == "udp" {
			udp = append(udp, pr)
		} else {
			tcp = append(tcp, pr)
		}
	}
	var out []portMatch
	if tcp != nil {
		out = append(out, portMatch{ProtoTCP, tcp})
	}
	if udp != nil {
		out = append(out, portMatch{ProtoUDP, udp})
	}
	return out
}

// hitChain is where a rule's matching packets go: it counts and applies
// action a. Packets a blocking rule must never stop (loopback, IPv6
// neighbour discovery) are accepted first, uncounted. A rule in monitor
// mode (monitor) only counts: what it would stop returns to the base
// chain, which goes on with the next rule as if this one were absent;
// the exempt packets return uncounted, as they would have passed.
func hitChain(name string, a plan.Action, monitor, v6, out bool) *Chain {
	c := &Chain{Name: name}
	exempt := Verdict{Kind: Accept}
	if monitor {
		exempt = Verdict{Kind: Return}
	}
	if a != plan.Accept {
		if !out { // outbound: loopback destinations are protected
			c.Rules = append(c.Rules, Rule{Iif: "lo", Verdict: exempt, Comment: "loopback"})
		}
		if v6 {
			c.Rules = append(c.Rules, Rule{NDP: true, Verdict: exempt, Comment: "IPv6 neighbour discovery"})
		}
	}
	switch {
	case monitor:
		c.Rules = append(c.Rules, Rule{Counter: true, Comment: MonitorComment + string(a)})
	case a == plan.Accept:
		c.Rules = append(c.Rules, Rule{Counter: true, Verdict: Verdict{Kind: Accept}})
	case a == plan.Reject:
		c.Rules = append(c.Rules,
			Rule{Proto: ProtoTCP, Counter: true, Reject: RejectTCPReset},
			Rule{Counter: true, Reject: RejectAdminProhibited})
	default:
		c.Rules = append(c.Rules, Rule{Counter: true, Verdict: Verdict{Kind: Drop}})
	}
	return c
}

// MonitorComment begins the comment of a monitor rule's counting rule
// ("monitor: would drop").
const MonitorComment = "monitor: would "

// lowerLayout adds the chains and maps of one family of one rule. name is
// the rule's root chain for the family.
func lowerLayout(prog *Program, l *plan.Layout, fam Family, name string, a plan.Action, hit string) {
	// Verdicts of the two sides: the hit chain or back to the base chain.
	inV, outV := Verdict{Kind: Goto, Chain: hit}, Verdict{Kind: Return}
	if a == plan.AllowOnly {
		inV, outV = outV, inV
	}
	tail := func(in bool) []Rule { // what an absent key means, as rules
		v := outV
		if in {
			v = inV
		}
		if v.Kind == Return {
			return nil
		}
		return []Rule{{Verdict: v}}
	}
	switch l.Kind {
	case plan.KindAll:
		prog.Chains = append(prog.Chains, &Chain{Name: name, Rules: tail(true)})
		return
	case plan.KindPlain:
		prog.Chains = append(prog.Chains, intervalChain(prog, name, fam, l.Plain, inV, tail(false)))
		return
	}
	if len(l.Rest) > 0 {
		prog.Chains = append(prog.Chains, intervalChain(prog, name+"_rest", fam, l.Rest, inV, tail(false)))
	}
	// Tree: which default chains each level needs.
	need := make([][2]bool, len(l.Levels)) // [level][in?]
	need[l.Root][boolIdx(l.RootIn)] = true
	for _, lv := range l.Levels {
		for _, e := range lv.All() {
			switch e.Kind {
			case plan.DescendIn:
				need[e.Next][1] = true
			case plan.DescendOut:
				need[e.Next][0] = true
			}
		}
	}
	// The chain names, made once: map elements share them.
	names := make([][2]string, len(l.Levels))
	for j, lv := range l.Levels {
		for _, in := range []bool{false, true} {
			names[j][boolIdx(in)] = fmt.Sprintf("%s_d%d_l%d_%s", name, lv.Depth, lv.Bits, map[bool]string{true: "in", false: "out"}[in])
		}
	}
	chainName := func(j int32, in bool) string {
		if int(j) == l.Root && in == l.RootIn {
			return name
		}
		return names[j][boolIdx(in)]
	}
	// IPv6 maps are keyed on the address's leading words: the kernel's
	// 4-byte fast paths make a lookup about twice as cheap.
	key := KeyAddress
	if fam == IPv6 {
		key = KeyWords
	}
	for j, lv := range l.Levels {
		m := &Set{Name: fmt.Sprintf("%s_d%d_l%d", name, lv.Depth, lv.Bits), Family: fam, KeyBits: lv.Bits, Key: key, IsMap: true,
			Comment: fmt.Sprintf("lookup %d: /%d buckets", lv.Depth, lv.Bits)}
		m.Elems.Grow(lv.Len())
		for _, e := range lv.All() {
			var v Verdict
			switch e.Kind {
			case plan.In:
				v = inV
			case plan.Out:
				v = outV
			case plan.DescendIn:
				v = Verdict{Kind: Goto, Chain: chainName(e.Next, true)}
			case plan.DescendOut:
				v = Verdict{Kind: Goto, Chain: chainName(e.Next, false)}
			case plan.DescendRest:
				v = Verdict{Kind: Goto, Chain: name + "_rest"}
			}
			m.Elems.Append(Elem{Key: e.Key(), Verdict: v})
		}
		var rules []Rule
		if lv.Bitmap {
			rules = bitmapRules(prog, m, lv, name, inV, outV)
		} else {
			prog.Sets = append(prog.Sets, m)
			rules = []Rule{{Lookup: &Lookup{Family: fam, MaskBits: lv.Bits, Key: key, Set: m.Name, IsMap: true}}}
		}
		for _, in := range []bool{false, true} {
			if !need[j][boolIdx(in)] {
				continue
			}
			prog.Chains = append(prog.Chains, &Chain{Name: chainName(int32(j), in), Rules: append(slices.Clip(rules), tail(in)...)})
		}
	}
}

// bitmapRules lowers the entries of a Bitmap level (plan.Level): it moves
// them all out of map m into one KeyHalf set per verdict (the kernel
// keeps them as bitmaps) and returns the rules that look them up, in the
// order of lv.Order: the busiest first.
func bitmapRules(prog *Program, m *Set, lv plan.Level, name string, inV, outV Verdict) []Rule {
	sets := map[Verdict]*Set{}
	rank := map[Verdict]int{}
	var order []Verdict
	for k, e := range m.Elems.All() {
		b := sets[e.Verdict]
		if b == nil {
			var side string
			switch {
			case e.Verdict == inV:
				side = "in"
			case e.Verdict == outV:
				side = "out"
			default: // a mixed bucket: where it is looked up next
				side = strings.TrimPrefix(e.Verdict.Chain, name+"_")
			}
			b = &Set{Name: m.Name + "_" + side, Family: m.Family, KeyBits: m.KeyBits, Key: KeyHalf,
				Comment: m.Comment + " " + side + " (bitmap)"}
			sets[e.Verdict] = b
			order = append(order, e.Verdict)
			rank[e.Verdict] = len(lv.Order)
			if i := slices.Index(lv.Order, lv.Entry(k).Kind); i >= 0 {
				rank[e.Verdict] = i
			}
		}
		b.Elems.Append(Elem{Key: e.Key})
	}
	// In the plan's order (busiest first), then by name.
	slices.SortStableFunc(order, func(a, b Verdict) int {
		if c := cmp.Compare(rank[a], rank[b]); c != 0 {
			return c
		}
		return strings.Compare(sets[a].Name, sets[b].Name)
	})
	var rules []Rule
	for _, v := range order {
		b := sets[v]
		prog.Sets = append(prog.Sets, b)
		rules = append(rules, Rule{Lookup: &Lookup{Family: m.Family, MaskBits: m.KeyBits, Key: KeyHalf, Set: b.Name}, Verdict: v})
	}
	return rules
}

// intervalChain is a chain deciding by an interval set of prefixes:
// in the set → inV, else what outTail says.
func intervalChain(prog *Program, name string, fam Family, ps []netip.Prefix, inV Verdict, outTail []Rule) *Chain {
	set := &Set{Name: name + "_set", Family: fam, Interval: true}
	for _, p := range ps {
		set.Elems.Append(Elem{Key: p})
	}
	prog.Sets = append(prog.Sets, set)
	rules := []Rule{{Lookup: &Lookup{Family: fam, Set: set.Name}, Verdict: inV}}
	return &Chain{Name: name, Rules: append(rules, outTail...)}
}

func boolIdx(b bool) int {
	if b {
		return 1
	}
	return 0
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_]`)

// sanitize makes a rule name usable inside nft object names.
func sanitize(s string) string {
	s = unsafeName.ReplaceAllString(s, "_")
	if len(s) > 24 {
		s = s[:24]
	}
	return s
}
