package ipt_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/plan"
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
// sized from the data, the jump from PREROUTING first, gotos into hit
// chains, and the filter table only for reject rules.
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
		"-I INPUT 1 -m mark --mark 0x100000/0x100000 -j ipfence-reject\n",
		"-A ipfence-reject -p tcp -m comment --comment \"ipfence reject\" -j REJECT --reject-with tcp-reset\n",
		"-A ipfence-reject -m comment --comment \"ipfence reject\" -j REJECT --reject-with icmp-admin-prohibited\n",
		"*raw\n:ipfence - [0:0]\n",
		"-I PREROUTING 1 -j ipfence\n",
		"-m set --match-set " + prog.Sets[0].Name + " src -m comment --comment \"feeds\" -g ipfence-h0\n",
		// ipset cannot hold 0.0.0.0, which allow-only rules let pass
		"-A ipfence ! -s 0.0.0.0/32 -p tcp -m multiport --dports 80,8000:8080 -m set ! --match-set " + prog.Sets[2].Name + " src -m comment --comment \"web\" -g ipfence-h1\n",
		"-A ipfence-h0 -i lo -m comment --comment \"loopback\" -j RETURN\n",
		"-A ipfence-h0 -m comment --comment \"ipfence rule feeds\" -j DROP\n",
		"-A ipfence-h1 -m comment --comment \"ipfence rule web\" -j MARK --set-xmark 0x100000/0x100000\n",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("missing %q in\n%s", line, got)
		}
	}
	if strings.Index(got, "*filter") > strings.Index(got, "*raw") {
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
		"*filter\n:INPUT ACCEPT [0:0]\n:ipfence-reject - [0:0]\n-A INPUT -m mark --mark 0x100000/0x100000 -j ipfence-reject\n-A INPUT -j ACCEPT\nCOMMIT\n"
	cur := ipt.ParseSave("ipfence", save)
	if strings.Join(cur.Raw.Chains, ",") != "ipfence,ipfence-h0" || len(cur.Raw.Jumps) != 1 || len(cur.Filter.Jumps) != 1 || len(cur.Raw.Rules) != 1 {
		t.Errorf("ParseSave: %+v", cur)
	}
	flush := ipt.Transition(&cur, &ipt.State{})
	for _, line := range []string{"-D PREROUTING -j ipfence\n", "-F ipfence-h0\n", "-X ipfence\n", "-D INPUT -m mark --mark 0x100000/0x100000 -j ipfence-reject\n", "-X ipfence-reject\n"} {
		if !strings.Contains(flush, line) {
			t.Errorf("flush: missing %q in\n%s", line, flush)
		}
	}
	if strings.Contains(flush, "host") || strings.Contains(flush, "ACCEPT") {
		t.Errorf("flush touches the host's rules:\n%s", flush)
	}
}

// TestSplitChains: one chain per /8 holding prefixes, shorter prefixes in
// the rule's chain, every chain ending by going on to the next rule.
func TestSplitChains(t *testing.T) {
	_, prog := compile(t, &plan.Input{Backend: plan.IPTablesSplit, Rules: []plan.RuleInput{
		{Name: "a", Action: plan.Drop, IPv4: true, Set: set(t, "2.0.0.0/7", "10.1.0.0/16", "10.2.3.4", "11.0.0.0/9")},
		{Name: "b", Action: plan.AllowOnly, IPv4: true, Set: set(t, "20.0.0.0/8")},
	}})
	want := prog.Desired(ipt.IPv4)
	text := strings.Join(want.Raw.Rules, "\n") + "\n"
	for _, line := range []string{
		"-A ipfence -g ipfence-r0\n",
		"-A ipfence-r0 -s 2.0.0.0/7 -g ipfence-h0\n",
		"-A ipfence-r0 -s 10.0.0.0/8 -g ipfence-r0-b0\n",
		"-A ipfence-r0 -s 11.0.0.0/8 -g ipfence-r0-b1\n",
		"-A ipfence-r0 -g ipfence-r1\n",
		"-A ipfence-r0-b0 -s 10.2.3.4/32 -g ipfence-h0\n",
		"-A ipfence-r0-b0 -g ipfence-r1\n",
		// allow-only: members go on, the rest is hit
		"-A ipfence-r1 -s 20.0.0.0/8 -j RETURN\n",
		"-A ipfence-r1 -g ipfence-h1\n",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("missing %q in\n%s", line, text)
		}
	}
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
