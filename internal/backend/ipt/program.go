// Package ipt is ipfence's iptables backends, for hosts without nftables:
// ipset (sources matched against ipsets) and iptables-split (a tree of
// chains of plain rules, split by address block).
//
// FromPlan lowers a plan into a Program: a small, closed model of exactly
// the objects ipfence creates (ipsets, chains in the raw and mangle
// tables, and a reject chain in the filter table), pure and testable
// without root. Render writes it as `ipset restore` and
// `iptables-restore` input, and Apply loads it: sets filled beside the
// live ones and swapped in, each family's chains replaced in one
// iptables-restore commit per table.
//
// Where the rules run, in the order a packet meets them:
//
//	raw PREROUTING -> Main       bans (ipset), then the stateless inbound
//	                             rules (and accept rules before them):
//	                             before conntrack, every packet
//	mangle PREROUTING -> -in     RETURN for packets Main rejected or
//	                             accepted (marks), RETURN for the packets
//	                             of connections conntrack knows
//	                             (ESTABLISHED, RELATED: replies to the
//	                             host's own connections, ICMP errors),
//	                             then the other inbound rules
//	mangle OUTPUT, FORWARD -> -out  the stateless outbound rules, RETURN
//	                             for known connections, the others; by
//	                             destination
//	filter INPUT, FORWARD, OUTPUT   reject the packets a reject rule
//	                             marked (RejectMark): only the filter
//	                             table can
//
// Bans and stateless rules stay before conntrack, where dropping costs
// least and replies are judged too; the mangle table is the first after
// conntrack (priority -150, conntrack -200) and, unlike the filter
// table, where an ACCEPT would skip the host's own filter rules, it
// decides nothing for the host's firewall. An accept rule that runs in
// raw marks the packets it accepts (PassMark), so that the rules in
// mangle let them pass, and -in clears the mark.
//
// The ipset backend's chains send a packet by goto to the hit chain of
// the first rule that matches it, so a RETURN there returns to the
// built-in chain: accepted packets go on through the host's own rules of
// the table, as they do past ipfence's nftables table. The split
// backend's chains call (-j) each rule's tree of chains in turn, and a
// packet the tree does not match returns for the next rule; its hit
// chains accept with ACCEPT, which ends the table's built-in chain for
// that packet. (Trees chained by gotos, rule to rule, would keep the
// first design, but nest as deep as all the trees together: nf_tables,
// under iptables-nft, refuses rulesets more than 16 chains deep and
// counts gotos.)
package ipt

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"net/netip"
	"regexp"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// Family is IPv4 (iptables, ipset family inet) or IPv6 (ip6tables, inet6).
type Family uint8

const (
	IPv4 Family = iota
	IPv6
)

func (f Family) String() string { return [...]string{"ipv4", "ipv6"}[f] }

// Command is the family's iptables command: "iptables" or "ip6tables".
func (f Family) Command() string { return [...]string{"iptables", "ip6tables"}[f] }

// Program is everything ipfence puts into iptables and ipset for a plan.
type Program struct {
	// Backend is plan.IPSet or plan.IPTablesSplit.
	Backend plan.Backend
	// Prefix starts the name of every chain and set (the plan's table
	// name): Main is the chain PREROUTING jumps to, RejectChain the
	// filter chain INPUT and FORWARD jump to for marked packets.
	Prefix string
	// Sets are the ipsets, of both families (ipset backend only).
	Sets []*Set
	// Tables are the chains of each family (Tables[IPv4], Tables[IPv6]).
	Tables [2]Tables
	// RejectMark is the packet mark bit that tells the filter table to
	// reject a packet a reject rule matched in raw or mangle (they
	// cannot reject).
	RejectMark uint32
	// PassMark is the mark bit an accept rule that runs in raw sets when
	// rules run after conntrack too, which let the packet pass and clear
	// the bit: the bit above RejectMark (below it, when RejectMark is
	// the top bit).
	PassMark uint32
	// Bans says Main starts by dropping the sources in the ban sets
	// (BanSet), which bans go into one by one with their time (Ban),
	// and every chain by letting through the allow entries (AllowSet).
	// Loads create them when missing and never replace them.
	Bans bool
}

