// Package ipt is ipfence's iptables backends, for hosts without nftables:
// ipset (sources matched against ipsets) and iptables-split (a tree of
// chains of plain rules, split by address block).
//
// FromPlan lowers a plan into a Program: a small, closed model of exactly
// the objects ipfence creates (ipsets, chains in the raw table, and a
// reject chain in the filter table), pure and testable without root.
// Render writes it as `ipset restore` and `iptables-restore` input, and
// Apply loads it: sets filled beside the live ones and swapped in, each
// family's chains replaced in one iptables-restore commit.
//
// The ipset backend's main chain sends a packet by goto to the hit chain
// of the first rule that matches it, so a RETURN there returns to
// PREROUTING: accepted packets go on through the host's own raw rules, as
// they do past ipfence's nftables table. The split backend's main chain
// calls (-j) each rule's tree of chains in turn, and a packet the tree
// does not match returns to it for the next rule; its hit chains accept
// with ACCEPT, which ends the raw table's PREROUTING for that packet.
// (Trees chained by gotos, rule to rule, would keep the first design, but
// nest as deep as all the trees together: nf_tables, under iptables-nft,
// refuses rulesets more than 16 chains deep and counts gotos.)
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
	// reject a packet a reject rule matched in raw (raw cannot reject).
	RejectMark uint32
	// Bans says Main starts by dropping the sources in the ban sets
	// (BanSet), which bans go into one by one with their time (Ban).
	// Loads create them when missing and never replace them.
	Bans bool
}

// Tables are one family's chains.
type Tables struct {
	// Raw are the chains of the raw table; the first is Main.
	Raw []*Chain
	// Reject says whether the family has reject rules, which need the
	// filter table's reject chain.
	Reject bool
}

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
	ICMPv6Type uint8        // neighbour and router discovery (133-137)
	Proto      string       // "tcp" or "udp", with Ports
	Ports      []plan.Port  // one protocol's ranges (at most 15 ports' worth: multiport)
	Src        netip.Prefix // "-s", when valid
	NotSrc     netip.Prefix // "! -s", when valid
	Sets       []SetMatch   // "-m set [!] --match-set NAME src", all must match
	Mark       uint32       // "-m mark --mark M/M", when not 0
	Target     Target
	Comment    string
}

// SetMatch is a match of the source against a set.
type SetMatch struct {
	Set    string
	Negate bool
}

// TargetKind is what a rule does with matching packets.
type TargetKind uint8

const (
	Goto         TargetKind = iota + 1 // -g Chain
	Return                             // -j RETURN
	DropPacket                         // -j DROP
	SetMark                            // -j MARK --set-xmark Mark/Mark (then the next rule)
	RejectTCP                          // -j REJECT --reject-with tcp-reset
	RejectOther                        // -j REJECT with ICMP admin-prohibited
	Jump                               // -j Chain
	AcceptPacket                       // -j ACCEPT
)

// Target is a rule's target.
type Target struct {
	Kind  TargetKind
	Chain string // Goto
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
	// Each rule's prefixes, by family, listed once for both families.
	prefixes := make([][2][]netip.Prefix, len(p.Rules))
	for i, r := range p.Rules {
		for _, pr := range r.Set.Prefixes() {
			f := IPv6
			if pr.Addr().Is4() {
				f = IPv4
			}
			prefixes[i][f] = append(prefixes[i][f], pr)
		}
	}
	for _, f := range []Family{IPv4, IPv6} {
		lw := lowering{prog: prog, fam: f, nft: opt.Flavour == NFT, main: &Chain{Name: prog.Main()}}
		lw.t.Raw = []*Chain{lw.main}
		if prog.Bans {
			// Bans are guarded when made (never a protected or own
			// address), so they need no loopback or discovery pass.
			lw.main.Rules = append(lw.main.Rules, Rule{Sets: []SetMatch{{Set: prog.BanSet(f)}}, Target: Target{Kind: DropPacket}, Comment: "ipfence bans"})
		}
		var rules []int // the rules with addresses of the family
		for i, r := range p.Rules {
			l := r.V4
			if f == IPv6 {
				l = r.V6
			}
			if l.Kind != plan.KindEmpty {
				rules = append(rules, i)
			}
		}
		for _, i := range rules {
			r := p.Rules[i]
			hit := lw.hitChain(i, r).Name
			ps := prefixes[i][f]
			if p.Backend == plan.IPSet {
				lw.ipsetRule(r, hit, ps)
				continue
			}
			lw.main.Rules = append(lw.main.Rules, Rule{Target: Target{Kind: Jump, Chain: prog.splitEntry(i)}})
			lw.splitRule(i, r, hit, ps)
		}
		lw.t.Raw = append(lw.t.Raw, lw.hits...)
		prog.Tables[f] = lw.t
	}
	return prog, nil
}

