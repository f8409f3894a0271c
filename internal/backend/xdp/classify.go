// Package xdp compiles the drop rules of a plan into an XDP program and
// its maps: the cheapest place on Linux to drop a packet, at the driver,
// before the kernel allocates anything for it.
//
// Compiling is pure: a Layout is data, built and checked without root.
// Each XDP rule gets a Class (1 for the first, 2 for the second, ...); a
// source address maps to the class of the first rule that drops it, or to
// 0 (pass on to the nftables rules). The IPv4 layout is a direct-indexed
// table of three levels (16, 8 and 8 bits, see V4); the IPv6 layout a
// direct table of 16 bits, then hash tables at lengths picked from the
// data (see V6). The kernel's LPM tries serve as the reference
// (LoadOptions.LPM).
package xdp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"go4.org/netipx"
)

// Class is what a layout maps a source address to: 0 passes, k > 0 is
// the k-th XDP rule, which drops.
type Class uint8

// MaxRules is the most rules one layout holds (classes 1..MaxRules).
const MaxRules = 255

// Rule is one XDP rule: the sources it drops. Rules are given in policy
// order; an address in several rules' sets belongs to the first.
//
// A Stateless rule drops every packet from its set. The others are
// connection-aware: a packet they would drop passes on to the kernel's
// stack when it belongs to a connection conntrack knows (see
// instructions), so the host's own connections keep their replies.
type Rule struct {
	Name      string
	Drop      *netipx.IPSet
	Stateless bool
}

// ErrTooManyRules is returned for more than MaxRules rules.
var ErrTooManyRules = errors.New("too many XDP rules")

// ErrStatelessOrder is returned for a stateless rule after a
// connection-aware one: an address in both sets belongs to the first
// rule, which would let a known connection's packets through the
// stateless one (plan.Compile refuses such policies too).
var ErrStatelessOrder = errors.New("a stateless XDP rule must come before every connection-aware one")

// span is a range of addresses of one class; spans of a family partition
// its whole address space, in order.
type span struct {
	from, to netip.Addr
	class    Class
}

// partition returns the spans of family (is4) that the rules give,
// covering the whole family: first match wins, gaps are class 0, and
// neighbours of one class are merged.
func partition(rules []Rule, is4 bool) ([]span, error) {
	if err := checkRules(rules); err != nil {
		return nil, err
	}
	return partitionAfter(rules, earlierSets(rules), is4), nil
}

// checkRules refuses more rules than a layout holds, and a stateless
// rule after a connection-aware one.
func checkRules(rules []Rule) error {
	if len(rules) > MaxRules {
		return fmt.Errorf("%w: %d, at most %d", ErrTooManyRules, len(rules), MaxRules)
	}
	n := statelessRules(rules)
	for _, r := range rules[n:] {
		if r.Stateless {
			return fmt.Errorf("%w: rule %q follows the connection-aware rule %q", ErrStatelessOrder, r.Name, rules[n].Name)
		}
	}
	return nil
}

// statelessRules is the number of leading stateless rules: classes 1 to
// it drop unconditionally, the higher ones are connection-aware.
func statelessRules(rules []Rule) int {
	n := 0
	for n < len(rules) && rules[n].Stateless {
		n++
	}
	return n
}

// earlierSets returns, for each rule, the addresses the rules before it
// drop.
func earlierSets(rules []Rule) []*netipx.IPSet {
	out := make([]*netipx.IPSet, len(rules))
	var taken netipx.IPSetBuilder
	last, empty := &netipx.IPSet{}, true
	for i, r := range rules {
		out[i] = last
		if r.Drop == nil || i == len(rules)-1 {
			continue
		}
		taken.AddSet(r.Drop)
		if empty {
			last, empty = r.Drop, false // no union to build
		} else {
			last = mustSet(&taken)
		}
	}
	return out
}

// partitionAfter is partition given earlierSets(rules).
func partitionAfter(rules []Rule, earlier []*netipx.IPSet, is4 bool) []span {
	var spans []span
	for i, r := range rules {
		if r.Drop == nil {
			continue
		}
		var b netipx.IPSetBuilder
		b.AddSet(r.Drop)
		b.RemoveSet(earlier[i])
		own := mustSet(&b)
		for _, rg := range own.Ranges() {
			if rg.From().Is4() == is4 {
				spans = append(spans, span{rg.From(), rg.To(), Class(i + 1)})
			}
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	first, last := netip.IPv6Unspecified(), netip.AddrFrom16([16]byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	if is4 {
		first, last = netip.IPv4Unspecified(), netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	var out []span
	add := func(s span) {
		if n := len(out); n > 0 && out[n-1].class == s.class {
			out[n-1].to = s.to
			return
		}
		out = append(out, s)
	}
	next := first
	for _, s := range spans {
		if s.from != next {
			add(span{next, s.from.Prev(), 0})
		}
		add(s)
		next = s.to.Next()
	}
	if next.IsValid() && (len(spans) == 0 || spans[len(spans)-1].to != last) {
		add(span{next, last, 0})
	}
	return out
}

// mustSet builds b; netipx only fails on invalid input, which sets built
// from IPSets cannot hold.
func mustSet(b *netipx.IPSetBuilder) *netipx.IPSet {
	s, err := b.IPSet()
	if err != nil {
		panic(fmt.Sprintf("xdp: building a set of valid sets: %v", err))
	}
	return s
}
