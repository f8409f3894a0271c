package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft/nfttest"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// startDaemon starts `exe daemon --socket socket args...` and returns
// once its API answers.
func startDaemon(t testing.TB, exe, socket string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"daemon", "--socket", socket}, args...)...)
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(socket)
	defer cl.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := cl.Status(context.Background()); err == nil {
			return cmd
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("daemon not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// normalizedRuleset is a digest of `nft -j list ruleset` of ns, normalized
// (nfttest.Ruleset) without handles and in a sorted order of objects:
// equal for equal rulesets however they were loaded.
func normalizedRuleset(t *testing.T, ns string) string {
	t.Helper()
	var objs []string
	for _, o := range nfttest.Ruleset(t, ns, "handle") {
		objs = append(objs, o.String())
	}
	slices.Sort(objs)
	return fmt.Sprintf("%x", sha256.Sum256([]byte(strings.Join(objs, "\n"))))
}

// TestKillDaemonDuringRefresh kills the daemon with SIGKILL while it
// sends a big feed refresh (a diff of some 50k elements): the kernel
// holds the ruleset before the refresh or after it, never a mix, and a
// restarted daemon carries on.
func TestKillDaemonDuringRefresh(t *testing.T) {
	lab := netnstest.New(t)
	exe := buildIpfence(t)
	dir := t.TempDir()
	small := "192.0.2.0/24\n2001:db8:1::/48\n"
	var b strings.Builder
	b.WriteString(small)
	for i := range 50000 { // every other /24 from 60.0.0.0: 50k prefixes that do not merge
		v := 60<<24 + uint32(i)*512
		fmt.Fprintf(&b, "%d.%d.%d.0/24\n", v>>24, v>>16&255, v>>8&255)
	}
	big := b.String()
	write(t, dir, "feed.txt", small)
	write(t, dir, "p.yaml", "sources:\n  feed: {format: list, paths: [feed.txt], max_shrink: 0, max_growth: 0}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	socket := filepath.Join(dir, "api.sock")
	start := func() *exec.Cmd {
		t.Helper()
		return startDaemon(t, exe, socket, "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW,
			"--state", filepath.Join(dir, "state"), "--metrics", "", "--tick", "1h")
	}
	reload := func() error {
		cl := api.NewClient(socket)
		defer cl.Close()
		_, err := cl.Reload(context.Background())
		return err
	}
	d := start()
	before := normalizedRuleset(t, lab.FW)
	write(t, dir, "feed.txt", big)
	t0 := time.Now()
	if err := reload(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	t.Logf("the big refresh takes %v", took)
	after := normalizedRuleset(t, lab.FW)
	write(t, dir, "feed.txt", small)
	if err := reload(); err != nil {
		t.Fatal(err)
	}
	if got := normalizedRuleset(t, lab.FW); got != before {
		t.Fatal("a refresh there and back does not give the ruleset back")
	}

	r := rand.New(rand.NewPCG(2, 2))
	seen := map[string]int{}
	for i := range 8 {
		write(t, dir, "feed.txt", big)
		go func() { _ = reload() }()
		// Kill somewhere in the refresh (read, compile, diff, one
		// transaction), whose time the first refresh measured.
		time.Sleep(time.Duration(r.Int64N(int64(took) * 3 / 2)))
		_ = d.Process.Signal(syscall.SIGKILL)
		_ = d.Wait()
		switch normalizedRuleset(t, lab.FW) {
		case before:
			seen["before"]++
		case after:
			seen["after"]++
		default:
			t.Fatalf("kill %d: the kernel holds neither the ruleset before the refresh nor the one after it", i)
		}
		write(t, dir, "feed.txt", small)
		d = start()
		if got := normalizedRuleset(t, lab.FW); got != before {
			t.Fatalf("kill %d: the restarted daemon did not load the small feed", i)
		}
	}
	_ = d.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
	t.Logf("after SIGKILL: %v", seen)
}
