package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/prefix"
)

const lastModified = "Fri, 02 Jan 2026 15:04:05 GMT"

// feedServer serves one feed on 127.0.0.1 with an ETag, answering
// conditional requests with 304, or with a forced status.
type feedServer struct {
	*httptest.Server
	mu       sync.Mutex
	body     []byte
	etag     string
	status   int      // if not 0, answer this instead
	requests []string // "GET" or "GET If-None-Match=..." per request
}

func newFeedServer(t *testing.T, body string) *feedServer {
	s := &feedServer{body: []byte(body), etag: `"v1"`}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		req := "GET"
		if inm := r.Header.Get("If-None-Match"); inm != "" {
			req += " If-None-Match=" + inm
		}
		if ims := r.Header.Get("If-Modified-Since"); ims != "" {
			req += " If-Modified-Since=" + ims
		}
		s.requests = append(s.requests, req)
		switch {
		case s.status != 0:
			w.WriteHeader(s.status)
		case r.Header.Get("If-None-Match") == s.etag:
			w.WriteHeader(http.StatusNotModified)
		default:
			if s.etag != "" {
				w.Header().Set("ETag", s.etag)
			}
			w.Header().Set("Last-Modified", lastModified)
			w.Write(s.body)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// serve sets what the server answers next.
func (s *feedServer) serve(body, etag string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body, s.etag, s.status = []byte(body), etag, status
}

// count is the number of requests so far.
func (s *feedServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

func (s *feedServer) lastRequest() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		return ""
	}
	return s.requests[len(s.requests)-1]
}

// cidrs returns the prefixes of src, one per line.
func cidrs(t *testing.T, src *Source) string {
	t.Helper()
	var b bytes.Buffer
	if err := prefix.WriteCIDRs(&b, src.Set()); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestURLCache(t *testing.T) {
	ctx := context.Background()
	srv := newFeedServer(t, "# feed v1\n192.0.2.0/24\n")
	url := srv.URL + "/drop.txt"
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, URLs: []string{url}}

	// 200: downloaded into the cache.
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := cidrs(t, src); got != "192.0.2.0/24\n" {
		t.Errorf("first load: %q", got)
	}
	if stale, err := src.Stale(); stale {
		t.Errorf("first load is stale: %v", err)
	}
	if m := src.Explain(mustAddr("192.0.2.1")); len(m) != 1 || m[0].Origin != url+":2" {
		t.Errorf("Explain = %+v, want origin %s:2", m, url)
	}
	if r := srv.lastRequest(); r != "GET" {
		t.Errorf("first request %q, want an unconditional GET", r)
	}
	_, base := l.cachePaths("feeds", url)
	cached, err := os.ReadFile(base + ".data")
	if err != nil || string(cached) != "# feed v1\n192.0.2.0/24\n" {
		t.Errorf("cached copy %q, %v", cached, err)
	}

	// 304: the cache is used, and is not stale.
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if r := srv.lastRequest(); r != `GET If-None-Match="v1" If-Modified-Since=`+lastModified {
		t.Errorf("second request %q, want a conditional GET", r)
	}
	if got := cidrs(t, src); got != "192.0.2.0/24\n" {
		t.Errorf("304 load: %q", got)
	}
	if stale, err := src.Stale(); stale {
		t.Errorf("304 load is stale: %v", err)
	}

	// 200 with new content (gzipped: detected by its magic bytes).
	srv.serve(string(gzipped([]byte("198.51.100.0/24\n"))), `"v2"`, 0)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := cidrs(t, src); got != "198.51.100.0/24\n" {
		t.Errorf("new content: %q", got)
	}

	// 500: the last cached copy stays, the source says why it is stale.
	srv.serve("", "", http.StatusInternalServerError)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := cidrs(t, src); got != "198.51.100.0/24\n" {
		t.Errorf("after a 500: %q, want the cached copy", got)
	}
	stale, why := src.Stale()
	var de *DownloadError
	if !stale || !errors.As(why, &de) || de.Status != 500 || !strings.Contains(why.Error(), "using the copy downloaded on") {
		t.Errorf("after a 500: Stale() = %v, %v; want a *DownloadError with status 500", stale, why)
	}

	// A download that does not parse: the last cached copy stays.
	srv.serve("198.51.100.0/24\n<html>Service unavailable</html>\n", `"v3"`, 0)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := cidrs(t, src); got != "198.51.100.0/24\n" {
		t.Errorf("after garbage: %q, want the cached copy", got)
	}
	stale, why = src.Stale()
	var pe *prefix.ParseError
	if !stale || !errors.As(why, &pe) || pe.File != url || pe.Line != 2 {
		t.Errorf("after garbage: Stale() = %v, %v; want a parse error at %s:2", stale, why, url)
	}
	if cached, _ := os.ReadFile(base + ".data"); !bytes.Equal(cached, gzipped([]byte("198.51.100.0/24\n"))) {
		t.Errorf("garbage replaced the cached copy: %q", cached)
	}

	// The server is gone: the cached copy stays.
	srv.Close()
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if stale, why := src.Stale(); !stale || !errors.As(why, &de) || de.Status != 0 {
		t.Errorf("server gone: Stale() = %v, %v; want a *DownloadError", stale, why)
	}
	entries, _ := os.ReadDir(filepath.Dir(base))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left in the cache", e.Name())
		}
	}
}

