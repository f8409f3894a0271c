package plan

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

func set(ps ...string) *prefix.Set {
	var b prefix.Builder
	for _, p := range ps {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	s, _ := b.Build()
	return s
}

func TestCompileVerdicts(t *testing.T) {
	in := &Input{
		Protect: set("203.0.113.7/32"),
		Rules: []RuleInput{
			{Name: "allow", Action: Accept, IPv4: true, IPv6: true, Set: set("10.1.0.0/16")},
			{Name: "feeds", Action: Drop, IPv4: true, IPv6: true, Set: set("10.0.0.0/8", "203.0.113.0/24", "2001:db8::/32")},
			{Name: "web", Action: AllowOnly, IPv4: true, Ports: []Port{{Proto: "tcp", First: 80, Last: 443}}, Set: set("192.0.2.0/24")},
			{Name: "rej", Action: Reject, IPv4: true, IPv6: true, Set: set("198.51.100.0/24", "fe80::/10")},
		},
	}
	p, err := Compile(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, proto string
		port       uint16
		verdict    string
		rule       string
	}{
		{"10.1.2.3", "tcp", 80, "accept", "allow"},      // accepted before the drop rule
		{"10.2.2.3", "udp", 53, "drop", "feeds"},        //
		{"203.0.113.7", "udp", 53, "accept", "protect"}, // protected inside a dropped /24
		{"203.0.113.8", "udp", 53, "drop", "feeds"},     //
		{"2001:db8::1", "udp", 53, "drop", "feeds"},     //
		{"8.8.8.8", "tcp", 443, "drop", "web"},          // not in the allow-only set, port filtered
		{"8.8.8.8", "tcp", 22, "accept", ""},            // port not filtered
		{"192.0.2.9", "tcp", 80, "accept", ""},          // in the allow-only set
		{"2001:db9::1", "tcp", 80, "accept", ""},        // web is IPv4 only
		{"198.51.100.1", "udp", 1, "reject", "rej"},     //
		{"fe80::1", "udp", 1, "accept", "protect"},      // link-local is always protected
	} {
		d := p.Verdict(Packet{Src: netip.MustParseAddr(tc.src), Proto: tc.proto, DPort: tc.port})
		if d.Verdict != tc.verdict || d.Rule != tc.rule {
			t.Errorf("%s %s/%d: %+v, want %s by %q", tc.src, tc.proto, tc.port, d, tc.verdict, tc.rule)
		}
	}
	if p.Rules[2].V6.Kind != KindEmpty {
		t.Errorf("an IPv4-only rule has an IPv6 layout: %v", p.Rules[2].V6.Kind)
	}
	if len(p.Warnings) != 2 || !strings.Contains(p.Warnings[0], "203.0.113.7/32") {
		t.Errorf("warnings %q, want the protected feed entry and the protected link-local", p.Warnings)
	}
	if r, blocked := p.Blocked(netip.MustParseAddr("10.9.9.9")); !blocked || r != "feeds" {
		t.Errorf("Blocked(10.9.9.9) = %q, %v", r, blocked)
	}
	if _, blocked := p.Blocked(netip.MustParseAddr("10.1.9.9")); blocked {
		t.Error("an accepted address counts as blocked")
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    RuleInput
		is   error
	}{
		{"drop all IPv4", RuleInput{Name: "a", Action: Drop, IPv4: true, IPv6: true, Set: set("0.0.0.0/0")}, ErrBlocksEverything},
		{"reject all IPv6", RuleInput{Name: "a", Action: Reject, IPv4: true, IPv6: true, Set: set("::/0")}, ErrBlocksEverything},
		{"allow-only without IPv6", RuleInput{Name: "a", Action: AllowOnly, IPv4: true, IPv6: true, Set: set("1.0.0.0/8")}, ErrBlocksEverything},
	} {
		_, err := Compile(&Input{Rules: []RuleInput{tc.r}}, Options{})
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
		}
	}
	_, err := Compile(&Input{Rules: []RuleInput{{Name: "a", Action: Drop, IPv4: true, Set: set("1.0.0.0/8")}, {Name: "a", Action: Drop, IPv4: true, Set: set("2.0.0.0/8")}}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate rule names: %v", err)
	}
	// Accepting everything is allowed (and is one rule with no lookup).
	p, err := Compile(&Input{Rules: []RuleInput{{Name: "a", Action: Accept, IPv4: true, Set: set("0.0.0.0/0")}}}, Options{})
	if err != nil || p.Rules[0].V4.Kind != KindAll {
		t.Errorf("accept all: %v", err)
	}
}

// TestAssignBackends: the leading drop and allow-only rules without ports
// that ask for XDP run there; the rest run in nftables, with a note when
// they asked for XDP.
func TestAssignBackends(t *testing.T) {
	rule := func(name string, a Action, ports ...Port) RuleInput {
		return RuleInput{Name: name, Action: a, Ports: ports, IPv4: true, IPv6: true, Set: set("192.0.2.0/24", "2001:db8::/32"), Where: "p.yaml:1"}
	}
	in := &Input{Backend: XDP, Interfaces: []string{"eth0"}, Rules: []RuleInput{
		rule("feed", Drop), rule("geo", AllowOnly), rule("ssh", Drop, Port{Proto: "tcp", First: 22, Last: 22}),
		rule("late", Drop), rule("rej", Reject),
	}}
	in.Rules[3].Backend = NFTables // asks for nftables itself: no note
	p, err := Compile(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Backend{XDP, XDP, NFTables, NFTables, NFTables}
	notes := []bool{false, false, true, false, true}
	for i, r := range p.Rules {
		if r.Backend != want[i] || (r.BackendNote != "") != notes[i] {
			t.Errorf("rule %s: backend %s, note %q; want %s, note %v", r.Name, r.Backend, r.BackendNote, want[i], notes[i])
		}
	}
	// XDP rules carry counts, not nftables layouts; the others their
	// layout.
	for _, r := range p.Rules {
		kind := KindPlain
		if r.Backend == XDP {
			kind = KindXDP
		}
		for _, l := range []*Layout{r.V4, r.V6} {
			b, _ := Build(r.Set, l.Is4, Options{})
			if l.Kind != kind || l.Prefixes != b.Prefixes {
				t.Errorf("rule %s (%s): %v layout of %d prefixes, want %s of %d", r.Name, r.Backend, l.Kind, l.Prefixes, kind, b.Prefixes)
			}
		}
	}
	if got := p.XDPRules(); len(got) != 2 || got[1].Name != "geo" {
		t.Errorf("XDPRules = %v, want feed and geo", got)
	}
	if len(p.Interfaces) != 1 || p.Interfaces[0] != "eth0" {
		t.Errorf("interfaces %v", p.Interfaces)
	}

	// A rule's own backend: only it runs in XDP.
	in = &Input{Interfaces: []string{"eth0"}, Rules: []RuleInput{rule("feed", Drop), rule("geo", AllowOnly)}}
	in.Rules[0].Backend = XDP
	if p, err = Compile(in, Options{}); err != nil || len(p.XDPRules()) != 1 || p.Rules[1].Backend != NFTables {
		t.Errorf("per-rule backend: %v, %+v", err, p)
	}

	in.Interfaces = nil
	if _, err := Compile(in, Options{}); !errors.Is(err, ErrNoInterfaces) {
		t.Errorf("XDP rules without interfaces: %v, want ErrNoInterfaces", err)
	}
}

// TestCompileConsume: with Consume, Compile drops the input's rule sets
// and makes the same plan as without.
func TestCompileConsume(t *testing.T) {
	mk := func() *Input {
		return &Input{
			Protect: set("203.0.113.7/32"),
			Rules: []RuleInput{
				{Name: "feeds", Action: Drop, IPv4: true, IPv6: true, Set: set("10.0.0.0/8", "203.0.113.0/24", "2001:db8::/32")},
				{Name: "web", Action: AllowOnly, IPv4: true, Set: set("192.0.2.0/24")},
			},
		}
	}
	kept, consumed := mk(), mk()
	want, err := Compile(kept, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Compile(consumed, Options{Consume: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range kept.Rules {
		if kept.Rules[i].Set == nil || consumed.Rules[i].Set != nil {
			t.Fatalf("rule %d: input set kept %v, consumed %v", i, kept.Rules[i].Set != nil, consumed.Rules[i].Set != nil)
		}
		if !got.Rules[i].Set.Equal(want.Rules[i].Set) {
			t.Errorf("rule %d: the consuming compile's set differs", i)
		}
	}
}
