package prefix

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"unicode/utf8"

	"go4.org/netipx"
)

// ParseError reports a line that is not an IP address, CIDR prefix or range.
type ParseError struct {
	File string // as given to Read; empty from ParseLine
	Line int    // 1-based; 0 from ParseLine
	Text string // the line without its comment, trimmed, cut at 200 bytes
	Err  error  // why it was rejected
}

// maxErrText bounds ParseError.Text, so that an error about a huge line
// stays readable and small.
const maxErrText = 200

// maxErrToken bounds a field quoted in an error's reason (Clip).
const maxErrToken = 64

// Clip returns s cut to at most 64 bytes (on a UTF-8 boundary) and
// marked "…" when cut: for quoting input in an error, which a hostile
// feed could otherwise make megabytes long.
func Clip(s string) string {
	if len(s) <= maxErrToken {
		return s
	}
	i := maxErrToken
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// Error returns `FILE:LINE: cannot parse "TEXT": REASON (expected an IP
// address, CIDR prefix or first-last range)`, without the FILE:LINE part
// when neither is known.
func (e *ParseError) Error() string {
	where := ""
	switch {
	case e.File != "":
		where = e.File + ":" + strconv.Itoa(e.Line) + ": "
	case e.Line > 0:
		where = "line " + strconv.Itoa(e.Line) + ": "
	}
	return fmt.Sprintf("%scannot parse %q: %v (expected an IP address, CIDR prefix or first-last range)", where, e.Text, e.Err)
}

// Unwrap returns the reason, e.Err.
func (e *ParseError) Unwrap() error { return e.Err }

// text is what the parser reads: ParseLine's string or Read's line buffer.
// Making the parser generic lets Read parse its buffer without copying
// each line into a string.
type text interface{ ~string | ~[]byte }

// ParseLine parses one line of a list (see the package documentation for
// the syntax). A blank or comment-only line gives ok == false and no
// error. Anything else that is not an address, prefix or range gives a
// *ParseError with no File or Line.
func ParseLine(s string) (r netipx.IPRange, ok bool, err error) {
	e, ok, err := parseLine(s)
	if !ok {
		return netipx.IPRange{}, false, err
	}
	return e.ipRange(), true, nil
}

// entry is a parsed line: an inclusive range of one family.
type entry struct {
	span
	is4 bool
}

func (e entry) ipRange() netipx.IPRange {
	if e.is4 {
		return netipx.IPRangeFrom(e.lo.Addr(32), e.hi.Addr(32))
	}
	return netipx.IPRangeFrom(e.lo.Addr(128), e.hi.Addr(128))
}

// parseLine is ParseLine for a string or a []byte, giving an entry.
func parseLine[T text](s T) (entry, bool, error) {
	if e, ok := parseFast4(s); ok {
		return e, true, nil
	}
	return parseAny(s)
}

// parseAny is parseLine without the fast path.
func parseAny[T text](s T) (entry, bool, error) {
	// One pass: cut the comment, note where '-' is.
	end, dash := len(s), -1
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '#' || c == ';' {
			end = i
			break
		}
		if c == '-' && dash < 0 {
			dash = i
		}
	}
	start, end := trimSpace(s, 0, end)
	if start == end {
		return entry{}, false, nil
	}
	line := s[start:end]
	var e entry
	var err error
	if dash < 0 {
		e, err = parseEndpoint(line)
	} else {
		e, err = parseRange(line, dash-start)
	}
	if err != nil {
		t := line
		if len(t) > maxErrText {
			t = t[:maxErrText]
		}
		return entry{}, false, &ParseError{Text: string(t), Err: err}
	}
	return e.unmap(), true, nil
}

// unmap returns e as IPv4 when it lies within the IPv4-mapped addresses
// (::ffff:0:0/96), as bans and explain read them: a packet from 1.2.3.4
// is IPv4, so "::ffff:1.2.3.4" in a list or protect means 1.2.3.4. A
// range reaching outside ::ffff:0:0/96 stays IPv6.
func (e entry) unmap() entry {
	mapped := func(u U128) bool { return u.Hi == 0 && u.Lo>>32 == 0xffff }
	if e.is4 || !mapped(e.lo) || !mapped(e.hi) {
		return e
	}
	return entry{span: span{lo: U128{Lo: e.lo.Lo & 0xffffffff}, hi: U128{Lo: e.hi.Lo & 0xffffffff}}, is4: true}
}

