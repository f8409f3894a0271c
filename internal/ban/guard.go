package ban

import (
	"fmt"
	"net/netip"

	"github.com/ipfence/ipfence/internal/prefix"
	"go4.org/netipx"
)

// Guard refuses bans that would block what must never be blocked: this
// host's own addresses and protected networks (management, monitoring,
// upstream resolvers...), and prefixes broader than /8 (IPv4) or /16
// (IPv6), whatever their origin (CLI, API, CrowdSec, fleet). The zero
// value refuses nothing else.
type Guard struct {
	Protected *prefix.Set  // nil: nothing
	Own       []netip.Addr // this host's addresses
}

// Check returns nil if banning p is allowed. Otherwise it returns an error
// wrapping ErrOwnAddress, naming the first of g.Own that p covers, or
// ErrProtected, naming the first protected prefix (of the minimal prefixes
// of g.Protected) that p overlaps, whether inside p or covering it. Own
// addresses are checked first. An invalid p (or an IPv4-mapped one) is
// ErrInvalid, one broader than /8 or /16 ErrTooBroad.
//
// Own addresses are compared without their IPv6 zone and with IPv4-mapped
// IPv6 addresses unmapped, as ParsePrefix gives bans.
func (g Guard) Check(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("checking ban %v: %w: not a valid prefix", p, ErrInvalid)
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return fmt.Errorf("checking ban %v: %w: an IPv4-mapped or zoned prefix (ban the IPv4 prefix)", p, ErrInvalid)
	}
	p = p.Masked()
	if min := MinBits(p.Addr()); p.Bits() < min {
		return fmt.Errorf("checking ban %v: %w: /%d is shorter than the /%d allowed for %s", p, ErrTooBroad, p.Bits(), min, family(p.Addr()))
	}
	for _, a := range g.Own {
		if p.Contains(a.WithZone("").Unmap()) {
			return fmt.Errorf("checking ban %v: %w %v (banning it would cut this host off; ban a narrower prefix)", p, ErrOwnAddress, a)
		}
	}
	if g.Protected == nil {
		return nil
	}
	// A single address: a binary search (OverlapsPrefix walks every
	// protected range), for bulk bans of millions.
	if p.IsSingleIP() && !g.Protected.Contains(p.Addr()) || !p.IsSingleIP() && !g.Protected.OverlapsPrefix(p) {
		return nil
	}
	r := netipx.RangeOfPrefix(p)
	for _, pr := range g.Protected.Ranges() {
		if !pr.Overlaps(r) {
			continue
		}
		for _, q := range pr.Prefixes() {
			if q.Overlaps(p) {
				return fmt.Errorf("checking ban %v: %w %v (ban a prefix outside it, or remove it from the protected list)", p, ErrProtected, q)
			}
		}
	}
	// Unreachable: OverlapsPrefix said some range overlaps.
	return fmt.Errorf("checking ban %v: %w", p, ErrProtected)
}
