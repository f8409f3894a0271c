// Package source reads the address lists ipfence compiles: plain lists of
// addresses, prefixes and ranges (threat feeds, FireHOL netsets), and
// country data ("first,last,CC" CSV, RIR delegated-stats files). It is the
// first stage of the data path: source → prefix set → plan → backend.
//
// A Loader reads one Spec (files, the embedded country data, and http(s)
// URLs kept in a local cache) into an immutable *Source. A Source keeps
// every row compactly with the file and line it came from, so that it can
// build the set of any selection of countries and explain where an address
// comes from. Loading fails with a typed error naming the file and line of
// bad input; it never returns a partly read source. Two safety nets guard
// feeds that break upstream: a URL whose download fails or does not parse
// falls back to its last cached copy (the Source says it is stale), and a
// load whose prefix count shrank by more than Spec.MaxShrink against the
// last committed load is refused with a *ShrinkError.
//
// Country codes in data are any two letters A–Z, stored upper case.
// Registries' placeholders (ZZ for unknown, EU and AP for regional blocks,
// withdrawn codes such as AN) are kept under their own code: they are in no
// country's set, so Countries(codes, true) — "everything but these
// countries" — includes them, and a query may name them only if the data
// holds them (see Source.Countries).
package source

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/prefix"
	"go4.org/netipx"
)

// Formats of source files. Every format may be gzip-compressed (detected by
// its magic bytes, whatever the file is called).
const (
	// FormatList is one address, prefix or range per line, with # comments
	// (the syntax of package prefix); FireHOL netsets are lists.
	FormatList = "list"
	// FormatCountryCSV is "first,last,CC" (an inclusive range) or "cidr,CC"
	// per line; blank lines and # comments are ignored.
	FormatCountryCSV = "country-csv"
	// FormatRIRDelegated is an RIR delegated-stats file
	// ("registry|cc|type|start|value|date|status[|...]"): allocated and
	// assigned ipv4 and ipv6 rows are read, all else skipped.
	FormatRIRDelegated = "rir-delegated"
)

// BuiltinPrefix starts a path that names a file of the embedded country
// data: "builtin:country-ipv4.csv.gz" or "builtin:country-ipv6.csv.gz"
// (format country-csv).
const BuiltinPrefix = "builtin:"

// Spec is one source as written in the policy.
type Spec struct {
	// Name identifies the source in messages and names its state and cache
	// directories: letters, digits, '.', '_' and '-', not starting with '.'.
	Name   string
	Format string // FormatList, FormatCountryCSV, FormatRIRDelegated or a JSON format (json.go)
	// Paths are files to read, absolute (the policy resolves relative
	// ones), or BuiltinPrefix and the name of an embedded file.
	Paths []string
	// URLs are http(s) addresses, downloaded into the Loader's cache.
	URLs []string
	// Refresh is how often a daemon reads the source again (0: its
	// default; negative: never).
	Refresh time.Duration
	// MaxShrink is the largest share (0.5 = 50%) by which the source's
	// prefix count may fall against the last committed load; a load that
	// shrank more is refused. 0 means DefaultMaxShrink; a negative value
	// turns the check off.
	MaxShrink float64
	// MaxGrowth is the growth gate: the largest share (4 = +400%) by which
	// the prefix count may rise against the last committed load, for
	// loads of more than GrowthFloor prefixes. 0 means DefaultMaxGrowth;
	// a negative value turns the check off.
	MaxGrowth float64
	// MaxBytes bounds each file and download after decompression, and
	// MaxEntries the rows of the source (all files together); 0 means
	// DefaultMaxBytes and DefaultMaxEntries.
	MaxBytes   int64
	MaxEntries int
	// AllowBroad lets a list source hold prefixes broader than /8 (IPv4)
	// or /16 (IPv6), which are refused otherwise. Country data is not
	// checked: registries allocate such blocks.
	AllowBroad bool
	// MinAge is the least time between two downloads of a URL (a
	// publisher's limit, from the catalog): a cached download younger
	// than that is read instead. 0: every load asks (conditionally).
	MinAge time.Duration
	// Services and Regions pick the records of a JSON format that has
	// them (aws-json, google-json; github-meta: services, its lists'
	// names): those of one of the services and one of the regions
	// listed, compared without case; none listed: all.
	Services, Regions []string
	// Labels are what an mmdb's networks are read with: LabelCountry,
	// LabelASN or both (0: whichever the file has). A label asked for
	// that no network has fails the load (a wrong edition downloaded
	// keeps the cached copy), and one not asked for is not read: adjacent
	// networks of a country are then one row, whatever their ASNs.
	Labels Labels
}

// Labels say what a source's rows carry beside their addresses.
type Labels uint8

// The labels of Spec.Labels.
const (
	LabelCountry Labels = 1 << iota
	LabelASN
)

// DefaultMaxShrink is the MaxShrink of a Spec that sets none.
const DefaultMaxShrink = 0.5

// Match says where an address in a source comes from.
type Match struct {
	Range netipx.IPRange // the row's range, as written
	// Origin is "FILE:LINE": the base name for embedded data, the URL for
	// a downloaded file, the path as given otherwise.
	Origin  string
	Country string // upper case; empty for list sources
	// ASN is the row's autonomous system (0: none), Org its
	// organisation as the data names it.
	ASN uint32
	Org string
}

// Source is the loaded content of one Spec. It is immutable and safe for
// concurrent use.
type Source struct {
	name, format string
	files        []string // display names, indexed by entry.file
	v4           table[k4]
	v6           table[k6]
	present      [numCodes]bool // codes that occur in the data
	hasCountry   bool           // some row has a country
	hasASN       bool           // some row has an autonomous system
	names        asnNames       // the organisations of the ASNs
	n4, n6       int            // prefixes of set
	rows4, rows6 int            // rows read (before compact)
	stale        []error        // why cached copies were used
	cached       []cachedCopy   // downloads this source was read from
}

