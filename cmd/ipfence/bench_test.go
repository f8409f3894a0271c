package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestBenchControlQuick: the CI smoke run of `ipfence bench control
// --quick` writes its three files, and they agree.
func TestBenchControlQuick(t *testing.T) {
	netnstest.NeedRoot(t)
	dir := t.TempDir()
	out, err := run(t, "bench", "control", "--quick", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res bench.ControlResult
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	o := bench.QuickControl
	if want := len(bench.SetKinds) * len(o.Sizes) * len(o.Writers); len(res.Adds) != want {
		t.Errorf("%d single-add rows, want %d", len(res.Adds), want)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || string(md) != out {
		t.Errorf("report.md differs from what was printed (%v)", err)
	}
	csv, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil || !strings.HasPrefix(string(csv), "part,set,") {
		t.Errorf("results.csv: %v\n%s", err, csv)
	}
	var ue usageError
	if _, err := run(t, "bench", "nosuch", "--out", dir); !errors.As(err, &ue) {
		t.Errorf("unknown scenario: %v, want a usage error", err)
	}
}