func TestURLNoCache(t *testing.T) {
	ctx := context.Background()
	srv := newFeedServer(t, "")
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"500", http.StatusInternalServerError, "", "server answered 500 Internal Server Error; there is no cached copy"},
		{"404", http.StatusNotFound, "", "server answered 404"},
		{"garbage", 0, "<html>\n", `does not parse: ` + srv.URL + `/x:1: cannot parse "<html>"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.serve(tc.body, `"x"`, tc.status)
			l := &Loader{StateDir: t.TempDir()}
			src, err := l.Load(ctx, Spec{Name: "feeds", Format: FormatList, URLs: []string{srv.URL + "/x"}})
			if err == nil {
				t.Fatalf("Load succeeded: %v", src)
			}
			if !strings.HasPrefix(err.Error(), "source feeds: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		l := &Loader{StateDir: t.TempDir()}
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		_, err := l.Load(ctx, Spec{Name: "feeds", Format: FormatList, URLs: []string{dead.URL + "/x"}})
		var de *DownloadError
		if !errors.As(err, &de) || de.URL != dead.URL+"/x" {
			t.Errorf("error %v, want a *DownloadError", err)
		}
	})
}

// prefixes returns n distinct, non-adjacent IPv4 /24s, one per line.
func prefixes(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "10.%d.%d.0/24\n", i/100, 2*(i%100))
	}
	return b.String()
}

func TestShrinkGate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "drop.txt")
	write := func(n int) {
		t.Helper()
		if err := os.WriteFile(path, []byte(prefixes(n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, Paths: []string{path}}

	write(100)
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	write(10) // no last good load yet: anything goes
	if _, err := l.Load(ctx, spec); err != nil {
		t.Fatalf("before any commit: %v", err)
	}
	if err := l.Commit(src); err != nil { // 100 prefixes
		t.Fatal(err)
	}

	for _, tc := range []struct {
		n         int
		maxShrink float64
		want      string // "" = accepted
	}{
		{40, 0, "source feeds shrank from 100 to 40 prefixes (-60%), more than the allowed 50%; the last good copy stays in force; raise max_shrink or check the feed"},
		{50, 0, ""}, // exactly 50%
		{49, 0, "(-51%), more than the allowed 50%"},
		{0, 0.9, "(-100%), more than the allowed 90%"},
		{40, 0.7, ""},
		{1, -1, ""}, // gate off
		{250, 0, ""},
	} {
		write(tc.n)
		spec.MaxShrink = tc.maxShrink
		_, err := l.Load(ctx, spec)
		var se *ShrinkError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%d prefixes, max_shrink %v: %v", tc.n, tc.maxShrink, err)
		case tc.want != "" && (!errors.As(err, &se) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%d prefixes, max_shrink %v: error %v, want a *ShrinkError containing %q", tc.n, tc.maxShrink, err, tc.want)
		case se != nil && (se.From != 100 || se.To != tc.n || se.Source != "feeds"):
			t.Errorf("ShrinkError %+v", se)
		}
	}

	// Commit moves the reference.
	write(40)
	spec.MaxShrink = 0.7
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}
	write(20)
	spec.MaxShrink = 0
	if _, err := l.Load(ctx, spec); err != nil {
		t.Errorf("40 → 20 after committing 40: %v", err)
	}

	// Without a state directory there is no gate, and Commit does nothing.
	var nostate Loader
	write(1)
	if src, err := nostate.Load(ctx, spec); err != nil || nostate.Commit(src) != nil {
		t.Errorf("no state: %v", err)
	}

	// A corrupt state file is an error that says what to do.
	if err := os.WriteFile(l.statePath("feeds"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(ctx, spec); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("corrupt state: error %v", err)
	}
}

func TestShrinkErrorMessage(t *testing.T) {
	e := &ShrinkError{Source: "feeds", From: 41205, To: 3002, MaxShrink: 0.5}
	want := "source feeds shrank from 41,205 to 3,002 prefixes (-93%), more than the allowed 50%; " +
		"the last good copy stays in force; raise max_shrink or check the feed"
	if e.Error() != want {
		t.Errorf("got  %s\nwant %s", e.Error(), want)
	}
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestShrinkGateURL checks that a feed which shrank upstream falls back on
// the copy committed last, and that Commit keeps exactly what was loaded.
func TestShrinkGateURL(t *testing.T) {
	ctx := context.Background()
	srv := newFeedServer(t, prefixes(100))
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, URLs: []string{srv.URL + "/drop.txt"}}
	src, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}

	srv.serve(prefixes(3), `"v2"`, 0)
	src, err = l.Load(ctx, spec)
	if err != nil {
		t.Fatalf("a shrunk feed with a committed copy: %v", err)
	}
	if v4, _ := src.Prefixes(); v4 != 100 {
		t.Errorf("shrunk feed: %d prefixes, want the committed 100", v4)
	}
	stale, why := src.Stale()
	var se *ShrinkError
	if !stale || !errors.As(why, &se) || se.From != 100 || se.To != 3 {
		t.Errorf("shrunk feed: Stale() = %v, %v; want a *ShrinkError 100 → 3", stale, why)
	}
	// Committing the fallback changes nothing.
	if err := l.Commit(src); err != nil {
		t.Fatal(err)
	}

	// Raising max_shrink accepts the new copy, already in the cache (304).
	spec.MaxShrink = 0.99
	fresh, err := l.Load(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if v4, _ := fresh.Prefixes(); v4 != 3 {
		t.Errorf("max_shrink 0.99: %d prefixes, want 3", v4)
	}
	if r := srv.lastRequest(); r != `GET If-None-Match="v2" If-Modified-Since=`+lastModified {
		t.Errorf("request %q, want a conditional GET", r)
	}

	// The cached copy changes before fresh is committed: Commit refuses.
	srv.serve(prefixes(7), `"v3"`, 0)
	if _, err := l.Load(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(fresh); !errors.Is(err, errChanged) {
		t.Errorf("Commit of an outdated load: %v, want errChanged", err)
	}

	// The download fails and the cached copy shrank: the committed copy.
	srv.serve("", "", http.StatusInternalServerError)
	spec.MaxShrink = 0
	src, err = l.Load(ctx, spec) // the 7-prefix copy, stale, then the gate
	if err != nil {
		t.Fatal(err)
	}
	if v4, _ := src.Prefixes(); v4 != 100 {
		t.Errorf("download failed and the cached copy shrank: %d prefixes, want the committed 100", v4)
	}
	if _, why := src.Stale(); !errors.As(why, &se) || !errors.As(why, new(*DownloadError)) {
		t.Errorf("Stale() reason %v, want both the download error and the shrink", why)
	}
}

// TestURLMinAge: with MinAge (a catalog feed's shortest refresh), a load
// within it reads the cached download and asks the publisher nothing; an
// older one asks (conditionally) again.
func TestURLMinAge(t *testing.T) {
	ctx := context.Background()
	srv := newFeedServer(t, "192.0.2.0/24\n")
	url := srv.URL + "/drop.txt"
	l := &Loader{StateDir: t.TempDir()}
	spec := Spec{Name: "feeds", Format: FormatList, URLs: []string{url}, MinAge: time.Hour}
	for range 3 {
		src, err := l.Load(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := cidrs(t, src); got != "192.0.2.0/24\n" {
			t.Errorf("load: %q", got)
		}
	}
	if n := srv.count(); n != 1 {
		t.Errorf("%d requests within the minimum age, want 1", n)
	}
	spec.MinAge = time.Nanosecond
	if _, err := l.Load(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if n := srv.count(); n != 2 {
		t.Errorf("%d requests past the minimum age, want 2", n)
	}
}
