package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// aggregateRun runs ipfence with args and stdin, returning stdout and the error.
func aggregateRun(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.Execute()
	return out.String(), err
}

func TestAggregateCmd(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a := file("a.txt", "# list a\n10.0.0.0/9\n10.128.0.0/9\n192.0.2.1\n192.0.2.2 - 192.0.2.3\n2001:db8::/32\n")
	b := file("b.txt", "198.51.100.0/24 ; list b\n10.0.0.0/8\n")
	allow := file("allow.txt", "10.1.0.0/16\n2001:db8::/33\n")
	v4only := file("v4.txt", "128.0.0.0/1\n")
	empty := file("empty.txt", "# nothing\n")

	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"files", "", []string{a, b},
			"10.0.0.0/8\n192.0.2.1/32\n192.0.2.2/31\n198.51.100.0/24\n2001:db8::/32\n"},
		{"stdin", "1.2.3.4\n1.2.3.5\n", nil, "1.2.3.4/31\n"},
		{"dash", "1.2.3.4\n", []string{"-", b}, "1.2.3.4/32\n10.0.0.0/8\n198.51.100.0/24\n"},
		{"ranges", "", []string{"--ranges", a}, "10.0.0.0-10.255.255.255\n192.0.2.1-192.0.2.3\n2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff\n"},
		{"single address range", "192.0.2.9\n", []string{"--ranges"}, "192.0.2.9\n"},
		{"exclude", "", []string{a, "--exclude", allow},
			"10.0.0.0/16\n10.2.0.0/15\n10.4.0.0/14\n10.8.0.0/13\n10.16.0.0/12\n10.32.0.0/11\n10.64.0.0/10\n10.128.0.0/9\n192.0.2.1/32\n192.0.2.2/31\n2001:db8:8000::/33\n"},
		{"exclude repeated", "", []string{b, "--exclude", allow, "--exclude", b}, ""},
		{"exclude stdin", "10.0.0.0/9\n", []string{b, "--exclude", "-"}, "10.128.0.0/9\n198.51.100.0/24\n"},
		{"complement v4 only", "", []string{"--complement", v4only}, "0.0.0.0/1\n"},
		{"complement both", "", []string{"--complement", "--ranges", a},
			"0.0.0.0-9.255.255.255\n11.0.0.0-192.0.2.0\n192.0.2.4-255.255.255.255\n::-2001:db7:ffff:ffff:ffff:ffff:ffff:ffff\n2001:db9::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff\n"},
		{"complement empty input", "", []string{"--complement", empty}, "0.0.0.0/0\n::/0\n"},
		{"complement then exclude", "", []string{"--complement", v4only, "--exclude", file("low.txt", "0.0.0.0/2\n")}, "64.0.0.0/2\n"},
		{"count", "", []string{"--count", a},
			"ipv4: 3 prefixes, 2 ranges, 16777219 addresses\nipv6: 1 prefixes, 1 ranges, 79228162514264337593543950336 addresses\n"},
		{"count json", "", []string{"--count", "--json", a},
			`{"ipv4":{"prefixes":3,"ranges":2,"addresses":"16777219"},"ipv6":{"prefixes":1,"ranges":1,"addresses":"79228162514264337593543950336"}}` + "\n"},
		{"count empty", "", []string{"--count", "--json", empty},
			`{"ipv4":{"prefixes":0,"ranges":0,"addresses":"0"},"ipv6":{"prefixes":0,"ranges":0,"addresses":"0"}}` + "\n"},
		{"json", "", []string{"--json", a},
			`{"ipv4":["10.0.0.0/8","192.0.2.1/32","192.0.2.2/31"],"ipv6":["2001:db8::/32"]}` + "\n"},
		{"json ranges", "", []string{"--json", "--ranges", v4only},
			`{"ipv4":["128.0.0.0-255.255.255.255"],"ipv6":[]}` + "\n"},
		{"json empty", "", []string{"--json", empty}, `{"ipv4":[],"ipv6":[]}` + "\n"},
		{"empty", "", []string{empty}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := aggregateRun(t, tt.stdin, append([]string{"aggregate"}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
			if strings.HasPrefix(got, "{") && !json.Valid([]byte(got)) {
				t.Errorf("invalid JSON: %s", got)
			}
		})
	}

	t.Run("parse error", func(t *testing.T) {
		bad := file("bad.txt", "10.0.0.0/8\n\n# x\n10.0.0.256\n")
		for _, args := range [][]string{{a, bad}, {a, "--exclude", bad}, {"--json", "--count", bad}} {
			out, err := aggregateRun(t, "", append([]string{"aggregate"}, args...)...)
			want := bad + `:4: cannot parse "10.0.0.256": "10.0.0.256" is not an IP address (expected an IP address, CIDR prefix or first-last range)`
			if err == nil || err.Error() != want {
				t.Errorf("%v: error %v\nwant %s", args, err, want)
			}
			if out != "" {
				t.Errorf("%v: printed %q despite the error", args, out)
			}
		}
		_, err := aggregateRun(t, "1.2.3.4\nfoo\n", "aggregate")
		if err == nil || !strings.HasPrefix(err.Error(), `stdin:2: cannot parse "foo"`) {
			t.Errorf("stdin error: %v", err)
		}
	})

	t.Run("usage errors", func(t *testing.T) {
		if _, err := aggregateRun(t, "", "aggregate", filepath.Join(dir, "missing.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("missing file: %v", err)
		}
		_, err := aggregateRun(t, "", "aggregate", "-", "--exclude", "-")
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("stdin twice: %v, want a usage error", err)
		}
		if _, err := aggregateRun(t, "", "aggregate", "--ranges", "--count", a); err == nil {
			t.Errorf("--ranges with --count: no error")
		}
	})
}
