package xdp

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// connLab is a lab whose firewall runs "allow only 198.19.0.0/16" (IPv4)
// in XDP on its veth, with conntrack on (an nftables input chain that
// accepts established and related packets, as ipfence's own does). The
// peer, Gen (198.18.0.2), is outside the allowed set; it runs UDP and
// TCP echo servers on port 53 ("DNS"), and the firewall UDP and TCP
// servers on port 7000.
type connLab struct {
	lab          *netns.Lab
	opt          Options
	fwUDP        net.PacketConn
	fwTCP        net.Listener
	peer, fwAddr netip.Addr
}

const connWait = 400 * time.Millisecond // how long a dropped exchange is waited for

func newConnLab(t testing.TB) *connLab {
	lab := netnstest.New(t, "nft")
	netnstest.Exec(t, lab.FW, "nft", "add table inet conn { chain in { type filter hook input priority 0; ct state established,related accept; }; }")
	c := &connLab{lab: lab, peer: lab.GenAddr4.Addr(), fwAddr: lab.FWAddr4.Addr(),
		opt: Options{NetNS: lab.FW, Interfaces: []string{lab.FWIf}, PinDir: netnstest.BPFFS(t)}}
	var udp net.PacketConn
	var tcp net.Listener
	listen := func(addr netip.Addr, port int) func() error {
		return func() (err error) {
			a := net.JoinHostPort(addr.String(), strconv.Itoa(port))
			if udp, err = net.ListenPacket("udp4", a); err != nil {
				return err
			}
			tcp, err = net.Listen("tcp4", a)
			return err
		}
	}
	netnstest.Listen(t, lab.Gen, c.peer, 53)
	if err := lab.DoFW(listen(c.fwAddr, 7000)); err != nil {
		t.Fatal(err)
	}
	c.fwUDP, c.fwTCP = udp, tcp
	t.Cleanup(func() { c.fwUDP.Close(); c.fwTCP.Close() })
	return c
}

// load attaches "allow only 198.19.0.0/16", stateless or not.
func (c *connLab) load(t *testing.T, stateless bool) {
	t.Helper()
	swapIn(t, c.layout(t, stateless), c.opt)
}

// layout is "allow only 198.19.0.0/16", stateless or not.
func (c *connLab) layout(t testing.TB, stateless bool) *Layout {
	t.Helper()
	var b netipx.IPSetBuilder
	b.AddPrefix(netip.MustParsePrefix("0.0.0.0/0"))
	b.RemovePrefix(netip.MustParsePrefix("198.19.0.0/16"))
	rules := []Rule{{Name: "allow-only", Drop: mustSet(&b), Stateless: stateless}}
	l, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	if l.Lookup(c.peer) != 1 || l.Lookup(netip.MustParseAddr("198.19.1.1")) != 0 {
		t.Fatalf("the rule: class %d for the peer, %d for 198.19.1.1; want 1 and 0", l.Lookup(c.peer), l.Lookup(netip.MustParseAddr("198.19.1.1")))
	}
	return l
}

