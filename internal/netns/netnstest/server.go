package netnstest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// Server is a server and the Internet around it, each a namespace of
// its own: Srv (the host under test, where the policy is applied) has a
// default route to Net, which holds the hosts of Allowed and Blocked as
// local addresses, and forwards for Cli, a client behind Srv (a
// container or VM it routes for). Every address is in 198.18.0.0/15 or
// 2001:2::/48; the policy of a test decides which hosts are "allowed".
type Server struct {
	Srv, Net, Cli string // namespace names
	// SrvAddr and CliAddr are Srv's uplink and Cli's addresses.
	SrvAddr, CliAddr [2]netip.Addr
	// Allowed and Blocked are hosts in Net, IPv4 and IPv6 (the names
	// say what the tests' policies do with them).
	Allowed, Blocked [2]netip.Addr
}

// Server address plan: Srv–Net 198.18.0.0/24 and 2001:2::/64, Srv–Cli
// 198.18.2.0/24 and 2001:2:0:2::/64, Net's hosts on its loopback.
var (
	serverAllowed = [2]netip.Addr{netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("2001:2:0:1::10")}
	serverBlocked = [2]netip.Addr{netip.MustParseAddr("198.19.5.5"), netip.MustParseAddr("2001:2:0:5::5")}
)

// NewServer makes a Server, removed when t ends. It gates t with Kernel.
func NewServer(t testing.TB) *Server {
	t.Helper()
	Kernel(t, "ip")
	id := fmt.Sprintf("t%d-%d", os.Getpid(), seq.Add(1))
	s := &Server{
		SrvAddr: [2]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2::1")},
		CliAddr: [2]netip.Addr{netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("2001:2:0:2::2")},
		Allowed: serverAllowed, Blocked: serverBlocked,
	}
	for _, p := range []struct {
		name *string
		role string
	}{{&s.Srv, "s"}, {&s.Net, "n"}, {&s.Cli, "c"}} {
		name, remove, err := netns.Scratch(id + p.role)
		if err != nil {
			t.Fatalf("creating the server's namespaces: %v", err)
		}
		t.Cleanup(func() {
			if err := remove(); err != nil {
				t.Errorf("removing %s: %v", name, err)
			}
		})
		*p.name = name
	}
	ip := func(ns string, args string) {
		t.Helper()
		Exec(t, ns, append([]string{"ip"}, strings.Fields(args)...)...)
	}
	link := func(a, ifa, b, ifb string) {
		t.Helper()
		Exec(t, a, "ip", "link", "add", ifa, "type", "veth", "peer", "name", ifb, "netns", b)
		ip(a, "link set "+ifa+" up")
		ip(b, "link set "+ifb+" up")
	}
	for _, ns := range []string{s.Srv, s.Net, s.Cli} {
		ip(ns, "link set lo up")
		Exec(t, ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
			"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	}
	link(s.Srv, "up0", s.Net, "isp0")
	link(s.Srv, "cli0", s.Cli, "eth0")
	ip(s.Srv, "addr add 198.18.0.1/24 dev up0")
	ip(s.Srv, "addr add 2001:2::1/64 dev up0 nodad")
	ip(s.Srv, "addr add 198.18.2.1/24 dev cli0")
	ip(s.Srv, "addr add 2001:2:0:2::1/64 dev cli0 nodad")
	ip(s.Srv, "route add default via 198.18.0.2")
	ip(s.Srv, "-6 route add default via 2001:2::2")
	ip(s.Net, "addr add 198.18.0.2/24 dev isp0")
	ip(s.Net, "addr add 2001:2::2/64 dev isp0 nodad")
	for _, a := range append(s.Allowed[:], s.Blocked[:]...) {
		ip(s.Net, "addr add "+netip.PrefixFrom(a, a.BitLen()).String()+" dev lo")
	}
	ip(s.Net, "route add 198.18.2.0/24 via 198.18.0.1")
	ip(s.Net, "-6 route add 2001:2:0:2::/64 via 2001:2::1")
	ip(s.Cli, "addr add 198.18.2.2/24 dev eth0")
	ip(s.Cli, "addr add 2001:2:0:2::2/64 dev eth0 nodad")
	ip(s.Cli, "route add default via 198.18.2.1")
	ip(s.Cli, "-6 route add default via 2001:2:0:2::1")
	// IPv6 addresses are usable once none is tentative any more.
	deadline := time.Now().Add(5 * time.Second)
	for _, ns := range []string{s.Srv, s.Net, s.Cli} {
		for {
			out, err := netns.Exec(ns, "ip", "-6", "addr", "show", "tentative")
			if err == nil && strings.TrimSpace(string(out)) == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("IPv6 addresses in %s stay tentative: %s %v", ns, out, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s
}

// exchangeTimeout bounds one exchange: a dropped packet shows as a
// timeout this long.
const exchangeTimeout = 700 * time.Millisecond

// Listen starts, in namespace ns, a UDP and a TCP echo service on port
// at addr (the unspecified address: all), until t ends. A UDP datagram
// is answered with the same bytes; a TCP connection echoes each line.
func Listen(t testing.TB, ns string, addr netip.Addr, port uint16) {
	t.Helper()
	ap := netip.AddrPortFrom(addr, port).String()
	var ln net.Listener
	var pc net.PacketConn
	err := netns.Do(ns, func() (err error) {
		if ln, err = net.Listen("tcp", ap); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ap)
		return err
	})
	if err != nil {
		t.Fatalf("listening in %s on %s: %v", ns, ap, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

// Dial opens, from namespace ns (from the local address from, or the
// routed one when from is invalid), a connection to to:port over network
// ("udp" or "tcp"), within the exchange timeout.
func Dial(ns, network string, from netip.Addr, to netip.AddrPort) (net.Conn, error) {
	return DialTimeout(ns, network, from, to, exchangeTimeout)
}

// DialTimeout is Dial with its own timeout.
func DialTimeout(ns, network string, from netip.Addr, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if from.IsValid() {
		if network == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: from.AsSlice()}
		}
	}
	var c net.Conn
	err := netns.Do(ns, func() (err error) {
		c, err = d.Dial(network, to.String())
		return err
	})
	return c, err
}

// Exchange sends a line on c and waits for its echo: nil when it came
// back within the exchange timeout.
func Exchange(c net.Conn) error {
	msg := []byte("ipfence\n")
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	return nil
}

// RoundTrip dials and exchanges once, closing the connection.
func RoundTrip(ns, network string, from netip.Addr, to netip.AddrPort) error {
	c, err := Dial(ns, network, from, to)
	if err != nil {
		return err
	}
	defer c.Close()
	return Exchange(c)
}

// Refused sends a UDP datagram from ns to a port where nothing listens
// and reports whether the ICMP port-unreachable came back (the socket
// reads ECONNREFUSED).
func Refused(ns string, to netip.AddrPort) (bool, error) {
	c, err := Dial(ns, "udp", netip.Addr{}, to)
	if err != nil {
		return false, err
	}
	defer c.Close()
	err = Exchange(c)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, nil
	}
	return false, fmt.Errorf("want a refusal or a timeout: %w", err)
}
