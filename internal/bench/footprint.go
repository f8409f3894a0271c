package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ipfence/ipfence/examples"

	"github.com/ipfence/ipfence/internal/bench/plot"
	"github.com/ipfence/ipfence/internal/daemonproc"
	"github.com/ipfence/ipfence/internal/netns"
)

// The footprint scenario measures what ipfence costs the host in memory
// and CPU, each step in a process of its own: its peak RSS (the kernel's
// high-water mark), its CPU seconds (user + system) and its wall time.
// The input is a synthetic threat feed (three single addresses for every
// /24, random over 1.0.0.0-223.255.255.255), at several sizes; beside
// ipfence, `nft -f` of the same feed as one interval set and `ipset
// restore` into a hash:net set. The daemon is measured after its load
// (idle and peak RSS), through a refresh that changes 1% of the feed, and
// holding bans.

// FootprintOptions configure Footprint.
type FootprintOptions struct {
	Lines  []int // feed sizes, in lines
	Bans   []int // bans the daemon holds (0: none), over the smallest feed
	Rounds int   // runs of each row; medians are reported
	// Binary is the ipfence executable to measure ("" : this process's).
	Binary string
	// Policies are policies whose daemon load is measured too (peak and
	// idle RSS, CPU), each under its name: examples/europe.yaml, or an
	// operator's own.
	Policies []FootprintPolicy
}

// FootprintPolicy is a policy: a file the daemon reads in place (Path;
// relative paths in it resolve from its folder), or else content the
// bench writes to a file of its own (YAML: sources must then be absolute
// paths, URLs or builtin: data).
type FootprintPolicy struct {
	Name string
	Path string
	YAML []byte
}

// QuickFootprint is a smoke run; FullFootprint the published one.
var (
	// The quick sizes grow tenfold, as the full ones do, beyond the
	// feed's growth gate: each size must start from a state of its own.
	QuickFootprint = FootprintOptions{Lines: []int{5_000, 50_000}, Bans: []int{0, 10_000}, Rounds: 1,
		Policies: []FootprintPolicy{{Name: "europe.yaml", YAML: examples.Europe}}}
	FullFootprint = FootprintOptions{Lines: []int{10_000, 100_000, 400_000, 1_000_000}, Bans: []int{0, 100_000, 1_000_000}, Rounds: 3,
		Policies: []FootprintPolicy{{Name: "europe.yaml", YAML: examples.Europe}}}
)

// Footprint steps, as the rows name them.
const (
	StepCompile      = "ipfence compile"
	StepApply        = "ipfence apply"
	StepNft          = "nft -f (one interval set)"
	StepIPSet        = "ipset restore (hash:net)"
	StepDaemonLoad   = "ipfence daemon: load"
	StepDaemonReload = "ipfence daemon: 1% refresh"
	StepDaemonBans   = "ipfence daemon: bans"
	// StepDaemonPolicy is the daemon's load of a policy (FootprintOptions.Policies),
	// followed by its name.
	StepDaemonPolicy = "ipfence daemon: load of "
)

// FootprintRow is one step at one size: medians over the runs.
type FootprintRow struct {
	Step     string `json:"step"`
	Lines    int    `json:"feed_lines"`
	Prefixes int    `json:"prefixes"` // distinct, after aggregation
	Bans     int    `json:"bans,omitempty"`
	// PeakMiB is the process's peak RSS during the step; IdleMiB the
	// daemon's RSS a few seconds after it (daemon steps only).
	PeakMiB float64 `json:"peak_rss_mib"`
	IdleMiB float64 `json:"idle_rss_mib,omitempty"`
	CPUSec  float64 `json:"cpu_s"`
	WallSec float64 `json:"wall_s"`
	Runs    int     `json:"runs"`
}

// FootprintResult is what Footprint measured.
type FootprintResult struct {
	Rows []FootprintRow `json:"rows"`
	// BytesPerBan is the daemon's idle RSS growth per ban, at the most
	// bans measured.
	BytesPerBan float64 `json:"idle_bytes_per_ban,omitempty"`
}

