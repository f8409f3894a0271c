package pktgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ipfence/ipfence/internal/netns"
	"golang.org/x/sys/unix"
)

// ErrUntestable is wrapped by Check's error for a source address the fw
// kernel drops after prerouting whatever the firewall says (see Testable).
var ErrUntestable = errors.New("source address cannot be tested")

// ErrLost is wrapped by Check's and Measure's errors when packets were lost
// for a reason other than the firewall: a receive buffer overflow, a drop
// before the IP layer, a bad checksum. Verdicts from such a run are void.
var ErrLost = errors.New("packets lost outside the firewall")

// ErrVerdict is wrapped by MeasureWith's errors when the firewall passed
// packets it was expected to drop, or the reverse.
var ErrVerdict = errors.New("firewall verdict differs from the expected one")

// CheckSrcPort is the UDP source port of Check's packets.
const CheckSrcPort = 40000

const (
	checkMagic    = 0x69706663 // "ipfc"
	checkPayload  = 12         // magic, nonce, sequence number
	checkBatch    = 256
	checkRcvbuf   = 64 << 20
	maxInFlight   = checkBatch             // packets sent but not yet seen by fw's IP layer
	stallTimeout  = 5 * time.Second        // how long fw may show no progress
	quietInterval = 20 * time.Millisecond  // no new packet for this long: quiescent
	settleTimeout = 10 * time.Second       // bound on waiting after the last send
	pollInterval  = 100 * time.Microsecond // pacing poll
)

// Check sends exactly one UDP packet from each source in srcs to fw's
// address of the same family (198.18.0.1 or 2001:2::1), port dport, and
// reports which arrived at a UDP socket listening there in fw: passed[i]
// is true when the packet from srcs[i] got through fw's prerouting hooks
// (and input hooks, and XDP: everything on the way to a local socket).
// Sources may repeat; each gets its own packet. Check takes about a second
// for 50k sources.
//
// It paces sending so fw keeps up, waits until fw is quiescent, and then
// reads fw's counters: if anything was dropped by other than the firewall
// (UDP receive buffer errors, bad checksums, drops on the veth, packets
// that never reached fw's IP layer, conntrack table full) it fails with an
// error wrapping ErrLost.
// A source that fw's kernel always drops (see Testable) fails the call
// with ErrUntestable before anything is sent. Replies the firewall sends
// (TCP resets, ICMP errors) are ignored: fw has no route to spoofed
// sources. dport must be free in fw.
func Check(lab *netns.Lab, srcs []netip.Addr, dport uint16) ([]bool, error) {
	if len(srcs) == 0 {
		return []bool{}, nil
	}
	if dport == 0 {
		return nil, errors.New("checking sources: destination port 0")
	}
	if uint64(len(srcs)) > 1<<32-1 {
		return nil, fmt.Errorf("checking %d sources: at most 2^32-1 per call", len(srcs))
	}
	for i, a := range srcs {
		if !Testable(a) {
			return nil, fmt.Errorf("checking source #%d %s: %w (fw's kernel drops it whatever the firewall says; filter with pktgen.Testable)", i, a, ErrUntestable)
		}
	}
	return checkSources(lab, srcs, dport)
}

// checkFrames returns a UDP frame from gen to fw for each source, from
// CheckSrcPort to dport and to the address dst gives for the source
// (unmapped), carrying the check payload: magic, nonce and the source's
// index. The frames share one buffer.
func checkFrames(lab *netns.Lab, srcs []netip.Addr, dport uint16, nonce uint32, dst func(src netip.Addr) netip.Addr) ([][]byte, error) {
	frames := make([][]byte, len(srcs))
	buf := make([]byte, 0, len(srcs)*FrameLen(netip.IPv6Unspecified(), UDPLen, checkPayload))
	h := Header{SrcMAC: lab.GenMAC, DstMAC: lab.FWMAC, SrcPort: CheckSrcPort, DstPort: dport}
	var payload [checkPayload]byte
	binary.BigEndian.PutUint32(payload[0:], checkMagic)
	binary.BigEndian.PutUint32(payload[4:], nonce)
	for i, a := range srcs {
		h.Src = a.Unmap()
		h.Dst = dst(h.Src)
		binary.BigEndian.PutUint32(payload[8:], uint32(i))
		start := len(buf)
		var err error
		if buf, err = AppendUDP(buf, &h, uint16(i), payload[:]); err != nil {
			return nil, fmt.Errorf("building a frame from %s: %w", h.Src, err)
		}
		frames[i] = buf[start:len(buf):len(buf)]
	}
	return frames, nil
}

