package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
)

// chainOrder lists the rules a base chain jumps to, in order ("ban" for
// a ban set lookup, "allow" for the allow sets' lookups, "known" for the
// known-connections accept).
func chainOrder(c *Chain) string {
	if c == nil {
		return "-"
	}
	var out []string
	for _, r := range c.Rules {
		switch {
		case r.Known:
			out = append(out, "known")
		case r.Lookup != nil && strings.HasPrefix(r.Lookup.Set, "allow"):
			if len(out) == 0 || out[len(out)-1] != "allow" {
				out = append(out, "allow")
			}
		case r.Lookup != nil:
			out = append(out, "ban")
		case len(out) == 0 || out[len(out)-1] != r.Comment:
			out = append(out, r.Comment)
		}
	}
	return strings.Join(out, " ")
}

// TestBaseChainsKeepPolicyOrder pins which rules run before conntrack
// and which after, so that each chain, read in order, decides as the
// model does: accept rules run wherever a later rule does (an accept
// ends one base chain only), stateless rules and the accept rules among
// them before conntrack, bans after the leading accept rules, allow
// entries first in every chain there is (after the known connections).
func TestBaseChainsKeepPolicyOrder(t *testing.T) {
	h := func(name string, a plan.Action, stateless bool, dir plan.Direction) RuleHead {
		return RuleHead{Name: name, Action: a, Stateless: stateless, Direction: dir, V4: true}
	}
	monitor := func(h RuleHead) RuleHead { h.Monitor = true; return h }
	in, out, both := plan.Inbound, plan.Outbound, plan.BothWays
	banned := Presence{Bans: [4]bool{true}}
	allowed := Presence{Allows: [4]bool{true, false, false, true}}
	both2 := Presence{Bans: banned.Bans, Allows: allowed.Allows}
	for _, tc := range []struct {
		name            string
		heads           []RuleHead
		pr              Presence
		raw, conn       string
		outRaw, outConn string
		fwd             string
	}{
		{"connection-aware only", []RuleHead{h("ok", plan.Accept, false, in), h("geo", plan.AllowOnly, false, in)}, Presence{},
			"", "known ok geo", "-", "-", "-"},
		{"bans after the allowlist", []RuleHead{h("ok", plan.Accept, false, in), h("geo", plan.AllowOnly, false, in)}, banned,
			"ok ban", "known ok geo", "-", "-", "-"},
		{"a stateless accept also after conntrack", []RuleHead{h("trusted", plan.Accept, true, in), h("feed", plan.Drop, false, in)}, Presence{},
			"trusted", "known trusted feed", "-", "-", "-"},
		{"an accept between stateless rules", []RuleHead{h("s1", plan.Drop, true, in), h("a", plan.Accept, false, in), h("s2", plan.Drop, true, in), h("geo", plan.AllowOnly, false, in)}, banned,
			"ban s1 a s2", "known a geo", "-", "-", "-"},
		{"a monitor rule does not end the allowlist", []RuleHead{monitor(h("trial", plan.Drop, false, in)), h("ok", plan.Accept, false, in), h("geo", plan.AllowOnly, false, in)}, banned,
			"ok ban", "known trial ok geo", "-", "-", "-"},
		{"a stateless monitor rule before the allowlist", []RuleHead{monitor(h("edge", plan.Drop, true, in)), h("ok", plan.Accept, false, in), h("feed", plan.Drop, false, in)}, banned,
			"edge ok ban", "known ok feed", "-", "-", "-"},
		{"outbound", []RuleHead{h("trustout", plan.Accept, true, out), h("edge", plan.Drop, true, both), h("c2", plan.Reject, false, out)}, Presence{},
			"edge", "-", "trustout edge", "known trustout c2", "trustout edge known trustout c2"},
		{"allows and bans", []RuleHead{h("ok", plan.Accept, false, in), h("geo", plan.AllowOnly, false, in)}, both2,
			"allow ok ban", "known allow ok geo", "-", "-", "-"},
		{"allows alone need no chain before conntrack", []RuleHead{h("ok", plan.Accept, false, in), h("geo", plan.AllowOnly, false, in)}, allowed,
			"", "known allow ok geo", "-", "-", "-"},
		{"allows outbound", []RuleHead{h("trustout", plan.Accept, true, out), h("edge", plan.Drop, true, both), h("c2", plan.Reject, false, out)}, allowed,
			"allow edge", "-", "allow trustout edge", "known allow trustout c2", "allow trustout edge known trustout c2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs := map[string]*Chain{}
			for _, c := range OutChains(tc.heads, -300, tc.pr) {
				outs[c.Name] = c
			}
			got := []string{chainOrder(BaseChain(tc.heads, -300, tc.pr)), chainOrder(ConnChain(tc.heads, tc.pr)),
				chainOrder(outs[OutRawChainName]), chainOrder(outs[OutChainName]), chainOrder(outs[ForwardChainName])}
			want := []string{tc.raw, tc.conn, tc.outRaw, tc.outConn, tc.fwd}
			for i, what := range []string{"prerouting (raw)", "inbound", "output_raw", "outbound", "forward"} {
				if got[i] != want[i] {
					t.Errorf("%s: %q, want %q", what, got[i], want[i])
				}
			}
		})
	}
}

