package ipt

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ipsetFamily names the ipset family of each Family.
var ipsetFamily = [...]string{"inet", "inet6"}

// createLine is the `ipset create` line of set s under name.
func createLine(b *strings.Builder, s *Set, name string) {
	fmt.Fprintf(b, "create %s %s family %s hashsize %d maxelem %d\n", name, s.Type, ipsetFamily[s.Family], s.HashSize, s.MaxElem)
}

// FillScript is the `ipset restore` input that loads every set into its
// temporary set (name + TempSuffix), destroying first the temporary sets
// a failed run left (stale).
func (p *Program) FillScript(stale []string) string {
	var b strings.Builder
	n := 0
	for _, s := range p.Sets {
		n += len(s.Elems)
	}
	b.Grow(64*len(p.Sets) + 48*n)
	for _, name := range stale {
		fmt.Fprintf(&b, "destroy %s\n", name)
	}
	buf := make([]byte, 0, 64)
	for _, s := range p.Sets {
		tmp := s.Name + TempSuffix
		createLine(&b, s, tmp)
		for _, e := range s.Elems {
			buf = append(buf[:0], "add "...)
			buf = append(buf, tmp...)
			buf = append(buf, ' ')
			if e.IsSingleIP() {
				buf = e.Addr().AppendTo(buf)
			} else {
				buf = e.AppendTo(buf)
			}
			buf = append(buf, '\n')
			b.Write(buf)
		}
	}
	return b.String()
}

// SwapScript is the `ipset restore` input that swaps every filled
// temporary set with its live set, creating the live sets that do not
// exist yet (live lists those that do). Afterwards the temporary sets
// hold the old contents, for UndoSwapScript or DropScript.
func (p *Program) SwapScript(live map[string]bool) string {
	var b strings.Builder
	for _, s := range p.Sets {
		if !live[s.Name] {
			createLine(&b, s, s.Name)
		}
		fmt.Fprintf(&b, "swap %s %s\n", s.Name+TempSuffix, s.Name)
	}
	return b.String()
}

// UndoSwapScript puts the old contents back after SwapScript and destroys
// the temporary sets and the live sets that did not exist before.
func (p *Program) UndoSwapScript(live map[string]bool) string {
	var b strings.Builder
	for _, s := range p.Sets {
		if live[s.Name] {
			fmt.Fprintf(&b, "swap %s %s\n", s.Name+TempSuffix, s.Name)
		}
		fmt.Fprintf(&b, "destroy %s\n", s.Name+TempSuffix)
	}
	for _, s := range p.Sets {
		if !live[s.Name] {
			fmt.Fprintf(&b, "destroy %s\n", s.Name)
		}
	}
	return b.String()
}

// destroyScript destroys the named sets.
func destroyScript(names []string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "destroy %s\n", n)
	}
	return b.String()
}

// Table is what one iptables table of one family holds of ipfence's.
type Table struct {
	// Chains are ipfence's chains.
	Chains []string
	// Jumps are the rules of built-in chains that jump to ipfence's
	// chains, as iptables-save writes them ("-A PREROUTING -j ipfence"),
	// in order; ipfence's are first in their chains.
	Jumps []string
	// Rules are the rules of ipfence's chains, as iptables-save writes
	// them ("-A ipfence-h0 -j DROP").
	Rules []string
}

func (t *Table) empty() bool { return len(t.Chains) == 0 && len(t.Jumps) == 0 }

// State is what one family's raw, mangle and filter tables hold of
// ipfence's.
type State struct {
	Raw, Mangle, Filter Table
}

// Empty reports whether the family holds nothing of ipfence's.
func (s *State) Empty() bool { return s.Raw.empty() && s.Mangle.empty() && s.Filter.empty() }

// savedTables are the tables whose iptables-save output ParseSave reads.
var savedTables = []string{"raw", "mangle", "filter"}

// ParseSave reads the state of ipfence's chains of prefix from the output
// of `iptables-save` (of the raw, mangle and filter tables, any of them).
func ParseSave(prefix, save string) State {
	var st State
	var t *Table
	for line := range strings.Lines(save) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "*"):
			t = map[string]*Table{"raw": &st.Raw, "mangle": &st.Mangle, "filter": &st.Filter}[line[1:]]
		case t == nil:
		case strings.HasPrefix(line, ":"):
			if name, _, _ := strings.Cut(line[1:], " "); own(prefix, name) {
				t.Chains = append(t.Chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			chain, rest, _ := strings.Cut(line[3:], " ")
			switch {
			case own(prefix, chain):
				t.Rules = append(t.Rules, line)
			case own(prefix, jumpTarget(rest)):
				t.Jumps = append(t.Jumps, line)
			}
		}
	}
	return st
}

