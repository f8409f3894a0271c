// Package netnstest gates kernel tests and gives them a fresh netns.Lab
// that is removed when the test ends.
//
// Kernel is the one gate of the kernel tier: it skips the test under
// `go test -short`, and when not running as root or when a program the
// test runs is missing, unless the environment has CI=true, where it fails
// instead: CI runs as root with every tool installed, so a skip there
// would hide the kernel tests. New and BPFFS pass through it. The first
// New in a test binary sweeps namespaces left by crashed runs. Labs are
// removed by t.Cleanup (which also runs when the test panics) and,
// because `go test -timeout` kills the binary without running cleanups,
// also by a watchdog shortly before the test deadline.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// deadlineMargin is how long before the test binary's deadline the
// watchdog removes all labs still open.
const deadlineMargin = 3 * time.Second

var (
	sweepOnce sync.Once
	seq       atomic.Uint64

	mu       sync.Mutex
	open     = map[*netns.Lab]bool{}
	watchdog *time.Timer
)

// Kernel gates a kernel test (one that needs root, the kernel, or
// programs of the system): it skips t under -short, and when not root or
// when one of tools is not on PATH; with CI=true it fails t instead,
// saying what is missing.
func Kernel(t testing.TB, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("kernel test: skipped under -short")
	}
	require(t, "kernel test", os.Geteuid() == 0, tools)
}

// Tools gates a test that runs programs of the system but needs neither
// root nor the kernel (a differential test against iprange, say), so it
// runs under -short: it skips t when one of tools is not on PATH, and
// with CI=true fails it instead, naming what is missing.
func Tools(t testing.TB, tools ...string) {
	t.Helper()
	require(t, "test", true, tools)
}

// require skips t, or fails it when CI=true, unless root and tools are
// all there.
func require(t testing.TB, what string, root bool, tools []string) {
	t.Helper()
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	var needs []string
	if !root {
		needs = append(needs, "root")
	}
	if len(missing) > 0 {
		needs = append(needs, strings.Join(missing, ", ")+" on PATH (scripts/install-deps.sh installs them)")
	}
	if len(needs) > 0 {
		Lacking(t, "%s needs %s", what, strings.Join(needs, " and "))
	}
}

// Lacking ends t because the system lacks something it needs, which
// format and args say: it skips t, and with CI=true, where everything a
// test needs is there, fails it instead.
func Lacking(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, failing instead of skipping: "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// New returns a new lab named after the process and a counter, so test
// binaries running in parallel do not collide, and registers its removal
// with t.Cleanup. It gates t with Kernel (ip and tools must be on PATH),
// and fails t when the lab cannot be created.
func New(t testing.TB, tools ...string) *netns.Lab {
	t.Helper()
	Kernel(t, append([]string{"ip"}, tools...)...)
	sweepOnce.Do(func() {
		if removed, err := netns.Sweep(); err != nil {
			t.Logf("sweeping stale namespaces: %v", err)
		} else if len(removed) > 0 {
			t.Logf("swept stale namespaces %v", removed)
		}
	})
	name := fmt.Sprintf("t%d-%d", os.Getpid(), seq.Add(1))
	lab, err := netns.NewLab(name)
	if err != nil {
		t.Fatalf("creating lab: %v", err)
	}
	track(t, lab)
	t.Cleanup(func() {
		untrack(lab)
		if err := lab.Close(); err != nil {
			t.Errorf("removing lab: %v", err)
		}
	})
	return lab
}

func track(t testing.TB, lab *netns.Lab) {
	mu.Lock()
	defer mu.Unlock()
	open[lab] = true
	if watchdog != nil {
		return
	}
	type deadliner interface{ Deadline() (time.Time, bool) }
	d, ok := t.(deadliner)
	if !ok {
		return
	}
	deadline, ok := d.Deadline()
	if !ok || time.Until(deadline) < 2*deadlineMargin {
		return
	}
	watchdog = time.AfterFunc(time.Until(deadline)-deadlineMargin, func() {
		mu.Lock()
		defer mu.Unlock()
		for lab := range open {
			fmt.Fprintf(os.Stderr, "netnstest: test deadline near, removing lab %s\n", lab.Name)
			lab.Close()
		}
	})
}

func untrack(lab *netns.Lab) {
	mu.Lock()
	defer mu.Unlock()
	delete(open, lab)
}

// Ruleset returns `nft list ruleset` of namespace ns without the
// counting-down "expires ..." of elements with timeouts, so that two
// listings of the same ruleset compare equal.
func Ruleset(t testing.TB, ns string) string {
	t.Helper()
	return expires.ReplaceAllString(Exec(t, ns, "nft", "list", "ruleset"), "")
}

// Saved returns what an iptables-save command (argv) lists in namespace
// ns without its "# Generated/Completed ... on <time>" lines, so that
// two listings of the same chains a second apart compare equal.
func Saved(t testing.TB, ns string, argv ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range strings.SplitAfter(Exec(t, ns, argv...), "\n") {
		if !strings.HasPrefix(l, "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// Exec runs argv in namespace ns and returns its combined output. It
// fails t when the command fails, so that a check on what a listing
// holds (or lacks) cannot pass on the error message of a failed one.
func Exec(t testing.TB, ns string, argv ...string) string {
	t.Helper()
	out, err := netns.Exec(ns, argv...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(out)
}

var expires = regexp.MustCompile(` expires [0-9a-z]+`)

// BPFFS mounts a bpf filesystem of the test's own in a temporary folder
// (the host's /sys/fs/bpf is left alone) and unmounts it when the test
// ends, which releases whatever the test pinned there.
func BPFFS(t testing.TB) string {
	t.Helper()
	Kernel(t)
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting a bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the test's bpffs: %v", err)
		}
	})
	return dir
}