// TestLastJumpsAreGotos: only jumps that end a base chain become gotos;
// an accept rule's jumps before the bans stay jumps, or a packet its
// chains let through would skip the bans.
func TestLastJumpsAreGotos(t *testing.T) {
	accept := RuleHead{Name: "partners", Action: plan.Accept, V4: true, V6: true}
	drop := RuleHead{Name: "feed", Action: plan.Drop, V4: true, V6: true}
	stateless := RuleHead{Name: "edge", Action: plan.Drop, V4: true, V6: true, Stateless: true}
	bans := Presence{Bans: [4]bool{true}}
	kinds := func(c *Chain) string {
		var out []string
		for _, r := range c.Rules {
			switch {
			case r.Lookup != nil:
				out = append(out, "ban")
			case r.Known:
				out = append(out, "known")
			default:
				out = append(out, r.Comment+":"+verdictWord(r.Verdict.Kind))
			}
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name  string
		chain *Chain
		want  string
	}{
		{"raw: accept, bans", BaseChain([]RuleHead{accept, drop}, -300, bans), "partners:jump partners:jump ban"},
		{"raw: accept, bans, stateless", BaseChain([]RuleHead{accept, stateless, drop}, -300, bans), "partners:jump partners:jump ban edge:goto edge:goto"},
		{"raw: stateless, no bans", BaseChain([]RuleHead{stateless, drop}, -300, Presence{}), "edge:goto edge:goto"},
		{"inbound", ConnChain([]RuleHead{accept, drop}, Presence{}), "known partners:jump partners:jump feed:goto feed:goto"},
	} {
		if got := kinds(tc.chain); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestBitmapRulesFollowOrder: a Bitmap level's rules come in the plan's
// order (busiest first), whatever the verdicts.
func TestBitmapRulesFollowOrder(t *testing.T) {
	p16 := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	for _, order := range [][]plan.EntryKind{{plan.In, plan.DescendOut}, {plan.DescendOut, plan.In}} {
		l := &plan.Layout{Is4: true, Kind: plan.KindTree, Levels: []plan.Level{
			plan.NewLevel(16, 1,
				plan.NewEntry(p16("20.0.0.0/16"), plan.In, 0),
				plan.NewEntry(p16("30.0.0.0/16"), plan.DescendOut, 1),
			),
			plan.NewLevel(24, 2, plan.NewEntry(p16("30.0.7.0/24"), plan.In, 0)),
		}}
		l.Levels[0].Bitmap, l.Levels[0].Order = true, order
		prog := &Program{}
		lowerLayout(prog, l, IPv4, "r", plan.AllowOnly, "hit")
		var got []string
		for _, c := range prog.Chains {
			if c.Name != "r" {
				continue
			}
			for _, r := range c.Rules {
				if r.Lookup != nil {
					got = append(got, strings.TrimPrefix(r.Lookup.Set, "r_d1_l16_"))
				}
			}
		}
		want := map[plan.EntryKind]string{plan.In: "in", plan.DescendOut: "d2_l24_out"}
		if len(got) != 2 || got[0] != want[order[0]] || got[1] != want[order[1]] {
			t.Errorf("order %v: root chain looks up %v", order, got)
		}
	}
}

// TestSameChains: heads that differ in a rule's mode make the same
// chains unless the mode moves the bans (a monitor rule ahead of an
// accept rule); a different rule does not.
func TestSameChains(t *testing.T) {
	accept := RuleHead{Name: "ok", Action: plan.Accept, V4: true}
	feed := RuleHead{Name: "feed", Action: plan.Drop, V4: true}
	monitor := func(h RuleHead) RuleHead { h.Monitor = true; return h }
	for _, tc := range []struct {
		name string
		a, b []RuleHead
		same bool
	}{
		{"the last rule's mode", []RuleHead{accept, feed}, []RuleHead{accept, monitor(feed)}, true},
		{"a mode that moves the bans", []RuleHead{feed, accept}, []RuleHead{monitor(feed), accept}, false},
		{"another rule", []RuleHead{accept, feed}, []RuleHead{accept, {Name: "geo", Action: plan.AllowOnly, V4: true}}, false},
	} {
		if got := SameChains(tc.a, tc.b, -300); got != tc.same {
			t.Errorf("%s: SameChains = %v, want %v", tc.name, got, tc.same)
		}
	}
}