// parseRange parses "A-B" where '-' is at s[dash] and A and B are
// addresses or prefixes: from the first address of A to the last of B.
func parseRange[T text](s T, dash int) (entry, error) {
	i, j := trimSpace(s, 0, dash)
	if i == j {
		return entry{}, errors.New("range has no first address before '-'")
	}
	first, err := parseEndpoint(s[i:j])
	if err != nil {
		return entry{}, err
	}
	i, j = trimSpace(s, dash+1, len(s))
	if i == j {
		return entry{}, errors.New("range has no last address after '-'")
	}
	last, err := parseEndpoint(s[i:j])
	if err != nil {
		return entry{}, err
	}
	if first.is4 != last.is4 {
		return entry{}, errors.New("range mixes IPv4 and IPv6")
	}
	e := entry{span{first.lo, last.hi}, first.is4}
	if e.hi.Less(e.lo) {
		r := entry{span{e.hi, e.lo}, e.is4}.ipRange()
		return entry{}, fmt.Errorf("range ends at %v, before its start %v", r.From(), r.To())
	}
	return e, nil
}

// parseEndpoint parses an address or a prefix (length or IPv4 netmask),
// giving the range it covers.
func parseEndpoint[T text](s T) (entry, error) {
	slash := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			slash = i
			break
		}
	}
	addr := s
	if slash >= 0 {
		addr = s[:slash]
	}
	if v, ok := parse4(addr); ok {
		a := U128{0, uint64(v)}
		if slash < 0 {
			return entry{span{a, a}, true}, nil
		}
		n, err := parseBits4(s[slash+1:])
		if err != nil {
			return entry{}, err
		}
		return entry{prefixSpan(a, n, 32), true}, nil
	}
	a, err := parse6(addr)
	if err != nil {
		return entry{}, err
	}
	if slash < 0 {
		return entry{span{a, a}, false}, nil
	}
	n, err := parseBits(s[slash+1:], 128)
	if err != nil {
		return entry{}, err
	}
	return entry{prefixSpan(a, n, 128), false}, nil
}

// prefixSpan returns the addresses of the network of a with n of width
// bits.
func prefixSpan(a U128, n, width int) span {
	host := max6.Shr(n + 128 - width) // the low width-n bits
	return span{U128{a.Hi &^ host.Hi, a.Lo &^ host.Lo}, U128{a.Hi | host.Hi, a.Lo | host.Lo}}
}

// parseFast4 parses the common IPv4 lines in one pass: "A", "A/N" or
// "A-B" (each side possibly a prefix, spaces allowed around '-'), possibly
// surrounded by white space and followed by a comment. For anything else,
// valid or not, ok is false and parseLine's general path decides; where ok
// is true, both paths agree (FuzzParseLine checks).
func parseFast4[T text](s T) (e entry, ok bool) {
	i := skipSpace(s, 0)
	first, i, ok := scan4(s, i)
	if !ok {
		return entry{}, false
	}
	lo, hi, i, ok := scanBits4(s, first, i)
	if !ok {
		return entry{}, false
	}
	i = skipSpace(s, i)
	if i < len(s) && s[i] == '-' {
		last, j, ok := scan4(s, skipSpace(s, i+1))
		if !ok {
			return entry{}, false
		}
		if _, hi, j, ok = scanBits4(s, last, j); !ok || hi < lo {
			return entry{}, false
		}
		i = skipSpace(s, j)
	}
	if i < len(s) && s[i] != '#' && s[i] != ';' {
		return entry{}, false
	}
	return entry{span{U128{0, uint64(lo)}, U128{0, uint64(hi)}}, true}, true
}

// scan4 parses a dotted quad at s[i:] strictly (four decimal octets 0-255,
// no leading zeros), returning the index after it. It fails if a digit or
// a dot follows.
func scan4[T text](s T, i int) (uint32, int, bool) {
	var ip uint32
	for k := range 4 {
		if k > 0 {
			if i == len(s) || s[i] != '.' {
				return 0, 0, false
			}
			i++
		}
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return 0, 0, false
		}
		v := uint32(s[i] - '0')
		i++
		for n := 0; v != 0 && n < 2 && i < len(s) && '0' <= s[i] && s[i] <= '9'; n++ {
			v = v*10 + uint32(s[i]-'0')
			i++
		}
		if v > 255 || i < len(s) && '0' <= s[i] && s[i] <= '9' {
			return 0, 0, false // too big, too long, or a leading zero
		}
		ip = ip<<8 | v
	}
	if i < len(s) && s[i] == '.' {
		return 0, 0, false
	}
	return ip, i, true
}