// Tables are one family's chains.
type Tables struct {
	// Raw are the chains of the raw table, Main first: the bans and the
	// inbound rules that run before conntrack (the stateless ones, and
	// the accept rules before them). None when there are neither.
	Raw []*Chain
	// Mangle are the chains of the mangle table: InChain, with the
	// other inbound rules, and OutChain, with the outbound rules, each
	// first of its chains and only when it has rules.
	Mangle []*Chain
	// Reject says whether the family has reject rules, which need the
	// filter table's reject chain.
	Reject bool
}

// NumChains is how many chains t holds (the reject chain not counted).
func (t *Tables) NumChains() int { return len(t.Raw) + len(t.Mangle) }

// Set is one ipset.
type Set struct {
	Name   string
	Type   string // "hash:net" or "hash:ip"
	Family Family
	Elems  []netip.Prefix
	// HashSize and MaxElem are sized from Elems: ipset's default maxelem
	// (65536) is the classic "Hash is full" failure of big lists.
	HashSize, MaxElem int
}

// Chain is one user chain.
type Chain struct {
	Name  string
	Rules []Rule
}

// Rule is one iptables rule, of the few shapes ipfence writes.
type Rule struct {
	Iif        string       // "-i lo"
	Oif        string       // "-o lo"
	ICMPv6Type uint8        // neighbour and router discovery (133-137)
	Src        netip.Prefix // "-s", when valid
	NotSrc     netip.Prefix // "! -s", when valid
	Dst        netip.Prefix // "-d", when valid
	NotDst     netip.Prefix // "! -d", when valid
	Proto      string       // "tcp" or "udp", with Ports
	Ports      []plan.Port  // one protocol's ranges (at most 15 ports' worth: multiport)
	Sets       []SetMatch   // "-m set [!] --match-set NAME src|dst", all must match
	Mark       uint32       // "-m mark --mark M/M", when not 0
	CtState    string       // "-m conntrack --ctstate S", when not ""
	Target     Target
	Comment    string
}

// SetMatch is a match of the source (or destination) against a set.
type SetMatch struct {
	Set    string
	Negate bool
	Dst    bool
}

// TargetKind is what a rule does with matching packets.
type TargetKind uint8

const (
	Goto         TargetKind = iota + 1 // -g Chain
	Return                             // -j RETURN
	DropPacket                         // -j DROP
	SetMark                            // -j MARK --set-xmark Mark/Mark (then the next rule)
	ClearMark                          // -j MARK --set-xmark 0x0/Mark (then the next rule)
	RejectTCP                          // -j REJECT --reject-with tcp-reset
	RejectOther                        // -j REJECT with ICMP admin-prohibited
	Jump                               // -j Chain
	AcceptPacket                       // -j ACCEPT
)

// Target is a rule's target.
type Target struct {
	Kind  TargetKind
	Chain string // Goto, Jump
	Mark  uint32 // SetMark, ClearMark
}

// DefaultRejectMark is the mark bit reject rules set when the policy does
// not choose one: a bit that kube-proxy, Docker, Cilium and Istio leave
// alone (Calico uses the top 16 bits by default: choose another there).
const DefaultRejectMark uint32 = 0x00100000

// LowerOptions are FromPlan's choices.
type LowerOptions struct {
	// RejectMark is the mark bit of rejected packets; 0 is
	// DefaultRejectMark.
	RejectMark uint32
	// Flavour is the iptables flavour the program is for (Legacy or NFT;
	// "" is Legacy). The split backend makes fewer, longer chains for
	// NFT: iptables-nft-restore looks the chain of every jump up in a
	// list, so a load costs rules × chains (200k prefixes in 31k chains:
	// 29 s, against 1 s in legacy).
	Flavour string
	// Bans adds the ban sets (ipset backend only; see Program.Bans).
	Bans bool
}

