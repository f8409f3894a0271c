package xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// ConnSlot is the index in the stats map of the packets that a
// connection-aware rule's set holds but that passed on to the kernel's
// stack: packets of connections conntrack knows, ICMP errors about them,
// and later fragments (see conntrack).
const ConnSlot = MaxRules + 1

// ErrNoConntrack is returned by Load for connection-aware rules when the
// kernel's BTF lacks the conntrack kfuncs the program calls.
var ErrNoConntrack = errors.New("the kernel has no conntrack kfuncs for XDP (bpf_xdp_ct_lookup in vmlinux BTF)")

// conntrackBTF is what the conntrack path needs of the running kernel:
// the BTF IDs of its kfuncs and where struct nf_conn keeps its status.
type conntrackBTF struct {
	lookup, release btf.TypeID
	status          int16 // offset of nf_conn.status, an unsigned long
}

// loadConntrackBTF reads conntrackBTF from the kernel's BTF. Only kfuncs
// of vmlinux are used: a kfunc of a module (nf_conntrack built as a
// module) needs the module's BTF passed with the program, which
// cilium/ebpf does only for programs loaded from an ELF file.
func loadConntrackBTF() (conntrackBTF, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return conntrackBTF{}, fmt.Errorf("%w: reading the kernel's BTF: %w", ErrNoConntrack, err)
	}
	var ct conntrackBTF
	for _, f := range []struct {
		name string
		id   *btf.TypeID
	}{{"bpf_xdp_ct_lookup", &ct.lookup}, {"bpf_ct_release", &ct.release}} {
		var fn *btf.Func
		if err := spec.TypeByName(f.name, &fn); err != nil {
			return conntrackBTF{}, fmt.Errorf("%w: %s: %w", ErrNoConntrack, f.name, err)
		}
		if *f.id, err = spec.TypeID(fn); err != nil {
			return conntrackBTF{}, fmt.Errorf("%w: %s: %w", ErrNoConntrack, f.name, err)
		}
	}
	var conn *btf.Struct
	if err := spec.TypeByName("nf_conn", &conn); err != nil {
		return conntrackBTF{}, fmt.Errorf("%w: struct nf_conn: %w", ErrNoConntrack, err)
	}
	for _, m := range conn.Members {
		if m.Name == "status" {
			ct.status = int16(m.Offset.Bytes())
			return ct, nil
		}
	}
	return conntrackBTF{}, fmt.Errorf("%w: struct nf_conn has no status", ErrNoConntrack)
}

// kfuncCall calls the kfunc of vmlinux whose BTF ID is id.
func kfuncCall(id btf.TypeID) asm.Instruction {
	return asm.Instruction{OpCode: asm.OpCode(asm.JumpClass).SetJumpOp(asm.Call), Src: asm.PseudoKfuncCall, Constant: int64(id)}
}

// Stack slots of the conntrack path (see the others at keyIdx).
const (
	ctxSlot = -40 // u64: the context, saved at entry
	ctTuple = -80 // struct bpf_sock_tuple: 12 bytes (IPv4) or 36 (IPv6)
	ctOpts  = -96 // struct bpf_ct_opts: 12 bytes
)

// Conntrack constants (linux/netfilter/nf_conntrack_common.h).
const (
	ctDirReply     = 1      // IP_CT_DIR_REPLY: bpf_ct_opts.dir of a reply
	ipsSeenReply   = 1 << 1 // IPS_SEEN_REPLY: the connection is established
	ctOptsSize     = 12     // bpf_ct_opts without the zone fields
	tcpSYN, tcpACK = 0x02, 0x10
)

