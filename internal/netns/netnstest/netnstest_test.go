package netnstest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records a skip or a failure and ends
// the goroutine, as the real ones do.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func gate(t *testing.T, fn func(testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

// TestToolsGate: a missing program skips the test, and fails it under
// CI=true, naming the program either way.
func TestToolsGate(t *testing.T) {
	const tool = "ipfence-no-such-tool"
	t.Setenv("CI", "")
	if r := gate(t, func(tb testing.TB) { Tools(tb, "sh", tool) }); !strings.Contains(r.skipped, tool) || r.failed != "" {
		t.Errorf("without CI: skipped %q, failed %q; want a skip naming %s", r.skipped, r.failed, tool)
	}
	t.Setenv("CI", "true")
	if r := gate(t, func(tb testing.TB) { Tools(tb, "sh", tool) }); !strings.Contains(r.failed, tool) || r.skipped != "" {
		t.Errorf("CI=true: skipped %q, failed %q; want a failure naming %s", r.skipped, r.failed, tool)
	}
	if r := gate(t, func(tb testing.TB) { Tools(tb, "sh") }); r.failed != "" || r.skipped != "" {
		t.Errorf("with sh on PATH: skipped %q, failed %q", r.skipped, r.failed)
	}
}

// TestKernelGateShort: under -short a kernel test skips, even under
// CI=true.
func TestKernelGateShort(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks the -short behaviour")
	}
	t.Setenv("CI", "true")
	if r := gate(t, func(tb testing.TB) { Kernel(tb) }); r.skipped == "" || r.failed != "" {
		t.Errorf("under -short: skipped %q, failed %q; want a skip", r.skipped, r.failed)
	}
}
