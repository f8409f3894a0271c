package source

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
)

// gzipOf returns about n bytes (whole lines) of line repeated,
// gzip-compressed.
func gzipOf(t testing.TB, line string, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	z, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	chunk := []byte(strings.Repeat(line, (64<<10)/len(line)))
	n -= n % len(line) // whole lines
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := z.Write(chunk[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestGzipBomb: a small gzip file that decompresses past the byte limit
// is refused with a *LimitError naming it, the default limit included,
// whatever the lines hold (comments cost time, rows memory).
func TestGzipBomb(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		line     string
		n        int
		maxBytes int64
	}{
		{"# nothing but comments\n", DefaultMaxBytes + 100, 0},
		{"\n", 8 << 20, 1 << 20},
		{"192.0.2.1\n", 8 << 20, 1 << 20},
	} {
		data := gzipOf(t, tc.line, tc.n)
		path := writeFile(t, dir, "bomb.gz", data)
		_, err := (&Loader{}).Load(ctx, Spec{Name: "bomb", Format: FormatList, Paths: []string{path}, MaxBytes: tc.maxBytes})
		var le *LimitError
		if !errors.As(err, &le) || le.What != "bytes after decompression" || le.File != path || le.Key != "max_bytes" {
			t.Errorf("%d bytes of %q (%d compressed), max %d: error %v, want a *LimitError on bytes", tc.n, tc.line, len(data), tc.maxBytes, err)
		}
	}
	// Within the limit the same file reads.
	path := writeFile(t, dir, "ok.gz", gzipOf(t, "192.0.2.1\n", 1<<20))
	if _, err := (&Loader{}).Load(ctx, Spec{Name: "ok", Format: FormatList, Paths: []string{path}, MaxBytes: 2 << 20}); err != nil {
		t.Errorf("1 MiB under a 2 MiB limit: %v", err)
	}
}

// addrs returns n distinct, non-adjacent IPv4 addresses, one per line.
func addrs(n int) string {
	var b strings.Builder
	for i := range n {
		v := 0x0a000000 + 2*i
		fmt.Fprintf(&b, "%d.%d.%d.%d\n", v>>24, v>>16&255, v>>8&255, v&255)
	}
	return b.String()
}

// TestMaxEntries: rows past the entry limit, in one file or across the
// files of a source, in every format.
func TestMaxEntries(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	csv := strings.Repeat("192.0.2.0,192.0.2.255,IT\n", 150)
	for _, tc := range []struct {
		name, format string
		files        []string
		max          int
		wantFile     string // "" = accepted
	}{
		{"list", FormatList, []string{addrs(150)}, 100, "f0"},
		{"list within", FormatList, []string{addrs(100)}, 100, ""},
		{"csv", FormatCountryCSV, []string{csv}, 100, "f0"},
		{"two files", FormatList, []string{addrs(60), addrs(60)}, 100, "all files"},
	} {
		spec := Spec{Name: "s", Format: tc.format, MaxEntries: tc.max}
		for i, f := range tc.files {
			spec.Paths = append(spec.Paths, writeFile(t, dir, fmt.Sprintf("f%d", i), []byte(f)))
		}
		_, err := (&Loader{}).Load(ctx, spec)
		var le *LimitError
		switch {
		case tc.wantFile == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantFile != "" && (!errors.As(err, &le) || le.What != "entries" || filepath.Base(le.File) != tc.wantFile || le.Limit != int64(tc.max)):
			t.Errorf("%s: error %v, want a *LimitError on entries of %s", tc.name, err, tc.wantFile)
		case le != nil && !strings.Contains(err.Error(), "more than 100 entries: refused (raise max_entries"):
			t.Errorf("%s: message %q", tc.name, err)
		}
	}
}

// TestBroadPrefixes: a list may not hold prefixes broader than /8 (IPv4)
// or /16 (IPv6) unless the source allows them; country data may.
func TestBroadPrefixes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		row  string
		want string // the broadest prefix refused, "" = accepted
	}{
		{"1.0.0.0/8", ""},
		{"0.0.0.0/1", "0.0.0.0/1"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"1.0.0.0-2.255.255.255", ""}, // 1.0.0.0/8 and 2.0.0.0/8
		{"2.0.0.0-3.255.255.255", "2.0.0.0/7"},
		{"1.2.3.4-9.0.0.0", "4.0.0.0/6"},
		{"2001::/16", ""},
		{"2000::/3", "2000::/3"},
		{"2001::-2003:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2002::/15"},
	} {
		path := writeFile(t, dir, "feed.txt", []byte("# feed\n192.0.2.0/24\n"+tc.row+"\n"))
		spec := Spec{Name: "feed", Format: FormatList, Paths: []string{path}}
		_, err := (&Loader{}).Load(ctx, spec)
		var be *BroadError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.row, err)
		case tc.want != "" && (!errors.As(err, &be) || be.Prefix.String() != tc.want || be.Line != 3 || be.File != path):
			t.Errorf("%s: error %v, want a *BroadError for %s at line 3", tc.row, err, tc.want)
		case be != nil && !strings.Contains(err.Error(), "set allow_broad: true on the source"):
			t.Errorf("%s: message %q", tc.row, err)
		}
		spec.AllowBroad = true
		if _, err := (&Loader{}).Load(ctx, spec); err != nil {
			t.Errorf("%s with allow_broad: %v", tc.row, err)
		}
	}
	// The first problem is reported, not a later bad line.
	path := writeFile(t, dir, "feed.txt", []byte("0.0.0.0/1\ngarbage\n"))
	var be *BroadError
	if _, err := (&Loader{}).Load(ctx, Spec{Name: "feed", Format: FormatList, Paths: []string{path}}); !errors.As(err, &be) || be.Line != 1 {
		t.Errorf("a broad row, then a bad one: %v, want the broad row's error", err)
	}
	// Registries allocate blocks over a /8 (the bundled data has a /7 of
	// the US): country sources are not checked.
	path = writeFile(t, dir, "cc.csv", []byte("6.0.0.0,8.10.5.255,US\n"))
	if _, err := (&Loader{}).Load(ctx, Spec{Name: "cc", Format: FormatCountryCSV, Paths: []string{path}}); err != nil {
		t.Errorf("country data with a /7: %v", err)
	}
}

