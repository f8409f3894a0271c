// Package nft turns a compiled plan into nftables objects and loads them.
//
// The Program type is a small, closed model of exactly the nftables objects
// ipfence creates: one inet table, named verdict maps and sets keyed on
// (masked) source addresses, a handful of chains, and rules of a few fixed
// shapes. Two translators read it: Render writes the nft script (the text
// contract of `ipfence compile`), and Apply loads it over netlink in one
// transaction. A differential test checks that both produce the same
// ruleset in the kernel.
package nft

import (
	"net/netip"
	"time"
)

// Family names the address family a set, map or rule is about.
type Family uint8

const (
	// FamilyAny matches both families (used by rules that do not look at
	// addresses).
	FamilyAny Family = iota
	// IPv4 is the ip family.
	IPv4
	// IPv6 is the ip6 family.
	IPv6
)

// String returns "ipv4", "ipv6" or "any".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return "any"
}

// VerdictKind is an nftables verdict.
type VerdictKind uint8

const (
	// Continue means no verdict: the rule has no verdict statement.
	Continue VerdictKind = iota
	Accept
	Drop
	Return
	Jump
	Goto
)

// Verdict is a verdict with its target chain for Jump and Goto.
type Verdict struct {
	Kind  VerdictKind
	Chain string // for Jump and Goto
}

// Program is everything ipfence puts in the kernel: one table.
type Program struct {
	// Table is the name of ipfence's inet table ("ipfence").
	Table string
	// Sets are created in order, after the chains (map elements jump to
	// them) and before the rules (which look them up).
	Sets []*Set
	// Chains are created in order; base chains (Hook != nil) are hooked
	// in only when the whole transaction commits.
	Chains []*Chain
}

// KeyForm says how a hash set's keys are read from the packet's source
// address.
type KeyForm uint8

const (
	// KeyAddress reads the address field, masked: "ip6 saddr &
	// ffff:ffff:ff00:: vmap @m" on a map of type ipv6_addr.
	KeyAddress KeyForm = iota
	// KeyWords (IPv6 hash sets only) reads the fewest leading 32-bit words of the address that
	// hold KeyBits bits, as raw network-header payload, concatenated, the
	// last one masked: "@nh,64,32 . @nh,96,32 & 0xffff0000 vmap @m" on a
	// map of "typeof @nh,64,32 . @nh,96,32". Every step is a 4-byte load
	// or mask, which the kernel runs on its fast paths, and a one-word key
	// gets its fastest hash: for IPv6 a lookup costs about 40 ns (one
	// word) or 90 ns (two) against 150 ns for the 16-byte address
	// (docs/benchmarks.md). Unlike "ip6 saddr", raw payload implies no
	// family check: a lookup rule with KeyWords checks meta nfproto only
	// when its Family is set.
	KeyWords
	// KeyHalf (IPv4 sets, not maps, KeyBits 16) reads the address's
	// leading 16 bits as raw network-header payload: "@nh,96,16 @s" on
	// a set of "typeof @nh,96,16". The kernel stores a set of 2-byte
	// keys as a bitmap (nft_set_bitmap: 16 KiB for all 65,536 keys),
	// whose lookup is one bit test that stays in cache however busy
	// the host is. Like KeyWords it implies no family check.
	KeyHalf
)

// halfBits is the key length of a KeyHalf set.
const halfBits = 16

// words is the number of 32-bit words of a KeyWords key of bits bits.
func words(bits int) int { return (bits + 31) / 32 }

// Set is a named set or verdict map keyed on addresses of one family.
//
// Keys are prefixes. In a plain set (Interval true) they are stored as
// intervals. In a hash set or map (Interval false) every key is a prefix
// of exactly KeyBits bits and is stored as its masked address, whole
// (KeyAddress) or its leading words (KeyWords); the rule that looks it up
// masks the packet's address to KeyBits first.
type Set struct {
	Name     string
	Family   Family // IPv4 or IPv6
	Interval bool   // flags interval
	// KeyBits is the prefix length of every key of a hash set or map
	// (0 for interval sets).
	KeyBits int
	// Key is how a hash set's key is read (KeyAddress for interval sets).
	Key KeyForm
	// Dst: the keys are destination addresses (outbound rules); only
	// the KeyWords typeof says so.
	Dst bool
	// Timeout gives the set "flags timeout": its elements may carry a
	// Timeout after which the kernel removes them. A hash set with
	// timeouts has no declared size (the kernel's resizable hash). Its
	// expired elements are collected every GCInterval.
	Timeout bool
	// IsMap makes this a verdict map (Elems[i].Verdict is the value).
	IsMap bool
	// Comment is stored as set userdata and shown by nft list.
	Comment string
	Elems   Elems
}

