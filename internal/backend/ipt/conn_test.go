package ipt_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
)

// Real connections between the lab's namespaces: gen has a second
// address of each family (friend, in the allow-only set) beside its own
// (peer, outside it).
var (
	peers   = [2]netip.Addr{netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("2001:2::2")}
	friends = [2]netip.Addr{netip.MustParseAddr("198.18.0.3"), netip.MustParseAddr("2001:2::3")}
	fws     = [2]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2::1")}
)

const (
	echoPort   = 7000 // TCP and UDP echo, in gen and fw
	closedPort = 7009 // nothing listens: ICMP port unreachable
	// blocked is how long a connection attempt or an answer that the
	// firewall drops is waited for (the veth loses nothing else).
	blocked = 600 * time.Millisecond
	passed  = 3 * time.Second
)

// echo serves TCP and UDP echo on echoPort of addrs in namespace ns
// until the test ends.
func echo(t *testing.T, ns string, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		netnstest.Listen(t, ns, a, echoPort)
	}
}

// roundTrip sends msg on c and waits up to timeout for it to come back.
func roundTrip(c net.Conn, msg string, timeout time.Duration) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, sent %q", buf, msg)
	}
	return nil
}

// conn is what a connection attempt from one namespace to another
// should meet.
type conn struct {
	what    string
	ns      string
	network string
	local   netip.Addr
	dst     netip.AddrPort
	pass    bool
}

// check opens c and sends one echo over it: it must come back when c
// should pass, and the connection (TCP) or the echo (UDP) must get no
// answer otherwise. It returns the open connection, or nil.
func (c conn) check(t *testing.T) net.Conn {
	t.Helper()
	timeout := blocked
	if c.pass {
		timeout = passed
	}
	nc, err := netnstest.DialTimeout(c.ns, c.network, c.local, c.dst, timeout)
	if err == nil {
		t.Cleanup(func() { nc.Close() })
		err = roundTrip(nc, c.what, timeout)
	}
	var ne net.Error
	switch {
	case c.pass && err != nil:
		t.Errorf("%s: %v, want an answer", c.what, err)
	case !c.pass && err == nil:
		t.Errorf("%s: answered, want no answer", c.what)
	case !c.pass && !(errors.As(err, &ne) && ne.Timeout()):
		t.Errorf("%s: %v, want a timeout", c.what, err)
	}
	if err != nil {
		return nil
	}
	return nc
}

// TestConnections runs real TCP and UDP connections through each
// iptables backend and flavour: with a connection-aware allow-only rule
// the firewall's own connections to a peer outside the set get their
// answers (and an ICMP port unreachable comes back), while new
// connections from that peer are dropped and from a member accepted; an
// outbound rule blocks new connections to its set but not from it; a
// ban cuts an established connection; a stateless allow-only rule drops
// the replies again, as before conntrack.
func TestConnections(t *testing.T) {
	eachBackend(t, func(t *testing.T, lab *netns.Lab, tc backendCase) { testConnections(t, lab, tc.backend, tc.flavour) })
}

