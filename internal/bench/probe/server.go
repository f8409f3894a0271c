package probe

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// BodySize is the length of the body the HTTP servers answer GET / with.
const BodySize = 10 << 10

// serverConnTimeout bounds how long a server connection may take, from
// accept to the response written.
const serverConnTimeout = 5 * time.Second

// maxRequest bounds the request head a server reads.
const maxRequest = 8 << 10

var (
	okResponse       = buildResponse("200 OK", bytes.Repeat([]byte("ipfence-probe.\n"), BodySize/15+1)[:BodySize])
	notFoundResponse = buildResponse("404 Not Found", nil)
	badResponse      = buildResponse("400 Bad Request", nil)
)

func buildResponse(status string, body []byte) []byte {
	head := "HTTP/1.1 " + status + "\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n"
	return append([]byte(head), body...)
}

// Servers are the probe targets, running in a lab's FW namespace: a UDP
// echo server and minimal HTTP/1.1 servers, all listening on the wildcard
// address (IPv4 and IPv6). The HTTP servers answer GET / with 200 and a
// body of BodySize bytes, any other request with 404, and close every
// connection after one response; TCP connect probes use their ports too.
//
// The exported fields are read-only.
type Servers struct {
	UDPPort   int   // 0: no UDP echo server
	HTTPPorts []int // may be empty

	udp       *net.UDPConn
	listeners []net.Listener
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]bool
	// seen counts accepted connections by (client address, server port),
	// and UDP datagrams by client address with port UDPPort: tests use
	// it to check where probes came from.
	seen map[peer]int
}

type peer struct {
	addr netip.Addr
	port int
}

// StartServers starts the servers in lab.FW: a UDP echo server on udpPort
// (none when 0) and an HTTP server on each of httpPorts. It fails when a
// port is out of range or taken; on error nothing is left running.
//
// The listeners use the backlog Go takes from the host's
// net.core.somaxconn, capped by FW's own (4096 by default in a new
// namespace since Linux 5.4): ample for the accept loop, which does
// nothing but start a goroutine.
func StartServers(lab *netns.Lab, udpPort int, httpPorts []int) (*Servers, error) {
	for _, p := range append([]int{udpPort}, httpPorts...) {
		if p < 0 || p > 65535 {
			return nil, fmt.Errorf("starting probe servers: port %d out of range", p)
		}
	}
	s := &Servers{
		UDPPort:   udpPort,
		HTTPPorts: append([]int(nil), httpPorts...),
		conns:     map[net.Conn]bool{},
		seen:      map[peer]int{},
	}
	err := lab.DoFW(func() error {
		if udpPort != 0 {
			c, err := net.ListenUDP("udp", &net.UDPAddr{Port: udpPort})
			if err != nil {
				return fmt.Errorf("listening on udp port %d: %w", udpPort, err)
			}
			s.udp = c
		}
		for _, p := range httpPorts {
			if p == 0 {
				return errors.New("listening for http: port 0")
			}
			l, err := net.ListenTCP("tcp", &net.TCPAddr{Port: p})
			if err != nil {
				return fmt.Errorf("listening on tcp port %d: %w", p, err)
			}
			s.listeners = append(s.listeners, l)
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("starting probe servers: %w", err)
	}
	if s.udp != nil {
		s.wg.Go(s.echo)
	}
	for i, l := range s.listeners {
		s.wg.Go(func() { s.accept(l, httpPorts[i]) })
	}
	return s, nil
}

// Close stops the servers, closes their open connections and waits for
// all their goroutines. It returns the first error closing a socket; it is
// safe to call more than once.
func (s *Servers) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var errs []error
	if s.udp != nil {
		errs = append(errs, s.udp.Close())
	}
	for _, l := range s.listeners {
		errs = append(errs, l.Close())
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing probe servers: %w", err)
	}
	return nil
}

// seenFrom returns the counts of connections and datagrams by client
// address and server port.
func (s *Servers) seenFrom() map[peer]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[peer]int, len(s.seen))
	for k, v := range s.seen {
		m[k] = v
	}
	return m
}

func (s *Servers) count(addr netip.Addr, port int) {
	s.mu.Lock()
	s.seen[peer{addr.Unmap(), port}]++
	s.mu.Unlock()
}

// echo sends every datagram back to its sender until the socket closes.
func (s *Servers) echo() {
	buf := make([]byte, 2048)
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(time.Millisecond) // a transient error; don't spin
			continue
		}
		s.udp.WriteToUDPAddrPort(buf[:n], from)
		s.count(from.Addr(), s.UDPPort)
	}
}

// accept serves connections on l until it closes.
func (s *Servers) accept(l net.Listener, port int) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(time.Millisecond) // EMFILE and the like
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.seen[peer{c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(), port}]++
		s.mu.Unlock()
		s.wg.Go(func() {
			serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		})
	}
}

// serve reads one request head from c and writes the response. The
// caller closes c, so the server sends its FIN right after the response;
// the probes then close with a reset (SO_LINGER 0), which ends the
// server's socket too: neither side is left in TIME_WAIT.
func serve(c net.Conn) {
	c.SetDeadline(time.Now().Add(serverConnTimeout))
	buf := make([]byte, 0, 1024)
	for !bytes.Contains(buf, []byte("\r\n\r\n")) {
		if len(buf) >= maxRequest {
			c.Write(badResponse)
			return
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return // closed, reset (a connect probe) or timed out
		}
	}
	line, _, _ := bytes.Cut(buf, []byte("\r\n"))
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	switch {
	case !ok1 || !ok2 || !bytes.HasPrefix(proto, []byte("HTTP/1.")):
		c.Write(badResponse)
	case string(method) == "GET" && string(target) == "/":
		c.Write(okResponse)
	default:
		c.Write(notFoundResponse)
	}
}