// fromFW runs fn on a connection the firewall opens to the peer's port.
func (c *connLab) fromFW(network string, port int, fn func(net.Conn) error) error {
	var conn net.Conn
	err := c.lab.DoFW(func() (err error) {
		conn, err = net.DialTimeout(network, net.JoinHostPort(c.peer.String(), strconv.Itoa(port)), connWait)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(connWait))
	return fn(conn)
}

// echo writes a message and reads it back.
func echo(conn net.Conn) error {
	if _, err := conn.Write([]byte("query")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	if err == nil && string(buf[:n]) != "query" {
		err = errors.New("a wrong echo: " + string(buf[:n]))
	}
	return err
}

// peerOpens reports whether the peer reaches the firewall's UDP and TCP
// servers with new connections.
func (c *connLab) peerOpens(t *testing.T) (udp, tcp bool) {
	t.Helper()
	fw := net.JoinHostPort(c.fwAddr.String(), "7000")
	if err := c.lab.DoGen(func() error {
		conn, err := net.Dial("udp4", fw)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("new"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.fwUDP.SetReadDeadline(time.Now().Add(connWait))
	_, _, err := c.fwUDP.ReadFrom(make([]byte, 16))
	udp = err == nil
	err = c.lab.DoGen(func() error {
		conn, err := net.DialTimeout("tcp4", fw, connWait)
		if err == nil {
			conn.Close()
		}
		return err
	})
	return udp, err == nil
}

func (c *connLab) counters(t *testing.T) (dropped, conn uint64) {
	t.Helper()
	st, err := ReadStatus(c.opt, 1)
	if err != nil {
		t.Fatal(err)
	}
	return Sum(st.Counters[1]).Packets, Sum(st.Conn).Packets
}

// TestConnectionAwareLab: behind a connection-aware allow-only rule in
// XDP, the firewall's own UDP and TCP exchanges with a peer outside the
// allowed set get their replies, and an ICMP port unreachable for its
// UDP flow, while the peer's new connections to the firewall are dropped
// in XDP (its counters show them). With the rule stateless, the replies
// are dropped too.
func TestConnectionAwareLab(t *testing.T) {
	c := newConnLab(t)
	c.load(t, false)
	if err := c.fromFW("udp4", 53, echo); err != nil {
		t.Errorf("the firewall's UDP exchange with the peer: %v", err)
	}
	if err := c.fromFW("tcp4", 53, echo); err != nil {
		t.Errorf("the firewall's TCP connection to the peer: %v", err)
	}
	err := c.fromFW("udp4", 54, echo) // nobody listens: port unreachable
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the firewall's UDP packet to a closed port of the peer: %v, want ECONNREFUSED (the ICMP error arrives)", err)
	}
	before, conn := c.counters(t)
	if conn < 4 {
		t.Errorf("%d packets passed as known connections, want at least 4", conn)
	}
	if udp, tcp := c.peerOpens(t); udp || tcp {
		t.Errorf("the peer's new connections reached the firewall: UDP %v, TCP %v", udp, tcp)
	}
	if after, _ := c.counters(t); after < before+2 {
		t.Errorf("XDP dropped %d packets of the peer's new connections, want at least 2", after-before)
	}

	c.load(t, true)
	if err := c.fromFW("udp4", 53, echo); err == nil {
		t.Error("stateless: the peer's UDP reply arrived")
	}
	if err := c.fromFW("tcp4", 53, echo); err == nil {
		t.Error("stateless: the TCP connection to the peer was made")
	}
	if err := c.fromFW("udp4", 54, echo); errors.Is(err, syscall.ECONNREFUSED) {
		t.Error("stateless: the ICMP error arrived")
	}
	if dropped, conn := c.counters(t); dropped < 3 || conn != 0 {
		t.Errorf("stateless: %d packets dropped, %d passed as known connections; want at least 3 and 0", dropped, conn)
	}
}

// BenchmarkConntrack times the program per packet (BPF_PROG_RUN, in the
// firewall's namespace of a connLab) with "allow only 198.19.0.0/16"
// stateless and connection-aware, on four frames: a UDP packet of a new
// flow from the blocked peer (the aware program looks it up and misses),
// a TCP SYN from it (no lookup), a UDP reply of a connection the
// firewall opened to the peer (a lookup that finds it: passed), and a
// UDP packet from an allowed source (no lookup either way).
//
//	sudo go test ./internal/backend/xdp -run '^$' -bench Conntrack -benchtime 5x
func BenchmarkConntrack(b *testing.B) {
	c := newConnLab(b)
	var local netip.AddrPort
	if err := c.fromFW("udp4", 53, func(conn net.Conn) error {
		local = conn.LocalAddr().(*net.UDPAddr).AddrPort()
		return echo(conn)
	}); err != nil {
		b.Fatal(err)
	}
	udp := func(src netip.Addr, sport, dport uint16) []byte {
		h := pktgen.Header{SrcMAC: testMAC, DstMAC: testMAC, Src: src, Dst: c.fwAddr, SrcPort: sport, DstPort: dport}
		f, err := pktgen.AppendUDP(nil, &h, 1, make([]byte, 18))
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	syn := udp(c.peer, 40000, 7000)
	syn[14+9] = unix.IPPROTO_TCP
	syn[14+20+12], syn[14+20+13] = 5<<4, 0x02 // data offset, SYN
	cases := []struct {
		name  string
		f     []byte
		aware uint32 // the connection-aware program's verdict
	}{
		{"new-udp", udp(c.peer, 40000, 7000), xdpDrop},
		{"syn", syn, xdpDrop},
		{"reply", udp(c.peer, 53, local.Port()), xdpPass},
		{"allowed", udp(netip.MustParseAddr("198.19.1.1"), 40000, 7000), xdpPass},
	}
	var progs []*ebpf.Program
	for _, stateless := range []bool{true, false} {
		o, err := c.layout(b, stateless).Load(LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer o.Close()
		progs = append(progs, o.Program)
	}
	for _, tc := range cases {
		var ns []float64
		if err := c.lab.DoFW(func() error {
			if got := run(b, progs[1], tc.f); got != tc.aware {
				b.Errorf("%s: the connection-aware verdict %d, want %d", tc.name, got, tc.aware)
			}
			ns = benchFrames(b, [][]byte{tc.f}, progs...)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(ns[0], tc.name+"-stateless-ns/packet")
		b.ReportMetric(ns[1], tc.name+"-aware-ns/packet")
	}
}
