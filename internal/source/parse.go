package source

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/radixsort"
	"go4.org/netipx"
)

// ParseError reports a row of a country-csv or rir-delegated file that
// cannot be read. (Rows of list files give a *prefix.ParseError.)
type ParseError struct {
	File string // as shown in Match.Origin
	Line int    // 1-based
	Text string // the row, trimmed, at most maxErrText bytes
	Err  error  // why; an *UnknownCountryError for a bad country code
	Want string // what a row of the format looks like
}

const maxErrText = 200

// Error returns `FILE:LINE: cannot parse "TEXT": REASON (expected WANT)`,
// or `FILE:LINE: unknown country code ...` for a bad country code.
func (e *ParseError) Error() string {
	var uc *UnknownCountryError
	if errors.As(e.Err, &uc) {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: cannot parse %q: %v (expected %s)", e.File, e.Line, e.Text, e.Err, e.Want)
}

// Unwrap returns e.Err.
func (e *ParseError) Unwrap() error { return e.Err }

const (
	wantCSV = `"first,last,CC" or "cidr,CC"`
	wantRIR = `"registry|cc|type|start|value|date|status"`
)

// maxLine bounds the length of a line of a country or RIR file, as
// prefix.Read does for lists.
const maxLine = 1 << 20

// gunzip returns r decompressed if it starts with the gzip magic bytes,
// r itself otherwise.
func gunzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(2)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if !bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		return br, nil
	}
	z, err := gzip.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("reading gzip header: %w", err)
	}
	return z, nil
}

// part holds the rows of one input file, in chunks of fixed size so
// that reading never copies them; Source.finish joins the parts into
// sorted tables. Rows that repeat or fall within another row of the same
// country are dropped as the part grows (chunks.compact): a file of
// twenty million copies of one address holds one row. rows4 and rows6
// count every row read, for the entries limit.
type part struct {
	v4           chunks[k4]
	v6           chunks[k6]
	rows4, rows6 int // rows read
	// names are the organisations of the autonomous systems, as the
	// first row of each that names one says, within maxNames and
	// maxNameBytes (nameBytes so far).
	names     map[uint32]string
	nameBytes int
}

// rows is the number of rows read, both families.
func (p *part) rows() int { return p.rows4 + p.rows6 }

const chunkLen = 4096

// compactAt is the fewest new rows a part holds before it drops the
// redundant ones (a variable for tests).
var compactAt = 1 << 16

// chunks is one family's rows: the ones already compacted, sorted
// (done), and the ones read since, in chunks of chunkLen.
type chunks[K key[K]] struct {
	done []entry[K]
	cur  [][]entry[K]
	n    int // rows in cur
}

func (c *chunks[K]) add(lo, hi K, cc uint16, asn uint32, file uint16, line int) {
	k := len(c.cur)
	if k == 0 || len(c.cur[k-1]) == chunkLen {
		c.cur = append(c.cur, make([]entry[K], 0, chunkLen))
		k++
	}
	c.cur[k-1] = append(c.cur[k-1], entry[K]{lo: lo, hi: hi, cc: cc, asn: asn, file: file, line: uint32(line)})
	// Compacting again once as many rows came in as it kept keeps the
	// work at O(n log n) when no row is redundant.
	if c.n++; c.n >= max(compactAt, len(c.done)) {
		c.done = c.compacted()
		c.cur, c.n = nil, 0
	}
}

// compacted is every row of c, sorted and compacted: the rows read since
// the last compaction are sorted on their own and merged with the ones
// it kept.
func (c *chunks[K]) compacted() []entry[K] {
	fresh := make([]entry[K], 0, c.n)
	for _, ch := range c.cur {
		fresh = append(fresh, ch...)
	}
	sortRows(fresh)
	if len(c.done) == 0 {
		return compact(fresh)
	}
	out := make([]entry[K], 0, len(c.done)+len(fresh))
	i, j := 0, 0
	for i < len(c.done) && j < len(fresh) {
		if byFirst(fresh[j], c.done[i]) < 0 {
			out = append(out, fresh[j])
			j++
		} else {
			out = append(out, c.done[i])
			i++
		}
	}
	out = append(append(out, c.done[i:]...), fresh[j:]...)
	return compact(out)
}

// len is the number of rows c holds.
func (c *chunks[K]) len() int { return len(c.done) + c.n }