// FootprintSteps is the number of progress steps Footprint reports.
func FootprintSteps(o FootprintOptions) int {
	o.Lines = feedSizes(o.Lines)
	n := len(o.Lines) * o.Rounds * 5
	if len(o.Bans) > 1 && len(o.Lines) > 0 {
		n += o.Rounds
	}
	return n + len(o.Policies)*o.Rounds
}

// feedSizes is lines without the sizes of 0 (--footprint-lines 0: no
// feed, the policies alone).
func feedSizes(lines []int) []int {
	return slices.DeleteFunc(slices.Clone(lines), func(n int) bool { return n <= 0 })
}

// sample is what one process, or one step of the daemon, cost.
type sample struct{ peak, idle, cpu, wall float64 }

// Footprint runs the footprint scenario in lab's firewall namespace.
func Footprint(ctx context.Context, lab *netns.Lab, o FootprintOptions, p *Progress) (*FootprintResult, error) {
	bin := o.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "ipfence-footprint-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f := &footprint{bin: bin, dir: dir, ns: lab.FW}
	res := &FootprintResult{}
	o.Lines = feedSizes(o.Lines)
	for _, n := range o.Lines {
		// Each size starts as a new host would: without the state (the
		// feed's last good copy) of the size before, whose growth gate
		// refuses a feed nine times as big.
		if err := os.RemoveAll(f.path("state")); err != nil {
			return nil, err
		}
		prefixes, err := f.writeFeed(n, 0)
		if err != nil {
			return nil, err
		}
		runs := map[string][]sample{}
		for round := range o.Rounds {
			for _, st := range []struct {
				name string
				run  func(context.Context) ([]sample, error)
			}{{StepCompile, f.compile}, {StepApply, f.apply}, {StepNft, f.nft}, {StepIPSet, f.ipset}, {StepDaemonLoad, f.daemon}} {
				p.Step(fmt.Sprintf("footprint: %s, %d lines, round %d/%d", st.name, n, round+1, o.Rounds))
				ss, err := st.run(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s, %d lines: %w", st.name, n, err)
				}
				if st.name == StepDaemonLoad {
					runs[StepDaemonReload] = append(runs[StepDaemonReload], ss[1])
				}
				runs[st.name] = append(runs[st.name], ss[0])
				if st.name == StepDaemonLoad {
					if _, err := f.writeFeed(n, 0); err != nil { // undo the refresh
						return nil, err
					}
				}
			}
		}
		for _, step := range []string{StepCompile, StepApply, StepNft, StepIPSet, StepDaemonLoad, StepDaemonReload} {
			res.Rows = append(res.Rows, medianRow(step, n, prefixes, 0, runs[step]))
		}
	}
	if len(o.Bans) > 1 && len(o.Lines) > 0 {
		n := o.Lines[0]
		prefixes, err := f.writeFeed(n, 0)
		if err != nil {
			return nil, err
		}
		base := map[int][]sample{}
		for round := range o.Rounds {
			p.Step(fmt.Sprintf("footprint: daemon with %v bans, round %d/%d", o.Bans[1:], round+1, o.Rounds))
			ss, err := f.daemonBans(ctx, o.Bans)
			if err != nil {
				return nil, fmt.Errorf("daemon bans: %w", err)
			}
			for i, s := range ss {
				base[o.Bans[i]] = append(base[o.Bans[i]], s)
			}
		}
		for _, b := range o.Bans {
			res.Rows = append(res.Rows, medianRow(StepDaemonBans, n, prefixes, b, base[b]))
		}
		last, first := res.Rows[len(res.Rows)-1], res.Rows[len(res.Rows)-len(o.Bans)]
		if last.Bans > 0 {
			res.BytesPerBan = (last.IdleMiB - first.IdleMiB) * (1 << 20) / float64(last.Bans)
		}
	}
	for _, pol := range o.Policies {
		path := pol.Path
		if path == "" {
			path = f.path("policy-" + filepath.Base(pol.Name))
			if err := os.WriteFile(path, pol.YAML, 0o644); err != nil {
				return nil, err
			}
		}
		var ss []sample
		for round := range o.Rounds {
			p.Step(fmt.Sprintf("footprint: daemon load of %s, round %d/%d", pol.Name, round+1, o.Rounds))
			s, err := f.daemonPolicy(ctx, path)
			if err != nil {
				return nil, fmt.Errorf("daemon load of %s: %w", pol.Name, err)
			}
			ss = append(ss, s)
		}
		res.Rows = append(res.Rows, medianRow(StepDaemonPolicy+pol.Name, 0, 0, 0, ss))
	}
	return res, nil
}

