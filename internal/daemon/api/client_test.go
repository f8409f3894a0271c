package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve runs a net/http server with h on a Unix socket for the test and
// counts the connections it accepted.
func serve(t *testing.T, h http.Handler, tune func(*http.Server)) (socket string, conns *atomic.Int32) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int32)
	srv := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	if tune != nil {
		tune(srv)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return socket, conns
}

func TestClientRoundTrip(t *testing.T) {
	var got struct {
		method, path, ctype string
		req                 BanRequest
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/bans", func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.ctype = r.Method, r.URL.Path, r.Header.Get("Content-Type")
		if err := json.NewDecoder(r.Body).Decode(&got.req); err != nil {
			t.Errorf("server: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"count": 1}`)
	})
	mux.HandleFunc("DELETE /v1/bans/{prefix...}", func(w http.ResponseWriter, r *http.Request) {
		got.path = r.PathValue("prefix")
		io.WriteString(w, `{"unbanned": []}`)
	})
	mux.HandleFunc("GET /v1/bans", func(w http.ResponseWriter, r *http.Request) {
		got.path = r.URL.RawQuery
		// Longer than net/http's buffer and without a length: chunked.
		io.WriteString(w, `{"total": 7, "bans": [], "counts": {"by_origin": {"`+strings.Repeat("x", 10000)+`": 1}}}`)
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			t.Errorf("reload: content length %d", r.ContentLength)
		}
		io.WriteString(w, `{"changed": true, "mode": "update"}`)
	})
	socket, conns := serve(t, mux, nil)
	c := NewClient(socket)
	defer c.Close()
	ctx := context.Background()

	resp, err := c.Ban(ctx, BanRequest{Prefix: "198.51.100.7", TTL: "1h", Reason: "ssh"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 1 || got.method != "POST" || got.path != "/v1/bans" || got.ctype != "application/json" ||
		got.req.Prefix != "198.51.100.7" || got.req.TTL != "1h" || got.req.Reason != "ssh" {
		t.Errorf("ban: sent %+v, answer %+v", got, resp)
	}
	if _, err := c.Unban(ctx, "2001:db8::/32", ""); err != nil || got.path != "2001:db8::/32" {
		t.Errorf("unban: %v, server saw %q", err, got.path)
	}
	l, err := c.List(ctx, ListOptions{Within: "10.0.0.0/8", Limit: 5})
	if err != nil || l.Total != 7 || len(l.Counts.ByOrigin) != 1 {
		t.Errorf("list: %v, %+v", err, l)
	}
	if got.path != "limit=5&offset=0&within=10.0.0.0%2F8" {
		t.Errorf("list query %q", got.path)
	}
	if r, err := c.Reload(ctx); err != nil || !r.Changed || r.Mode != "update" {
		t.Errorf("reload: %v, %+v", err, r)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 4 calls one after another, want 1 kept alive", n)
	}
}

func TestClientError(t *testing.T) {
	socket, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			http.Error(w, "not json at all", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"code": "protected", "error": "198.18.0.1 is protected"}`)
	}), nil)
	c := NewClient(socket)
	defer c.Close()
	_, err := c.Ban(context.Background(), BanRequest{Prefix: "198.18.0.1"})
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusForbidden || e.Code != "protected" || e.Message != "198.18.0.1 is protected" {
		t.Errorf("got %#v", err)
	}
	_, err = c.Status(context.Background())
	if !errors.As(err, &e) || e.Status != http.StatusBadGateway || e.Code != "internal" || !strings.Contains(e.Message, "not json at all") {
		t.Errorf("got %#v", err)
	}
	// A path that cannot go on a request line is refused before sending.
	if _, err := c.Unban(context.Background(), "1.2.3.4 HTTP/1.1\r\nX: y", ""); err == nil {
		t.Error("a prefix with spaces and line breaks was sent")
	}
}

// TestClientStaleConnection: the daemon closed a kept-alive connection
// (idle timeout, restart); the next call goes through on a new one.
func TestClientStaleConnection(t *testing.T) {
	var calls atomic.Int32
	socket, conns := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, `{"total": 3}`)
	}), func(s *http.Server) { s.IdleTimeout = 50 * time.Millisecond })
	c := NewClient(socket)
	defer c.Close()
	for i := range 3 {
		if i > 0 {
			time.Sleep(200 * time.Millisecond) // the server closes the idle connection
		}
		n, err := c.Count(context.Background())
		if err != nil || n.Total != 3 {
			t.Fatalf("call %d: %v, %+v", i, err, n)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("server saw %d calls, want 3", n)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (each idle one closed by the server)", n)
	}
}

func TestClientCancel(t *testing.T) {
	release := make(chan struct{})
	socket, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}), nil)
	defer close(release)
	c := NewClient(socket)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := c.Status(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the call returned %v after its context was cancelled", d)
	}
	ctx, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	if _, err := c.Status(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
}

// lateCtx is a context whose deadline has passed before its timer fired.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestClientDeadlinePassed: a call whose deadline has passed says so, even
// before the context's timer has fired, rather than failing with an i/o
// timeout that callers would count as an error of the daemon.
func TestClientDeadlinePassed(t *testing.T) {
	socket, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{}`)
	}), nil)
	c := NewClient(socket)
	defer c.Close()
	if _, err := c.Status(context.Background()); err != nil { // a kept-alive connection
		t.Fatal(err)
	}
	if _, err := c.Status(lateCtx{context.Background()}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
}