// Main is the name of the chain PREROUTING jumps to.
func (p *Program) Main() string { return p.Prefix }

// RejectChain is the name of the filter chain that rejects marked packets.
func (p *Program) RejectChain() string { return p.Prefix + "-reject" }

// HitChain is the name of the chain that counts and applies rule i's
// action.
func (p *Program) HitChain(i int) string { return fmt.Sprintf("%s-h%d", p.Prefix, i) }

// SetName names the set of rule r's single addresses (kind "a") or
// prefixes ("n") of family f: the prefix, the start of the rule's name and
// a hash of all of it, a letter for the action, the kind and family
// ("ipfence-feeds1a2bd-n4"). A set keeps its name while its rule keeps
// name and action, so a reload swaps the new content in under the rules
// in force; a rule whose action changes gets new sets, which only the new
// rules use.
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
func (p *Program) BanSet(f Family) string { return banSet(p.Prefix, f) }

func banSet(prefix string, f Family) string { return fmt.Sprintf("%s-ban%d", prefix, 4+2*int(f)) }

// TempSuffix ends the name of the set a new content is loaded into
// before it is swapped with the live set.
const TempSuffix = "-t"

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_]`)

// setPattern matches the names SetName gives with prefix, temporary
// ones included, and the ban sets.
func setPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-([A-Za-z0-9_]{0,6}[0-9a-f]{4}[drao]-[na][46](` + TempSuffix + `)?|ban[46])$`)
}

// lowering builds one family's chains.
type lowering struct {
	prog *Program
	fam  Family
	nft  bool // for iptables-nft (LowerOptions.Flavour)
	t    Tables
	main *Chain
	hits []*Chain
}

// hitChain adds the chain that counts and applies rule i's action. A
// blocking rule first lets loopback and (IPv6) neighbour discovery
// through, which no rule may block. It lets packets through past
// ipfence's other rules with pass (see the package comment).
func (lw *lowering) hitChain(i int, r *plan.Rule) *Chain {
	c := &Chain{Name: lw.prog.HitChain(i)}
	pass := Target{Kind: Return}
	if lw.prog.Backend == plan.IPTablesSplit {
		pass = Target{Kind: AcceptPacket}
	}
	comment := "ipfence rule " + r.Name
	a := r.Hit()
	if a != plan.Accept {
		c.Rules = append(c.Rules, Rule{Iif: "lo", Target: pass, Comment: "loopback"})
		if lw.fam == IPv6 {
			for typ := uint8(133); typ <= 137; typ++ {
				c.Rules = append(c.Rules, Rule{ICMPv6Type: typ, Target: pass, Comment: "IPv6 neighbour discovery"})
			}
		}
	}
	switch a {
	case plan.Accept:
		c.Rules = append(c.Rules, Rule{Target: pass, Comment: comment})
	case plan.Reject:
		lw.t.Reject = true
		c.Rules = append(c.Rules, Rule{Target: Target{Kind: SetMark}, Comment: comment},
			Rule{Target: pass})
	default:
		c.Rules = append(c.Rules, Rule{Target: Target{Kind: DropPacket}, Comment: comment})
	}
	lw.hits = append(lw.hits, c)
	return c
}