// TestGrowthGate: a load with far more prefixes than the last good one
// is refused, a local file with a *GrowthError, a URL by falling back on
// its committed copy; small sources grow freely.
func TestGrowthGate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "drop.txt")
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, Paths: []string{path}}
	load := func(n int) (*Source, error) {
		writeFile(t, dir, "drop.txt", []byte(addrs(n)))
		return l.Load(ctx, spec)
	}
	src, err := load(3000)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n      int
		growth float64
		want   bool // refused
	}{
		{GrowthFloor, 0, false},    // small: free
		{15000, 0, false},          // +400%: at the limit
		{15001, 0, true},           // past it
		{15001, 5, false},          // raised
		{60000, -1, false},         // gate off
		{GrowthFloor + 1, 1, true}, // +233% over +100%
	} {
		spec.MaxGrowth = tc.growth
		_, err := load(tc.n)
		var ge *GrowthError
		switch {
		case !tc.want && err != nil:
			t.Errorf("%d prefixes, max_growth %v: %v", tc.n, tc.growth, err)
		case tc.want && (!errors.As(err, &ge) || ge.From != 3000 || ge.To != tc.n):
			t.Errorf("%d prefixes, max_growth %v: error %v, want a *GrowthError 3000 → %d", tc.n, tc.growth, err, tc.n)
		}
	}
	e := &GrowthError{Source: "feeds", From: 3000, To: 15001, MaxGrowth: 4}
	if want := "source feeds grew from 3,000 to 15,001 prefixes (+400%), more than the allowed +400%; the last good copy stays in force; raise max_growth or check the feed"; e.Error() != want {
		t.Errorf("got  %s\nwant %s", e.Error(), want)
	}

	// A URL that grew falls back on its committed copy.
	srv := newFeedServer(t, addrs(3000))
	uspec := Spec{Name: "url", Format: FormatList, URLs: []string{srv.URL + "/drop.txt"}}
	if src, err = l.Load(ctx, uspec); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}
	srv.serve(addrs(50000), `"v2"`, 0)
	src, err = l.Load(ctx, uspec)
	if err != nil {
		t.Fatal(err)
	}
	var ge *GrowthError
	if v4, _ := src.Prefixes(); v4 != 3000 {
		t.Errorf("grown feed: %d prefixes, want the committed 3000", v4)
	} else if stale, why := src.Stale(); !stale || !errors.As(why, &ge) {
		t.Errorf("grown feed: Stale() = %v, %v; want a *GrowthError", stale, why)
	}
}

