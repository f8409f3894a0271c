package pktgen

import (
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/ipfence/ipfence/internal/netns"
	"golang.org/x/sys/unix"
)

// DefaultBatch is the number of frames a Sender passes to one sendmmsg.
const DefaultBatch = 256

// maxBatch is UIO_MAXIOV, the most messages one sendmmsg takes.
const maxBatch = 1024

// sendRetryFor bounds how long Send retries a send the kernel refused for
// lack of buffer space before giving up.
const sendRetryFor = time.Second

// Sender writes Ethernet frames to the gen end of a lab's veth. It uses an
// AF_PACKET raw socket created in the gen namespace and bound to the veth,
// with PACKET_QDISC_BYPASS, and sends with sendmmsg. The socket receives
// nothing. A Sender is not safe for concurrent use.
type Sender struct {
	fd     int
	frames [][]byte
	iovs   []unix.Iovec
	msgs   []unix.Mmsghdr
	next   int

	// Batch is the number of frames per sendmmsg, 1 to 1024;
	// DefaultBatch when zero.
	Batch int
}

// NewSender opens the AF_PACKET socket in lab's gen namespace. It fails
// without CAP_NET_RAW or when the lab is closed.
func NewSender(lab *netns.Lab) (*Sender, error) {
	s := &Sender{fd: -1}
	err := lab.DoGen(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening AF_PACKET socket: %w", err)
		}
		s.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			return fmt.Errorf("setting PACKET_QDISC_BYPASS: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20); err != nil {
			return fmt.Errorf("setting SO_SNDBUFFORCE: %w", err)
		}
		// Protocol 0: bound for sending only, no frames are queued to us.
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: lab.GenIndex}); err != nil {
			return fmt.Errorf("binding AF_PACKET socket to %s: %w", lab.GenIf, err)
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("creating sender: %w", err)
	}
	return s, nil
}

// Load makes frames the ones Send cycles through, starting with frames[0].
// The Sender keeps referring to frames (no copy): do not modify them while
// sending.
func (s *Sender) Load(frames [][]byte) {
	s.frames = frames
	s.iovs = make([]unix.Iovec, len(frames))
	s.msgs = make([]unix.Mmsghdr, len(frames))
	for i, f := range frames {
		s.iovs[i].Base = unsafe.SliceData(f)
		s.iovs[i].SetLen(len(f))
		s.msgs[i].Hdr.Iov = &s.iovs[i]
		s.msgs[i].Hdr.SetIovlen(1)
	}
	s.next = 0
}

// Send sends n frames, continuing the cycle through the loaded frames where
// the last call stopped, in batches of s.Batch. It does not allocate. When
// the kernel reports no buffer space it retries for up to a second. It
// returns the number of frames sent, which is n unless err is set.
func (s *Sender) Send(n int) (int, error) {
	if len(s.msgs) == 0 {
		return 0, errors.New("sending: no frames loaded")
	}
	batch := s.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	batch = min(batch, maxBatch)
	sent := 0
	var stalled time.Time
	for sent < n {
		k := min(batch, n-sent, len(s.msgs)-s.next)
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.msgs[s.next])), uintptr(k), 0, 0, 0)
		if e != 0 {
			switch e {
			case unix.EINTR:
				continue
			case unix.ENOBUFS, unix.EAGAIN:
				if stalled.IsZero() {
					stalled = time.Now()
				} else if time.Since(stalled) > sendRetryFor {
					return sent, fmt.Errorf("sending frames: %w (for over %v)", e, sendRetryFor)
				}
				time.Sleep(50 * time.Microsecond)
				continue
			}
			return sent, fmt.Errorf("sending frames: %w", e)
		}
		stalled = time.Time{}
		sent += int(r)
		s.next += int(r)
		if s.next == len(s.msgs) {
			s.next = 0
		}
	}
	runtime.KeepAlive(s.frames)
	return sent, nil
}

// Close closes the socket. It is safe to call more than once.
func (s *Sender) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("closing sender: %w", err)
	}
	return nil
}
