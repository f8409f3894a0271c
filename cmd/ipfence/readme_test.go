package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/source"
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
	out, err := run(t, "explain", "--policy", "../../examples/europe.yaml", "--monitor", "--state", t.TempDir(), "8.8.8.8")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), out) {
		t.Errorf("README.md does not show the output of `ipfence explain --monitor 8.8.8.8`:\n%s", out)
	}
	out, err = run(t, "explain", "--policy", "../../examples/hosting.yaml", "--port", "tcp/22", "--state", t.TempDir(), "198.51.100.7")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), strings.ReplaceAll(out, "../../", "")) {
		t.Errorf("README.md does not show the output of `ipfence explain --policy examples/hosting.yaml --port tcp/22 198.51.100.7`:\n%s", out)
	}
	out, err = run(t, "geo", "--countries", "IT", "--count")
	if err != nil || !strings.Contains(out, "10557") && !strings.Contains(out, "10,557") {
		t.Errorf("geo --countries IT --count: %v\n%s", err, out)
	}
	if _, err := run(t, "compile", "--policy", "../../examples/europe.yaml", "--state", t.TempDir(), "--json"); err != nil {
		t.Error(err)
	}
}

// TestDistFiles checks the command lines of the systemd units against the
// CLI (every subcommand and flag exists) and compiles the sample policy.
func TestDistFiles(t *testing.T) {
	if lines := checkUnits(t, "../../dist/systemd", "/usr/local/bin/ipfence"); lines < 3 {
		t.Errorf("found %d command lines in the units", lines)
	}
	if _, err := policy.Load("../../dist/ipfence/policy.yaml"); err != nil {
		t.Errorf("sample policy: %v", err)
	}
	// The README's example policy parses (its catalog sources too).
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(readme), "```yaml\nsources:")
	example, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README.md has no example policy")
	}
	if _, err := policy.Parse([]byte("sources:"+example), "README.md"); err != nil {
		t.Errorf("README's example policy: %v", err)
	}
}

// TestFeeds lists the catalog, as text (with each feed's URLs) and JSON.
func TestFeeds(t *testing.T) {
	out, err := run(t, "feeds", "-l")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range source.Catalog() {
		for _, want := range append([]string{e.Name + " ", e.Licence}, e.URLs...) {
			if !strings.Contains(out, want) {
				t.Errorf("feeds -l lacks %q", want)
			}
		}
	}
	out, err = run(t, "--json", "feeds")
	var es []source.CatalogEntry
	if err != nil || json.Unmarshal([]byte(out), &es) != nil || len(es) != len(source.Catalog()) || es[0].Refresh == 0 {
		t.Errorf("feeds --json: %v\n%s", err, out)
	}
}

// checkUnits checks that every ExecStart and ExecReload of the systemd
// units in dir runs bin with an ipfence command and flags the CLI knows,
// and returns how many such lines there are.
func checkUnits(t *testing.T, dir, bin string) int {
	t.Helper()
	units, err := filepath.Glob(filepath.Join(dir, "*.service"))
	if err != nil || len(units) < 2 {
		t.Fatalf("units in %s: %v %v", dir, units, err)
	}
	lines := 0
	for _, u := range units {
		data, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			cmdline, ok := strings.CutPrefix(line, "ExecStart=")
			if !ok {
				cmdline, ok = strings.CutPrefix(line, "ExecReload=")
			}
			if !ok {
				continue
			}
			lines++
			args := strings.Fields(cmdline)
			if args[0] != bin {
				t.Errorf("%s: runs %s, want %s", u, args[0], bin)
			}
			c, rest, err := newRootCmd().Find(args[1:])
			if err != nil || c.Name() != args[1] {
				t.Errorf("%s: %q is not an ipfence command: %v", u, cmdline, err)
				continue
			}
			if err := c.ParseFlags(rest); err != nil {
				t.Errorf("%s: %q: %v", u, cmdline, err)
			}
		}
	}
	return lines
}
