package ipt_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// compile compiles in and lowers it.
func compile(t *testing.T, in *plan.Input) (*plan.Plan, *ipt.Program) {
	t.Helper()
	p, err := plan.Compile(in, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ipt.FromPlan(p, ipt.LowerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p, prog
}

// TestRestoreText pins the shape of what the ipset backend loads: sets
// sized from the data, connection-aware rules in the mangle table after
// the known connections' RETURN, the jump from PREROUTING first, gotos
// into hit chains, nothing in raw without bans or stateless rules, and
// the filter table only for reject rules.
func TestRestoreText(t *testing.T) {
	_, prog := compile(t, &plan.Input{Backend: plan.IPSet, Rules: []plan.RuleInput{
		{Name: "feeds", Action: plan.Drop, IPv4: true, IPv6: true, Set: set(t, "1.0.0.0/8", "9.9.9.9", "2001:db8::/32")},
		{Name: "web", Action: plan.AllowOnly, Otherwise: plan.Reject, IPv4: true, Ports: []plan.Port{{Proto: "tcp", First: 80, Last: 80}, {Proto: "tcp", First: 8000, Last: 8080}},
			Set: set(t, "10.0.0.0/8")},
	}})
	if len(prog.Sets) != 4 {
		t.Fatalf("%d sets, want 4 (feeds: net4, addr4; web: net4; feeds: net6)", len(prog.Sets))
	}
	for _, s := range prog.Sets {
		if s.HashSize < 1024 || s.MaxElem < 65536 || s.MaxElem < len(s.Elems) {
			t.Errorf("set %s: hashsize %d maxelem %d for %d elements", s.Name, s.HashSize, s.MaxElem, len(s.Elems))
		}
		if len(s.Name)+len(ipt.TempSuffix) > 31 {
			t.Errorf("set name %s too long for ipset", s.Name)
		}
	}
	want4 := prog.Desired(ipt.IPv4)
	got := ipt.Transition(&ipt.State{}, &want4)
	for _, line := range []string{
		"*filter\n:ipfence-reject - [0:0]\n",
		"-I INPUT 1 -m mark --mark 0x100000/0x100000 -m comment --comment ipfence-owned -j ipfence-reject\n",
		"-I OUTPUT 1 -m mark --mark 0x100000/0x100000 -m comment --comment ipfence-owned -j ipfence-reject\n",
		"-A ipfence-reject -p tcp -m comment --comment \"ipfence reject\" -j REJECT --reject-with tcp-reset\n",
		"-A ipfence-reject -m comment --comment \"ipfence reject\" -j REJECT --reject-with icmp-admin-prohibited\n",
		"*mangle\n:ipfence-in - [0:0]\n",
		"-I PREROUTING 1 -m comment --comment ipfence-owned -j ipfence-in\n",
		"-A ipfence-in -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment \"known connections\" -j RETURN\n-A ipfence-in -m set",
		"-m set --match-set " + prog.Sets[0].Name + " src -m comment --comment \"feeds\" -g ipfence-h0\n",
		// ipset cannot hold 0.0.0.0, which allow-only rules let pass
		"-A ipfence-in ! -s 0.0.0.0/32 -p tcp -m multiport --dports 80,8000:8080 -m set ! --match-set " + prog.Sets[2].Name + " src -m comment --comment \"web\" -g ipfence-h1\n",
		"-A ipfence-h0 -i lo -m comment --comment \"loopback\" -j RETURN\n",
		"-A ipfence-h0 -m comment --comment \"ipfence rule feeds\" -j DROP\n",
		"-A ipfence-h1 -m comment --comment \"ipfence rule web\" -j MARK --set-xmark 0x100000/0x100000\n",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("missing %q in\n%s", line, got)
		}
	}
	if strings.Contains(got, "*raw") || strings.Contains(got, "ipfence-out") {
		t.Errorf("raw or outbound chains without bans, stateless or outbound rules:\n%s", got)
	}
	if strings.Index(got, "*filter") > strings.Index(got, "*mangle") {
		t.Errorf("the filter table must come first when it gains the reject chain:\n%s", got)
	}
	// IPv6 has no reject rule: no filter table, and NDP passes.
	want6 := prog.Desired(ipt.IPv6)
	got6 := ipt.Transition(&ipt.State{}, &want6)
	if strings.Contains(got6, "*filter") || !strings.Contains(got6, "--icmpv6-type 135 -m comment") {
		t.Errorf("IPv6:\n%s", got6)
	}

	// Reading back what was loaded and going to nothing removes it all.
	save := "*raw\n:PREROUTING ACCEPT [0:0]\n:host - [0:0]\n:ipfence - [0:0]\n:ipfence-h0 - [0:0]\n-A PREROUTING -s 192.0.2.1/32 -j host\n-A PREROUTING -j ipfence\n-A PREROUTING -s 192.0.2.2/32 -j LOG --log-prefix ipfence\n-A ipfence -j ipfence-h0\nCOMMIT\n" +
		"*mangle\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ipfence-out - [0:0]\n-A OUTPUT -j ipfence-out\n-A ipfence-out -j RETURN\nCOMMIT\n" +
		"*filter\n:INPUT ACCEPT [0:0]\n:ipfence-reject - [0:0]\n-A INPUT -m mark --mark 0x100000/0x100000 -j ipfence-reject\n-A INPUT -j ACCEPT\nCOMMIT\n"
	cur := ipt.ParseSave("ipfence", save)
	if strings.Join(cur.Raw.Chains, ",") != "ipfence,ipfence-h0" || len(cur.Raw.Jumps) != 1 || len(cur.Filter.Jumps) != 1 || len(cur.Raw.Rules) != 1 ||
		len(cur.Mangle.Chains) != 1 || len(cur.Mangle.Jumps) != 1 {
		t.Errorf("ParseSave: %+v", cur)
	}
	flush := ipt.Transition(&cur, &ipt.State{})
	for _, line := range []string{"-D PREROUTING -j ipfence\n", "-F ipfence-h0\n", "*mangle\n", "-D OUTPUT -j ipfence-out\n", "-X ipfence-out\n", "-X ipfence\n", "-D INPUT -m mark --mark 0x100000/0x100000 -j ipfence-reject\n", "-X ipfence-reject\n"} {
		if !strings.Contains(flush, line) {
			t.Errorf("flush: missing %q in\n%s", line, flush)
		}
	}
	if strings.Contains(flush, "host") || strings.Contains(flush, "ACCEPT") {
		t.Errorf("flush touches the host's rules:\n%s", flush)
	}
}

// TestSplitChains: the main chain calls each rule's chains; a rule of few
// prefixes is one chain of plain rules that returns for the next rule;
// allow-only swaps the two.
func TestSplitChains(t *testing.T) {
	_, prog := compile(t, &plan.Input{Backend: plan.IPTablesSplit, Rules: []plan.RuleInput{
		{Name: "a", Action: plan.Drop, IPv4: true, Set: set(t, "2.0.0.0/7", "10.1.0.0/16", "10.2.3.4", "11.0.0.0/9")},
		{Name: "b", Action: plan.AllowOnly, IPv4: true, Set: set(t, "20.0.0.0/8")},
	}})
	want := prog.Desired(ipt.IPv4)
	text := strings.Join(want.Mangle.Rules, "\n") + "\n"
	for _, line := range []string{
		"-A ipfence-in -j ipfence-r0\n",
		"-A ipfence-in -j ipfence-r1\n",
		"-A ipfence-r0 -s 2.0.0.0/7 -g ipfence-h0\n",
		"-A ipfence-r0 -s 10.2.3.4/32 -g ipfence-h0\n",
		"-A ipfence-r0 -j RETURN\n",
		// allow-only: members go on, the rest is hit
		"-A ipfence-r1 -s 20.0.0.0/8 -j RETURN\n",
		"-A ipfence-r1 -g ipfence-h1\n",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("missing %q in\n%s", line, text)
		}
	}
}

