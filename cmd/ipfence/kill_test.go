package main

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// buildIpfence builds the ipfence binary for tests that need a process
// of their own.
func buildIpfence(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "ipfence")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("building ipfence: %v\n%s", err, out)
	}
	return exe
}

// TestKillDuringApply kills `ipfence apply` of a big policy (the Europe
// policy: some 260k elements, half a second of netlink) with SIGKILL at
// random moments: the kernel must hold the old ruleset or the new one,
// never a mix.
func TestKillDuringApply(t *testing.T) {
	lab := netnstest.New(t)
	exe := buildIpfence(t)
	dir := t.TempDir()
	write(t, dir, "feed.txt", "192.0.2.0/24\n")
	write(t, dir, "small.yaml", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: f, action: drop, match: {source: f}}\n")
	small, big := filepath.Join(dir, "small.yaml"), "../../examples/europe.yaml"
	apply := func(pol string) {
		t.Helper()
		if out, err := exec.Command(exe, "apply", "--policy", pol, "--netns", lab.FW, "--state", dir).CombinedOutput(); err != nil {
			t.Fatalf("apply %s: %v\n%s", pol, err, out)
		}
	}
	digest := func() string {
		return fmt.Sprintf("%x", sha256.Sum256([]byte(netnstest.Ruleset(t, lab.FW))))
	}
	apply(big)
	bigSum := digest()
	apply(small)
	smallSum := digest()

	r := rand.New(rand.NewPCG(1, 1))
	seen := map[string]int{}
	for i := range 8 {
		cmd := exec.Command(exe, "apply", "--policy", big, "--netns", lab.FW, "--state", dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(r.IntN(1500)) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		switch sum := digest(); sum {
		case smallSum:
			seen["old"]++
		case bigSum:
			seen["new"]++
			apply(small)
		default:
			t.Fatalf("kill %d: the kernel holds neither the old nor the new ruleset", i)
		}
		// A killed apply may leave its lock file; it is released with the
		// process (flock), so the next apply runs.
		if _, err := os.Stat(filepath.Join(dir, "lock")); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("after SIGKILL: %v", seen)
}
