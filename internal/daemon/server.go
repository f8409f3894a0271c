package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/trial"
)

// maxBody bounds a request body (a bulk ban of ~100k addresses).
const maxBody = api.MaxBody

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/bans", d.handleBan)
	mux.HandleFunc("DELETE /v1/bans/{prefix...}", d.handleUnban)
	mux.HandleFunc("GET /v1/bans", d.handleList)
	mux.HandleFunc("GET /v1/bans/count", d.handleCount)
	mux.HandleFunc("POST /v1/allows", d.handleAllow)
	mux.HandleFunc("DELETE /v1/allows/{prefix...}", d.handleUnallow)
	mux.HandleFunc("GET /v1/allows", d.handleAllows)
	mux.HandleFunc("GET /v1/status", d.handleStatus)
	mux.HandleFunc("POST /v1/reload", d.handleReload)
	mux.HandleFunc("POST /v1/confirm", d.handleConfirm)
	mux.HandleFunc("GET /v1/explain", d.handleExplain)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint %s %s (see /v1/...)", r.Method, r.URL.Path))
	})
	return mux
}

// decodeBody reads r's body, one JSON object of known fields, into v;
// false (the error written) when it is not one.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "malformed JSON: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "bad_request", "malformed JSON: more than one object")
		return false
	}
	return true
}

// requests are the requests a ban or allow body asks for: prefix and
// prefixes, each with ttl (a duration; empty: for good), reason and
// origin ("api" when empty); false (the error written) when the body is
// wrong. what names the request in the error of one with no prefix.
func requests(w http.ResponseWriter, what, prefix string, prefixes []string, ttl, reason, origin string) ([]bansets.Request, bool) {
	targets := prefixes
	if prefix != "" {
		targets = append([]string{prefix}, targets...)
	}
	if len(targets) == 0 {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`nothing to %s: give "prefix" or "prefixes"`, what))
		return nil, false
	}
	d, err := ban.ParseTTL(ttl)
	if err != nil {
		writeBanError(w, err)
		return nil, false
	}
	if origin == "" {
		origin = "api"
	}
	reqs := make([]bansets.Request, len(targets))
	for i, t := range targets {
		p, err := ban.ParsePrefix(t)
		if err != nil {
			writeBanError(w, err)
			return nil, false
		}
		reqs[i] = bansets.Request{Prefix: p, TTL: d, Reason: reason, Origin: origin}
	}
	return reqs, true
}

func (d *Daemon) handleBan(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	var req api.BanRequest
	if !decodeBody(w, r, &req) {
		return
	}
	reqs, ok := requests(w, "ban", req.Prefix, req.Prefixes, req.TTL, req.Reason, req.Origin)
	if !ok {
		return
	}
	for i := range reqs {
		reqs[i].NoShorten = req.NoShorten
	}
	done, err := d.ban(r.Context(), reqs, req.Quiet)
	if err != nil {
		writeBanError(w, err)
		return
	}
	d.metrics.banSeconds.Observe(time.Since(t0).Seconds())
	resp := api.BanResponse{Banned: done.Bans, Count: done.N}
	if req.Quiet {
		resp.Banned = nil
	}
	writeJSON(w, http.StatusCreated, resp)
}

func (d *Daemon) handleUnban(w http.ResponseWriter, r *http.Request) {
	l, ok := liftOf(w, r)
	if !ok {
		return
	}
	l.Forget = r.URL.Query().Get("forget") == "1"
	lifted, err := d.Unban(r.Context(), []bansets.Lift{l})
	if err != nil {
		writeBanError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.UnbanResponse{Unbanned: lifted})
}

// liftOf is the lift a DELETE asks for: the prefix of its path, of the
// origin of its query; false (the error written) when the prefix is
// wrong. One too broad to make can be lifted (an older ipfence's).
func liftOf(w http.ResponseWriter, r *http.Request) (bansets.Lift, bool) {
	p, err := ban.ParsePrefix(r.PathValue("prefix"))
	if err != nil && !errors.Is(err, ban.ErrTooBroad) {
		writeBanError(w, err)
		return bansets.Lift{}, false
	}
	return bansets.Lift{Prefix: p, Origin: r.URL.Query().Get("origin")}, true
}