// TestSplitTree: the split backend's tree of chains, walked rule by rule
// as iptables does, sends exactly the set's addresses to the hit chain
// (the reference model: the set itself), and no chain is long: a packet
// pays for a few short chains, not for one per /8 or /16.
func TestSplitTree(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	for _, tc := range []struct {
		name   string
		action plan.Action
		set    *prefix.Set
	}{
		{"IPv4 feed", plan.Drop, randomSet(r, 4, 20000)},
		{"IPv6 feed", plan.Drop, randomSet(r, 6, 20000)},
		{"IPv4 big feed", plan.Drop, randomSet(r, 4, 200000)},
		{"IPv4 allow-only", plan.AllowOnly, randomSet(r, 4, 5000)},
		{"one address", plan.Drop, set(t, "9.9.9.9")},
		{"short prefixes", plan.Drop, set(t, "0.0.0.0/2", "128.0.0.0/3", "192.0.0.0/9")},
	} {
		for _, flavour := range []string{ipt.Legacy, ipt.NFT} {
			t.Run(tc.name+"/"+flavour, func(t *testing.T) {
				v6 := prefix.Prefixes(tc.set)[0].Addr().Is6()
				in := &plan.Input{Backend: plan.IPTablesSplit, Rules: []plan.RuleInput{
					{Name: "r", Action: tc.action, IPv4: !v6, IPv6: v6, Set: tc.set}}}
				p, err := plan.Compile(in, plan.Options{})
				if err != nil {
					t.Fatal(err)
				}
				prog, err := ipt.FromPlan(p, ipt.LowerOptions{Flavour: flavour})
				if err != nil {
					t.Fatal(err)
				}
				rule := p.Rules[0] // the set as compiled (allow-only adds loopback)
				f := ipt.IPv4
				if v6 {
					f = ipt.IPv6
				}
				chains := map[string]*ipt.Chain{}
				longest := 0
				for _, c := range prog.Tables[f].Mangle {
					chains[c.Name] = c
					longest = max(longest, len(c.Rules))
				}
				// Legacy: 16 blocks and 14 shorter prefixes (stride 4), or
				// 32 plain prefixes; and the rule that goes on. nft: leaves
				// of up to 1/512 of the prefixes, at most 5 × 512 chains.
				n := len(prefix.Prefixes(rule.Set))
				if flavour == ipt.Legacy && longest > 33 || flavour == ipt.NFT && (longest > max(33, n/512+1) || len(chains) > 5*512) {
					t.Errorf("%d chains, the longest of %d rules, for %d prefixes", len(chains), longest, n)
				}
				var path, most int
				for _, a := range append(demo.Sample(r, tc.set.IPSet(), 5000), randomAddrs(r, v6, 5000)...) {
					hit := walk(t, chains, prog.InChain(), a, &path) == prog.HitChain(0)
					most = max(most, path)
					if want := rule.Set.Contains(a) != (tc.action == plan.AllowOnly); hit != want {
						t.Fatalf("%s: hit %v, want %v", a, hit, want)
					}
				}
				t.Logf("%d chains, at most %d rules on a path", len(chains), most)
			})
		}
	}
}

