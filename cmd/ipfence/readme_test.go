package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEExplain runs the explain examples of README.md and checks the
// README shows what the command prints.
func TestREADMEExplain(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"8.8.8.8", "151.1.1.1"} {
		out, err := run(t, "explain", "--policy", "../../examples/europe.yaml", "--state", t.TempDir(), addr)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(readme), out) {
			t.Errorf("README.md does not show the output of `ipfence explain %s`:\n%s", addr, out)
		}
	}
	out, err := run(t, "geo", "--countries", "IT", "--count")
	if err != nil || !strings.Contains(out, "10557") && !strings.Contains(out, "10,557") {
		t.Errorf("geo --countries IT --count: %v\n%s", err, out)
	}
	if _, err := run(t, "compile", "--policy", "../../examples/europe.yaml", "--state", t.TempDir(), "--json"); err != nil {
		t.Error(err)
	}
}
