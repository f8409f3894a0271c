// Package memlimit gives the Go runtime a soft memory limit that fits the
// cgroup ipfence runs in.
//
// Under systemd, MemoryHigh= throttles a service past its value and
// MemoryMax= kills it; the runtime knows neither and lets the heap grow to
// twice what is live before it collects. With a soft limit below them
// (GOMEMLIMIT), the runtime collects harder as the heap nears the limit
// instead. An explicit GOMEMLIMIT wins.
package memlimit

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Share is the part of the cgroup's limit the heap is held to: the rest
// is the binary, stacks and what the runtime has not returned yet.
const Share = 0.9

// Set sets the runtime's soft memory limit to Share of the lowest memory
// limit of this process's cgroup and its parents (FromCgroup), unless
// GOMEMLIMIT is set or no limit applies. It returns the
// limit set, 0 for none.
func Set() int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	limit, ok := FromCgroup("/sys/fs/cgroup", self)
	if !ok {
		return 0
	}
	soft := int64(float64(limit) * Share)
	debug.SetMemoryLimit(soft)
	return soft
}

// FromCgroup returns the lowest memory limit set on this process's
// cgroup or its parents, under the cgroup file system mounted at root,
// from procSelfCgroup (the text of /proc/self/cgroup): memory.high and
// memory.max with cgroup v2, memory.limit_in_bytes of the memory
// controller with v1 (systemd's MemoryMax= there).
func FromCgroup(root string, procSelfCgroup []byte) (int64, bool) {
	var v2, v1 string
	sc := bufio.NewScanner(bytes.NewReader(procSelfCgroup))
	for sc.Scan() {
		id, rest, _ := strings.Cut(sc.Text(), ":")
		ctrl, path, _ := strings.Cut(rest, ":")
		switch {
		case id == "0" && ctrl == "":
			v2 = path
		case slices.Contains(strings.Split(ctrl, ","), "memory"):
			v1 = path
		}
	}
	best := int64(math.MaxInt64)
	lowest := func(dir string, files ...string) {
		for ; ; dir = filepath.Dir(dir) {
			for _, f := range files {
				data, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					continue
				}
				// "max" (v2) does not parse: no limit; v1 writes no
				// limit as a number near 2^63.
				v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
				if err == nil && v > 0 && v < best && v < 1<<62 {
					best = v
				}
			}
			if dir == root || dir == filepath.Dir(dir) {
				return
			}
		}
	}
	if v1 != "" {
		mem := filepath.Join(root, "memory")
		lowest(filepath.Join(mem, filepath.Clean("/"+v1)), "memory.limit_in_bytes")
	} else if v2 != "" {
		lowest(filepath.Join(root, filepath.Clean("/"+v2)), "memory.high", "memory.max")
	}
	return best, best != math.MaxInt64
}

// Within holds the process, for a span of work that builds a second copy
// of what it has loaded (a daemon's reload), to factor times the memory
// it has resident now: it lowers the runtime's soft memory limit to that,
// less the binary's own pages (RssFile, resident already and not the
// runtime's), and returns a function that puts the limit in force before
// back. A lower limit in force (GOMEMLIMIT, the cgroup's share) stays.
//
// When the work needs more live memory than that (a reload that loads a
// much bigger feed), holding the limit would only cost CPU: the runtime
// would collect at every step and then let the heap grow anyway. So the
// limit is lifted for the rest of the span once the heap live after a
// collection passes it (checked every Tick). Spans must not overlap (the
// last to end would put back the limit of the first). Without /proc it
// does nothing.
func Within(factor float64) (restore func()) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return func() {}
	}
	limit, ok := WithinLimit(status, factor)
	old := debug.SetMemoryLimit(-1) // reads it
	if !ok || limit >= old {
		return func() {}
	}
	debug.SetMemoryLimit(limit)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if watch(stop, limit) {
			debug.SetMemoryLimit(old)
		}
	}()
	return sync.OnceFunc(func() {
		close(stop)
		<-done
		debug.SetMemoryLimit(old)
	})
}

// Tick is how often Within looks at the live heap.
const Tick = 20 * time.Millisecond

// watch reports true, at once, when the heap live after a collection
// passed limit, and false when stop closes first.
func watch(stop <-chan struct{}, limit int64) bool {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(Tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return false
		case <-t.C:
		}
		if metrics.Read(s); s[0].Value.Kind() == metrics.KindUint64 && int64(s[0].Value.Uint64()) > limit {
			return true
		}
	}
}

// WithinLimit is Within's limit for the process whose /proc/PID/status
// is status: factor × VmRSS − RssFile, in bytes; false when status lacks
// them or the limit would be under a mebibyte.
func WithinLimit(status []byte, factor float64) (int64, bool) {
	sizes := StatusSizes(status)
	rss, ok1 := sizes["VmRSS"]
	file, ok2 := sizes["RssFile"]
	limit := int64(factor*float64(rss)) - file
	return limit, ok1 && ok2 && limit >= 1<<20
}

// StatusSizes returns the sizes a /proc/PID/status file gives in kB
// (VmRSS, VmHWM, RssFile, ...), in bytes, by name.
func StatusSizes(status []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			out[name] = n << 10
		}
	}
	return out
}
