package nft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"
)

// Programs shared by the pure tests (golden files) and the kernel tests
// (differential, listing).

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// shapesProgram uses every rule shape documented on Rule, and every kind
// of set: hash maps and sets of both families, interval sets with adjacent
// and open-ended ranges, an empty set, comments.
func shapesProgram() *Program {
	return &Program{
		Table: "ipfence",
		Sets: []*Set{
			{Name: "v4_16", Family: IPv4, KeyBits: 16, IsMap: true, Comment: "blocklist v4 by /16", Elems: ElemsOf(
				Elem{Key: pfx("10.1.0.0/16"), Verdict: Verdict{Kind: Drop}},
				Elem{Key: pfx("10.2.0.0/16"), Verdict: Verdict{Kind: Jump, Chain: "v4_10_2"}},
				Elem{Key: pfx("192.168.0.0/16"), Verdict: Verdict{Kind: Accept}},
				Elem{Key: pfx("172.16.0.0/16"), Verdict: Verdict{Kind: Goto, Chain: "v4_10_2"}},
				Elem{Key: pfx("172.17.0.0/16"), Verdict: Verdict{Kind: Return}},
			)},
			{Name: "v4_10_2_24", Family: IPv4, KeyBits: 24, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("10.2.3.0/24"), Verdict: Verdict{Kind: Drop}},
				Elem{Key: pfx("10.2.4.0/24"), Verdict: Verdict{Kind: Drop}},
			)},
			{Name: "v6_32", Family: IPv6, KeyBits: 32, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8::/32"), Verdict: Verdict{Kind: Drop}},
				Elem{Key: pfx("2001:db9::/32"), Verdict: Verdict{Kind: Jump, Chain: "v6_2001_db9"}},
			)},
			{Name: "v6_2001_db9_48", Family: IPv6, KeyBits: 48, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db9:1::/48"), Verdict: Verdict{Kind: Drop}},
			)},
			{Name: "host4", Family: IPv4, KeyBits: 32, Elems: ElemsOf(
				Elem{Key: pfx("198.51.100.7/32")},
				Elem{Key: pfx("198.51.100.9/32")},
			)},
			{Name: "allow4", Family: IPv4, Interval: true, Comment: "allowlist", Elems: ElemsOf(
				Elem{Key: pfx("203.0.113.0/25")},
				Elem{Key: pfx("203.0.113.128/25")}, // adjacent to the one before
				Elem{Key: pfx("192.0.2.1/32")},
				Elem{Key: pfx("255.255.255.0/24")}, // runs to the last address
			)},
			{Name: "allow6", Family: IPv6, Interval: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:ffff::/48")},
				Elem{Key: pfx("fe80::1/128")},
			)},
			{Name: "empty6", Family: IPv6, Interval: true},
			{Name: "w6_24", Family: IPv6, KeyBits: 24, Key: KeyWords, IsMap: true, Comment: "one word", Elems: ElemsOf(
				Elem{Key: pfx("2001:d00::/24"), Verdict: Verdict{Kind: Goto, Chain: "w6_2001_db8"}},
				Elem{Key: pfx("2a00::/24"), Verdict: Verdict{Kind: Drop}},
			)},
			{Name: "w6_2001_db8_40", Family: IPv6, KeyBits: 40, Key: KeyWords, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:100::/40"), Verdict: Verdict{Kind: Drop}},
				Elem{Key: pfx("2001:db8:ff00::/40"), Verdict: Verdict{Kind: Goto, Chain: "w6_deep"}},
			)},
			{Name: "w6_72", Family: IPv6, KeyBits: 72, Key: KeyWords, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:ff00:1:ff00::/72"), Verdict: Verdict{Kind: Accept}},
			)},
			{Name: "w6_128", Family: IPv6, KeyBits: 128, Key: KeyWords, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:ff00:1:ff00::1/128")},
			)},
			{Name: "ban4", Family: IPv4, KeyBits: 32, Timeout: true, Comment: "bans", Elems: ElemsOf(
				Elem{Key: pfx("198.51.100.20/32"), Timeout: time.Hour},
				Elem{Key: pfx("198.51.100.21/32")},
				Elem{Key: pfx("198.51.100.22/32"), Timeout: 90 * time.Second},
			)},
			{Name: "bannet6", Family: IPv6, Interval: true, Timeout: true, Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:aa::/48"), Timeout: 2 * time.Hour},
				Elem{Key: pfx("2001:db8:ab::/48"), Timeout: 3*24*time.Hour + 90*time.Second}, // adjacent to the one before
				Elem{Key: pfx("2001:db8:b0::/44")},
			)},
			{Name: "bannet4_empty", Family: IPv4, Interval: true, Timeout: true},
			{Name: "half4", Family: IPv4, KeyBits: 16, Key: KeyHalf, Comment: "bitmap", Elems: ElemsOf(
				Elem{Key: pfx("10.3.0.0/16")},
				Elem{Key: pfx("172.31.0.0/16")},
			)},
		},
		Chains: []*Chain{
			{Name: "v4_10_2", Rules: []Rule{
				{Lookup: &Lookup{Family: IPv4, MaskBits: 24, Set: "v4_10_2_24", IsMap: true}},
			}},
			{Name: "v6_2001_db9", Rules: []Rule{
				{Lookup: &Lookup{Family: IPv6, MaskBits: 48, Set: "v6_2001_db9_48", IsMap: true}},
			}},
			{Name: "blocked", Rules: []Rule{
				{Proto: ProtoTCP, Counter: true, Reject: RejectTCPReset, Comment: "blocked tcp"},
				{Counter: true, Reject: RejectAdminProhibited},
			}},
			{Name: "services", Rules: []Rule{
				{Proto: ProtoUDP, Ports: []PortRange{{53, 53}}, Verdict: Verdict{Kind: Accept}},
				{Proto: ProtoTCP, Ports: []PortRange{{1000, 2000}}, Verdict: Verdict{Kind: Accept}},
				{Proto: ProtoTCP, Ports: []PortRange{{23, 23}, {22, 22}}, Verdict: Verdict{Kind: Accept}}, // merges to 22-23
				{Proto: ProtoUDP, Ports: []PortRange{{500, 500}, {4500, 4500}}, Verdict: Verdict{Kind: Accept}},
				{Proto: ProtoTCP, Ports: []PortRange{{8000, 65535}, {443, 443}}, Verdict: Verdict{Kind: Accept}},
				{Verdict: Verdict{Kind: Return}},
			}},
			{Name: "pre", Hook: &Hook{Priority: -300}, Rules: []Rule{
				{Iif: "lo", Verdict: Verdict{Kind: Accept}, Comment: "loopback"},
				{NDP: true, Verdict: Verdict{Kind: Accept}},
				{Family: IPv4, Proto: ProtoTCP, Ports: []PortRange{{22, 22}, {80, 90}}, Verdict: Verdict{Kind: Jump, Chain: "services"}},
				{Family: IPv6, Proto: ProtoUDP, Ports: []PortRange{{53, 53}}, Verdict: Verdict{Kind: Jump, Chain: "services"}},
				{Lookup: &Lookup{Family: IPv4, Set: "allow4"}, Verdict: Verdict{Kind: Accept}},
				{Lookup: &Lookup{Family: IPv6, MaskBits: 128, Set: "allow6"}, Verdict: Verdict{Kind: Accept}},
				{Lookup: &Lookup{Family: IPv4, MaskBits: 32, Set: "host4"}, Counter: true, Verdict: Verdict{Kind: Drop}},
				{Lookup: &Lookup{Family: IPv4, MaskBits: 16, Set: "v4_16", IsMap: true}, Comment: "v4 blocklist"},
				{Family: IPv4, Lookup: &Lookup{Family: IPv4, MaskBits: 16, Key: KeyHalf, Set: "half4"}, Counter: true, Verdict: Verdict{Kind: Drop}},
				{Lookup: &Lookup{Family: IPv6, MaskBits: 32, Set: "v6_32", IsMap: true}},
				{Family: IPv6, Lookup: &Lookup{Family: IPv6, MaskBits: 24, Key: KeyWords, Set: "w6_24", IsMap: true}},
				{Lookup: &Lookup{Family: IPv4, Set: "ban4"}, Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
				{Lookup: &Lookup{Family: IPv6, Set: "bannet6"}, Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
				{Lookup: &Lookup{Family: IPv4, Set: "bannet4_empty"}, Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
				{Lookup: &Lookup{Family: IPv6, Set: "empty6"}, Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
				{Family: IPv6, Counter: true, Verdict: Verdict{Kind: Drop}},
				{Counter: true, Verdict: Verdict{Kind: Accept}},
			}},
			{Name: "w6_2001_db8", Rules: []Rule{
				{Lookup: &Lookup{Family: IPv6, MaskBits: 40, Key: KeyWords, Set: "w6_2001_db8_40", IsMap: true}},
			}},
			{Name: "w6_deep", Rules: []Rule{
				{Lookup: &Lookup{Family: IPv6, Key: KeyWords, Set: "w6_128"}, Counter: true, Verdict: Verdict{Kind: Drop}},
				{Lookup: &Lookup{Family: IPv6, MaskBits: 72, Key: KeyWords, Set: "w6_72", IsMap: true}},
			}},
		},
	}
}

// minimalProgram is a table with one base chain and no sets.
func minimalProgram() *Program {
	return &Program{
		Table: "ipfence",
		Chains: []*Chain{
			{Name: "pre", Hook: &Hook{Priority: -300}, Rules: []Rule{
				{Counter: true, Verdict: Verdict{Kind: Accept}, Comment: "all"},
			}},
		},
	}
}

// generatedProgram builds a two-level layout like the planner's: a v4 map
// keyed on /8 jumping to one chain per /8, each looking up a /16 or /24 map
// of its own; the same for v6 with /32 then /48; plus an interval
// allowlist per family. perV4 and perV6 elements go in each second-level
// map; the program has about chains*(per+1) elements.
func generatedProgram(seed uint64, chains, perV4, perV6 int) *Program {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &Program{Table: "ipfence"}
	top4 := &Set{Name: "v4_8", Family: IPv4, KeyBits: 8, IsMap: true}
	top6 := &Set{Name: "v6_16", Family: IPv6, KeyBits: 16, IsMap: true}
	p.Sets = append(p.Sets, top4, top6)
	pre := &Chain{Name: "pre", Hook: &Hook{Priority: -300}, Rules: []Rule{
		{Iif: "lo", Verdict: Verdict{Kind: Accept}},
		{NDP: true, Verdict: Verdict{Kind: Accept}},
		{Lookup: &Lookup{Family: IPv4, Set: "allow4"}, Verdict: Verdict{Kind: Accept}},
		{Lookup: &Lookup{Family: IPv6, Set: "allow6"}, Verdict: Verdict{Kind: Accept}},
		{Lookup: &Lookup{Family: IPv4, MaskBits: 8, Set: "v4_8", IsMap: true}},
		{Lookup: &Lookup{Family: IPv6, MaskBits: 16, Set: "v6_16", IsMap: true}},
	}}
	blocked := &Chain{Name: "blocked", Rules: []Rule{
		{Proto: ProtoTCP, Counter: true, Reject: RejectTCPReset},
		{Counter: true, Reject: RejectAdminProhibited},
	}}
	var sub []*Chain
	verdict := func() Verdict {
		switch rng.IntN(8) {
		case 0:
			return Verdict{Kind: Goto, Chain: "blocked"}
		case 1:
			return Verdict{Kind: Accept}
		}
		return Verdict{Kind: Drop}
	}
	for i := range chains {
		if i%2 == 0 { // v4: /8 number i/2 (mod 224), second level /16 or /24
			o1 := (i/2)%223 + 1
			bits := 16
			if i%4 == 0 {
				bits = 24
			}
			name := fmt.Sprintf("v4_%d_%d", o1, i)
			m := &Set{Name: name + "_m", Family: IPv4, KeyBits: bits, IsMap: true}
			n := perV4
			if bits == 16 {
				n = min(n, 256) // there are only 256 /16s in a /8
			}
			seen := map[netip.Prefix]bool{}
			for m.Elems.Len() < n {
				a := netip.AddrFrom4([4]byte{byte(o1), byte(rng.IntN(256)), byte(rng.IntN(256)), 0})
				k := netip.PrefixFrom(a, bits).Masked()
				if !seen[k] {
					seen[k] = true
					m.Elems.Append(Elem{Key: k, Verdict: verdict()})
				}
			}
			p.Sets = append(p.Sets, m)
			if i/2 < 223 {
				top4.Elems.Append(Elem{
					Key:     netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(o1)}), 8),
					Verdict: Verdict{Kind: Jump, Chain: name},
				})
			}
			sub = append(sub, &Chain{Name: name, Rules: []Rule{
				{Lookup: &Lookup{Family: IPv4, MaskBits: bits, Set: m.Name, IsMap: true}},
			}})
			continue
		}
		// v6: /16 number i, second level /32 or /48
		var a16 [16]byte
		a16[0], a16[1] = 0x20, byte(i)
		a16[0] += byte(i >> 8)
		bits := 32
		if i%4 == 1 {
			bits = 48
		}
		name := fmt.Sprintf("v6_%x_%d", uint16(a16[0])<<8|uint16(a16[1]), i)
		key := KeyAddress
		if i%2 == 1 {
			key = KeyWords
		}
		m := &Set{Name: name + "_m", Family: IPv6, KeyBits: bits, Key: key, IsMap: true}
		seen := map[netip.Prefix]bool{}
		for m.Elems.Len() < perV6 {
			a := a16
			a[2], a[3], a[4], a[5] = byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))
			k := netip.PrefixFrom(netip.AddrFrom16(a), bits).Masked()
			if !seen[k] {
				seen[k] = true
				m.Elems.Append(Elem{Key: k, Verdict: verdict()})
			}
		}
		p.Sets = append(p.Sets, m)
		top6.Elems.Append(Elem{
			Key:     netip.PrefixFrom(netip.AddrFrom16(a16), 16),
			Verdict: Verdict{Kind: Jump, Chain: name},
		})
		sub = append(sub, &Chain{Name: name, Rules: []Rule{
			{Lookup: &Lookup{Family: IPv6, MaskBits: bits, Key: key, Set: m.Name, IsMap: true}},
		}})
	}
	allow4 := &Set{Name: "allow4", Family: IPv4, Interval: true}
	for i := range 64 {
		allow4.Elems.Append(Elem{Key: netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, byte(i), 0}), 24+i%9)})
	}
	allow6 := &Set{Name: "allow6", Family: IPv6, Interval: true, Elems: ElemsOf(
		Elem{Key: pfx("2001:db8::/32")}, Elem{Key: pfx("fd00::/8")},
	)}
	p.Sets = append(p.Sets, allow4, allow6)
	p.Chains = append(sub, blocked, pre)
	return p
}

// programElements counts the elements of a program's sets.
func programElements(p *Program) int {
	n := 0
	for _, s := range p.Sets {
		n += s.Elems.Len()
	}
	return n
}

// editElem changes the i-th element of es with f.
func editElem(es *Elems, i int, f func(*Elem)) {
	e := es.At(i)
	f(&e)
	es.Put(i, e)
}