// TestBombKeepsLastGood: a download over a limit is never cached; the
// source falls back on its last good copy, which stays the cached one.
func TestBombKeepsLastGood(t *testing.T) {
	ctx := context.Background()
	good := "192.0.2.0/24\n"
	srv := newFeedServer(t, good)
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feed", Format: FormatList, URLs: []string{srv.URL + "/drop.txt"}, MaxBytes: 1 << 20, MaxEntries: 1000}
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}
	_, base := l.cachePaths("feed", spec.URLs[0])
	for i, bomb := range []string{
		string(gzipOf(t, "198.51.100.1\n", 4<<20)), // decompresses past max_bytes
		strings.Repeat("\n", 2<<20),                // downloads past it
		addrs(2000),                                // past max_entries
		"192.0.2.0/24\n0.0.0.0/1\n",                // too broad
	} {
		srv.serve(bomb, fmt.Sprintf(`"bomb%d"`, i), 0)
		src, err := l.Load(ctx, spec)
		if err != nil {
			t.Fatalf("bomb %d: %v", i, err)
		}
		if got := cidrs(t, src); got != good {
			t.Errorf("bomb %d: loaded %q, want the last good copy", i, got)
		}
		stale, why := src.Stale()
		var le *LimitError
		var be *BroadError
		if !stale || !errors.As(why, &le) && !errors.As(why, &be) {
			t.Errorf("bomb %d: Stale() = %v, %v; want the limit that refused it", i, stale, why)
		}
		if cached, err := os.ReadFile(base + ".data"); err != nil || string(cached) != good {
			t.Errorf("bomb %d: the cache holds %d bytes, %v; want the good copy", i, len(cached), err)
		}
	}
}

// TestStatePerNamespace: the gates and the committed copies of one
// namespace do not apply to another (the bug: a policy applied with
// --netns A was refused with --netns B, "shrank by more than 50%").
func TestStatePerNamespace(t *testing.T) {
	ctx := context.Background()
	state, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "drop.txt")
	spec := Spec{Name: "feeds", Format: FormatList, Paths: []string{path}}
	la, lb, lcur := &Loader{StateDir: state, Namespace: "A"}, &Loader{StateDir: state, Namespace: "B"}, &Loader{StateDir: state}
	writeFile(t, dir, "drop.txt", []byte(addrs(2000)))
	src, err := la.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Commit(src); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "drop.txt", []byte(addrs(10)))
	var se *ShrinkError
	if _, err := la.Load(ctx, spec); !errors.As(err, &se) {
		t.Errorf("namespace A, 2000 → 10: %v, want a *ShrinkError", err)
	}
	for name, l := range map[string]*Loader{"B": lb, "current": lcur} {
		if _, err := l.Load(ctx, spec); err != nil {
			t.Errorf("namespace %s, never committed: %v", name, err)
		}
	}

	// URLs: each namespace falls back on its own committed copy.
	srv := newFeedServer(t, addrs(3000))
	uspec := Spec{Name: "url", Format: FormatList, URLs: []string{srv.URL + "/drop.txt"}}
	commit := func(l *Loader) {
		t.Helper()
		src, err := l.Load(ctx, uspec)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(src); err != nil {
			t.Fatal(err)
		}
	}
	commit(la) // 3000
	srv.serve(addrs(2500), `"v2"`, 0)
	commit(lb) // 2500
	srv.serve(addrs(5), `"v3"`, 0)
	for l, want := range map[*Loader]int{la: 3000, lb: 2500} {
		src, err := l.Load(ctx, uspec)
		if err != nil {
			t.Fatal(err)
		}
		if v4, _ := src.Prefixes(); v4 != want {
			t.Errorf("namespace %s: fell back on %d prefixes, want its own %d", l.Namespace, v4, want)
		}
	}
	for _, ns := range []string{"..", "/", ".hidden"} {
		if _, err := (&Loader{StateDir: state, Namespace: ns}).Load(ctx, spec); err == nil {
			t.Errorf("namespace %q was accepted", ns)
		}
	}
	// A namespace given as a path (--netns /run/netns/A) is namespace A.
	writeFile(t, dir, "drop.txt", []byte(addrs(10)))
	if _, err := (&Loader{StateDir: state, Namespace: "/run/netns/A"}).Load(ctx, spec); !errors.As(err, &se) {
		t.Errorf("namespace /run/netns/A, 2000 → 10: %v, want A's *ShrinkError", err)
	}
}

