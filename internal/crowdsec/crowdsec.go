// Package crowdsec follows a CrowdSec Local API's decisions stream as a
// bouncer does, and turns the decisions into the bans ipfence should hold.
//
// Client pulls GET /v1/decisions/stream (startup=true for everything in
// force, then the changes since the last pull). Tracker is pure: it keeps
// the live decisions per prefix and says which bans to make, change or
// lift, so that a prefix is banned until its latest-expiring decision of a
// banning type ends. Addresses (scope Ip) and prefixes (scope Range) are
// both banned; the official nftables bouncer drops ranges.
package crowdsec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// Decision is one decision as the stream sends it.
type Decision struct {
	ID       int64  `json:"id"`
	Origin   string `json:"origin"`   // crowdsec, cscli, CAPI, lists
	Type     string `json:"type"`     // ban, captcha, ...
	Scope    string `json:"scope"`    // Ip, Range, Country, AS, ...
	Value    string `json:"value"`    // the address or prefix
	Duration string `json:"duration"` // time left, a Go duration; negative once over
	Scenario string `json:"scenario"`
}

// Stream is one answer of the decisions stream.
type Stream struct {
	New     []Decision `json:"new"`
	Deleted []Decision `json:"deleted"`
}

// ErrAuth is returned when the Local API refuses the bouncer's key.
var ErrAuth = errors.New("the CrowdSec Local API refused the API key")

// Client pulls a Local API's decisions stream with a bouncer's API key
// (cscli bouncers add NAME).
type Client struct {
	URL       string       // the Local API, e.g. http://127.0.0.1:8080/
	Key       string       // the bouncer's API key
	HTTP      *http.Client // nil: a client with a 30 s timeout
	UserAgent string
}

// maxAnswer bounds an answer's size (a full stream with the community
// blocklist is a few MB).
const maxAnswer = 256 << 20