// daemonPolicy starts the daemon on the policy at path and measures its
// load: peak and idle RSS, CPU, and the wall time until it was ready.
func (f *footprint) daemonPolicy(ctx context.Context, path string) (sample, error) {
	d, err := f.startDaemonOn(ctx, path)
	if err != nil {
		return sample{}, err
	}
	defer d.stop()
	s, err := d.settle(ctx)
	s.wall = d.Ready.Sub(d.Started).Seconds()
	return s, err
}

func medianRow(step string, lines, prefixes, bans int, ss []sample) FootprintRow {
	col := func(v func(sample) float64) float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = v(s)
		}
		return Median(xs)
	}
	return FootprintRow{Step: step, Lines: lines, Prefixes: prefixes, Bans: bans, Runs: len(ss),
		PeakMiB: col(func(s sample) float64 { return s.peak }), IdleMiB: col(func(s sample) float64 { return s.idle }),
		CPUSec: col(func(s sample) float64 { return s.cpu }), WallSec: col(func(s sample) float64 { return s.wall })}
}

// footprint holds one run's files: the feed, its policy, ipfence's state.
type footprint struct {
	bin, dir, ns string
	lines        int            // the feed's
	feed         []netip.Prefix // the feed's aggregated prefixes
}

func (f *footprint) path(name string) string { return filepath.Join(f.dir, name) }

