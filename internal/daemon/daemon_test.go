package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/nft/nfttest"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// running is a daemon started by a test.
type running struct {
	d    *Daemon
	cl   *api.Client
	stop func() error
}

func startDaemon(t *testing.T, cfg Config) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if testing.Verbose() {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	d := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	cl := api.NewClient(cfg.Socket)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := cl.Status(context.Background()); err == nil {
			break
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("daemon stopped while starting: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("daemon not ready after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := &running{d: d, cl: cl}
	stopped := false
	r.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		cl.Close()
		return <-done
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// verdicts sends one UDP packet per source through the lab and returns
// "p" (passed) or "d" (dropped) per source.
func verdicts(t *testing.T, lab *netns.Lab, srcs ...string) string {
	t.Helper()
	as := make([]netip.Addr, len(srcs))
	for i, s := range srcs {
		as[i] = netip.MustParseAddr(s)
	}
	var b strings.Builder
	for _, ok := range pktgentest.Send(t, lab, as, 9999) {
		b.WriteString(map[bool]string{true: "p", false: "d"}[ok])
	}
	return b.String()
}

// TestDaemon runs the daemon in a lab namespace and drives it through its
// API: bans (good and bad), a feed refresh sent as a diff, a feed that
// breaks, metrics, and a restart that brings the bans back.
func TestDaemon(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	feed := filepath.Join(dir, "feed.txt")
	writeFile(t, feed, "192.0.2.0/24\n2001:db8:1::/48\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  feed: {format: list, paths: [feed.txt], max_shrink: 0}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: 50 * time.Millisecond}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	srcs := []string{"192.0.2.1", "203.0.113.5", "100.64.1.1", "2001:db8:1::1", "2001:db8:2::1"}
	if got := verdicts(t, lab, srcs...); got != "dppdp" {
		t.Fatalf("verdicts at start %q", got)
	}

	// Bans.
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: "203.0.113.5", TTL: "1h", Reason: "ssh"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefixes: []string{"2001:db8:2::/48"}, Origin: "fail2ban"}); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "ddpdd" {
		t.Errorf("verdicts with bans %q, want ddpdd", got)
	}
	l, err := r.cl.List(ctx, api.ListOptions{})
	if err != nil || l.Total != 2 || l.Counts.ByOrigin["fail2ban"] != 1 || l.Bans[0].Reason != "ssh" {
		t.Errorf("list: %+v, %v", l, err)
	}

	// Bad requests: 400 with a code, nothing changed.
	before := netnstest.Ruleset(t, lab.FW)
	for _, tc := range []struct {
		body, code string
	}{
		{`{"prefix": "198.18.0.9"}`, "protected"},
		{`{"prefix": "10.0.0.0/4"}`, "too_broad"},
		{`{"prefix": "nonsense"}`, "invalid"},
		{`{"prefix": "192.0.2.9", "ttl": "1000d"}`, "ttl"},
		{`{"prefix": "192.0.2.9", "colour": "red"}`, "bad_request"},
		{`{"prefix": `, "bad_request"},
		{`{}`, "bad_request"},
		{`{"prefixes": ["192.0.2.10", "198.18.0.1"]}`, "own_address"},
	} {
		resp := rawRequest(t, cfg.Socket, http.MethodPost, "/v1/bans", tc.body)
		var e api.Error
		_ = json.Unmarshal(resp.body, &e)
		if resp.status != http.StatusBadRequest || e.Code != tc.code {
			t.Errorf("POST %s: %d %s, want 400 %s", tc.body, resp.status, resp.body, tc.code)
		}
	}
	if after := netnstest.Ruleset(t, lab.FW); after != before {
		t.Errorf("refused bans changed the ruleset")
	}

	// Concurrent clients: every ban lands, in few transactions, and each
	// caller gets its own ban back.
	concurrently(t, 8, func(c int) error {
		for i := range 50 {
			p := fmt.Sprintf("100.%d.%d.1", 65+c, i)
			resp, err := r.cl.Ban(ctx, api.BanRequest{Prefix: p, TTL: "10m", Origin: "load"})
			if err != nil {
				return err
			}
			if resp.Count != 1 || len(resp.Banned) != 1 || resp.Banned[0].Prefix.String() != p+"/32" {
				return fmt.Errorf("ban %s answered %+v", p, resp)
			}
		}
		return nil
	})
	if c, err := r.cl.Count(ctx); err != nil || c.ByOrigin["load"] != 400 {
		t.Errorf("count after concurrent bans: %+v, %v", c, err)
	}
	if got := kernelCount(t, lab.FW, nft.BanAddrs4); got != 401 {
		t.Errorf("bans_v4 holds %d elements, want 401", got)
	}
	// A quiet bulk ban answers with the count only.
	bulk := api.BanRequest{TTL: "10m", Origin: "bulk", Quiet: true}
	for i := range 100 {
		bulk.Prefixes = append(bulk.Prefixes, fmt.Sprintf("100.99.0.%d", i+1))
	}
	if resp, err := r.cl.Ban(ctx, bulk); err != nil || resp.Count != 100 || len(resp.Banned) != 0 {
		t.Errorf("quiet bulk ban: %+v, %v", resp, err)
	}
	if _, err := r.cl.Unban(ctx, "100.99.0.0/24", ""); err != nil { // not banned as such: no error
		t.Error(err)
	}
	// Concurrent unbans share transactions; each caller gets its own ban.
	concurrently(t, 4, func(c int) error {
		for i := c; i < 100; i += 4 {
			p := fmt.Sprintf("100.99.0.%d", i+1)
			resp, err := r.cl.Unban(ctx, p, "")
			if err != nil {
				return err
			}
			if len(resp.Unbanned) != 1 || resp.Unbanned[0].Prefix.String() != p+"/32" {
				return fmt.Errorf("unban %s answered %+v", p, resp)
			}
		}
		return nil
	})

	// A feed refresh is a diff: the bans stay, the new prefixes drop.
	writeFile(t, feed, "192.0.2.0/24\n2001:db8:1::/48\n100.64.0.0/16\n")
	rr, err := r.cl.Reload(ctx)
	if err != nil || rr.Mode != "update" {
		t.Fatalf("reload: %+v, %v", rr, err)
	}
	if got := verdicts(t, lab, srcs...); got != "ddddd" {
		t.Errorf("verdicts after refresh %q, want ddddd", got)
	}

	// A broken feed keeps the last good ruleset, and says so.
	writeFile(t, feed, "192.0.2.0/24\nthis is not an address\n")
	if _, err := r.cl.Reload(ctx); err == nil {
		t.Error("reload of a broken feed succeeded")
	}
	if got := verdicts(t, lab, srcs...); got != "ddddd" {
		t.Errorf("verdicts after a failed refresh %q, want ddddd", got)
	}
	st, err := r.cl.Status(ctx)
	if err != nil || len(st.Sources) != 1 || st.Sources[0].LastError == "" {
		t.Errorf("status after a failed refresh: %+v, %v", st, err)
	}
	rec := httptest.NewRecorder()
	r.d.metrics.handler(false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`ipfence_source_last_load_failed{source="feed"} 1`, `ipfence_bans_by_origin{origin="load"} 400`,
		`ipfence_rule_packets_total{rule="ban"}`, `ipfence_ban_request_seconds_count`, `ipfence_apply_seconds_count{kind="update"} 1`,
		`ipfence_conntrack_max `, `ipfence_ban_strikes 0`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, rec.Body.String())
		}
	}
	// Every metric the Grafana dashboard queries is one the daemon
	// exports (XDP's: TestDaemonXDP).
	for _, name := range dashboardMetrics(t) {
		if name != "ipfence_xdp_passed_packets_total" && !strings.Contains(rec.Body.String(), "# HELP "+name+" ") {
			t.Errorf("dist/grafana/ipfence.json queries %s, which the daemon does not export", name)
		}
	}

	// Unban, then restart: bans come back from the store.
	if _, err := r.cl.Unban(ctx, "2001:db8:2::/48", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("daemon stopped with %v", err)
	}
	if got := verdicts(t, lab, srcs...); got != "ddddp" {
		t.Errorf("verdicts with the daemon stopped %q, want ddddp (the ruleset stays)", got)
	}
	writeFile(t, feed, "192.0.2.0/24\n")
	r = startDaemon(t, cfg)
	if got := verdicts(t, lab, srcs...); got != "ddppp" {
		t.Errorf("verdicts after restart %q, want ddppp", got)
	}
	if c, err := r.cl.Count(ctx); err != nil || c.Total != 401 {
		t.Errorf("bans after restart: %+v, %v", c, err)
	}
}

