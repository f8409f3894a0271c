package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// Layout is what BuildLayout compiles rules into, for both families.
type Layout struct {
	Rules []string // names, by class - 1
	V4    *V4
	V6    *V6
	// Ref4 and Ref6 are the prefixes of each family and their classes,
	// for the reference program (LoadOptions.LPM).
	Ref4, Ref6 []ClassPrefix
	// Stateless is the number of leading stateless rules: classes above
	// it are connection-aware (see Rule).
	Stateless int
}

// ClassPrefix is a prefix of an LPM trie and its class.
type ClassPrefix struct {
	Prefix netip.Prefix
	Class  Class
}

// BuildLayout compiles rules (first match wins) for both families.
func BuildLayout(rules []Rule) (*Layout, error) {
	l, earlier, err := buildReference(rules)
	if err != nil {
		return nil, err
	}
	l.V4 = buildV4(partitionAfter(rules, earlier, true))
	if l.V6, err = buildV6(l.Ref6); err != nil {
		return nil, err
	}
	return l, nil
}

// BuildReference compiles rules into LPM prefixes only: a Layout that
// loads with LoadOptions.LPM and has no tables (Lookup and Memory need
// BuildLayout's).
func BuildReference(rules []Rule) (*Layout, error) {
	l, _, err := buildReference(rules)
	return l, err
}

// buildReference is BuildReference, also returning earlierSets(rules).
func buildReference(rules []Rule) (*Layout, []*netipx.IPSet, error) {
	if err := checkRules(rules); err != nil {
		return nil, nil, err
	}
	earlier := earlierSets(rules)
	l := &Layout{Stateless: statelessRules(rules)}
	l.Ref4, l.Ref6 = lpmPrefixes(rules, earlier)
	for _, r := range rules {
		l.Rules = append(l.Rules, r.Name)
	}
	return l, earlier, nil
}

