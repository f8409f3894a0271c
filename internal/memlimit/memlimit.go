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
	"slices"
	"strconv"
	"strings"
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
