package nft

import (
	"bufio"
	"encoding/binary"
	"io"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// minHashSize is the smallest "size" a hash set or map is declared with.
// A declared size makes the kernel choose a fixed-size hash (nft_hash, or
// nft_hash_fast for 4-byte keys) instead of the resizable rhash; the size
// is also the most elements the set can hold.
const minHashSize = 16

// hashSize is the "size" of a hash set or map: its element count rounded
// up to a power of two, at least minHashSize; 0 (none) for a set with
// timeouts, which gets the kernel's resizable hash. Render and Apply both
// use it.
//
// The room to grow is for updates: the kernel takes a set's new size only
// when the transaction commits, so an Update cannot add elements beyond
// the size declared before, and Diff has to replace such a set whole. A
// power of two p costs little: the kernel gives a fixed-size hash
// roundup_pow_of_two(size*4/3) buckets, as many as for the element count
// when it is above 3p/4, twice as many (8 bytes each) below.
func hashSize(s *Set) uint32 { return sizeFor(s, s.Elems.Len()) }

// sizeFor is the hashSize of s holding n elements.
func sizeFor(s *Set, n int) uint32 {
	if s.Timeout {
		return 0
	}
	if n <= minHashSize {
		return minHashSize
	}
	return 1 << bits.Len(uint(n-1))
}

// ndpTypes are the ICMPv6 types of neighbour and router discovery that an
// NDP rule accepts, in the order nft lists them.
var ndpTypes = []struct {
	name string
	typ  byte
}{
	{"nd-router-solicit", 133},
	{"nd-router-advert", 134},
	{"nd-neighbor-solicit", 135},
	{"nd-neighbor-advert", 136},
	{"nd-redirect", 137},
}

// Render returns the nft script that loads p: `nft -f` of it replaces
// ipfence's table in one transaction, exactly as Apply does (a test loads
// both ways and compares), the table with ipfence's mark (`comment
// "ipfence"`, see Mark). The script starts with "table inet NAME {}" and
// "delete table inet NAME", so it loads whether or not the table exists:
// unlike Apply, nft does not check that an existing table has the mark.
//
// Output is deterministic: objects and elements come in Program order, one
// element per line. Render does not validate p; an invalid Program (see
// Validate) renders a script that nft rejects or that differs from what
// Apply loads.
func Render(p *Program) string {
	var b strings.Builder
	n := 256
	for _, s := range p.Sets {
		n += 128 + s.Elems.Len()*24
	}
	for _, c := range p.Chains {
		n += 64 + len(c.Rules)*96
	}
	b.Grow(n)
	render(&b, p)
	return b.String()
}

// Write writes Render(p) to w, a buffer at a time: a big table's script
// (30 MB for 690k elements) is never held in memory whole.
func Write(w io.Writer, p *Program) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	render(bw, p)
	return bw.Flush() // a bufio.Writer's first error sticks
}

// textSink is what render writes to: a strings.Builder or a bufio.Writer.
type textSink interface {
	io.Writer
	io.StringWriter
	io.ByteWriter
}

func render(b textSink, p *Program) {
	t := p.Table
	b.WriteString("table inet " + t + " {}\n")
	b.WriteString("delete table inet " + t + "\n")
	b.WriteString("table inet " + t + " {\n\tcomment " + strconv.Quote(Mark) + "\n")
	first := true
	sep := func() {
		if !first {
			b.WriteByte('\n')
		}
		first = false
	}
	for _, s := range p.Sets {
		sep()
		renderSet(b, s)
	}
	for _, c := range p.Chains {
		sep()
		renderChain(b, c)
	}
	b.WriteString("}\n")
}

// appendDuration writes d in nft's time syntax ("1d2h3m4s5ms"), to the
// millisecond (the kernel's unit; less rounds down, but at least 1ms).
func appendDuration(buf []byte, d time.Duration) []byte {
	ms := max(d.Milliseconds(), 1)
	start := len(buf)
	for _, u := range []struct {
		name string
		ms   int64
	}{{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}} {
		if n := ms / u.ms; n > 0 {
			buf = strconv.AppendInt(buf, n, 10)
			buf = append(buf, u.name...)
			ms -= n * u.ms
		}
	}
	if len(buf) == start {
		buf = append(buf, "0s"...)
	}
	return buf
}

// keyType is the "type …" or "typeof …" line of a set's key.
func keyType(s *Set) string {
	switch {
	case s.Key == KeyWords:
		return "typeof " + wordsExpr(s.Family, s.Dst, words(s.KeyBits))
	case s.Key == KeyHalf:
		return "typeof " + halfExpr(s.Dst)
	case s.Family == IPv6:
		return "type ipv6_addr"
	}
	return "type ipv4_addr"
}

