package plan

import (
	"net/netip"
	"strings"
	"testing"
)

// TestOtherwiseReject: an allow-only rule with otherwise reject rejects
// the sources outside its set, on its ports only; otherwise is refused on
// other actions.
func TestOtherwiseReject(t *testing.T) {
	in := &Input{Rules: []RuleInput{{Name: "p8001", Action: AllowOnly, Otherwise: Reject, IPv4: true,
		Ports: []Port{{Proto: "tcp", First: 8001, Last: 8001}}, Set: set("192.0.2.0/28")}}}
	p, err := Compile(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src  string
		port uint16
		want string
	}{{"192.0.2.1", 8001, "accept"}, {"192.0.2.99", 8001, "reject"}, {"192.0.2.99", 8002, "accept"}} {
		if d := p.Verdict(Packet{Src: netip.MustParseAddr(c.src), Proto: "tcp", DPort: c.port}); d.Verdict != c.want {
			t.Errorf("%s:%d: %+v, want %s", c.src, c.port, d, c.want)
		}
	}
	if p.Rules[0].Hit() != Reject {
		t.Errorf("Hit: %s", p.Rules[0].Hit())
	}
	in.Rules[0].Action = Drop
	if _, err := Compile(in, Options{}); err == nil || !strings.Contains(err.Error(), "otherwise is for allow-only") {
		t.Errorf("otherwise on a drop rule: %v", err)
	}
}

// TestIPTablesBackends: the plan records the iptables backend, its rules
// get prefix counts (no nftables layout), and rules cannot ask for XDP or
// nftables there; auto must be resolved first.
func TestIPTablesBackends(t *testing.T) {
	for _, b := range []Backend{IPSet, IPTablesSplit} {
		in := &Input{Backend: b, Rules: []RuleInput{{Name: "a", Action: Drop, IPv4: true, IPv6: true, Set: set("1.0.0.0/8", "2001:db8::/32")}}}
		p, err := Compile(in, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Backend != b || p.Rules[0].Backend != b || p.Rules[0].V4.Kind != Kind(b) || p.Rules[0].V4.Prefixes != 1 {
			t.Errorf("%s: plan backend %s, rule %s, layout %+v", b, p.Backend, p.Rules[0].Backend, p.Rules[0].V4)
		}
		for _, rb := range []Backend{XDP, NFTables} {
			in.Rules[0].Backend = rb
			if _, err := Compile(in, Options{}); err == nil {
				t.Errorf("%s: a rule asking for %s compiled", b, rb)
			}
		}
	}
	if _, err := Compile(&Input{Backend: Auto}, Options{}); err == nil {
		t.Error("backend auto compiled unresolved")
	}
	if _, err := ParseRuleBackend("ipset"); err == nil {
		t.Error("a rule may not ask for ipset")
	}
}
