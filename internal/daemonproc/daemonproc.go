// Package daemonproc runs `ipfence daemon` as a child process, for the
// measurements that look at it from outside: the ban stress run and the
// footprint benchmark.
package daemonproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/memlimit"
)

// Options say which daemon to run.
type Options struct {
	Exe    string // the ipfence binary
	Policy string
	NetNS  string
	// Dir holds the daemon's state (Dir/state), API socket
	// (Dir/api.sock) and log (Dir/daemon.log).
	Dir     string
	Metrics string   // the metrics listen address ("": none)
	Args    []string // more flags
}

// Proc is a running daemon.
type Proc struct {
	Cmd                *exec.Cmd
	Socket, State, Log string
	Client             *api.Client // on Socket
	Started, Ready     time.Time   // when it was started, and had loaded
	done               chan error  // Wait's result
	exited             chan struct{}
	once               sync.Once
	err                error
}

// StartTimeout bounds how long Start waits for the first load.
const StartTimeout = 2 * time.Minute

// Start starts the daemon in a process group of its own and waits until
// its API answers and its policy is loaded; it fails, with the log's last
// line, if the daemon exits first.
func Start(ctx context.Context, o Options) (*Proc, error) {
	p := &Proc{Socket: filepath.Join(o.Dir, "api.sock"), State: filepath.Join(o.Dir, "state"), Log: filepath.Join(o.Dir, "daemon.log"),
		done: make(chan error, 1), exited: make(chan struct{})}
	logf, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	args := []string{"daemon", "--policy", o.Policy, "--netns", o.NetNS, "--state", p.State, "--socket", p.Socket, "--metrics", o.Metrics}
	p.Cmd = exec.Command(o.Exe, append(args, o.Args...)...)
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.Started = time.Now()
	if err := p.Cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting the daemon: %w", err)
	}
	go func() { p.done <- p.Cmd.Wait(); logf.Close(); close(p.exited) }()
	p.Client = api.NewClient(p.Socket)
	deadline := time.Now().Add(StartTimeout)
	for {
		st, err := p.Client.Status(ctx)
		if err == nil && !st.Applied.IsZero() {
			p.Ready = time.Now()
			return p, nil
		}
		select {
		case <-p.exited:
			p.Stop()
			return nil, fmt.Errorf("the daemon exited before it loaded (%v): %s", p.err, p.lastLog())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("the daemon did not load in %v (%v): %s", StartTimeout, err, p.lastLog())
		}
	}
}

// lastLog is the last line of the daemon's log.
func (p *Proc) lastLog() string {
	data, _ := os.ReadFile(p.Log)
	s := strings.TrimSpace(string(data))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Pid is the daemon's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop sends SIGTERM and waits for the daemon to exit, killing its
// process group after 30 s; it returns how the daemon exited.
func (p *Proc) Stop() error {
	p.once.Do(func() {
		p.Client.Close()
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case p.err = <-p.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
			p.err = errors.Join(errors.New("killed after 30 s"), <-p.done)
		}
	})
	return p.err
}

// Memory is the daemon's resident memory now and its high-water mark
// (VmRSS and VmHWM), in MiB.
func (p *Proc) Memory() (rss, peak float64, err error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, 0, err
	}
	sizes := memlimit.StatusSizes(status)
	return float64(sizes["VmRSS"]) / (1 << 20), float64(sizes["VmHWM"]) / (1 << 20), nil
}

// CPU is the daemon's user and system time so far, in seconds.
func (p *Proc) CPU() (float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0, err
	}
	// Fields after the command's ")": state is the 3rd field, utime the
	// 14th and stime the 15th, in clock ticks (USER_HZ, 100 a second on
	// Linux whatever the kernel's own tick).
	fs := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if len(fs) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", p.Pid(), stat)
	}
	ut, _ := strconv.ParseFloat(fs[11], 64)
	st, _ := strconv.ParseFloat(fs[12], 64)
	return (ut + st) / 100, nil
}

// ResetPeak resets the daemon's RSS high-water mark (clear_refs 5).
func (p *Proc) ResetPeak() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Pid()), []byte("5"), 0)
}