func (d *Daemon) handleAllow(w http.ResponseWriter, r *http.Request) {
	var req api.AllowRequest
	if !decodeBody(w, r, &req) {
		return
	}
	reqs, ok := requests(w, "allow", req.Prefix, req.Prefixes, req.TTL, req.Reason, req.Origin)
	if !ok {
		return
	}
	done, err := d.Allow(r.Context(), reqs)
	if err != nil {
		writeBanError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.AllowResponse{Allowed: done})
}

func (d *Daemon) handleUnallow(w http.ResponseWriter, r *http.Request) {
	l, ok := liftOf(w, r)
	if !ok {
		return
	}
	gone, err := d.Unallow(r.Context(), []bansets.Lift{l})
	if err != nil {
		writeBanError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.UnallowResponse{Unallowed: gone})
}

// Allow makes the allow entries reqs ask for, in one transaction (or
// none of them), and returns them. Call it once Ready.
func (d *Daemon) Allow(ctx context.Context, reqs []bansets.Request) ([]ban.Ban, error) {
	return d.allows.Ban(ctx, reqs)
}

// AllowEach makes the allow entries of the requests that stand alone
// (fleet entries): the ones refused are left out with their error in
// errs, the others are made together. Call it once Ready.
func (d *Daemon) AllowEach(ctx context.Context, reqs []bansets.Request) (allows []ban.Ban, errs []error, err error) {
	prep, errs := d.allows.PrepareEach(reqs)
	if prep.Len() == 0 {
		return nil, errs, nil
	}
	allows, err = d.allows.BanPrepared(ctx, prep)
	return allows, errs, err
}

// Unallow removes the allow entries ls name and returns them. Call it
// once Ready.
func (d *Daemon) Unallow(ctx context.Context, ls []bansets.Lift) ([]ban.Ban, error) {
	return d.allows.Unban(ctx, ls)
}

// ban queues reqs for the next ban transaction and waits for it; quiet
// leaves the bans out of the result (their count stays).
func (d *Daemon) ban(ctx context.Context, reqs []bansets.Request, quiet bool) (bansets.Result, error) {
	// The guard and the building of the bans run here, on the caller's
	// goroutine, so that the batching one only commits.
	prep, err := d.ctl.Prepare(reqs)
	if err != nil {
		return bansets.Result{}, err
	}
	return d.bans.Ban(ctx, prep, quiet)
}

// Ban bans reqs as the API does (batched with concurrent calls, checked
// by the guard) and returns the bans made. Call it once Ready.
func (d *Daemon) Ban(ctx context.Context, reqs []bansets.Request) ([]ban.Ban, error) {
	r, err := d.ban(ctx, reqs, false)
	return r.Bans, err
}

// BanEach bans the requests that stand alone (fleet bans): the ones the
// guard or the TTL limits refuse are left out with their error in errs,
// the others are banned together. Call it once Ready.
func (d *Daemon) BanEach(ctx context.Context, reqs []bansets.Request) (bans []ban.Ban, errs []error, err error) {
	prep, errs := d.ctl.PrepareEach(reqs)
	if prep.Len() == 0 {
		return nil, errs, nil
	}
	r, err := d.bans.Ban(ctx, prep, false)
	return r.Bans, errs, err
}

// Unban lifts the bans of ps and returns them. Call it once Ready.
func (d *Daemon) Unban(ctx context.Context, ps []bansets.Lift) ([]ban.Ban, error) {
	r, err := d.bans.Unban(ctx, ps)
	return r.Bans, err
}

func (d *Daemon) handleList(w http.ResponseWriter, r *http.Request) {
	if page, total, counts, ok := listPage(w, r, d.ctl); ok {
		writeJSON(w, http.StatusOK, api.BanList{Bans: page, Total: total, Counts: counts})
	}
}

func (d *Daemon) handleAllows(w http.ResponseWriter, r *http.Request) {
	if page, total, counts, ok := listPage(w, r, d.allows); ok {
		writeJSON(w, http.StatusOK, api.AllowList{Allows: page, Total: total, Counts: counts})
	}
}

