// Package probe measures latency through a firewall in a netns.Lab: the
// servers run in the lab's FW namespace (where the firewall under test is
// loaded), the probes send from Gen and time the answers. It serves the
// "geo" and "http" scenarios of `ipfence bench`.
//
// Every probe is bounded in count and in time: each request by its
// timeout, the whole run by the context. A request the firewall drops
// counts as lost or failed; a probe returns an error only when it cannot
// run (no socket in Gen, a source address Gen does not have) or when the
// context ends, and then with the results so far. Sockets are made only
// on threads that lab.DoGen switched into Gen (the TCP probes check the
// thread against Gen's namespace file), bound to a Gen address, and
// closed before a probe returns.
//
// Times are taken with the monotonic clock around the socket calls, so
// they include Go's poller waking the goroutine (some microseconds) but
// no namespace switch and no socket creation.
package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// deadline returns when a request started at now must end: after timeout,
// or at ctx's deadline if that is sooner, in which case cut is true.
func deadline(ctx context.Context, now time.Time, timeout time.Duration) (end time.Time, cut bool) {
	end = now.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		return d, true
	}
	return end, false
}

// ctxErr is ctx's error, or DeadlineExceeded when a request was cut short
// by ctx's deadline before ctx noticed.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// checkRun checks the arguments every probe takes.
func checkRun(port, n int, timeout time.Duration) error {
	switch {
	case port <= 0 || port > 65535:
		return fmt.Errorf("port %d out of range", port)
	case n < 0:
		return fmt.Errorf("negative count %d", n)
	case timeout <= 0:
		return fmt.Errorf("timeout %v not positive", timeout)
	}
	return nil
}

// udpPayload is a request: a nonce of the run and the sequence number.
const udpPayload = 16

// UDPRoundTrips sends n UDP requests one after another from Gen (source
// lab.GenAddr4) to FW's echo server on port and returns the round trip of
// each one answered within timeout, in order; the others count in lost.
// A request carries the run's nonce and its sequence number, and only the
// echo of that very request ends it: a late answer to an earlier one is
// skipped. An ICMP error (port unreachable from a reject rule, or no
// server) loses the request at once.
//
// It returns an error when it cannot create its socket, or when ctx ends
// before the n requests are done, with the results so far.
func UDPRoundTrips(ctx context.Context, lab *netns.Lab, port, n int, timeout time.Duration) (rtts []time.Duration, lost int, err error) {
	if err := checkRun(port, n, timeout); err != nil {
		return nil, 0, fmt.Errorf("probing udp: %w", err)
	}
	dst := netip.AddrPortFrom(lab.FWAddr4.Addr(), uint16(port))
	var c *net.UDPConn
	err = lab.DoGen(func() error {
		var err error
		c, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.GenAddr4.Addr(), 0)), net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("probing udp %s: %w", dst, err)
	}
	defer c.Close()
	nonce := rand.Uint64()
	req := make([]byte, udpPayload)
	buf := make([]byte, 512)
	binary.BigEndian.PutUint64(req, nonce)
	rtts = make([]time.Duration, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return rtts, lost, fmt.Errorf("probing udp %s: %w", dst, err)
		}
		binary.BigEndian.PutUint64(req[8:], uint64(i))
		start := time.Now()
		end, cut := deadline(ctx, start, timeout)
		if err := c.SetReadDeadline(end); err != nil {
			return rtts, lost, fmt.Errorf("probing udp %s: %w", dst, err)
		}
		_, err := c.Write(req)
		if errors.Is(err, syscall.ECONNREFUSED) {
			// The late ICMP error of an earlier request, reported now.
			_, err = c.Write(req)
		}
		if err != nil {
			lost++
			continue
		}
		for {
			k, err := c.Read(buf)
			if err != nil {
				if cut && errors.Is(err, os.ErrDeadlineExceeded) {
					return rtts, lost, fmt.Errorf("probing udp %s: %w", dst, ctxErr(ctx))
				}
				lost++ // timed out, or refused
				break
			}
			if k == udpPayload && bytes.Equal(buf[:k], req) {
				rtts = append(rtts, time.Since(start))
				break
			}
		}
	}
	return rtts, lost, nil
}

// TCPConnects opens n TCP connections one after another from Gen (source
// lab.GenAddr4) to FW's port and returns each connect time, from the
// SYN sent to the SYN-ACK seen, in order; a connect that fails or takes
// longer than timeout counts in failed. Each connection is reset right
// away (SO_LINGER 0), so no TIME_WAIT piles up.
//
// It returns an error when it cannot create sockets in Gen, or when ctx
// ends before the n connects are done, with the results so far.
func TCPConnects(ctx context.Context, lab *netns.Lab, port, n int, timeout time.Duration) (ds []time.Duration, failed int, err error) {
	if err := checkRun(port, n, timeout); err != nil {
		return nil, 0, fmt.Errorf("probing tcp connect: %w", err)
	}
	dst := netip.AddrPortFrom(lab.FWAddr4.Addr(), uint16(port))
	m, err := newSocketMaker(lab)
	if err != nil {
		return nil, 0, fmt.Errorf("probing tcp connect to %s: %w", dst, err)
	}
	defer m.close()
	src := lab.GenAddr4.Addr()
	ds = make([]time.Duration, 0, n)
	for range n {
		if err := ctx.Err(); err != nil {
			return ds, failed, fmt.Errorf("probing tcp connect to %s: %w", dst, err)
		}
		fd, err := m.socket(ctx, src)
		if err != nil {
			return ds, failed, fmt.Errorf("probing tcp connect to %s: %w", dst, err)
		}
		start := time.Now()
		end, cut := deadline(ctx, start, timeout)
		f, err := connect(fd, dst, end)
		d := time.Since(start)
		if err != nil {
			if cut && errors.Is(err, os.ErrDeadlineExceeded) {
				return ds, failed, fmt.Errorf("probing tcp connect to %s: %w", dst, ctxErr(ctx))
			}
			failed++
			continue
		}
		f.Close()
		ds = append(ds, d)
	}
	return ds, failed, nil
}

