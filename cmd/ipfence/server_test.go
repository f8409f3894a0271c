package main

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// serverPolicy writes a policy that lets only Server.Allowed's network
// open connections to the server ("allow only Italy"), protecting the
// server's links, in backend with the given statelessness.
func serverPolicy(t *testing.T, dir, backend string, stateless bool) string {
	t.Helper()
	write(t, dir, "allowed.txt", "198.18.1.0/24\n2001:2:0:1::/64\n")
	write(t, dir, "p.yaml", fmt.Sprintf(`
backend: %s
interfaces: [up0]
stateless: %v
sources:
  allowed: {format: list, paths: [allowed.txt]}
protect: [198.18.0.0/24, 198.18.2.0/24, "2001:2::/64", "2001:2:0:2::/64"]
rules:
  - {name: geo, action: allow-only, match: {source: allowed}}
`, backend, stateless))
	return filepath.Join(dir, "p.yaml")
}

// TestServerKeepsWorking is the founding scenario: a server behind
// "allow only these networks" still resolves names, fetches from and
// gets ICMP errors from hosts outside them, and so do the clients it
// forwards for, IPv4 and IPv6; new connections from outside are dropped,
// from inside accepted; a ban cuts an established connection; and a
// stateless policy behaves as before (replies from outside dropped).
func TestServerKeepsWorking(t *testing.T) {
	for _, backend := range []string{"nftables", "xdp", "ipset", "iptables-split"} {
		t.Run(backend, func(t *testing.T) {
			s := netnstest.NewServer(t)
			var pins []string // apply only: bans never touch XDP
			if backend == "xdp" {
				pins = []string{"--pin-dir", netnstest.BPFFS(t)}
			}
			// UDP services bind their address: a reply must come from
			// where the query went.
			for _, a := range append(s.Blocked[:], s.Allowed[:]...) {
				netnstest.Listen(t, s.Net, a, 53)
				netnstest.Listen(t, s.Net, a, 80)
			}
			netnstest.Listen(t, s.Srv, netip.IPv6Unspecified(), 22)
			dir := t.TempDir()
			args := []string{"--netns", s.Srv, "--state", dir}
			if out, err := run(t, append(append([]string{"apply", "--policy", serverPolicy(t, dir, backend, false)}, args...), pins...)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for f, fam := range []string{"IPv4", "IPv6"} {
				blocked, allowed, srv := s.Blocked[f], s.Allowed[f], s.SrvAddr[f]
				at := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
				if err := netnstest.RoundTrip(s.Srv, "udp", netip.Addr{}, at(blocked, 53)); err != nil {
					t.Errorf("%s: the server's own DNS query to %s: %v", fam, blocked, err)
				}
				if err := netnstest.RoundTrip(s.Srv, "tcp", netip.Addr{}, at(blocked, 80)); err != nil {
					t.Errorf("%s: the server's own HTTP connection to %s: %v", fam, blocked, err)
				}
				if ok, err := netnstest.Refused(s.Srv, at(blocked, 9)); err != nil || !ok {
					t.Errorf("%s: the ICMP port-unreachable from %s for the server's own flow: arrived %v, %v", fam, blocked, ok, err)
				}
				if err := netnstest.RoundTrip(s.Cli, "tcp", netip.Addr{}, at(blocked, 80)); err != nil {
					t.Errorf("%s: a forwarded client's connection to %s: %v", fam, blocked, err)
				}
				if err := netnstest.RoundTrip(s.Net, "tcp", blocked, at(srv, 22)); err == nil {
					t.Errorf("%s: a new connection from %s, outside the allowed set, got in", fam, blocked)
				}
				if err := netnstest.RoundTrip(s.Net, "tcp", allowed, at(srv, 22)); err != nil {
					t.Errorf("%s: a new connection from the allowed %s: %v", fam, allowed, err)
				}
			}

			// status says conntrack is relied on, and XDP what it passed.
			out, err := run(t, append(append([]string{"status"}, args...), pins...)...)
			if err != nil || !strings.Contains(out, "conntrack: ") {
				t.Errorf("status: %v; want the conntrack table's fill:\n%s", err, out)
			}
			if backend == "xdp" && !strings.Contains(out, "passed: known connections") {
				t.Errorf("status does not count XDP's known-connection passes:\n%s", out)
			}

			// A ban cuts an established connection from an allowed host
			// (iptables-split has no ban sets: see TestBanWithoutDaemon).
			if backend != "iptables-split" {
				checkBanCuts(t, s, args)
			}

			// Stateless: every packet judged by its source, replies too.
			sdir := t.TempDir()
			sargs := []string{"--netns", s.Srv, "--state", sdir}
			if out, err := run(t, append(append([]string{"apply", "--policy", serverPolicy(t, sdir, backend, true)}, sargs...), pins...)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if err := netnstest.RoundTrip(s.Srv, "udp", netip.Addr{}, netip.AddrPortFrom(s.Blocked[0], 53)); err == nil {
				t.Error("stateless: the reply from outside the allowed set got in")
			}
			if err := netnstest.RoundTrip(s.Net, "tcp", s.Allowed[0], netip.AddrPortFrom(s.SrvAddr[0], 22)); err != nil {
				t.Errorf("stateless: a new connection from the allowed host: %v", err)
			}

			checkOutbound(t, s, backend, pins)
		})
	}
}

// checkBanCuts bans an allowed host with an established connection to
// the server: the connection gets no more answers.
func checkBanCuts(t *testing.T, s *netnstest.Server, args []string) {
	t.Helper()
	{
		c, err := netnstest.Dial(s.Net, "tcp", s.Allowed[0], netip.AddrPortFrom(s.SrvAddr[0], 22))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := netnstest.Exchange(c); err != nil {
			t.Fatalf("before the ban: %v", err)
		}
		if out, err := run(t, append([]string{"ban", s.Allowed[0].String(), "--ttl", "1h", "--socket", ""}, args...)...); err != nil {
			t.Fatalf("ban: %v\n%s", err, out)
		}
		if err := netnstest.Exchange(c); err == nil {
			t.Error("the banned host's established connection still gets answers")
		}
	}
}

// checkOutbound applies an outbound reject rule for the allowed hosts
// and checks that the server and its forwarded client cannot open
// connections to them, while they still can to the server (the answers
// are known connections), until allow entries let them (nftables,
// ipset); and that an outbound rule covering the server's default
// gateway is refused.
func checkOutbound(t *testing.T, s *netnstest.Server, backend string, pins []string) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"--netns", s.Srv, "--state", dir}
	pol := serverPolicy(t, dir, backend, false)
	write(t, dir, "c2.txt", s.Allowed[0].String()+"\n"+s.Allowed[1].String()+"\n")
	text := readFile(t, pol) + "  - {name: c2, action: reject, direction: out, match: {source: c2}}\n"
	text = strings.Replace(text, "sources:\n", "sources:\n  c2: {format: list, paths: [c2.txt]}\n", 1)
	write(t, dir, "p.yaml", text)
	if out, err := run(t, append(append([]string{"apply", "--policy", pol}, args...), pins...)...); err != nil {
		t.Fatalf("apply with an outbound rule: %v\n%s", err, out)
	}
	for f, fam := range []string{"IPv4", "IPv6"} {
		to := netip.AddrPortFrom(s.Allowed[f], 80)
		if err := netnstest.RoundTrip(s.Srv, "tcp", netip.Addr{}, to); err == nil {
			t.Errorf("%s: the server opened a connection to %s, which an outbound rule lists", fam, to)
		}
		if err := netnstest.RoundTrip(s.Cli, "tcp", netip.Addr{}, to); err == nil {
			t.Errorf("%s: a forwarded client opened a connection to %s, which an outbound rule lists", fam, to)
		}
		if err := netnstest.RoundTrip(s.Net, "tcp", s.Allowed[f], netip.AddrPortFrom(s.SrvAddr[f], 22)); err != nil {
			t.Errorf("%s: an outbound rule stopped a new inbound connection from %s: %v", fam, s.Allowed[f], err)
		}
		if err := netnstest.RoundTrip(s.Srv, "tcp", netip.Addr{}, netip.AddrPortFrom(s.Blocked[f], 80)); err != nil {
			t.Errorf("%s: the server's connection to an unlisted destination: %v", fam, err)
		}
	}
	if backend == "nftables" || backend == "ipset" {
		// Allow entries beat outbound rules too, by destination: the
		// server and its forwarded client reach the listed hosts again,
		// until the entries go.
		hosts := []string{s.Allowed[0].String(), s.Allowed[1].String()}
		if out, err := run(t, append(append([]string{"allow", "--ttl", "1h", "--socket", ""}, hosts...), args...)...); err != nil {
			t.Fatalf("allow: %v\n%s", err, out)
		}
		for f, fam := range []string{"IPv4", "IPv6"} {
			to := netip.AddrPortFrom(s.Allowed[f], 80)
			if err := netnstest.RoundTrip(s.Srv, "tcp", netip.Addr{}, to); err != nil {
				t.Errorf("%s: allowed, the server still cannot reach %s: %v", fam, to, err)
			}
			if err := netnstest.RoundTrip(s.Cli, "tcp", netip.Addr{}, to); err != nil {
				t.Errorf("%s: allowed, a forwarded client still cannot reach %s: %v", fam, to, err)
			}
		}
		if out, err := run(t, append(append([]string{"unallow", "--socket", ""}, hosts...), args...)...); err != nil {
			t.Fatalf("unallow: %v\n%s", err, out)
		}
		if err := netnstest.RoundTrip(s.Srv, "tcp", netip.Addr{}, netip.AddrPortFrom(s.Allowed[0], 80)); err == nil {
			t.Error("no longer allowed, the server still opened a connection to a host an outbound rule lists")
		}
	}
	// The default gateway (Net's 198.18.0.2) in an outbound rule.
	write(t, dir, "gw.txt", "198.18.0.2\n")
	write(t, dir, "gw.yaml", "backend: "+backend+"\nsources:\n  gw: {format: list, paths: [gw.txt]}\nrules:\n  - {name: c2, action: drop, direction: out, match: {source: gw}}\n")
	out, err := run(t, append(append([]string{"apply", "--policy", filepath.Join(dir, "gw.yaml")}, args...), pins...)...)
	if err == nil || !strings.Contains(out+err.Error(), "default gateway") {
		t.Errorf("an outbound rule covering the default gateway: %v\n%s; want a refusal naming it", err, out)
	}
}
