package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestMonitorSwitch: a rule in monitor mode passes what it would drop,
// and its status, metrics and explain say so; switching it to enforce
// and back is a difference load that sends no element (only its hit
// chain changes), and the verdicts follow.
func TestMonitorSwitch(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "feed.txt"), "192.0.2.0/24\n2001:db8:1::/48\n")
	pol := filepath.Join(dir, "policy.yaml")
	policy := func(mode string) string {
		return "sources:\n  feed: {format: list, paths: [feed.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n" +
			"rules:\n  - {name: feed, action: drop, mode: " + mode + ", match: {source: feed}}\n"
	}
	writeFile(t, pol, policy("monitor"))
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: time.Hour}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	srcs := []string{"192.0.2.1", "192.0.2.2", "203.0.113.5", "2001:db8:1::1", "2001:db8:2::1"}
	if got := verdicts(t, lab, srcs...); got != "ppppp" {
		t.Fatalf("verdicts in monitor mode %q, want ppppp", got)
	}
	st, err := r.cl.Status(ctx)
	if err != nil || len(st.Rules) != 1 || st.Rules[0].Mode != "monitor" {
		t.Fatalf("status: %+v, %v", st, err)
	}
	ex, err := r.cl.Explain(ctx, "192.0.2.1", "udp", 9999)
	if err != nil || ex.Verdict != "accept" || !slices.Equal(ex.Monitored, []string{"feed"}) {
		t.Errorf("explain: %+v, %v; want accept, monitored by feed", ex, err)
	}
	metrics := func() string {
		rec := httptest.NewRecorder()
		r.d.metrics.handler(false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	m := metrics()
	for _, want := range []string{`ipfence_rule_monitor{rule="feed"} 1`, `ipfence_rule_packets_total{rule="feed"} 3`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics in monitor mode lack %q:\n%s", want, m)
		}
	}

	for _, step := range []struct{ mode, want string }{{"enforce", "ddpdp"}, {"monitor", "ppppp"}} {
		writeFile(t, pol, policy(step.mode))
		rr, err := r.d.Reload(ctx)
		if err != nil || rr.Mode != "update" || rr.Added != 0 || rr.Deleted != 0 {
			t.Fatalf("switch to %s: %+v, %v; want an update of no element", step.mode, rr, err)
		}
		if got := verdicts(t, lab, srcs...); got != step.want {
			t.Errorf("verdicts after the switch to %s %q, want %s", step.mode, got, step.want)
		}
	}
	if m := metrics(); !strings.Contains(m, `ipfence_rule_monitor{rule="feed"} 1`) {
		t.Errorf("metrics after the switch back lack the monitor gauge:\n%s", m)
	}
}

// TestMonitorKeepsAllowlist: a rule in monitor mode ahead of an accept
// rule does not end the leading accept rules, which win over bans: a
// banned address the allowlist holds still passes, as it would without
// the monitor rule; a banned address outside it is dropped.
func TestMonitorKeepsAllowlist(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "feed.txt"), "203.0.113.0/24\n192.0.2.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeFile(t, pol, "sources:\n  feed: {format: list, paths: [feed.txt]}\nprotect: [198.18.0.0/15, 2001:2::/48]\n"+
		"rules:\n  - {name: trial, action: drop, mode: monitor, match: {source: feed}}\n"+
		"  - {name: office, action: accept, match: {prefixes: [203.0.113.0/24]}}\n"+
		"  - {name: late, action: drop, match: {prefixes: [100.64.0.0/16]}}\n")
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: time.Hour}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	for _, a := range []string{"203.0.113.5", "192.0.2.5"} {
		if _, err := r.cl.Ban(ctx, api.BanRequest{Prefix: a, TTL: "1h"}); err != nil {
			t.Fatal(err)
		}
	}
	// office's banned address passes, the other banned one does not;
	// the monitor rule stops neither of the unbanned ones.
	if got := verdicts(t, lab, "203.0.113.5", "192.0.2.5", "203.0.113.6", "192.0.2.6", "100.64.0.1"); got != "pdppd" {
		t.Errorf("verdicts %q, want pdppd", got)
	}
	ex, err := r.cl.Explain(ctx, "203.0.113.5", "udp", 9999)
	if err != nil || ex.Verdict != "accept" || ex.Rule != "office" {
		t.Errorf("explain 203.0.113.5: %+v, %v; want accepted by office", ex, err)
	}
}