// Phases are the times of one HTTP request on a new connection, each from
// the start of the request (just before connect), so they add up: Complete
// is the total.
type Phases struct {
	Connect   time.Duration // connect returned: the handshake is done
	Send      time.Duration // the request is written
	FirstByte time.Duration // the first byte of the response is read
	Complete  time.Duration // the whole body is read
}

// HTTPSequential makes n requests one after another from Gen (source
// lab.GenAddr4) to FW's HTTP server on port, each on a new connection
// (Connection: close, reset after the body), and returns their phases in
// order. A request that fails, takes longer than timeout, or is answered
// by other than status 200 with a body of BodySize bytes counts in
// failed.
//
// It returns an error when it cannot create sockets in Gen, or when ctx
// ends before the n requests are done, with the results so far.
func HTTPSequential(ctx context.Context, lab *netns.Lab, port, n int, timeout time.Duration) (ps []Phases, failed int, err error) {
	if err := checkRun(port, n, timeout); err != nil {
		return nil, 0, fmt.Errorf("probing http: %w", err)
	}
	dst := netip.AddrPortFrom(lab.FWAddr4.Addr(), uint16(port))
	m, err := newSocketMaker(lab)
	if err != nil {
		return nil, 0, fmt.Errorf("probing http %s: %w", dst, err)
	}
	defer m.close()
	src := lab.GenAddr4.Addr()
	buf := make([]byte, respBuf)
	ps = make([]Phases, 0, n)
	for range n {
		if err := ctx.Err(); err != nil {
			return ps, failed, fmt.Errorf("probing http %s: %w", dst, err)
		}
		fd, err := m.socket(ctx, src)
		if err != nil {
			return ps, failed, fmt.Errorf("probing http %s: %w", dst, err)
		}
		start := time.Now()
		end, cut := deadline(ctx, start, timeout)
		p, err := get(fd, dst, start, end, buf)
		if err != nil {
			if cut && errors.Is(err, os.ErrDeadlineExceeded) {
				return ps, failed, fmt.Errorf("probing http %s: %w", dst, ctxErr(ctx))
			}
			failed++
			continue
		}
		ps = append(ps, p)
	}
	return ps, failed, nil
}

// request is what every HTTP probe sends.
var request = []byte("GET / HTTP/1.1\r\nHost: fw\r\nUser-Agent: ipfence-probe\r\nConnection: close\r\n\r\n")

// respBuf is the buffer get needs: the response head and body.
const respBuf = BodySize + 4<<10

// errResponse is a response that is not 200 with a body of BodySize.
var errResponse = errors.New("bad response")

// get makes one request on the socket fd (which it takes over and closes)
// to dst, with phases timed from start and everything done by end. buf
// holds at least respBuf bytes.
func get(fd int, dst netip.AddrPort, start, end time.Time, buf []byte) (Phases, error) {
	var p Phases
	f, err := connect(fd, dst, end)
	if err != nil {
		return p, err
	}
	defer f.Close()
	p.Connect = time.Since(start)
	if err := f.SetDeadline(end); err != nil {
		return p, err
	}
	if _, err := f.Write(request); err != nil {
		return p, fmt.Errorf("sending request to %s: %w", dst, err)
	}
	p.Send = time.Since(start)
	// Read until the head is complete and then as many body bytes as
	// Content-Length says (to the end of the stream without one).
	got, head, want := 0, -1, -1
	for {
		if got == len(buf) {
			return p, fmt.Errorf("reading response from %s: %w: longer than %d bytes", dst, errResponse, len(buf))
		}
		k, err := f.Read(buf[got:])
		if k > 0 && got == 0 {
			p.FirstByte = time.Since(start)
		}
		got += k
		if head < 0 {
			if i := bytes.Index(buf[:got], []byte("\r\n\r\n")); i >= 0 {
				head = i + 4
				if want, err = parseHead(buf[:head]); err != nil {
					return p, fmt.Errorf("reading response from %s: %w", dst, err)
				}
			}
		}
		if head >= 0 && want >= 0 && got-head >= want {
			p.Complete = time.Since(start)
			break
		}
		if err == io.EOF && head >= 0 && want < 0 {
			p.Complete = time.Since(start)
			want = got - head
			break
		}
		if err == io.EOF {
			return p, fmt.Errorf("reading response from %s: %w: cut short", dst, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return p, fmt.Errorf("reading response from %s: %w", dst, err)
		}
	}
	if want != BodySize {
		return p, fmt.Errorf("reading response from %s: %w: body of %d bytes, want %d", dst, errResponse, want, BodySize)
	}
	return p, nil
}

// parseHead checks that the response head is status 200 and returns its
// Content-Length, -1 if it has none.
func parseHead(head []byte) (int, error) {
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	status := lines[0]
	if !bytes.HasPrefix(status, []byte("HTTP/1.")) || len(status) < 12 || status[8] != ' ' {
		return 0, fmt.Errorf("%w: status line %q", errResponse, status)
	}
	if string(status[9:12]) != "200" {
		return 0, fmt.Errorf("%w: status %s", errResponse, status[9:])
	}
	length := -1
	for _, l := range lines[1:] {
		name, value, ok := bytes.Cut(l, []byte(":"))
		if !ok || !bytes.EqualFold(bytes.TrimSpace(name), []byte("Content-Length")) {
			continue
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(value)))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%w: Content-Length %q", errResponse, value)
		}
		length = n
	}
	return length, nil
}
