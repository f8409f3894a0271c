package plan

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestConnectionAwareModel checks the reference model's directions and
// states: a connection-aware rule judges new connections only, a
// stateless one every packet; inbound rules judge by source, outbound
// ones by destination.
func TestConnectionAwareModel(t *testing.T) {
	in := &Input{Rules: []RuleInput{
		{Name: "feed", Action: Drop, IPv4: true, IPv6: true, Set: set("192.0.2.0/24"), Stateless: true, Where: "p:1"},
		{Name: "geo", Action: AllowOnly, IPv4: true, IPv6: true, Set: set("198.51.100.0/24", "2001:db8::/32"), Where: "p:2"},
		{Name: "c2", Action: Reject, Direction: Outbound, IPv4: true, IPv6: true, Set: set("203.0.113.0/24"), Where: "p:3"},
	}}
	p, err := Compile(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		pkt  Packet
		want string // deciding rule
	}{
		{Packet{Src: a("8.8.8.8")}, "geo"},                                     // new, outside the allowed set
		{Packet{Src: a("8.8.8.8"), Established: true}, ""},                     // the reply to our own DNS query
		{Packet{Src: a("198.51.100.7")}, ""},                                   // allowed
		{Packet{Src: a("192.0.2.9"), Established: true}, "feed"},               // stateless: replies too
		{Packet{Out: true, Src: a("198.18.0.1"), Dst: a("8.8.8.8")}, ""},       // outbound: geo is inbound only
		{Packet{Out: true, Src: a("198.18.0.1"), Dst: a("203.0.113.5")}, "c2"}, // to a listed destination
		{Packet{Src: a("203.0.113.5"), Established: true}, ""},                 // c2 judges outbound only
		{Packet{Out: true, Dst: a("203.0.113.5"), Established: true}, ""},      // a connection c2 did not see open
		{Packet{Src: a("2001:db8::1")}, ""},
		{Packet{Src: a("2001:db9::1")}, "geo"},
	} {
		if got := p.Verdict(tc.pkt).Rule; got != tc.want {
			t.Errorf("%+v: decided by %q, want %q", tc.pkt, got, tc.want)
		}
	}
	if p.Rules[2].Direction != Outbound || p.Rules[1].Direction != Inbound || !p.Rules[0].Stateless || p.Rules[1].Stateless {
		t.Errorf("directions/statelessness not kept: %+v %+v %+v", p.Rules[0], p.Rules[1], p.Rules[2])
	}
	egress, err := Compile(&Input{Rules: []RuleInput{{Name: "egress", Action: AllowOnly, Direction: Outbound, IPv4: true, IPv6: true,
		Set: set("198.51.100.0/24", "2001:db8::/32"), Where: "p:1"}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"224.0.0.251", "255.255.255.255", "ff02::1:2", "ff02::16"} {
		if d := egress.Verdict(Packet{Out: true, Dst: a(dst)}); d.Rule != "" {
			t.Errorf("outbound allow-only blocks %s (DHCP, mDNS, MLD): %+v", dst, d)
		}
	}
	if d := egress.Verdict(Packet{Out: true, Dst: a("8.8.8.8")}); d.Rule != "egress" {
		t.Errorf("outbound allow-only lets 8.8.8.8 through: %+v", d)
	}
	if r, ok := p.BlockedOut(a("203.0.113.1")); !ok || r != "c2" {
		t.Errorf("BlockedOut(203.0.113.1) = %q, %v; want c2", r, ok)
	}
	if _, ok := p.BlockedOut(a("8.8.8.8")); ok {
		t.Error("BlockedOut(8.8.8.8): an inbound rule counted for outbound")
	}
}

// TestStatelessOrder refuses a stateless rule after a connection-aware
// blocking rule of the same direction, and warns about the stateless
// allow-only trap.
func TestStatelessOrder(t *testing.T) {
	rules := []RuleInput{
		{Name: "ok", Action: Accept, IPv4: true, Set: set("198.18.0.0/15"), Where: "p:1"},
		{Name: "geo", Action: AllowOnly, IPv4: true, Set: set("198.51.100.0/24"), Where: "p:2"},
		{Name: "edge", Action: Drop, IPv4: true, Set: set("192.0.2.0/24"), Stateless: true, Where: "p:3"},
	}
	_, err := Compile(&Input{Rules: rules}, Options{})
	if !errors.Is(err, ErrStatelessOrder) || !strings.Contains(err.Error(), `"geo"`) {
		t.Errorf("stateless after connection-aware: %v, want ErrStatelessOrder naming geo", err)
	}
	rules[2].Direction = Outbound // another direction: fine
	if _, err := Compile(&Input{Rules: rules}, Options{}); err != nil {
		t.Errorf("stateless outbound after inbound: %v", err)
	}
	p, err := Compile(&Input{Rules: []RuleInput{{Name: "geo", Action: AllowOnly, IPv4: true, Set: set("198.51.100.0/24"), Stateless: true, Where: "p:2"}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) == 0 || !strings.Contains(p.Warnings[0], "replies") {
		t.Errorf("stateless allow-only without ports: warnings %q, want one about replies", p.Warnings)
	}
}