// lpmPrefixes returns the prefixes of each family and their classes
// such that the longest one holding an address gives its class under
// first match: each rule's prefixes, but those its earlier rules (see
// earlierSets) hold whole. (A prefix partly held by earlier rules holds
// their prefixes, which are longer and win.) In address order, shorter
// first.
func lpmPrefixes(rules []Rule, earlier []*netipx.IPSet) (v4, v6 []ClassPrefix) {
	var out []ClassPrefix
	for i, r := range rules {
		if r.Drop == nil {
			continue
		}
		ranges := earlier[i].Ranges()
		for _, p := range r.Drop.Prefixes() {
			if !covered(ranges, p) {
				out = append(out, ClassPrefix{p, Class(i + 1)})
			}
		}
	}
	slices.SortFunc(out, func(a, b ClassPrefix) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	// IPv4 sorts first.
	n, _ := slices.BinarySearchFunc(out, true, func(p ClassPrefix, _ bool) int {
		if p.Prefix.Addr().Is4() {
			return -1
		}
		return 1
	})
	return out[:n:n], out[n:]
}

// covered reports whether one of the sorted, disjoint ranges holds p
// whole (IPSet.ContainsPrefix walks every range).
func covered(ranges []netipx.IPRange, p netip.Prefix) bool {
	i, _ := slices.BinarySearchFunc(ranges, p.Addr(), func(r netipx.IPRange, a netip.Addr) int {
		return r.From().Compare(a)
	})
	// ranges[i-1] is the last starting at or before p, or ranges[i] starts
	// at p itself.
	if i < len(ranges) && ranges[i].From() == p.Addr() {
		return netipx.PrefixLastIP(p).Compare(ranges[i].To()) <= 0
	}
	return i > 0 && netipx.PrefixLastIP(p).Compare(ranges[i-1].To()) <= 0
}

// Lookup returns the class of a (the model of the program).
func (l *Layout) Lookup(a netip.Addr) Class {
	a = a.Unmap()
	if a.Is4() {
		return l.V4.Lookup(a)
	}
	return l.V6.Lookup(a)
}

// Memory is the bytes of map values the layout takes.
func (l *Layout) Memory() int { return l.V4.Memory() + l.V6.Memory() }

// XDP verdicts.
const (
	xdpDrop = 1
	xdpPass = 2
)

// Counters is one class's counters in the stats map, per CPU.
type Counters struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Objects are a layout's maps, filled, and its program, loaded but not
// attached. Close releases them.
type Objects struct {
	Program *ebpf.Program
	Stats   *ebpf.Map // per-CPU Counters by class, and at ConnSlot
	maps    []*ebpf.Map
}

// Close releases the program and every map.
func (o *Objects) Close() error {
	errs := []error{o.Program.Close()}
	for _, m := range o.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// Counters are the packets and bytes of class c (or ConnSlot) summed
// over CPUs.
func (o *Objects) Counters(c int) (Counters, error) {
	var per []Counters
	if err := o.Stats.Lookup(uint32(c), &per); err != nil {
		return Counters{}, fmt.Errorf("reading the counters of class %d: %w", c, err)
	}
	var sum Counters
	for _, x := range per {
		sum.Packets += x.Packets
		sum.Bytes += x.Bytes
	}
	return sum, nil
}

// LoadOptions tune Load.
type LoadOptions struct {
	// LPM looks sources up in an LPM trie per family instead of the
	// tables: the reference the tables are measured against.
	LPM bool
}

// progMaps are the maps a program reads: the tables, or with
// LoadOptions.LPM the tries.
type progMaps struct {
	v4L1, v4L2, v4Bits, v4Bytes *ebpf.Map
	v6L1, v6Narrow, v6Wide      *ebpf.Map
	lpm4, lpm6                  *ebpf.Map
	stats                       *ebpf.Map
}

// narrowSlot and wideSlot are a Slot as BPF reads it in a level of at
// most 64 bits and in a longer one.
type narrowSlot struct {
	Hi    uint64
	Entry Entry
	_     uint32
}

type wideSlot struct {
	Hi, Lo uint64
	Entry  Entry
	_      uint32
}

// Load creates l's maps, fills them and loads the program that reads
// them. Nothing is attached. With connection-aware rules it needs the
// conntrack kfuncs in the kernel's BTF, or fails with ErrNoConntrack.
func (l *Layout) Load(opt LoadOptions) (_ *Objects, err error) {
	var ct *conntrackBTF
	if l.Stateless < len(l.Rules) {
		c, err := loadConntrackBTF()
		if err != nil {
			return nil, err
		}
		ct = &c
	}
	o := &Objects{}
	defer func() {
		if err != nil {
			for _, m := range o.maps {
				m.Close()
			}
		}
	}()
	var m progMaps
	// array creates an array map of n values (at least one) and fills it
	// with values, a slice of n.
	array := func(name string, valueSize uint32, n int, values any) (*ebpf.Map, error) {
		mp, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.Array, KeySize: 4, ValueSize: valueSize, MaxEntries: uint32(max(n, 1))})
		if err != nil {
			return nil, fmt.Errorf("creating map %s: %w", name, err)
		}
		o.maps = append(o.maps, mp)
		if n == 0 {
			return mp, nil
		}
		keys := make([]uint32, n)
		for i := range keys {
			keys[i] = uint32(i)
		}
		if _, err := mp.BatchUpdate(keys, values, nil); err != nil {
			return nil, fmt.Errorf("filling map %s: %w", name, err)
		}
		return mp, nil
	}
	trie := func(name string, ps []ClassPrefix, bits int) (*ebpf.Map, error) {
		mp, err := NewLPMTrie(name, ps, bits)
		if err == nil {
			o.maps = append(o.maps, mp)
		}
		return mp, err
	}
	if opt.LPM {
		if m.lpm4, err = trie("ipf_v4_lpm", l.Ref4, 32); err != nil {
			return nil, err
		}
		if m.lpm6, err = trie("ipf_v6_lpm", l.Ref6, 128); err != nil {
			return nil, err
		}
	} else {
		v4, v6 := l.V4, l.V6
		narrow, wide := make([]narrowSlot, v6.NarrowSlots), make([]wideSlot, v6.WideSlots)
		for _, lv := range v6.Levels {
			for i, sl := range lv.Slots {
				if lv.Wide() {
					wide[lv.Base+i] = wideSlot{Hi: sl.Hi, Lo: sl.Lo, Entry: sl.Entry}
				} else {
					narrow[lv.Base+i] = narrowSlot{Hi: sl.Hi, Entry: sl.Entry}
				}
			}
		}
		for _, a := range []struct {
			m         **ebpf.Map
			name      string
			valueSize uint32
			n         int
			values    any
		}{
			{&m.v4L1, "ipf_v4_l1", 4, len(v4.L1), v4.L1[:]},
			{&m.v4L2, "ipf_v4_l2", 4 * 256, len(v4.L2), v4.L2},
			{&m.v4Bits, "ipf_v4_bits", 40, len(v4.Bits), v4.Bits},
			{&m.v4Bytes, "ipf_v4_bytes", 256, len(v4.Bytes), v4.Bytes},
			{&m.v6L1, "ipf_v6_l1", 4, len(v6.L1), v6.L1[:]},
			{&m.v6Narrow, "ipf_v6_narrow", 16, len(narrow), narrow},
			{&m.v6Wide, "ipf_v6_wide", 24, len(wide), wide},
		} {
			if *a.m, err = array(a.name, a.valueSize, a.n, a.values); err != nil {
				return nil, err
			}
		}
	}
	if o.Stats, err = ebpf.NewMap(&ebpf.MapSpec{Name: "ipf_stats", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: ConnSlot + 1}); err != nil {
		return nil, fmt.Errorf("creating map ipf_stats: %w", err)
	}
	o.maps = append(o.maps, o.Stats)
	m.stats = o.Stats
	o.Program, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: progName, Type: ebpf.XDP, License: "GPL",
		Instructions: instructions(l, &m, ct)})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	return o, nil
}

