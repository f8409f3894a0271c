// Package brokertest runs the embedded NATS server for tests.
package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/fleet/broker"
)

// Server is an embedded server for one test.
type Server struct {
	URL  string
	Dir  string
	stop func()
}

// Start runs an embedded server with JetStream in dir (a new temporary
// folder when ""), on a free port of 127.0.0.1; the test stops it.
func Start(t testing.TB, dir string) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	return StartOn(t, dir, "127.0.0.1:-1")
}

// StartOn is Start on listen (host:port; port -1 is any free one).
func StartOn(t testing.TB, dir, listen string) *Server {
	t.Helper()
	return StartWith(t, broker.ServerConfig{DataDir: dir, Listen: listen})
}

// StartWith runs an embedded server configured by cfg (its Ready is
// the helper's).
func StartWith(t testing.TB, cfg broker.ServerConfig) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan string, 1), make(chan error, 1)
	cfg.Ready = func(url string) { ready <- url }
	go func() { done <- broker.Serve(ctx, cfg) }()
	s := &Server{Dir: cfg.DataDir}
	select {
	case s.URL = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("embedded NATS: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("embedded NATS: not ready after 30s")
	}
	var once bool
	s.stop = func() {
		if !once {
			once = true
			cancel()
			<-done
		}
	}
	t.Cleanup(s.stop)
	return s
}

// Stop stops the server (the test's cleanup does it otherwise).
func (s *Server) Stop() { s.stop() }