// byFirst orders rows by first address, widest first, then by where they
// were read.
func byFirst[K key[K]](a, b entry[K]) int {
	if c := a.lo.compare(b.lo); c != 0 {
		return c
	}
	if c := b.hi.compare(a.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.file, b.file); c != 0 {
		return c
	}
	return cmp.Compare(a.line, b.line)
}

// sortRows sorts es by byFirst. IPv4 rows (20 bytes, keys of 32 bits)
// take a radix sort: a tenth of the time of the comparisons for a 400k-row
// feed.
func sortRows[K key[K]](es []entry[K]) {
	if e4, ok := any(es).([]entry[k4]); ok {
		radixsort.Func(e4, 0, func(e *entry[k4]) uint64 { return uint64(e.file)<<32 | uint64(e.line) })
		radixsort.Func(e4, 0, func(e *entry[k4]) uint64 { return uint64(e.lo)<<32 | uint64(^e.hi) })
		return
	}
	slices.SortFunc(es, byFirst)
}

// compact drops from es, sorted by byFirst (by first address, widest
// first, then by where they were read), every row within an earlier row
// of the same country and autonomous system (so of equal rows the first
// read stays, for explain).
func compact[K key[K]](es []entry[K]) []entry[K] {
	// reach[c] is the highest last address of the rows of country slot
	// c (and no ASN) so far; every one of them starts at or before the
	// current row. Rows of an ASN are kept in far (made for the first).
	var reach [numCodes + 1]K
	var seen [numCodes + 1]bool
	var far map[uint64]K
	out := es[:0]
	for _, e := range es {
		c := min(int(e.cc), numCodes)
		if e.asn != 0 {
			if far == nil {
				far = map[uint64]K{}
			}
			k := uint64(c)<<32 | uint64(e.asn)
			if r, ok := far[k]; ok && e.hi.compare(r) <= 0 {
				continue
			}
			far[k] = e.hi
			out = append(out, e)
			continue
		}
		if seen[c] && e.hi.compare(reach[c]) <= 0 {
			continue // within an earlier row
		}
		reach[c], seen[c] = e.hi, true // reaches further than any before
		out = append(out, e)
	}
	if cap(out) > 2*len(out)+64 {
		return slices.Clone(out) // not the whole array for a few rows
	}
	return slices.Clip(out)
}

// add appends one valid range.
func (p *part) add(lo, hi netip.Addr, cc uint16, asn uint32, file uint16, line int) {
	if lo.Is4() {
		p.rows4++
		p.v4.add(k4From(lo), k4From(hi), cc, asn, file, line)
	} else {
		p.rows6++
		p.v6.add(k6From(lo), k6From(hi), cc, asn, file, line)
	}
}

// Bounds of the organisation names a file's rows give (a hostile file
// could give each row an AS and a name of its own): maxOrgName bytes a
// name, and maxNames names and maxNameBytes bytes a file, past which
// names are dropped (the real tables name some 120,000 ASes in about
// 3 MB).
const (
	maxOrgName   = 96
	maxNames     = 250_000
	maxNameBytes = 8 << 20
)

// name records org as asn's organisation unless one is known: printable
// text only, at most maxOrgName bytes, copied (org may be a slice of a
// chunk read).
func (p *part) name(asn uint32, org string) {
	if asn == 0 || org == "" || len(p.names) >= maxNames || p.nameBytes >= maxNameBytes {
		return
	}
	if _, ok := p.names[asn]; ok {
		return
	}
	n := cleanName(org)
	if n == "" {
		return
	}
	if p.names == nil {
		p.names = map[uint32]string{}
	}
	p.names[asn] = n
	p.nameBytes += len(n)
}