// writeFeed writes the feed of n lines (seeded by n), with change lines
// in every 10,000 replaced, and its policy; it returns the number of
// distinct prefixes.
func (f *footprint) writeFeed(n, change int) (int, error) {
	r := rand.New(rand.NewPCG(uint64(n), 25))
	var b bytes.Buffer
	var lines []netip.Prefix
	for i := range n {
		a := [4]byte{byte(1 + r.IntN(223)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}
		if change > 0 && i%10_000 < change {
			a[3] ^= 0x55 // another address (or /24) of the same network
			a[2] ^= byte(i)
		}
		p := netip.PrefixFrom(netip.AddrFrom4(a), 32)
		if i%4 == 0 {
			p = netip.PrefixFrom(netip.AddrFrom4(a), 24).Masked()
		}
		lines = append(lines, p)
		b.WriteString(p.String())
		b.WriteByte('\n')
	}
	if err := os.WriteFile(f.path("feed.txt"), b.Bytes(), 0o644); err != nil {
		return 0, err
	}
	pol := "sources: {feed: {format: list, paths: [feed.txt]}}\n" +
		"rules: [{name: feed, action: drop, match: {source: feed}}]\n"
	if err := os.WriteFile(f.path("policy.yaml"), []byte(pol), 0o644); err != nil {
		return 0, err
	}
	f.feed, f.lines = aggregate(lines), n
	return len(f.feed), nil
}

// aggregate is ps sorted without the prefixes that lie within another
// (the feed's /32s and /24s never merge into shorter prefixes: this is
// its minimal cover).
func aggregate(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out := ps[:0]
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// ipfence runs the ipfence binary with args and measures it.
func (f *footprint) ipfence(ctx context.Context, args ...string) (sample, error) {
	return measureProc(ctx, nil, f.bin, args...)
}

func (f *footprint) compile(ctx context.Context) ([]sample, error) {
	s, err := f.ipfence(ctx, "compile", "--policy", f.path("policy.yaml"), "--state", f.path("state"), "-o", os.DevNull)
	return []sample{s}, err
}

func (f *footprint) apply(ctx context.Context) ([]sample, error) {
	s, err := f.ipfence(ctx, "apply", "--policy", f.path("policy.yaml"), "--state", f.path("state"), "--netns", f.ns)
	// Flushed whatever happened: a failed apply may have left a table.
	if _, ferr := f.ipfence(context.WithoutCancel(ctx), "flush", "--state", f.path("state"), "--netns", f.ns); err == nil {
		err = ferr
	}
	if err != nil {
		return nil, err
	}
	return []sample{s}, nil
}

// nft loads the feed as one interval set with nft -f, as a user without
// ipfence would, and removes it.
func (f *footprint) nft(ctx context.Context) ([]sample, error) {
	var b bytes.Buffer
	b.WriteString("table ip footprint {\n\tset feed {\n\t\ttype ipv4_addr; flags interval\n\t\telements = {\n")
	for _, p := range f.feed {
		b.WriteString("\t\t\t" + p.String() + ",\n")
	}
	b.WriteString("\t\t}\n\t}\n\tchain pre {\n\t\ttype filter hook prerouting priority -300; policy accept;\n\t\tip saddr @feed drop\n\t}\n}\n")
	if err := os.WriteFile(f.path("feed.nft"), b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	s, err := measureProc(ctx, nil, "ip", "netns", "exec", f.ns, "nft", "-f", f.path("feed.nft"))
	if err != nil {
		return nil, err
	}
	if _, err := measureProc(context.WithoutCancel(ctx), nil, "ip", "netns", "exec", f.ns, "nft", "delete", "table", "ip", "footprint"); err != nil {
		return nil, err
	}
	return []sample{s}, nil
}

// ipset restores the feed into a hash:net set and destroys it.
func (f *footprint) ipset(ctx context.Context) ([]sample, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "create ipfence-footprint hash:net family inet hashsize %d maxelem %d\n", 1<<max(10, bitsFor(len(f.feed))), max(65536, 2*len(f.feed)))
	for _, p := range f.feed {
		b.WriteString("add ipfence-footprint " + p.String() + "\n")
	}
	s, err := measureProc(ctx, bytes.NewReader(b.Bytes()), "ip", "netns", "exec", f.ns, "ipset", "restore")
	// Destroyed whatever happened: a restore that failed half way leaves
	// the set.
	_, derr := measureProc(context.WithoutCancel(ctx), nil, "ip", "netns", "exec", f.ns, "ipset", "destroy", "ipfence-footprint")
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, err
	}
	return []sample{s}, nil
}

// bitsFor is the bits of n's next power of two.
func bitsFor(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

// daemon starts the daemon on the feed, measures its load (peak, idle,
// CPU), then a refresh that changes 1% of the feed (its own peak, from a
// reset high-water mark, and CPU), and stops it.
func (f *footprint) daemon(ctx context.Context) ([]sample, error) {
	d, err := f.startDaemon(ctx)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	load, err := d.settle(ctx)
	if err != nil {
		return nil, err
	}
	load.wall = d.Ready.Sub(d.Started).Seconds()
	if err := d.ResetPeak(); err != nil {
		return nil, err
	}
	cpu0 := load.cpu
	if _, err := f.writeFeed(f.lines, 100); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := d.Client.Reload(ctx); err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	wall := time.Since(t0).Seconds()
	refresh, err := d.settle(ctx)
	if err != nil {
		return nil, err
	}
	refresh.cpu -= cpu0
	refresh.wall = wall
	return []sample{load, refresh}, nil
}

// daemonBans starts the daemon and bans up to each count of bans in turn
// (single addresses from 100.64.0.0 up, `ipfence ban -` of at most
// banBatch at a time).
// The first count is the daemon without bans (0): its idle RSS after the
// load. For each later count: the daemon's peak RSS and CPU over the
// step (from a reset high-water mark), its idle RSS after it, and the
// wall time of the ban command.
func (f *footprint) daemonBans(ctx context.Context, counts []int) ([]sample, error) {
	d, err := f.startDaemon(ctx)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	var out []sample
	have := 0
	for _, n := range counts {
		if n <= have {
			s, err := d.settle(ctx)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
			continue
		}
		before, err := d.settle(ctx)
		if err != nil {
			return nil, err
		}
		if err := d.ResetPeak(); err != nil {
			return nil, err
		}
		// In requests of banBatch: the API takes 8 MiB a request.
		var wall float64
		for from := have; from < n; from += banBatch {
			var b bytes.Buffer
			for i := from; i < min(n, from+banBatch); i++ {
				a := 0x64400000 + uint32(i)
				fmt.Fprintf(&b, "%d.%d.%d.%d\n", a>>24, a>>16&0xff, a>>8&0xff, a&0xff)
			}
			ban, err := measureProc(ctx, &b, f.bin, "ban", "-", "--socket", d.Socket, "--state", d.State, "--netns", f.ns, "--ttl", "1h")
			if err != nil {
				return nil, err
			}
			wall += ban.wall
		}
		have = n
		if c, err := d.Client.Count(ctx); err != nil || c.Total != n {
			return nil, fmt.Errorf("the daemon holds %v bans, want %d (%v)", c, n, err)
		}
		s, err := d.settle(ctx)
		if err != nil {
			return nil, err
		}
		s.cpu -= before.cpu
		s.wall = wall
		out = append(out, s)
	}
	return out, nil
}

// banBatch is the most bans daemonBans sends in one request.
const banBatch = 200_000

// measureProc runs name with args (stdin from in) under GNU time and
// returns its peak RSS, CPU and wall time from the kernel's accounting of
// the process (wait4). Go starts processes as vfork does, sharing its
// memory until the exec, and the kernel then counts the parent's peak RSS
// as the child's: time's own fork keeps the figures the child's.
func measureProc(ctx context.Context, in io.Reader, name string, args ...string) (sample, error) {
	out, err := os.CreateTemp("", "ipfence-footprint-time-")
	if err != nil {
		return sample{}, err
	}
	out.Close()
	defer os.Remove(out.Name())
	cmd := exec.CommandContext(ctx, "/usr/bin/time", append([]string{"-f", "%M %U %S", "-o", out.Name(), name}, args...)...)
	cmd.Stdin = in
	killGroup(cmd)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return sample{}, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLine(stderr.String()))
	}
	wall := time.Since(t0).Seconds()
	data, err := os.ReadFile(out.Name())
	if err != nil {
		return sample{}, err
	}
	var kb, user, sys float64
	if _, err := fmt.Sscan(lastLine(string(data)), &kb, &user, &sys); err != nil {
		return sample{}, fmt.Errorf("reading /usr/bin/time's figures %q: %w", data, err)
	}
	return sample{peak: kb / 1024, cpu: user + sys, wall: wall}, nil
}

