package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// The bench's eBPF programs are the plainest drop paths, written in eBPF
// assembly so that nothing but the kernel is needed: IPv4 packets whose
// source matches are dropped at the firewall veth's driver (XDP) or at tc
// ingress (tcx), all else passes. They are what the scenarios compare the
// nft and iptables hooks against.

// hook is where a bench program attaches: its program type, where its
// context holds the packet's start and end, and its verdicts.
type hook struct {
	typ                ebpf.ProgramType
	dataOff, endOff    int16
	dropCode, passCode int32
}

var (
	xdpHook = hook{ebpf.XDP, 0, 4, 1, 2}        // xdp_md; XDP_DROP, XDP_PASS
	tcHook  = hook{ebpf.SchedCLS, 76, 80, 2, 0} // __sk_buff; TCX_DROP, TCX_PASS
)

// ipv4Source loads an Ethernet frame's IPv4 source address into R5
// (network byte order in memory, read as a little-endian word), jumping
// to "pass" when the frame is too short or not IPv4.
func (h hook) ipv4Source() asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, h.dataOff, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, h.endOff, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20), // Ethernet and IPv4 headers
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
		asm.JNE.Imm(asm.R5, int32(hostUint16(unix.ETH_P_IP)), "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14+12, asm.Word), // IPv4 source
	}
}

// verdicts ends a program: fall through to drop, "pass" to pass.
func (h hook) verdicts() asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R0, h.dropCode),
		asm.Return(),
		asm.Mov.Imm(asm.R0, h.passCode).WithSymbol("pass"),
		asm.Return(),
	}
}

// hostUint16 is the value a load in host byte order reads from v stored in
// network byte order.
func hostUint16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// XDPDropPrefix drops IPv4 packets from p at the driver: one masked
// compare.
func XDPDropPrefix(p netip.Prefix) Loader { return xdpHook.dropPrefix(p) }

// TCDropPrefix drops IPv4 packets from p at tc ingress (tcx), with the
// same program as XDPDropPrefix.
func TCDropPrefix(p netip.Prefix) Loader { return tcHook.dropPrefix(p) }

func (h hook) dropPrefix(p netip.Prefix) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("building the prefix drop: %s is not IPv4", p)
		}
		var m [4]byte
		binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-p.Bits())) // 0 for /0
		a := p.Masked().Addr().As4()
		insns := append(h.ipv4Source(),
			asm.LoadImm(asm.R6, int64(binary.NativeEndian.Uint32(m[:])), asm.DWord),
			asm.And.Reg(asm.R5, asm.R6),
			asm.LoadImm(asm.R6, int64(binary.NativeEndian.Uint32(a[:])), asm.DWord),
			asm.JNE.Reg(asm.R5, asm.R6, "pass"),
		)
		return h.attach(lab, append(insns, h.verdicts()...))
	}
}

// XDPDropSet drops packets whose source is in one of prefixes at the
// driver, with one lookup in an LPM trie map per family.
func XDPDropSet(prefixes []netip.Prefix) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		insns, maps, err := lpmDrop(prefixes)
		if err != nil {
			return nil, err
		}
		unload, err := xdpHook.attach(lab, insns, maps...)
		if err != nil {
			closeMaps(maps)
		}
		return unload, err
	}
}

// lpmDrop returns the XDP program of XDPDropSet and its maps, filled: an
// LPM trie of prefixes' IPv4 prefixes and one of their IPv6 prefixes.
func lpmDrop(prefixes []netip.Prefix) (asm.Instructions, []*ebpf.Map, error) {
	var maps []*ebpf.Map
	for _, bits := range []int{32, 128} {
		m, err := lpmTrie(prefixes, bits)
		if err != nil {
			closeMaps(maps)
			return nil, nil, err
		}
		maps = append(maps, m)
	}
	h := xdpHook
	const (
		key4 = -8  // struct bpf_lpm_trie_key_u8 with 4 bytes of data
		key6 = -20 // with 16
	)
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, h.dataOff, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, h.endOff, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20), // Ethernet and IPv4 headers
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
		asm.JEq.Imm(asm.R5, int32(hostUint16(unix.ETH_P_IP)), "v4"),
		asm.JNE.Imm(asm.R5, int32(hostUint16(unix.ETH_P_IPV6)), "pass"),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+40), // Ethernet and IPv6 headers
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.StoreImm(asm.RFP, key6, 128, asm.Word), // prefixlen
	}
	for i := range int16(4) { // the IPv6 source, a word at a time
		insns = append(insns,
			asm.LoadMem(asm.R5, asm.R2, 14+8+4*i, asm.Word),
			asm.StoreMem(asm.RFP, key6+4+4*i, asm.R5, asm.Word))
	}
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, maps[1].FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key6),
		asm.FnMapLookupElem.Call(),
		asm.Ja.Label("found"),
		asm.StoreImm(asm.RFP, key4, 32, asm.Word).WithSymbol("v4"),
		asm.LoadMem(asm.R5, asm.R2, 14+12, asm.Word), // IPv4 source
		asm.StoreMem(asm.RFP, key4+4, asm.R5, asm.Word),
		asm.LoadMapPtr(asm.R1, maps[0].FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass").WithSymbol("found"),
	)
	return append(insns, h.verdicts()...), maps, nil
}