// cleanName is org with every control character and invalid byte a
// space, and cut to at most maxOrgName bytes (at a character).
func cleanName(org string) string {
	var b strings.Builder
	for _, r := range org {
		if b.Len()+utf8.RuneLen(r) > maxOrgName {
			break
		}
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = ' '
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// readPart reads one file (gzip or not) of the given format, its rows
// shown as coming from name, file index file, within lim: it fails with
// a *LimitError past lim's bytes (after decompression) or entries, and
// with a *BroadError for a list row broader than lim allows.
func readPart(r io.Reader, format, name string, file uint16, lim limits) (*part, error) {
	r, err := gunzip(r)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	c := &capReader{r: r, left: lim.bytes}
	p, err := readRows(c, format, name, file, lim)
	// Past the limit the scanner may still see the cut-off last line and
	// report it as bad: the limit is the error.
	if c.left < 0 {
		return nil, &LimitError{File: name, What: "bytes after decompression", Limit: lim.bytes, Key: "max_bytes"}
	}
	return p, err
}

// readRows is readPart after decompression.
func readRows(r io.Reader, format, name string, file uint16, lim limits) (*part, error) {
	p := new(part)
	if IsJSONFormat(format) {
		return readJSON(r, format, name, file, lim)
	}
	if format == FormatMMDB {
		return readMMDB(r, name, file, lim)
	}
	tooMany := &LimitError{File: name, What: "entries", Limit: int64(lim.entries), Key: "max_entries"}
	if format == FormatList {
		// Errors name the file already: a *prefix.ParseError, or a read
		// error wrapped as "reading NAME: ...". Past a limit the rest is
		// only scanned (within the byte limit) and the first problem
		// reported.
		var stop error
		err := prefix.Read(r, name, func(rng netipx.IPRange, line int) {
			switch {
			case stop != nil:
			case p.rows() >= lim.entries:
				stop = tooMany
			default:
				if !lim.broad {
					if b, broad := broadest(rng); broad {
						stop = &BroadError{File: name, Line: line, Prefix: b}
						return
					}
				}
				p.add(rng.From(), rng.To(), noCountry, 0, file, line)
			}
		})
		if stop != nil { // the first problem, not a later bad line
			return nil, stop
		}
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	parse, want := countryRow(parseCSVRow), wantCSV
	switch format {
	case FormatRIRDelegated:
		parse, want = countryRow(parseRIRRow), wantRIR
	case FormatASNCSV:
		parse, want = parseASNRow, wantASN
	}
	// Scan chunks of whole lines and convert each chunk to a string once:
	// a string per row would be half a million allocations for the
	// embedded data.
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	sc.Split(scanLines)
	line := 0
	for sc.Scan() {
		chunk := string(sc.Bytes())
		for more := true; more; {
			var row string
			row, chunk, more = strings.Cut(chunk, "\n")
			line++
			if line == 1 {
				row = strings.TrimPrefix(row, "\uFEFF")
			}
			row = strings.TrimSpace(row)
			if row == "" || row[0] == '#' {
				continue
			}
			if line == 1 && format == FormatASNCSV && isHeader(row) {
				continue
			}
			lo, hi, cc, asn, org, ok, err := parse(row)
			if err != nil {
				if len(row) > maxErrText {
					row = row[:maxErrText]
				}
				return nil, &ParseError{File: name, Line: line, Text: row, Err: err, Want: want}
			}
			if ok {
				if p.rows() >= lim.entries {
					return nil, tooMany
				}
				p.add(lo, hi, cc, asn, file, line)
				p.name(asn, org)
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{File: name, Line: line + 1, Text: "…", Err: fmt.Errorf("line longer than %d bytes", maxLine), Want: want}
		}
		return nil, fmt.Errorf("reading %s after line %d: %w", name, line, err)
	}
	return p, nil
}

// scanLines is a bufio.SplitFunc that returns as many whole lines as the
// buffer holds, without the last '\n'.
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// parseCSVRow parses a non-blank, non-comment row of a country CSV file:
// "first,last,CC" or "cidr,CC" (or anything else a list line may hold,
// then a comma and the code). A trailing # comment is allowed.
func parseCSVRow(row string) (lo, hi netip.Addr, cc uint16, ok bool, err error) {
	if i := strings.IndexByte(row, '#'); i >= 0 {
		row = row[:i]
	}
	var f [4]string
	n := splitFields(row, ',', f[:])
	switch n {
	case 3:
		if lo, hi, err = parseRange(f[0], f[1]); err != nil {
			return
		}
	case 2:
		r, nonEmpty, perr := prefix.ParseLine(f[0])
		if perr != nil {
			var pe *prefix.ParseError
			if errors.As(perr, &pe) {
				perr = pe.Err // the row is quoted already
			}
			err = perr
			return
		}
		if !nonEmpty {
			err = errors.New("no address before the comma")
			return
		}
		lo, hi = r.From(), r.To()
	default:
		err = fmt.Errorf("%d comma-separated fields", n)
		if n == len(f) {
			err = errors.New("more than 3 comma-separated fields")
		}
		return
	}
	cc, err = dataCode(f[n-1])
	return lo, hi, cc, err == nil, err
}

// parseRange parses a row's inclusive range, its first and last
// addresses: one family, in order.
func parseRange(first, last string) (lo, hi netip.Addr, err error) {
	if lo, err = parseAddr("first address", first); err != nil {
		return
	}
	if hi, err = parseAddr("last address", last); err != nil {
		return
	}
	if lo.Is4() != hi.Is4() {
		return lo, hi, errors.New("the range mixes IPv4 and IPv6")
	}
	if hi.Less(lo) {
		return lo, hi, fmt.Errorf("the range ends (%v) before it starts (%v)", hi, lo)
	}
	return lo, hi, nil
}

// parseAddr parses one address of a row, without a zone.
func parseAddr(what, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q is not an IP address", what, prefix.Clip(s))
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s %q has an IPv6 zone, which a source cannot use", what, prefix.Clip(s))
	}
	return a.Unmap(), nil // ::ffff:1.2.3.4 is 1.2.3.4, as in lists and bans
}

// dataCode checks a country code of a data row: two letters, either case.
func dataCode(s string) (uint16, error) {
	i, ok := codeIndex(s)
	if !ok {
		return 0, &UnknownCountryError{Code: s, Malformed: true}
	}
	return i, nil
}

// parseRIRRow parses a non-blank, non-comment row of an RIR
// delegated-stats file. The version line, summary lines (cc "*"), asn rows
// and rows neither allocated nor assigned give ok == false.
//
//	2|ripencc|1700000000|...                         version
//	ripencc|*|ipv4|*|80000|summary                   summary
//	ripencc|IT|ipv4|2.32.0.0|1048576|20100715|allocated
//	ripencc|IT|ipv6|2001:760::|32|19990826|allocated|...
func parseRIRRow(row string) (lo, hi netip.Addr, cc uint16, ok bool, err error) {
	var f [7]string
	n := splitFields(row, '|', f[:])
	if isVersion(f[0]) || n >= 2 && f[1] == "*" {
		return // version or summary line
	}
	if n < 7 {
		err = fmt.Errorf("%d '|'-separated fields, need at least 7", n)
		return
	}
	typ, status := strings.ToLower(f[2]), strings.ToLower(f[6])
	switch typ {
	case "asn":
		return
	case "ipv4", "ipv6":
	default:
		err = fmt.Errorf("type %q is not asn, ipv4 or ipv6", prefix.Clip(f[2]))
		return
	}
	switch status {
	case "allocated", "assigned":
	case "available", "reserved":
		return
	default:
		err = fmt.Errorf("status %q is not allocated, assigned, available or reserved", prefix.Clip(f[6]))
		return
	}
	if lo, err = parseAddr("start address", f[3]); err != nil {
		return
	}
	if lo.Is4() != (typ == "ipv4") {
		err = fmt.Errorf("start address %s is not an %s address", lo, typ)
		return
	}
	if typ == "ipv4" {
		count, perr := strconv.ParseUint(f[4], 10, 64)
		last, inRange := k4From(lo).add(count - 1)
		if perr != nil || count == 0 || !inRange {
			err = fmt.Errorf("ipv4 value %q is not an address count from 1 to the end of the address space", prefix.Clip(f[4]))
			return
		}
		hi = last.addr()
	} else {
		bits, perr := strconv.ParseUint(f[4], 10, 8)
		if perr != nil || bits > 128 {
			err = fmt.Errorf("ipv6 value %q is not a prefix length from 0 to 128", prefix.Clip(f[4]))
			return
		}
		p := netip.PrefixFrom(lo, int(bits))
		if p.Masked().Addr() != lo {
			err = fmt.Errorf("start address %s is not the first address of a /%d", lo, bits)
			return
		}
		hi = netipx.RangeOfPrefix(p).To()
	}
	cc, err = dataCode(f[1])
	return lo, hi, cc, err == nil, err
}

// isVersion reports whether s is the first field of a version line: a
// number such as "2" or "2.3".
func isVersion(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return true
}

// splitFields cuts row at sep into at most len(f) trimmed fields (the last
// one keeps the rest of the row) and returns how many it filled.
func splitFields(row string, sep byte, f []string) int {
	n := 0
	for n < len(f) {
		field, rest, more := strings.Cut(row, string(sep))
		f[n] = strings.TrimSpace(field)
		n++
		if !more {
			break
		}
		row = rest
	}
	return n
}