// listPage is the page of c's entries a list request asks for (within,
// origin, reason, offset, limit); false (the error written) when the
// query is wrong.
func listPage(w http.ResponseWriter, r *http.Request, c *bansets.Controller) (page []ban.Ban, total int, counts api.Counts, ok bool) {
	q := r.URL.Query()
	var f ban.Filter
	if s := q.Get("within"); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("within=%q is not a prefix", s))
			return nil, 0, counts, false
		}
		f.Within = p.Masked()
	}
	f.Origin, f.Reason = q.Get("origin"), q.Get("reason")
	offset, err1 := intParam(q.Get("offset"), 0)
	limit, err2 := intParam(q.Get("limit"), 100)
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return nil, 0, counts, false
	}
	var keys ban.Keys
	c.View(func(s *ban.Set) {
		keys = s.Match(time.Now(), f)
		counts = api.CountsOf(s.Tally())
	})
	keys.Sort() // without the lock: bans go on meanwhile
	c.View(func(s *ban.Set) { page = s.Page(keys, offset, limit) })
	if page == nil {
		page = []ban.Ban{}
	}
	return page, keys.Len(), counts, true
}

func (d *Daemon) handleCount(w http.ResponseWriter, _ *http.Request) {
	var c api.Counts
	d.ctl.View(func(s *ban.Set) { c = api.CountsOf(s.Tally()) })
	writeJSON(w, http.StatusOK, c)
}

func (d *Daemon) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.Status())
}

// Status describes what the daemon runs.
func (d *Daemon) Status() api.Status {
	var c, a api.Counts
	d.ctl.View(func(s *ban.Set) { c = api.CountsOf(s.Tally()) })
	d.allows.View(func(s *ban.Set) { a = api.CountsOf(s.Tally()) })
	d.mu.Lock()
	defer d.mu.Unlock()
	st := api.Status{Policy: d.cfg.Policy, NetNS: d.cfg.NetNS, Table: d.plan.Table, Started: d.started,
		Applied: d.applied, Bans: c, Allows: a, Elements: d.elements, Drift: d.drift, LastError: d.lastErr}
	for _, r := range d.plan.Rules {
		rs := api.RuleStatus{Name: r.Name, Action: string(r.Action), Backend: string(r.Backend), Mode: plan.ModeName(r.Monitor)}
		switch {
		case r.ReplayNote != "":
			rs.Layout = "not replayed: " + r.ReplayNote
		case r.Replayed:
			rs.Layout = "replayed"
		}
		if r.V4.Kind != plan.KindEmpty {
			rs.PrefixesV4 = r.V4.Prefixes
		}
		if r.V6.Kind != plan.KindEmpty {
			rs.PrefixesV6 = r.V6.Prefixes
		}
		st.Rules = append(st.Rules, rs)
	}
	for _, sd := range d.pol.Sources {
		ss := d.sources[sd.Spec.Name]
		src := api.Source{Name: sd.Spec.Name, Loaded: ss.loaded, Checked: ss.checked, Stale: ss.stale,
			LastError: ss.lastErr, PrefixesV4: ss.v4, PrefixesV6: ss.v6, Refresh: "never"}
		if ss.refresh > 0 {
			src.Refresh = ss.refresh.String()
		}
		st.Sources = append(st.Sources, src)
	}
	for _, c := range d.pol.CrowdSec {
		if ss := d.sources[c.Name]; ss != nil {
			st.Sources = append(st.Sources, api.Source{Name: c.Name, Kind: policy.FormatCrowdSec, Loaded: ss.loaded, Checked: ss.checked,
				Refresh: ss.refresh.String(), LastError: ss.lastErr, PrefixesV4: ss.v4, PrefixesV6: ss.v6})
		}
	}
	return st
}

func (d *Daemon) handleReload(w http.ResponseWriter, r *http.Request) {
	var res ReloadResult
	var p *trial.Pending
	var err error
	if c := r.URL.Query().Get("confirm"); c != "" {
		window, perr := time.ParseDuration(c)
		if perr != nil {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("confirm %q: not a duration (2m, 30s)", c))
			return
		}
		res, p, err = d.ReloadTrial(r.Context(), window)
	} else {
		res, err = d.Reload(r.Context())
	}
	switch {
	case errors.Is(err, trial.ErrOnTrial):
		writeError(w, http.StatusConflict, "on_trial", err.Error())
		return
	case errors.Is(err, trial.ErrWindow), errors.Is(err, ErrFleetTrial):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	case err != nil:
		writeError(w, http.StatusUnprocessableEntity, "reload_failed", "reload failed, the ruleset in force stays: "+err.Error())
		return
	}
	d.mu.Lock()
	n := d.elements
	d.mu.Unlock()
	out := api.ReloadResponse{Changed: res.Changed, Mode: res.Mode, Millis: res.Duration.Milliseconds(), Elements: n}
	if p != nil {
		out.Trial = &api.Trial{Policy: p.Policy, Deadline: p.Deadline, Window: p.Window.String()}
	}
	writeJSON(w, http.StatusOK, out)
}