// ErrBans is returned for bans asked of the split backend, which has no
// sets to hold them.
var ErrBans = errors.New("bans need the ipset backend here (iptables-split has no sets)")

// Name limits: iptables chain names have at most 28 characters and ipset
// names 31; ipfence adds to its prefix at most "-r255-b9999999" (split
// chains: a rule of millions of prefixes) and 19 characters for a
// temporary set (see SetName).
const maxPrefix = 12

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ErrName is returned for a table name iptables and ipset cannot carry.
var ErrName = errors.New("name too long or invalid for iptables and ipset")

// ErrTooManyRules is returned for a policy with more rules than the
// names allow.
var ErrTooManyRules = errors.New("too many rules for the iptables backends")

// MaxRules is the most rules the iptables backends run.
const MaxRules = 256

// FromPlan lowers the plan's rules (all of them: the iptables backends do
// not run beside XDP) into a Program.
func FromPlan(p *plan.Plan, opt LowerOptions) (*Program, error) {
	if !p.Backend.IPTables() {
		return nil, fmt.Errorf("ipt: plan backend %s is not ipset or iptables-split", p.Backend)
	}
	if len(p.Table) > maxPrefix || !validPrefix.MatchString(p.Table) {
		return nil, fmt.Errorf("table name %q: %w: use at most %d letters, digits, _ and -", p.Table, ErrName, maxPrefix)
	}
	if len(p.Rules) > MaxRules {
		return nil, fmt.Errorf("%w: %d rules, at most %d", ErrTooManyRules, len(p.Rules), MaxRules)
	}
	if opt.Bans && p.Backend != plan.IPSet {
		return nil, ErrBans
	}
	prog := &Program{Backend: p.Backend, Prefix: p.Table, RejectMark: opt.RejectMark, Bans: opt.Bans}
	if prog.RejectMark == 0 {
		prog.RejectMark = DefaultRejectMark
	}
	prog.PassMark = prog.RejectMark << 1
	if prog.PassMark == 0 {
		prog.PassMark = prog.RejectMark >> 1
	}
	// Each rule's prefixes, by family, listed once for both families.
	prefixes := make([][2][]netip.Prefix, len(p.Rules))
	for i, r := range p.Rules {
		for _, pr := range prefix.Prefixes(r.Set) {
			f := IPv6
			if pr.Addr().Is4() {
				f = IPv4
			}
			prefixes[i][f] = append(prefixes[i][f], pr)
		}
	}
	inRaw, outLead := leading(p.Rules, plan.Direction.In), leading(p.Rules, plan.Direction.Out)
	sets := map[string]bool{}
	for _, f := range []Family{IPv4, IPv6} {
		lw := lowering{prog: prog, fam: f, nft: opt.Flavour == NFT, sets: sets}
		var rules []int // the rules with addresses of the family
		afterCT := false
		for i, r := range p.Rules {
			l := r.V4
			if f == IPv6 {
				l = r.V6
			}
			if l.Kind != plan.KindEmpty {
				rules = append(rules, i)
				afterCT = afterCT || r.Direction.In() && i >= inRaw
			}
		}
		raw := lw.stage(prog.Main(), false)
		if afterCT {
			raw.mark = prog.PassMark
		}
		if prog.Bans {
			// Bans are guarded when made (never a protected or own
			// address), so they need no loopback or discovery pass.
			raw.main.Rules = append(raw.main.Rules, Rule{Sets: []SetMatch{{Set: prog.BanSet(f)}}, Target: Target{Kind: DropPacket}, Comment: "ipfence bans"})
		}
		for _, i := range rules {
			if i < inRaw && p.Rules[i].Direction.In() {
				raw.rule(i, p.Rules[i], prefixes[i][f])
			}
		}
		in := lw.stage(prog.InChain(), false)
		if raw.reject {
			in.main.Rules = append(in.main.Rules, Rule{Mark: prog.RejectMark, Target: Target{Kind: Return}, Comment: "rejected before conntrack"})
		}
		if raw.accept {
			in.main.Rules = append(in.main.Rules, Rule{Mark: prog.PassMark, Target: Target{Kind: Goto, Chain: prog.PassChain()}, Comment: "accepted before conntrack"})
			in.below = append(in.below, &Chain{Name: prog.PassChain(), Rules: []Rule{{Target: Target{Kind: ClearMark, Mark: prog.PassMark}}}})
		}
		in.main.Rules = append(in.main.Rules, knownConnections)
		out := lw.stage(prog.OutChain(), true)
		known := false // out has knownConnections
		for _, i := range rules {
			r := p.Rules[i]
			if r.Direction.In() && i >= inRaw {
				in.rule(i, r, prefixes[i][f])
			}
			if !r.Direction.Out() {
				continue
			}
			if i >= outLead && !known {
				out.main.Rules, known = append(out.main.Rules, knownConnections), true
			}
			out.rule(i, r, prefixes[i][f])
		}
		if !afterCT {
			in.main.Rules = nil
		}
		if prog.Bans {
			// Allow entries first in every chain there is: they beat
			// every rule and ban (an ACCEPT there would end one table
			// only; a RETURN leaves each of ipfence's chains).
			for _, s := range []*stage{raw, in, out} {
				if len(s.main.Rules) > 0 {
					allow := Rule{Sets: []SetMatch{{Set: prog.AllowSet(f), Dst: s.out}}, Target: Target{Kind: Return}, Comment: "ipfence allow entries"}
					s.main.Rules = append([]Rule{allow}, s.main.Rules...)
				}
			}
		}
		lw.t.Raw = raw.chains()
		lw.t.Mangle = append(in.chains(), out.chains()...)
		prog.Tables[f] = lw.t
	}
	return prog, nil
}