// ipsetRule puts rule r, of prefixes ps in the family, into the main
// chain: per port group, one rule per set that sends members to the hit
// chain, or for allow-only one rule that sends non-members of every set
// there.
func (lw *lowering) ipsetRule(r *plan.Rule, hit string, ps []netip.Prefix) {
	if len(ps) == 1 && ps[0].Bits() == 0 {
		// The whole family (an accept rule's): no set holds a /0.
		if r.Action != plan.AllowOnly {
			for _, pm := range portGroups(r.Ports) {
				lw.main.Rules = append(lw.main.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports,
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
		lw.prog.Sets = append(lw.prog.Sets, newSet(name, k.typ, lw.fam, k.elems))
		matches = append(matches, SetMatch{Set: name, Negate: r.Action == plan.AllowOnly})
	}
	for _, pm := range portGroups(r.Ports) {
		if r.Action == plan.AllowOnly {
			lw.main.Rules = append(lw.main.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports, NotSrc: null, Sets: matches,
				Target: Target{Kind: Goto, Chain: hit}, Comment: r.Name})
			continue
		}
		if null.IsValid() {
			lw.main.Rules = append(lw.main.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports, Src: null,
				Target: Target{Kind: Goto, Chain: hit}, Comment: r.Name})
		}
		for _, m := range matches {
			lw.main.Rules = append(lw.main.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports, Sets: []SetMatch{m},
				Target: Target{Kind: Goto, Chain: hit}, Comment: r.Name})
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

// splitEntry names the entry chain of rule i for the split backend.
func (p *Program) splitEntry(i int) string { return fmt.Sprintf("%s-r%d", p.Prefix, i) }

// splitRule lowers rule i for the split backend into chains the main
// chain calls, which return to it when the rule does not decide:
//
//	entry:  per port group "-p P --dports X -g match", then RETURN
//	        (without ports, entry is the match chain)
//	match:  the root of the rule's tree (see splitTree)
//
// where matching prefixes go to IN, the hit chain, and the rest to OUT,
// RETURN; allow-only rules swap the two.
func (lw *lowering) splitRule(i int, r *plan.Rule, hit string, ps []netip.Prefix) {
	name := lw.prog.splitEntry(i)
	in, out := Target{Kind: Goto, Chain: hit}, Target{Kind: Return}
	if r.Action == plan.AllowOnly {
		in, out = out, in
	}
	match := &Chain{Name: name}
	if len(r.Ports) > 0 {
		entry := match
		match = &Chain{Name: name + "-m"}
		lw.t.Raw = append(lw.t.Raw, entry)
		for _, pm := range portGroups(r.Ports) {
			entry.Rules = append(entry.Rules, Rule{Proto: pm.Proto, Ports: pm.Ports, Target: Target{Kind: Goto, Chain: match.Name}, Comment: r.Name})
		}
		entry.Rules = append(entry.Rules, Rule{Target: Target{Kind: Return}})
	}
	t := splitTree{lw: lw, name: name, in: in, out: out, leaf: splitLeaf}
	if lw.nft {
		t.leaf = max(t.leaf, len(ps)/splitChainsNFT)
	}
	t.chain(match, ps, 0)
}

// splitTree builds one rule's tree of chains.
type splitTree struct {
	lw      *lowering
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
// "-s BLOCK -g CHILD", CHILD built the same way. Prefixes are disjoint,
// so the order of the rules does not change what matches.
func (t *splitTree) chain(c *Chain, ps []netip.Prefix, depth int) {
	t.lw.t.Raw = append(t.lw.t.Raw, c)
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
				c.Rules = append(c.Rules, Rule{Src: block, Target: Target{Kind: Goto, Chain: child.Name}})
				t.chain(child, ps[:n], depth+1)
				ps = ps[n:]
				continue
			}
		}
		c.Rules = append(c.Rules, Rule{Src: ps[0], Target: t.in})
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