// walk follows a packet from a through chains from start, rule by rule,
// jumps returning as iptables does, and returns the hit chain it ends in
// ("" when it returns from start); path is how many rules it looked at.
func walk(t *testing.T, chains map[string]*ipt.Chain, start string, a netip.Addr, path *int) string {
	*path = 0
	type frame struct {
		c *ipt.Chain
		i int // the rule to go on from
	}
	var stack []frame
	c, from := chains[start], 0
	for steps := 0; ; steps++ {
		if steps > 64 {
			t.Fatalf("%s: a loop from %s", a, start)
		}
		// New connections: the known connections' RETURN does not match.
		i := slices.IndexFunc(c.Rules[from:], func(r ipt.Rule) bool {
			return r.CtState == "" && (!r.Src.IsValid() || r.Src.Contains(a)) && (!r.Dst.IsValid() || r.Dst.Contains(a))
		})
		tg := ipt.Target{Kind: ipt.Return} // the end of a chain
		if i >= 0 {
			*path += i + 1
			tg = c.Rules[from+i].Target
		}
		switch {
		case tg.Kind == ipt.Return && len(stack) == 0:
			return ""
		case tg.Kind == ipt.Return:
			c, from = stack[len(stack)-1].c, stack[len(stack)-1].i
			stack = stack[:len(stack)-1]
		case tg.Kind == ipt.Jump:
			stack = append(stack, frame{c, from + i + 1})
			c, from = chains[tg.Chain], 0
		case tg.Kind == ipt.Goto && !strings.Contains(tg.Chain, "-h"):
			c, from = chains[tg.Chain], 0
		default:
			return tg.Chain
		}
	}
}

