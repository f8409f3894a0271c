package crowdsec

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// TestTrackerAgainstModel feeds random streams (decisions added, deleted,
// running out, sent again, startup answers) to a Tracker and applies what
// it returns to a model of ipfence's bans: after every answer, each
// prefix must be banned exactly until its latest live decision ends.
func TestTrackerAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	values := []struct{ scope, value string }{
		{"Ip", "198.51.100.7"}, {"Ip", "2001:db8::7"}, {"Range", "203.0.113.0/24"}, {"Range", "2001:db8:1::/48"},
		{"ip", "198.51.100.8"},
	}
	now := time.Unix(1_800_000_000, 0)
	type dec struct {
		Decision
		prefix  netip.Prefix
		expires time.Time
	}
	live := map[int64]dec{} // the Local API's decisions in force
	var deleted []Decision  // since the last pull
	held := map[netip.Prefix]time.Time{}
	tr := NewTracker(nil)
	nextID := int64(1)
	for step := range 2000 {
		now = now.Add(time.Duration(r.IntN(90)) * time.Second)
		for id, d := range live {
			if !d.expires.After(now) {
				delete(live, id)
				deleted = append(deleted, d.Decision)
			}
		}
		var s Stream
		for range r.IntN(3) {
			v := values[r.IntN(len(values))]
			typ := "ban"
			if r.IntN(8) == 0 {
				typ = "captcha"
			}
			left := time.Duration(1+r.IntN(30)) * time.Minute
			d := Decision{ID: nextID, Type: typ, Scope: v.scope, Value: v.value, Duration: left.String(), Scenario: fmt.Sprint("s", nextID)}
			nextID++
			s.New = append(s.New, d)
			if typ == "ban" {
				live[d.ID] = dec{d, netip.MustParsePrefix(netip.MustParsePrefix(withBits(v.value)).String()), now.Add(left)}
			}
		}
		if len(live) > 0 && r.IntN(3) == 0 { // cscli decisions delete
			for id, d := range live {
				delete(live, id)
				deleted = append(deleted, d.Decision)
				break
			}
		}
		startup := r.IntN(10) == 0
		if startup {
			s.New = s.New[:0]
			for _, d := range live {
				d.Duration = d.expires.Sub(now).String()
				s.New = append(s.New, d.Decision)
			}
		} else {
			s.Deleted = deleted
			if r.IntN(2) == 0 { // the Local API sends deletions again
				s.Deleted = append(s.Deleted, deleted...)
			}
		}
		deleted = nil
		bans, lifts, _ := tr.Update(&s, startup, now)
		for _, b := range bans {
			held[b.Prefix] = b.Expires
		}
		for _, p := range lifts {
			delete(held, p)
		}
		want := map[netip.Prefix]time.Time{}
		for _, d := range live {
			if d.expires.After(want[d.prefix]) {
				want[d.prefix] = d.expires
			}
		}
		for p, e := range held {
			if !e.After(now) {
				delete(held, p) // the kernel expired it
			}
		}
		if len(held) != len(want) {
			t.Fatalf("step %d: holds %v, want %v", step, held, want)
		}
		for p, e := range want {
			if got, ok := held[p]; !ok || absDiff(got, e) > slack {
				t.Fatalf("step %d: %v banned until %v (%v), want %v", step, p, got, ok, e)
			}
		}
	}
}

func withBits(v string) string {
	if a, err := netip.ParseAddr(v); err == nil {
		return netip.PrefixFrom(a, a.BitLen()).String()
	}
	return v
}

