package prefix

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGolden reads each list in testdata/ (*.txt, *.netset) and compares
// what WriteCIDRs, WriteRanges and WriteJSON print with the golden files
// next to it. Run with -update to rewrite them, then review the diff.
func TestGolden(t *testing.T) {
	txt, _ := filepath.Glob("testdata/*.txt")
	netset, _ := filepath.Glob("testdata/*.netset")
	lists := append(txt, netset...)
	if len(lists) < 2 {
		t.Fatalf("found only %v in testdata/", lists)
	}
	for _, in := range lists {
		t.Run(filepath.Base(in), func(t *testing.T) {
			f, err := os.Open(in)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			s, err := ReadSet(f, in)
			if err != nil {
				t.Fatal(err)
			}
			base := strings.TrimSuffix(in, filepath.Ext(in))
			outputs := []struct {
				ext   string
				write func(*bytes.Buffer) error
			}{
				{".cidrs", func(b *bytes.Buffer) error { return WriteCIDRs(b, s) }},
				{".ranges", func(b *bytes.Buffer) error { return WriteRanges(b, s) }},
				{".cidrs.json", func(b *bytes.Buffer) error { return WriteJSON(b, s, false) }},
				{".ranges.json", func(b *bytes.Buffer) error { return WriteJSON(b, s, true) }},
			}
			for _, o := range outputs {
				var got bytes.Buffer
				if err := o.write(&got); err != nil {
					t.Fatal(err)
				}
				golden(t, base+o.ext, got.Bytes())
			}
		})
	}
}

// golden compares got with the file at path, or rewrites it with -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