// randomSet is n random prefixes of the family, feed-shaped: single
// addresses and prefixes of many lengths, clustered in a few blocks as
// real data is.
func randomSet(r *rand.Rand, family, n int) *prefix.Set {
	var b prefix.Builder
	for range n {
		a := randomBytes(r)
		if family == 4 {
			a[0] = byte(1 + r.IntN(4)*50)
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), 20+r.IntN(13))
			b.AddPrefix(p.Masked())
			continue
		}
		a[0], a[1] = 0x24, byte(r.IntN(3))
		b.AddPrefix(netip.PrefixFrom(netip.AddrFrom16(a), 24+r.IntN(105)).Masked())
	}
	s, _ := b.Build()
	return s
}

func randomBytes(r *rand.Rand) (a [16]byte) {
	binary.BigEndian.PutUint64(a[:8], r.Uint64())
	binary.BigEndian.PutUint64(a[8:], r.Uint64())
	return a
}

// randomAddrs is n addresses of the family from anywhere.
func randomAddrs(r *rand.Rand, v6 bool, n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		a := randomBytes(r)
		out[i] = netip.AddrFrom16(a)
		if !v6 {
			out[i] = netip.AddrFrom4([4]byte(a[:4]))
		}
	}
	return out
}

func TestFromPlanRefuses(t *testing.T) {
	p, err := plan.Compile(&plan.Input{Table: "a-very-long-table", Backend: plan.IPSet}, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ipt.FromPlan(p, ipt.LowerOptions{}); !errors.Is(err, ipt.ErrName) {
		t.Errorf("long table name: %v", err)
	}
}

// TestSplitDepth: however many rules, no path from PREROUTING runs more
// than 16 chains deep, gotos counted: nf_tables refuses deeper rulesets
// (iptables-nft: "Too many links").
func TestSplitDepth(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	in := &plan.Input{Backend: plan.IPTablesSplit}
	for i := range 30 {
		in.Rules = append(in.Rules, plan.RuleInput{Name: fmt.Sprint("r", i), Action: []plan.Action{plan.Drop, plan.Accept, plan.Reject}[i%3],
			Ports: []plan.Port{{Proto: "tcp", First: 80, Last: 80}}, IPv4: true, IPv6: true, Set: randomSet(r, 4+2*(i%2), 3000)})
	}
	_, prog := compile(t, in)
	for _, f := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
		chains := map[string]*ipt.Chain{}
		for _, c := range prog.Tables[f].Mangle {
			chains[c.Name] = c
		}
		depth := map[string]int{} // the deepest path below a chain, itself included
		var below func(name string) int
		below = func(name string) int {
			if d, ok := depth[name]; ok {
				return d
			}
			d := 1
			for _, rule := range chains[name].Rules {
				if k := rule.Target.Kind; k == ipt.Goto || k == ipt.Jump {
					d = max(d, 1+below(rule.Target.Chain))
				}
			}
			depth[name] = d
			return d
		}
		if d := 1 + below(prog.InChain()); d > 16 { // and PREROUTING
			t.Errorf("%s: %d chains deep", f, d)
		}
	}
}