// checkSources is Check without the test for testable sources.
func checkSources(lab *netns.Lab, srcs []netip.Addr, dport uint16) ([]bool, error) {
	passed := make([]bool, len(srcs))
	var n4 uint64
	for _, a := range srcs {
		if !a.IsValid() {
			return nil, fmt.Errorf("checking sources: invalid address")
		}
		if a.Unmap().Is4() {
			n4++
		}
	}
	need4, need6 := n4 > 0, n4 < uint64(len(srcs))
	nonce := rand.Uint32()
	frames, err := checkFrames(lab, srcs, dport, nonce, func(src netip.Addr) netip.Addr {
		if src.Is4() {
			return lab.FWAddr4.Addr()
		}
		return lab.FWAddr6.Addr()
	})
	if err != nil {
		return nil, fmt.Errorf("checking sources: %w", err)
	}

	rx, err := listen(lab, dport, need4, need6)
	if err != nil {
		return nil, err
	}
	if testHookListen != nil {
		testHookListen(rx)
	}
	defer rx.close()
	stats, err := openStats(lab)
	if err != nil {
		return nil, err
	}
	defer stats.close()
	tx, err := NewSender(lab)
	if err != nil {
		return nil, err
	}
	defer tx.Close()
	tx.Load(frames)

	before, err := stats.read()
	if err != nil {
		return nil, err
	}
	rx.start(srcs, passed, nonce)
	n := uint64(len(srcs))
	if err := check(tx, stats, rx, before, n4, n-n4); err != nil {
		rx.close()
		return nil, fmt.Errorf("checking %d sources: %w", n, err)
	}
	rx.close()
	after, err := stats.read()
	if err != nil {
		return nil, err
	}
	if err := lossError(before, after, n); err != nil {
		return nil, fmt.Errorf("checking %d sources: %w", n, err)
	}
	if rx.mismatch.Load() != nil {
		return nil, fmt.Errorf("checking %d sources: %w", n, *rx.mismatch.Load())
	}
	return passed, nil
}

