package source

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ipfence/ipfence/internal/prefix"
)

// FormatASNCSV is autonomous-system data: "first,last,ASN[,name]" (an
// inclusive range) or "cidr,ASN[,name]" per line, the ASN as a number or
// AS and a number, the name (the organisation) the rest of the line,
// quoted or not; blank lines and # comments are ignored, and so is a
// header line (field names) at the top. Rows of ASN 0 (not routed) are
// skipped. This is the layout of ip-location-db's asn CSVs and of
// IPtoASN's ip2asn (tab-separated there: convert).
const FormatASNCSV = "asn-csv"

const wantASN = `"first,last,ASN[,name]" or "cidr,ASN[,name]"`

// rowFunc parses one row of a CSV-like format.
type rowFunc func(row string) (lo, hi netip.Addr, cc uint16, asn uint32, org string, ok bool, err error)

// countryRow is a rowFunc of a country format's row parser.
func countryRow(parse func(string) (netip.Addr, netip.Addr, uint16, bool, error)) rowFunc {
	return func(row string) (lo, hi netip.Addr, cc uint16, asn uint32, org string, ok bool, err error) {
		lo, hi, cc, ok, err = parse(row)
		return lo, hi, cc, 0, "", ok, err
	}
}

// parseASNRow parses a non-blank, non-comment row of an asn-csv file.
// The second field tells the layouts apart: an address makes it a
// range's last address, anything else the ASN after a prefix.
func parseASNRow(row string) (lo, hi netip.Addr, cc uint16, asn uint32, org string, ok bool, err error) {
	var f [3]string
	n := splitFields(row, ',', f[:])
	fields := 2 // before the ASN
	_, aerr := netip.ParseAddr(f[1])
	if n == 2 && aerr == nil {
		return lo, hi, 0, 0, "", false, errors.New("an address range and no ASN after it")
	}
	if n == 3 && aerr == nil {
		if lo, hi, err = parseRange(f[0], f[1]); err != nil {
			return
		}
	} else {
		if n < 2 {
			return lo, hi, 0, 0, "", false, errors.New("no comma: give an address range or prefix, then the ASN")
		}
		r, nonEmpty, perr := prefix.ParseLine(f[0])
		if perr != nil || !nonEmpty {
			return lo, hi, 0, 0, "", false, fmt.Errorf("%q is neither a prefix nor a range's first address followed by its last", prefix.Clip(f[0]))
		}
		lo, hi, fields = r.From(), r.To(), 1
	}
	// The ASN, then the name: the rest of the row, commas and all.
	rest := row
	for range fields {
		_, rest, _ = strings.Cut(rest, ",")
	}
	a, name, _ := strings.Cut(rest, ",")
	if asn, err = ParseASN(strings.TrimSpace(a)); err != nil {
		return lo, hi, 0, 0, "", false, err
	}
	return lo, hi, noCountry, asn, unquote(strings.TrimSpace(name)), asn != 0, nil
}

// unquote is s without the double quotes of a CSV field ("" is ").
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`)
	}
	return s
}

// isHeader reports whether row is a line of field names: letters,
// digits, '_', ' ' and commas, and its first field no address.
func isHeader(row string) bool {
	first, _, _ := strings.Cut(row, ",")
	if _, err := netip.ParseAddr(strings.TrimSpace(first)); err == nil {
		return false
	}
	if _, err := netip.ParsePrefix(strings.TrimSpace(first)); err == nil {
		return false
	}
	for _, r := range row {
		if r != '_' && r != ',' && r != ' ' && r != '"' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// ParseASN reads an autonomous system number: "15169", "AS15169" or
// "as15169". 0 (no AS) is valid; more than 32 bits is not.
func ParseASN(s string) (uint32, error) {
	t := s
	if len(t) > 2 && strings.EqualFold(t[:2], "AS") {
		t = t[2:]
	}
	n, err := strconv.ParseUint(t, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not an AS number (like AS15169 or 15169, at most %d)", prefix.Clip(s), uint32(math.MaxUint32))
	}
	return uint32(n), nil
}

// asnNames are the organisations of autonomous systems, pointer-free:
// names[i] is text[ends[i-1]:ends[i]], asns sorted.
type asnNames struct {
	asns, ends []uint32
	text       string
}

// packNames packs the names of the parts (the first part naming an ASN
// wins).
func packNames(parts []*part) asnNames {
	all := map[uint32]string{}
	for _, p := range parts {
		for a, n := range p.names {
			if _, ok := all[a]; !ok {
				all[a] = n
			}
		}
	}
	var t asnNames
	t.asns = make([]uint32, 0, len(all))
	for a := range all {
		t.asns = append(t.asns, a)
	}
	slices.Sort(t.asns)
	t.ends = make([]uint32, len(t.asns))
	var b strings.Builder
	for i, a := range t.asns {
		b.WriteString(all[a])
		t.ends[i] = uint32(b.Len())
	}
	t.text = b.String()
	return t
}

// name is the organisation of asn, "" if none is known.
func (t *asnNames) name(asn uint32) string {
	i, ok := slices.BinarySearch(t.asns, asn)
	if !ok {
		return ""
	}
	start := uint32(0)
	if i > 0 {
		start = t.ends[i-1]
	}
	return t.text[start:t.ends[i]]
}

// ErrNotASN is returned by ASNs for a source whose rows carry no
// autonomous systems.
var ErrNotASN = errors.New("not an ASN source")

// IsASN reports whether the rows carry autonomous systems (format
// asn-csv, or an mmdb with ASNs: GeoLite2 ASN, IPinfo lite, DB-IP ASN).
func (s *Source) IsASN() bool { return s.format == FormatASNCSV || s.hasASN }

// ASNs returns the addresses of the given autonomous systems, or with
// invert those of every other AS in the data (not the addresses no row
// mentions). An ASN absent from the data selects nothing.
func (s *Source) ASNs(asns []uint32, invert bool) (*prefix.Set, error) {
	if !s.IsASN() {
		return nil, fmt.Errorf("selecting autonomous systems of source %s: it has format %s and no ASNs: %w", s.name, s.format, ErrNotASN)
	}
	sel := &selector{asns: map[uint32]bool{}, invert: invert}
	for _, a := range asns {
		sel.asns[a] = true
	}
	return s.build(sel), nil
}

// ASName is the organisation the data names for asn ("" if none).
func (s *Source) ASName(asn uint32) string { return s.names.name(asn) }
