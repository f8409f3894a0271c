package ban

import (
	"fmt"
	"net/netip"
)

// Policy is what a policy's `bans:` says of bans. The zero Policy
// changes nothing.
type Policy struct {
	// Aggregate6, when 2 or more, bans a /64 once that many addresses of
	// it are banned, in place of them.
	Aggregate6 int `json:"aggregate_v6,omitempty"`
	// Recidive escalates the bans of prefixes banned again.
	Recidive Recidive `json:"recidive,omitzero"`
}

// MaxAggregate6 bounds Policy.Aggregate6.
const MaxAggregate6 = 1 << 16

// Check reports what is wrong with p.
func (p Policy) Check() error {
	if p.Aggregate6 != 0 && (p.Aggregate6 < 2 || p.Aggregate6 > MaxAggregate6) {
		return fmt.Errorf("aggregate_v6 %d: give the number of addresses of one /64 that bans it whole, 2 to %d (0: off)", p.Aggregate6, MaxAggregate6)
	}
	return p.Recidive.Check()
}

// Net64 is the /64 of the IPv6 address ban p (false for anything else).
func Net64(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsSingleIP() || !p.Addr().Is6() || p.Addr().Is4In6() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(p.Addr(), 64).Masked(), true
}
