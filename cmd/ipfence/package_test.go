package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/policy"
)

// TestPackage builds the .deb and .rpm with scripts/package.sh, installs
// the .deb with dpkg -i into a root of its own (dpkg --root: the host's
// packages are not touched) and checks what it installed: the binary
// runs and says its version, the units run it with commands and flags the
// CLI knows, the sample policy loads, the fail2ban action is the shipped
// one, every command has a man page, bash loads the completion, the
// configuration files are conffiles, and a purge removes everything. The
// .rpm holds the same files with the same configuration files, and
// installs into a root of its own too.
func TestPackage(t *testing.T) {
	// Not a kernel test, but of the same tier: dpkg -i wants root, and
	// the packaging tools are the system's.
	netnstest.Kernel(t, "dpkg", "dpkg-deb", "rpm", "rpmbuild")
	t.Parallel()
	out := t.TempDir()
	const version = "0.8.0+test1"
	build, err := exec.Command("../../scripts/package.sh", "--out", out, "--version", version).CombinedOutput()
	if err != nil {
		t.Fatalf("package.sh: %v\n%s", err, build)
	}
	deb := filepath.Join(out, "ipfence_"+version+"_amd64.deb")
	rpm := filepath.Join(out, "ipfence-"+version+"-1.x86_64.rpm")

	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, root, "var/lib/dpkg/status", "")
	dpkg := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("dpkg", append([]string{"--root=" + root, "--log=/dev/null", "--force-script-chrootless"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	dpkg("-i", deb)
	status := dpkg("-s", "ipfence")
	if !strings.Contains(status, "Status: install ok installed") || !strings.Contains(status, "Version: "+version) {
		t.Errorf("dpkg -s:\n%s", status)
	}
	conffiles := []string{"/etc/ipfence/policy.yaml", "/etc/ipfence/blocklist.txt", "/etc/fail2ban/action.d/ipfence.conf"}
	for _, c := range conffiles {
		if !strings.Contains(status, "\n "+c+" ") {
			t.Errorf("%s is not a conffile:\n%s", c, status)
		}
	}
	in := func(p string) string { return filepath.Join(root, p) }

	if v, err := exec.Command(in("usr/bin/ipfence"), "--version").CombinedOutput(); err != nil || !strings.Contains(string(v), version) {
		t.Errorf("ipfence --version: %v %s", err, v)
	}
	if n := checkUnits(t, in("lib/systemd/system"), "/usr/bin/ipfence"); n < 4 {
		t.Errorf("%d command lines in the installed units", n)
	}
	if _, err := policy.Load(in("etc/ipfence/policy.yaml")); err != nil {
		t.Errorf("installed policy: %v", err)
	}
	if _, err := os.Stat(in("etc/ipfence/blocklist.txt")); err != nil {
		t.Error(err)
	}
	if got, want := readFile(t, in("etc/fail2ban/action.d/ipfence.conf")), readFile(t, "../../dist/fail2ban/ipfence.conf"); got != want {
		t.Error("the installed fail2ban action differs from dist/fail2ban/ipfence.conf")
	}
	var visit func(c *cobra.Command)
	visit = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		page := in("usr/share/man/man1/" + strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1.gz")
		if text := gunzip(t, page); !strings.Contains(text, `.TH "IPFENCE"`) || !strings.Contains(text, c.Short[:min(20, len(c.Short))]) {
			t.Errorf("%s: not the man page of %q", page, c.CommandPath())
		}
		for _, sub := range c.Commands() {
			visit(sub)
		}
	}
	visit(newRootCmd())
	if out, err := exec.Command("bash", "-c", "source "+in("usr/share/bash-completion/completions/ipfence")+" && complete -p ipfence").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "ipfence") {
		t.Errorf("bash completion: %v %s", err, out)
	}
	if !strings.HasPrefix(readFile(t, in("usr/share/zsh/vendor-completions/_ipfence")), "#compdef ipfence") {
		t.Error("zsh completion: no #compdef ipfence")
	}
	if !strings.Contains(readFile(t, in("usr/share/fish/vendor_completions.d/ipfence.fish")), "complete -c ipfence") {
		t.Error("fish completion: no complete -c ipfence")
	}
	for _, doc := range []string{"README.md", "copyright", "LICENSE-NRO"} {
		if _, err := os.Stat(in("usr/share/doc/ipfence/" + doc)); err != nil {
			t.Error(err)
		}
	}
	debFiles := installedFiles(dpkg("-L", "ipfence"), root)

	dpkg("--purge", "ipfence")
	for _, f := range append(debFiles, "/etc/ipfence") {
		if _, err := os.Lstat(in(f)); err == nil {
			t.Errorf("%s is left after the purge", f)
		}
	}

	// The .rpm: the same files and configuration files, installable.
	rpmOut := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("rpm", args...).Output()
		if err != nil {
			t.Fatalf("rpm %v: %v", args, err)
		}
		return string(out)
	}
	rpmFiles := strings.Fields(rpmOut("-qp", "--qf", "[%{FILENAMES} %{FILEMODES:perms}\n]", rpm))
	var files []string
	for i := 0; i+1 < len(rpmFiles); i += 2 {
		if !strings.HasPrefix(rpmFiles[i+1], "d") {
			files = append(files, rpmFiles[i])
		}
	}
	slices.Sort(files)
	if !slices.Equal(files, debFiles) {
		t.Errorf("the .rpm's files\n%q\ndiffer from the .deb's\n%q", files, debFiles)
	}
	cfg := strings.Fields(rpmOut("-qpc", rpm))
	slices.Sort(cfg)
	want := slices.Clone(conffiles)
	slices.Sort(want)
	if !slices.Equal(cfg, want) {
		t.Errorf("rpm configuration files %q, want %q", cfg, want)
	}
	rroot := t.TempDir()
	rpmOut("--root", rroot, "--initdb")
	if out, err := exec.Command("rpm", "--root", rroot, "-i", "--nodeps", "--noscripts", rpm).CombinedOutput(); err != nil {
		t.Fatalf("rpm -i: %v\n%s", err, out)
	}
	if v, err := exec.Command(filepath.Join(rroot, "usr/bin/ipfence"), "--version").CombinedOutput(); err != nil || !strings.Contains(string(v), version) {
		t.Errorf("the .rpm's ipfence --version: %v %s", err, v)
	}
}

// installedFiles are the regular files and links of a dpkg -L listing.
func installedFiles(list, root string) []string {
	var files []string
	for _, f := range strings.Fields(list) {
		if st, err := os.Lstat(filepath.Join(root, f)); err == nil && !st.IsDir() {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return ""
	}
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return ""
	}
	text, err := io.ReadAll(r)
	if err != nil {
		t.Errorf("%s: %v", path, err)
	}
	return string(text)
}
