package source

import (
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/prefix"
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
	// DefaultMaxJSONBytes is DefaultMaxBytes for the JSON formats, which
	// are read whole: the largest (AWS's ip-ranges.json) is a few MiB.
	DefaultMaxJSONBytes = 32 << 20
	// DefaultMaxEntries bounds a source's rows (addresses, prefixes,
	// ranges), all files together: the bundled country data has 550k,
	// ipfence's range is up to 1M prefixes. Each row costs 20 (IPv4) or
	// 48 (IPv6) bytes while loading.
	DefaultMaxEntries = 2_000_000
	// DefaultMaxGrowth is the growth gate's share: a load may have up to
	// 1 + DefaultMaxGrowth times the prefixes of the last good one.
	DefaultMaxGrowth = 4.0
	// GrowthFloor: a load of at most this many prefixes passes the growth
	// gate whatever it grew by (small feeds grow in steps).
	GrowthFloor = 10_000
)

// limits are a Spec's input limits, defaults resolved, and the records
// it picks of a JSON file.
type limits struct {
	bytes   int64
	entries int
	broad   bool // list rows may be broader than bans may (ban.MinBits)
	pick    pick
	labels  Labels
}

func (s Spec) limits() limits {
	l := limits{bytes: s.MaxBytes, entries: s.MaxEntries, broad: s.AllowBroad, pick: pick{services: s.Services, regions: s.Regions}, labels: s.Labels}
	if l.bytes <= 0 {
		l.bytes = DefaultMaxBytes
		if IsJSONFormat(s.Format) {
			l.bytes = DefaultMaxJSONBytes
		}
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
	return fmt.Sprintf("%s:%d: %s is broader than /%d: a feed may not block that much; "+
		"set allow_broad: true on the source if it is meant", e.File, e.Line, e.Prefix, ban.MinBits(e.Prefix.Addr()))
}

// broadest returns the shortest prefix of r's minimal cover and whether
// it is broader than a ban of its family may be (ban.MinBits).
func broadest(r netipx.IPRange) (netip.Prefix, bool) {
	min := ban.MinBits(r.From())
	// Cheap test first: a range of at most 2**(bits-min) addresses (its
	// last minus its first below 2**(bits-min)) holds no prefix shorter
	// than /min.
	span := prefix.U128From(r.To()).Sub(prefix.U128From(r.From()))
	if span.Shr(r.From().BitLen()-min) == (prefix.U128{}) {
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
