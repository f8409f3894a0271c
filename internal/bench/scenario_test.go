package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestGeo runs the geo scenario small: every config loads, passes all
// legitimate and drops all blocked packets (checked from the firewall's
// counters in every measurement), and lets every probe through; the XDP
// program alone gives each traffic its verdict.
func TestGeo(t *testing.T) {
	lab := netnstest.New(t)
	o := QuickGeo
	o.Probes, o.Packets = 20, 1000
	res, err := Geo(context.Background(), lab, o, NewProgress(nil, GeoSteps(o)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sets) != 2 || res.Sets[0].Prefixes < 5000 || !res.Sets[1].IPv6 || res.Sets[1].Prefixes < 5000 {
		t.Fatalf("sets %+v: want CH and AT's thousands of IPv4, then of IPv6 prefixes", res.Sets)
	}
	if want := 2 * (len(GeoConfigs) + 1) * len(GeoTraffic); len(res.Rows) != want {
		t.Errorf("%d per-packet rows, want %d", len(res.Rows), want)
	}
	// XDP runs: ipfence's tables and the LPM trie, per set and traffic.
	if len(res.Loads) != 2*len(GeoConfigs) || len(res.XDPRun) != 2*2*len(GeoTraffic) {
		t.Errorf("%d loads, %d XDP runs", len(res.Loads), len(res.XDPRun))
	}
	for _, x := range res.XDPRun {
		if x.NsPerRun <= 0 || (x.Config != "ipfence-xdp" && x.Config != "xdp-lpm") {
			t.Errorf("XDP run %+v", x)
		}
	}
	// Latency is probed from an IPv4 host, so for the IPv4 set only.
	if want := (len(GeoConfigs) + 1) * len(probeNames); len(res.Latency) != want {
		t.Errorf("%d latency rows, want %d", len(res.Latency), want)
	}
	for _, l := range res.Latency {
		if l.Lost > 0 || l.Samples != o.Probes || l.P50us <= 0 {
			t.Errorf("latency %+v: want %d samples, none lost", l, o.Probes)
		}
	}
}

// TestHTTP runs the http scenario small: no request fails through any
// growing block list, and all 400 clients reach all 4 ports through every
// way of writing the per-port allow list.
func TestHTTP(t *testing.T) {
	lab := netnstest.New(t)
	o := QuickHTTP
	o.Requests = 10
	res, err := HTTP(context.Background(), lab, o, NewProgress(nil, HTTPSteps(o)))
	if err != nil {
		t.Fatal(err)
	}
	if want := len(o.Rules) * (len(HTTPGrowthConfigs) + 1) * len(HTTPPhases); len(res.Growth) != want {
		t.Errorf("%d growth rows, want %d", len(res.Growth), want)
	}
	for _, g := range res.Growth {
		if g.Failed > 0 || g.P50us <= 0 {
			t.Errorf("growth %+v", g)
		}
	}
	if len(res.PerPort) != httpPortConfigCount {
		t.Errorf("%d per-port rows, want %d", len(res.PerPort), httpPortConfigCount)
	}
	for _, p := range res.PerPort {
		if p.Errors > 0 || p.Requests < int(o.Rate*o.Duration.Seconds())*9/10 {
			t.Errorf("per-port %+v: want about %.0f requests, no errors", p, o.Rate*o.Duration.Seconds())
		}
	}
}

// TestScale runs the scale scenario small: every ruleset of every family
// must load, unload, and pass the traffic it does not match (checked from
// the firewall's counters), and every DDoS hook must drop all of the
// attack.
func TestScale(t *testing.T) {
	lab := netnstest.New(t)
	o := QuickScale
	o.Steps = []int{0, 3}
	o.Rounds, o.Packets = 1, 1000
	p := NewProgress(nil, ScaleSteps(o))
	res, err := Scale(context.Background(), lab, o, p)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, f := range o.Families {
		want += len(o.Steps) * (len(scaleConfigs(f, 0)) - 1)
	}
	if len(res.Rows) != want {
		t.Errorf("%d rows, want %d", len(res.Rows), want)
	}
	if want := len(ddosConfigs(tcDropWorks(context.Background(), lab) == nil)); len(res.DDoS) != want {
		t.Errorf("%d DDoS rows, want %d", len(res.DDoS), want)
	}
	for _, r := range res.Rows {
		if r.NsPerPacket <= 0 || r.Packets <= 0 {
			t.Errorf("row %+v: no measurement", r)
		}
	}
	t.Logf("%+v", res.DDoS)
}

// TestServer runs the server scenario in its --quick form: every config
// has the three measurements; the plain interval set breaks the server's
// own DNS round trip and HTTP fetch to the blocked country, and ipfence
// keeps both working; the interactive round trip from the allowed
// country works through every config; every per-packet cell is measured.
func TestServer(t *testing.T) {
	lab := netnstest.New(t, "nft")
	o := QuickServer
	res, err := Server(context.Background(), lab, o, NewProgress(nil, ServerSteps(o)))
	if err != nil {
		t.Fatal(err)
	}
	if want := len(ServerConfigs) * len(ServerMeasures); len(res.Rows) != want {
		t.Errorf("%d measurements, want %d", len(res.Rows), want)
	}
	for _, c := range ServerConfigs {
		for _, m := range ServerMeasures {
			x, ok := res.Row(c, m)
			if !ok {
				t.Errorf("%s: no %s measurement", c, m)
				continue
			}
			if x.Samples+x.Failed != o.Samples*o.Rounds {
				t.Errorf("%s %s: %d samples and %d failures, want %d in all", c, m, x.Samples, x.Failed, o.Samples*o.Rounds)
			}
			broken := c == "nft-interval-set" && m != "interactive"
			if x.Broken() != broken {
				t.Errorf("%s %s: %+v, want broken %v", c, m, x, broken)
			}
			if !broken && (x.Failed > 0 || x.P50us <= 0) {
				t.Errorf("%s %s: %+v, want every sample to succeed", c, m, x)
			}
		}
	}
	if want := (len(ServerPacketConfigs) + 1) * len(ServerTraffic); len(res.Packets) != want {
		t.Errorf("%d per-packet rows, want %d", len(res.Packets), want)
	}
	for _, x := range res.Packets {
		if x.NsPerPacket <= 0 || x.Packets <= 0 {
			t.Errorf("per packet %+v: no measurement", x)
		}
	}
	md := res.Markdown()
	if !strings.Contains(md, "**fails**: timeout") {
		t.Errorf("the report does not show the plain set's failures:\n%s", md)
	}
}
