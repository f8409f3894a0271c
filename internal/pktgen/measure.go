package pktgen

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"golang.org/x/sys/unix"
)

// MeasureDstPort is the UDP destination port of Measure's packets.
const MeasureDstPort = 9

// Result is what Measure saw.
type Result struct {
	Packets     int           // packets sent
	Received    uint64        // packets fw's veth received meanwhile (≥ Packets; the excess is background traffic such as IPv6 MLD)
	Elapsed     time.Duration // wall time of the send loop
	NsPerPacket float64       // Elapsed / Packets in nanoseconds
	CPU         int           // the CPU the sending thread was pinned to

	// ThreadCPU is the CPU time the sending thread used in the loop,
	// softirq work done in its context included (unless the kernel has
	// CONFIG_IRQ_TIME_ACCOUNTING). Well below Elapsed means the thread
	// waited for the CPU: the machine was busy and the round is noise.
	ThreadCPU time.Duration
	// Ksoftirqd is the CPU time ksoftirqd of CPU used meanwhile: receive
	// work the kernel deferred from the sending thread (zero if unknown).
	Ksoftirqd time.Duration
	// CPUNsPerPacket is (ThreadCPU + Ksoftirqd) / Packets in nanoseconds:
	// the CPU cost of a packet, which unlike NsPerPacket does not grow
	// while the thread waits for a busy CPU.
	CPUNsPerPacket float64
}

// Disturbed reports whether the sending thread was off the CPU for more
// than a tenth of the round, so the round had better be discarded.
func (r Result) Disturbed() bool { return r.ThreadCPU < r.Elapsed*9/10 }

// Expect is what the firewall is to do with Measure's packets, which
// MeasureWith checks from fw's counters after the round.
type Expect int

const (
	// ExpectAny checks only that fw received every packet.
	ExpectAny Expect = iota
	// ExpectPass checks that every packet got past the firewall to its
	// end: dropped by routing (the sink) or by UDP for want of a socket
	// (a local destination).
	ExpectPass
	// ExpectDrop checks that no packet got past the firewall; where in fw
	// it dropped them (XDP, tc, netdev ingress, prerouting, input) is not
	// checked.
	ExpectDrop
)

// MeasureOptions vary Measure.
type MeasureOptions struct {
	// Local sends to fw's own address (FWAddr4 or FWAddr6) instead of the
	// sink, so packets pass the input hook and end in UDP, which has no
	// socket on MeasureDstPort (ICMP errors back are rate limited).
	Local  bool
	Expect Expect
}

// Measure is MeasureWith with the zero MeasureOptions.
func Measure(lab *netns.Lab, srcs []netip.Addr, n int) (Result, error) {
	return MeasureWith(lab, srcs, n, MeasureOptions{})
}