// ErrRejected is returned when the kernel refuses to load the program
// (its verifier, mostly).
var ErrRejected = errors.New("the kernel refused the XDP program")

// NewLPMTrie returns an LPM trie map named name holding the prefixes of ps
// that have bits bits (32: IPv4, 128: IPv6), each with its class as value.
func NewLPMTrie(name string, ps []ClassPrefix, bits int) (*ebpf.Map, error) {
	n := 0
	for _, p := range ps {
		if p.Prefix.Addr().BitLen() == bits {
			n++
		}
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.LPMTrie, KeySize: 4 + uint32(bits/8), ValueSize: 1,
		MaxEntries: uint32(max(n, 1)), Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		return nil, fmt.Errorf("creating map %s: %w", name, err)
	}
	key := make([]byte, 4+bits/8)
	for _, p := range ps {
		if p.Prefix.Addr().BitLen() != bits {
			continue
		}
		binary.NativeEndian.PutUint32(key, uint32(p.Prefix.Bits()))
		copy(key[4:], p.Prefix.Masked().Addr().AsSlice())
		if err := m.Put(key, uint8(p.Class)); err != nil {
			m.Close()
			return nil, fmt.Errorf("adding %s to map %s: %w", p.Prefix, name, err)
		}
	}
	return m, nil
}

// Stack slots of the program.
const (
	keyIdx   = -4  // u32 array index
	keyV4    = -8  // LPM key: u32 prefix length, 4 bytes of address
	keyV6    = -20 // LPM key: u32 prefix length, 16 bytes of address
	frameLen = -32 // u64 length of the frame
)

// be16 is v in network order, as a load of it reads.
func be16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

// ethernet parses the frame whose context is in R1: R2 and R3 the start
// and end of the frame, then afterLoad, then R2 moved past up to two VLAN
// tags (802.1Q or 802.1ad) to the network header and R5 its EtherType.
// Frames too short go to fail; labels end in sfx.
func ethernet(sfx, fail string, afterLoad asm.Instructions) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
	}
	insns = append(insns, afterLoad...)
	insns = append(insns,
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, fail),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
	)
	for i := range 2 { // VLAN tags: move R2 past each
		tagged, untagged := fmt.Sprintf("vlan%d%s", i, sfx), fmt.Sprintf("novlan%d%s", i, sfx)
		insns = append(insns,
			asm.JEq.Imm(asm.R5, be16(unix.ETH_P_8021Q), tagged),
			asm.JNE.Imm(asm.R5, be16(unix.ETH_P_8021AD), untagged),
			asm.Add.Imm(asm.R2, 4).WithSymbol(tagged),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 14),
			asm.JGT.Reg(asm.R4, asm.R3, fail),
			asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
			asm.Mov.Reg(asm.R5, asm.R5).WithSymbol(untagged), // a no-op to carry the label
		)
	}
	return insns
}