// conntrack is the path of a packet that a connection-aware rule would
// drop (class in R9, the context saved at ctxSlot). It goes to "tally"
// with R9 unchanged, to drop the packet, or set to ConnSlot, to pass it:
//
//   - TCP and UDP: passed when bpf_xdp_ct_lookup finds its connection
//     and the packet is a reply, or the connection has seen one
//     (conntrack's "established"). A TCP SYN without ACK opens a
//     connection, so it is dropped without a lookup: a SYN flood from a
//     blocked set costs what it costs stateless.
//   - ICMP and ICMPv6 errors (destination unreachable, packet too big,
//     time exceeded, parameter problem) about a TCP or UDP packet:
//     passed when the connection of the packet they quote is known
//     (conntrack's "related"), replied or not.
//   - Later fragments (IPv4 fragment offset > 0, an IPv6 fragment header
//     right after the fixed header with offset > 0): passed; they carry
//     no ports, and the stack cannot reassemble them without the first
//     fragment, which is judged.
//   - Anything else (other protocols, ICMP echo replies, extension
//     headers other than one fragment header, short or malformed
//     headers): dropped.
func conntrack(ct conntrackBTF) asm.Instructions {
	insns := asm.Instructions{asm.LoadMem(asm.R1, asm.RFP, ctxSlot, asm.DWord).WithSymbol("ct")}
	insns = append(insns, ethernet("ct", "tally", nil)...)
	insns = append(insns,
		asm.Add.Imm(asm.R2, 14),                     // the network header
		asm.StoreImm(asm.RFP, ctOpts, -1, asm.Word), // netns_id: BPF_F_CURRENT_NETNS
		asm.StoreImm(asm.RFP, ctOpts+4, 0, asm.Word),
		asm.StoreImm(asm.RFP, ctOpts+8, 0, asm.Word),
		asm.Mov.Imm(asm.R8, 0), // 1: any connection will do (an ICMP error)
		asm.JEq.Imm(asm.R5, be16(unix.ETH_P_IPV6), "ct6"),
		asm.JNE.Imm(asm.R5, be16(unix.ETH_P_IP), "tally"),
	)
	// IPv4: R2 the header, R3 the end of the frame.
	insns = append(insns, laterFragment(20, 6, 0x1fff)...)
	insns = append(insns, copyAddrs(12, 4)...)
	insns = append(insns,
		asm.LoadMem(asm.R4, asm.R2, 9, asm.Byte),
		asm.LoadMem(asm.R5, asm.R2, 0, asm.Byte),
		asm.And.Imm(asm.R5, 0xf),
		asm.LSh.Imm(asm.R5, 2),
		asm.JLT.Imm(asm.R5, 20, "tally"),
		asm.Add.Reg(asm.R2, asm.R5),
	)
	insns = append(insns, transport(ipv4Family)...)
	insns = append(insns,
		// IPv6.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ct6"),
		asm.Add.Imm(asm.R4, 40),
		asm.JGT.Reg(asm.R4, asm.R3, "tally"),
	)
	insns = append(insns, copyAddrs(8, 16)...)
	insns = append(insns,
		asm.LoadMem(asm.R4, asm.R2, 6, asm.Byte),
		asm.Add.Imm(asm.R2, 40),
		asm.JNE.Imm(asm.R4, unix.IPPROTO_FRAGMENT, "ctl4v6"),
	)
	insns = append(insns, laterFragment(8, 2, 0xfff8)...)
	insns = append(insns,
		asm.LoadMem(asm.R4, asm.R2, 0, asm.Byte),
		asm.Add.Imm(asm.R2, 8),
		asm.Mov.Reg(asm.R4, asm.R4).WithSymbol("ctl4v6"), // a no-op to carry the label
	)
	insns = append(insns, transport(ipv6Family)...)
	return append(insns,
		// The lookup: R3 the tuple's size, R8 whether any connection
		// will do.
		asm.LoadMem(asm.R1, asm.RFP, ctxSlot, asm.DWord).WithSymbol("ctlookup"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, ctTuple),
		asm.Mov.Reg(asm.R4, asm.RFP),
		asm.Add.Imm(asm.R4, ctOpts),
		asm.Mov.Imm(asm.R5, ctOptsSize),
		kfuncCall(ct.lookup),
		asm.JEq.Imm(asm.R0, 0, "tally"),
		asm.JNE.Imm(asm.R8, 0, "ctknown"),
		asm.LoadMem(asm.R1, asm.RFP, ctOpts+9, asm.Byte),
		asm.JEq.Imm(asm.R1, ctDirReply, "ctknown"),
		asm.LoadMem(asm.R1, asm.R0, ct.status, asm.DWord),
		asm.And.Imm(asm.R1, ipsSeenReply),
		asm.JNE.Imm(asm.R1, 0, "ctknown"),
		asm.Mov.Reg(asm.R1, asm.R0),
		kfuncCall(ct.release),
		asm.Ja.Label("tally"),
		asm.Mov.Reg(asm.R1, asm.R0).WithSymbol("ctknown"),
		kfuncCall(ct.release),
		asm.Mov.Imm(asm.R9, ConnSlot).WithSymbol("ctpass"),
		asm.Ja.Label("tally"),
	)
}

// laterFragment checks that the header at R2 has n bytes (else goes to
// "tally") and goes to "ctpass" if the fragment offset it keeps at off,
// under mask (host order), is not 0.
func laterFragment(n int32, off int16, mask uint16) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R0, asm.R2),
		asm.Add.Imm(asm.R0, n),
		asm.JGT.Reg(asm.R0, asm.R3, "tally"),
		asm.LoadMem(asm.R0, asm.R2, off, asm.Half),
		asm.And.Imm(asm.R0, be16(mask)),
		asm.JNE.Imm(asm.R0, 0, "ctpass"),
	}
}