// check sends all loaded frames, n4 IPv4 and n6 IPv6 ones, pacing on fw's
// IP InReceives counters and the sockets' queues, then waits until fw is
// quiescent.
//
// When fw's interface runs an XDP program, which may drop packets before
// they reach IP, it paces on the packets the interface received instead
// (counted as IPv4 below).
func check(tx *Sender, stats *nsStats, rx *receiver, before counters, n4, n6 uint64) error {
	if stats.xdp {
		n4, n6 = n4+n6, 0
	}
	seen := func() (in4, in6 uint64, err error) {
		c, err := stats.read()
		if stats.xdp {
			return c.rxPackets - before.rxPackets, 0, err
		}
		return c.ipIn - before.ipIn, c.ip6In - before.ip6In, err
	}
	n := n4 + n6
	var sent uint64
	for sent < n {
		k, err := tx.Send(int(min(checkBatch, n-sent)))
		sent += uint64(k)
		if err != nil {
			return err
		}
		// Keep what fw has not processed below its backlog limit
		// (net.core.netdev_max_backlog, 1000 by default), in case its
		// receive work is deferred to ksoftirqd.
		var progress uint64
		var since time.Time
		for {
			in4, in6, err := seen()
			if err != nil {
				return err
			}
			in := in4 + in6
			if sent-min(in, sent) <= maxInFlight && rx.queued() <= checkRcvbuf/4 {
				break
			}
			if in != progress || since.IsZero() {
				progress, since = in, time.Now()
			} else if time.Since(since) > stallTimeout {
				return fmt.Errorf("%w: fw's IP layer saw %d of %d packets sent and no more for %v", ErrLost, in, sent, stallTimeout)
			}
			time.Sleep(pollInterval)
		}
	}
	// Quiescent: fw's IP layer has seen every packet of each family, the
	// sockets are drained, and no packet arrived for quietInterval.
	deadline := time.Now().Add(settleTimeout)
	last, lastChange := rx.count.Load(), time.Now()
	for {
		in4, in6, err := seen()
		if err != nil {
			return err
		}
		c := rx.count.Load()
		if c != last {
			last, lastChange = c, time.Now()
		}
		if in4 >= n4 && in6 >= n6 && rx.queued() == 0 && time.Since(lastChange) >= quietInterval {
			return nil
		}
		if time.Now().After(deadline) {
			if in4 < n4 || in6 < n6 {
				return fmt.Errorf("%w: fw's IP layer saw only %d of %d IPv4 and %d of %d IPv6 packets within %v", ErrLost, in4, n4, in6, n6, settleTimeout)
			}
			return fmt.Errorf("fw still receiving after %v", settleTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// lossError reports counters that show packets lost outside the firewall.
func lossError(before, after counters, n uint64) error {
	var errs []string
	d := func(name string, b, a uint64) {
		if a > b {
			errs = append(errs, fmt.Sprintf("%s +%d", name, a-b))
		}
	}
	d("Udp RcvbufErrors", before.udpRcvbuf, after.udpRcvbuf)
	d("Udp6 RcvbufErrors", before.udp6Rcvbuf, after.udp6Rcvbuf)
	d("Udp InErrors", before.udpInErr, after.udpInErr)
	d("Udp6 InErrors", before.udp6InErr, after.udp6InErr)
	d("Udp InCsumErrors", before.udpCsum, after.udpCsum)
	d("Udp6 InCsumErrors", before.udp6Csum, after.udp6Csum)
	d("veth rx_dropped", before.rxDropped, after.rxDropped)
	d("veth rx_errors", before.rxErrors, after.rxErrors)
	d("veth rx_fifo", before.rxFIFO, after.rxFIFO)
	d("conntrack drop", before.ctDrop, after.ctDrop)
	d("conntrack insert_failed", before.ctInsFailed, after.ctInsFailed)
	if got := after.rxPackets - before.rxPackets; got < n {
		errs = append(errs, fmt.Sprintf("veth received %d of %d packets", got, n))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: fw counters: %s", ErrLost, strings.Join(errs, ", "))
}

// receiver is the pair of UDP sockets in fw that Check's packets go to.
// testHookListen, when set by a test, gets the receiver before Check sends.
var testHookListen func(*receiver)

type receiver struct {
	gate     chan struct{} // if set, readers wait for it to close
	conns    []*net.UDPConn
	wg       sync.WaitGroup
	count    atomic.Uint64
	mismatch atomic.Pointer[error]
	once     sync.Once
}

func listen(lab *netns.Lab, port uint16, need4, need6 bool) (*receiver, error) {
	r := &receiver{}
	err := lab.DoFW(func() error {
		for _, a := range []struct {
			need bool
			net  string
			addr netip.Addr
		}{{need4, "udp4", lab.FWAddr4.Addr()}, {need6, "udp6", lab.FWAddr6.Addr()}} {
			if !a.need {
				continue
			}
			c, err := net.ListenUDP(a.net, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.addr, port)))
			if err != nil {
				return fmt.Errorf("listening in fw: %w", err)
			}
			r.conns = append(r.conns, c)
			if err := control(c, func(fd int) error {
				return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, checkRcvbuf)
			}); err != nil {
				return fmt.Errorf("setting SO_RCVBUFFORCE: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func control(c syscall.Conn, fn func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// start reads datagrams until close, marking passed[seq] for each valid one.
func (r *receiver) start(srcs []netip.Addr, passed []bool, nonce uint32) {
	for _, c := range r.conns {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if r.gate != nil {
				<-r.gate
			}
			var b [64]byte
			for {
				n, from, err := c.ReadFromUDPAddrPort(b[:])
				if err != nil {
					return // closed
				}
				if n != checkPayload || binary.BigEndian.Uint32(b[0:]) != checkMagic || binary.BigEndian.Uint32(b[4:]) != nonce {
					continue
				}
				seq := binary.BigEndian.Uint32(b[8:])
				if uint64(seq) >= uint64(len(srcs)) {
					continue
				}
				if got, want := from.Addr().Unmap().WithZone(""), srcs[seq].Unmap(); got != want {
					err := fmt.Errorf("packet #%d arrived from %s, sent from %s (NAT in fw?)", seq, got, want)
					r.mismatch.CompareAndSwap(nil, &err)
					continue
				}
				if !passed[seq] {
					passed[seq] = true
					r.count.Add(1)
				}
			}
		}()
	}
}

// queued returns the bytes waiting in the sockets' receive queues.
func (r *receiver) queued() int {
	total := 0
	for _, c := range r.conns {
		control(c, func(fd int) error {
			var mem [unix.SK_MEMINFO_VARS]uint32
			l := uint32(len(mem) * 4)
			if err := getsockopt(fd, unix.SOL_SOCKET, unix.SO_MEMINFO, mem[:], &l); err != nil {
				return err
			}
			total += int(mem[unix.SK_MEMINFO_RMEM_ALLOC])
			return nil
		})
	}
	return total
}

// close closes the sockets and waits for the readers to stop.
func (r *receiver) close() {
	r.once.Do(func() {
		for _, c := range r.conns {
			c.Close()
		}
		r.wg.Wait()
	})
}

// getsockopt reads an option made of uint32s, which x/sys/unix has no
// wrapper for.
func getsockopt(fd, level, opt int, v []uint32, l *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(unsafe.SliceData(v))), uintptr(unsafe.Pointer(l)), 0)
	if e != 0 {
		return e
	}
	return nil
}