// scanBits4 parses an optional "/N" after address a at s[i:], returning
// the range it stands for and the index after it. A netmask is left to
// the general path.
func scanBits4[T text](s T, a uint32, i int) (lo, hi uint32, j int, ok bool) {
	if i == len(s) || s[i] != '/' {
		return a, a, i, true
	}
	j = i + 1
	n := 0
	for j < len(s) && '0' <= s[j] && s[j] <= '9' && j-i <= 2 {
		n = n*10 + int(s[j]-'0')
		j++
	}
	if j == i+1 || j-i == 3 && s[i+1] == '0' || n > 32 || j < len(s) && '0' <= s[j] && s[j] <= '9' {
		return 0, 0, 0, false
	}
	host := uint32(uint64(1)<<(32-n) - 1)
	return a &^ host, a | host, j, true
}

func skipSpace[T text](s T, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// parse4 parses a dotted-quad IPv4 address strictly: four decimal octets
// 0-255, no leading zeros, no sign, nothing else.
func parse4[T text](s T) (uint32, bool) {
	v, i, ok := scan4(s, 0)
	return v, ok && i == len(s)
}

// parse6 parses anything that is not a valid dotted quad: an IPv6 address,
// or else explains what is wrong with the text.
func parse6[T text](s T) (U128, error) {
	isV6 := false
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			isV6 = true
			break
		}
	}
	if !isV6 {
		return U128{}, why4(string(s))
	}
	a, err := netip.ParseAddr(string(s))
	if err != nil || !a.Is6() {
		return U128{}, fmt.Errorf("%q is not an IPv6 address", Clip(string(s)))
	}
	if a.Zone() != "" {
		return U128{}, fmt.Errorf("%q has an IPv6 zone, which a list cannot use", Clip(string(s)))
	}
	return U128From(a), nil
}

// why4 explains why s, which has no ':', is not an IPv4 address.
func why4(s string) error {
	if s == "" {
		return errors.New("no address before '/'")
	}
	dots, letters, leadingZero := 0, false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			dots++
		case '0' <= c && c <= '9':
			if c == '0' && (i == 0 || s[i-1] == '.') && i+1 < len(s) && '0' <= s[i+1] && s[i+1] <= '9' {
				leadingZero = true
			}
		case 'a' <= c|0x20 && c|0x20 <= 'z':
			letters = true
		}
	}
	switch {
	case letters:
		return fmt.Errorf("%q is not an IP address, and hostnames are not resolved", Clip(string(s)))
	case leadingZero && dots == 3:
		return fmt.Errorf("%q has an octet with a leading zero, which some tools read as octal: write it without", Clip(string(s)))
	case dots != 3:
		return fmt.Errorf("%q is not an IP address: IPv4 needs four dotted decimal octets", Clip(string(s)))
	}
	return fmt.Errorf("%q is not an IP address", Clip(string(s)))
}

// parseBits4 parses what follows '/' after an IPv4 address: a prefix
// length or a contiguous dotted netmask.
func parseBits4[T text](s T) (int, error) {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			m, ok := parse4(s)
			if host := ^m; !ok || host&(host+1) != 0 {
				return 0, fmt.Errorf("%q is not an IPv4 netmask of contiguous ones, like 255.255.255.0", Clip(string(s)))
			}
			return bits.OnesCount32(m), nil
		}
	}
	return parseBits(s, 32)
}

// parseBits parses a decimal prefix length between 0 and max.
func parseBits[T text](s T, max int) (int, error) {
	n := 0
	ok := len(s) > 0 && len(s) <= 3 && (s[0] != '0' || len(s) == 1)
	for i := 0; ok && i < len(s); i++ {
		ok = '0' <= s[i] && s[i] <= '9'
		n = n*10 + int(s[i]-'0')
	}
	if !ok || n > max {
		return 0, fmt.Errorf("prefix length %q is not a number from 0 to %d", Clip(string(s)), max)
	}
	return n, nil
}

// trimSpace returns the bounds of s[i:j] without leading and trailing
// white space.
func trimSpace[T text](s T, i, j int) (int, int) {
	for i < j && isSpace(s[i]) {
		i++
	}
	for j > i && isSpace(s[j-1]) {
		j--
	}
	return i, j
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'
}
