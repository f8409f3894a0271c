package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Server is a server and the Internet around it, each a namespace of
// its own: Srv (the host under test, where a policy is applied) has a
// default route to Net, which holds the hosts of Allowed and Blocked as
// local addresses, and forwards for Cli, a client behind Srv (a
// container or VM it routes for). Srv's and Cli's addresses are in
// 198.18.0.0/15 and 2001:2::/48; the hosts in Net are whatever the caller
// gives (the names say what a policy is to do with them), and exist only
// inside Net.
//
// The exported fields are read-only after NewServer.
type Server struct {
	Srv, Net, Cli string // namespace names
	// SrvAddr and CliAddr are Srv's uplink and Cli's addresses, IPv4
	// and IPv6.
	SrvAddr, CliAddr [2]netip.Addr
	// Allowed and Blocked are hosts in Net, IPv4 and IPv6.
	Allowed, Blocked [2]netip.Addr

	removes []func() error
}

// Server address plan: Srv–Net 198.18.0.0/24 and 2001:2::/64, Srv–Cli
// 198.18.2.0/24 and 2001:2:0:2::/64, Net's hosts on its loopback.
var (
	srvAddr = [2]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2::1")}
	cliAddr = [2]netip.Addr{netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("2001:2:0:2::2")}
)

// NewServer creates the namespaces of a Server (named like a lab's,
// Prefix + name + "-s", "-n", "-c" + "-fw", so that Sweep removes them
// should this process die) with allowed and blocked (an IPv4 and an IPv6
// address each) as Net's hosts. It waits until no IPv6 address is
// tentative. On any error nothing is left behind; Close removes it all.
func NewServer(name string, allowed, blocked [2]netip.Addr) (*Server, error) {
	for _, a := range append(allowed[:], blocked[:]...) {
		if !a.IsValid() {
			return nil, fmt.Errorf("creating server %s: a host address is missing", name)
		}
	}
	s := &Server{SrvAddr: srvAddr, CliAddr: cliAddr, Allowed: allowed, Blocked: blocked}
	if err := s.setup(name); err != nil {
		return nil, errors.Join(fmt.Errorf("creating server %s: %w", name, err), s.Close())
	}
	return s, nil
}

func (s *Server) setup(name string) error {
	for _, p := range []struct {
		name *string
		role string
	}{{&s.Srv, "s"}, {&s.Net, "n"}, {&s.Cli, "c"}} {
		ns, remove, err := Scratch(name + p.role)
		if err != nil {
			return err
		}
		s.removes = append(s.removes, remove)
		*p.name = ns
	}
	var cmds [][]string
	ip := func(ns, args string) { cmds = append(cmds, append([]string{ns, "ip"}, strings.Fields(args)...)) }
	link := func(a, ifa, b, ifb string) {
		cmds = append(cmds, []string{a, "ip", "link", "add", ifa, "type", "veth", "peer", "name", ifb, "netns", b})
		ip(a, "link set "+ifa+" up")
		ip(b, "link set "+ifb+" up")
	}
	for _, ns := range []string{s.Srv, s.Net, s.Cli} {
		ip(ns, "link set lo up")
		cmds = append(cmds, []string{ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
			"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"})
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
	for _, c := range cmds {
		if _, err := Exec(c[0], c[1:]...); err != nil {
			return err
		}
	}
	// IPv6 addresses are usable once none is tentative any more.
	deadline := time.Now().Add(5 * time.Second)
	for _, ns := range []string{s.Srv, s.Net, s.Cli} {
		for {
			out, err := Exec(ns, "ip", "-6", "addr", "show", "tentative")
			if err == nil && strings.TrimSpace(string(out)) == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("IPv6 addresses in %s stay tentative: %s %v", ns, out, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// Close removes the server's namespaces, and with them its links. It is
// safe to call more than once.
func (s *Server) Close() error {
	var errs []error
	for _, remove := range s.removes {
		errs = append(errs, remove())
	}
	s.removes = nil
	return errors.Join(errs...)
}

// ServeUDPEcho answers each datagram on pc with the same bytes, until pc
// is closed: a resolver's stand-in for tests and benchmarks.
func ServeUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}