// knownConnections lets the packets of the connections conntrack knows
// pass a stage after conntrack: only the rules before it, the stateless
// ones, judge them.
// Mark is the comment of the rule that ends each chain a built-in chain
// jumps to (the entry of each table's chains), and of those jumps:
// ipfence's proof that the chains of its name are its own, since
// iptables chains have no comments. The rule returns, as the chain's end would: it changes no
// verdict. ipset has no set comments: ipfence's sets are known by their
// names (the table's, a content hash and a kind, see setPattern), and
// touched only beside its own chains or where no chain of the name is.
const Mark = "ipfence-owned"

var ownerMark = Rule{Target: Target{Kind: Return}, Comment: Mark}

var knownConnections = Rule{CtState: "RELATED,ESTABLISHED", Target: Target{Kind: Return}, Comment: "known connections"}

// leading returns the index after the last stateless rule of the
// direction dir says yes to: the rules before it run before conntrack
// (inbound) or judge established packets too (outbound). The plan
// refuses stateless rules after connection-aware blocking ones, so
// every rule there is stateless or an accept rule (which accepts the
// established packets of its sources too: they pass either way, unless
// a later stateless rule would drop them).
func leading(rules []*plan.Rule, dir func(plan.Direction) bool) int {
	n := 0
	for i, r := range rules {
		if dir(r.Direction) && r.Stateless {
			n = i + 1
		}
	}
	return n
}

// Main is the name of the raw table's chain PREROUTING jumps to.
func (p *Program) Main() string { return p.Prefix }

// InChain is the name of the mangle table's chain PREROUTING jumps to,
// for the inbound rules after conntrack.
func (p *Program) InChain() string { return p.Prefix + "-in" }

// OutChain is the name of the mangle table's chain OUTPUT and FORWARD
// jump to, for the outbound rules.
func (p *Program) OutChain() string { return p.Prefix + "-out" }

// PassChain is the name of the mangle chain that clears PassMark.
func (p *Program) PassChain() string { return p.Prefix + "-pass" }

// RejectChain is the name of the filter chain that rejects marked packets.
func (p *Program) RejectChain() string { return p.Prefix + "-reject" }

// HitChain is the name of the chain that counts and applies rule i's
// action to inbound packets.
func (p *Program) HitChain(i int) string { return fmt.Sprintf("%s-h%d", p.Prefix, i) }