// family is how the conntrack path reads the headers of one IP version.
type family struct {
	name      string // label suffix
	addrLen   int16  // bytes of an address
	tupleSize int32  // of struct bpf_sock_tuple's member
	icmp      int32  // the ICMP protocol
	errors    []int32
	// innerLen is the length of the IP header an ICMP error quotes (IPv4:
	// only those without options); innerProto and innerAddrs are where
	// it keeps the protocol and the addresses.
	innerLen, innerProto, innerAddrs int16
}

var (
	ipv4Family = family{name: "v4", addrLen: 4, tupleSize: 12, icmp: unix.IPPROTO_ICMP,
		errors:   []int32{3, 11, 12}, // destination unreachable, time exceeded, parameter problem
		innerLen: 20, innerProto: 9, innerAddrs: 12}
	ipv6Family = family{name: "v6", addrLen: 16, tupleSize: 36, icmp: unix.IPPROTO_ICMPV6,
		errors:   []int32{1, 2, 3, 4}, // destination unreachable, packet too big, time exceeded, parameter problem
		innerLen: 40, innerProto: 6, innerAddrs: 8}
)

// copyAddrs copies the source and destination addresses, n bytes each
// from offset off of the header at R2, to the tuple.
func copyAddrs(off, n int16) asm.Instructions {
	var insns asm.Instructions
	for i := int16(0); i < 2*n; i += 4 {
		insns = append(insns,
			asm.LoadMem(asm.R0, asm.R2, off+i, asm.Word),
			asm.StoreMem(asm.RFP, ctTuple+i, asm.R0, asm.Word))
	}
	return insns
}

// transport reads the transport header at R2 (protocol in R4, the end of
// the frame in R3) into the tuple and opts of f's lookup and goes to
// "ctlookup", or to "tally" for what it drops.
func transport(f family) asm.Instructions {
	tcp, udp, icmpErr, ports := "cttcp"+f.name, "ctudp"+f.name, "cticmperr"+f.name, "ctports"+f.name
	insns := asm.Instructions{
		asm.JEq.Imm(asm.R4, unix.IPPROTO_TCP, tcp),
		asm.JEq.Imm(asm.R4, unix.IPPROTO_UDP, udp),
		asm.JNE.Imm(asm.R4, f.icmp, "tally"),
		// An ICMP error: its header, the quoted IP header and ports.
		asm.Mov.Reg(asm.R0, asm.R2),
		asm.Add.Imm(asm.R0, 8+int32(f.innerLen)+4),
		asm.JGT.Reg(asm.R0, asm.R3, "tally"),
		asm.LoadMem(asm.R0, asm.R2, 0, asm.Byte),
	}
	for _, t := range f.errors {
		insns = append(insns, asm.JEq.Imm(asm.R0, t, icmpErr))
	}
	insns = append(insns,
		asm.Ja.Label("tally"),
		asm.Add.Imm(asm.R2, 8).WithSymbol(icmpErr),
	)
	if f.addrLen == 4 {
		insns = append(insns,
			asm.LoadMem(asm.R0, asm.R2, 0, asm.Byte),
			asm.JNE.Imm(asm.R0, 0x45, "tally")) // IPv4 without options
	}
	insns = append(insns,
		asm.LoadMem(asm.R4, asm.R2, f.innerProto, asm.Byte),
		asm.JEq.Imm(asm.R4, unix.IPPROTO_TCP, icmpErr+"ok"),
		asm.JNE.Imm(asm.R4, unix.IPPROTO_UDP, "tally"),
	)
	inner := copyAddrs(f.innerAddrs, f.addrLen)
	inner[0] = inner[0].WithSymbol(icmpErr + "ok")
	insns = append(insns, inner...)
	return append(insns,
		asm.Add.Imm(asm.R2, int32(f.innerLen)),
		asm.Mov.Imm(asm.R8, 1),
		asm.Ja.Label(ports),

		asm.Mov.Reg(asm.R0, asm.R2).WithSymbol(tcp),
		asm.Add.Imm(asm.R0, 14),
		asm.JGT.Reg(asm.R0, asm.R3, "tally"),
		asm.LoadMem(asm.R0, asm.R2, 13, asm.Byte),
		asm.And.Imm(asm.R0, tcpSYN|tcpACK),
		asm.JEq.Imm(asm.R0, tcpSYN, "tally"), // opens a connection
		asm.Ja.Label(ports),

		asm.Mov.Reg(asm.R0, asm.R2).WithSymbol(udp),
		asm.Add.Imm(asm.R0, 8),
		asm.JGT.Reg(asm.R0, asm.R3, "tally"),

		asm.LoadMem(asm.R0, asm.R2, 0, asm.Word).WithSymbol(ports), // both ports
		asm.StoreMem(asm.RFP, ctTuple+2*f.addrLen, asm.R0, asm.Word),
		asm.StoreMem(asm.RFP, ctOpts+8, asm.R4, asm.Byte), // l4proto
		asm.Mov.Imm(asm.R3, f.tupleSize),
		asm.Ja.Label("ctlookup"),
	)
}