type rawResponse struct {
	status int
	body   []byte
}

func rawRequest(t *testing.T, socket, method, path, body string) rawResponse {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (netConn, error) {
		return dialUnix(ctx, socket)
	}}}
	req, err := http.NewRequest(method, "http://ipfence"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResponse{resp.StatusCode, b}
}

// kernelCount counts the elements of a (small) set in the kernel.
func kernelCount(t *testing.T, ns, set string) int {
	t.Helper()
	return len(nfttest.Elements(t, ns, "set", "inet", "ipfence", set))
}

type netConn = net.Conn

func dialUnix(ctx context.Context, socket string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", socket)
}

// TestBansDuringFullReloads bans while the policy's rules change (each
// reload a full load of the table, bans included): no ban may be lost
// between reading the bans and loading them.
func TestBansDuringFullReloads(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "feed.txt"), "192.0.2.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	policies := []string{
		"sources:\n  feed: {format: list, paths: [feed.txt]}\nrules:\n  - {name: feed, action: drop, match: {source: feed}}\n",
		"sources:\n  feed: {format: list, paths: [feed.txt]}\nrules:\n  - {name: feed, action: drop, match: {source: feed}, ports: [tcp/22]}\n",
	}
	writeFile(t, pol, policies[0])
	r := startDaemon(t, Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: time.Hour})
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for i := range 300 {
			if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: fmt.Sprintf("100.64.%d.%d", i/250, i%250+1), TTL: "1h"}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	full := 0
	for i := 0; ; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if full < 2 {
				t.Errorf("only %d full reloads ran during the bans", full)
			}
			if n := kernelCount(t, lab.FW, nft.BanAddrs4); n != 300 {
				t.Errorf("bans_v4 holds %d elements after 300 bans and %d full reloads", n, full)
			}
			return
		default:
		}
		writeFile(t, pol, policies[i%2])
		rr, err := r.cl.Reload(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rr.Mode == "full" {
			full++
		}
	}
}