func (d *Daemon) handleConfirm(w http.ResponseWriter, r *http.Request) {
	rollback := false
	if v := r.URL.Query().Get("rollback"); v != "" {
		var err error
		if rollback, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("rollback %q: give 1 or true (or leave it out to confirm)", v))
			return
		}
	}
	p, err := d.Confirm(r.Context(), rollback)
	switch {
	case errors.Is(err, trial.ErrNoTrial):
		writeError(w, http.StatusNotFound, "no_trial", err.Error())
	case errors.Is(err, trial.ErrTooLate):
		writeError(w, http.StatusConflict, "too_late", err.Error())
	case err != nil:
		writeError(w, http.StatusUnprocessableEntity, "confirm_failed", err.Error())
	default:
		writeJSON(w, http.StatusOK, api.ConfirmResponse{Policy: p.Policy, RolledBack: rollback})
	}
}

func (d *Daemon) handleExplain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	addr, err := netip.ParseAddr(q.Get("addr"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("addr=%q is not an IP address", q.Get("addr")))
		return
	}
	port, err := intParam(q.Get("port"), 0)
	if err != nil || port > 65535 {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("port=%q is not a port", q.Get("port")))
		return
	}
	proto := q.Get("proto")
	if proto == "" {
		proto = "tcp"
	}
	addr = addr.Unmap()
	ex := api.Explanation{Addr: addr.String()}
	now := time.Now()
	d.ctl.View(func(s *ban.Set) {
		if b, ok := s.Covering(addr, now); ok {
			ex.Banned = &b
		}
	})
	d.allows.View(func(s *ban.Set) {
		if b, ok := s.Covering(addr, now); ok {
			ex.Allowed = &b
		}
	})
	d.mu.Lock()
	v := d.plan.Verdict(plan.Packet{Src: addr, Proto: proto, DPort: uint16(port)})
	enforced := allowsEnforced(d.plan)
	d.mu.Unlock()
	ex.Verdict, ex.Rule, ex.Monitored = v.Verdict, v.Rule, v.Monitored
	switch {
	case ex.Allowed != nil && enforced:
		ex.Verdict, ex.Rule = "accept", "allow"
	case ex.Banned != nil && v.Verdict == "accept" && !d.allowlisted(v.Rule):
		ex.Verdict, ex.Rule = "drop", "ban"
	}
	writeJSON(w, http.StatusOK, ex)
}

// allowlisted reports whether rule is one of the policy's leading accept
// rules (rules in monitor mode aside), which bans do not override.
func (d *Daemon) allowlisted(rule string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.plan.Rules {
		if r.Monitor {
			continue // stops nothing: the accept rules after it still lead
		}
		if r.Action != plan.Accept {
			return false
		}
		if r.Name == rule {
			return true
		}
	}
	return false
}

func intParam(s string, def int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative number", s)
	}
	return n, nil
}

// writeBanError maps ban errors to 400 with a stable code; anything else
// is a 500 (the kernel refused: nothing was changed).
func writeBanError(w http.ResponseWriter, err error) {
	for _, m := range []struct {
		err  error
		code string
	}{
		{ban.ErrInvalid, "invalid"}, {ban.ErrTooBroad, "too_broad"}, {ban.ErrProtected, "protected"},
		{ban.ErrOwnAddress, "own_address"}, {ban.ErrTTL, "ttl"},
	} {
		if errors.Is(err, m.err) {
			writeError(w, http.StatusBadRequest, m.code, err.Error())
			return
		}
	}
	writeError(w, http.StatusInternalServerError, "internal", err.Error())
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