// jumpTarget returns the chain a rule ends by jumping to ("... -j
// CHAIN"), "" when it ends otherwise (a target with options, as in
// "-j LOG --log-prefix ipfence", is not a jump).
func jumpTarget(rule string) string {
	i := strings.LastIndex(" "+rule, " -j ")
	if i < 0 {
		return ""
	}
	target := rule[i+3:]
	if strings.Contains(target, " ") {
		return ""
	}
	return target
}

// own reports whether chain is one of ipfence's chains of prefix.
func own(prefix, chain string) bool {
	return chain == prefix || strings.HasPrefix(chain, prefix+"-")
}

// Desired is the state family f's tables have once p is loaded: the
// chains of each table with the built-in chains' jumps to them first
// (raw PREROUTING to Main; mangle PREROUTING to InChain, FORWARD and
// OUTPUT to OutChain), and when the family has reject rules the filter
// table's reject chain, which INPUT, FORWARD and OUTPUT send marked
// packets to first. Jumps are in iptables-save's order.
func (p *Program) Desired(f Family) State {
	var st State
	t := p.Tables[f]
	st.Raw = desiredTable(p, f, t.Raw, map[string][]string{p.Main(): {"PREROUTING"}})
	st.Mangle = desiredTable(p, f, t.Mangle, map[string][]string{p.InChain(): {"PREROUTING"}, p.OutChain(): {"FORWARD", "OUTPUT"}})
	if t.Reject {
		rc := &Chain{Name: p.RejectChain(), Rules: []Rule{
			{Proto: "tcp", Target: Target{Kind: RejectTCP}, Comment: "ipfence reject"},
			{Target: Target{Kind: RejectOther}, Comment: "ipfence reject"}}}
		st.Filter = desiredTable(p, f, []*Chain{rc}, map[string][]string{rc.Name: nil}) // marked; its jumps follow
		mark := fmt.Sprintf("-m mark --mark %#x/%#x", p.RejectMark, p.RejectMark)
		for _, hook := range []string{"INPUT", "FORWARD", "OUTPUT"} {
			st.Filter.Jumps = append(st.Filter.Jumps, fmt.Sprintf("-A %s %s -m comment --comment %s -j %s", hook, mark, Mark, rc.Name))
		}
	}
	return st
}

// hookOrder is the order iptables-save lists the built-in chains in.
var hookOrder = []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// desiredTable is a table of chains, with jumps to those hooks names
// (chain name: built-in chains). The chains hooks names end with
// ipfence's mark (ownerMark), and the jumps to them carry it too: the
// chains stay known as ipfence's when another program flushes either.
func desiredTable(p *Program, f Family, chains []*Chain, hooks map[string][]string) Table {
	var t Table
	n := 0
	for _, c := range chains {
		n += len(c.Rules)
	}
	t.Rules = make([]string, 0, n)
	for _, c := range chains {
		t.Chains = append(t.Chains, c.Name)
		t.Rules = appendChain(t.Rules, f, c)
		if _, entry := hooks[c.Name]; entry {
			t.Rules = appendChain(t.Rules, f, &Chain{Name: c.Name, Rules: []Rule{ownerMark}})
		}
	}
	for _, hook := range hookOrder {
		for _, c := range chains {
			if slices.Contains(hooks[c.Name], hook) {
				t.Jumps = append(t.Jumps, "-A "+hook+" -m comment --comment "+Mark+" -j "+c.Name)
			}
		}
	}
	return t
}

// Transition is the `iptables-restore --noflush` input that takes a
// family's tables from one state of ipfence's to another, touching
// nothing else: each table in one commit; the filter table first when it
// gains the reject chain (so that marks are rejected before raw or
// mangle sets any), last otherwise; mangle before raw, so that while
// rules move from one to the other, they run in both for a moment
// rather than in neither, and the marks of raw's accept rules are let
// through before raw sets any.
func Transition(from, to *State) string {
	var b strings.Builder
	n := 256
	for _, l := range to.Raw.Rules {
		n += len(l) + 1
	}
	for _, l := range to.Mangle.Rules {
		n += len(l) + 1
	}
	b.Grow(n)
	filter := func() { transition(&b, "filter", &from.Filter, &to.Filter) }
	if !to.Filter.empty() {
		filter()
	}
	transition(&b, "mangle", &from.Mangle, &to.Mangle)
	transition(&b, "raw", &from.Raw, &to.Raw)
	if to.Filter.empty() {
		filter()
	}
	return b.String()
}

