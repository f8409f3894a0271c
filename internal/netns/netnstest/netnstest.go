// Package netnstest gives kernel tests a fresh netns.Lab that is removed
// when the test ends.
//
// New skips the test when not running as root, unless the environment has
// CI=true, where it fails instead: CI runs as root, so a skip there would
// hide the kernel tests. The first New in a test binary sweeps namespaces
// left by crashed runs. Labs are removed by t.Cleanup (which also runs when
// the test panics) and, because `go test -timeout` kills the binary without
// running cleanups, also by a watchdog shortly before the test deadline.
package netnstest

import (
	"fmt"
	"os"
	"regexp"
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

// NeedRoot skips t when not root, and fails it when CI=true: kernel
// tests always run in CI.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("kernel test needs root (CI=true: not skipping)")
		}
		t.Skip("kernel test needs root; skipping")
	}
}

// New returns a new lab named after the process and a counter, so test
// binaries running in parallel do not collide, and registers its removal
// with t.Cleanup. It skips t when not root (fails it when CI=true), and
// fails t when the lab cannot be created.
func New(t testing.TB) *netns.Lab {
	t.Helper()
	NeedRoot(t)
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
	out, err := netns.Exec(ns, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v\n%s", ns, err, out)
	}
	return expires.ReplaceAllString(string(out), "")
}

var expires = regexp.MustCompile(` expires [0-9a-z]+`)

// BPFFS mounts a bpf filesystem of the test's own in a temporary folder
// (the host's /sys/fs/bpf is left alone) and unmounts it when the test
// ends, which releases whatever the test pinned there.
func BPFFS(t testing.TB) string {
	t.Helper()
	NeedRoot(t)
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
