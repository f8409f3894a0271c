package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestReloadTrial: a timed refresh reads the sources of the policy as
// loaded, never a policy file edited behind the operator's back (which a
// reload on trial would then record as what to put back); a reload on
// trial that is rolled back puts back the policy before the edit; the
// API refuses what it cannot mean (rollback=maybe, a window too short)
// and says no trial is on when none is.
func TestReloadTrial(t *testing.T) {
	lab := netnstest.New(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.txt"), "192.0.2.0/24\n2001:db8:1::/48\n")
	writeFile(t, filepath.Join(dir, "b.txt"), "203.0.113.0/24\n2001:db8:2::/48\n")
	pol := filepath.Join(dir, "policy.yaml")
	policyOf := func(list string) string {
		return "sources:\n  s: {format: list, paths: [" + list + "], max_shrink: 0}\nprotect: [198.18.0.0/15, 2001:2::/48]\n" +
			"rules:\n  - {name: r, action: drop, match: {source: s}}\n"
	}
	writeFile(t, pol, policyOf("a.txt"))
	cfg := Config{Policy: pol, NetNS: lab.FW, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), Tick: time.Hour}
	r := startDaemon(t, cfg)
	ctx := context.Background()
	srcs := []string{"192.0.2.1", "203.0.113.5", "2001:db8:1::1", "2001:db8:2::1"}
	if got := verdicts(t, lab, srcs...); got != "dpdp" {
		t.Fatalf("verdicts at start %q", got)
	}

	// The file edited; a timed refresh keeps the policy as loaded.
	writeFile(t, pol, policyOf("b.txt"))
	if _, err := r.d.reload(ctx, true, false); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "dpdp" {
		t.Fatalf("a timed refresh loaded the edited policy file: %q", got)
	}

	// On trial, then rolled back: A again, though the file says B.
	if _, err := r.cl.ReloadTrial(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "pdpd" {
		t.Fatalf("verdicts on trial %q", got)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodPost, "/v1/confirm?rollback=maybe", http.StatusBadRequest, "bad_request"},
		{http.MethodPost, "/v1/reload?confirm=1s", http.StatusBadRequest, "bad_request"},
		{http.MethodPost, "/v1/reload", http.StatusConflict, "on_trial"},
	} {
		resp := rawRequest(t, cfg.Socket, tc.method, tc.path, "")
		var e api.Error
		_ = json.Unmarshal(resp.body, &e)
		if resp.status != tc.status || e.Code != tc.code {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, resp.status, resp.body, tc.status, tc.code)
		}
	}
	if cr, err := r.cl.Confirm(ctx, true); err != nil || !cr.RolledBack {
		t.Fatalf("confirm --rollback: %+v, %v", cr, err)
	}
	if got := verdicts(t, lab, srcs...); got != "dpdp" {
		t.Fatalf("verdicts after the rollback %q", got)
	}
	if _, err := r.d.reload(ctx, true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cl.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, lab, srcs...); got != "dpdp" {
		t.Fatalf("a refresh and a reload of the refused file: %q", got)
	}
	resp := rawRequest(t, cfg.Socket, http.MethodPost, "/v1/confirm", "")
	if resp.status != http.StatusNotFound {
		t.Errorf("confirm with nothing on trial: %d %s", resp.status, resp.body)
	}
}
