package xdp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// The helper process of TestTablesTooLargeForMemory (the test binary run
// again, see TestMain) builds tables of about 40 MiB, joins the memory
// cgroup the test made (so that only what it allocates from then on counts
// against the limit), and prepares them.
const (
	helperCgroup = "IPFENCE_TEST_CGROUP_PROCS" // the cgroup.procs file to join
	helperOpts   = "IPFENCE_TEST_XDP_OPTIONS"  // Options as JSON
)

// helperResult is what the helper reports on stdout.
type helperResult struct {
	ENOMEM bool   `json:"enomem"`
	Error  string `json:"error"`
}

// TestMain runs the helper process when asked to, the tests otherwise.
func TestMain(m *testing.M) {
	if procs := os.Getenv(helperCgroup); procs != "" {
		if err := prepareInCgroup(procs); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// prepareInCgroup is the helper process of TestTablesTooLargeForMemory.
func prepareInCgroup(procs string) error {
	var opt Options
	if err := json.Unmarshal([]byte(os.Getenv(helperOpts)), &opt); err != nil {
		return err
	}
	// One address in each of 40,000 /16s: 40,000 L2 chunks of 1 KiB.
	r := rand.New(rand.NewPCG(3, 4))
	var b netipx.IPSetBuilder
	for _, hi := range r.Perm(1 << 16)[:40000] {
		b.Add(netip.AddrFrom4([4]byte{byte(hi >> 8), byte(hi), 1, 1}))
	}
	l, err := BuildLayout([]Rule{{Name: "big", Drop: mustSet(&b)}})
	if err != nil {
		return err
	}
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	var res helperResult
	sw, err := Prepare(l, opt)
	if err == nil {
		sw.Close()
	} else {
		res.ENOMEM, res.Error = errors.Is(err, unix.ENOMEM), err.Error()
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// TestTablesTooLargeForMemory loads tables larger than the memory cgroup
// of the loading process allows (BPF maps are charged to it): Prepare
// fails with ENOMEM and a hint, and the program attached before keeps
// running, unchanged.
func TestTablesTooLargeForMemory(t *testing.T) {
	lab := netnstest.New(t)
	opt := Options{NetNS: lab.FW, Interfaces: []string{lab.FWIf}, PinDir: netnstest.BPFFS(t)}
	small, err := BuildLayout([]Rule{{Name: "x", Drop: setOf(t, "198.51.100.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	swapIn(t, small, opt)
	before, _ := attachedProgram(t, lab.DoFW, lab.FWIf)

	procs := memoryCgroup(t, 8<<20)
	js, _ := json.Marshal(opt)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperCgroup+"="+procs, helperOpts+"="+string(js))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	var res helperResult
	if json.Unmarshal(out, &res) != nil {
		t.Fatalf("helper process said %q", out)
	}
	if !res.ENOMEM || !strings.Contains(res.Error, "do not fit") {
		t.Errorf("Prepare of 40 MiB of tables under an 8 MiB memory limit: %+v; want ENOMEM with the hint", res)
	}
	t.Logf("the error: %s", res.Error)
	if after, _ := attachedProgram(t, lab.DoFW, lab.FWIf); after != before || after == 0 {
		t.Errorf("XDP program %d after the failed load, want %d", after, before)
	}
}

// memoryCgroup makes a memory cgroup limited to limit bytes (under this
// process's own in cgroup v1, under the root in cgroup v2) and returns
// its cgroup.procs file; the cgroup is removed when the test ends.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	dir, limitFile, err := memoryCgroupDir()
	if err != nil {
		netnstest.Lacking(t, "a memory cgroup to test in: %v", err)
	}
	cg := filepath.Join(dir, fmt.Sprintf("ipfence-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("removing the test's memory cgroup: %v", err)
		}
	})
	if err := os.WriteFile(filepath.Join(cg, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(cg, "cgroup.procs")
}

// memoryCgroupDir returns the cgroup folder to make a limited child in
// and the name of the limit's file: this process's memory cgroup in a v1
// hierarchy, or the root of a v2 hierarchy that delegates memory.
func memoryCgroupDir() (dir, limitFile string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options ... - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch {
		case tail[0] == "cgroup" && slices.Contains(strings.Split(tail[2], ","), "memory"):
			v1 = fields[4]
		case tail[0] == "cgroup2":
			v2 = fields[4]
		}
	}
	if v1 != "" {
		own, err := ownCgroup("memory")
		if err != nil {
			return "", "", err
		}
		return filepath.Join(v1, own), "memory.limit_in_bytes", nil
	}
	if v2 != "" {
		ctl, err := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control"))
		if err == nil && slices.Contains(strings.Fields(string(ctl)), "memory") {
			return v2, "memory.max", nil
		}
	}
	return "", "", errors.New("no cgroup v1 memory hierarchy, and no cgroup v2 root with the memory controller enabled")
}

// ownCgroup returns this process's cgroup path in the v1 hierarchy of
// controller.
func ownCgroup(controller string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("this process is in no %s cgroup", controller)
}
