package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binary is the ipfence binary that tests needing a process of their own
// run, built once per test binary run (buildIpfence) in a folder TestMain
// removes.
var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// TestMain runs the tests, then removes the ipfence binary if one was
// built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		if err := os.RemoveAll(binary.dir); err != nil {
			fmt.Fprintf(os.Stderr, "removing the test's ipfence binary: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildIpfence returns the ipfence binary, building it on the first call
// of the test binary run; it fails t when the build fails.
func buildIpfence(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() {
		binary.dir, binary.err = os.MkdirTemp("", "ipfence-test-bin-")
		if binary.err != nil {
			return
		}
		exe := filepath.Join(binary.dir, "ipfence")
		if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("%w\n%s", err, out)
			return
		}
		binary.path = exe
	})
	if binary.err != nil {
		t.Fatalf("building ipfence: %v", binary.err)
	}
	return binary.path
}