// OutHitChain is the name of the chain that counts and applies rule i's
// action to outbound packets.
func (p *Program) OutHitChain(i int) string { return fmt.Sprintf("%s-o%d", p.Prefix, i) }

// SetName names the set of rule r's single addresses (kind "a") or
// prefixes ("n") of family f: the prefix, the start of the rule's name and
// a hash of all of it, a letter for the action, the kind and family
// ("ipfence-feeds1a2bd-n4"). A set keeps its name while its rule keeps
// name and action, so a reload swaps the new content in under the rules
// in force; a rule whose action changes gets new sets, which only the new
// rules use. Inbound and outbound rules match the same set.
func (p *Program) SetName(r *plan.Rule, kind string, f Family) string {
	short := unsafeName.ReplaceAllString(r.Name, "_")
	if len(short) > 6 {
		short = short[:6]
	}
	h := fnv.New32a()
	h.Write([]byte(r.Name))
	act := map[plan.Action]byte{plan.Drop: 'd', plan.Reject: 'r', plan.Accept: 'a', plan.AllowOnly: 'o'}[r.Action]
	return fmt.Sprintf("%s-%s%04x%c-%s%d", p.Prefix, short, h.Sum32()&0xffff, act, kind, 4+2*int(f))
}

// BanSet is the name of family f's ban set ("ipfence-ban4").
func (p *Program) BanSet(f Family) string { return dynSet(p.Prefix, KindBan, f) }

// AllowSet is the name of family f's allow set ("ipfence-allow4").
func (p *Program) AllowSet(f Family) string { return dynSet(p.Prefix, KindAllow, f) }

// SetKind is a kind of the ipset backend's dynamic sets, whose elements
// come and go apart from the program, each with its own timeout.
type SetKind string

// The dynamic sets: bans (dropped first) and allow entries (let
// through before everything, bans included).
const (
	KindBan   SetKind = "ban"
	KindAllow SetKind = "allow"
)

// dynSet is the name of family f's set of kind of prefix's program.
func dynSet(prefix string, kind SetKind, f Family) string {
	return fmt.Sprintf("%s-%s%d", prefix, kind, 4+2*int(f))
}

// dynSets are the names of every dynamic set of prefix's program.
func dynSets(prefix string) []string {
	var out []string
	for _, k := range []SetKind{KindBan, KindAllow} {
		out = append(out, dynSet(prefix, k, IPv4), dynSet(prefix, k, IPv6))
	}
	return out
}

// TempSuffix ends the name of the set a new content is loaded into
// before it is swapped with the live set.
const TempSuffix = "-t"

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_]`)

// setPattern matches the names SetName gives with prefix, temporary
// ones included, and the ban and allow sets.
func setPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-([A-Za-z0-9_]{0,6}[0-9a-f]{4}[drao]-[na][46](` + TempSuffix + `)?|(ban|allow)[46](` + TempSuffix + `)?)$`)
}

// lowering builds one family's chains.
type lowering struct {
	prog *Program
	fam  Family
	nft  bool // for iptables-nft (LowerOptions.Flavour)
	t    Tables
	sets map[string]bool // the sets made, of both families
}

// stage is one chain a hook jumps to and the rules it runs: the raw
// table's Main, the mangle table's InChain or OutChain.
type stage struct {
	lw   *lowering
	main *Chain
	out  bool   // judges destinations (outbound)
	mark uint32 // the mark accept rules set (PassMark), when not 0
	// below are the chains below main: trees, hit chains.
	below []*Chain
	// reject and accept say whether it has reject rules and accept
	// rules that mark.
	reject, accept bool
}

func (lw *lowering) stage(name string, out bool) *stage {
	return &stage{lw: lw, main: &Chain{Name: name}, out: out}
}

// chains are the stage's chains, main first; none when main has no
// rules.
func (s *stage) chains() []*Chain {
	if len(s.main.Rules) == 0 {
		return nil
	}
	return append([]*Chain{s.main}, s.below...)
}

