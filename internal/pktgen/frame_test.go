package pktgen

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"testing"
)

var (
	macA = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xa}
	macB = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xb}
)

func TestChecksumRFC1071(t *testing.T) {
	// RFC 1071 section 3 example: the sum is ddf2, the checksum its complement.
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := Checksum(b); got != ^uint16(0xddf2) {
		t.Errorf("Checksum = %04x, want %04x", got, ^uint16(0xddf2))
	}
	if got := Checksum([]byte{0xff}); got != 0x00ff {
		t.Errorf("odd length: Checksum = %04x, want 00ff", got)
	}
}

func TestIPv4HeaderKnownGood(t *testing.T) {
	// A well-known IPv4 header (Wikipedia, "Internet checksum"): UDP,
	// 192.168.0.1 -> 192.168.0.199, total length 0x73, DF, TTL 64,
	// checksum b861.
	want, err := hex.DecodeString("45000073000040004011b861c0a80001c0a800c7")
	if err != nil {
		t.Fatal(err)
	}
	h := Header{SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("192.168.0.199"), SrcPort: 1, DstPort: 2}
	f, err := AppendUDP(nil, &h, 0, make([]byte, 0x73-IPv4Len-UDPLen))
	if err != nil {
		t.Fatal(err)
	}
	if got := f[EthLen : EthLen+IPv4Len]; !bytes.Equal(got, want) {
		t.Errorf("IPv4 header\n got %x\nwant %x", got, want)
	}
	if !bytes.Equal(f[0:6], macB) || !bytes.Equal(f[6:12], macA) || f[12] != 0x08 || f[13] != 0 {
		t.Errorf("Ethernet header %x", f[:EthLen])
	}
}

// refL4Sum is a separate reference: it builds the pseudo-header as bytes
// (RFC 768, RFC 8200 section 8.1) and sums 16-bit words in 64 bits.
func refL4Sum(src, dst netip.Addr, proto byte, seg []byte) uint16 {
	var ph []byte
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		ph = append(append(append(ph, s[:]...), d[:]...), 0, proto, byte(len(seg)>>8), byte(len(seg)))
	} else {
		s, d := src.As16(), dst.As16()
		ph = append(append(ph, s[:]...), d[:]...)
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(seg)))
		ph = append(ph, 0, 0, 0, proto)
	}
	all := append(ph, seg...)
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var s uint64
	for i := 0; i < len(all); i += 2 {
		s += uint64(binary.BigEndian.Uint16(all[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestTransportChecksums(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	srcs := append(RandomV4(r, 50), RandomV6(r, 50)...)
	for i, src := range srcs {
		dst := netip.MustParseAddr("2001:2::1")
		if src.Is4() {
			dst = netip.MustParseAddr("198.18.0.1")
		}
		h := Header{SrcMAC: macA, DstMAC: macB, Src: src, Dst: dst, SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}
		payload := make([]byte, i%7+r.IntN(40))
		for j := range payload {
			payload[j] = byte(r.Uint32())
		}
		ipLen := IPv6Len
		if src.Is4() {
			ipLen = IPv4Len
		}
		udp, err := AppendUDP(nil, &h, uint16(i), payload)
		if err != nil {
			t.Fatal(err)
		}
		syn, err := AppendTCPSYN(nil, &h, uint16(i), r.Uint32())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name  string
			frame []byte
			proto byte
			off   int
		}{{"udp", udp, 17, 6}, {"tcp", syn, 6, 16}} {
			if len(c.frame) != FrameLen(src, len(c.frame)-EthLen-ipLen, 0) {
				t.Fatalf("%s: FrameLen mismatch", c.name)
			}
			ip := c.frame[EthLen : EthLen+ipLen]
			if src.Is4() && Checksum(ip) != 0 {
				t.Errorf("%s from %s: IPv4 header checksum does not verify: %x", c.name, src, ip)
			}
			seg := bytes.Clone(c.frame[EthLen+ipLen:])
			got := binary.BigEndian.Uint16(seg[c.off:])
			binary.BigEndian.PutUint16(seg[c.off:], 0)
			want := refL4Sum(src, dst, c.proto, seg)
			if c.proto == 17 && want == 0 {
				want = 0xffff
			}
			if got != want {
				t.Errorf("%s from %s: checksum %04x, reference %04x", c.name, src, got, want)
			}
		}
	}
}

func TestHeaderErrors(t *testing.T) {
	v4, v6 := netip.MustParseAddr("1.2.3.4"), netip.MustParseAddr("2001:db8::1")
	for _, h := range []Header{
		{SrcMAC: macA, DstMAC: macB, Src: v4, Dst: v6},
		{SrcMAC: macA, DstMAC: macB, Dst: v4},
		{SrcMAC: macA[:5], DstMAC: macB, Src: v4, Dst: v4},
	} {
		if _, err := AppendUDP(nil, &h, 0, nil); err == nil {
			t.Errorf("AppendUDP(%+v) succeeded", h)
		}
		if _, err := AppendTCPSYN(nil, &h, 0, 0); err == nil {
			t.Errorf("AppendTCPSYN(%+v) succeeded", h)
		}
	}
	// IPv4-mapped addresses are written as IPv4.
	h := Header{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("::ffff:1.2.3.4"), Dst: netip.MustParseAddr("198.18.0.1")}
	f, err := AppendUDP(nil, &h, 0, nil)
	if err != nil || f[12] != 0x08 || f[EthLen]>>4 != 4 {
		t.Errorf("v4-mapped source: %x, %v", f, err)
	}
}

func TestNeighborSolicit(t *testing.T) {
	src, dst := netip.MustParseAddr("2a00:1::2"), netip.MustParseAddr("ff02::1:ff00:1")
	target := netip.MustParseAddr("2001:2::1")
	h := Header{SrcMAC: macA, DstMAC: macB, Src: src, Dst: dst}
	f, err := AppendNeighborSolicit(nil, &h, target)
	if err != nil {
		t.Fatal(err)
	}
	ip := f[EthLen:]
	if len(ip) != IPv6Len+32 || ip[6] != protoICMPv6 || ip[7] != 255 || binary.BigEndian.Uint16(ip[4:]) != 32 {
		t.Fatalf("IPv6 header %x: want next header 58, hop limit 255, payload length 32", ip[:IPv6Len])
	}
	m := slices.Clone(ip[IPv6Len:])
	if m[0] != 135 || m[1] != 0 || !bytes.Equal(m[8:24], target.AsSlice()) || m[24] != 1 || m[25] != 1 || !bytes.Equal(m[26:32], macA) {
		t.Errorf("neighbour solicitation %x", m)
	}
	sum := binary.BigEndian.Uint16(m[2:])
	m[2], m[3] = 0, 0
	if want := refL4Sum(src, dst, protoICMPv6, m); sum != want {
		t.Errorf("checksum %04x, want %04x", sum, want)
	}
	h.Src = netip.MustParseAddr("192.0.2.1")
	h.Dst = netip.MustParseAddr("192.0.2.2")
	if _, err := AppendNeighborSolicit(nil, &h, target); err == nil {
		t.Error("an IPv4 neighbour solicitation was built")
	}
}
