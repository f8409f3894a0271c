package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// Layout is what BuildLayout compiles rules into, for both families.
type Layout struct {
	Rules []string // names, by class - 1
	V4    *V4
	V6    []ClassPrefix // the IPv6 prefixes and their classes, for the LPM trie
	// Ref4 are the IPv4 prefixes and their classes, for the reference
	// program (LoadOptions.LPM4).
	Ref4 []ClassPrefix
}

// ClassPrefix is a prefix of an LPM trie and its class.
type ClassPrefix struct {
	Prefix netip.Prefix
	Class  Class
}

// BuildLayout compiles rules (first match wins) for both families.
func BuildLayout(rules []Rule) (*Layout, error) {
	spans4, err := partition(rules, true)
	if err != nil {
		return nil, err
	}
	spans6, err := partition(rules, false)
	if err != nil {
		return nil, err
	}
	l := &Layout{V4: buildV4(spans4), Ref4: classPrefixes(spans4), V6: classPrefixes(spans6)}
	for _, r := range rules {
		l.Rules = append(l.Rules, r.Name)
	}
	return l, nil
}

// classPrefixes returns the fewest prefixes, with their classes, that
// cover the spans of classes other than 0.
func classPrefixes(spans []span) []ClassPrefix {
	var out []ClassPrefix
	for _, s := range spans {
		if s.class == 0 {
			continue
		}
		for _, p := range netipx.IPRangeFrom(s.from, s.to).Prefixes() {
			out = append(out, ClassPrefix{p, s.class})
		}
	}
	return out
}

// Lookup returns the class of a (the model of the program).
func (l *Layout) Lookup(a netip.Addr) Class {
	a = a.Unmap()
	if a.Is4() {
		return l.V4.Lookup(a)
	}
	best, class := -1, Class(0)
	for _, p := range l.V6 {
		if p.Prefix.Bits() > best && p.Prefix.Contains(a) {
			best, class = p.Prefix.Bits(), p.Class
		}
	}
	return class
}

// Memory is the bytes of map values the layout takes (the IPv6 trie
// counted as its keys and values, without the kernel's node overhead).
func (l *Layout) Memory() int { return l.V4.Memory() + 21*len(l.V6) }

// XDP verdicts.
const (
	xdpDrop = 1
	xdpPass = 2
)

// Counters is one class's counters in the stats map, per CPU.
type Counters struct {
	Packets, Bytes uint64
}

// Objects are a layout's maps, filled, and its program, loaded but not
// attached. Close releases them.
type Objects struct {
	Program *ebpf.Program
	Stats   *ebpf.Map // per-CPU Counters by class
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

// Class counters: the packets and bytes of class c summed over CPUs.
func (o *Objects) Counters(c Class) (Counters, error) {
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
	// LPM4 looks IPv4 sources up in an LPM trie, as IPv6 ones: the
	// reference the tables are measured against.
	LPM4 bool
}

// Load creates l's maps, fills them and loads the program that reads
// them. Nothing is attached.
func (l *Layout) Load(opt LoadOptions) (_ *Objects, err error) {
	o := &Objects{}
	defer func() {
		if err != nil {
			for _, m := range o.maps {
				m.Close()
			}
		}
	}()
	newMap := func(spec *ebpf.MapSpec) (*ebpf.Map, error) {
		m, err := ebpf.NewMap(spec)
		if err != nil {
			return nil, fmt.Errorf("creating map %s: %w", spec.Name, err)
		}
		o.maps = append(o.maps, m)
		return m, nil
	}
	array := func(name string, valueSize uint32, n int) (*ebpf.Map, error) {
		return newMap(&ebpf.MapSpec{Name: name, Type: ebpf.Array, KeySize: 4, ValueSize: valueSize, MaxEntries: uint32(max(n, 1))})
	}
	l1, err := array("ipf_v4_l1", 4, len(l.V4.L1))
	if err != nil {
		return nil, err
	}
	l2, err := array("ipf_v4_l2", 4, len(l.V4.L2))
	if err != nil {
		return nil, err
	}
	bits, err := array("ipf_v4_bits", 36, len(l.V4.Bits))
	if err != nil {
		return nil, err
	}
	bytes, err := array("ipf_v4_bytes", 256, len(l.V4.Bytes))
	if err != nil {
		return nil, err
	}
	trie := func(name string, ps []ClassPrefix, bits int) (*ebpf.Map, error) {
		m, err := NewLPMTrie(name, ps, bits)
		if err == nil {
			o.maps = append(o.maps, m)
		}
		return m, err
	}
	trie6, err := trie("ipf_v6_lpm", l.V6, 128)
	if err != nil {
		return nil, err
	}
	var trie4 *ebpf.Map
	if opt.LPM4 {
		if trie4, err = trie("ipf_v4_lpm", l.Ref4, 32); err != nil {
			return nil, err
		}
	}
	if o.Stats, err = newMap(&ebpf.MapSpec{Name: "ipf_stats", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: MaxRules + 1}); err != nil {
		return nil, err
	}
	if err := fill(l, l1, l2, bits, bytes); err != nil {
		return nil, err
	}
	o.Program, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "ipfence", Type: ebpf.XDP, License: "GPL",
		Instructions: instructions(l1, l2, bits, bytes, trie4, trie6, o.Stats)})
	if err != nil {
		return nil, fmt.Errorf("loading the XDP program: %w", err)
	}
	return o, nil
}

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

