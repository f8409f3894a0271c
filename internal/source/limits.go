package source

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/netip"

	"go4.org/netipx"
)

// Defaults of a Spec's input limits. A feed is hostile until it parses:
// these bound what one file or download may cost (time and memory) and
// what a source may block.
const (
	// DefaultMaxBytes bounds one file or download, after decompression:
	// the largest real inputs (RIR delegated-extended files, a 1M-line
	// feed) are tens of MiB.
	DefaultMaxBytes = 256 << 20
	// DefaultMaxEntries bounds a source's rows (addresses, prefixes,
	// ranges), all files together: the bundled country data has 550k,
	// ipfence's range is up to 1M prefixes. Each row costs 16 (IPv4) or
	// 40 (IPv6) bytes while loading.
	DefaultMaxEntries = 2_000_000
	// DefaultMaxGrowth is the growth gate's share: a load may have up to
	// 1 + DefaultMaxGrowth times the prefixes of the last good one.
	DefaultMaxGrowth = 4.0
	// GrowthFloor: a load of at most this many prefixes passes the growth
	// gate whatever it grew by (small feeds grow in steps).
	GrowthFloor = 10_000
	// MinBroadBits4 and MinBroadBits6: a list source may not hold a
	// prefix shorter than these (the minimum of bans) unless
	// Spec.AllowBroad.
	MinBroadBits4 = 8
	MinBroadBits6 = 16
)

// limits are a Spec's input limits, defaults resolved.
type limits struct {
	bytes   int64
	entries int
	broad   bool // list rows may be broader than MinBroadBits4/6
}

func (s Spec) limits() limits {
	l := limits{bytes: s.MaxBytes, entries: s.MaxEntries, broad: s.AllowBroad}
	if l.bytes <= 0 {
		l.bytes = DefaultMaxBytes
	}
	if l.entries <= 0 {
		l.entries = DefaultMaxEntries
	}
	return l
}

// LimitError reports an input over one of its source's limits. The load
// is refused; a URL falls back on its last good copy.
type LimitError struct {
	File  string // as shown in Match.Origin, or "all files" for a source's total
	What  string // "bytes after decompression", "entries"
	Limit int64
	Key   string // the policy key that raises it
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: more than %s %s: refused (raise %s on the source if it is really this large)",
		e.File, thousands(int(e.Limit)), e.What, e.Key)
}

// BroadError reports a row of a list source broader than /8 (IPv4) or
// /16 (IPv6), which the source does not allow.
type BroadError struct {
	File   string
	Line   int
	Prefix netip.Prefix // the broadest prefix of the row's range
}

func (e *BroadError) Error() string {
	min := MinBroadBits4
	if !e.Prefix.Addr().Is4() {
		min = MinBroadBits6
	}
	return fmt.Sprintf("%s:%d: %s is broader than /%d: a feed may not block that much; "+
		"set allow_broad: true on the source if it is meant", e.File, e.Line, e.Prefix, min)
}

// broadest returns the shortest prefix of r's minimal cover and whether
// it is broader than its family's minimum.
func broadest(r netipx.IPRange) (netip.Prefix, bool) {
	min := MinBroadBits4
	if !r.From().Is4() {
		min = MinBroadBits6
	}
	// Cheap test first: a range of at most 2**(bits-min) addresses holds
	// no prefix shorter than /min.
	if !spansMoreThan(r, r.From().BitLen()-min) {
		return netip.Prefix{}, false
	}
	var best netip.Prefix
	for _, p := range r.Prefixes() {
		if !best.IsValid() || p.Bits() < best.Bits() {
			best = p
		}
	}
	return best, best.Bits() < min
}

// spansMoreThan reports whether r holds more than 2**k addresses.
func spansMoreThan(r netipx.IPRange, k int) bool {
	a, b := r.From().As16(), r.To().As16()
	var hi, lo uint64
	var borrow uint64
	lo, borrow = bits.Sub64(be64(b[8:]), be64(a[8:]), 0)
	hi, _ = bits.Sub64(be64(b[:8]), be64(a[:8]), borrow)
	// r holds hi:lo + 1 addresses: more than 2**k iff hi:lo >= 2**k.
	if k >= 64 {
		return hi>>(k-64) != 0
	}
	return hi != 0 || lo>>k != 0
}

func be64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// errTooLarge is what capReader returns past its limit.
var errTooLarge = errors.New("over the limit")

// capReader reads r up to left bytes, then fails with errTooLarge.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errTooLarge
	}
	return n, err
}
