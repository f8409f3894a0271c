package prefix

import (
	"bufio"
	"encoding/binary"
	"io"
	"math/big"
	"net/netip"
	"strconv"

	"go4.org/netipx"
)

// WriteCIDRs writes the minimal exact CIDR cover of s, one prefix per
// line, IPv4 before IPv6, each family in address order: "192.0.2.0/24",
// "192.0.2.7/32" (always with the length), "2001:db8::/32" (RFC 5952
// text). For IPv4 this is the output of FireHOL's
// `iprange --print-suffix-ips /32`. A nil s writes nothing. It returns the
// first error writing w.
func WriteCIDRs(w io.Writer, s *Set) error {
	return write(w, s, appendCIDRs, lines)
}

// WriteRanges writes the maximal ranges of s, one per line, IPv4 before
// IPv6, in address order, as "first-last", or just the address for a
// range of one address. A nil s writes nothing. It returns the first
// error writing w.
func WriteRanges(w io.Writer, s *Set) error {
	return write(w, s, appendRange, lines)
}

// WriteJSON writes s as one line of JSON,
// {"ipv4":["192.0.2.0/24",...],"ipv6":[...]}, the entries written as by
// WriteCIDRs, or as by WriteRanges when ranges is true. Both arrays are
// always present. It returns the first error writing w.
func WriteJSON(w io.Writer, s *Set, ranges bool) error {
	f := appendCIDRs
	if ranges {
		f = appendRange
	}
	return write(w, s, f, jsonObject)
}

// WriteJSONArray writes the prefixes WriteCIDRs writes as one JSON array
// of strings, ["192.0.2.0/24","2001:db8::/32"], without a newline: what
// json.Marshal writes of them as a []string, without the list. It
// returns the first error writing w.
func WriteJSONArray(w io.Writer, s *Set) error {
	return write(w, s, appendCIDRs, jsonArray)
}

// WriteJSONString writes the text WriteCIDRs writes as one JSON string,
// "192.0.2.0/24\n2001:db8::/32\n": what json.Marshal writes of that text,
// without the text. It returns the first error writing w.
func WriteJSONString(w io.Writer, s *Set) error {
	return write(w, s, appendCIDRs, jsonString)
}

// frame is how write frames its items.
type frame int

const (
	lines      frame = iota // one a line
	jsonObject              // {"ipv4":[...],"ipv6":[...]}
	jsonArray               // [...]
	jsonString              // "...\n...\n"
)

// write writes the ranges of s, each formatted by f, framed by fr.
func write(w io.Writer, s *Set, f func(b []byte, r span, is4 bool, before, after string) []byte, fr frame) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	before, after := "", "\n"
	switch fr {
	case jsonObject:
		bw.WriteString(`{"ipv4":[`)
	case jsonArray:
		bw.WriteString(`[`)
	case jsonString:
		bw.WriteString(`"`)
		after = `\n`
	}
	if fr == jsonObject || fr == jsonArray {
		before, after = `,"`, `"`
	}
	first := true // no item yet in this JSON array
	var b []byte
	for _, is4 := range []bool{true, false} {
		if fr == jsonObject && !is4 {
			first = true
			bw.WriteString(`],"ipv6":[`)
		}
		s.each(is4, func(r span) {
			b = f(b[:0], r, is4, before, after)
			out := b
			if (fr == jsonObject || fr == jsonArray) && first {
				out, first = b[1:], false // no comma before the first item
			}
			bw.Write(out)
		})
	}
	switch fr {
	case jsonObject:
		bw.WriteString("]}\n")
	case jsonArray:
		bw.WriteString("]")
	case jsonString:
		bw.WriteString(`"`)
	}
	return bw.Flush()
}

// appendCIDRs appends each prefix of the minimal cover of r, between before
// and after.
func appendCIDRs(b []byte, r span, is4 bool, before, after string) []byte {
	forEachCIDR(r.lo, r.hi, widthOf(is4), func(a U128, bits int) {
		b = append(b, before...)
		b = appendAddr(b, a, is4)
		b = append(b, '/')
		b = append(b, decimal[bits]...)
		b = append(b, after...)
	})
	return b
}

// appendRange appends "first-last", or the one address, between before and
// after.
func appendRange(b []byte, r span, is4 bool, before, after string) []byte {
	b = append(b, before...)
	b = appendAddr(b, r.lo, is4)
	if r.lo != r.hi {
		b = append(b, '-')
		b = appendAddr(b, r.hi, is4)
	}
	return append(b, after...)
}

