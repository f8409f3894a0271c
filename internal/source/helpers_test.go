package source

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fromBytes reads files (named f0, f1, ...) of a format into a Source
// the way Loader.load does, without a Loader.
func fromBytes(format string, files ...[]byte) (*Source, error) {
	src := &Source{name: "test", format: format}
	var parts []*part
	for i, b := range files {
		name := fmt.Sprintf("f%d", i)
		src.files = append(src.files, name)
		p, err := readPart(bytes.NewReader(b), format, name, uint16(i), Spec{AllowBroad: true}.limits())
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	src.finish(parts)
	return src, nil
}

// rowText is "ORIGIN FIRST-LAST CC" (and " ASn ORG" for a row of an AS).
func rowText(m Match) string {
	s := strings.TrimSpace(m.Origin + " " + m.Range.String() + " " + m.Country)
	if m.ASN != 0 {
		s = strings.TrimSpace(fmt.Sprintf("%s AS%d %s", s, m.ASN, m.Org))
	}
	return s
}

// rows lists every row of src in file order, as rowText.
func rows(src *Source) []string {
	type row struct {
		file, line uint32
		s          string
	}
	var rs []row
	for e := range src.v4.all() {
		m := src.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line)
		rs = append(rs, row{uint32(e.file), e.line, rowText(m)})
	}
	for e := range src.v6.all() {
		m := src.match(e.lo.addr(), e.hi.addr(), e.cc, e.asn, e.file, e.line)
		rs = append(rs, row{uint32(e.file), e.line, rowText(m)})
	}
	slices.SortFunc(rs, func(a, b row) int {
		if a.file != b.file {
			return int(a.file) - int(b.file)
		}
		return int(a.line) - int(b.line)
	})
	out := []string{}
	for _, r := range rs {
		out = append(out, r.s)
	}
	return out
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	z.Write(b)
	z.Close()
	return buf.Bytes()
}

// writeFile writes content to name in dir and returns the path.
func writeFile(t testing.TB, dir, name string, content []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