// fill writes l's IPv4 tables into their maps with batch updates.
func fill(l *Layout, l1, l2, bits, bytes *ebpf.Map) error {
	put := func(m *ebpf.Map, n int, values any) error {
		if n == 0 {
			return nil
		}
		keys := make([]uint32, n)
		for i := range keys {
			keys[i] = uint32(i)
		}
		if _, err := m.BatchUpdate(keys, values, nil); err != nil {
			return fmt.Errorf("filling map %s: %w", m, err)
		}
		return nil
	}
	if err := put(l1, len(l.V4.L1), l.V4.L1[:]); err != nil {
		return err
	}
	if err := put(l2, len(l.V4.L2), l.V4.L2); err != nil {
		return err
	}
	if err := put(bits, len(l.V4.Bits), l.V4.Bits); err != nil {
		return err
	}
	return put(bytes, len(l.V4.Bytes), l.V4.Bytes)
}

// Stack slots of the program.
const (
	keyIdx = -4  // u32 array index
	keyV4  = -8  // LPM key: u32 prefix length, 4 bytes of address
	keyV6  = -20 // LPM key: u32 prefix length, 16 bytes of address
)

// instructions is the program: parse Ethernet (up to two VLAN tags,
// 802.1Q or 802.1ad, are skipped), look the IPv4 or IPv6 source up, count
// the packet under its class and drop it unless the class is 0. Frames of
// other protocols, and frames too short for their headers, pass
// uncounted.
//
// Registers kept across helper calls: R6 the frame length, R7 the IPv4
// source (host order), R8 the entry read, R9 the class.
//
// With trie4, IPv4 sources are looked up in that LPM trie instead of the
// tables.
func instructions(l1, l2, bits, bytes, trie4, trie6, stats *ebpf.Map) asm.Instructions {
	be16 := func(v uint16) int32 {
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], v)
		return int32(binary.NativeEndian.Uint16(b[:]))
	}
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
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R6, asm.R3),
		asm.Sub.Reg(asm.R6, asm.R2),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
	}
	for i := range 2 { // VLAN tags: move R2 past each
		tagged, untagged := fmt.Sprintf("vlan%d", i), fmt.Sprintf("novlan%d", i)
		insns = append(insns,
			asm.JEq.Imm(asm.R5, be16(unix.ETH_P_8021Q), tagged),
			asm.JNE.Imm(asm.R5, be16(unix.ETH_P_8021AD), untagged),
			asm.Add.Imm(asm.R2, 4).WithSymbol(tagged),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 14),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
			asm.Mov.Reg(asm.R5, asm.R5).WithSymbol(untagged), // a no-op to carry the label
		)
	}
	insns = append(insns,
		asm.JEq.Imm(asm.R5, be16(unix.ETH_P_IP), "v4"),
		asm.JNE.Imm(asm.R5, be16(unix.ETH_P_IPV6), "pass"),

		// IPv6: one LPM trie lookup.
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+40),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.StoreImm(asm.RFP, keyV6, 128, asm.Word),
	)
	for i := range int16(4) {
		insns = append(insns,
			asm.LoadMem(asm.R5, asm.R2, 14+8+4*i, asm.Word),
			asm.StoreMem(asm.RFP, keyV6+4+4*i, asm.R5, asm.Word))
	}
	insns = append(insns, trieClass(trie6, keyV6)...)
	insns = append(insns,
		// IPv4: L1 by the top 16 bits.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("v4"),
		asm.Add.Imm(asm.R4, 14+20),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R7, asm.R2, 14+12, asm.Word),
	)
	if trie4 != nil {
		insns = append(insns,
			asm.StoreImm(asm.RFP, keyV4, 32, asm.Word),
			asm.StoreMem(asm.RFP, keyV4+4, asm.R7, asm.Word))
		insns = append(insns, trieClass(trie4, keyV4)...)
	} else {
		insns = append(insns, asm.HostTo(asm.BE, asm.R7, asm.Word))
		insns = append(insns, v4Tables(l1, l2, bits, bytes)...)
	}
	insns = append(insns,
		// Count the packet under its class.
		asm.StoreMem(asm.RFP, keyIdx, asm.R9, asm.Word).WithSymbol("count"),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyIdx),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "verdict"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R6),
		asm.StoreMem(asm.R0, 8, asm.R1, asm.DWord),

		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("verdict"),
		asm.JNE.Imm(asm.R9, 0, "exit"),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return().WithSymbol("exit"),
	)
	return insns
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
		// L2: the chunk's entry for the third byte.
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.And.Imm(asm.R1, indexMask),
		asm.LSh.Imm(asm.R1, 8),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.RSh.Imm(asm.R2, 8),
		asm.And.Imm(asm.R2, 0xff),
		asm.Add.Reg(asm.R1, asm.R2),
		asm.StoreMem(asm.RFP, keyIdx, asm.R1, asm.Word),
	)
	insns = append(insns, lookup(l2, keyIdx, "")...)
	insns = append(insns, readEntry...)
	insns = append(insns,
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.And.Imm(asm.R2, indexMask),
		asm.StoreMem(asm.RFP, keyIdx, asm.R2, asm.Word),
		asm.JEq.Imm(asm.R1, int32(ByteLeaf), "byteleaf"),
	)
	insns = append(insns, lookup(bits, keyIdx, "")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R9, 0),
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
		asm.JEq.Imm(asm.R2, 0, "count"),
		asm.LoadMem(asm.R9, asm.R0, 32, asm.Word),
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