// appendAddr appends the text of a (an IPv4 address when is4).
func appendAddr(b []byte, a U128, is4 bool) []byte {
	if !is4 {
		return a.Addr(128).AppendTo(b)
	}
	v := uint32(a.Lo)
	b = append(b, decimal[v>>24]...)
	b = append(b, '.')
	b = append(b, decimal[v>>16&0xff]...)
	b = append(b, '.')
	b = append(b, decimal[v>>8&0xff]...)
	b = append(b, '.')
	return append(b, decimal[v&0xff]...)
}

// decimal holds the decimal text of 0 to 255, for IPv4 octets and prefix
// lengths.
var decimal = func() (d [256]string) {
	for i := range d {
		d[i] = strconv.Itoa(i)
	}
	return d
}()

// Count returns the number of IPv4 and IPv6 prefixes in the minimal CIDR
// cover of s (what WriteCIDRs writes). A nil s counts as empty.
func Count(s *Set) (v4, v6 int) {
	s.each(true, func(r span) { v4 += countCIDRs(r.lo, r.hi, 32) })
	s.each(false, func(r span) { v6 += countCIDRs(r.lo, r.hi, 128) })
	return v4, v6
}

// CountRange returns the number of prefixes of the minimal CIDR cover of
// r, a valid range.
func CountRange(r netipx.IPRange) int {
	return countCIDRs(U128From(r.From()), U128From(r.To()), widthOf(r.From().Is4()))
}

// widthOf is the bits of an address of the family (is4: IPv4).
func widthOf(is4 bool) int {
	if is4 {
		return 32
	}
	return 128
}

// NumAddrs returns the number of IPv4 and IPv6 addresses in s (up to 2^32
// and 2^128). A nil s counts as empty.
func NumAddrs(s *Set) (v4 uint64, v6 *big.Int) {
	v6 = new(big.Int)
	one := big.NewInt(1)
	var n big.Int
	var b [16]byte
	s.each(true, func(r span) { v4 += r.hi.Lo - r.lo.Lo + 1 })
	s.each(false, func(r span) {
		d := r.hi.Sub(r.lo) // one less than the size, which may be 2^128
		binary.BigEndian.PutUint64(b[:8], d.Hi)
		binary.BigEndian.PutUint64(b[8:], d.Lo)
		v6.Add(v6, n.SetBytes(b[:]))
		v6.Add(v6, one)
	})
	return v4, v6
}

// Complement returns the addresses not in s within the families asked for:
// 0.0.0.0/0 if v4, ::/0 if v6. Addresses of s in a family not asked for
// are ignored, so the result holds nothing of that family. A nil s counts
// as empty.
func Complement(s *Set, v4, v6 bool) *Set {
	s4, s6 := s.lists()
	var c4 []uint64
	var c6 []span
	if v4 {
		c4, _ = collect(true, len(s4)+1, func(fn func(span)) { eachGap(s4, max4, fn) })
	}
	if v6 {
		_, c6 = collect(false, len(s6)+1, func(fn func(span)) { eachGap(s6, max6, fn) })
	}
	return setOfPacked(c4, c6)
}

// Prefixes returns the minimal CIDR cover of s, IPv4 then IPv6, each in
// address order (what WriteCIDRs writes). A nil s has none.
func Prefixes(s *Set) []netip.Prefix {
	n4, n6 := Count(s)
	out := make([]netip.Prefix, 0, n4+n6)
	for _, is4 := range []bool{true, false} {
		width := widthOf(is4)
		s.each(is4, func(r span) {
			forEachCIDR(r.lo, r.hi, width, func(a U128, bits int) {
				out = append(out, netip.PrefixFrom(a.Addr(width), bits))
			})
		})
	}
	return out
}

// Partition calls fn, in address order, with each prefix of the minimal
// CIDR covers of one family (is4) of s and of its complement in that
// family, in saying which: the prefixes tile the family's address space.
func Partition(s *Set, is4 bool, fn func(p netip.Prefix, in bool)) {
	width := widthOf(is4)
	Pieces(s, is4, func(a U128, bits int, in bool, _, _ U128) { fn(netip.PrefixFrom(a.Addr(width), bits), in) })
}

// Pieces calls fn for each prefix of Partition(s, is4), in the same order,
// as its address and length, its side, and the first and last address of
// the run it belongs to: the range of s, or the gap between two, that the
// prefix is part of. It allocates nothing, however many prefixes it
// calls fn for: it reads s's list in place.
func Pieces(s *Set, is4 bool, fn func(a U128, bits int, in bool, runLo, runHi U128)) {
	emit := func(width int) func(sp span, in bool) {
		return func(sp span, in bool) {
			forEachCIDR(sp.lo, sp.hi, width, func(a U128, bits int) { fn(a, bits, in, sp.lo, sp.hi) })
		}
	}
	// The gaps are walked as they come, between the set's runs.
	if v4, v6 := s.lists(); is4 {
		eachRun(v4, max4, emit(32))
	} else {
		eachRun(v6, max6, emit(128))
	}
}