// match returns r matching the address p (or every other address,
// with not): the source, or for outbound stages the destination.
func (s *stage) match(r Rule, p netip.Prefix, not bool) Rule {
	switch {
	case s.out && not:
		r.NotDst = p
	case s.out:
		r.Dst = p
	case not:
		r.NotSrc = p
	default:
		r.Src = p
	}
	return r
}

// rule lowers rule i, of prefixes ps in the family, into the stage.
func (s *stage) rule(i int, r *plan.Rule, ps []netip.Prefix) {
	hit := s.hitChain(i, r).Name
	if s.lw.prog.Backend == plan.IPSet {
		s.ipsetRule(r, hit, ps)
		return
	}
	entry := s.lw.prog.splitEntry(i, s.out)
	s.main.Rules = append(s.main.Rules, Rule{Target: Target{Kind: Jump, Chain: entry}})
	s.splitRule(entry, r, hit, ps)
}

// hitChain adds the chain that counts and applies rule i's action. A
// blocking rule first lets loopback and (IPv6) neighbour discovery
// through, which no rule may block. It lets packets through past
// ipfence's other rules with pass (see the package comment).
func (s *stage) hitChain(i int, r *plan.Rule) *Chain {
	lw := s.lw
	c := &Chain{Name: lw.prog.HitChain(i)}
	lo := Rule{Iif: "lo"}
	if s.out {
		c.Name, lo = lw.prog.OutHitChain(i), Rule{Oif: "lo"}
	}
	pass := Target{Kind: Return}
	if lw.prog.Backend == plan.IPTablesSplit {
		pass = Target{Kind: AcceptPacket}
	}
	comment := "ipfence rule " + r.Name
	a := r.Hit()
	if a != plan.Accept {
		lo.Target, lo.Comment = pass, "loopback"
		c.Rules = append(c.Rules, lo)
		if lw.fam == IPv6 {
			for typ := uint8(133); typ <= 137; typ++ {
				c.Rules = append(c.Rules, Rule{ICMPv6Type: typ, Target: pass, Comment: "IPv6 neighbour discovery"})
			}
		}
	}
	switch {
	case a == plan.Accept && s.mark != 0:
		s.accept = true
		c.Rules = append(c.Rules, Rule{Target: Target{Kind: SetMark, Mark: s.mark}, Comment: comment}, Rule{Target: pass})
	case a == plan.Accept:
		c.Rules = append(c.Rules, Rule{Target: pass, Comment: comment})
	case a == plan.Reject:
		lw.t.Reject, s.reject = true, true
		c.Rules = append(c.Rules, Rule{Target: Target{Kind: SetMark, Mark: lw.prog.RejectMark}, Comment: comment},
			Rule{Target: pass})
	default:
		c.Rules = append(c.Rules, Rule{Target: Target{Kind: DropPacket}, Comment: comment})
	}
	s.below = append(s.below, c)
	return c
}

