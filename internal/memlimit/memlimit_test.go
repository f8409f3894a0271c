package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"
)

// TestFromCgroup: the lowest memory.high or memory.max of the cgroup and
// its parents; "max" is no limit; cgroup v1 and no limit give none.
func TestFromCgroup(t *testing.T) {
	root := t.TempDir()
	write := func(dir, file, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("system.slice/ipfence.service", "memory.high", "max")
	write("system.slice/ipfence.service", "memory.max", "max")
	write("system.slice", "memory.max", "max")
	self := []byte("0::/system.slice/ipfence.service\n")
	if v, ok := FromCgroup(root, self); ok {
		t.Fatalf("no limits: got %d", v)
	}
	write("system.slice", "memory.max", "2147483648")
	if v, ok := FromCgroup(root, self); !ok || v != 2<<30 {
		t.Fatalf("a parent's memory.max: got %d, %v", v, ok)
	}
	write("system.slice/ipfence.service", "memory.high", "402653184")
	write("system.slice/ipfence.service", "memory.max", "536870912")
	if v, ok := FromCgroup(root, self); !ok || v != 384<<20 {
		t.Fatalf("the service's memory.high: got %d, %v", v, ok)
	}
	// cgroup v1: the memory controller's limit_in_bytes, where "no
	// limit" is a number near 2^63; the v2 files do not count there.
	v1 := []byte("12:memory:/system.slice/x\n1:name=systemd:/x\n0::/system.slice/ipfence.service\n")
	write("memory/system.slice/x", "memory.limit_in_bytes", "9223372036854771712")
	write("memory/system.slice", "memory.limit_in_bytes", "9223372036854771712")
	if v, ok := FromCgroup(root, v1); ok {
		t.Fatalf("cgroup v1 without a limit: got %d", v)
	}
	write("memory/system.slice/x", "memory.limit_in_bytes", "1073741824")
	if v, ok := FromCgroup(root, v1); !ok || v != 1<<30 {
		t.Fatalf("cgroup v1: got %d, %v", v, ok)
	}
}

// TestWithinLimit: factor × VmRSS less the binary's pages; nothing when
// the status lacks either or the limit would be tiny.
func TestWithinLimit(t *testing.T) {
	status := []byte("Name:\tipfence\nVmHWM:\t  90876 kB\nVmRSS:\t   40000 kB\nRssAnon:\t   18000 kB\nRssFile:\t   22000 kB\nRssShmem:\t       0 kB\n")
	if v, ok := WithinLimit(status, 1.5); !ok || v != (60000-22000)<<10 {
		t.Fatalf("got %d, %v; want %d", v, ok, (60000-22000)<<10)
	}
	for _, s := range []string{"VmRSS:\t40000 kB\n", "RssFile:\t22000 kB\n", "VmRSS:\t1000 kB\nRssFile:\t1000 kB\n", ""} {
		if v, ok := WithinLimit([]byte(s), 1.5); ok {
			t.Errorf("%q: got %d", s, v)
		}
	}
}

// TestWithin: the limit is lowered for the span and put back after; a
// lower limit in force stays.
func TestWithin(t *testing.T) {
	if _, err := os.ReadFile("/proc/self/status"); err != nil {
		t.Fatal(err)
	}
	orig := debug.SetMemoryLimit(math.MaxInt64)
	defer debug.SetMemoryLimit(orig)
	restore := Within(1.5)
	during := debug.SetMemoryLimit(-1)
	if during == math.MaxInt64 || during <= 0 {
		t.Fatalf("limit during the span: %d", during)
	}
	restore()
	if after := debug.SetMemoryLimit(-1); after != math.MaxInt64 {
		t.Fatalf("limit after: %d, want none", after)
	}
	debug.SetMemoryLimit(1 << 20)
	restore = Within(1.5)
	if during := debug.SetMemoryLimit(-1); during != 1<<20 {
		t.Fatalf("a lower limit in force was raised to %d", during)
	}
	restore()
}

// TestWithinLifts: work that needs more live memory than the limit gets
// the limit lifted (the collector would take half the CPU to no end),
// and the limit in force before is back after the span.
func TestWithinLifts(t *testing.T) {
	orig := debug.SetMemoryLimit(math.MaxInt64)
	defer debug.SetMemoryLimit(orig)
	restore := Within(1.5)
	defer restore()
	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		t.Fatal("no limit set")
	}
	var live [][]byte
	for debug.SetMemoryLimit(-1) == limit {
		if len(live) > 1024 { // 1 GiB, many times the limit
			t.Fatalf("the limit (%d MiB) stayed while %d MiB were live", limit>>20, len(live))
		}
		b := make([]byte, 1<<20)
		b[0] = 1
		live = append(live, b)
		time.Sleep(time.Millisecond)
	}
	t.Logf("limit %d MiB lifted at %d MiB live", limit>>20, len(live))
	restore()
	if after := debug.SetMemoryLimit(-1); after != math.MaxInt64 {
		t.Fatalf("limit after: %d, want none", after)
	}
}