// TestDriftRepair: a ban element deleted behind the daemon's back, the
// base chain that looks the bans up, and the whole table flushed, are put
// back by the drift check.
func TestDriftRepair(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "feed.txt"), "192.0.2.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  feed: {format: list, paths: [feed.txt]}\nrules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	r := startDaemon(t, Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"),
		Tick: 20 * time.Millisecond, DriftEvery: 20 * time.Millisecond})
	ctx := context.Background()
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefixes: []string{"203.0.113.5", "203.0.113.6"}, TTL: "1h"}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not repaired after 10 s", what)
			}
		}
	}
	if out, err := netns.Exec(lab.FW, "nft", "delete", "element", "inet", "ipfence", nft.BanAddrs4, "{ 203.0.113.5 }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor("a deleted ban element", func() bool { return kernelCount(t, lab.FW, nft.BanAddrs4) == 2 })
	// The base chain before conntrack exists for the bans only (the
	// policy has no stateless rule): deleted, it is drift all the same.
	if out, err := netns.Exec(lab.FW, "nft", "delete", "chain", "inet", "ipfence", nft.BaseChainName); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor("a deleted base chain holding the bans", func() bool {
		out, err := netns.Exec(lab.FW, "nft", "list", "chain", "inet", "ipfence", nft.BaseChainName)
		return err == nil && strings.Contains(string(out), "@"+nft.BanAddrs4)
	})
	if out, err := netns.Exec(lab.FW, "nft", "delete", "table", "inet", "ipfence"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor("a deleted table", func() bool {
		out, err := netns.Exec(lab.FW, "nft", "list", "tables")
		return err == nil && strings.Contains(string(out), "ipfence") && kernelCount(t, lab.FW, nft.BanAddrs4) == 2
	})
	if st, err := r.cl.Status(ctx); err != nil || st.Drift < 3 {
		t.Errorf("status after three repairs: %+v, %v", st, err)
	}
}

// concurrently runs fn(0) to fn(n-1) at once and fails t with the first
// error.
func concurrently(t *testing.T, n int, fn func(int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonXDP runs a policy whose feed rule runs in XDP: the feed drops
// at the driver, bans and the port rule stay in nftables, a feed refresh
// swaps the XDP program (the link stays), a program gone from an
// interface is attached again by the drift check, and the counters reach
// the metrics.
func TestDaemonXDP(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	feed := filepath.Join(dir, "feed.txt")
	writeFile(t, feed, "192.0.2.0/24\n2001:db8:1::/48\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, fmt.Sprintf("backend: xdp\ninterfaces: [%s]\n", lab.FWIf)+
		"sources:\n  feed: {format: list, paths: [feed.txt], max_shrink: 0}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: feed, action: drop, match: {source: feed}}\n"+
		"  - {name: ssh, action: drop, ports: [udp/9999], match: {prefixes: [100.64.0.0/10]}}\n")
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"),
		Tick: 50 * time.Millisecond, DriftEvery: 200 * time.Millisecond, XDP: xdp.Options{PinDir: netnstest.BPFFS(t)}}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	xopt := cfg.XDP
	xopt.NetNS = lab.FW
	status := func() xdp.Status {
		t.Helper()
		st, err := xdp.ReadStatus(xopt, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Interfaces) != 1 || st.Interfaces[0].Program != st.Program {
			t.Fatalf("XDP status %+v: want the program on %s", st, lab.FWIf)
		}
		return st
	}
	st := status()
	if s, err := r.cl.Status(ctx); err != nil || s.Rules[0].Backend != "xdp" || s.Rules[1].Backend != "nftables" {
		t.Errorf("status: %+v, %v", s, err)
	}
	srcs := []string{"192.0.2.1", "203.0.113.5", "100.64.1.1", "2001:db8:1::1", "2001:db8:2::1"}
	if got := verdicts(t, lab, srcs...); got != "dpddp" {
		t.Fatalf("verdicts at start %q, want dpddp", got)
	}
	if n := xdp.Sum(status().Counters[1]).Packets; n == 0 {
		t.Error("the XDP feed rule counted no packet")
	}
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: "203.0.113.5", TTL: "1h"}); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "ddddp" {
		t.Errorf("verdicts with a ban %q, want ddddp", got)
	}

	// A feed refresh swaps the program; nftables is left as it was.
	table := netnstest.Ruleset(t, lab.FW)
	writeFile(t, feed, "192.0.2.0/24\n2001:db8::/32\n")
	rr, err := r.cl.Reload(ctx)
	if err != nil || rr.Mode != "update" {
		t.Fatalf("reload: %+v, %v", rr, err)
	}
	if after := netnstest.Ruleset(t, lab.FW); after != table {
		t.Error("a refresh of an XDP rule's feed changed the nftables ruleset")
	}
	if now := status(); now.Program == st.Program {
		t.Error("the feed changed but the XDP program was not swapped")
	}
	if got := verdicts(t, lab, srcs...); got != "ddddd" {
		t.Errorf("verdicts after the refresh %q, want ddddd", got)
	}

	// The link's pin removed by hand: the program is detached, and the
	// drift check attaches it again.
	dirs, err := filepath.Glob(filepath.Join(cfg.XDP.PinDir, "netns-*", "link_"+lab.FWIf))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("link pins %v, %v", dirs, err)
	}
	if err := os.Remove(dirs[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := xdp.ReadStatus(xopt, 1)
		if err == nil && len(st.Interfaces) == 1 && st.Interfaces[0].Program == st.Program {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("XDP not attached again after 10s: %+v, %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := verdicts(t, lab, srcs...); got != "ddddd" {
		t.Errorf("verdicts after the drift repair %q, want ddddd", got)
	}
	rec := httptest.NewRecorder()
	r.d.metrics.handler(false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`ipfence_rule_packets_total{rule="feed"}`, `# HELP ipfence_xdp_passed_packets_total `, `ipfence_drift_repairs_total 1`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, rec.Body.String())
		}
	}

	// A policy naming an interface that does not exist: the reload fails
	// and says so, the program and the table stay.
	st = status()
	table = netnstest.Ruleset(t, lab.FW)
	good, err := os.ReadFile(pol)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, pol, strings.Replace(string(good), "interfaces: ["+lab.FWIf+"]", "interfaces: ["+lab.FWIf+", nosuch0]", 1))
	if _, err := r.cl.Reload(ctx); err == nil {
		t.Error("reload with a missing interface succeeded")
	}
	if s, err := r.cl.Status(ctx); err != nil || !strings.Contains(s.LastError, "nosuch0") {
		t.Errorf("status after the failed reload: last error %q, %v", s.LastError, err)
	}
	if now := status(); now.Program != st.Program || netnstest.Ruleset(t, lab.FW) != table {
		t.Error("a failed reload changed the XDP program or the table")
	}
	writeFile(t, pol, string(good))

	// The rule moves to nftables: the program is detached.
	writeFile(t, pol, "sources:\n  feed: {format: list, paths: [feed.txt], max_shrink: 0}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	if rr, err := r.cl.Reload(ctx); err != nil || rr.Mode != "full" {
		t.Fatalf("reload to nftables: %+v, %v", rr, err)
	}
	if _, err := xdp.ReadStatus(xopt, 1); !errors.Is(err, xdp.ErrNotLoaded) {
		t.Errorf("XDP status after moving to nftables: %v, want ErrNotLoaded", err)
	}
	if got := verdicts(t, lab, srcs...); got != "ddpdd" {
		t.Errorf("verdicts in nftables %q, want ddpdd", got)
	}
}

