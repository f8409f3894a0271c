package probe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

const (
	udpPort   = 7
	httpPort  = 8080
	httpPort2 = 8081
)

// startServers starts the probe servers in lab and stops them with the test.
func startServers(t *testing.T, lab *netns.Lab, udp int, http ...int) *Servers {
	t.Helper()
	s, err := StartServers(lab, udp, http)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing servers: %v", err)
		}
	})
	return s
}

// loadNFT loads an nft script into lab.FW.
func loadNFT(t *testing.T, lab *netns.Lab, script string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := netns.Exec(lab.FW, "nft", "-f", file); err != nil {
		t.Fatalf("loading ruleset: %v\n%s", err, out)
	}
}

// dropRules is a firewall in FW's input hook that drops what rules match.
func dropRules(rules ...string) string {
	return "table inet probetest {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\t" +
		strings.Join(rules, "\n\t\t") + "\n\t}\n}\n"
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// plausible fails t unless every d is in (0, 1s).
func plausible(t *testing.T, what string, ds []time.Duration) {
	t.Helper()
	for i, d := range ds {
		if d <= 0 || d >= time.Second {
			t.Errorf("%s %d: %v, want in (0, 1s)", what, i, d)
		}
	}
}

func TestProbesWithoutFirewall(t *testing.T) {
	lab := netnstest.New(t)
	s := startServers(t, lab, udpPort, httpPort, httpPort2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	timeout := 500 * time.Millisecond

	rtts, lost, err := UDPRoundTrips(ctx, lab, udpPort, 200, timeout)
	if err != nil || lost != 0 || len(rtts) != 200 {
		t.Fatalf("UDPRoundTrips = %d rtts, %d lost, %v; want 200, 0, nil", len(rtts), lost, err)
	}
	plausible(t, "udp rtt", rtts)

	ds, failed, err := TCPConnects(ctx, lab, httpPort2, 200, timeout)
	if err != nil || failed != 0 || len(ds) != 200 {
		t.Fatalf("TCPConnects = %d, %d failed, %v; want 200, 0, nil", len(ds), failed, err)
	}
	plausible(t, "tcp connect", ds)

	ps, failed, err := HTTPSequential(ctx, lab, httpPort, 100, timeout)
	if err != nil || failed != 0 || len(ps) != 100 {
		t.Fatalf("HTTPSequential = %d, %d failed, %v; want 100, 0, nil", len(ps), failed, err)
	}
	var complete []time.Duration
	for i, p := range ps {
		if !(0 < p.Connect && p.Connect <= p.Send && p.Send <= p.FirstByte && p.FirstByte <= p.Complete && p.Complete < time.Second) {
			t.Errorf("request %d: phases %+v not increasing within (0, 1s)", i, p)
		}
		complete = append(complete, p.Complete)
	}
	t.Logf("median: udp rtt %v, tcp connect %v, http complete %v", median(rtts), median(ds), median(complete))

	// Everything came from Gen's lab address: the sockets were in Gen.
	gen := lab.GenAddr4.Addr()
	want := map[peer]int{{gen, udpPort}: 200, {gen, httpPort2}: 200, {gen, httpPort}: 100}
	if got := s.seenFrom(); !mapsEqual(got, want) {
		t.Errorf("servers saw %v, want %v", got, want)
	}
}

func mapsEqual(a, b map[peer]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// nsInode returns the inode of the network namespace socket fd is in.
func nsInode(fd int) (uint64, error) {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return 0, fmt.Errorf("SIOCGSKNS: %w", err)
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func TestSocketsInGen(t *testing.T) {
	lab := netnstest.New(t)
	startServers(t, lab, 0, httpPort)
	var gen, host unix.Stat_t
	if err := unix.Stat(netns.Path(lab.Gen), &gen); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	m, err := newSocketMaker(lab)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	// Sockets made from many goroutines (on many threads) are all in Gen.
	errs := make(chan error, 50)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			fd, err := m.socket(context.Background(), lab.GenAddr4.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer unix.Close(fd)
			ino, err := nsInode(fd)
			if err != nil {
				errs <- err
				return
			}
			if ino != gen.Ino || ino == host.Ino {
				errs <- fmt.Errorf("socket in namespace %d, want Gen's %d (host is %d)", ino, gen.Ino, host.Ino)
				return
			}
			errs <- nil
		})
	}
	wg.Wait()
	for range 50 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// A connected socket has Gen's address.
	fd, err := m.socket(context.Background(), lab.GenAddr4.Addr())
	if err != nil {
		t.Fatal(err)
	}
	f, err := connect(fd, netip.AddrPortFrom(lab.FWAddr4.Addr(), httpPort), time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if a := netip.AddrFrom4(sa.(*unix.SockaddrInet4).Addr); a != lab.GenAddr4.Addr() {
		t.Errorf("local address %v, want %v", a, lab.GenAddr4.Addr())
	}
	// Gen's addresses are not the host's: binding one there fails.
	if _, err := tcpSocket(lab.GenAddr4.Addr()); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Errorf("binding %v on the host: %v, want EADDRNOTAVAIL", lab.GenAddr4.Addr(), err)
	}
}

func TestFirewallDrops(t *testing.T) {
	lab := netnstest.New(t)
	startServers(t, lab, udpPort, httpPort, httpPort2)
	loadNFT(t, lab, dropRules(fmt.Sprintf("udp dport %d drop", udpPort), fmt.Sprintf("tcp dport %d drop", httpPort2)))
	ctx := context.Background()
	const n, timeout = 5, 50 * time.Millisecond
	// Lost and failed requests cost their timeout, no more.
	quick := func(what string, start time.Time) {
		t.Helper()
		if el := time.Since(start); el > n*timeout+300*time.Millisecond {
			t.Errorf("%s took %v, want about %v", what, el, n*timeout)
		}
	}

	start := time.Now()
	rtts, lost, err := UDPRoundTrips(ctx, lab, udpPort, n, timeout)
	if err != nil || lost != n || len(rtts) != 0 {
		t.Errorf("UDPRoundTrips to dropped port = %v, %d lost, %v; want none, %d, nil", rtts, lost, err, n)
	}
	quick("UDPRoundTrips", start)

	start = time.Now()
	ds, failed, err := TCPConnects(ctx, lab, httpPort2, n, timeout)
	if err != nil || failed != n || len(ds) != 0 {
		t.Errorf("TCPConnects to dropped port = %v, %d failed, %v; want none, %d, nil", ds, failed, err, n)
	}
	quick("TCPConnects", start)

	start = time.Now()
	ps, failed, err := HTTPSequential(ctx, lab, httpPort2, n, timeout)
	if err != nil || failed != n || len(ps) != 0 {
		t.Errorf("HTTPSequential to dropped port = %v, %d failed, %v; want none, %d, nil", ps, failed, err, n)
	}
	quick("HTTPSequential", start)

	// The other port still answers.
	ds, failed, err = TCPConnects(ctx, lab, httpPort, n, timeout)
	if err != nil || failed != 0 || len(ds) != n {
		t.Errorf("TCPConnects to open port = %d, %d failed, %v; want %d, 0, nil", len(ds), failed, err, n)
	}
	ps, failed, err = HTTPSequential(ctx, lab, httpPort, n, timeout)
	if err != nil || failed != 0 || len(ps) != n {
		t.Errorf("HTTPSequential to open port = %d, %d failed, %v; want %d, 0, nil", len(ps), failed, err, n)
	}
}

// A port without a server answers at once (ICMP port unreachable, TCP
// reset): lost and failed without waiting for the timeout.
func TestRefusedFailsFast(t *testing.T) {
	lab := netnstest.New(t)
	ctx := context.Background()
	const n, timeout = 5, time.Second
	start := time.Now()
	rtts, lost, err := UDPRoundTrips(ctx, lab, udpPort, n, timeout)
	if err != nil || lost != n || len(rtts) != 0 {
		t.Errorf("UDPRoundTrips to closed port = %v, %d lost, %v; want none, %d, nil", rtts, lost, err, n)
	}
	ds, failed, err := TCPConnects(ctx, lab, httpPort, n, timeout)
	if err != nil || failed != n || len(ds) != 0 {
		t.Errorf("TCPConnects to closed port = %v, %d failed, %v; want none, %d, nil", ds, failed, err, n)
	}
	if el := time.Since(start); el > timeout/2 {
		t.Errorf("took %v, want well under the timeout %v", el, timeout)
	}
}

// A late answer to an earlier request never ends a later one.
func TestUDPLateAnswer(t *testing.T) {
	lab := netnstest.New(t)
	const timeout = 100 * time.Millisecond
	var c *net.UDPConn
	err := lab.DoFW(func() error {
		var err error
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer func() { c.Close(); <-done }()
	// Request 0 is answered late (during request 1), request 1 never,
	// request 2 at once.
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n != udpPayload {
				continue
			}
			msg := slices.Clone(buf[:n])
			switch binary.BigEndian.Uint64(msg[8:]) {
			case 0:
				time.AfterFunc(timeout*3/2, func() { c.WriteToUDPAddrPort(msg, from) })
			case 1:
			default:
				c.WriteToUDPAddrPort(msg, from)
			}
		}
	}()
	rtts, lost, err := UDPRoundTrips(context.Background(), lab, udpPort, 3, timeout)
	if err != nil || lost != 2 || len(rtts) != 1 {
		t.Fatalf("UDPRoundTrips = %v, %d lost, %v; want 1 rtt, 2 lost, nil", rtts, lost, err)
	}
	if rtts[0] >= timeout/2 {
		t.Errorf("rtt of request 2 %v, want well under %v", rtts[0], timeout)
	}
}

// serveRaw runs a TCP server in FW on port that answers every connection
// with resp, after reading the request head.
func serveRaw(t *testing.T, lab *netns.Lab, port int, resp string) {
	t.Helper()
	var l net.Listener
	err := lab.DoFW(func() error {
		var err error
		l, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 1024)
			got := 0
			for !strings.Contains(string(buf[:got]), "\r\n\r\n") && got < len(buf) {
				n, err := c.Read(buf[got:])
				got += n
				if err != nil {
					break
				}
			}
			c.Write([]byte(resp))
			c.Close()
		}
	}()
}

func TestHTTPBadResponses(t *testing.T) {
	lab := netnstest.New(t)
	body := strings.Repeat("b", BodySize)
	head := func(status string, length int) string {
		h := "HTTP/1.1 " + status + "\r\nConnection: close\r\n"
		if length >= 0 {
			h += fmt.Sprintf("content-length: %d\r\n", length)
		}
		return h + "\r\n"
	}
	for i, tc := range []struct {
		name string
		resp string
		ok   bool
	}{
		{"good", head("200 OK", BodySize) + body, true},
		{"good without length", head("200 OK", -1) + body, true},
		{"status 500", head("500 Internal Server Error", BodySize) + body, false},
		{"status 404", head("404 Not Found", 0), false},
		{"short body", head("200 OK", 100) + body[:100], false},
		{"long body", head("200 OK", BodySize+1) + body + "b", false},
		{"long body without length", head("200 OK", -1) + body + "b", false},
		{"cut short", head("200 OK", BodySize) + body[:1000], false},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", false},
		{"no head", "", false},
	} {
		port := 9000 + i
		serveRaw(t, lab, port, tc.resp)
		ps, failed, err := HTTPSequential(context.Background(), lab, port, 2, 200*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.ok && (len(ps) != 2 || failed != 0) || !tc.ok && (len(ps) != 0 || failed != 2) {
			t.Errorf("%s: %d ok, %d failed; want ok %v", tc.name, len(ps), failed, tc.ok)
		}
	}
}

func TestContextBoundsProbes(t *testing.T) {
	lab := netnstest.New(t)
	startServers(t, lab, udpPort, httpPort)
	loadNFT(t, lab, dropRules(fmt.Sprintf("udp dport %d drop", udpPort), fmt.Sprintf("tcp dport %d drop", httpPort)))
	for _, probe := range []struct {
		name string
		run  func(ctx context.Context) (int, error)
	}{
		{"udp", func(ctx context.Context) (int, error) {
			_, lost, err := UDPRoundTrips(ctx, lab, udpPort, 1000, time.Second)
			return lost, err
		}},
		{"tcp", func(ctx context.Context) (int, error) {
			_, failed, err := TCPConnects(ctx, lab, httpPort, 1000, time.Second)
			return failed, err
		}},
		{"http", func(ctx context.Context) (int, error) {
			_, failed, err := HTTPSequential(ctx, lab, httpPort, 1000, time.Second)
			return failed, err
		}},
		{"open loop", func(ctx context.Context) (int, error) {
			_, errs, err := OpenLoop(ctx, lab, []netip.Addr{lab.GenAddr4.Addr()}, []int{httpPort}, 100, time.Minute, time.Second)
			return errs, err
		}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		start := time.Now()
		failed, err := probe.run(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || failed != 0 {
			t.Errorf("%s: %d failed, %v; want 0 and the context's deadline", probe.name, failed, err)
		}
		if el := time.Since(start); el > 500*time.Millisecond {
			t.Errorf("%s took %v, want about the context's 150ms", probe.name, el)
		}
	}
}

func TestAddClients(t *testing.T) {
	lab := netnstest.New(t)
	if _, err := AddClients(lab, 0); err == nil {
		t.Error("AddClients(0) succeeded")
	}
	if _, err := AddClients(lab, MaxClients+1); err == nil {
		t.Error("AddClients(MaxClients+1) succeeded")
	}
	for range 2 { // a second call changes nothing
		addrs, err := AddClients(lab, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 1000 || addrs[0] != netip.MustParseAddr("198.19.0.1") || addrs[999] != netip.MustParseAddr("198.19.3.232") {
			t.Fatalf("addresses %v ... %v (%d), want 198.19.0.1 ... 198.19.3.232 (1000)", addrs[0], addrs[len(addrs)-1], len(addrs))
		}
	}
	err := lab.DoGen(func() error {
		link, err := netlink.LinkByName(lab.GenIf)
		if err != nil {
			return err
		}
		list, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(list) != 1001 {
			return fmt.Errorf("%s has %d IPv4 addresses, want 1001", lab.GenIf, len(list))
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	err = lab.DoFW(func() error {
		routes, err := netlink.RouteGet(net.ParseIP("198.19.3.232"))
		if err != nil {
			return err
		}
		if len(routes) != 1 || !routes[0].Gw.Equal(lab.GenAddr4.Addr().AsSlice()) || routes[0].LinkIndex != lab.FWIndex {
			return fmt.Errorf("route to 198.19.3.232 in FW: %+v, want via %v on %s", routes, lab.GenAddr4.Addr(), lab.FWIf)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

func TestOpenLoop(t *testing.T) {
	lab := netnstest.New(t)
	s := startServers(t, lab, 0, httpPort, httpPort2)
	clients, err := AddClients(lab, 10)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ports := []int{httpPort, httpPort2}
	start := time.Now()
	lat, errs, err := OpenLoop(ctx, lab, clients, ports, 200, 2*time.Second, time.Second)
	el := time.Since(start)
	if err != nil || errs != 0 || len(lat) != 400 {
		t.Fatalf("OpenLoop = %d latencies, %d errors, %v; want 400, 0, nil", len(lat), errs, err)
	}
	plausible(t, "latency", lat)
	if el < 2*time.Second-10*time.Millisecond || el > 3*time.Second { // the last is due at 1.995s
		t.Errorf("OpenLoop for 2s took %v", el)
	}
	t.Logf("open loop 200/s: median %v, max %v", median(lat), slices.Max(lat))
	// Every client met every port, equally often, from its own address.
	want := map[peer]int{}
	for _, c := range clients {
		for _, p := range ports {
			want[peer{c, p}] = 20
		}
	}
	if got := s.seenFrom(); !mapsEqual(got, want) {
		t.Errorf("servers saw %v, want %v", got, want)
	}

	// Drop one client: a tenth of the requests fail.
	loadNFT(t, lab, dropRules("ip saddr "+clients[2].String()+" drop"))
	lat, errs, err = OpenLoop(ctx, lab, clients, ports, 200, time.Second, 500*time.Millisecond) // room for a busy machine: a dropped client times out whatever the bound
	if err != nil || errs != 20 || len(lat) != 180 {
		t.Errorf("OpenLoop with a client dropped = %d latencies, %d errors, %v; want 180, 20, nil", len(lat), errs, err)
	}
}

// Requests beyond the bound in flight count as errors, and do not wait.
func TestOpenLoopInFlightBound(t *testing.T) {
	lab := netnstest.New(t)
	startServers(t, lab, 0, httpPort)
	loadNFT(t, lab, dropRules(fmt.Sprintf("tcp dport %d drop", httpPort)))
	start := time.Now()
	lat, errs, err := openLoop(context.Background(), lab, []netip.Addr{lab.GenAddr4.Addr()}, []int{httpPort}, 100, 500*time.Millisecond, 200*time.Millisecond, 2)
	if err != nil || errs != 50 || len(lat) != 0 {
		t.Errorf("openLoop = %d latencies, %d errors, %v; want 0, 50, nil", len(lat), errs, err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("took %v, want about 700ms", el)
	}
}

func TestOpenLoopUnknownSource(t *testing.T) {
	lab := netnstest.New(t)
	startServers(t, lab, 0, httpPort)
	srcs := []netip.Addr{lab.GenAddr4.Addr(), netip.MustParseAddr("198.19.9.9")}
	lat, errs, err := OpenLoop(context.Background(), lab, srcs, []int{httpPort}, 100, time.Second, time.Second)
	if !errors.Is(err, unix.EADDRNOTAVAIL) || lat != nil || errs != 0 {
		t.Errorf("OpenLoop from an address Gen lacks = %v, %d, %v; want nil, 0, EADDRNOTAVAIL", lat, errs, err)
	}
}

// Close returns at once even with a client connected and silent.
func TestServersClose(t *testing.T) {
	lab := netnstest.New(t)
	s, err := StartServers(lab, udpPort, []int{httpPort})
	if err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	err = lab.DoGen(func() error {
		var err error
		c, err = net.Dial("tcp4", netip.AddrPortFrom(lab.FWAddr4.Addr(), httpPort).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(20 * time.Millisecond) // let the server accept it
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("Close took %v", el)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := StartServers(lab, udpPort, []int{httpPort}); err != nil {
		t.Errorf("ports not free after Close: %v", err)
	}
}

func TestParseHead(t *testing.T) {
	for _, tc := range []struct {
		head string
		want int // -2: error
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 10240\r\n\r\n", 10240},
		{"HTTP/1.0 200 OK\r\ncontent-length:5\r\n\r\n", 5},
		{"HTTP/1.1 200 OK\r\n\r\n", -1},
		{"HTTP/1.1 200\r\n\r\n", -1},
		{"HTTP/1.1 204 No Content\r\n\r\n", -2},
		{"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", -2},
		{"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", -2},
		{"HTTP/2 200\r\n\r\n", -2},
		{"\r\n\r\n", -2},
	} {
		got, err := parseHead([]byte(tc.head))
		if err != nil {
			got = -2
			if !errors.Is(err, errResponse) {
				t.Errorf("parseHead(%q): error %v not errResponse", tc.head, err)
			}
		}
		if got != tc.want {
			t.Errorf("parseHead(%q) = %d, %v; want %d", tc.head, got, err, tc.want)
		}
	}
}

func FuzzParseHead(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 10240"))
	f.Add([]byte("HTTP/1.1 404"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseHead(append(b, "\r\n\r\n"...))
		if err == nil && n < -1 {
			t.Errorf("length %d", n)
		}
	})
}