// wordsExpr is the raw payload expression of the first n words of the
// source address: "@nh,64,32 . @nh,96,32".
func wordsExpr(f Family, dst bool, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = "@nh," + strconv.Itoa(8*wordsOffset(f, dst)+32*i) + ",32"
	}
	return strings.Join(parts, " . ")
}

// halfExpr is the raw payload expression of a KeyHalf key: the leading
// 16 bits of the IPv4 source (or destination) address.
func halfExpr(dst bool) string {
	return "@nh," + strconv.Itoa(8*wordsOffset(IPv4, dst)) + "," + strconv.Itoa(halfBits)
}

// appendHalf writes a KeyHalf key as nft lists it: the address's leading
// 16 bits in hex.
func appendHalf(buf []byte, k netip.Prefix) []byte {
	a := k.Masked().Addr().As4()
	return strconv.AppendUint(append(buf, "0x"...), uint64(a[0])<<8|uint64(a[1]), 16)
}

// appendWords writes a KeyWords key: its words in hex, joined by " . ".
func appendWords(buf []byte, k netip.Prefix) []byte {
	ws := keyWords(k)
	for i := 0; i < len(ws); i += 4 {
		if i > 0 {
			buf = append(buf, " . "...)
		}
		buf = append(buf, "0x"...)
		buf = strconv.AppendUint(buf, uint64(binary.BigEndian.Uint32(ws[i:])), 16)
	}
	return buf
}