// instructions is the program: parse Ethernet (see ethernet), look the
// IPv4 or IPv6 source up, and drop the packet unless its class is 0.
// With ct (connection-aware rules, classes above l.Stateless), a packet
// of such a class goes the conntrack path first, which may pass it
// under ConnSlot. The packet is counted under its class (or ConnSlot).
// Frames of other protocols, and frames too short for their headers,
// pass uncounted.
//
// Registers kept across helper calls: R7 the IPv4 source, or R7 and R8
// the IPv6 source's halves (host order); R9 the class; R6 and R8 scratch.
// The frame length waits on the stack, and the context at ctxSlot for
// the conntrack path.
func instructions(l *Layout, m *progMaps, ct *conntrackBTF) asm.Instructions {
	// trieClass sets R9 to the class the LPM trie m holds for the key at
	// key (0 if none) and goes to "count".
	trieClass := func(m *ebpf.Map, key int16) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Imm(asm.R9, 0),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, int32(key)),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "count"),
			asm.LoadMem(asm.R9, asm.R0, 0, asm.Byte),
			asm.Ja.Label("count"),
		}
	}
	var insns asm.Instructions
	if ct != nil {
		insns = append(insns, asm.StoreMem(asm.RFP, ctxSlot, asm.R1, asm.DWord))
	}
	insns = append(insns, ethernet("", "pass", asm.Instructions{
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.Sub.Reg(asm.R4, asm.R2),
		asm.StoreMem(asm.RFP, frameLen, asm.R4, asm.DWord),
	})...)
	insns = append(insns,
		asm.JEq.Imm(asm.R5, be16(unix.ETH_P_IP), "v4"),
		asm.JNE.Imm(asm.R5, be16(unix.ETH_P_IPV6), "pass"),

		// IPv6.
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+40),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
	)
	if m.lpm6 != nil {
		insns = append(insns, asm.StoreImm(asm.RFP, keyV6, 128, asm.Word))
		for i := range int16(4) {
			insns = append(insns,
				asm.LoadMem(asm.R5, asm.R2, 14+8+4*i, asm.Word),
				asm.StoreMem(asm.RFP, keyV6+4+4*i, asm.R5, asm.Word))
		}
		insns = append(insns, trieClass(m.lpm6, keyV6)...)
	} else {
		insns = append(insns,
			asm.LoadMem(asm.R7, asm.R2, 14+8, asm.DWord),
			asm.HostTo(asm.BE, asm.R7, asm.DWord),
			asm.LoadMem(asm.R8, asm.R2, 14+16, asm.DWord),
			asm.HostTo(asm.BE, asm.R8, asm.DWord),
		)
		insns = append(insns, v6Tables(l.V6, m)...)
	}
	insns = append(insns,
		// IPv4.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("v4"),
		asm.Add.Imm(asm.R4, 14+20),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R7, asm.R2, 14+12, asm.Word),
	)
	if m.lpm4 != nil {
		insns = append(insns,
			asm.StoreImm(asm.RFP, keyV4, 32, asm.Word),
			asm.StoreMem(asm.RFP, keyV4+4, asm.R7, asm.Word))
		insns = append(insns, trieClass(m.lpm4, keyV4)...)
	} else {
		insns = append(insns, asm.HostTo(asm.BE, asm.R7, asm.Word))
		insns = append(insns, v4Tables(m.v4L1, m.v4L2, m.v4Bits, m.v4Bytes)...)
	}
	tally := asm.StoreMem(asm.RFP, keyIdx, asm.R9, asm.Word).WithSymbol("count")
	if ct != nil {
		// Connection-aware classes go the conntrack path.
		insns = append(insns, asm.JLE.Imm(asm.R9, int32(l.Stateless), "tally").WithSymbol("count"))
		insns = append(insns, conntrack(*ct)...)
		tally = tally.WithSymbol("tally")
	}
	insns = append(insns,
		// Count the packet under its class.
		tally,
		asm.LoadMapPtr(asm.R1, m.stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyIdx),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "verdict"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, frameLen, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R2),
		asm.StoreMem(asm.R0, 8, asm.R1, asm.DWord),

		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("verdict"),
	)
	if ct != nil {
		insns = append(insns, asm.JEq.Imm(asm.R9, ConnSlot, "pass"))
	}
	insns = append(insns,
		asm.JNE.Imm(asm.R9, 0, "exit"),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return().WithSymbol("exit"),
	)
	return insns
}

