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
	"go4.org/netipx"
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

// XDPTables drops packets whose source is in set at the firewall veth's
// driver with ipfence's XDP program (internal/backend/xdp): its compiled
// tables, or with lpm the kernel's LPM tries of the same prefixes (the
// reference).
func XDPTables(set *netipx.IPSet, lpm bool) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		objs, err := loadXDP(set, lpm)
		if err != nil {
			return nil, err
		}
		unload, err := attachProgram(lab, objs.Program, objs.Close)
		if err != nil {
			objs.Close()
		}
		return unload, err
	}
}

// loadXDP loads ipfence's XDP program dropping set.
func loadXDP(set *netipx.IPSet, lpm bool) (*xdp.Objects, error) {
	build := xdp.BuildLayout
	if lpm {
		build = xdp.BuildReference
	}
	l, err := build([]xdp.Rule{{Name: "bench", Drop: set}})
	if err != nil {
		return nil, fmt.Errorf("compiling the XDP tables: %w", err)
	}
	objs, err := l.Load(xdp.LoadOptions{LPM: lpm})
	if err != nil {
		return nil, fmt.Errorf("loading the XDP program: %w", err)
	}
	return objs, nil
}

// XDPRun is the time of one run of an XDP program without a device.
type XDPRun struct {
	Name     string  // the config: ipfence-xdp or xdp-lpm
	LPM      bool    // LPM tries instead of tables
	NsPerRun float64 // median over frames of the mean over runs
}

// XDPRunNs times ipfence's XDP program dropping set, with its tables and
// with LPM tries (runs[i].LPM), in the kernel without a device
// (BPF_PROG_TEST_RUN): for each of up to 64 UDP frames from srcs to lab's
// sink of their family, repeat runs of each program in turn. It fills in
// each run's median over frames of their mean time per run, and fails if
// a frame does not get the verdict drop says.
func XDPRunNs(lab *netns.Lab, set *netipx.IPSet, runs []XDPRun, srcs []netip.Addr, repeat int, drop bool) error {
	if len(srcs) == 0 {
		return errors.New("timing the XDP program: no sources")
	}
	progs := make([]*ebpf.Program, len(runs))
	for i, r := range runs {
		objs, err := loadXDP(set, r.LPM)
		if err != nil {
			return err
		}
		defer objs.Close()
		progs[i] = objs.Program
	}
	mac := []byte{2, 0, 0, 0, 0, 1}
	want := uint32(xdpHook.passCode)
	if drop {
		want = uint32(xdpHook.dropCode)
	}
	per := make([][]float64, len(runs))
	for _, a := range srcs[:min(len(srcs), 64)] {
		dst := lab.Sink4
		if a.Is6() {
			dst = lab.Sink6
		}
		h := pktgen.Header{SrcMAC: mac, DstMAC: mac, Src: a, Dst: dst, SrcPort: 1, DstPort: 9}
		frame, err := pktgen.AppendUDP(nil, &h, 1, make([]byte, 18))
		if err != nil {
			return err
		}
		for i, prog := range progs {
			ret, d, err := prog.Benchmark(frame, repeat, nil)
			if err != nil {
				return fmt.Errorf("running the XDP program (%s): %w", runs[i].Name, err)
			}
			if ret != want {
				return fmt.Errorf("XDP program (%s) returned %d for source %s, want %d", runs[i].Name, ret, a, want)
			}
			per[i] = append(per[i], float64(d.Nanoseconds()))
		}
	}
	for i := range runs {
		runs[i].NsPerRun = Median(per[i])
	}
	return nil
}

// attach loads insns and attaches them to the firewall's veth: XDP in
// driver mode, or tcx ingress. Unloading detaches and closes the program.
func (h hook) attach(lab *netns.Lab, insns asm.Instructions) (func() error, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "ipfence_bench", Type: h.typ, License: "GPL", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("loading the %s program: %w", h.typ, err)
	}
	unload, err := attachProgram(lab, prog, prog.Close)
	if err != nil {
		prog.Close()
	}
	return unload, err
}

// attachProgram attaches prog to the firewall's veth by its type: XDP in
// driver mode, or tcx ingress. Unloading detaches it and calls release.
func attachProgram(lab *netns.Lab, prog *ebpf.Program, release func() error) (func() error, error) {
	var l link.Link
	err := lab.DoFW(func() error {
		var err error
		if prog.Type() == ebpf.XDP {
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: lab.FWIndex, Flags: link.XDPDriverMode})
		} else {
			l, err = link.AttachTCX(link.TCXOptions{Program: prog, Interface: lab.FWIndex, Attach: ebpf.AttachTCXIngress})
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attaching the %s program to %s: %w", prog.Type(), lab.FWIf, err)
	}
	return func() error { return errors.Join(l.Close(), release()) }, nil
}
