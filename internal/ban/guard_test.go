package ban

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

func TestGuard(t *testing.T) {
	var b prefix.Builder
	for _, s := range []string{"192.0.2.0/24", "198.51.100.128/25", "2001:db8:1::/48"} {
		b.AddPrefix(netip.MustParsePrefix(s))
	}
	protected, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	g := Guard{
		Protected: protected,
		Own:       []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("::ffff:100.64.0.1")},
	}
	tests := []struct {
		ban  string
		err  error
		name string // what the error must name
	}{
		{ban: "192.0.2.7/32", err: ErrProtected, name: "192.0.2.0/24"},         // inside
		{ban: "192.0.2.128/25", err: ErrProtected, name: "192.0.2.0/24"},       // inside
		{ban: "192.0.2.0/24", err: ErrProtected, name: "192.0.2.0/24"},         // equal
		{ban: "192.0.0.0/16", err: ErrProtected, name: "192.0.2.0/24"},         // covering
		{ban: "198.51.100.0/24", err: ErrProtected, name: "198.51.100.128/25"}, // covering
		{ban: "2001:db8::/32", err: ErrProtected, name: "2001:db8:1::/48"},     // covering, IPv6
		{ban: "2001:db8:1:2::/64", err: ErrProtected, name: "2001:db8:1::/48"}, // inside, IPv6
		{ban: "203.0.113.10/32", err: ErrOwnAddress, name: "203.0.113.10"},     // own address
		{ban: "203.0.113.0/24", err: ErrOwnAddress, name: "203.0.113.10"},      // own address inside a CIDR
		{ban: "fe80::/16", err: ErrOwnAddress, name: "fe80::1%eth0"},           // zone ignored
		{ban: "100.64.0.0/10", err: ErrOwnAddress, name: "::ffff:100.64.0.1"},  // mapped own address
		{ban: "192.0.3.0/24"},    // disjoint, adjacent
		{ban: "198.51.100.0/25"}, // disjoint, sibling
		{ban: "203.0.113.11/32"},
		{ban: "2001:db8:2::/48"},
		{ban: "10.0.0.0/8"},
	}
	for _, tt := range tests {
		t.Run(tt.ban, func(t *testing.T) {
			err := g.Check(netip.MustParsePrefix(tt.ban))
			if tt.err == nil {
				if err != nil {
					t.Fatalf("Check(%s): %v", tt.ban, err)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("Check(%s) = %v, want %v", tt.ban, err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.name) {
				t.Errorf("Check(%s) = %q, does not name %s", tt.ban, err, tt.name)
			}
		})
	}
}

func TestGuardZero(t *testing.T) {
	var g Guard
	if err := g.Check(netip.MustParsePrefix("10.0.0.0/8")); err != nil {
		t.Errorf("zero Guard refused a ban: %v", err)
	}
	if err := g.Check(netip.Prefix{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Check(invalid) = %v, want ErrInvalid", err)
	}
}

// TestGuardTooBroad: the minimum length holds for every ban, not only
// those the CLI parses (fleet bans and CrowdSec decisions come as
// prefixes).
func TestGuardTooBroad(t *testing.T) {
	var g Guard
	for s, want := range map[string]error{
		"128.0.0.0/3": ErrTooBroad, "0.0.0.0/0": ErrTooBroad, "10.0.0.0/7": ErrTooBroad,
		"2000::/3": ErrTooBroad, "2001::/15": ErrTooBroad, "::/0": ErrTooBroad,
		"::ffff:10.0.0.0/104": ErrInvalid,
		"10.0.0.0/8":          nil, "2001::/16": nil, "192.0.2.1/32": nil,
	} {
		if err := g.Check(netip.MustParsePrefix(s)); !errors.Is(err, want) || want == nil && err != nil {
			t.Errorf("Check(%s) = %v, want %v", s, err, want)
		}
	}
}