// TestSlowFeedDoesNotStall: a due feed that drips its answer is
// refreshed off the daemon's loop and lock: while it downloads, status
// answers, bans go in and expire; a source that is not due is not
// downloaded again; and the refresh completes once the feed does.
func TestSlowFeedDoesNotStall(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	release := make(chan struct{})
	var slowReqs, fastReqs atomic.Int32
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slowReqs.Add(1) == 1 {
			fmt.Fprint(w, "192.0.2.0/24\n")
			return
		}
		fmt.Fprint(w, "192.0.2.0/24\n")
		w.(http.Flusher).Flush()
		select { // a feed that stalls mid-answer
		case <-release:
			fmt.Fprint(w, "198.51.100.0/24\n")
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	var once sync.Once
	unstall := func() { once.Do(func() { close(release) }) }
	defer unstall()
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fastReqs.Add(1)
		fmt.Fprint(w, "203.0.113.0/24\n")
	}))
	defer fast.Close()
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  slow: {format: list, url: \""+slow.URL+"/f\", refresh: 1m}\n  fast: {format: list, url: \""+fast.URL+"/f\", refresh: 1h}\n"+
		"protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n  - {name: slow, action: drop, match: {source: slow}}\n  - {name: fast, action: drop, match: {source: fast}}\n")
	r := startDaemon(t, Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: 50 * time.Millisecond})
	ctx := context.Background()

	// The slow feed is due: its refresh starts at the next tick, and hangs.
	r.d.mu.Lock()
	r.d.sources["slow"].checked = time.Now().Add(-time.Hour)
	r.d.mu.Unlock()
	eventually(t, 5*time.Second, "the slow feed is asked again", func() bool { return slowReqs.Load() == 2 })
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: "100.64.0.1", TTL: "1s"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		t0 := time.Now()
		if _, err := r.cl.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: fmt.Sprintf("100.64.1.%d", i+1), TTL: "1h"}); err != nil {
			t.Fatal(err)
		}
		// Blocked, they would wait for the stalled download; a loaded
		// CI machine may still take a while.
		if took := time.Since(t0); took > 5*time.Second {
			t.Errorf("status and a ban took %v during the slow refresh", took)
		}
	}
	eventually(t, 5*time.Second, "the 1s ban expires during the slow refresh", func() bool {
		l, err := r.cl.List(ctx, api.ListOptions{Within: "100.64.0.1/32"})
		return err == nil && l.Total == 0
	})
	if got := verdicts(t, lab, "198.51.100.1"); got != "p" {
		t.Errorf("the stalled download is in force already: %q", got)
	}
	unstall()
	eventually(t, 10*time.Second, "the refresh completes once the feed does", func() bool { return verdicts(t, lab, "198.51.100.1") == "d" })
	if n := fastReqs.Load(); n != 1 {
		t.Errorf("the fast feed, not due, was downloaded %d times, want once", n)
	}
}