// Elem is a set or map element.
type Elem struct {
	Key     netip.Prefix
	Verdict Verdict // maps only
	// Timeout is how long the element stays (sets with Timeout only; 0:
	// for good). The kernel counts in milliseconds.
	Timeout time.Duration
}

// Chain is a regular chain, or a base chain when Hook is set.
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// Hook makes a chain a base chain: type filter, hook Num (prerouting
// when zero) at the given priority, policy accept.
type Hook struct {
	// Priority: -300 is raw (before conntrack at -200).
	Priority int32
	Num      HookNum
}

// HookNum is the netfilter hook a base chain runs at.
type HookNum uint8

const (
	Prerouting HookNum = iota
	Output
	Forward
)

// String is the hook's name in nft's syntax.
func (h HookNum) String() string {
	return [...]string{"prerouting", "output", "forward"}[h]
}

// Proto is an L4 protocol a rule can match on.
type Proto uint8

const (
	ProtoTCP Proto = 6
	ProtoUDP Proto = 17
)

// String returns "tcp" or "udp".
func (p Proto) String() string {
	if p == ProtoUDP {
		return "udp"
	}
	return "tcp"
}

// PortRange is an inclusive destination port range.
type PortRange struct{ First, Last uint16 }

// RejectKind selects the reject statement of a rule.
type RejectKind uint8

const (
	// NoReject: the rule has no reject statement.
	NoReject RejectKind = iota
	// RejectTCPReset: "reject with tcp reset" (the rule also matches
	// meta l4proto tcp).
	RejectTCPReset
	// RejectAdminProhibited: "reject with icmpx admin-prohibited".
	RejectAdminProhibited
)

// Rule is one rule. Its statements are evaluated in the order of the
// fields below; a zero field is absent. Only these shapes are produced:
//
//	iif "lo" accept                                     (Iif + Verdict)
//	meta nfproto ipv4 meta l4proto tcp th dport {..} jump c   (Family, Proto, Ports, Verdict)
//	meta l4proto ipv6-icmp icmpv6 type {nd-*} accept    (NDP + Verdict)
//	ip saddr & 255.255.0.0 vmap @m                      (Lookup with Map)
//	@nh,64,32 . @nh,96,32 & 0xffff0000 vmap @m          (Lookup, KeyWords)
//	ip saddr @s drop                                    (Lookup with set + Verdict)
//	counter drop / counter accept                       (Counter + Verdict)
//	meta l4proto tcp counter reject with tcp reset      (Proto, Counter, Reject)
//	counter reject with icmpx admin-prohibited          (Counter, Reject)
type Rule struct {
	// Iif matches the input interface by name ("lo").
	Iif string
	// Family matches meta nfproto (implied by a KeyAddress Lookup, which
	// then needs no Family).
	Family Family
	// Proto matches meta l4proto; with Ports, th dport in Ports.
	Proto Proto
	Ports []PortRange
	// NDP matches ICMPv6 neighbour/router discovery messages.
	NDP bool
	// Known matches packets of connections conntrack knows: ct state
	// established or related (replies, ICMP errors about them).
	Known bool
	// Lookup looks the masked source address up in a set or map.
	Lookup *Lookup
	// Counter adds an anonymous counter statement.
	Counter bool
	// Reject adds a reject statement (a terminal verdict of its own).
	Reject RejectKind
	// Verdict ends the rule (Continue: none). A rule whose Lookup is a
	// map takes its verdict from the map and has no Verdict.
	Verdict Verdict
	// Comment is stored as rule userdata.
	Comment string
}

// Lookup is "ip saddr & MASK @set" or "ip saddr & MASK vmap @map" (or
// the KeyWords form of the same).
type Lookup struct {
	Family Family // IPv4 or IPv6
	// Key is the set's KeyForm.
	Key KeyForm
	// MaskBits masks the source address before the lookup; 0 (or the
	// full address length) means no mask.
	MaskBits int
	Set      string // name of a Set in the same Program
	IsMap    bool   // vmap
	// Dst looks the destination address up instead of the source.
	Dst bool
}

// GCInterval is how often the kernel frees the expired elements of a set
// with timeouts (nft's gc-interval). An expired element no longer
// matches at once; the interval only decides when its memory is
// reclaimed. The kernel's default, one second, makes its collector walk
// every element of a ban set each second: about 11% of a 2-vCPU machine
// at 3M bans.
const GCInterval = 30 * time.Second