func testConnections(t *testing.T, lab *netns.Lab, backend plan.Backend, flavour string) {
	ctx := context.Background()
	netnstest.Exec(t, lab.Gen, "ip", "addr", "add", friends[0].String()+"/24", "dev", lab.GenIf)
	netnstest.Exec(t, lab.Gen, "ip", "addr", "add", friends[1].String()+"/64", "dev", lab.GenIf, "nodad")
	echo(t, lab.Gen, append(peers[:], friends[:]...)...)
	echo(t, lab.FW, fws[:]...)
	o := ipt.Options{NetNS: lab.FW, Flavour: flavour}
	load := func(rules ...plan.RuleInput) *ipt.Program {
		t.Helper()
		p, err := plan.Compile(&plan.Input{Backend: backend, Rules: rules}, plan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		prog, err := ipt.FromPlan(p, ipt.LowerOptions{Flavour: flavour, Bans: backend == plan.IPSet})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ipt.Apply(ctx, prog, o); err != nil {
			t.Fatal(err)
		}
		return prog
	}
	members := set(t, friends[0].String(), friends[1].String())
	prog := load(
		plan.RuleInput{Name: "members", Action: plan.AllowOnly, IPv4: true, IPv6: true, Set: members},
		plan.RuleInput{Name: "egress", Action: plan.Drop, Direction: plan.Outbound, IPv4: true, IPv6: true, Set: members})
	var open []net.Conn // the firewall's TCP connections to the peers
	for f := range 2 {
		peer, friend, fw := peers[f], friends[f], fws[f]
		for _, c := range []conn{
			{fmt.Sprintf("fw's TCP connection to %s outside the set", peer), lab.FW, "tcp", netip.Addr{}, netip.AddrPortFrom(peer, echoPort), true},
			{fmt.Sprintf("fw's UDP flow to %s outside the set", peer), lab.FW, "udp", netip.Addr{}, netip.AddrPortFrom(peer, echoPort), true},
			{fmt.Sprintf("new TCP connection from %s outside the set", peer), lab.Gen, "tcp", peer, netip.AddrPortFrom(fw, echoPort), false},
			{fmt.Sprintf("new UDP flow from %s outside the set", peer), lab.Gen, "udp", peer, netip.AddrPortFrom(fw, echoPort), false},
			{fmt.Sprintf("new TCP connection from member %s", friend), lab.Gen, "tcp", friend, netip.AddrPortFrom(fw, echoPort), true},
			{fmt.Sprintf("new UDP flow from member %s", friend), lab.Gen, "udp", friend, netip.AddrPortFrom(fw, echoPort), true},
			{fmt.Sprintf("fw's TCP connection to %s, listed outbound", friend), lab.FW, "tcp", netip.Addr{}, netip.AddrPortFrom(friend, echoPort), false},
		} {
			if nc := c.check(t); nc != nil && c.network == "tcp" && c.dst.Addr() == peer {
				open = append(open, nc)
			}
		}
		// The peer's ICMP port unreachable for fw's own UDP flow.
		nc, err := netnstest.DialTimeout(lab.FW, "udp", netip.Addr{}, netip.AddrPortFrom(peer, closedPort), passed)
		if err != nil {
			t.Fatal(err)
		}
		if err := roundTrip(nc, "x", passed); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("fw's UDP flow to %s's closed port: %v, want the ICMP error (connection refused)", peer, err)
		}
		nc.Close()
	}
	st, err := ipt.ReadStatus(ctx, prog.Prefix, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range st.Rules {
		if rc.Rule == "members" && (rc.In.Packets < 4 || rc.Out.Packets != 0) || rc.Rule == "egress" && (rc.Out.Packets < 2 || rc.In.Packets != 0) {
			t.Errorf("status: rule %s counted %+v inbound, %+v outbound", rc.Rule, rc.In, rc.Out)
		}
	}
	if len(st.Rules) != 2 {
		t.Errorf("status: %+v", st.Rules)
	}
	if ok, err := ipt.InForce(ctx, prog, o); err != nil || !ok {
		t.Errorf("InForce = %v, %v; want true", ok, err)
	}
	if len(open) != 2 {
		t.Fatalf("%d open connections, want 2", len(open))
	}

	if backend == plan.IPSet {
		for _, nc := range open {
			if err := roundTrip(nc, "before the ban", passed); err != nil {
				t.Errorf("established connection to %s: %v", nc.RemoteAddr(), err)
			}
		}
		bans := []ipt.BanEntry{{Prefix: netip.PrefixFrom(peers[0], 32)}, {Prefix: netip.PrefixFrom(peers[1], 128)}}
		if err := ipt.Ban(ctx, prog.Prefix, o, bans, nil); err != nil {
			t.Fatal(err)
		}
		var ne net.Error
		for _, nc := range open {
			if err := roundTrip(nc, "after the ban", blocked); !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("established connection to banned %s: %v, want no answer", nc.RemoteAddr(), err)
			}
		}
		if err := ipt.Ban(ctx, prog.Prefix, o, nil, []netip.Prefix{bans[0].Prefix, bans[1].Prefix}); err != nil {
			t.Fatal(err)
		}
	}
	for _, nc := range open {
		nc.Close()
	}

	// What InForce checks includes the mangle table's jumps.
	netnstest.Exec(t, lab.FW, "ip6tables-"+flavour, "-w", "-t", "mangle", "-F", "OUTPUT")
	if ok, err := ipt.InForce(ctx, prog, o); err != nil || ok {
		t.Errorf("mangle OUTPUT flushed: InForce = %v, %v; want false", ok, err)
	}

	// Stateless: replies are judged by their source again.
	load(plan.RuleInput{Name: "members", Action: plan.AllowOnly, Stateless: true, IPv4: true, IPv6: true, Set: members})
	for f := range 2 {
		for _, c := range []conn{
			{fmt.Sprintf("fw's TCP connection to %s outside the stateless set", peers[f]), lab.FW, "tcp", netip.Addr{}, netip.AddrPortFrom(peers[f], echoPort), false},
			{fmt.Sprintf("fw's UDP flow to %s outside the stateless set", peers[f]), lab.FW, "udp", netip.Addr{}, netip.AddrPortFrom(peers[f], echoPort), false},
			{fmt.Sprintf("new TCP connection from member %s, stateless", friends[f]), lab.Gen, "tcp", friends[f], netip.AddrPortFrom(fws[f], echoPort), true},
		} {
			c.check(t)
		}
	}
	if found, err := ipt.Flush(ctx, prog.Prefix, o); err != nil || !found {
		t.Fatalf("flush: %v, %v", found, err)
	}
	for _, table := range []string{"raw", "mangle", "filter"} {
		for _, cmd := range []string{"iptables-", "ip6tables-"} {
			if out := netnstest.Exec(t, lab.FW, cmd+flavour+"-save", "-t", table); strings.Contains(out, prog.Prefix) {
				t.Errorf("after flush, %s %s:\n%s", cmd, table, out)
			}
		}
	}
}