// ipsetRule puts rule r, of prefixes ps in the family, into the stage's
// main chain: per port group, one rule per set that sends members to
// the hit chain, or for allow-only one rule that sends non-members of
// every set there.
func (s *stage) ipsetRule(r *plan.Rule, hit string, ps []netip.Prefix) {
	lw := s.lw
	if len(ps) == 1 && ps[0].Bits() == 0 {
		// The whole family (an accept rule's): no set holds a /0.
		if r.Action != plan.AllowOnly {
			for _, pm := range portGroups(r.Ports) {
				s.main.Rules = append(s.main.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports,
					Target: Target{Kind: Goto, Chain: hit}, Comment: r.Name})
			}
		}
		return
	}
	// ipset cannot hold the null address (0.0.0.0, ::): an allow-only
	// rule leaves it alone, the others match it with a rule of its own.
	var null netip.Prefix
	if len(ps) > 0 && ps[0].Addr().IsUnspecified() && ps[0].IsSingleIP() {
		null, ps = ps[0], ps[1:]
	}
	var nets, addrs []netip.Prefix
	for _, p := range ps {
		if p.IsSingleIP() {
			addrs = append(addrs, p)
		} else {
			nets = append(nets, p)
		}
	}
	var matches []SetMatch
	for _, k := range []struct {
		typ, kind string
		elems     []netip.Prefix
	}{{"hash:net", "n", nets}, {"hash:ip", "a", addrs}} {
		if len(k.elems) == 0 {
			continue
		}
		name := lw.prog.SetName(r, k.kind, lw.fam)
		if !lw.sets[name] {
			lw.sets[name] = true
			lw.prog.Sets = append(lw.prog.Sets, newSet(name, k.typ, lw.fam, k.elems))
		}
		matches = append(matches, SetMatch{Set: name, Negate: r.Action == plan.AllowOnly, Dst: s.out})
	}
	for _, pm := range portGroups(r.Ports) {
		base := Rule{Proto: pm.Proto, Ports: pm.Ports, Target: Target{Kind: Goto, Chain: hit}, Comment: r.Name}
		if r.Action == plan.AllowOnly {
			m := base
			if null.IsValid() {
				m = s.match(base, null, true)
			}
			m.Sets = matches
			s.main.Rules = append(s.main.Rules, m)
			continue
		}
		if null.IsValid() {
			s.main.Rules = append(s.main.Rules, s.match(base, null, false))
		}
		for _, sm := range matches {
			m := base
			m.Sets = []SetMatch{sm}
			s.main.Rules = append(s.main.Rules, m)
		}
	}
}

// newSet sizes a set for elems: a power-of-two hash size of at least the
// element count (one element per bucket on average), and room for twice
// the elements before "Hash is full".
func newSet(name, typ string, f Family, elems []netip.Prefix) *Set {
	hs := 1024
	for hs < len(elems) {
		hs *= 2
	}
	return &Set{Name: name, Type: typ, Family: f, Elems: elems, HashSize: hs, MaxElem: max(65536, 2*hs)}
}

// PortGroup is one protocol's port ranges that one multiport match holds
// (at most 15 ports, a range counting two); no Proto: every packet.
type PortGroup struct {
	Proto string
	Ports []plan.Port
}

// portGroups splits a rule's ports into multiport groups, by protocol;
// none means one group of every packet.
func portGroups(ps []plan.Port) []PortGroup {
	if len(ps) == 0 {
		return []PortGroup{{}}
	}
	var out []PortGroup
	for _, proto := range []string{"tcp", "udp"} {
		var cur []plan.Port
		n := 0
		for _, p := range ps {
			if p.Proto != proto {
				continue
			}
			w := 1
			if p.First != p.Last {
				w = 2
			}
			if n+w > 15 {
				out = append(out, PortGroup{proto, cur})
				cur, n = nil, 0
			}
			cur, n = append(cur, p), n+w
		}
		if cur != nil {
			out = append(out, PortGroup{proto, cur})
		}
	}
	return out
}

// The split backend's tree: a chain holding more than splitLeaf prefixes
// is split by the next splitStride bits of the address (at most 16 blocks
// per chain, plus the prefixes shorter than its blocks). iptables walks a
// chain rule by rule, so a packet pays for the rules of each chain on its
// path: a few dozen at most, where one chain per /8 costs hundreds (IPv4)
// and a chain per /16 thousands (IPv6 country data).
//
// For iptables-nft, a rule's tree has leaves of at least len/splitChainsNFT
// prefixes: about 3,000 chains for 160k prefixes, twice to three times
// the rules on a packet's path.
//
// A tree is at most splitDepth chains deep below the rule's entry: with
// PREROUTING, the main chain, the entry, the port match and the hit chain
// that is 15 levels, within nf_tables' 16 (deeper trees are rare: the
// prefixes of each level's blocks must all share a long prefix).
const (
	splitStride    = 4
	splitLeaf      = 32
	splitChainsNFT = 512
	splitDepth     = 10
)

