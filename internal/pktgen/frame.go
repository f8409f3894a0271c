// Package pktgen sends crafted packets through a netns.Lab to test and
// measure the firewall loaded in the lab's fw namespace.
//
//   - Frame builders (AppendUDP, AppendTCPSYN) write Ethernet/IPv4/IPv6
//     frames with any source address and correct checksums.
//   - Sender writes precomputed frames to the gen end of the veth through an
//     AF_PACKET socket with sendmmsg, bypassing the qdisc.
//   - Check tells, for each source address, whether one UDP packet from it
//     got through fw's firewall to a socket; it fails loudly when a packet
//     was lost for any other reason.
//   - Measure times a flood through fw's prerouting to a destination fw
//     drops after routing, for the cost of a ruleset.
//   - RandomV4, RandomV6, RandomFromSet and Boundaries draw reproducible
//     source addresses; they only return addresses Check can test.
package pktgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Header sizes.
const (
	EthLen  = 14
	IPv4Len = 20
	IPv6Len = 40
	UDPLen  = 8
	TCPLen  = 20
)

// Header holds the addresses of a frame. Src and Dst must be of the same
// family; MACs must be 6 bytes.
type Header struct {
	SrcMAC, DstMAC   net.HardwareAddr
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

func (h *Header) check() error {
	if len(h.SrcMAC) != 6 || len(h.DstMAC) != 6 {
		return fmt.Errorf("building frame: MACs %v, %v: want 6 bytes each", h.SrcMAC, h.DstMAC)
	}
	if !h.Src.IsValid() || !h.Dst.IsValid() {
		return errors.New("building frame: source or destination address missing")
	}
	src, dst := h.Src.Unmap(), h.Dst.Unmap()
	if src.Is4() != dst.Is4() {
		return fmt.Errorf("building frame: source %s and destination %s are of different families", h.Src, h.Dst)
	}
	return nil
}

// FrameLen is the length of a frame for family-of-src, l4 header length and
// payload length.
func FrameLen(src netip.Addr, l4, payload int) int {
	if src.Unmap().Is4() {
		return EthLen + IPv4Len + l4 + payload
	}
	return EthLen + IPv6Len + l4 + payload
}

// AppendUDP appends an Ethernet frame carrying a UDP datagram to b. IPv4
// packets have DF set, TTL 64 and the given IP ID; IPv6 packets hop limit
// 64 (id is unused). IPv4-mapped IPv6 addresses are written as IPv4. It
// fails only on an invalid Header.
func AppendUDP(b []byte, h *Header, id uint16, payload []byte) ([]byte, error) {
	if err := h.check(); err != nil {
		return b, err
	}
	b, l4 := appendL3(b, h, id, protoUDP, UDPLen+len(payload))
	u := len(b)
	b = binary.BigEndian.AppendUint16(b, h.SrcPort)
	b = binary.BigEndian.AppendUint16(b, h.DstPort)
	b = binary.BigEndian.AppendUint16(b, uint16(UDPLen+len(payload)))
	b = append(b, 0, 0)
	b = append(b, payload...)
	sum := finish(l4 + sum16(b[u:]))
	if sum == 0 {
		sum = 0xffff // RFC 768: a computed zero is sent as all ones.
	}
	binary.BigEndian.PutUint16(b[u+6:], sum)
	return b, nil
}

// AppendTCPSYN appends an Ethernet frame carrying a TCP SYN with sequence
// number seq, window 65535 and no options.
func AppendTCPSYN(b []byte, h *Header, id uint16, seq uint32) ([]byte, error) {
	if err := h.check(); err != nil {
		return b, err
	}
	b, l4 := appendL3(b, h, id, protoTCP, TCPLen)
	t := len(b)
	b = binary.BigEndian.AppendUint16(b, h.SrcPort)
	b = binary.BigEndian.AppendUint16(b, h.DstPort)
	b = binary.BigEndian.AppendUint32(b, seq)
	b = binary.BigEndian.AppendUint32(b, 0) // ack
	b = append(b, TCPLen/4<<4, 0x02)        // data offset, SYN
	b = binary.BigEndian.AppendUint16(b, 65535)
	b = append(b, 0, 0, 0, 0) // checksum, urgent pointer
	binary.BigEndian.PutUint16(b[t+16:], finish(l4+sum16(b[t:])))
	return b, nil
}

// AppendNeighborSolicit appends an Ethernet frame carrying an ICMPv6
// neighbour solicitation (RFC 4861) for target, from h.Src with h.SrcMAC
// as source link-layer address option, hop limit 255 as the RFC requires.
// h.Dst is usually target's solicited-node multicast address and h.DstMAC
// its 33:33:ff:… group; ports are unused.
func AppendNeighborSolicit(b []byte, h *Header, target netip.Addr) ([]byte, error) {
	if err := h.check(); err != nil {
		return b, err
	}
	if h.Src.Unmap().Is4() || !target.Is6() || target.Is4In6() {
		return b, fmt.Errorf("building neighbour solicitation: %s for %s is not IPv6", h.Src, target)
	}
	const nsLen = 4 + 4 + 16 + 8 // type..checksum, reserved, target, SLLA option
	start := len(b)
	b, l4 := appendL3(b, h, 0, protoICMPv6, nsLen)
	b[start+EthLen+7] = 255 // hop limit
	m := len(b)
	b = append(b, 135, 0, 0, 0, 0, 0, 0, 0) // type, code, checksum, reserved
	t16 := target.As16()
	b = append(b, t16[:]...)
	b = append(b, 1, 1) // source link-layer address, 8 bytes
	b = append(b, h.SrcMAC...)
	binary.BigEndian.PutUint16(b[m+2:], finish(l4+sum16(b[m:])))
	return b, nil
}

const (
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// appendL3 appends the Ethernet and IP headers and returns the unfolded
// sum of the transport pseudo-header.
func appendL3(b []byte, h *Header, id uint16, proto uint8, l4len int) ([]byte, uint32) {
	src, dst := h.Src.Unmap(), h.Dst.Unmap()
	b = append(b, h.DstMAC...)
	b = append(b, h.SrcMAC...)
	if src.Is4() {
		b = append(b, 0x08, 0x00)
		ip := len(b)
		b = append(b, 0x45, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(IPv4Len+l4len))
		b = binary.BigEndian.AppendUint16(b, id)
		b = append(b, 0x40, 0, 64, proto, 0, 0) // DF, TTL, protocol, checksum
		s4, d4 := src.As4(), dst.As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
		binary.BigEndian.PutUint16(b[ip+10:], finish(sum16(b[ip:ip+IPv4Len])))
		return b, sum16(s4[:]) + sum16(d4[:]) + uint32(proto) + uint32(l4len)
	}
	b = append(b, 0x86, 0xdd)
	b = append(b, 0x60, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(l4len))
	b = append(b, proto, 64)
	s16, d16 := src.As16(), dst.As16()
	b = append(b, s16[:]...)
	b = append(b, d16[:]...)
	return b, sum16(s16[:]) + sum16(d16[:]) + uint32(proto) + uint32(l4len)
}

// sum16 returns the unfolded sum of b as big-endian 16-bit words, an odd
// last byte padded with zero.
func sum16(b []byte) uint32 {
	var s uint32
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

// finish folds an unfolded sum and returns its ones' complement.
func finish(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// Checksum returns the Internet checksum (RFC 1071) of b.
func Checksum(b []byte) uint16 { return finish(sum16(b)) }
