package probe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// MaxInFlight bounds the requests OpenLoop has open at once.
const MaxInFlight = 512

// maxRequests bounds rate×d, and with it OpenLoop's memory.
const maxRequests = 10_000_000

// Outcomes of one scheduled request.
const (
	outcomeOK      = iota
	outcomeFailed  // error, timeout or bad response: counts in errs
	outcomeSkipped // not sent, or cut short, because ctx ended
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, respBuf); return &b }}

// OpenLoop sends HTTP GET requests from Gen to FW at a fixed rate for d:
// request i is due at start + i/rate whatever became of the earlier ones,
// and runs on a goroutine of its own, on a new connection from srcs[i mod
// len(srcs)] (bound as source address) to ports[(i div len(srcs)) mod
// len(ports)], so every source meets every port within len(srcs) ×
// len(ports) requests. The destination is lab.FWAddr4, or lab.FWAddr6 for
// an IPv6 source. A request's latency runs from the time it was due to
// the last byte of the body, so it includes any delay in starting it; it
// must be complete (status 200, BodySize bytes) within timeout of that
// time. The schedule runs on one thread in Gen that makes each socket
// before its request is due and sleeps in nanosleep(2) with a timer slack
// of 1 ns, so the generator's own lateness is some tens of microseconds
// rather than the half millisecond of a Go timer. OpenLoop returns the
// latencies of the requests that completed, in the order they were due,
// and counts in errs those that failed or timed out, and those that could
// not start because MaxInFlight requests were open.
//
// It returns an error, with the results so far, when ctx ends early (the
// requests cut short count nowhere), and without results when the
// arguments are bad or a socket cannot be made: a source Gen does not
// have (add client addresses with AddClients) fails before the first
// request.
func OpenLoop(ctx context.Context, lab *netns.Lab, srcs []netip.Addr, ports []int, rate float64, d, timeout time.Duration) (lat []time.Duration, errs int, err error) {
	return openLoop(ctx, lab, srcs, ports, rate, d, timeout, MaxInFlight)
}

func openLoop(ctx context.Context, lab *netns.Lab, srcs []netip.Addr, ports []int, rate float64, d, timeout time.Duration, maxInFlight int) (lat []time.Duration, errs int, err error) {
	switch {
	case len(srcs) == 0 || len(ports) == 0:
		return nil, 0, errors.New("running open loop: no sources or no ports")
	case !(rate > 0) || math.IsInf(rate, 0) || d <= 0 || timeout <= 0 || maxInFlight <= 0:
		return nil, 0, fmt.Errorf("running open loop: rate %v, duration %v and timeout %v must be positive and finite", rate, d, timeout)
	case d.Seconds()*rate > maxRequests:
		return nil, 0, fmt.Errorf("running open loop: %v at %v/s is more than %d requests", d, rate, maxRequests)
	}
	total := 0
	for offset(total, rate) < d {
		total++
	}
	for _, p := range ports {
		if p <= 0 || p > 65535 {
			return nil, 0, fmt.Errorf("running open loop: port %d out of range", p)
		}
	}
	var (
		wg      sync.WaitGroup
		sem     = make(chan struct{}, maxInFlight)
		outcome = make([]uint8, total) // each set by the loop or its request only
		lats    = make([]time.Duration, total)
	)
	for i := range outcome {
		outcome[i] = outcomeSkipped
	}
	// The schedule runs on the thread DoGen switched into Gen, which
	// makes each request's socket before the request is due, so neither
	// making it nor a namespace switch is part of any latency.
	err = lab.DoGen(func() error {
		if err := checkThreadNS(netns.Path(lab.Gen)); err != nil {
			return err
		}
		// Bind every source once before the clock starts, so a missing
		// address is an error rather than a run of failures.
		for _, src := range srcs {
			fd, err := tcpSocket(src)
			if err != nil {
				return fmt.Errorf("source %s: %w", src, err)
			}
			unix.Close(fd)
		}
		restore, err := preciseSleep()
		if err != nil {
			return err
		}
		defer restore()
		start := time.Now()
		for i := range total {
			src := srcs[i%len(srcs)]
			fw := lab.FWAddr4.Addr()
			if src.Is6() {
				fw = lab.FWAddr6.Addr()
			}
			dst := netip.AddrPortFrom(fw, uint16(ports[i/len(srcs)%len(ports)]))
			fd, err := tcpSocket(src)
			if err != nil {
				return fmt.Errorf("source %s: %w", src, err)
			}
			at := start.Add(offset(i, rate))
			if !sleepUntil(ctx, at) {
				unix.Close(fd)
				return nil
			}
			select {
			case sem <- struct{}{}:
			default:
				unix.Close(fd)
				outcome[i] = outcomeFailed
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				end, cut := deadline(ctx, at, timeout)
				buf := bufPool.Get().(*[]byte)
				defer bufPool.Put(buf)
				p, err := get(fd, dst, at, end, *buf)
				switch {
				case err == nil:
					outcome[i], lats[i] = outcomeOK, p.Complete
				case cut && errors.Is(err, os.ErrDeadlineExceeded):
					// Cut short by ctx: neither a success nor a failure.
				default:
					outcome[i] = outcomeFailed
				}
			})
		}
		return nil
	})
	wg.Wait()
	skipped := 0
	for i, o := range outcome {
		switch o {
		case outcomeOK:
			lat = append(lat, lats[i])
		case outcomeFailed:
			errs++
		default:
			skipped++
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("running open loop: %w", err)
	}
	if skipped > 0 {
		return lat, errs, fmt.Errorf("running open loop: %d of %d requests not done: %w", skipped, total, ctxErr(ctx))
	}
	return lat, errs, nil
}

// offset is when request i is due, from the start.
func offset(i int, rate float64) time.Duration {
	return time.Duration(float64(i) / rate * float64(time.Second))
}

// pollStep bounds each sleep of the schedule, and so how long it takes to
// notice the context ending.
const pollStep = 10 * time.Millisecond

// sleepUntil sleeps the calling thread until at; it reports false, at
// once or within pollStep, if ctx ends first. It sleeps in nanosleep(2)
// rather than on a Go timer: the runtime waits for timers in epoll_wait,
// whose timeout is in milliseconds, so a timer fires half a millisecond
// late on average, which would be added to every latency.
func sleepUntil(ctx context.Context, at time.Time) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		d := time.Until(at)
		if d <= 0 {
			return true
		}
		ts := unix.NsecToTimespec(int64(min(d, pollStep)))
		unix.Nanosleep(&ts, nil) // EINTR: the loop sleeps again
	}
}

// preciseSleep sets the calling (locked) thread's timer slack to 1 ns, so
// nanosleep wakes when asked rather than up to 50 µs later, and returns
// the function that restores the slack before the thread is unlocked.
func preciseSleep() (restore func(), err error) {
	old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("getting timer slack: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("setting timer slack: %w", err)
	}
	return func() { unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0) }, nil
}