// MeasureWith sends n UDP packets as fast as it can, cycling through srcs, to
// lab.Sink4 or lab.Sink6 (by source family): addresses on fw's subnets that
// are not local, so in fw every packet passes prerouting and is then
// dropped by routing (forwarding is off), a cheap constant cost. A veth
// delivers in the sender's context (softirq on the sending CPU), so the
// wall time of the send loop includes fw's receive path up to that drop,
// hooks and firewall included. The sending thread is pinned to one CPU.
//
// How to read it: the cost of a ruleset is NsPerPacket with the ruleset
// loaded minus NsPerPacket without it. Measure both in interleaved rounds
// (without, with, without, with, ...; at least 5 each, n ≥ 100k), discard
// the first round, and compare medians: one round is noisy and drifts with
// CPU frequency and what else the machine runs. On a shared machine compare
// CPUNsPerPacket instead, or discard rounds that are Disturbed. Packets the
// ruleset drops skip fw's routing step, so a dropping ruleset looks cheaper
// by that step; to time lookups alone, use sources the ruleset accepts (or
// compare drop against drop).
//
// MeasureWith fails, wrapping ErrLost, if fw's veth or IP layer did not
// count all n packets, or the veth dropped any: on a busy machine the
// kernel may defer fw's receive work to ksoftirqd and overflow its backlog
// (1000 packets); retry such a round. With o.Expect set it fails, wrapping
// ErrVerdict, when the packets' fate differs. Packets dropped before IP
// (ExpectDrop) are not required in the IP layer's count. Sources need not
// be Testable.
func MeasureWith(lab *netns.Lab, srcs []netip.Addr, n int, o MeasureOptions) (Result, error) {
	if n <= 0 || len(srcs) == 0 {
		return Result{}, errors.New("measuring: need n > 0 and at least one source")
	}
	frames, err := checkFrames(lab, srcs[:min(len(srcs), n)], MeasureDstPort, 0, func(src netip.Addr) netip.Addr {
		switch {
		case src.Is4() && o.Local:
			return lab.FWAddr4.Addr()
		case src.Is4():
			return lab.Sink4
		case o.Local:
			return lab.FWAddr6.Addr()
		}
		return lab.Sink6
	})
	if err != nil {
		return Result{}, fmt.Errorf("measuring: %w", err)
	}
	stats, err := openStats(lab)
	if err != nil {
		return Result{}, err
	}
	defer stats.close()
	tx, err := NewSender(lab)
	if err != nil {
		return Result{}, err
	}
	defer tx.Close()
	tx.Load(frames)

	before, err := stats.read()
	if err != nil {
		return Result{}, err
	}
	res := Result{Packets: n}
	err = pinned(func(cpu int) error {
		res.CPU = cpu
		ksoft := ksoftirqdStat(cpu)
		k0 := ksoft()
		defer func() { res.Ksoftirqd = ksoft() - k0 }()
		var c0, c1 unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &c0); err != nil {
			return fmt.Errorf("reading thread CPU time: %w", err)
		}
		start := time.Now()
		_, err := tx.Send(n)
		res.Elapsed = time.Since(start)
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &c1); err != nil {
			return fmt.Errorf("reading thread CPU time: %w", err)
		}
		res.ThreadCPU = time.Duration(c1.Nano() - c0.Nano())
		return err
	})
	if err != nil {
		return res, fmt.Errorf("measuring: %w", err)
	}
	res.NsPerPacket = float64(res.Elapsed.Nanoseconds()) / float64(n)
	res.CPUNsPerPacket = float64((res.ThreadCPU + res.Ksoftirqd).Nanoseconds()) / float64(n)

	// Delivery is synchronous unless softirq work was deferred to
	// ksoftirqd; allow it a moment.
	deadline := time.Now().Add(2 * time.Second)
	var after counters
	var in, ended uint64
	for {
		if after, err = stats.read(); err != nil {
			return res, err
		}
		res.Received = after.rxPackets - before.rxPackets
		in = after.ipIn + after.ip6In - before.ipIn - before.ip6In
		ended = after.addrErr + after.noPorts - before.addrErr - before.noPorts
		done := res.Received >= uint64(n) && in >= uint64(n)
		switch o.Expect {
		case ExpectPass:
			done = done && ended >= uint64(n)
		case ExpectDrop:
			// Dropped early the packets never reach IP: wait for the
			// veth's count only (with XDP it rises as XDP runs).
			done = res.Received >= uint64(n)
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if o.Expect == ExpectDrop {
		// A packet counted by the veth may still wait in a backlog for
		// the firewall; give deferred work a moment before checking that
		// none got past it.
		time.Sleep(5 * time.Millisecond)
		if after, err = stats.read(); err != nil {
			return res, err
		}
		res.Received = after.rxPackets - before.rxPackets
		ended = after.addrErr + after.noPorts - before.addrErr - before.noPorts
	}
	d := after.rxDropped - before.rxDropped
	if o.Expect == ExpectDrop {
		// Dropped early (XDP, tc, netdev ingress) the packets do not
		// reach IP; the veth counts them all the same.
		if d > 0 || res.Received < uint64(n) {
			return res, fmt.Errorf("measuring: %w: of %d packets fw's veth received %d and dropped %d", ErrLost, n, res.Received, d)
		}
		if ended > 0 {
			return res, fmt.Errorf("measuring: %w: %d of %d packets got past the firewall, which was to drop them all", ErrVerdict, ended, n)
		}
		return res, nil
	}
	if d > 0 || res.Received < uint64(n) || in < uint64(n) {
		return res, fmt.Errorf("measuring: %w: of %d packets fw's veth received %d and dropped %d, its IP layer saw %d", ErrLost, n, res.Received, d, in)
	}
	if o.Expect == ExpectPass && ended < uint64(n) {
		return res, fmt.Errorf("measuring: %w: only %d of %d packets got past the firewall, which was to pass them all", ErrVerdict, ended, n)
	}
	return res, nil
}

// pinned runs fn on a fresh goroutine locked to its OS thread and pinned
// to the highest-numbered CPU the process may use. If the thread's affinity
// cannot be restored, the thread stays locked and dies with the goroutine.
func pinned(fn func(cpu int) error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var orig unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("reading CPU affinity: %w", err)
			return
		}
		cpu := -1
		for i := range len(orig) * 64 {
			if orig.IsSet(i) {
				cpu = i
			}
		}
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("pinning to CPU %d: %w", cpu, err)
			return
		}
		err := fn(cpu)
		if rerr := unix.SchedSetaffinity(0, &orig); rerr != nil {
			ch <- errors.Join(err, fmt.Errorf("restoring CPU affinity (thread discarded): %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		ch <- err
	}()
	return <-ch
}

// ksoftirqdStat returns a function that reads the run time of ksoftirqd of
// cpu from its schedstat; it reads 0 if that is not available.
func ksoftirqdStat(cpu int) func() time.Duration {
	want := fmt.Sprintf("ksoftirqd/%d\n", cpu)
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err != nil || string(b) != want {
			continue
		}
		stat := filepath.Join(filepath.Dir(c), "schedstat")
		return func() time.Duration {
			b, err := os.ReadFile(stat)
			if err != nil {
				return 0
			}
			var ns int64
			fmt.Sscan(string(b), &ns)
			return time.Duration(ns)
		}
	}
	return func() time.Duration { return 0 }
}
