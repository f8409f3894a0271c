package netnstest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// Server is netns.Server, the server and the Internet around it, with
// the tests' hosts: Allowed 198.18.1.10 and 2001:2:0:1::10, Blocked
// 198.19.5.5 and 2001:2:0:5::5 (what each test's policy does with them
// is up to the test).
type Server = netns.Server

var (
	serverAllowed = [2]netip.Addr{netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("2001:2:0:1::10")}
	serverBlocked = [2]netip.Addr{netip.MustParseAddr("198.19.5.5"), netip.MustParseAddr("2001:2:0:5::5")}
)

// NewServer makes a Server, removed when t ends. It gates t with Kernel.
func NewServer(t testing.TB) *Server {
	t.Helper()
	Kernel(t, "ip")
	s, err := netns.NewServer(fmt.Sprintf("t%d-%d", os.Getpid(), seq.Add(1)), serverAllowed, serverBlocked)
	if err != nil {
		t.Fatalf("creating the server's namespaces: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("removing the server's namespaces: %v", err)
		}
	})
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
	go netns.ServeUDPEcho(pc)
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
