package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/plan"
)

// TestOnlyApplyProbes: with backend auto, compile and explain choose
// without probing (they promise to touch no kernel, and the probe makes a
// scratch namespace); apply probes.
func TestOnlyApplyProbes(t *testing.T) {
	probes := 0
	old := probeBackend
	probeBackend = func() (plan.Backend, string, error) {
		probes++
		return plan.NFTables, "test probe", nil
	}
	defer func() { probeBackend = old }()
	dir := t.TempDir()
	write(t, dir, "p.yaml", "backend: auto\nrules:\n  - {name: f, action: drop, match: {prefixes: [198.51.100.0/24]}}\n")
	pol, state := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "state")
	for _, args := range [][]string{
		{"compile", "--policy", pol, "--state", state},
		{"--json", "compile", "--policy", pol, "--state", state},
		{"explain", "--policy", pol, "--state", state, "198.51.100.1"},
	} {
		if out, err := run(t, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if probes != 0 {
		t.Errorf("compile and explain probed the host %d times", probes)
	}
	out, err := run(t, "apply", "--dry-run", "--policy", pol, "--state", state)
	if err != nil {
		t.Fatalf("apply --dry-run: %v\n%s", err, out)
	}
	if probes != 1 || !strings.Contains(out, "test probe") {
		t.Errorf("apply --dry-run: %d probes; output:\n%s", probes, out)
	}
}
