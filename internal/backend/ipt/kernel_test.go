package ipt_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/demo"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// set builds a set of prefixes, ranges or addresses.
func set(t testing.TB, items ...string) *prefix.Set {
	t.Helper()
	var b prefix.Builder
	for _, s := range items {
		if p, err := netip.ParsePrefix(s); err == nil {
			b.AddPrefix(p)
		} else if r, err := netipx.ParseIPRange(s); err == nil {
			b.AddRange(r)
		} else {
			b.Add(netip.MustParseAddr(s))
		}
	}
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testInput is a policy of every action, with ports, both families,
// single addresses and prefixes of many lengths.
func testInput(t testing.TB, backend plan.Backend) *plan.Input {
	r := rand.New(rand.NewPCG(3, 3))
	var feed []string
	for range 3000 {
		feed = append(feed, netip.AddrFrom4([4]byte{byte(1 + r.IntN(100)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}).String())
	}
	for range 500 {
		a := netip.AddrFrom4([4]byte{byte(101 + r.IntN(90)), byte(r.IntN(256)), byte(r.IntN(256)), 0})
		feed = append(feed, netip.PrefixFrom(a, 12+r.IntN(13)).Masked().String())
	}
	for range 800 {
		a := netip.AddrFrom16([16]byte{0x20, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		feed = append(feed, netip.PrefixFrom(a, 20+r.IntN(109)).Masked().String())
	}
	return &plan.Input{Backend: backend, Protect: set(t, "198.18.0.0/15", "2001:2::/48"), Rules: []plan.RuleInput{
		{Name: "allow", Action: plan.Accept, IPv4: true, IPv6: true, Set: set(t, "1.2.3.0/24", "2001:db8:5::/48", "5.0.0.0/8")},
		{Name: "feeds", Action: plan.Drop, IPv4: true, IPv6: true, Set: set(t, feed...)},
		{Name: "clients", Action: plan.AllowOnly, Otherwise: plan.Reject, Ports: []plan.Port{{Proto: "udp", First: 9000, Last: 9001}},
			IPv4: true, IPv6: true, Set: set(t, "200.0.0.0/8", "201.1.0.0/16", "2a00::/12")},
		{Name: "rej", Action: plan.Reject, IPv4: true, IPv6: false, Set: set(t, "210.0.0.0/7", "212.5.5.5")},
		{Name: "v6only", Action: plan.AllowOnly, IPv4: false, IPv6: true, Set: set(t, "2000::/4")},
	}}
}

// sample draws sources inside and around every rule's set.
func sample(p *plan.Plan, n int) []netip.Addr {
	r := rand.New(rand.NewPCG(9, 9))
	var srcs []netip.Addr
	for _, rule := range p.Rules {
		srcs = append(srcs, demo.Sample(r, rule.Set.IPSet(), n)...)
	}
	return srcs
}

// checkVerdicts sends a UDP packet per source and port and compares what
// passed with the model (pktgentest.ExpectModel); it returns how many
// packets each rule decided, by the model.
func checkVerdicts(t *testing.T, lab *netns.Lab, p *plan.Plan, srcs []netip.Addr, ports ...uint16) (decided map[string]uint64, rejected uint64) {
	t.Helper()
	decided = map[string]uint64{}
	for _, port := range ports {
		for _, d := range pktgentest.ExpectModel(t, lab, p, srcs, port) {
			if d.Rule != "" && d.Rule != "protect" {
				decided[d.Rule]++
			}
			if d.Verdict == "reject" {
				rejected++
			}
		}
	}
	return decided, rejected
}

// checkCounters compares the rules' counters with what the model says
// they decided.
func checkCounters(t *testing.T, o ipt.Options, table string, decided map[string]uint64, rejected uint64) {
	t.Helper()
	st, err := ipt.ReadStatus(context.Background(), table, o)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Loaded {
		t.Errorf("status: not loaded")
	}
	got := map[string]uint64{}
	for _, rc := range st.Rules {
		got[rc.Rule] = rc.Packets
	}
	for rule, n := range decided {
		if got[rule] != n {
			t.Errorf("rule %s: counters say %d packets, the model %d", rule, got[rule], n)
		}
	}
	if st.Rejected != rejected {
		t.Errorf("the reject chain rejected %d packets, the model %d", st.Rejected, rejected)
	}
}

// hostRules gives the namespace rules and a set of the host's own, which
// ipfence must leave alone, and returns how to list them.
func hostRules(t *testing.T, ns, flavour string) func() string {
	t.Helper()
	for _, argv := range [][]string{
		{"ipset", "create", "host-set", "hash:ip"},
		{"ipset", "add", "host-set", "192.0.2.1"},
		{"iptables-" + flavour, "-w", "-t", "raw", "-A", "PREROUTING", "-s", "192.0.2.9", "-j", "CT", "--notrack"},
		{"iptables-" + flavour, "-w", "-A", "INPUT", "-m", "set", "--match-set", "host-set", "src", "-j", "DROP"},
		{"ip6tables-" + flavour, "-w", "-t", "raw", "-A", "PREROUTING", "-s", "2001:db8:ffff::1", "-j", "DROP"},
	} {
		if _, err := netns.Exec(ns, argv...); err != nil {
			t.Fatal(err)
		}
	}
	return func() string {
		var b strings.Builder
		for _, argv := range [][]string{{"iptables-" + flavour + "-save"}, {"ip6tables-" + flavour + "-save"}, {"ipset", "list"}} {
			out, err := netns.Exec(ns, argv...)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(withoutEmptyTables(string(out)))
		}
		return b.String()
	}
}

// withoutEmptyTables drops iptables-save's comments (dates), the packet
// counters of chain policies (a namespace's own router solicitations pass
// through raw OUTPUT while the test runs), and the tables without rules or
// chains of their own whose built-in chains accept: such a table, which
// the iptables tools register and leave, passes every packet as no table
// does.
func withoutEmptyTables(save string) string {
	var b, table strings.Builder
	empty := true
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			table.Reset()
			empty = true
			table.WriteString(l + "\n")
		case l == "COMMIT":
			if !empty {
				b.WriteString(table.String() + l + "\n")
			}
			table.Reset()
		case table.Len() > 0:
			if strings.HasPrefix(l, ":") {
				l = l[:strings.LastIndexByte(l, ' ')]
			}
			table.WriteString(l + "\n")
			if !strings.HasPrefix(l, ":") || !strings.HasSuffix(l, " ACCEPT") {
				empty = false
			}
		default:
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestApplyVerdicts applies a policy of every action with each iptables
// backend and flavour in a fresh namespace holding rules and a set of the
// host's own, checks verdicts and counters against the model, applies a
// changed policy over it, and flushes: the host's rules and sets are as
// they were.
func TestApplyVerdicts(t *testing.T) {
	eachBackend(t, func(t *testing.T, lab *netns.Lab, tc backendCase) {
		ctx := context.Background()
		host := hostRules(t, lab.FW, tc.flavour)
		before := host()
		o := ipt.Options{NetNS: lab.FW, Flavour: tc.flavour}
		in := testInput(t, tc.backend)
		for round := range 2 {
			if round == 1 {
				// Rules go (the reject chain with them), move
				// and change action.
				in.Rules = []plan.RuleInput{in.Rules[2], in.Rules[1], in.Rules[4]}
				in.Rules[1].Action = plan.Reject
			}
			p, prog := compile(t, in)
			res, err := ipt.Apply(ctx, prog, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d: %+v", round, res)
			decided, rejected := checkVerdicts(t, lab, p, sample(p, 1500), 9000, 53)
			checkCounters(t, o, p.Table, decided, rejected)
			st, err := ipt.ReadStatus(ctx, p.Table, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Sets) != len(prog.Sets) {
				t.Errorf("status lists %d sets, the program has %d", len(st.Sets), len(prog.Sets))
			}
			listed := map[string]int{}
			for _, ss := range st.Sets {
				listed[ss.Name] = ss.Elements
			}
			for _, s := range prog.Sets {
				if n, ok := listed[s.Name]; !ok || n != len(s.Elems) {
					t.Errorf("status: set %s lists %d elements (listed: %v), the program has %d", s.Name, n, ok, len(s.Elems))
				}
			}
		}
		found, err := ipt.Flush(ctx, "ipfence", o)
		if err != nil || !found {
			t.Fatalf("flush: %v, %v", found, err)
		}
		if after := host(); after != before {
			t.Errorf("the host's rules and sets changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// backendCase is one iptables backend in one flavour.
type backendCase struct {
	backend plan.Backend
	flavour string
}

// eachBackend runs test for each iptables backend and flavour, as a
// subtest with a fresh lab.
func eachBackend(t *testing.T, test func(t *testing.T, lab *netns.Lab, tc backendCase)) {
	for _, tc := range []backendCase{{plan.IPSet, ipt.NFT}, {plan.IPSet, ipt.Legacy}, {plan.IPTablesSplit, ipt.NFT}, {plan.IPTablesSplit, ipt.Legacy}} {
		t.Run(fmt.Sprintf("%s-%s", tc.backend, tc.flavour), func(t *testing.T) {
			test(t, netnstest.New(t, "ipset", "iptables-"+tc.flavour+"-restore", "ip6tables-"+tc.flavour+"-restore"), tc)
		})
	}
}

// TestBans loads a program with ban sets, bans an address for 2 s and an
// IPv6 prefix until lifted, and checks with packets: bans drop at once,
// a reload keeps them, a lifted one and an expired one pass again, and
// flush removes the ban sets.
func TestBans(t *testing.T) {
	lab := netnstest.New(t, "ipset", "iptables-nft-restore", "ip6tables-nft-restore")
	ctx := context.Background()
	o := ipt.Options{NetNS: lab.FW, Flavour: ipt.NFT}
	in := &plan.Input{Backend: plan.IPSet, Protect: set(t, "198.18.0.0/15", "2001:2::/48"), Rules: []plan.RuleInput{
		{Name: "feeds", Action: plan.Drop, IPv4: true, IPv6: true, Set: set(t, "1.0.0.0/8", "2001:db8:1::/48")}}}
	p, err := plan.Compile(in, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ipt.FromPlan(p, ipt.LowerOptions{Bans: true, Flavour: ipt.NFT}); err != nil {
		t.Fatal(err)
	}
	split := *p
	split.Backend = plan.IPTablesSplit
	if _, err := ipt.FromPlan(&split, ipt.LowerOptions{Bans: true}); !errors.Is(err, ipt.ErrBans) {
		t.Errorf("split with bans: %v, want ErrBans", err)
	}
	prog, _ := ipt.FromPlan(p, ipt.LowerOptions{Bans: true, Flavour: ipt.NFT})
	if _, err := ipt.Apply(ctx, prog, o); err != nil {
		t.Fatal(err)
	}
	a4, a6 := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("2001:db8:77::9")
	srcs := []netip.Addr{a4, a6, netip.MustParseAddr("203.0.113.6"), netip.MustParseAddr("1.2.3.4")}
	expect := func(what string, want ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 9000, want, what)
	}
	count := func(want int) {
		t.Helper()
		if n, err := ipt.BanCount(ctx, p.Table, o); err != nil || n != want {
			t.Errorf("BanCount = %d, %v; want %d", n, err, want)
		}
	}
	expect("before the bans", true, true, true, false)
	err = ipt.Ban(ctx, p.Table, o, []ipt.BanEntry{{Prefix: netip.PrefixFrom(a4, 32), TTL: 2 * time.Second},
		{Prefix: netip.MustParsePrefix("2001:db8:77::/48")}, {Prefix: netip.MustParsePrefix("203.0.113.128/25"), TTL: 1000 * time.Hour}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	expect("banned", false, false, true, false)
	count(3)
	if _, err := ipt.Apply(ctx, prog, o); err != nil {
		t.Fatal(err)
	}
	expect("reloaded", false, false, true, false)
	if err := ipt.Ban(ctx, p.Table, o, nil, []netip.Prefix{netip.MustParsePrefix("2001:db8:77::/48")}); err != nil {
		t.Fatal(err)
	}
	expect("IPv6 ban lifted", false, true, true, false)
	time.Sleep(2500*time.Millisecond - time.Since(t0))
	expect("IPv4 ban expired", true, true, true, false)
	count(1)

	// What was loaded is in force until another program takes a piece
	// of it away: the jump, or a chain's rules.
	inForce := func(want bool, what string) {
		t.Helper()
		if ok, err := ipt.InForce(ctx, prog, o); err != nil || ok != want {
			t.Errorf("%s: InForce = %v, %v; want %v", what, ok, err, want)
		}
	}
	inForce(true, "as loaded")
	netnstest.Exec(t, lab.FW, "ip6tables-nft", "-t", "raw", "-F", "PREROUTING")
	inForce(false, "ip6tables' jump flushed")
	if _, err := ipt.Apply(ctx, prog, o); err != nil {
		t.Fatal(err)
	}
	inForce(true, "loaded again")
	netnstest.Exec(t, lab.FW, "iptables-nft", "-t", "raw", "-F", prog.Prefix)
	inForce(false, "ipfence's IPv4 chain flushed")

	if _, err := ipt.Flush(ctx, p.Table, o); err != nil {
		t.Fatal(err)
	}
	out, err := netns.Exec(lab.FW, "ipset", "list", "-n")
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("after flush: ipsets %q, %v", out, err)
	}
}