func renderSet(b textSink, s *Set) {
	if s.IsMap {
		b.WriteString("\tmap " + s.Name + " {\n")
		b.WriteString("\t\t" + keyType(s) + " : verdict\n")
	} else {
		b.WriteString("\tset " + s.Name + " {\n")
		b.WriteString("\t\t" + keyType(s) + "\n")
	}
	switch {
	case s.Interval && s.Timeout:
		b.WriteString("\t\tflags interval,timeout\n")
	case s.Interval:
		b.WriteString("\t\tflags interval\n")
	case s.Timeout:
		b.WriteString("\t\tflags timeout\n")
	default:
		b.WriteString("\t\tsize " + strconv.FormatUint(uint64(hashSize(s)), 10) + "\n")
	}
	if s.Timeout {
		b.WriteString("\t\tgc-interval " + strconv.Itoa(int(GCInterval/time.Second)) + "s\n")
	}
	if s.Comment != "" {
		b.WriteString("\t\tcomment \"" + s.Comment + "\"\n")
	}
	if s.Elems.Len() > 0 {
		b.WriteString("\t\telements = {\n")
		var buf []byte
		for i, e := range s.Elems.All() {
			buf = append(buf[:0], "\t\t\t"...)
			k := e.Key.Masked()
			switch {
			case s.Key == KeyWords:
				buf = appendWords(buf, k)
			case s.Key == KeyHalf:
				buf = appendHalf(buf, k)
			case s.Interval && k.Bits() != k.Addr().BitLen():
				buf = k.AppendTo(buf)
			default:
				buf = k.Addr().AppendTo(buf)
			}
			if e.Timeout > 0 {
				buf = append(buf, " timeout "...)
				buf = appendDuration(buf, e.Timeout)
			}
			if s.IsMap {
				buf = append(buf, " : "...)
				buf = appendVerdict(buf, e.Verdict)
			}
			if i < s.Elems.Len()-1 {
				buf = append(buf, ',')
			}
			buf = append(buf, '\n')
			b.Write(buf)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
}

func renderChain(b textSink, c *Chain) {
	b.WriteString("\tchain " + c.Name + " {\n")
	if c.Hook != nil {
		b.WriteString("\t\ttype filter hook " + c.Hook.Num.String() + " priority " +
			strconv.FormatInt(int64(c.Hook.Priority), 10) + "; policy accept;\n")
	}
	var buf []byte
	for i := range c.Rules {
		buf = append(buf[:0], "\t\t"...)
		buf = appendRule(buf, &c.Rules[i])
		buf = append(buf, '\n')
		b.Write(buf)
	}
	b.WriteString("\t}\n")
}

func verdictWord(k VerdictKind) string {
	switch k {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump"
	case Goto:
		return "goto"
	}
	return "continue"
}

func appendVerdict(buf []byte, v Verdict) []byte {
	buf = append(buf, verdictWord(v.Kind)...)
	if v.Kind == Jump || v.Kind == Goto {
		buf = append(buf, ' ')
		buf = append(buf, v.Chain...)
	}
	return buf
}

// appendRule writes a rule's statements in the order of Rule's fields;
// netlink.go emits the same expressions in the same order.
func appendRule(buf []byte, r *Rule) []byte {
	start := len(buf)
	word := func(s string) {
		if len(buf) > start {
			buf = append(buf, ' ')
		}
		buf = append(buf, s...)
	}
	if r.Iif != "" {
		word(`iif "` + r.Iif + `"`)
	}
	if r.Family != FamilyAny && (r.Lookup == nil || r.Lookup.Key != KeyAddress) {
		word("meta nfproto " + r.Family.String())
	}
	if r.Proto != 0 {
		word("meta l4proto " + r.Proto.String())
		if len(r.Ports) > 0 {
			word("th dport " + portsText(canonicalPorts(r.Ports)))
		}
	}
	if r.Known {
		word("ct state established,related")
	}
	if r.NDP {
		names := make([]string, len(ndpTypes))
		for i, t := range ndpTypes {
			names[i] = t.name
		}
		word("meta l4proto ipv6-icmp icmpv6 type { " + strings.Join(names, ", ") + " }")
	}
	if l := r.Lookup; l != nil {
		switch {
		case l.Key == KeyWords:
			bits := effectiveMask(l)
			word(wordsExpr(l.Family, l.Dst, words(bits)))
			if m, ok := lastWordMask(bits); ok {
				word("& 0x" + strconv.FormatUint(uint64(m), 16))
			}
		case l.Key == KeyHalf:
			word(halfExpr(l.Dst))
		case l.Family == IPv6 && l.Dst:
			word("ip6 daddr")
		case l.Family == IPv6:
			word("ip6 saddr")
		case l.Dst:
			word("ip daddr")
		default:
			word("ip saddr")
		}
		if m, ok := lookupMask(l); ok && l.Key == KeyAddress {
			word("& " + m.String())
		}
		if l.IsMap {
			word("vmap @" + l.Set)
		} else {
			word("@" + l.Set)
		}
	}
	if r.Counter {
		word("counter")
	}
	switch r.Reject {
	case RejectTCPReset:
		word("reject with tcp reset")
	case RejectAdminProhibited:
		word("reject with icmpx admin-prohibited")
	}
	if r.Verdict.Kind != Continue {
		word(string(appendVerdict(nil, r.Verdict)))
	}
	if r.Comment != "" {
		word(`comment "` + r.Comment + `"`)
	}
	return buf
}

// lookupMask returns the netmask a lookup applies to the source address,
// and false when it applies none (MaskBits 0 or the full length).
func lookupMask(l *Lookup) (netip.Addr, bool) {
	bits := familyBits(l.Family)
	if l.MaskBits == 0 || l.MaskBits >= bits {
		return netip.Addr{}, false
	}
	m := make([]byte, bits/8)
	for i := range l.MaskBits {
		m[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(m)
	return a, true
}

// wordsOffset is the byte offset of the source address in the network
// header.
// wordsOffset is the byte offset of the source address (or with dst,
// the destination address) in family f's network header.
func wordsOffset(f Family, dst bool) int {
	switch {
	case f == IPv6 && dst:
		return 24
	case f == IPv6:
		return 8
	case dst:
		return 16
	}
	return 12
}

// keyWords is the key of prefix k in a KeyWords set: the leading words of
// its masked address that hold its bits.
func keyWords(k netip.Prefix) []byte {
	return k.Masked().Addr().AsSlice()[:4*words(k.Bits())]
}

// lastWordMask is the mask of the last word of a KeyWords key of bits bits,
// and false when that word is whole.
func lastWordMask(bits int) (uint32, bool) {
	if bits%32 == 0 {
		return 0, false
	}
	return ^uint32(0) << (32 - bits%32), true
}

// canonicalPorts sorts port ranges and merges those that overlap or touch,
// so that nft (which would merge them in an anonymous interval set) and
// Apply see the same elements.
func canonicalPorts(in []PortRange) []PortRange {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// portsText renders canonical port ranges: a single port or range bare
// (nft turns it into comparisons), several in an anonymous set.
func portsText(rs []PortRange) string {
	one := func(r PortRange) string {
		s := strconv.Itoa(int(r.First))
		if r.Last != r.First {
			s += "-" + strconv.Itoa(int(r.Last))
		}
		return s
	}
	if len(rs) == 1 {
		return one(rs[0])
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = one(r)
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}
