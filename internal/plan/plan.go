// Package plan compiles resolved rules (prefix sets per rule) into a Plan:
// per rule and address family, the layout the kernel will evaluate.
//
// Compile is pure and deterministic: no kernel, no files, no network. The
// Plan is data; backends turn it into kernel objects, and Plan.Verdict is
// the reference model every backend's verdicts are tested against.
package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/prefix"
)

// Action is what a rule does with matching packets.
type Action string

const (
	// Drop drops packets whose source is in the set.
	Drop Action = "drop"
	// Reject rejects them (TCP reset, ICMP admin-prohibited otherwise).
	Reject Action = "reject"
	// Accept accepts them: later rules are not evaluated.
	Accept Action = "accept"
	// AllowOnly drops packets whose source is NOT in the set.
	AllowOnly Action = "allow-only"
)

// ParseAction validates an action name.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case Drop, Reject, Accept, AllowOnly:
		return a, nil
	}
	return "", fmt.Errorf("unknown action %q (use drop, reject, accept or allow-only)", s)
}

// Port is a destination port range of one protocol ("tcp/80-443").
type Port struct {
	Proto string `json:"proto"` // "tcp" or "udp"
	First uint16 `json:"first"`
	Last  uint16 `json:"last"`
}

func (p Port) String() string {
	if p.First == p.Last {
		return fmt.Sprintf("%s/%d", p.Proto, p.First)
	}
	return fmt.Sprintf("%s/%d-%d", p.Proto, p.First, p.Last)
}

// Backend is where a rule is enforced.
type Backend string

const (
	// NFTables runs the rule in ipfence's nftables table (prerouting).
	NFTables Backend = "nftables"
	// XDP runs it in an XDP program on the policy's interfaces, before
	// the kernel allocates anything for the packet. Only the leading
	// drop and allow-only rules without ports can: see Compile.
	XDP Backend = "xdp"
	// IPSet runs the rules in ipfence's iptables chains (raw table),
	// matching sources against ipsets: for hosts without nftables.
	IPSet Backend = "ipset"
	// IPTablesSplit runs them in iptables chains of plain rules, one
	// chain per /8 (IPv4) or /16 (IPv6): for hosts without ipset either.
	IPTablesSplit Backend = "iptables-split"
	// Auto is resolved before Compile to the first of NFTables, IPSet and
	// IPTablesSplit the host supports.
	Auto Backend = "auto"
)

// IPTables reports whether b is one of the iptables backends.
func (b Backend) IPTables() bool { return b == IPSet || b == IPTablesSplit }

// Firewall reports whether b is a backend that runs a whole policy's
// rules (every backend but XDP, which runs only the leading ones).
func (b Backend) Firewall() bool { return b == NFTables || b.IPTables() }

// ParseBackend validates a policy's backend name ("" is the default).
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case "", NFTables, XDP, IPSet, IPTablesSplit, Auto:
		return b, nil
	}
	return "", fmt.Errorf("unknown backend %q (use nftables, xdp, ipset, iptables-split or auto)", s)
}

// ParseRuleBackend validates a rule's backend name ("" is the policy's).
func ParseRuleBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case "", NFTables, XDP:
		return b, nil
	}
	return "", fmt.Errorf("unknown backend %q for a rule (use nftables or xdp; ipset and iptables-split are the policy's top-level backend)", s)
}

// RuleInput is one rule with its set resolved from the sources.
type RuleInput struct {
	Name   string
	Action Action
	// Direction is which connections the rule judges ("" is In);
	// Stateless makes it judge every packet, replies included, before
	// conntrack (see Rule).
	Direction Direction
	Stateless bool
	// Otherwise is what an allow-only rule does with the sources outside
	// its set: Drop ("") or Reject.
	Otherwise Action
	// Monitor makes a rule that drops or rejects (drop, reject,
	// allow-only) only count the packets it would stop; see Rule.
	Monitor bool
	Ports   []Port
	// Backend is where the policy asks the rule to run; "" is the
	// Input's Backend.
	Backend Backend
	// IPv4 and IPv6 select the families the rule applies to.
	IPv4, IPv6 bool
	Set        *prefix.Set
	// Where names the rule's place in the policy ("policy.yaml:12") for
	// error messages.
	Where string
	// Chosen4 and Chosen6 are the layouts another host chose for this
	// rule's set (a fleet bundle's): Compile replays them if they fit
	// the set as compiled here, and searches itself otherwise.
	Chosen4, Chosen6 *Choices
	// ChosenNote says why a layout chosen elsewhere is not there (it
	// did not read): Compile reports it with the rule (Rule.ReplayNote).
	ChosenNote string
}