// TestHugeBadLineSmallError: a bad line of a megabyte gives an error of
// a few hundred bytes, whatever field is bad, in every format.
func TestHugeBadLineSmallError(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	big := strings.Repeat("9", 1<<20)
	for _, tc := range []struct{ format, row string }{
		{FormatList, "1.2.3.4/" + big},
		{FormatList, big},
		{FormatList, "1.2.3.4-" + big},
		{FormatList, "2001:db8::" + big},
		{FormatCountryCSV, "1.2.3.0,1.2.3.255," + big},
		{FormatCountryCSV, "1.2.3.0," + big + ",IT"},
		{FormatCountryCSV, big + ",IT"},
		{FormatRIRDelegated, "apnic|AU|ipv4|" + big + "|256|20100715|allocated"},
		{FormatRIRDelegated, "apnic|AU|ipv4|1.0.0.0|" + big + "|20100715|allocated"},
		{FormatRIRDelegated, "apnic|AU|" + big + "|1.0.0.0|256|20100715|allocated"},
		{FormatRIRDelegated, "apnic|AU|ipv4|1.0.0.0|256|20100715|" + big},
		{FormatRIRDelegated, "apnic|" + big + "|ipv4|1.0.0.0|256|20100715|allocated"},
	} {
		path := writeFile(t, dir, "f", []byte("\n"+tc.row+"\n"))
		_, err := (&Loader{}).Load(ctx, Spec{Name: "s", Format: tc.format, Paths: []string{path}})
		if err == nil || len(err.Error()) > 1000 || !strings.Contains(err.Error(), path+":2: ") {
			msg := "<nil>"
			if err != nil {
				msg = prefix.Clip(err.Error())
			}
			t.Errorf("%s, row of %d bytes: error of %d bytes: %s", tc.format, len(tc.row), len(msg), msg)
		}
	}
}

// TestURLSecretsNotShown: a feed URL's password and query values appear
// in no error, origin or stale reason.
func TestURLSecretsNotShown(t *testing.T) {
	ctx := context.Background()
	srv := newFeedServer(t, "192.0.2.0/24\n")
	u := strings.Replace(srv.URL, "http://", "http://user:s3cret-pass@", 1) + "/drop.txt?apikey=s3cret-key&fmt=txt"
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feed", Format: FormatList, URLs: []string{u}}
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	leaks := func(what, s string) {
		t.Helper()
		if strings.Contains(s, "s3cret") {
			t.Errorf("%s shows a secret: %s", what, s)
		}
	}
	m := src.Explain(mustAddr("192.0.2.1"))
	if len(m) != 1 {
		t.Fatalf("Explain: %+v", m)
	}
	leaks("origin", m[0].Origin)
	if want := strings.Replace(srv.URL, "http://", "http://user:xxxxx@", 1) + "/drop.txt?apikey=xxxxx&fmt=xxxxx:1"; m[0].Origin != want {
		t.Errorf("origin %q, want %q", m[0].Origin, want)
	}
	srv.serve("192.0.2.0/24\nbad line\n", `"v2"`, 0)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	_, why := src.Stale()
	leaks("parse error", why.Error())
	srv.serve("", "", 500)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	_, why = src.Stale()
	leaks("download error", why.Error())
	srv.Close()
	_, err = (&Loader{StateDir: t.TempDir()}).Load(ctx, spec) // no cache, no server
	if err == nil {
		t.Fatal("no server and no cache: loaded")
	}
	leaks("connection error", err.Error())
}

// TestMappedAddressesAreIPv4: ::ffff:a.b.c.d is read as a.b.c.d in every
// format, as bans and explain read it: a packet from it is IPv4.
func TestMappedAddressesAreIPv4(t *testing.T) {
	for _, tc := range []struct{ format, data string }{
		{FormatList, "::ffff:192.0.2.0/120\n"},
		{FormatList, "::ffff:192.0.2.0-::ffff:192.0.2.255\n"},
		{FormatCountryCSV, "::ffff:192.0.2.0,::ffff:192.0.2.255,IT\n"},
		{FormatCountryCSV, "::ffff:192.0.2.0/120,IT\n"},
	} {
		src, err := fromBytes(tc.format, []byte(tc.data))
		if err != nil {
			t.Fatalf("%s %q: %v", tc.format, tc.data, err)
		}
		if got := cidrs(t, src); got != "192.0.2.0/24\n" {
			t.Errorf("%s %q: %q, want 192.0.2.0/24", tc.format, tc.data, got)
		}
	}
}