// ErrNotCountry is returned by Countries for a source of format list.
var ErrNotCountry = errors.New("not a country source")

// Name returns the name of the Spec the source was loaded from.
func (s *Source) Name() string { return s.name }

// Format returns the format of the source's files.
func (s *Source) Format() string { return s.format }

// IsCountry reports whether the rows carry country codes (formats
// country-csv and rir-delegated, and an mmdb with countries).
func (s *Source) IsCountry() bool {
	return s.format == FormatCountryCSV || s.format == FormatRIRDelegated || s.format == FormatMMDB && s.hasCountry
}

// Set returns all addresses of the source (for a country source: of every
// country), built from its rows at each call (see finish).
func (s *Source) Set() *prefix.Set { return s.build(nil) }

// Prefixes returns how many prefixes the minimal cover of Set has, per
// family.
func (s *Source) Prefixes() (v4, v6 int) { return s.n4, s.n6 }

// Rows returns how many rows (ranges) were read, per family. Rows that
// repeat or lie within another row of their file and country are read,
// then dropped: Explain shows the row that covers them.
func (s *Source) Rows() (v4, v6 int) { return s.rows4, s.rows6 }

// Stale reports whether the source was read, in whole or in part, from a
// cached copy instead of a fresh download, and why: a failed download
// (*DownloadError), a download that did not parse (*ParseError or
// *prefix.ParseError) or a fresh load refused by the shrink gate
// (*ShrinkError), joined when there are several.
func (s *Source) Stale() (bool, error) {
	return len(s.stale) > 0, errors.Join(s.stale...)
}

// Countries returns the addresses of the given ISO 3166-1 alpha-2 codes
// (either case), or with invert those of every other code in the data.
// Inverting does not complement the address space: addresses that no row
// mentions are in neither set, and an address that rows of two countries
// claim (the data has a few hundred such overlaps) is in both.
//
// A code that is not two letters, or that is neither ISO 3166-1 alpha-2
// (or XK) nor present in the data, gives an *UnknownCountryError; a valid
// code absent from the data selects nothing. A list source gives an error
// wrapping ErrNotCountry.
func (s *Source) Countries(codes []string, invert bool) (*prefix.Set, error) {
	if !s.IsCountry() {
		return nil, fmt.Errorf("selecting countries of source %s: it has format %s and no countries: %w", s.name, s.format, ErrNotCountry)
	}
	var sel [numCodes]bool
	for _, c := range codes {
		i, ok := codeIndex(c)
		if !ok {
			return nil, &UnknownCountryError{Code: c, Malformed: true}
		}
		if !iso3166[i] && !s.present[i] {
			return nil, &UnknownCountryError{Code: c}
		}
		sel[i] = true
	}
	if invert {
		for i := range sel {
			sel[i] = !sel[i]
		}
	}
	return s.build(&selector{cc: &sel}), nil
}

// build returns the union of the rows sel picks (nil: all rows).
func (s *Source) build(sel *selector) *prefix.Set {
	var b prefix.Builder
	if !s.IsCountry() && !s.IsASN() {
		// A list's rows are compacted (none within another): their
		// union has about as many ranges. A country table's rows
		// merge into far fewer, and sel picks some of them.
		b.Grow(s.v4.n, s.v6.n)
	}
	s.v4.addTo(&b, sel)
	s.v6.addTo(&b, sel)
	set, _ := b.Build() // cannot fail: every range added is valid
	return set
}

// Explain returns every row that contains addr, in file order (files in
// the order of the Spec, paths before URLs). An address with a zone is
// looked up without it; an IPv4-mapped IPv6 address is an IPv6 address.
func (s *Source) Explain(addr netip.Addr) []Match {
	if !addr.IsValid() {
		return nil
	}
	addr = addr.WithZone("")
	var out []Match
	if addr.Is4() {
		for _, e := range sortByOrigin(s.v4.containing(k4From(addr), nil)) {
			out = append(out, s.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line))
		}
	} else {
		for _, e := range sortByOrigin(s.v6.containing(k6From(addr), nil)) {
			out = append(out, s.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line))
		}
	}
	return out
}

func sortByOrigin[K key[K]](es []entry[K]) []entry[K] {
	slices.SortFunc(es, func(a, b entry[K]) int {
		if c := cmp.Compare(a.file, b.file); c != 0 {
			return c
		}
		return cmp.Compare(a.line, b.line)
	})
	return es
}

func (s *Source) match(lo, hi netip.Addr, cc uint16, asn uint32, file uint16, line uint32) Match {
	origin := fmt.Sprintf("%s:%d", s.files[file], line)
	if line == 0 {
		origin = s.files[file] // a row of no line (an mmdb network)
	}
	return Match{Range: netipx.IPRangeFrom(lo, hi), Origin: origin, Country: codeString(cc), ASN: asn, Org: s.names.name(asn)}
}

// Codes are the country codes the rows carry, sorted (none for a source
// without country data).
func (s *Source) Codes() []string {
	var out []string
	for i, ok := range s.present {
		if ok {
			out = append(out, codeString(uint16(i)))
		}
	}
	slices.Sort(out)
	return out
}

// String returns a one-line summary, for logs.
func (s *Source) String() string {
	r4, r6 := s.Rows()
	var b strings.Builder
	fmt.Fprintf(&b, "source %s (%s): %d+%d rows, %d+%d prefixes", s.name, s.format, r4, r6, s.n4, s.n6)
	if stale, _ := s.Stale(); stale {
		b.WriteString(", stale")
	}
	return b.String()
}