// Pull returns the decisions stream: everything in force with startup,
// else what changed since the last pull (which the Local API remembers
// per bouncer). Only the scopes ipfence bans are asked for.
func (c *Client) Pull(ctx context.Context, startup bool) (*Stream, error) {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("crowdsec url %q: expected http(s)://HOST:PORT/", c.URL)
	}
	u = u.JoinPath("v1/decisions/stream")
	u.RawQuery = url.Values{"startup": {fmt.Sprint(startup)}, "scopes": {"ip,range"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Api-Key", c.Key)
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	hc := http.Client{Timeout: 30 * time.Second}
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	// The key travels in a header of ours, which net/http would send on
	// to wherever a redirect points: follow redirects on the same host
	// and scheme only.
	hc.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("stopped after 5 redirects")
		}
		if r.URL.Host != via[0].URL.Host || r.URL.Scheme != via[0].URL.Scheme {
			return fmt.Errorf("redirected to %s://%s, another host or scheme: refused, the API key is not sent there", r.URL.Scheme, r.URL.Host)
		}
		return nil
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pulling decisions from %s: %w", c.URL, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
		return nil, fmt.Errorf("pulling decisions from %s: %w (HTTP %d): check the key (cscli bouncers add NAME)", c.URL, ErrAuth, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("pulling decisions from %s: HTTP %d: %s", c.URL, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var s Stream
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&s); err != nil {
		return nil, fmt.Errorf("pulling decisions from %s: malformed answer: %w", c.URL, err)
	}
	return &s, nil
}

// Ban is a ban the decisions ask for.
type Ban struct {
	Prefix  netip.Prefix
	Expires time.Time
	Reason  string // the decision's scenario
}

// Ignored is a decision Tracker does not turn into a ban, and why.
type Ignored struct {
	Decision Decision
	Err      error
}

// ErrUnsupported marks decisions of a scope or type that is not banned.
var ErrUnsupported = errors.New("not a ban of an address or range")

// Tracker keeps the live decisions and what ipfence holds for them.
type Tracker struct {
	live map[netip.Prefix]map[int64]Ban // decisions in force, by id
	held map[netip.Prefix]Ban           // the bans made for them
}

// NewTracker returns a Tracker that knows of no decision and assumes that
// ipfence holds held (the bans of this stream's origin, as stored).
func NewTracker(held []Ban) *Tracker {
	t := &Tracker{live: map[netip.Prefix]map[int64]Ban{}, held: make(map[netip.Prefix]Ban, len(held))}
	for _, b := range held {
		t.held[b.Prefix] = b
	}
	return t
}

// Decisions is the number of live decisions.
func (t *Tracker) Decisions() int {
	n := 0
	for _, m := range t.live {
		n += len(m)
	}
	return n
}

// Held counts the bans in force for the decisions, by family: the ones
// made, and the ones another origin's longer ban stood for.
func (t *Tracker) Held() (v4, v6 int) {
	for p := range t.held {
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	return v4, v6
}

// Drop forgets the ban of p that Update asked for: ipfence refused it (a
// protected network). A later deletion of its decision then lifts nothing.
func (t *Tracker) Drop(p netip.Prefix) { delete(t.held, p) }

// slack is how far a ban's expiry may be from its decision's before the
// ban is made again (durations come rounded, and a little late).
const slack = 2 * time.Second

// Update applies one answer of the stream at now (with startup, the
// answer is everything in force: decisions not in it are gone) and
// returns the bans to make or change, the prefixes whose bans to lift,
// and the decisions it ignored. It assumes the caller makes them all;
// when that fails, start again with NewTracker and a startup pull.
func (t *Tracker) Update(s *Stream, startup bool, now time.Time) (bans []Ban, lifts []netip.Prefix, ignored []Ignored) {
	touched := map[netip.Prefix]bool{}
	if startup {
		t.live = map[netip.Prefix]map[int64]Ban{}
		for p := range t.held {
			touched[p] = true
		}
	}
	for _, d := range s.New {
		p, err := parse(d)
		if err != nil {
			ignored = append(ignored, Ignored{d, err})
			continue
		}
		left, err := time.ParseDuration(d.Duration)
		if err != nil {
			ignored = append(ignored, Ignored{d, fmt.Errorf("duration %q: %w", d.Duration, err)})
			continue
		}
		if left <= 0 {
			continue
		}
		m := t.live[p]
		if m == nil {
			m = map[int64]Ban{}
			t.live[p] = m
		}
		m[d.ID] = Ban{Prefix: p, Expires: now.Add(left), Reason: d.Scenario}
		touched[p] = true
	}
	// Deletions after additions: a decision made and deleted since the
	// last pull may come in both lists, and a deletion is final.
	for _, d := range s.Deleted {
		p, err := parse(d)
		if err != nil {
			continue // never taken in
		}
		if m := t.live[p]; m != nil {
			delete(m, d.ID)
			if len(m) == 0 {
				delete(t.live, p)
			}
			touched[p] = true
		}
	}
	for p := range touched {
		want, ok := t.latest(p, now)
		held, had := t.held[p]
		switch {
		case !ok && had:
			delete(t.held, p)
			if held.Expires.After(now) {
				lifts = append(lifts, p)
			}
		case ok && (!had || absDiff(held.Expires, want.Expires) > slack):
			t.held[p] = want
			bans = append(bans, want)
		}
	}
	t.forget(now)
	return bans, lifts, ignored
}

// latest is the latest-expiring live decision of p.
func (t *Tracker) latest(p netip.Prefix, now time.Time) (Ban, bool) {
	var best Ban
	found := false
	for _, b := range t.live[p] {
		if b.Expires.After(now) && (!found || b.Expires.After(best.Expires)) {
			best, found = b, true
		}
	}
	return best, found
}

// forget drops decisions and bans that ran out (the kernel expires the
// bans by itself).
func (t *Tracker) forget(now time.Time) {
	for p, m := range t.live {
		for id, b := range m {
			if !b.Expires.After(now) {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(t.live, p)
		}
	}
	for p, b := range t.held {
		if !b.Expires.After(now) {
			delete(t.held, p)
		}
	}
}

// parse returns the prefix a banning decision is about.
func parse(d Decision) (netip.Prefix, error) {
	if !strings.EqualFold(d.Type, "ban") {
		return netip.Prefix{}, fmt.Errorf("type %q: %w", d.Type, ErrUnsupported)
	}
	switch {
	case strings.EqualFold(d.Scope, "ip"):
		if strings.Contains(d.Value, "/") {
			return netip.Prefix{}, fmt.Errorf("scope Ip, value %q: %w", d.Value, ban.ErrInvalid)
		}
	case strings.EqualFold(d.Scope, "range"):
	default:
		return netip.Prefix{}, fmt.Errorf("scope %q: %w", d.Scope, ErrUnsupported)
	}
	return ban.ParsePrefix(d.Value)
}

func absDiff(a, b time.Time) time.Duration {
	d := a.Sub(b)
	if d < 0 {
		return -d
	}
	return d
}