// splitEntry names the entry chain of rule i for the split backend:
// "-r<i>" inbound, "-d<i>" outbound (by destination).
func (p *Program) splitEntry(i int, out bool) string {
	if out {
		return fmt.Sprintf("%s-d%d", p.Prefix, i)
	}
	return fmt.Sprintf("%s-r%d", p.Prefix, i)
}

// splitRule lowers a rule for the split backend into chains the stage's
// main chain calls, which return to it when the rule does not decide:
//
//	entry:  per port group "-p P --dports X -g match", then RETURN
//	        (without ports, entry is the match chain)
//	match:  the root of the rule's tree (see splitTree)
//
// where matching prefixes go to IN, the hit chain, and the rest to OUT,
// RETURN; allow-only rules swap the two.
func (s *stage) splitRule(name string, r *plan.Rule, hit string, ps []netip.Prefix) {
	in, out := Target{Kind: Goto, Chain: hit}, Target{Kind: Return}
	if r.Action == plan.AllowOnly {
		in, out = out, in
	}
	match := &Chain{Name: name}
	if len(r.Ports) > 0 {
		entry := match
		match = &Chain{Name: name + "-m"}
		s.below = append(s.below, entry)
		for _, pm := range portGroups(r.Ports) {
			entry.Rules = append(entry.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports, Target: Target{Kind: Goto, Chain: match.Name}, Comment: r.Name})
		}
		entry.Rules = append(entry.Rules, Rule{Target: Target{Kind: Return}})
	}
	t := splitTree{s: s, name: name, in: in, out: out, leaf: splitLeaf}
	if s.lw.nft {
		t.leaf = max(t.leaf, len(ps)/splitChainsNFT)
	}
	t.chain(match, ps, 0)
}

// splitTree builds one rule's tree of chains.
type splitTree struct {
	s       *stage
	name    string
	in, out Target
	n       int // chains made, for their names
	leaf    int // the most prefixes a chain holds unsplit
}

// chain fills c with rules sending ps (sorted, disjoint, as an IPSet
// gives them) to in, and everything else to out, then adds c and the
// chains below it. Up to t.leaf prefixes, or any number splitDepth chains
// down, are plain rules. More are split: the block all of them share is
// cut into blocks splitStride bits longer; a prefix shorter than those,
// or alone in its block, is a plain rule, and each other block is
// "-s BLOCK -g CHILD" ("-d" outbound), CHILD built the same way.
// Prefixes are disjoint, so the order of the rules does not change what
// matches.
func (t *splitTree) chain(c *Chain, ps []netip.Prefix, depth int) {
	t.s.below = append(t.s.below, c)
	split := len(ps) > t.leaf && depth < splitDepth
	cut := 0
	if split {
		common := commonBits(ps[0].Addr(), netipx.PrefixLastIP(ps[len(ps)-1]))
		cut = min(common+splitStride, ps[0].Addr().BitLen())
	}
	for len(ps) > 0 {
		n := 1
		if split && ps[0].Bits() >= cut {
			block, _ := ps[0].Addr().Prefix(cut)
			for n < len(ps) && block.Contains(ps[n].Addr()) {
				n++
			}
			if n > 1 {
				child := &Chain{Name: fmt.Sprintf("%s-b%d", t.name, t.n)}
				t.n++
				c.Rules = append(c.Rules, t.s.match(Rule{Target: Target{Kind: Goto, Chain: child.Name}}, block, false))
				t.chain(child, ps[:n], depth+1)
				ps = ps[n:]
				continue
			}
		}
		c.Rules = append(c.Rules, t.s.match(Rule{Target: t.in}, ps[0], false))
		ps = ps[1:]
	}
	c.Rules = append(c.Rules, Rule{Target: t.out})
}

// commonBits is the length of the longest prefix a and b (of one
// family) share.
func commonBits(a, b netip.Addr) int {
	x, y := a.As16(), b.As16()
	skip := 128 - a.BitLen() // IPv4 in IPv6: the ::ffff: both have
	for i := range x {
		if d := x[i] ^ y[i]; d != 0 {
			return i*8 + bits.LeadingZeros8(d) - skip
		}
	}
	return a.BitLen()
}