func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRemovedSourceIsNotDue: a source the policy no longer has, and a
// crowdsec source's state, never make a timed refresh due (they used to,
// at every tick, once their interval had passed).
func TestRemovedSourceIsNotDue(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.txt"), "192.0.2.0/24\n")
	writeFile(t, filepath.Join(dir, "b.txt"), "198.51.100.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  a: {format: list, paths: [a.txt]}\n  b: {format: list, paths: [b.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: a, action: drop, match: {source: a}}\n  - {name: b, action: drop, match: {source: b}}\n")
	r := startDaemon(t, Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: 20 * time.Millisecond})
	writeFile(t, pol, "sources:\n  a: {format: list, paths: [a.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\nrules:\n  - {name: a, action: drop, match: {source: a}}\n")
	if _, err := r.cl.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.d.mu.Lock()
	r.d.sources["b"].checked = time.Now().Add(-time.Hour)
	r.d.sources["cs"] = &sourceState{refresh: time.Second, checked: time.Now().Add(-time.Hour)}
	applied := r.d.applied
	r.d.mu.Unlock()
	time.Sleep(300 * time.Millisecond) // 15 ticks
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if r.d.applied != applied {
		t.Errorf("a refresh ran for sources the policy does not have")
	}
}

// TestInputCompiledAgain: a fleet agent's input is the revision it keeps,
// compiled again at every reload: a compile must leave its sets whole
// (the policy's, resolved afresh each time, go as the plan is made). Its
// second compile blocks what the first did. In a lab namespace (the plan
// is checked against the namespace's own addresses).
func TestInputCompiledAgain(t *testing.T) {
	lab := netnstest.New(t)
	var b prefix.Builder
	b.AddPrefix(netip.MustParsePrefix("192.0.2.0/24"))
	set, _ := b.Build()
	rev := &plan.Input{Table: "ipfence", Priority: -300, Protect: plan.Builtin(),
		Rules: []plan.RuleInput{{Name: "feed", Action: plan.Drop, IPv4: true, IPv6: true, Set: set}}}
	d := New(Config{NetNS: lab.FW, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Input: func(context.Context) (*plan.Input, error) { return apply.ForHost(rev, plan.NFTables), nil }})
	for i := range 2 {
		c, err := d.compile(context.Background(), false, false)
		if err != nil {
			t.Fatal(err)
		}
		if rule, blocked := c.plan.Blocked(netip.MustParseAddr("192.0.2.7")); !blocked || rule != "feed" {
			t.Fatalf("compile %d: 192.0.2.7 blocked %v by %q, want by feed", i+1, blocked, rule)
		}
	}
	if rev.Rules[0].Set != set {
		t.Fatal("the revision's set was dropped by the compile")
	}
}