// killGroup makes cmd a process group of its own that cancelling its
// context kills whole (time and what it measures, ip and what it runs).
func killGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// daemonProc is a daemon the scenario started.
type daemonProc struct {
	*daemonproc.Proc
	f *footprint
}

// startDaemon starts the daemon on the feed's policy, in a folder of its
// own under the run's.
func (f *footprint) startDaemon(ctx context.Context) (*daemonProc, error) {
	return f.startDaemonOn(ctx, f.path("policy.yaml"))
}

// startDaemonOn starts the daemon on the policy at path.
func (f *footprint) startDaemonOn(ctx context.Context, path string) (*daemonProc, error) {
	dir, err := os.MkdirTemp(f.dir, "daemon-")
	if err != nil {
		return nil, err
	}
	p, err := daemonproc.Start(ctx, daemonproc.Options{Exe: f.bin, Policy: path, NetNS: f.ns, Dir: dir})
	if err != nil {
		_, _ = measureProc(context.WithoutCancel(ctx), nil, f.bin, "flush", "--state", filepath.Join(dir, "state"), "--netns", f.ns)
		return nil, err
	}
	return &daemonProc{Proc: p, f: f}, nil
}

// settle waits for the daemon to go idle (its RSS steady over a second,
// after the collection it runs after a load), then reads its peak and
// idle RSS and its CPU so far from /proc.
func (d *daemonProc) settle(ctx context.Context) (sample, error) {
	prev := -1.0
	for range 30 {
		select {
		case <-ctx.Done():
			return sample{}, ctx.Err()
		case <-time.After(time.Second):
		}
		s, err := d.read()
		if err != nil {
			return sample{}, err
		}
		if s.idle == prev {
			return s, nil
		}
		prev = s.idle
	}
	return d.read()
}

