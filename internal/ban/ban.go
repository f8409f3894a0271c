package ban

import (
	"errors"
	"net/netip"
	"time"
)

// Ban is one banned prefix.
type Ban struct {
	Prefix  netip.Prefix `json:"prefix"`           // masked; a single address is /32 or /128
	Expires time.Time    `json:"expires,omitzero"` // zero: permanent
	Created time.Time    `json:"created"`
	Reason  string       `json:"reason,omitempty"`
	Origin  string       `json:"origin,omitempty"` // who banned: "cli", "api", "fail2ban", ...
}

// IsAddr reports whether b bans a single address (/32 or /128).
func (b Ban) IsAddr() bool {
	return b.Prefix.IsValid() && b.Prefix.IsSingleIP()
}

// Live reports whether b is in force at now: permanent, or expiring after
// now. A ban expiring exactly at now is no longer live.
func (b Ban) Live(now time.Time) bool {
	return b.Expires.IsZero() || b.Expires.After(now)
}

// Remaining returns how long b stays in force after now: 0 for a permanent
// ban, > 0 while a temporary ban is live, and ≤ 0 (how long ago it
// expired, negated) once it is not.
func (b Ban) Remaining(now time.Time) time.Duration {
	if b.Expires.IsZero() {
		return 0
	}
	return b.Expires.Sub(now)
}

// Sentinel errors. Functions of this package wrap them with context
// (which prefix, why, what to do); match them with errors.Is.
var (
	// ErrInvalid: not an IP address or CIDR prefix, or a stored ban that
	// cannot be read.
	ErrInvalid = errors.New("invalid ban target")
	// ErrTooBroad: a prefix shorter than /8 (IPv4) or /16 (IPv6).
	ErrTooBroad = errors.New("prefix too broad to ban")
	// ErrProtected: the ban overlaps a protected network.
	ErrProtected = errors.New("overlaps a protected network")
	// ErrOwnAddress: the ban covers one of this host's addresses.
	ErrOwnAddress = errors.New("covers this host's own address")
	// ErrTTL: a ban duration that cannot be parsed or is out of
	// [MinTTL, MaxTTL].
	ErrTTL = errors.New("invalid ban duration")
	// ErrLocked: another process holds the ban store.
	ErrLocked = errors.New("ban store locked by another process")
)

// Outlasts reports whether b stays in force at least as long as o
// (permanent outlasts everything).
func (b Ban) Outlasts(o Ban) bool {
	return later(b.Expires, o.Expires).Equal(b.Expires)
}

// later returns the later of two expiries, where zero (permanent) is the
// latest of all.
func later(a, b time.Time) time.Time {
	if a.IsZero() || b.IsZero() {
		return time.Time{}
	}
	if a.After(b) {
		return a
	}
	return b
}

// comparePrefix orders prefixes IPv4 first, then by address, then by
// length (shorter first), so that a prefix comes right before the
// prefixes it contains. (netip.Prefix.Compare and netipx.ComparePrefix
// order by length before address.)
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
