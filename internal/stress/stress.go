// Package stress measures the daemon's ban path and hammers it, in a
// namespace of its own: ban latency through the API at several numbers of
// existing bans and clients, bulk and sustained ban rates, count queries,
// the daemon's memory, and a mixed run of many concurrent workers after
// which the kernel's ban sets are read back and checked against the
// daemon and the workers' own record (no lost, no phantom ban).
//
// The daemon runs as a separate process (Options.Exe daemon ...), so its
// memory is its own.
package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/daemonproc"
	"github.com/ipfence/ipfence/internal/netns"
)

// Options configure Run.
type Options struct {
	Exe      string // the ipfence binary (runs "daemon")
	Existing []int  // bans already in force for the latency rows (ascending)
	Clients  []int  // concurrent clients for the latency rows
	// Rates are total request rates (per second) for paced latency rows:
	// the largest number of Clients, each sending on a schedule instead
	// of as fast as it can.
	Rates    []int
	Requests int           // single-ban requests per latency row
	Duration time.Duration // length of the mixed run (0: none)
	Workers  int           // workers of the mixed run
	// DaemonArgs are added to the daemon's command line (e.g. --pprof).
	DaemonArgs []string
	Progress   io.Writer
}

// LatencyRow is one latency measurement.
type LatencyRow struct {
	Existing int `json:"existing_bans"`
	Clients  int `json:"clients"`
	// Rate is the total request rate of a paced row (0: each client sends
	// its next request when the last one is answered).
	Rate int `json:"rate_per_sec,omitempty"`
	// LateP99us is how late the paced requests went out, 99th
	// percentile: what the client's schedule slipped (not counted in
	// the latency).
	LateP99us float64 `json:"late_p99_us,omitempty"`
	Requests  int     `json:"requests"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	MaxUs     float64 `json:"max_us"`
}

// Report is what Run measured.
type Report struct {
	Latency         []LatencyRow `json:"ban_latency"`
	BulkPerSec      float64      `json:"bulk_bans_per_sec"`
	BulkElements    int          `json:"bulk_elements"`
	SustainedPerSec float64      `json:"sustained_bans_per_sec"`
	CountP50us      float64      `json:"count_p50_us"`
	CountP99us      float64      `json:"count_p99_us"`
	CountAt         int          `json:"count_at_bans"`
	LoadedRSSMiB    float64      `json:"loaded_daemon_rss_mib"` // after the latency rows
	LoadedRSSAtBans int          `json:"loaded_rss_at_bans"`    // bans in force then
	DaemonRSSMiB    float64      `json:"daemon_rss_mib"`        // after the sustained run
	RSSAtBans       int          `json:"daemon_rss_at_bans"`    // bans in force then
	MixedRSSMiB     float64      `json:"mixed_daemon_rss_mib,omitempty"`
	Mixed           *MixedResult `json:"mixed,omitempty"`
}

// MixedResult is the outcome of the mixed run.
type MixedResult struct {
	Seconds      float64        `json:"seconds"`
	Workers      int            `json:"workers"`
	Ops          map[string]int `json:"ops"`
	Errors       int            `json:"errors"`
	FirstError   string         `json:"first_error,omitempty"`
	BansAtEnd    int            `json:"bans_at_end"`
	KernelRanges int            `json:"kernel_ranges_read"`
	KernelProbed int            `json:"kernel_addresses_probed"`
	Lost         int            `json:"lost"`    // banned per the workers, missing in the daemon or kernel
	Phantom      int            `json:"phantom"` // in the daemon or kernel, not banned per the workers
	ReadBackSecs float64        `json:"kernel_read_back_seconds"`
}

// Run runs the measurements in a fresh lab namespace and removes it.
func Run(ctx context.Context, o Options) (*Report, error) {
	say := func(f string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, f+"\n", a...)
		}
	}
	lab, err := netns.NewLab(fmt.Sprintf("stress%d", os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	dir, err := os.MkdirTemp("", "ipfence-stress-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := writeFeed(dir, 0); err != nil {
		return nil, err
	}
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("sources:\n  feed: {format: list, paths: [feed.txt], max_shrink: 0}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n  - {name: feed, action: drop, match: {source: feed}}\n"), 0o644); err != nil {
		return nil, err
	}
	d, err := startDaemon(ctx, o.Exe, dir, pol, lab.FW, o.DaemonArgs)
	if err != nil {
		return nil, err
	}
	defer d.Stop()
	say("daemon: pid %d, metrics on %s", d.Pid(), d.metrics)
	cl := api.NewClient(d.Socket)
	defer cl.Close()
	rep := &Report{}
	m := newModel()

	// Latency at each number of existing bans; the preload is the bulk
	// rate (11.0.0.0 up, see bulkLoad).
	have := 0
	var bulkTime time.Duration
	next := uint32(100 << 24) // latency bans: 100.0.0.0 up
	for _, n := range o.Existing {
		if n > have {
			say("loading %d bans", n-have)
			took, err := bulkLoad(ctx, cl, 11<<24+uint32(have), n-have, m)
			if err != nil {
				return nil, err
			}
			bulkTime += took
			have = n
			rep.BulkElements = have
		}
		rows := make([]LatencyRow, 0, len(o.Clients)+len(o.Rates))
		for _, c := range o.Clients {
			rows = append(rows, LatencyRow{Existing: n, Clients: c, Requests: o.Requests})
		}
		for _, r := range o.Rates {
			rows = append(rows, LatencyRow{Existing: n, Clients: slices.Max(o.Clients), Rate: r, Requests: o.Requests})
		}
		for _, row := range rows {
			pace := "flat out"
			if row.Rate > 0 {
				pace = fmt.Sprintf("%d/s", row.Rate)
			}
			say("ban latency: %d existing, %d clients, %s", n, row.Clients, pace)
			lat, late, err := latency(ctx, cl, row.Clients, row.Rate, o.Requests, &next, m)
			if err != nil {
				return nil, err
			}
			row.P50us, row.P99us, row.MaxUs = us(bench.Percentile(lat, 50)), us(bench.Percentile(lat, 99)), us(bench.Percentile(lat, 100))
			if len(late) > 0 {
				row.LateP99us = us(bench.Percentile(late, 99))
			}
			rep.Latency = append(rep.Latency, row)
		}
	}
	if bulkTime > 0 {
		rep.BulkPerSec = float64(rep.BulkElements) / bulkTime.Seconds()
	}

	rep.LoadedRSSMiB, rep.LoadedRSSAtBans = d.rssMiB(), m.len()

	say("count queries")
	var cnt []time.Duration
	for range 200 {
		t0 := time.Now()
		if _, err := cl.Count(ctx); err != nil {
			return nil, err
		}
		cnt = append(cnt, time.Since(t0))
	}
	rep.CountP50us, rep.CountP99us, rep.CountAt = us(bench.Percentile(cnt, 50)), us(bench.Percentile(cnt, 99)), m.len()

	say("sustained bans: 8 clients, 256 addresses per request, 5 s")
	if rep.SustainedPerSec, err = sustained(ctx, cl, 8, 256, 5*time.Second, m); err != nil {
		return nil, err
	}
	rep.DaemonRSSMiB, rep.RSSAtBans = d.rssMiB(), m.len()

	if o.Duration > 0 {
		say("mixed run: %d workers for %v", o.Workers, o.Duration)
		mr, err := mixed(ctx, cl, d, dir, lab.FW, o, m)
		if err != nil {
			return nil, err
		}
		rep.Mixed = mr
		rep.MixedRSSMiB = d.rssMiB()
	}
	if err := d.Stop(); err != nil {
		return rep, fmt.Errorf("the daemon did not stop cleanly: %w", err)
	}
	return rep, nil
}

// daemonProc is the daemon under test, with its metrics address.
type daemonProc struct {
	*daemonproc.Proc
	metrics string
}

func startDaemon(ctx context.Context, exe, dir, pol, ns string, extra []string) (*daemonProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	maddr := ln.Addr().String()
	ln.Close()
	p, err := daemonproc.Start(ctx, daemonproc.Options{Exe: exe, Policy: pol, NetNS: ns, Dir: dir, Metrics: maddr,
		Args: append([]string{"--tick", "1s"}, extra...)})
	if err != nil {
		return nil, err
	}
	return &daemonProc{Proc: p, metrics: maddr}, nil
}

// rssMiB is the daemon's resident memory (0 when it cannot be read).
func (d *daemonProc) rssMiB() float64 {
	rss, _, _ := d.Memory()
	return rss
}

// Bulk loads send requests of BulkChunk addresses, BulkInFlight at a time:
// while the daemon commits one request, it reads and checks the next.
const (
	BulkChunk    = 50000
	BulkInFlight = 2
)

// bulkLoad bans n addresses from first up and returns how long the
// requests took (building them and recording them in m come before and
// after).
func bulkLoad(ctx context.Context, cl *api.Client, first uint32, n int, m *model) (time.Duration, error) {
	var reqs []api.BanRequest
	for i := 0; i < n; i += BulkChunk {
		req := api.BanRequest{TTL: "6h", Origin: "bulk", Quiet: true}
		for k := i; k < min(i+BulkChunk, n); k++ {
			req.Prefixes = append(req.Prefixes, addr(first+uint32(k)).String())
		}
		reqs = append(reqs, req)
	}
	work := make(chan api.BanRequest, len(reqs))
	for _, r := range reqs {
		work <- r
	}
	close(work)
	var wg sync.WaitGroup
	errs := make([]error, BulkInFlight)
	t0 := time.Now()
	for w := range BulkInFlight {
		wg.Go(func() {
			for r := range work {
				if _, err := cl.Ban(ctx, r); err != nil {
					errs[w] = fmt.Errorf("bulk ban: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	for k := range n {
		m.ban(netip.PrefixFrom(addr(first+uint32(k)), 32))
	}
	return d, nil
}

// latency sends requests single-address bans from clients concurrent
// clients and returns their durations. With rate 0 each client sends its
// next request as soon as the last one is answered. Otherwise the
// clients send rate requests per second between them, client c's i-th
// request due at start + (i*clients+c)/rate; late are how long after
// their due times the requests went out (the previous one still waiting
// for its answer, or the client's timer waking late).
func latency(ctx context.Context, cl *api.Client, clients, rate, requests int, next *uint32, m *model) (out, late []time.Duration, err error) {
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	per := max(requests/clients, 1)
	base := *next
	*next += uint32(per * clients)
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for i := range per {
				p := netip.PrefixFrom(addr(base+uint32(c*per+i)), 32)
				var due time.Time
				if rate > 0 {
					due = start.Add(time.Duration(i*clients+c) * time.Second / time.Duration(rate))
					time.Sleep(time.Until(due))
				}
				t0 := time.Now()
				_, err := cl.Ban(ctx, api.BanRequest{Prefix: p.Addr().String(), TTL: "6h", Origin: "latency"})
				d := time.Since(t0)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out = append(out, d)
				if rate > 0 {
					late = append(late, t0.Sub(due))
				}
				mu.Unlock()
				if err == nil {
					m.ban(p)
				}
			}
		})
	}
	wg.Wait()
	return out, late, firstErr
}

// sustained bans as fast as clients can for d, batch addresses per
// request, and returns bans per second.
func sustained(ctx context.Context, cl *api.Client, clients, batch int, d time.Duration, m *model) (float64, error) {
	var mu sync.Mutex
	var n int
	var firstErr error
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	t0 := time.Now()
	made := make([]int, clients) // requests that succeeded, per client
	for c := range clients {
		wg.Go(func() {
			base := uint32(102+c) << 24
			for i := 0; time.Now().Before(end); i++ {
				req := api.BanRequest{TTL: "6h", Origin: "sustained", Quiet: true}
				for k := range batch {
					req.Prefixes = append(req.Prefixes, addr(base+uint32(i*batch+k)).String())
				}
				_, err := cl.Ban(ctx, req)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				n += batch
				mu.Unlock()
				made[c]++
			}
		})
	}
	wg.Wait()
	rate := float64(n) / time.Since(t0).Seconds()
	for c, k := range made {
		for i := range k * batch {
			m.ban(netip.PrefixFrom(addr(uint32(102+c)<<24+uint32(i)), 32))
		}
	}
	return rate, firstErr
}

// writeFeed writes the policy's feed: 2000 /24s in 60.0.0.0/8, shifted
// by gen so that every refresh changes some of them.
func writeFeed(dir string, gen int) error {
	var b strings.Builder
	for i := range 2000 {
		j := (i + gen*37) % 4000
		fmt.Fprintf(&b, "60.%d.%d.0/24\n", j/256, j%256)
	}
	return os.WriteFile(filepath.Join(dir, "feed.txt"), []byte(b.String()), 0o644)
}

func addr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