// read reads the daemon's VmHWM, VmRSS and CPU.
func (d *daemonProc) read() (sample, error) {
	rss, peak, err := d.Memory()
	if err != nil {
		return sample{}, err
	}
	cpu, err := d.CPU()
	if err != nil {
		return sample{}, err
	}
	return sample{peak: peak, idle: rss, cpu: cpu}, nil
}

// stop stops the daemon and flushes what it loaded.
func (d *daemonProc) stop() {
	_ = d.Stop()
	_, _ = measureProc(context.Background(), nil, d.f.bin, "flush", "--state", d.State, "--netns", d.f.ns)
	_ = os.RemoveAll(filepath.Dir(d.State))
}

// CSV renders the rows.
func (r *FootprintResult) CSV() string {
	var b strings.Builder
	b.WriteString("step,feed_lines,prefixes,bans,peak_rss_mib,idle_rss_mib,cpu_s,wall_s,runs\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "%s,%d,%d,%d,%.1f,%.1f,%.2f,%.2f,%d\n", csvQuote(x.Step), x.Lines, x.Prefixes, x.Bans, x.PeakMiB, x.IdleMiB, x.CPUSec, x.WallSec, x.Runs)
	}
	return b.String()
}

// Markdown renders the report.
func (r *FootprintResult) Markdown() string {
	var b strings.Builder
	b.WriteString("## footprint: memory and CPU per step, each in a process of its own\n\n")
	b.WriteString("Medians over the runs. Peak RSS: the process's high-water mark (the daemon's over the step, from a reset mark);" +
		" idle RSS: the daemon's once it is steady again after the step. Daemon CPU: over the step." +
		" Bans rows: the daemon with no bans after its load, then each `ipfence ban -` of the bans added (its wall time).\n\n")
	var rows [][]string
	for _, x := range r.Rows {
		idle := ""
		if x.IdleMiB > 0 {
			idle = fmt.Sprintf("%.0f", x.IdleMiB)
		}
		bans, lines, prefixes := "", strconv.Itoa(x.Lines), strconv.Itoa(x.Prefixes)
		if x.Step == StepDaemonBans {
			bans = strconv.Itoa(x.Bans)
		}
		if strings.HasPrefix(x.Step, StepDaemonPolicy) {
			lines, prefixes = "", ""
		}
		rows = append(rows, []string{x.Step, lines, prefixes, bans,
			fmt.Sprintf("%.0f", x.PeakMiB), idle, fmt.Sprintf("%.2f", x.CPUSec), fmt.Sprintf("%.2f", x.WallSec), strconv.Itoa(x.Runs)})
	}
	table(&b, []string{"step", "feed lines", "prefixes", "bans", "peak RSS (MiB)", "idle RSS (MiB)", "CPU (s)", "wall (s)", "runs"}, rows)
	if r.BytesPerBan > 0 {
		fmt.Fprintf(&b, "\nDaemon idle RSS per ban: %.0f bytes.\n", r.BytesPerBan)
	}
	return b.String()
}

// Figures plots peak RSS and CPU against the feed's size, a line per step.
func (r *FootprintResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	for _, q := range []struct {
		name, label string
		v           func(FootprintRow) float64
	}{{"rss", "peak RSS (MiB)", func(x FootprintRow) float64 { return x.PeakMiB }}, {"cpu", "CPU seconds", func(x FootprintRow) float64 { return x.CPUSec }}} {
		fig := &plot.Figure{Title: "footprint: " + q.label, XLabel: "feed lines", YLabel: q.label, LogY: true}
		for _, step := range ordered(r.Rows, func(x FootprintRow) string { return x.Step }) {
			if step == StepDaemonBans || strings.HasPrefix(step, StepDaemonPolicy) {
				continue
			}
			s := plot.Series{Name: step}
			for _, x := range r.Rows {
				if x.Step == step {
					v := q.v(x)
					s.Points = append(s.Points, plot.Point{X: float64(x.Lines), Min: v, Median: v, Max: v})
				}
			}
			fig.Series = append(fig.Series, s)
		}
		figs["footprint-"+q.name] = fig
	}
	return figs
}