// TestLayout pins where each part runs: bans and stateless rules (and
// the accept rule before them) in raw, before conntrack; the other
// inbound rules in mangle after the marks of raw's verdicts and the
// known connections' RETURN; outbound rules by destination in mangle
// OUTPUT and FORWARD, stateless ones before the known connections'
// RETURN; a rule of both directions matches one set both ways.
func TestLayout(t *testing.T) {
	p, err := plan.Compile(&plan.Input{Backend: plan.IPSet, Rules: []plan.RuleInput{
		{Name: "office", Action: plan.Accept, IPv4: true, Set: set(t, "10.0.0.0/8")},
		{Name: "ddos", Action: plan.Reject, Stateless: true, IPv4: true, Set: set(t, "1.0.0.0/8")},
		{Name: "geo", Action: plan.AllowOnly, IPv4: true, Set: set(t, "20.0.0.0/8")},
		{Name: "egress", Action: plan.Reject, Direction: plan.Outbound, Stateless: true, IPv4: true, Set: set(t, "40.0.0.0/8")},
		{Name: "c2", Action: plan.Drop, Direction: plan.BothWays, IPv4: true, Set: set(t, "30.0.0.0/8", "31.1.1.1")},
	}}, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ipt.FromPlan(p, ipt.LowerOptions{Bans: true})
	if err != nil {
		t.Fatal(err)
	}
	if prog.PassMark != ipt.DefaultRejectMark<<1 {
		t.Errorf("PassMark %#x", prog.PassMark)
	}
	if len(prog.Sets) != 6 { // office, ddos, geo, egress, c2 (nets and an address)
		t.Errorf("%d sets, want 6 (one per kind and rule, whatever its directions)", len(prog.Sets))
	}
	c2 := prog.SetName(p.Rules[4], "n", ipt.IPv4)
	want := prog.Desired(ipt.IPv4)
	text := ipt.Transition(&ipt.State{}, &want)
	order := []string{
		"*filter\n",
		"-I OUTPUT 1 -m mark --mark 0x100000/0x100000 -m comment --comment ipfence-owned -j ipfence-reject\n",
		"*mangle\n",
		"-I OUTPUT 1 -m comment --comment ipfence-owned -j ipfence-out\n", // inserted first, in reverse
		"-I FORWARD 1 -m comment --comment ipfence-owned -j ipfence-out\n",
		"-I PREROUTING 1 -m comment --comment ipfence-owned -j ipfence-in\n",
		"-A ipfence-in -m mark --mark 0x100000/0x100000 -m comment --comment \"rejected before conntrack\" -j RETURN\n",
		"-A ipfence-in -m mark --mark 0x200000/0x200000 -m comment --comment \"accepted before conntrack\" -g ipfence-pass\n",
		"-A ipfence-in -m conntrack --ctstate RELATED,ESTABLISHED",
		"-A ipfence-in ! -s 0.0.0.0/32 -m set ! --match-set",
		"-A ipfence-in -m set --match-set " + c2 + " src -m comment --comment \"c2\" -g ipfence-h4\n",
		"-A ipfence-pass -j MARK --set-xmark 0x0/0x200000\n",
		"-A ipfence-h4 -i lo -m comment --comment \"loopback\" -j RETURN\n",
		"-A ipfence-out -m set --match-set " + prog.SetName(p.Rules[3], "n", ipt.IPv4) + " dst -m comment --comment \"egress\" -g ipfence-o3\n",
		"-A ipfence-out -m conntrack --ctstate RELATED,ESTABLISHED",
		"-A ipfence-out -m set --match-set " + c2 + " dst -m comment --comment \"c2\" -g ipfence-o4\n",
		"-A ipfence-o3 -m comment --comment \"ipfence rule egress\" -j MARK --set-xmark 0x100000/0x100000\n",
		"-A ipfence-o4 -o lo -m comment --comment \"loopback\" -j RETURN\n",
		"*raw\n",
		"-I PREROUTING 1 -m comment --comment ipfence-owned -j ipfence\n",
		"-A ipfence -m set --match-set ipfence-ban4 src -m comment --comment \"ipfence bans\" -j DROP\n",
		"\" -g ipfence-h0\n", // office
		"\" -g ipfence-h1\n", // ddos
		"-A ipfence-h0 -m comment --comment \"ipfence rule office\" -j MARK --set-xmark 0x200000/0x200000\n-A ipfence-h0 -j RETURN\n",
		"-A ipfence-h1 -m comment --comment \"ipfence rule ddos\" -j MARK --set-xmark 0x100000/0x100000\n",
	}
	at := 0
	for _, line := range order {
		i := strings.Index(text[at:], line)
		if i < 0 {
			t.Fatalf("missing %q after byte %d (or out of order) in\n%s", line, at, text)
		}
		at += i + len(line)
	}
	if strings.Contains(text, "-g ipfence-h2\n-A ipfence ") || strings.Contains(strings.Join(want.Raw.Rules, "\n"), "geo") {
		t.Errorf("connection-aware rule geo in raw:\n%s", text)
	}
}
