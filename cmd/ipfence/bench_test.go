package main

import (
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestBenchQuick: the CI smoke run of `ipfence bench all --quick` writes,
// for every scenario, results that parse, a report that was also printed,
// a CSV table and plots that decode.
func TestBenchQuick(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft", "ipset", "/usr/bin/time")
	footprintBinary = buildIpfence(t)
	defer func() { footprintBinary = "" }()
	dir := t.TempDir()
	out, err := run(t, "bench", "all", "--quick", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range benchScenarios {
		sub := filepath.Join(dir, s.name)
		md, err := os.ReadFile(filepath.Join(sub, "report.md"))
		if err != nil || !strings.Contains(out, string(md)) {
			t.Errorf("%s: report.md missing from what was printed (%v)", s.name, err)
		}
		csv, err := os.ReadFile(filepath.Join(sub, "results.csv"))
		if err != nil || strings.Count(string(csv), "\n") < 2 {
			t.Errorf("%s: results.csv: %v\n%s", s.name, err, csv)
		}
		pngs, _ := filepath.Glob(filepath.Join(sub, "*.png"))
		svgs, _ := filepath.Glob(filepath.Join(sub, "*.svg"))
		if len(pngs) == 0 || len(svgs) != len(pngs) {
			t.Errorf("%s: %d PNG and %d SVG plots", s.name, len(pngs), len(svgs))
		}
		for _, p := range pngs {
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := png.Decode(f); err != nil {
				t.Errorf("%s: %v", p, err)
			}
			f.Close()
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "control", "results.json"))
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
	data, err = os.ReadFile(filepath.Join(dir, "footprint", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fp bench.FootprintResult
	if err := json.Unmarshal(data, &fp); err != nil {
		t.Fatal(err)
	}
	fo := bench.QuickFootprint
	if want := 6*len(fo.Lines) + len(fo.Bans) + len(fo.Policies); len(fp.Rows) != want {
		t.Errorf("%d footprint rows, want %d", len(fp.Rows), want)
	}
	if last := fp.Rows[len(fp.Rows)-1]; last.Step != bench.StepDaemonPolicy+"europe.yaml" {
		t.Errorf("footprint: last row %q, want the daemon's load of europe.yaml", last.Step)
	}
	for _, x := range fp.Rows {
		if x.PeakMiB <= 1 || x.CPUSec < 0 || x.Prefixes < x.Lines*9/10 || strings.HasPrefix(x.Step, "ipfence daemon") && (x.IdleMiB <= 1 || x.IdleMiB > x.PeakMiB) {
			t.Errorf("footprint row %+v: a figure is missing or impossible", x)
		}
	}
	// The scenario checks that the daemon holds the bans (Count); the
	// RSS they add is a figure, not a bound: 10k bans are about 1 MB, in
	// the noise of a collection.
	var banRows []int
	for _, x := range fp.Rows {
		if x.Step == bench.StepDaemonBans {
			banRows = append(banRows, x.Bans)
		}
	}
	if !slices.Equal(banRows, fo.Bans) {
		t.Errorf("footprint: ban rows for %v, want %v", banRows, fo.Bans)
	}
	var ue usageError
	if _, err := run(t, "bench", "nosuch", "--out", dir); !errors.As(err, &ue) {
		t.Errorf("unknown scenario: %v, want a usage error", err)
	}
}

// TestBenchGeoFlags: --geo-sets takes names with commas in them, once per
// set, and a name or config the run does not have is a usage error before
// anything runs.
func TestBenchGeoFlags(t *testing.T) {
	var ue usageError
	for _, args := range [][]string{
		{"--geo-sets", "6 countries, IPv6", "--geo-sets", "8 in Europ"},
		{"--quick", "--geo-sets", "8 in Europe"},
		{"--geo-configs", "ipfence,nosuch"},
	} {
		if _, err := run(t, append([]string{"bench", "geo", "--out", t.TempDir()}, args...)...); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	c, _, err := newRootCmd().Find([]string{"bench"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ParseFlags([]string{"--geo-sets", "6 countries, IPv6", "--geo-sets", "8 in Europe"}); err != nil {
		t.Fatal(err)
	}
	got := geoOptions(false).Sets
	if len(got) != 2 || got[0].Name != "8 in Europe" || got[1].Name != "6 countries, IPv6" {
		t.Errorf("sets %v, want 8 in Europe and 6 countries, IPv6", got)
	}
}