// Input is everything Compile needs.
type Input struct {
	Table    string
	Priority int32
	// Protect lists prefixes that are never blocked.
	Protect *prefix.Set
	Rules   []RuleInput
	// Backend is the rules' default backend; "" is NFTables. XDP runs
	// the leading rules that can in XDP and the others in NFTables; Auto
	// must be resolved first.
	Backend Backend
	// Interfaces are where XDP rules are attached.
	Interfaces []string
	// RejectMark is the packet mark bit of the iptables backends' reject
	// rules (0: their default).
	RejectMark uint32
	// Bans is how bans escalate and aggregate (the policy's bans:).
	Bans ban.Policy
}

// Builtin returns the prefixes that are protected in every plan: loopback,
// link-local and the unspecified addresses (used as sources by DHCP and
// IPv6 duplicate address detection). Blocking them breaks the host.
func Builtin() *prefix.Set {
	return prefixSet("0.0.0.0/32", "127.0.0.0/8", "169.254.0.0/16", "::/128", "::1/128", "fe80::/10")
}

// prefixSet is the set of the prefixes ps, which must be valid.
func prefixSet(ps ...string) *prefix.Set {
	var b prefix.Builder
	for _, p := range ps {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, _ := b.Build()
	return s
}

// Plan is a compiled policy.
type Plan struct {
	Table    string   `json:"table"`
	Priority int32    `json:"priority"`
	Protect  []string `json:"protect"`
	Rules    []*Rule  `json:"rules"`
	Warnings []string `json:"warnings,omitempty"`
	// Interfaces are where the XDP rules run.
	Interfaces []string `json:"interfaces,omitempty"`
	// Backend is where the rules that do not run in XDP run: NFTables,
	// IPSet or IPTablesSplit.
	Backend Backend `json:"backend"`
	// Bans is how bans escalate and aggregate (Input.Bans).
	Bans ban.Policy `json:"bans,omitzero"`

	protect *prefix.Set
}

// Rule is one compiled rule.
type Rule struct {
	Name   string `json:"name"`
	Action Action `json:"action"`
	// Direction is which connections the rule judges: In, new inbound
	// ones (and packets of no connection) by their source; Out, new
	// ones from this host and its forwarded clients by their
	// destination; or Both.
	Direction Direction `json:"direction"`
	// Stateless rules judge every packet, those of established
	// connections and replies included, before conntrack sees it (the
	// old behaviour, for edge and DDoS boxes); the others let the
	// packets of known connections (conntrack established or related,
	// ICMP errors included) pass.
	Stateless bool `json:"stateless,omitempty"`
	// Otherwise is Reject for an allow-only rule that rejects the sources
	// outside its set, "" otherwise.
	Otherwise Action `json:"otherwise,omitempty"`
	// Monitor: the rule is loaded in full, but its hit only counts the
	// packets it would drop or reject; they go on to the later rules as
	// if it were absent (Verdict lists it in Decision.Monitored).
	Monitor bool    `json:"monitor,omitempty"`
	Ports   []Port  `json:"ports,omitempty"`
	V4      *Layout `json:"ipv4"`
	V6      *Layout `json:"ipv6"`
	// Backend is where the rule runs (XDP or the Plan's Backend);
	// BackendNote says why a rule that asked for XDP does not.
	Backend     Backend `json:"backend"`
	BackendNote string  `json:"backend_note,omitempty"`
	// Replayed says the rule's tree layouts are the ones its input
	// chose (RuleInput.Chosen4/6); ReplayNote why chosen layouts were
	// not used (and the layout search ran here).
	Replayed   bool   `json:"replayed,omitempty"`
	ReplayNote string `json:"replay_note,omitempty"`

	// Set is what the rule matches after protection (blocking rules:
	// minus protected prefixes; allow-only: plus them).
	Set *prefix.Set `json:"-"`
}

// Direction is which connections a rule judges.
type Direction string

const (
	Inbound  Direction = "in"   // new inbound connections, by source
	Outbound Direction = "out"  // new outbound and forwarded ones, by destination
	BothWays Direction = "both" // both
)

// ParseDirection parses a rule's direction ("" is In).
func ParseDirection(s string) (Direction, error) {
	switch d := Direction(s); d {
	case "":
		return Inbound, nil
	case Inbound, Outbound, BothWays:
		return d, nil
	}
	return "", fmt.Errorf("direction %q: use in, out or both", s)
}

// In reports whether the direction judges inbound connections.
func (d Direction) In() bool { return d == "" || d == Inbound || d == BothWays }

// Out reports whether the direction judges outbound connections.
func (d Direction) Out() bool { return d == Outbound || d == BothWays }

// ErrStatelessOrder is returned for a stateless rule after a
// connection-aware rule that can block: stateless rules run before
// conntrack, so in the kernel they would come first.
var ErrStatelessOrder = errors.New("a stateless rule must come before every connection-aware blocking rule")

// ErrBlocksEverything is returned for a rule that would block a whole
// address family.
var ErrBlocksEverything = errors.New("rule would block every address of a family")

// DefaultPriority is the hook priority of ipfence's base chain unless the
// policy sets one: raw, before conntrack.
const DefaultPriority = -300

// Sets are the sets p's rules match, by name.
func (p *Plan) Sets() map[string]*prefix.Set {
	out := make(map[string]*prefix.Set, len(p.Rules))
	for _, r := range p.Rules {
		out[r.Name] = r.Set
	}
	return out
}

// Sets are the sets the rules of in match, by name, as Compile makes
// them (protection applied): what their layouts are chosen for. No
// layout is built.
func Sets(in *Input) (map[string]*prefix.Set, error) {
	prot := protection(in)
	out := make(map[string]*prefix.Set, len(in.Rules))
	for i := range in.Rules {
		r, _, err := compileRule(&in.Rules[i], prot)
		if err != nil {
			return nil, err
		}
		out[r.Name] = r.Set
	}
	return out, nil
}

func protection(in *Input) *prefix.Set {
	prot := Builtin()
	if in.Protect != nil {
		prot = prefix.Union(prot, in.Protect)
	}
	return prot
}

// Compile builds the plan: protection applied, layouts chosen.
func Compile(in *Input, opt Options) (*Plan, error) {
	prot := protection(in)
	p := &Plan{Table: in.Table, Priority: in.Priority, Bans: in.Bans, protect: prot}
	if p.Table == "" {
		p.Table = "ipfence"
	}
	// Here too, not only in the policy: fleet bundles and stored
	// revisions reach Compile without a policy file's checks.
	if err := CheckTable(p.Table); err != nil {
		return nil, err
	}
	if p.Priority == 0 {
		p.Priority = DefaultPriority
	}
	for _, pr := range prefix.Prefixes(prot) {
		p.Protect = append(p.Protect, pr.String())
	}
	if err := checkStatelessOrder(in.Rules); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i := range in.Rules {
		ri := &in.Rules[i]
		if seen[ri.Name] {
			return nil, fmt.Errorf("%s: rule %q: the name is used twice", ri.Where, ri.Name)
		}
		seen[ri.Name] = true
		r, warn, err := compileRule(ri, prot)
		if err != nil {
			return nil, err
		}
		p.Warnings = append(p.Warnings, warn...)
		p.Rules = append(p.Rules, r)
		if opt.Consume {
			ri.Set = nil
		}
	}
	if err := p.assignBackends(in); err != nil {
		return nil, err
	}
	for i, r := range p.Rules {
		if err := r.buildLayouts(&in.Rules[i], opt); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// checkStatelessOrder refuses a stateless rule that follows a
// connection-aware rule of the same direction that can block (accept
// rules may come first: they accept before and after conntrack alike).
func checkStatelessOrder(rules []RuleInput) error {
	for _, dir := range []func(Direction) bool{Direction.In, Direction.Out} {
		blocker := ""
		for _, r := range rules {
			if !dir(r.Direction) {
				continue
			}
			switch {
			case r.Stateless && blocker != "":
				return fmt.Errorf("%s: rule %q: %w: it follows rule %q; move it up, or make both stateless (or both connection-aware)", r.Where, r.Name, ErrStatelessOrder, blocker)
			case !r.Stateless && r.Action != Accept && blocker == "":
				blocker = r.Name
			}
		}
	}
	return nil
}

// MaxXDPRules is the most rules the XDP backend runs; later ones stay in
// nftables.
const MaxXDPRules = 255

// ErrNoInterfaces is returned for XDP rules in a policy without
// interfaces.
var ErrNoInterfaces = errors.New("XDP rules need interfaces")

// assignBackends decides where each rule runs. XDP runs before every
// nftables rule and can only drop by source, so the rules that run there
// are the leading ones asking for it that drop or allow only some
// sources, without ports; the others, and every rule after the first that
// stays in nftables, run in nftables (with a note and a warning when they
// asked for XDP). Connection-aware inbound rules run in XDP as stateless
// ones do: the program passes what they would drop to the stack when
// conntrack knows its connection (backend/xdp looks it up), so they need
// no note; outbound ones cannot (XDP sees inbound packets only).
func (p *Plan) assignBackends(in *Input) error {
	switch p.Backend = in.Backend; p.Backend {
	case "", XDP:
		p.Backend = NFTables
	case Auto:
		return errors.New("plan: backend auto must be resolved before Compile")
	}
	var blocker string // the first rule that does not run in XDP
	xdp := 0
	for i, r := range p.Rules {
		want := in.Rules[i].Backend
		if want == "" {
			want = in.Backend
		}
		if want.Firewall() && want != p.Backend {
			return fmt.Errorf("%s: rule %q asks for backend %s, but the policy's rules run in %s", in.Rules[i].Where, r.Name, want, p.Backend)
		}
		r.Backend = p.Backend
		if r.Monitor && p.Backend != NFTables {
			return fmt.Errorf("%s: rule %q: %w (the policy's rules run in %s)", in.Rules[i].Where, r.Name, ErrMonitorBackend, p.Backend)
		}
		var note string
		switch {
		case want != XDP:
		case p.Backend != NFTables:
			return fmt.Errorf("%s: rule %q asks for backend xdp, which runs ahead of an nftables table; with backend %s no rule can", in.Rules[i].Where, r.Name, p.Backend)
		case blocker != "":
			note = fmt.Sprintf("it follows rule %q, which runs in nftables, and XDP runs first", blocker)
		case r.Monitor:
			note = "a rule in monitor mode counts in nftables, where later rules still see what it would drop"
		case r.Hit() == Reject:
			note = "XDP can drop but not reject"
		case r.Action == Accept:
			note = "accept must skip the later nftables rules, which XDP cannot"
		case len(r.Ports) > 0:
			note = "XDP rules match sources, not ports"
		case r.Direction.Out():
			note = "XDP sees inbound packets only, and the rule judges outbound connections"
		case xdp == MaxXDPRules:
			note = fmt.Sprintf("XDP runs at most %d rules", MaxXDPRules)
		default:
			r.Backend = XDP
			xdp++
			continue
		}
		if blocker == "" {
			blocker = r.Name
		}
		if note != "" {
			r.BackendNote = "runs in nftables: " + note
			p.Warnings = append(p.Warnings, fmt.Sprintf("%s: rule %q asks for backend xdp but %s", in.Rules[i].Where, r.Name, r.BackendNote))
		}
	}
	if xdp > 0 {
		if len(in.Interfaces) == 0 {
			return fmt.Errorf("%w: %d rules run in XDP but the policy lists no interfaces; add e.g. `interfaces: [eth0]`", ErrNoInterfaces, xdp)
		}
		p.Interfaces = slices.Clone(in.Interfaces)
	}
	return nil
}

// XDPRules returns the rules that run in XDP: the first ones of p.Rules.
func (p *Plan) XDPRules() []*Rule {
	n := 0
	for n < len(p.Rules) && p.Rules[n].Backend == XDP {
		n++
	}
	return p.Rules[:n]
}

// outboundProtect are destinations outbound rules never block, besides
// the plan's protected prefixes: multicast and the broadcast address,
// where DHCP, DHCPv6, neighbour discovery's MLD and routing protocols
// send (no packet comes from them, so inbound rules need not know).
var outboundProtect = prefixSet("224.0.0.0/4", "255.255.255.255/32", "ff00::/8")

func compileRule(ri *RuleInput, prot *prefix.Set) (*Rule, []string, error) {
	var warn []string
	if ri.Direction.Out() {
		prot = prefix.Union(prot, outboundProtect)
	}
	// Keep only the families the rule applies to.
	set := prefix.Family(ri.Set, ri.IPv4, ri.IPv6)

	for _, is4 := range []bool{true, false} {
		if (is4 && !ri.IPv4) || (!is4 && !ri.IPv6) {
			continue
		}
		full := fullPrefix(is4)
		if ri.Action == AllowOnly && !set.OverlapsPrefix(full) {
			return nil, nil, fmt.Errorf("%s: rule %q: %w: its set has no %s address, so allow-only would block all of %s; add %s data or limit the rule with `family: %s`",
				ri.Where, ri.Name, ErrBlocksEverything, familyName(is4), full, familyName(is4), map[bool]string{true: "ipv6", false: "ipv4"}[is4])
		}
		if (ri.Action == Drop || ri.Action == Reject) && set.ContainsPrefix(full) {
			return nil, nil, fmt.Errorf("%s: rule %q: %w: its set contains %s; remove that entry from the source", ri.Where, ri.Name, ErrBlocksEverything, full)
		}
	}

	eff := set
	switch ri.Action {
	case Drop, Reject:
		if inter := prefix.Prefixes(prefix.Intersect(set, prot)); len(inter) > 0 {
			warn = append(warn, fmt.Sprintf("%s: rule %q: its set covers protected prefixes %s; they keep passing", ri.Where, ri.Name, summarize(inter)))
		}
		eff = prefix.Subtract(set, prot)
	case AllowOnly:
		// Protection applies only within the rule's families.
		eff = prefix.Family(prefix.Union(set, prot), ri.IPv4, ri.IPv6)
	}
	dir := ri.Direction
	if dir == "" {
		dir = Inbound
	}
	r := &Rule{Name: ri.Name, Action: ri.Action, Ports: ri.Ports, Set: eff, Direction: dir, Stateless: ri.Stateless}
	if ri.Stateless && ri.Action == AllowOnly && len(ri.Ports) == 0 {
		if dir.In() {
			warn = append(warn, fmt.Sprintf("%s: rule %q is a stateless allow-only rule without ports: it also drops the replies to this host's own connections to addresses outside its set (DNS answers, updates, API calls, ICMP errors); give it ports, or make it connection-aware", ri.Where, ri.Name))
		}
		if dir.Out() {
			warn = append(warn, fmt.Sprintf("%s: rule %q is a stateless outbound allow-only rule without ports: it also drops the answers this host sends to clients outside its set; give it ports, or make it connection-aware", ri.Where, ri.Name))
		}
	}
	switch ri.Otherwise {
	case "", Drop:
	case Reject:
		if ri.Action != AllowOnly {
			return nil, nil, fmt.Errorf("%s: rule %q: otherwise is for allow-only rules", ri.Where, ri.Name)
		}
		r.Otherwise = Reject
	default:
		return nil, nil, fmt.Errorf("%s: rule %q: otherwise %q (use drop or reject)", ri.Where, ri.Name, ri.Otherwise)
	}
	if ri.Monitor {
		if ri.Action == Accept {
			return nil, nil, fmt.Errorf("%s: rule %q: %w", ri.Where, ri.Name, ErrMonitorAccept)
		}
		r.Monitor = true
	}
	return r, warn, nil
}

// ModeName is a rule's mode as shown: "monitor", or "enforce".
func ModeName(monitor bool) string {
	if monitor {
		return "monitor"
	}
	return "enforce"
}

// ErrMonitorAccept is returned for an accept rule in monitor mode: it
// stops nothing, so there is nothing to try out (and an accept rule that
// let packets go on would let later rules and bans drop what it allows).
var ErrMonitorAccept = errors.New("monitor mode is for rules that drop or reject; an accept rule blocks nothing")

// ErrMonitorBackend is returned for monitor rules in a plan whose rules
// run in ipset/iptables: monitor mode needs nftables.
var ErrMonitorBackend = errors.New("monitor mode needs the nftables backend")

// Hit is what the rule does with the packets it decides: its action, or
// for allow-only rules Drop or Reject (Otherwise).
func (r *Rule) Hit() Action {
	switch {
	case r.Action != AllowOnly:
		return r.Action
	case r.Otherwise == Reject:
		return Reject
	}
	return Drop
}

// buildLayouts builds r's layouts once its backend is known: nftables
// rules get the layout Build chooses, the others only their prefix count
// (their backends compile their own tables and sets).
func (r *Rule) buildLayouts(ri *RuleInput, opt Options) error {
	o := opt
	o.PassIsIn = ri.Action == AllowOnly
	var own4, own6 *Layout
	if r.Backend != NFTables {
		own4, own6 = BuildCounts(r.Set, Kind(r.Backend))
		if ri.Chosen4 != nil || ri.Chosen6 != nil {
			r.ReplayNote = fmt.Sprintf("the rule runs in %s here, which builds its own tables", r.Backend)
		}
	}
	var notes []string
	if ri.ChosenNote != "" {
		notes = append(notes, ri.ChosenNote)
	}
	type family struct {
		l        **Layout
		own      *Layout
		chosen   *Choices
		is4, on  bool
		replayed bool
		note     string
		err      error
	}
	fams := []*family{{l: &r.V4, own: own4, chosen: ri.Chosen4, is4: true, on: ri.IPv4}, {l: &r.V6, own: own6, chosen: ri.Chosen6, on: ri.IPv6}}
	build := func(f *family) {
		switch {
		case !f.on:
			// A family the rule does not apply to must not be
			// evaluated at all (allow-only would otherwise block the
			// whole family).
			*f.l = &Layout{Is4: f.is4, Kind: KindEmpty}
		case f.own != nil:
			*f.l = f.own
		default:
			if f.chosen != nil {
				l, err := Replay(r.Set, f.is4, o, f.chosen)
				if err == nil {
					*f.l, f.replayed = l, true
					return
				}
				f.note = fmt.Sprintf("%s: %v", familyName(f.is4), err)
			}
			l, err := Build(r.Set, f.is4, o)
			if err != nil {
				f.err = fmt.Errorf("%s: rule %q: %w", ri.Where, ri.Name, err)
				return
			}
			*f.l = l
		}
	}
	if opt.Parallel {
		// The families share nothing but the rule's set, which both
		// only read.
		var wg sync.WaitGroup
		wg.Go(func() { build(fams[1]) })
		build(fams[0])
		wg.Wait()
	} else {
		for _, f := range fams {
			if build(f); f.err != nil {
				break
			}
		}
	}
	for _, f := range fams {
		if f.err != nil {
			return f.err
		}
		if f.note != "" {
			notes = append(notes, f.note)
		}
		r.Replayed = r.Replayed || f.replayed
	}
	if len(notes) > 0 {
		r.ReplayNote = strings.Join(notes, "; ")
	}
	return nil
}

func summarize(ps []netip.Prefix) string {
	var s []string
	for i, p := range ps {
		if i == 3 {
			s = append(s, fmt.Sprintf("and %d more", len(ps)-3))
			break
		}
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// Packet is what the model needs to know of a packet.
type Packet struct {
	Src   netip.Addr
	Proto string // "tcp", "udp" or "" (other)
	DPort uint16
	// Out: the packet opens a connection from this host (or a client it
	// forwards) to Dst, judged by outbound rules; otherwise it arrives
	// from Src, judged by inbound rules.
	Out bool
	Dst netip.Addr
	// Established: the packet belongs to a connection conntrack knows
	// (established or related); only stateless rules judge it.
	Established bool
}

// key is the address the rules judge the packet by.
func (pkt Packet) key() netip.Addr {
	if pkt.Out {
		return pkt.Dst.Unmap()
	}
	return pkt.Src.Unmap()
}

// judgedBy reports whether r judges pkt: its direction, and its state.
func (r *Rule) judgedBy(pkt Packet) bool {
	if pkt.Out && !r.Direction.Out() || !pkt.Out && !r.Direction.In() {
		return false
	}
	// An accept rule judges packets of known connections too: ahead of
	// a stateless rule it runs before conntrack, where their state is
	// not known (and elsewhere accepting them changes nothing).
	return r.Stateless || r.Action == Accept || !pkt.Established
}

// Decision is the model's verdict for a packet.
type Decision struct {
	// Verdict is "accept" (also for packets no rule stops), "drop" or
	// "reject".
	Verdict string `json:"verdict"`
	// Rule is the deciding rule, "" when none matched, "protect" for
	// protected sources.
	Rule string `json:"rule,omitempty"`
	// InSet says whether the source is in the deciding rule's set.
	InSet bool `json:"in_set"`
	// Monitored are the rules in monitor mode that would have dropped
	// or rejected the packet, in policy order, before the deciding one.
	Monitored []string `json:"monitored,omitempty"`
}

// Verdict evaluates the plan for a packet as the kernel should, from the
// rules' sets (not their layouts): the reference model.
func (p *Plan) Verdict(pkt Packet) Decision {
	src := pkt.key()
	var monitored []string
	for _, r := range p.Rules {
		if !r.judgedBy(pkt) || !r.matchesPort(pkt) {
			continue
		}
		l := r.V4
		if !src.Is4() {
			l = r.V6
		}
		if l.Kind == KindEmpty {
			continue // Compile refuses allow-only rules with an empty family
		}
		in := r.Set.Contains(src)
		var d Decision
		switch r.Action {
		case Drop, Reject:
			if in {
				d = Decision{Verdict: string(r.Action), Rule: r.Name, InSet: true}
			}
		case Accept:
			if in {
				d = Decision{Verdict: "accept", Rule: r.Name, InSet: true}
			}
		case AllowOnly:
			if !in {
				d = Decision{Verdict: string(r.Hit()), Rule: r.Name}
			}
		}
		switch {
		case d.Rule == "":
		case r.Monitor:
			monitored = append(monitored, r.Name)
		default:
			d.Monitored = monitored
			return d
		}
	}
	d := Decision{Verdict: "accept", Monitored: monitored}
	if p.protect != nil && p.protect.Contains(src) {
		d.Rule = "protect"
	}
	return d
}

func (r *Rule) matchesPort(pkt Packet) bool {
	if len(r.Ports) == 0 {
		return true
	}
	for _, pr := range r.Ports {
		if pr.Proto == pkt.Proto && pkt.DPort >= pr.First && pkt.DPort <= pr.Last {
			return true
		}
	}
	return false
}

// Release drops the map elements of every rule's layouts once the plan
// is lowered (Layout.Release).
func (p *Plan) Release() {
	for _, r := range p.Rules {
		for _, l := range []*Layout{r.V4, r.V6} {
			if l != nil {
				l.Release()
			}
		}
	}
}

// HasOutbound reports whether some rule judges outbound connections.
func (p *Plan) HasOutbound() bool {
	for _, r := range p.Rules {
		if r.Direction.Out() {
			return true
		}
	}
	return false
}

// ProtectSet returns the protected prefixes (built-in ones included).
func (p *Plan) ProtectSet() *prefix.Set { return p.protect }

// Protected reports whether addr is protected.
func (p *Plan) Protected(addr netip.Addr) bool {
	return p.protect != nil && p.protect.Contains(addr.Unmap())
}

// Blocked reports whether some rule could block addr (for some port): the
// check against the host's own addresses.
func (p *Plan) Blocked(addr netip.Addr) (rule string, blocked bool) {
	return p.blocked(addr, Direction.In)
}

// BlockedOut reports whether some outbound rule could block new
// connections to addr (for some port): the check against the host's
// upstreams (resolvers, gateway).
func (p *Plan) BlockedOut(addr netip.Addr) (rule string, blocked bool) {
	return p.blocked(addr, Direction.Out)
}

func (p *Plan) blocked(addr netip.Addr, dir func(Direction) bool) (rule string, blocked bool) {
	addr = addr.Unmap()
	for _, r := range p.Rules {
		if !dir(r.Direction) {
			continue
		}
		l := r.V4
		if !addr.Is4() {
			l = r.V6
		}
		if l.Kind == KindEmpty {
			continue
		}
		in := r.Set.Contains(addr)
		switch {
		case r.Action == Accept && in && len(r.Ports) == 0:
			return "", false
		case (r.Action == Drop || r.Action == Reject) && in, r.Action == AllowOnly && !in:
			return r.Name, true
		}
	}
	return "", false
}