// lpmTrie returns an LPM trie holding prefixes of bits bits (32: the
// IPv4 ones, 128: IPv6).
func lpmTrie(prefixes []netip.Prefix, bits int) (*ebpf.Map, error) {
	ps := make([]xdp.ClassPrefix, len(prefixes))
	for i, p := range prefixes {
		ps[i] = xdp.ClassPrefix{Prefix: p, Class: 1}
	}
	return xdp.NewLPMTrie(fmt.Sprintf("ipfence_lpm%d", bits), ps, bits)
}

func closeMaps(maps []*ebpf.Map) {
	for _, m := range maps {
		m.Close()
	}
}

// XDPRunNs times XDPDropSet's program in the kernel without a device
// (BPF_PROG_TEST_RUN): for each of up to 64 UDP frames from srcs to lab's
// sink of their family, repeat runs. It returns the median of the frames' mean time per run,
// and an error if a frame does not get the verdict drop says.
func XDPRunNs(lab *netns.Lab, prefixes []netip.Prefix, srcs []netip.Addr, repeat int, drop bool) (float64, error) {
	if len(srcs) == 0 {
		return 0, errors.New("timing the XDP program: no sources")
	}
	insns, maps, err := lpmDrop(prefixes)
	if err != nil {
		return 0, err
	}
	defer closeMaps(maps)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "ipfence_bench", Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		return 0, fmt.Errorf("loading the XDP program: %w", err)
	}
	defer prog.Close()
	mac := []byte{2, 0, 0, 0, 0, 1}
	want := uint32(xdpHook.passCode)
	if drop {
		want = uint32(xdpHook.dropCode)
	}
	var per []float64
	for _, a := range srcs[:min(len(srcs), 64)] {
		dst := lab.Sink4
		if a.Is6() {
			dst = lab.Sink6
		}
		h := pktgen.Header{SrcMAC: mac, DstMAC: mac, Src: a, Dst: dst, SrcPort: 1, DstPort: 9}
		frame, err := pktgen.AppendUDP(nil, &h, 1, make([]byte, 18))
		if err != nil {
			return 0, err
		}
		ret, d, err := prog.Benchmark(frame, repeat, nil)
		if err != nil {
			return 0, fmt.Errorf("running the XDP program: %w", err)
		}
		if ret != want {
			return 0, fmt.Errorf("XDP program returned %d for source %s, want %d", ret, a, want)
		}
		per = append(per, float64(d.Nanoseconds()))
	}
	return Median(per), nil
}

// attach loads insns and attaches them to the firewall's veth: XDP in
// driver mode, or tcx ingress. Unloading detaches the program and closes
// it and maps.
func (h hook) attach(lab *netns.Lab, insns asm.Instructions, maps ...*ebpf.Map) (func() error, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "ipfence_bench", Type: h.typ, License: "GPL", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("loading the %s program: %w", h.typ, err)
	}
	var l link.Link
	err = lab.DoFW(func() error {
		var err error
		if h.typ == ebpf.XDP {
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: lab.FWIndex, Flags: link.XDPDriverMode})
		} else {
			l, err = link.AttachTCX(link.TCXOptions{Program: prog, Interface: lab.FWIndex, Attach: ebpf.AttachTCXIngress})
		}
		return err
	})
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attaching the %s program to %s: %w", h.typ, lab.FWIf, err)
	}
	return func() error {
		errs := []error{l.Close(), prog.Close()}
		for _, m := range maps {
			errs = append(errs, m.Close())
		}
		return errors.Join(errs...)
	}, nil
}
