package prefix

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// The differential tests below check that, on IPv4, this package prints
// exactly what FireHOL's iprange prints on the same input:
//
//	WriteCIDRs   = iprange --print-suffix-ips /32 (plain iprange prints /32 bare)
//	WriteRanges  = iprange -j, with "A-A" written "A"
//	exclusion    = iprange IN --except EXCLUDE
//	Complement   = iprange 0.0.0.0/0 --except IN
//	NumAddrs     = the unique_ips column of iprange -C

// iprange runs iprange with args and returns its output. Without iprange
// the test is skipped, except in CI (CI=true), where it fails: CI
// installs it.
func iprange(t *testing.T, args ...string) string {
	t.Helper()
	netnstest.Tools(t, "iprange")
	cmd := exec.Command("iprange", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("iprange %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// singleRange matches iprange -j's way of writing a single address.
var singleRange = regexp.MustCompile(`(?m)^([0-9.]+)-([0-9.]+)$`)

func iprangeRanges(s string) string {
	return singleRange.ReplaceAllStringFunc(s, func(l string) string {
		first, last, _ := strings.Cut(l, "-")
		if first == last {
			return first
		}
		return l
	})
}

func TestIprangeSynthetic(t *testing.T) {
	netnstest.Tools(t, "iprange")
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			in := synthetic(4000+int(seed)*1000, seed, false)
			ex := synthetic(500, seed+100, false)
			compareWithIprange(t, in, ex)
		})
	}
}

func TestIprangeCountry(t *testing.T) {
	netnstest.Tools(t, "iprange")
	in := countryRanges(t)
	// Exclude every tenth range of the data, shifted to straddle borders.
	var ex bytes.Buffer
	for i, l := range strings.SplitAfter(string(in), "\n") {
		if i%10 == 0 && l != "" {
			first, _, _ := strings.Cut(l, "-")
			fmt.Fprintf(&ex, "%s/20\n", first)
		}
	}
	compareWithIprange(t, in, ex.Bytes())
}

// compareWithIprange checks the CIDRs, ranges, count, exclusion and
// complement of in (with ex excluded) against iprange.
func compareWithIprange(t *testing.T, in, ex []byte) {
	inFile, exFile := writeTemp(t, "in.txt", in), writeTemp(t, "ex.txt", ex)
	all := writeTemp(t, "all.txt", []byte("0.0.0.0/0\n"))
	set, err := ReadSet(bytes.NewReader(in), inFile)
	if err != nil {
		t.Fatal(err)
	}
	var b Builder
	b.AddSet(set)
	if err := Read(bytes.NewReader(ex), exFile, func(r netipx.IPRange, _ int) { b.RemoveRange(r) }); err != nil {
		t.Fatal(err)
	}
	excluded, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}

	var cidrs, ranges, exCIDRs, comp bytes.Buffer
	for _, w := range []error{
		WriteCIDRs(&cidrs, set), WriteRanges(&ranges, set),
		WriteCIDRs(&exCIDRs, excluded), WriteCIDRs(&comp, Complement(set, true, false)),
	} {
		if w != nil {
			t.Fatal(w)
		}
	}
	sameLines(t, "CIDRs", cidrs.String(), iprange(t, "--print-suffix-ips", "/32", inFile))
	sameLines(t, "ranges", ranges.String(), iprangeRanges(iprange(t, "-j", inFile)))
	sameLines(t, "exclusion", exCIDRs.String(), iprange(t, "--print-suffix-ips", "/32", inFile, "--except", exFile))
	sameLines(t, "complement", comp.String(), iprange(t, "--print-suffix-ips", "/32", all, "--except", inFile))

	n4, _ := NumAddrs(set)
	_, unique, _ := strings.Cut(strings.TrimSpace(iprange(t, "-C", inFile)), ",")
	if fmt.Sprint(n4) != unique {
		t.Errorf("NumAddrs = %d, iprange -C counts %s unique addresses", n4, unique)
	}
	if v4, _ := Count(set); v4 != strings.Count(cidrs.String(), "\n") || v4 < 100 {
		t.Errorf("Count = %d for %d lines of output", v4, strings.Count(cidrs.String(), "\n"))
	}
}

// sameLines reports the first difference between our output and iprange's.
func sameLines(t *testing.T, what, ours, theirs string) {
	t.Helper()
	if ours == theirs {
		return
	}
	a, b := strings.Split(ours, "\n"), strings.Split(theirs, "\n")
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			t.Errorf("%s differ from iprange's at line %d (ours %d lines, iprange %d): ours %q, iprange %q", what, i+1, len(a), len(b), x, y)
			return
		}
	}
}
