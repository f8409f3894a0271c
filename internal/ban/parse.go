package ban

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Narrowest allowed minimum lengths: a ban shorter than these would block
// a sizeable part of the Internet and is almost certainly a typo.
const (
	MinBits4 = 8  // IPv4 bans are /8 or longer
	MinBits6 = 16 // IPv6 bans are /16 or longer
)

// maxPrefixLen bounds the text of an address or CIDR: the longest,
// "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128", has 49 bytes, and
// a zone makes no valid ban. Longer input is refused before netip quotes
// it whole in its errors.
const maxPrefixLen = 64

// maxQuoted bounds how much of the user's input an error quotes.
const maxQuoted = 100

// quote returns s quoted for an error message, cut at maxQuoted bytes.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// ParsePrefix parses an address ("203.0.113.5", "2001:db8::1") or CIDR
// ("203.0.113.0/24"), surrounding spaces allowed, and returns the masked
// prefix: /32 or /128 for an address, the network for a CIDR with host
// bits set (203.0.113.7/24 is 203.0.113.0/24). IPv4-mapped IPv6
// (::ffff:203.0.113.5, ::ffff:203.0.113.0/120) is turned into IPv4.
//
// It fails with an error wrapping ErrInvalid for anything else (hostnames,
// IPv6 zones as in fe80::1%eth0, IPv4-mapped prefixes shorter than /96),
// and ErrTooBroad for IPv4 shorter than /8 or IPv6 shorter than /16
// (/0 included).
func ParsePrefix(s string) (netip.Prefix, error) {
	t := strings.TrimSpace(s)
	if len(t) > maxPrefixLen {
		return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: %d bytes is too long for an address or CIDR", quote(s), ErrInvalid, len(t))
	}
	var p netip.Prefix
	if strings.Contains(t, "/") {
		var err error
		if p, err = netip.ParsePrefix(t); err != nil {
			return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: %v (expected an address like 203.0.113.5 or a CIDR like 203.0.113.0/24)", quote(s), ErrInvalid, err)
		}
	} else {
		a, err := netip.ParseAddr(t)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: %v (expected an address like 203.0.113.5 or a CIDR like 203.0.113.0/24)", quote(s), ErrInvalid, err)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: an IPv6 zone names a local interface, not a remote host (drop %q)", quote(s), ErrInvalid, "%"+a.Zone())
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: an IPv4-mapped prefix shorter than /96 mixes IPv4 and IPv6 (write the IPv4 prefix instead)", quote(s), ErrInvalid)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	p = p.Masked()
	if min := MinBits(p.Addr()); p.Bits() < min {
		return netip.Prefix{}, fmt.Errorf("parsing ban target %s: %w: /%d is shorter than the /%d allowed for %s (ban narrower prefixes)", quote(s), ErrTooBroad, p.Bits(), min, family(p.Addr()))
	}
	return p, nil
}

// MinBits is the shortest prefix length a ban of a's family may have
// (MinBits4 or MinBits6); sources use it for their broad-prefix check.
func MinBits(a netip.Addr) int {
	if a.Is4() {
		return MinBits4
	}
	return MinBits6
}

// family names a's address family for messages.
func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// Bounds of a temporary ban's duration (ParseTTL).
const (
	MinTTL = time.Second
	MaxTTL = 366 * 24 * time.Hour
)

// Units ParseTTL accepts: those of time.ParseDuration, plus d and w.
const (
	day  = 24 * time.Hour
	week = 7 * day
)

var units = map[string]time.Duration{
	"ns": time.Nanosecond,
	"us": time.Microsecond,
	"µs": time.Microsecond, // U+00B5
	"μs": time.Microsecond, // U+03BC
	"ms": time.Millisecond,
	"s":  time.Second,
	"m":  time.Minute,
	"h":  time.Hour,
	"d":  day,
	"w":  week,
}

// ParseTTL parses a ban duration: a Go duration ("90s", "15m", "1h30m")
// whose units may also be d (24h) and w (7d), as in "7d", "2w" or "1d12h";
// surrounding spaces are allowed. "" and "0" mean permanent and return 0.
//
// Every failure wraps ErrTTL: text that is not such a duration, a negative
// one, or one out of [MinTTL, MaxTTL] (including "0s": write "0" or
// nothing for a permanent ban).
func ParseTTL(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "" || t == "0" {
		return 0, nil
	}
	d, err := parseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("parsing ban duration %s: %w: %v (expected e.g. 90s, 15m, 1h30m, 7d or 2w; 0 for permanent)", quote(s), ErrTTL, err)
	}
	if d < MinTTL || d > MaxTTL {
		return 0, fmt.Errorf("parsing ban duration %s: %w: out of range [%v, %v] (0 or nothing bans for good)", quote(s), ErrTTL, MinTTL, fmtDays(MaxTTL))
	}
	return d, nil
}

// ClampTTL is ParseTTL, but a duration above MaxTTL is MaxTTL, with
// clamped true, instead of an error: for integrations whose ban times
// have no ceiling (fail2ban's recidive jail, bantime.increment).
func ClampTTL(s string) (d time.Duration, clamped bool, err error) {
	t := strings.TrimSpace(s)
	if t == "" || t == "0" {
		return 0, false, nil
	}
	if d, err = parseDuration(t); err == nil && d > MaxTTL {
		return MaxTTL, true, nil
	}
	d, err = ParseTTL(s)
	return d, false, err
}

// fmtDays prints a whole number of days as "366d".
func fmtDays(d time.Duration) string {
	return strconv.FormatInt(int64(d/day), 10) + "d"
}

// parseDuration is time.ParseDuration plus units d and w, without a sign.
// It reads the text as a sequence of number+unit terms and returns as soon
// as the sum exceeds MaxTTL (so that nothing overflows; the caller rejects
// it).
func parseDuration(s string) (time.Duration, error) {
	var total time.Duration
	for rest := s; rest != ""; {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("expected a number at %s", quote(rest))
		}
		j := i
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') && rest[j] != '.' {
			j++
		}
		num, unit := rest[:i], rest[i:j]
		rest = rest[j:]
		u, ok := units[unit]
		if !ok {
			if unit == "" {
				return 0, fmt.Errorf("missing unit after %s", num)
			}
			return 0, fmt.Errorf("unknown unit %s (units are ns, us, ms, s, m, h, d, w)", quote(unit))
		}
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0, fmt.Errorf("bad number %s", quote(num))
		}
		if f*float64(u) > float64(MaxTTL) {
			return MaxTTL + 1, nil
		}
		// d and w by multiplication; Go's own units exactly as
		// time.ParseDuration reads them, without float rounding.
		var d time.Duration
		if unit == "d" || unit == "w" {
			d = time.Duration(f * float64(u))
		} else if d, err = time.ParseDuration(num + unit); err != nil {
			return 0, fmt.Errorf("bad term %s", quote(num+unit))
		}
		if total += d; total > MaxTTL {
			return total, nil
		}
	}
	return total, nil
}