// TestTrackerStartupLiftsStale: bans held from before (the daemon was
// down) whose decisions are gone are lifted by the first startup answer;
// the ones still decided stay without a new transaction.
func TestTrackerStartupLiftsStale(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	keep, gone := netip.MustParsePrefix("198.51.100.7/32"), netip.MustParsePrefix("203.0.113.0/24")
	tr := NewTracker([]Ban{{Prefix: keep, Expires: now.Add(time.Hour)}, {Prefix: gone, Expires: now.Add(time.Hour)}})
	bans, lifts, ignored := tr.Update(&Stream{New: []Decision{
		{ID: 1, Type: "ban", Scope: "Ip", Value: "198.51.100.7", Duration: "59m59.5s"},
		{ID: 2, Type: "ban", Scope: "Country", Value: "FR", Duration: "1h"},
		{ID: 3, Type: "ban", Scope: "Range", Value: "10.0.0.0/4", Duration: "1h"},
	}}, true, now)
	if len(bans) != 0 || len(lifts) != 1 || lifts[0] != gone {
		t.Errorf("bans %v, lifts %v; want none and %v", bans, lifts, gone)
	}
	if len(ignored) != 2 || !errors.Is(ignored[0].Err, ErrUnsupported) || !errors.Is(ignored[1].Err, ban.ErrTooBroad) {
		t.Errorf("ignored %v, want the country (unsupported) and the /4 (too broad)", ignored)
	}

	// A ban ipfence refused is dropped: not counted, and its deletion
	// lifts nothing.
	refused := netip.MustParsePrefix("2001:db8::/48")
	bans, _, _ = tr.Update(&Stream{New: []Decision{{ID: 4, Type: "ban", Scope: "Range", Value: refused.String(), Duration: "1h"}}}, false, now)
	if len(bans) != 1 || bans[0].Prefix != refused {
		t.Fatalf("bans %v, want %v", bans, refused)
	}
	if v4, v6 := tr.Held(); v4 != 1 || v6 != 1 {
		t.Errorf("held %d+%d, want 1+1", v4, v6)
	}
	tr.Drop(refused)
	if v4, v6 := tr.Held(); v4 != 1 || v6 != 0 {
		t.Errorf("held after the drop %d+%d, want 1+0", v4, v6)
	}
	if _, lifts, _ := tr.Update(&Stream{Deleted: []Decision{{ID: 4, Type: "ban", Scope: "Range", Value: refused.String()}}}, false, now); len(lifts) != 0 {
		t.Errorf("deleting a refused decision lifts %v", lifts)
	}
}

// TestPull checks the request (path, query, key) and the errors: a
// refused key is ErrAuth, a server error says what the server said.
func TestPull(t *testing.T) {
	var got *http.Request
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		if status != http.StatusOK {
			http.Error(w, "nope", status)
			return
		}
		fmt.Fprint(w, `{"new":[{"id":4,"type":"ban","scope":"Range","value":"203.0.113.0/24","duration":"3h59m","scenario":"x"}],"deleted":null}`)
	}))
	defer srv.Close()
	c := &Client{URL: srv.URL + "/", Key: "k3y", UserAgent: "ipfence/test"}
	s, err := c.Pull(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	if got.URL.Path != "/v1/decisions/stream" || got.URL.Query().Get("startup") != "true" || got.URL.Query().Get("scopes") != "ip,range" ||
		got.Header.Get("X-Api-Key") != "k3y" || got.UserAgent() != "ipfence/test" {
		t.Errorf("request %v %v", got.URL, got.Header)
	}
	if len(s.New) != 1 || s.New[0].Value != "203.0.113.0/24" || s.Deleted != nil {
		t.Errorf("stream %+v", s)
	}
	status = http.StatusForbidden
	if _, err := c.Pull(context.Background(), false); !errors.Is(err, ErrAuth) {
		t.Errorf("403: %v, want ErrAuth", err)
	}
	status = http.StatusInternalServerError
	if _, err := c.Pull(context.Background(), false); err == nil || errors.Is(err, ErrAuth) {
		t.Errorf("500: %v", err)
	}
	if _, err := (&Client{URL: "ftp://x"}).Pull(context.Background(), false); err == nil {
		t.Error("an ftp URL was accepted")
	}
}

// TestPullRedirectKeepsKey: a redirect to another host is refused and
// the key never reaches it; one on the same host is followed.
func TestPullRedirectKeepsKey(t *testing.T) {
	var leaked atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "" {
			leaked.Store(true)
		}
		fmt.Fprint(w, `{"new":null,"deleted":null}`)
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/decisions/stream" && r.URL.Query().Get("startup") == "true":
			http.Redirect(w, r, other.URL+"/v1/decisions/stream", http.StatusFound)
		case r.URL.Path == "/v1/decisions/stream":
			http.Redirect(w, r, "/moved/v1/decisions/stream", http.StatusFound)
		default:
			fmt.Fprint(w, `{"new":null,"deleted":null}`)
		}
	}))
	defer srv.Close()
	c := &Client{URL: srv.URL + "/", Key: "k3y"}
	if _, err := c.Pull(context.Background(), true); err == nil || !strings.Contains(err.Error(), "another host") {
		t.Errorf("redirect to another host: %v", err)
	}
	if leaked.Load() {
		t.Error("the key reached the other host")
	}
	if _, err := c.Pull(context.Background(), false); err != nil {
		t.Errorf("redirect on the same host: %v", err)
	}
}