// transition writes one table's section; nothing when both are empty.
func transition(b *strings.Builder, name string, from, to *Table) {
	if from.empty() && to.empty() {
		return
	}
	fmt.Fprintf(b, "*%s\n", name)
	// Declaring a chain flushes it when it exists, creates it otherwise.
	for _, c := range to.Chains {
		fmt.Fprintf(b, ":%s - [0:0]\n", c)
	}
	for _, l := range from.Jumps {
		b.WriteString("-D " + strings.TrimPrefix(l, "-A ") + "\n")
	}
	// Chains that go: all flushed first, so that none refers to another.
	stay := make(map[string]bool, len(to.Chains))
	for _, c := range to.Chains {
		stay[c] = true
	}
	var gone []string
	for _, c := range from.Chains {
		if !stay[c] {
			gone = append(gone, c)
		}
	}
	for _, c := range gone {
		fmt.Fprintf(b, "-F %s\n", c)
	}
	for _, c := range gone {
		fmt.Fprintf(b, "-X %s\n", c)
	}
	// Jumps first in their chains, in order.
	for _, l := range slices.Backward(to.Jumps) {
		chain, rest, _ := strings.Cut(strings.TrimPrefix(l, "-A "), " ")
		fmt.Fprintf(b, "-I %s 1 %s\n", chain, rest)
	}
	for _, l := range to.Rules {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	b.WriteString("COMMIT\n")
}

// appendChain appends c's rules as iptables-save lines.
func appendChain(lines []string, f Family, c *Chain) []string {
	buf := make([]byte, 0, 160)
	for i := range c.Rules {
		buf = append(buf[:0], "-A "...)
		buf = append(buf, c.Name...)
		buf = appendRule(buf, f, &c.Rules[i])
		lines = append(lines, string(buf))
	}
	return lines
}

// appendRule writes a rule's matches and target.
func appendRule(buf []byte, f Family, r *Rule) []byte {
	if r.Iif != "" {
		buf = append(buf, " -i "...)
		buf = append(buf, r.Iif...)
	}
	if r.Oif != "" {
		buf = append(buf, " -o "...)
		buf = append(buf, r.Oif...)
	}
	if r.ICMPv6Type != 0 {
		buf = fmt.Appendf(buf, " -p ipv6-icmp -m icmp6 --icmpv6-type %d", r.ICMPv6Type)
	}
	for _, m := range [...]struct {
		opt string
		p   netip.Prefix
	}{{" -s ", r.Src}, {" ! -s ", r.NotSrc}, {" -d ", r.Dst}, {" ! -d ", r.NotDst}} {
		if m.p.IsValid() {
			buf = append(buf, m.opt...)
			buf = m.p.AppendTo(buf)
		}
	}
	if r.Proto != "" {
		buf = append(buf, " -p "...)
		buf = append(buf, r.Proto...)
	}
	if len(r.Ports) > 0 {
		buf = append(buf, " -m multiport --dports "...)
		for i, pr := range r.Ports {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendUint(buf, uint64(pr.First), 10)
			if pr.Last != pr.First {
				buf = append(buf, ':')
				buf = strconv.AppendUint(buf, uint64(pr.Last), 10)
			}
		}
	}
	for _, m := range r.Sets {
		buf = append(buf, " -m set "...)
		if m.Negate {
			buf = append(buf, "! "...)
		}
		buf = append(buf, "--match-set "...)
		buf = append(buf, m.Set...)
		if m.Dst {
			buf = append(buf, " dst"...)
		} else {
			buf = append(buf, " src"...)
		}
	}
	if r.Mark != 0 {
		buf = fmt.Appendf(buf, " -m mark --mark %#x/%#x", r.Mark, r.Mark)
	}
	if r.CtState != "" {
		buf = append(buf, " -m conntrack --ctstate "...)
		buf = append(buf, r.CtState...)
	}
	if r.Comment != "" {
		buf = append(buf, " -m comment --comment "...)
		buf = strconv.AppendQuote(buf, r.Comment)
	}
	switch r.Target.Kind {
	case Goto:
		buf = append(buf, " -g "...)
		buf = append(buf, r.Target.Chain...)
	case Jump:
		buf = append(buf, " -j "...)
		buf = append(buf, r.Target.Chain...)
	case AcceptPacket:
		buf = append(buf, " -j ACCEPT"...)
	case Return:
		buf = append(buf, " -j RETURN"...)
	case DropPacket:
		buf = append(buf, " -j DROP"...)
	case SetMark:
		buf = fmt.Appendf(buf, " -j MARK --set-xmark %#x/%#x", r.Target.Mark, r.Target.Mark)
	case ClearMark:
		buf = fmt.Appendf(buf, " -j MARK --set-xmark 0x0/%#x", r.Target.Mark)
	case RejectTCP:
		buf = append(buf, " -j REJECT --reject-with tcp-reset"...)
	case RejectOther:
		if f == IPv4 {
			buf = append(buf, " -j REJECT --reject-with icmp-admin-prohibited"...)
		} else {
			buf = append(buf, " -j REJECT --reject-with icmp6-adm-prohibited"...)
		}
	}
	return buf
}
