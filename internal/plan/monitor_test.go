package plan

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

// TestMonitorVerdict: the model skips rules in monitor mode (naming the
// ones that would have stopped the packet) and later rules decide.
func TestMonitorVerdict(t *testing.T) {
	in := &Input{Rules: []RuleInput{
		{Name: "trial", Action: Drop, Monitor: true, IPv4: true, IPv6: true, Set: set("10.0.0.0/8", "2001:db8::/32")},
		{Name: "only", Action: AllowOnly, Otherwise: Reject, Monitor: true, IPv4: true, IPv6: true, Set: set("10.1.0.0/16", "2001:db8:1::/48")},
		{Name: "feed", Action: Reject, IPv4: true, IPv6: true, Set: set("10.1.2.0/24", "10.9.0.0/16")},
	}}
	p, err := Compile(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, verdict, rule string
		monitored          []string
	}{
		{"10.1.2.3", "reject", "feed", []string{"trial"}},         // in only's set: it would pass it
		{"10.9.0.1", "reject", "feed", []string{"trial", "only"}}, // outside only's set
		{"10.1.3.3", "accept", "", []string{"trial"}},
		{"192.0.2.1", "accept", "", []string{"only"}},
		{"2001:db8:1::1", "accept", "", []string{"trial"}},
	} {
		d := p.Verdict(Packet{Src: netip.MustParseAddr(tc.src)})
		if d.Verdict != tc.verdict || d.Rule != tc.rule || !slices.Equal(d.Monitored, tc.monitored) {
			t.Errorf("%s: %+v, want %s by %q, monitored by %v", tc.src, d, tc.verdict, tc.rule, tc.monitored)
		}
	}
	if !p.Rules[0].Monitor || !p.Rules[1].Monitor || p.Rules[2].Monitor {
		t.Errorf("modes %v %v %v", p.Rules[0].Monitor, p.Rules[1].Monitor, p.Rules[2].Monitor)
	}
}

// TestMonitorRefusals: an accept rule cannot monitor, nor can a rule in
// the iptables backends; a monitor rule that asked for XDP runs in
// nftables, with a note.
func TestMonitorRefusals(t *testing.T) {
	r := RuleInput{Name: "a", Action: Accept, Monitor: true, IPv4: true, Set: set("192.0.2.0/24")}
	if _, err := Compile(&Input{Rules: []RuleInput{r}}, Options{}); !errors.Is(err, ErrMonitorAccept) {
		t.Errorf("accept in monitor mode: %v, want ErrMonitorAccept", err)
	}
	r.Action = Drop
	for _, b := range []Backend{IPSet, IPTablesSplit} {
		if _, err := Compile(&Input{Backend: b, Rules: []RuleInput{r}}, Options{}); !errors.Is(err, ErrMonitorBackend) {
			t.Errorf("backend %s: %v, want ErrMonitorBackend", b, err)
		}
	}
	p, err := Compile(&Input{Backend: XDP, Interfaces: []string{"eth0"}, Rules: []RuleInput{r}}, Options{})
	if err != nil || p.Rules[0].Backend != NFTables || p.Rules[0].BackendNote == "" {
		t.Errorf("XDP: %v, %+v; want nftables with a note", err, p)
	}
}