// TestEntriesAcrossURLsFallBack: downloads that are each within the
// limits but together over max_entries fall back on the copies committed
// last, like a source that trips a gate.
func TestEntriesAcrossURLsFallBack(t *testing.T) {
	ctx := context.Background()
	a, b := newFeedServer(t, addrs(40)), newFeedServer(t, strings.ReplaceAll(addrs(40), "10.", "11."))
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, URLs: []string{a.URL + "/a", b.URL + "/b"}, MaxEntries: 100}
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}
	a.serve(addrs(60), `"a2"`, 0)
	b.serve(strings.ReplaceAll(addrs(60), "10.", "11."), `"b2"`, 0)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatalf("over max_entries together, with committed copies: %v", err)
	}
	var le *LimitError
	if v4, _ := src.Prefixes(); v4 != 80 {
		t.Errorf("%d prefixes, want the committed 80", v4)
	} else if stale, why := src.Stale(); !stale || !errors.As(why, &le) || le.File != allFiles {
		t.Errorf("Stale() = %v, %v; want the limit on all files", stale, why)
	}
}

// TestRedirectSendsNoReferer: a feed redirected to another host does not
// send it the feed's URL (and its key) as the Referer.
func TestRedirectSendsNoReferer(t *testing.T) {
	var referer atomic.Value
	referer.Store("")
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		referer.Store(r.Header.Get("Referer"))
		fmt.Fprint(w, "192.0.2.0/24\n")
	}))
	defer other.Close()
	first := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/moved", http.StatusFound)
	}))
	defer first.Close()
	spec := Spec{Name: "feed", Format: FormatList, URLs: []string{first.URL + "/drop.txt?key=s3cret"}}
	if _, err := (&Loader{StateDir: t.TempDir()}).Load(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if r := referer.Load().(string); r != "" {
		t.Errorf("the next host got Referer %q", r)
	}
}

// TestRepeatedRowsCompact: a file of one address repeated millions of
// times holds a handful of rows while it is read, not one per line
// (memory grows with distinct rows), counts every line it read, and
// explains the address by its first line.
func TestRepeatedRowsCompact(t *testing.T) {
	n := 2*compactAt + 5
	data := bytes.Repeat([]byte("192.0.2.7\n"), n)
	p, err := readPart(bytes.NewReader(data), FormatList, "dup.txt", 0, Spec{MaxEntries: 10 * n}.limits())
	if err != nil {
		t.Fatal(err)
	}
	if p.rows() != n || p.v4.len() > compactAt {
		t.Fatalf("read %d rows holding %d, want %d rows holding at most %d", p.rows(), p.v4.len(), n, compactAt)
	}
	src := &Source{name: "dup", format: FormatList, files: []string{"dup.txt"}}
	src.finish([]*part{p})
	if r4, _ := src.Rows(); r4 != n || src.v4.n != 1 {
		t.Fatalf("Rows() = %d with %d kept, want %d and 1", r4, src.v4.n, n)
	}
	if got := src.Explain(netip.MustParseAddr("192.0.2.7")); len(got) != 1 || got[0].Origin != "dup.txt:1" {
		t.Fatalf("Explain = %+v, want dup.txt:1 only", got)
	}
}

// TestNameBounds: a file that gives every row an AS and a long name of
// its own keeps at most maxNames names in maxNameBytes bytes; names are
// printable and cut at maxOrgName bytes; a name that cleans to nothing
// does not take the AS's name.
func TestNameBounds(t *testing.T) {
	var p part
	long := strings.Repeat("x", 200)
	for i := range uint32(maxNames + 1000) {
		p.name(i+1, long)
	}
	if len(p.names) > maxNames || p.nameBytes > maxNameBytes+maxOrgName {
		t.Errorf("%d names in %d bytes", len(p.names), p.nameBytes)
	}
	for _, n := range p.names {
		if len(n) > maxOrgName {
			t.Fatalf("a name of %d bytes", len(n))
		}
	}
	var q part
	for i := range uint32(maxNames + 1000) {
		q.name(i+1, "n")
	}
	if len(q.names) != maxNames {
		t.Errorf("%d short names, want %d", len(q.names), maxNames)
	}
	var r part
	r.name(7, "\x1b\x00\x07")
	r.name(7, "Real\x1b[31m Org")
	if r.names[7] != "Real [31m Org" {
		t.Errorf("name %q", r.names[7])
	}
}