func TestClientNoDaemon(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "nobody.sock"))
	defer c.Close()
	if _, err := c.Status(context.Background()); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("got %v, want ErrNoDaemon", err)
	}
}

// TestClientConcurrent: concurrent calls each get a connection; after
// they are done, the connections are reused rather than dialled again.
func TestClientConcurrent(t *testing.T) {
	socket, conns := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req BanRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(BanResponse{Count: len(req.Prefixes)})
	}), nil)
	c := NewClient(socket)
	defer c.Close()
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := range 50 {
				ps := make([]string, w+i%3)
				r, err := c.Ban(context.Background(), BanRequest{Prefixes: ps})
				if err == nil && r.Count != len(ps) {
					err = errors.New("answer of another call")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n > 8 {
		t.Errorf("%d connections for 8 concurrent callers", n)
	}
}

// TestClientDaemonRestart: after a restart every kept-alive connection is
// dead; the next call still goes through, on a new one.
func TestClientDaemonRestart(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // so that the callers overlap
		io.WriteString(w, `{"total": 5}`)
	})
	dir := t.TempDir()
	socket := filepath.Join(dir, "api.sock")
	start := func() *http.Server {
		ln, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		return srv
	}
	srv := start()
	c := NewClient(socket)
	defer c.Close()
	concurrent := make(chan error, 4)
	for range 4 {
		go func() { _, err := c.Count(context.Background()); concurrent <- err }()
	}
	for range 4 {
		if err := <-concurrent; err != nil {
			t.Fatal(err)
		}
	}
	if len(c.idle) < 2 {
		t.Fatalf("%d idle connections, want several for this test", len(c.idle))
	}
	srv.Close() // closes the idle connections and removes the socket
	srv = start()
	defer srv.Close()
	for i := range 3 {
		if n, err := c.Count(context.Background()); err != nil || n.Total != 5 {
			t.Fatalf("call %d after the restart: %v, %+v", i, err, n)
		}
	}
}

func TestClientUnbanEscapes(t *testing.T) {
	var got []string
	mux := http.NewServeMux()
	mux.HandleFunc("DELETE /v1/bans/{prefix...}", func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.PathValue("prefix"))
		io.WriteString(w, `{"unbanned": []}`)
	})
	socket, _ := serve(t, mux, nil)
	c := NewClient(socket)
	defer c.Close()
	for _, p := range []string{"192.0.2.1", "198.51.100.0/24", "2001:db8::/32", "192.0.2.1?x", "192.0.2.1#y"} {
		if _, err := c.Unban(context.Background(), p, ""); err != nil {
			t.Fatalf("unban %q: %v", p, err)
		}
		if got[len(got)-1] != p {
			t.Errorf("unban %q: the daemon saw %q", p, got[len(got)-1])
		}
	}
}

func TestClientBodyLimit(t *testing.T) {
	var calls atomic.Int32
	socket, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }), nil)
	c := NewClient(socket)
	defer c.Close()
	req := BanRequest{Prefixes: make([]string, MaxBody/8)}
	for i := range req.Prefixes {
		req.Prefixes[i] = "198.51.100.200"
	}
	if _, err := c.Ban(context.Background(), req); err == nil || !strings.Contains(err.Error(), "send it in parts") {
		t.Errorf("got %v, want the limit's error", err)
	}
	if calls.Load() != 0 {
		t.Error("an oversized request reached the daemon")
	}
}