// dashboardMetrics are the metrics dist/grafana/ipfence.json's panels
// query (a histogram's by its name), after checking that it is a
// dashboard: panels with a title, each with queries.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../dist/grafana/ipfence.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil || dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dist/grafana/ipfence.json: %v, %d panels", err, len(dash.Panels))
	}
	seen := map[string]bool{}
	var names []string
	for _, p := range dash.Panels {
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q has no title or no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, n := range metricName.FindAllString(q.Expr, -1) {
				n = strings.TrimSuffix(n, "_bucket")
				if !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
		}
	}
	for _, want := range []string{"ipfence_rule_packets_total", "ipfence_bans_by_origin", "ipfence_source_age_seconds", "ipfence_feed_errors_total",
		"ipfence_ban_request_seconds", "ipfence_conntrack_entries"} {
		if !seen[want] {
			t.Errorf("the dashboard has no panel on %s", want)
		}
	}
	return names
}

var metricName = regexp.MustCompile(`ipfence_[a-z0-9_]+`)

// TestDaemonAllows drives allow entries through the daemon's API: one
// inside a dropped prefix and one inside a banned prefix pass, their
// neighbours do not; explain and status say so; a feed refresh (a
// difference load) and a restart keep them; a bad request changes
// nothing; DELETE removes one.
func TestDaemonAllows(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	feed := filepath.Join(dir, "feed.txt")
	writeFile(t, feed, "192.0.2.0/24\n2001:db8:1::/48\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  feed: {format: list, paths: [feed.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: 50 * time.Millisecond}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	srcs := []string{"192.0.2.7", "192.0.2.8", "203.0.113.5", "203.0.113.6", "2001:db8:1::7", "2001:db8:1:1::7"}
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: "203.0.113.0/24", TTL: "1h"}); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "dddddd" {
		t.Fatalf("verdicts before allows %q", got)
	}
	if _, err := r.cl.Allow(ctx, api.AllowRequest{Prefixes: []string{"192.0.2.7", "203.0.113.5", "2001:db8:1::/64"}, TTL: "1h", Reason: "vendor"}); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdpdpd" {
		t.Errorf("verdicts with allows %q, want pdpdpd", got)
	}
	ex, err := r.cl.Explain(ctx, "203.0.113.5", "udp", 9999)
	if err != nil || ex.Verdict != "accept" || ex.Rule != "allow" || ex.Allowed == nil || ex.Allowed.Reason != "vendor" {
		t.Errorf("explain of an allowed address: %+v, %v", ex, err)
	}
	if st, err := r.cl.Status(ctx); err != nil || st.Allows.Total != 3 {
		t.Errorf("status: %+v, %v", st, err)
	}
	// The last ban lifted (the chain before conntrack goes), and one
	// made again (it comes back): the allow entries still win.
	if _, err := r.cl.Unban(ctx, "203.0.113.0/24", ""); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdpppd" {
		t.Errorf("verdicts with no ban %q, want pdpppd", got)
	}
	if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: "203.0.113.0/24", TTL: "1h"}); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdpdpd" {
		t.Errorf("verdicts banned again %q, want pdpdpd", got)
	}

	before := netnstest.Ruleset(t, lab.FW)
	for _, body := range []string{`{"prefix": "10.0.0.0/4"}`, `{"prefix": "192.0.2.9", "ttl": "1000d"}`, `{"prefix": "192.0.2.9", "no_shorten": true}`, `{}`} {
		if resp := rawRequest(t, cfg.Socket, http.MethodPost, "/v1/allows", body); resp.status != http.StatusBadRequest {
			t.Errorf("POST /v1/allows %s: %d %s, want 400", body, resp.status, resp.body)
		}
	}
	if after := netnstest.Ruleset(t, lab.FW); after != before {
		t.Error("refused allow entries changed the ruleset")
	}

	writeFile(t, feed, "192.0.2.0/24\n2001:db8:1::/48\n198.51.100.0/24\n")
	if rr, err := r.cl.Reload(ctx); err != nil || rr.Mode != "update" {
		t.Fatalf("reload: %+v, %v", rr, err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdpdpd" {
		t.Errorf("verdicts after a refresh %q, want pdpdpd", got)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = startDaemon(t, cfg)
	if got := verdicts(t, lab, srcs...); got != "pdpdpd" {
		t.Errorf("verdicts after a restart %q, want pdpdpd", got)
	}
	if resp, err := r.cl.Unallow(ctx, "203.0.113.5", ""); err != nil || len(resp.Unallowed) != 1 {
		t.Errorf("unallow: %+v, %v", resp, err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdddpd" {
		t.Errorf("verdicts after unallow %q, want pdddpd", got)
	}
	if l, err := r.cl.Allows(ctx, api.ListOptions{}); err != nil || l.Total != 2 {
		t.Errorf("allows: %+v, %v", l, err)
	}
}