// v6Tables sets R9 to the class of the IPv6 source in R7:R8 (host order)
// from the tables (see V6.Lookup) and goes to "count".
func v6Tables(t *V6, m *progMaps) asm.Instructions {
	level := func(i int) string { return fmt.Sprintf("v6level%d", i) }
	// dispatch goes on from the Entry in R1: to "v6decide" if it decides,
	// else, with R9 the class of addresses the level does not hold, to the
	// label of the level it names, one of next.
	dispatch := func(sym string, next []int) asm.Instructions {
		insns := asm.Instructions{
			asm.Mov.Reg(asm.R2, asm.R1).WithSymbol(sym),
			asm.RSh.Imm(asm.R2, kindShift),
			asm.JEq.Imm(asm.R2, int32(Decide), "v6decide"),
			// The next level's default class, then its index.
			asm.Mov.Reg(asm.R9, asm.R1),
			asm.RSh.Imm(asm.R9, 8),
			asm.And.Imm(asm.R9, 0xff),
			asm.And.Imm(asm.R1, 0xff),
		}
		for _, n := range next {
			insns = append(insns, asm.JEq.Imm(asm.R1, int32(n), level(n)))
		}
		return append(insns, asm.Ja.Label("v6miss")) // cannot happen
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.RSh.Imm(asm.R1, 48),
		asm.StoreMem(asm.RFP, keyIdx, asm.R1, asm.Word),
	}
	insns = append(insns, lookup(m.v6L1, keyIdx, "")...)
	insns = append(insns, asm.LoadMem(asm.R1, asm.R0, 0, asm.Word))
	insns = append(insns, dispatch("v6l1", t.Next)...)
	for i := range t.Levels {
		insns = append(insns, levelProbes(&t.Levels[i], i, m, level(i))...)
		insns = append(insns, dispatch(fmt.Sprintf("v6found%d", i), t.Levels[i].Next)...)
	}
	return append(insns,
		asm.Ja.Label("count").WithSymbol("v6miss"), // R9: the level's default
		asm.Mov.Reg(asm.R9, asm.R1).WithSymbol("v6decide"),
		asm.And.Imm(asm.R9, 0xff),
		asm.Ja.Label("count"),
	)
}

// levelProbes looks the IPv6 source in R7:R8 up in level lv (index i),
// starting at symbol sym: a bounded loop over its probes, counted in R6.
// It goes to "v6miss" if the key is absent, or to "v6found<i>" with the
// key's Entry in R1.
func levelProbes(lv *Level, i int, m *progMaps, sym string) asm.Instructions {
	loop, found := fmt.Sprintf("v6probe%d", i), fmt.Sprintf("v6found%d", i)
	// keyHi and keyLo put the key's halves in R3 (and R4).
	keyHi := asm.Instructions{asm.Mov.Reg(asm.R3, asm.R7)}
	if lv.Bits < 64 {
		keyHi = append(keyHi, asm.RSh.Imm(asm.R3, int32(64-lv.Bits)))
	}
	keyLo := asm.Instructions{asm.Mov.Reg(asm.R4, asm.R8)}
	if lv.Bits < 128 {
		keyLo = append(keyLo, asm.RSh.Imm(asm.R4, int32(128-lv.Bits)))
	}
	mp, entryOff := m.v6Narrow, int16(8)
	if lv.Wide() {
		mp, entryOff = m.v6Wide, 16
	}
	insns := asm.Instructions{asm.Mov.Imm(asm.R6, 0).WithSymbol(sym)}
	// The slot: home + R6, wrapped, past the level's base.
	insns = append(insns, keyHi...)
	insns[len(insns)-len(keyHi)] = insns[len(insns)-len(keyHi)].WithSymbol(loop)
	insns = append(insns,
		asm.LoadImm(asm.R1, int64(lv.Mult[0]), asm.DWord),
		asm.Mul.Reg(asm.R3, asm.R1),
	)
	if lv.Wide() {
		insns = append(insns, keyLo...)
		insns = append(insns,
			asm.LoadImm(asm.R1, int64(lv.Mult[1]), asm.DWord),
			asm.Mul.Reg(asm.R4, asm.R1),
			asm.Add.Reg(asm.R3, asm.R4),
		)
	}
	wrapped := fmt.Sprintf("v6wrapped%d", i)
	insns = append(insns,
		asm.RSh.Imm(asm.R3, 32),
		asm.Mul.Imm(asm.R3, int32(len(lv.Slots))),
		asm.RSh.Imm(asm.R3, 32),
		asm.Add.Reg(asm.R3, asm.R6),
		asm.JLT.Imm(asm.R3, int32(len(lv.Slots)), wrapped),
		asm.Sub.Imm(asm.R3, int32(len(lv.Slots))),
		asm.Add.Imm(asm.R3, int32(lv.Base)).WithSymbol(wrapped),
		asm.StoreMem(asm.RFP, keyIdx, asm.R3, asm.Word),
	)
	insns = append(insns, lookup(mp, keyIdx, "")...)
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.R0, entryOff, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "v6miss"), // an empty slot
		asm.LoadMem(asm.R2, asm.R0, 0, asm.DWord),
	)
	next := fmt.Sprintf("v6next%d", i)
	insns = append(insns, keyHi...)
	insns = append(insns, asm.JNE.Reg(asm.R2, asm.R3, next))
	if lv.Wide() {
		insns = append(insns, asm.LoadMem(asm.R2, asm.R0, 8, asm.DWord))
		insns = append(insns, keyLo...)
		insns = append(insns, asm.JNE.Reg(asm.R2, asm.R4, next))
	}
	return append(insns,
		asm.Ja.Label(found),
		asm.Add.Imm(asm.R6, 1).WithSymbol(next),
		asm.JLT.Imm(asm.R6, int32(lv.Probes), loop),
		asm.Ja.Label("v6miss"),
	)
}

