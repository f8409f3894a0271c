package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// A socket belongs to the network namespace of the thread that created
// it, for good: creating one on a thread outside Gen would make a probe
// talk to the host's network. So the TCP probes never create sockets on
// their own goroutines. A socketMaker owns one OS thread that lab.DoGen
// switched into Gen and that stays there, locked, until close; it checks
// that once, then creates every socket on request: socket(2), options and
// bind(2), a few microseconds. The probes then connect, write and read
// from any goroutine, through Go's poller, with no namespace switch (nor
// handing over to a locked thread) inside the times they measure.

// socketMaker creates TCP sockets in a lab's Gen namespace.
type socketMaker struct {
	reqs chan socketReq
	done chan error
}

type socketReq struct {
	src   netip.Addr
	reply chan socketReply
}

type socketReply struct {
	fd  int
	err error
}

// newSocketMaker starts the socket-making thread in lab.Gen.
func newSocketMaker(lab *netns.Lab) (*socketMaker, error) {
	m := &socketMaker{reqs: make(chan socketReq), done: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		m.done <- lab.DoGen(func() error {
			if err := checkThreadNS(netns.Path(lab.Gen)); err != nil {
				started <- err
				return err
			}
			started <- nil
			for r := range m.reqs {
				fd, err := tcpSocket(r.src)
				r.reply <- socketReply{fd, err}
			}
			return nil
		})
	}()
	select {
	case err := <-started:
		if err != nil {
			<-m.done
			return nil, fmt.Errorf("starting socket thread in %s: %w", lab.Gen, err)
		}
		return m, nil
	case err := <-m.done:
		if err == nil {
			err = errors.New("thread ended early")
		}
		return nil, fmt.Errorf("starting socket thread in %s: %w", lab.Gen, err)
	}
}

// socket returns a new non-blocking TCP socket in Gen, bound to src with
// the port left to connect(2), and set to reset on close. The caller owns
// the descriptor.
func (m *socketMaker) socket(ctx context.Context, src netip.Addr) (int, error) {
	reply := make(chan socketReply, 1)
	select {
	case m.reqs <- socketReq{src, reply}:
	case <-ctx.Done():
		return -1, ctx.Err()
	}
	r := <-reply
	return r.fd, r.err
}

// close ends the thread, which returns to the host namespace. Call it
// only when no socket call is running or will be made.
func (m *socketMaker) close() error {
	close(m.reqs)
	return <-m.done
}

// checkThreadNS checks that the calling thread is in the network
// namespace mounted at path.
func checkThreadNS(path string) error {
	var want, got unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return fmt.Errorf("checking network namespace: %w", err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &got); err != nil {
		return fmt.Errorf("checking network namespace: %w", err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return fmt.Errorf("thread is not in network namespace %s", path)
	}
	return nil
}

// tcpSocket creates a TCP socket bound to src in the calling thread's
// namespace. IP_BIND_ADDRESS_NO_PORT defers the choice of the local port
// to connect, which then picks a port unique for the whole 4-tuple rather
// than for (src, port) alone. SO_LINGER 0 makes close send a reset and
// free the socket at once: no TIME_WAIT piles up on the client, and the
// server's socket, half-closed after its response, goes too.
func tcpSocket(src netip.Addr) (int, error) {
	family := unix.AF_INET
	if src.Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("creating socket: %w", err)
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting SO_LINGER: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting TCP_NODELAY: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting IP_BIND_ADDRESS_NO_PORT: %w", err)
	}
	if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(src, 0))); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding to %s: %w", src, err)
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

// errNotConnected is a connect that has not completed yet.
var errNotConnected = errors.New("not connected")

// connect connects the socket fd (from socketMaker.socket, which connect
// takes over) to dst by the deadline and returns it as a pollable
// *os.File. On error fd is closed.
func connect(fd int, dst netip.AddrPort, deadline time.Time) (*os.File, error) {
	err := unix.Connect(fd, sockaddr(dst))
	if err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return nil, fmt.Errorf("connecting to %s: %w", dst, err)
	}
	// Registered with the poller only now, as the net package does: the
	// unconnected socket would have reported itself writable.
	f := os.NewFile(uintptr(fd), "tcp")
	if err == nil {
		return f, nil
	}
	if err := f.SetDeadline(deadline); err != nil {
		f.Close()
		return nil, fmt.Errorf("connecting to %s: %w", dst, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("connecting to %s: %w", dst, err)
	}
	cerr := errNotConnected
	err = rc.Write(func(fd uintptr) bool {
		cerr = connected(int(fd))
		return cerr != errNotConnected
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("connecting to %s: %w", dst, err)
	}
	return f, nil
}

// connected reports how a non-blocking connect on fd stands: nil when
// done, errNotConnected while in progress, else why it failed. The poller
// can wake spuriously, so a zero SO_ERROR is confirmed by getpeername.
func connected(fd int) error {
	n, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	switch e := unix.Errno(n); e {
	case 0:
		if _, err := unix.Getpeername(fd); err != nil {
			return errNotConnected
		}
		return nil
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		return errNotConnected
	default:
		return e
	}
}