// v4Tables sets R9 to the class of the IPv4 source in R7 (host order)
// from the tables (see V4.Lookup), going to "count" or falling through
// with it.
func v4Tables(l1, l2, bits, bytes *ebpf.Map) asm.Instructions {
	// readEntry reads the Entry R0 points to into R8 and its kind into R1,
	// going to "decided" if it decides.
	readEntry := asm.Instructions{
		asm.LoadMem(asm.R8, asm.R0, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.RSh.Imm(asm.R1, kindShift),
		asm.JEq.Imm(asm.R1, int32(Decide), "decided"),
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.RSh.Imm(asm.R1, 16),
		asm.StoreMem(asm.RFP, keyIdx, asm.R1, asm.Word),
	}
	insns = append(insns, lookup(l1, keyIdx, "")...)
	insns = append(insns, readEntry...)
	insns = append(insns,
		// L2: the chunk (one map value), then its entry for the third
		// byte.
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.And.Imm(asm.R1, indexMask),
		asm.StoreMem(asm.RFP, keyIdx, asm.R1, asm.Word),
	)
	insns = append(insns, lookup(l2, keyIdx, "")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.RSh.Imm(asm.R1, 8),
		asm.And.Imm(asm.R1, 0xff),
		asm.LSh.Imm(asm.R1, 2),
		asm.Add.Reg(asm.R0, asm.R1),
	)
	insns = append(insns, readEntry...)
	insns = append(insns,
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.And.Imm(asm.R2, indexMask),
		asm.StoreMem(asm.RFP, keyIdx, asm.R2, asm.Word),
		asm.JEq.Imm(asm.R1, int32(ByteLeaf), "byteleaf"),
	)
	insns = append(insns, lookup(bits, keyIdx, "")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R7), // word offset: (last byte / 32) * 4
		asm.And.Imm(asm.R1, 0xff),
		asm.RSh.Imm(asm.R1, 5),
		asm.LSh.Imm(asm.R1, 2),
		asm.Mov.Reg(asm.R3, asm.R0),
		asm.Add.Reg(asm.R3, asm.R1),
		asm.LoadMem(asm.R2, asm.R3, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.And.Imm(asm.R1, 31),
		asm.RSh.Reg(asm.R2, asm.R1),
		asm.And.Imm(asm.R2, 1),
		asm.LoadMem(asm.R9, asm.R0, 32, asm.Word), // Class
		asm.JEq.Imm(asm.R2, 1, "count"),
		asm.LoadMem(asm.R9, asm.R0, 36, asm.Word), // Else
		asm.Ja.Label("count"),
	)
	insns = append(insns, lookup(bytes, keyIdx, "byteleaf")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.And.Imm(asm.R1, 0xff),
		asm.Add.Reg(asm.R0, asm.R1),
		asm.LoadMem(asm.R9, asm.R0, 0, asm.Byte),
		asm.Ja.Label("count"),

		asm.Mov.Reg(asm.R9, asm.R8).WithSymbol("decided"),
		asm.And.Imm(asm.R9, indexMask),
	)
	return insns
}

// lookup looks the key at key up in array m, starting at symbol sym if
// any; R0 points to the value.
func lookup(m *ebpf.Map, key int16, sym string) asm.Instructions {
	first := asm.LoadMapPtr(asm.R1, m.FD())
	if sym != "" {
		first = first.WithSymbol(sym)
	}
	return asm.Instructions{
		first,
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"), // cannot happen for arrays; the verifier wants it
	}
}
