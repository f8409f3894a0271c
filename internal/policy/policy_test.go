package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

const good = `
sources:
  geo:   {format: country-csv, paths: ["builtin:country-ipv4.csv.gz", "builtin:country-ipv6.csv.gz"]}
  feeds: {format: list, paths: [feed.txt]}
protect: [203.0.113.7, 2001:db8::/32]
rules:
  - {name: feeds,  action: drop, match: {source: feeds}}
  - {name: europe, action: allow-only, match: {source: geo, countries: [IT, DE]},
     ports: [tcp/22, tcp/80-443]}
`

func TestParseGood(t *testing.T) {
	p, err := Parse([]byte(good), "testdata/p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 2 || p.Rules[1].Action != plan.AllowOnly || len(p.Rules[1].Ports) != 2 {
		t.Fatalf("rules: %+v", p.Rules)
	}
	if got := p.Rules[1].Ports[1]; got != (plan.Port{Proto: "tcp", First: 80, Last: 443}) {
		t.Errorf("port: %+v", got)
	}
	if p.Rules[1].Line != 8 {
		t.Errorf("line of rule europe: %d, want 8", p.Rules[1].Line)
	}
	if got := p.source("feeds").Spec.Paths[0]; got != filepath.Join("testdata", "feed.txt") {
		t.Errorf("relative path resolved to %q", got)
	}
	for _, tc := range []struct {
		refresh string
		want    time.Duration
	}{{"", 0}, {"15m", 15 * time.Minute}, {"6h", 6 * time.Hour}, {"never", -1}} {
		y := "sources:\n  x: {format: list, paths: [f], refresh: \"" + tc.refresh + "\"}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n"
		p, err := Parse([]byte(y), "p.yaml")
		if err != nil {
			t.Errorf("refresh %q: %v", tc.refresh, err)
		} else if got := p.source("x").Spec.Refresh; got != tc.want {
			t.Errorf("refresh %q: %v, want %v", tc.refresh, got, tc.want)
		}
	}
	// A trailing --- is no second policy.
	if _, err := Parse([]byte("rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n---\n# end\n"), "p.yaml"); err != nil {
		t.Errorf("trailing ---: %v", err)
	}
	// Input limits.
	for _, tc := range []struct {
		keys string
		want source.Spec
	}{
		{"", source.Spec{}},
		{"max_bytes: 64MiB, max_entries: 500000, max_growth: 2, allow_broad: true", source.Spec{MaxBytes: 64 << 20, MaxEntries: 500000, MaxGrowth: 2, AllowBroad: true}},
		{"max_bytes: 50000000", source.Spec{MaxBytes: 50_000_000}},
		{"max_bytes: 2G, max_growth: 0", source.Spec{MaxBytes: 2e9, MaxGrowth: -1}},
	} {
		y := "sources:\n  x: {format: list, paths: [f]" + map[bool]string{true: ", " + tc.keys, false: ""}[tc.keys != ""] + "}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n"
		p, err := Parse([]byte(y), "p.yaml")
		if err != nil {
			t.Errorf("%s: %v", tc.keys, err)
			continue
		}
		s := p.source("x").Spec
		if s.MaxBytes != tc.want.MaxBytes || s.MaxEntries != tc.want.MaxEntries || s.MaxGrowth != tc.want.MaxGrowth || s.AllowBroad != tc.want.AllowBroad {
			t.Errorf("%s: spec %+v", tc.keys, s)
		}
	}
	y := "backend: xdp\ninterfaces: [eth0, bond0.42]\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n  - {name: b, action: drop, match: {prefixes: [1.2.3.5]}, backend: nftables}\n"
	if p, err := Parse([]byte(y), "p.yaml"); err != nil {
		t.Error(err)
	} else if p.Backend != plan.XDP || len(p.Interfaces) != 2 || p.Interfaces[1] != "bond0.42" || p.Rules[0].Backend != "" || p.Rules[1].Backend != plan.NFTables {
		t.Errorf("backend %q, interfaces %v, rule backends %q %q", p.Backend, p.Interfaces, p.Rules[0].Backend, p.Rules[1].Backend)
	}
}

// TestParseBans: the policy's bans: reaches the plan's input (and so
// the applied record and the fleet bundle).
func TestParseBans(t *testing.T) {
	p, err := Parse([]byte("bans: {aggregate_v6: 4}\nrules:\n  - {name: a, action: drop, match: {prefixes: [192.0.2.0/24]}}\n"), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := ban.Policy{Aggregate6: 4}
	if p.Bans != want {
		t.Errorf("bans %+v, want %+v", p.Bans, want)
	}
	res, err := p.Resolve(context.Background(), &source.Loader{StateDir: t.TempDir()})
	if err != nil || res.Input.Bans != want {
		t.Errorf("input bans %+v, %v", res.Input.Bans, err)
	}
	for y, want := range map[string]ban.Recidive{
		"{window: 24h}":                     {Window: 24 * time.Hour, Factor: 2, Max: 30 * 24 * time.Hour},
		"{window: 7d, factor: 3, max: 60d}": {Window: 7 * 24 * time.Hour, Factor: 3, Max: 60 * 24 * time.Hour},
	} {
		p, err := Parse([]byte("bans: {recidive: "+y+"}\nrules:\n  - {name: a, action: drop, match: {prefixes: [192.0.2.0/24]}}\n"), "p.yaml")
		if err != nil || p.Bans.Recidive != want {
			t.Errorf("recidive %s: %+v, %v; want %+v", y, p.Bans.Recidive, err, want)
		}
	}
}

// TestParseCatalog: a catalog source takes its entry's URLs, format,
// refresh and input limits; its own refresh and picks stand.
func TestParseCatalog(t *testing.T) {
	y := "sources:\n  drop: {catalog: spamhaus-drop}\n  fh: {catalog: firehol-level1, refresh: 15m}\n" +
		"  gh: {catalog: github, services: [hooks]}\n" +
		"rules:\n  - {name: a, action: drop, match: {source: drop}}\n  - {name: b, action: drop, match: {source: fh}}\n  - {name: c, action: accept, match: {source: gh}}\n"
	p, err := Parse([]byte(y), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	drop := p.source("drop").Spec
	if drop.Format != source.FormatSpamhausJSON || len(drop.URLs) != 2 || !strings.HasSuffix(drop.URLs[1], "/drop_v6.json") || drop.Refresh != 12*time.Hour {
		t.Errorf("spamhaus-drop: %+v", drop)
	}
	if fh := p.source("fh").Spec; fh.Refresh != 15*time.Minute || !fh.AllowBroad || fh.Format != source.FormatList {
		t.Errorf("firehol-level1 with its own refresh: %+v", fh)
	}
	if gh := p.source("gh").Spec; gh.Format != source.FormatGitHubMeta || len(gh.Services) != 1 {
		t.Errorf("github, hooks: %+v", gh)
	}
	// The entry's input limits, and a source's own over them.
	y = "sources:\n  feodo: {catalog: feodo}\n  fh: {catalog: firehol-level1, allow_broad: false, max_shrink: 0.3}\n" +
		"rules:\n  - {name: a, action: drop, match: {sources: [feodo, fh]}}\n  - {name: b, action: allow-only, match: {source: fh, invert: true}}\n"
	if p, err = Parse([]byte(y), "p.yaml"); err != nil {
		t.Fatal(err)
	}
	if f := p.source("feodo").Spec; f.MaxShrink != -1 || f.AllowBroad {
		t.Errorf("feodo: shrink gate %v (want off), allow_broad %v", f.MaxShrink, f.AllowBroad)
	}
	if fh := p.source("fh").Spec; fh.AllowBroad || fh.MaxShrink != 0.3 {
		t.Errorf("firehol-level1 with allow_broad: false, max_shrink: 0.3: %+v", fh)
	}
}

// TestParseCrowdSec: a crowdsec source is no source of prefixes; with
// one, a policy may have no rules (bans only).
func TestParseCrowdSec(t *testing.T) {
	p, err := Parse([]byte("sources:\n  crowdsec: {format: crowdsec, url: \"http://127.0.0.1:8080/\", api_key_file: cs.key, refresh: 2s}\n"), "etc/p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sources) != 0 || len(p.Rules) != 0 || len(p.CrowdSec) != 1 {
		t.Fatalf("sources %v, rules %v, crowdsec %v", p.Sources, p.Rules, p.CrowdSec)
	}
	if c := p.CrowdSec[0]; c.Name != "crowdsec" || c.Every != 2*time.Second || c.APIKeyFile != filepath.Join("etc", "cs.key") || c.Line != 2 {
		t.Errorf("%+v", c)
	}
	dir := t.TempDir()
	c := &CrowdSecDef{Name: "cs", APIKeyFile: filepath.Join(dir, "k")}
	if _, err := c.Key(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing key file: %v", err)
	}
	os.WriteFile(c.APIKeyFile, []byte("  s3cret \n"), 0o600)
	if k, err := c.Key(); k != "s3cret" || err != nil {
		t.Errorf("key %q, %v", k, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		line       int
		want       string
	}{
		{"unknown field", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, colour: red}\n", 2, "colour"},
		{"unknown action", "rules:\n  - {name: a, action: block, match: {prefixes: [1.2.3.4]}}\n", 2, `unknown action "block"`},
		{"unknown source", "sources:\n  x: {format: list, paths: [f]}\nrules:\n  - {name: a, action: drop, match: {source: y}}\n", 4, `unknown source "y"`},
		{"bad port", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, ports: [tcp/0]}\n", 2, "port"},
		{"bad family", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, family: ipx}\n", 2, "family"},
		{"duplicate", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n  - {name: a, action: drop, match: {prefixes: [1.2.3.5]}}\n", 3, "defined twice"},
		{"bad protect", "protect: [1.2.3.4, nope]\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `"nope"`},
		{"no format", "sources:\n  x: {paths: [f]}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "no format"},
		{"no rules", "sources: {}\n", 0, "no rules"},
		{"recidive without window", "bans: {recidive: {factor: 2}}\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "recidive needs a window"},
		{"recidive factor 1", "bans: {recidive: {window: 1h, factor: 1}}\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "recidive factor 1"},
		{"recidive bad max", "bans: {recidive: {window: 1h, max: forever}}\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `recidive max "forever"`},
		{"recidive short window", "bans: {recidive: {window: 10s}}\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "recidive window 10s"},
		{"bad aggregate", "bans: {aggregate_v6: 1}\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "aggregate_v6 1"},
		{"unknown catalog", "sources:\n  x: {catalog: spamhaus}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, `catalog "spamhaus" is not in the catalog (spamhaus-drop, firehol-level1`},
		{"catalog and url", "sources:\n  x: {catalog: feodo, url: \"https://example.net/f.txt\"}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "catalog feodo gives the URLs and format"},
		{"catalog refreshed too often", "sources:\n  x: {catalog: spamhaus-drop, refresh: 10m}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "at most every 1h0m0s"},
		{"block feed allowed", "sources:\n  x: {catalog: firehol-level1}\nrules:\n  - {name: a, action: accept, match: {source: x}}\n", 4, "lets attackers in"},
		{"catalog with a pick it lacks", "sources:\n  x: {catalog: feodo, services: [x]}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "services"},
		{"bad yaml", "rules: [\n", 1, "did not find"},
		{"empty match", "rules:\n  - {name: a, action: drop}\n", 2, "matches nothing"},
		{"bad refresh", "sources:\n  x: {format: list, paths: [f], refresh: soon}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, `refresh "soon"`},
		{"refresh too short", "sources:\n  x: {format: list, paths: [f], refresh: 10s}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "at least 1m"},
		{"bad backend", "backend: ebpf\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `unknown backend "ebpf"`},
		{"bad mode", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, mode: trial}\n", 2, `mode "trial"`},
		{"accept monitor", "rules:\n  - {name: a, action: accept, match: {prefixes: [1.2.3.4]}, mode: monitor}\n", 2, "blocks nothing"},
		{"bad top mode", "mode: dry\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `mode "dry"`},
		{"bad rule backend", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, backend: tc}\n", 2, `unknown backend "tc"`},
		{"rule backend ipset", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}, backend: ipset}\n", 2, "policy's top-level backend"},
		{"otherwise on drop", "rules:\n  - {name: a, action: drop, otherwise: reject, match: {prefixes: [1.2.3.4]}}\n", 2, "otherwise is for allow-only"},
		{"bad otherwise", "rules:\n  - {name: a, action: allow-only, otherwise: accept, match: {prefixes: [1.2.3.4]}}\n", 2, `otherwise "accept"`},
		{"bad reject mark", "reject_mark: 0x3\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "one bit of the packet mark"},
		{"bad interface", "interfaces: [eth0, a/b]\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `interface name "a/b"`},
		{"interface twice", "interfaces: [eth0, eth0]\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "listed twice"},
		{"crowdsec without key", "sources:\n  cs: {format: crowdsec, url: \"http://127.0.0.1:8080/\"}\n", 2, "api_key or api_key_file"},
		{"crowdsec two keys", "sources:\n  cs: {format: crowdsec, url: \"http://127.0.0.1:8080/\", api_key: k, api_key_file: f}\n", 2, "one of them"},
		{"crowdsec bad url", "sources:\n  cs: {format: crowdsec, url: \"127.0.0.1:8080\", api_key: k}\n", 2, "not http(s)"},
		{"crowdsec paths", "sources:\n  cs: {format: crowdsec, url: \"http://h/\", api_key: k, paths: [f]}\n", 2, "do not apply"},
		{"crowdsec refresh", "sources:\n  cs: {format: crowdsec, url: \"http://h/\", api_key: k, refresh: 2h}\n", 2, "from 1s to 1h"},
		{"crowdsec in a rule", "sources:\n  cs: {format: crowdsec, url: \"http://h/\", api_key: k}\nrules:\n  - {name: a, action: drop, match: {source: cs}}\n", 4, "become bans"},
		{"bad max_bytes", "sources:\n  x: {format: list, paths: [f], max_bytes: 64XB}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, `max_bytes "64XB": unknown unit "XB"`},
		{"zero max_bytes", "sources:\n  x: {format: list, paths: [f], max_bytes: 0}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "positive number of bytes"},
		{"negative max_entries", "sources:\n  x: {format: list, paths: [f], max_entries: -1}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "max_entries -1 is negative"},
		{"negative max_growth", "sources:\n  x: {format: list, paths: [f], max_growth: -2}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "max_growth -2 is negative"},
		{"NaN max_growth", "sources:\n  x: {format: list, paths: [f], max_growth: .nan}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "max_growth NaN"},
		{"NaN max_shrink", "sources:\n  x: {format: list, paths: [f], max_shrink: .nan}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "max_shrink NaN"},
		{"crowdsec limits", "sources:\n  cs: {format: crowdsec, url: \"http://h/\", api_key: k, max_entries: 5}\n", 2, "do not apply"},
		{"table filter", "table: filter\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, `table name "filter"`},
		{"table DOCKER", "table: DOCKER\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "another firewall manager"},
		{"table -x", "table: \"-x\"\nrules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n", 1, "starting with a letter"},
		{"second document", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4]}}\n---\nrules:\n  - {name: b, action: drop, match: {prefixes: [0.0.0.0/0]}}\n", 3, "a second YAML document"},
		{"bad asn", "sources:\n  x: {format: asn-csv, paths: [f]}\nrules:\n  - {name: a, action: drop, match: {source: x, asns: [AS15169, ASX]}}\n", 4, `asns: "ASX" is not an AS number`},
		{"asn 0", "sources:\n  x: {format: asn-csv, paths: [f]}\nrules:\n  - {name: a, action: drop, match: {source: x, asns: [0]}}\n", 4, `asns: "0" is not an AS number`},
		{"asns and countries", "sources:\n  x: {format: mmdb, paths: [f]}\nrules:\n  - {name: a, action: drop, match: {source: x, asns: [1], countries: [IT]}}\n", 4, "countries or asns, not both"},
		{"asns without a source", "rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4], asns: [1]}}\n", 2, "need a country or ASN source"},
		{"api_key on a list", "sources:\n  x: {format: list, paths: [f], api_key: k}\nrules:\n  - {name: a, action: drop, match: {source: x}}\n", 2, "for crowdsec sources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "p.yaml")
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *policy.Error", err)
			}
			if pe.Line != tc.line || !strings.Contains(err.Error(), tc.want) || pe.File != "p.yaml" {
				t.Errorf("error %q (line %d), want line %d containing %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}
}

func resolve(t *testing.T, yaml string) (*Resolved, error) {
	t.Helper()
	dir := t.TempDir()
	feed, _ := os.ReadFile("testdata/feed.txt")
	os.WriteFile(filepath.Join(dir, "feed.txt"), feed, 0o644)
	path := filepath.Join(dir, "p.yaml")
	os.WriteFile(path, []byte(yaml), 0o644)
	p, err := Load(path)
	if err != nil {
		return nil, err
	}
	return p.Resolve(context.Background(), &source.Loader{StateDir: filepath.Join(dir, "state")})
}

func TestResolveAndCompile(t *testing.T) {
	res, err := resolve(t, good)
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Compile(res.Input, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, proto string
		port       uint16
		verdict    string
		rule       string
	}{
		{"192.0.2.9", "udp", 53, "drop", "feeds"},
		{"2001:db8:1::5", "tcp", 22, "accept", "protect"}, // feed entry inside protected 2001:db8::/32
		{"203.0.113.7", "tcp", 22, "accept", "protect"},
		{"8.8.8.8", "tcp", 22, "drop", "europe"}, // US, port 22 is filtered
		{"8.8.8.8", "tcp", 8080, "accept", ""},   // port not filtered
		{"151.1.1.1", "tcp", 443, "accept", ""},  // Italy
	} {
		d := p.Verdict(plan.Packet{Src: netip.MustParseAddr(tc.src), Proto: tc.proto, DPort: tc.port})
		if d.Verdict != tc.verdict || d.Rule != tc.rule {
			t.Errorf("%s %s/%d: %+v, want %s by %q", tc.src, tc.proto, tc.port, d, tc.verdict, tc.rule)
		}
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "2001:db8:1::/48") {
		t.Errorf("warnings: %q, want one about the protected feed entry", p.Warnings)
	}
	ex := res.Explain("europe", netip.MustParseAddr("151.1.1.1"))
	if len(ex) == 0 || ex[0].Country != "IT" {
		t.Errorf("explain: %+v", ex)
	}
}

// TestResolveASN resolves rules on an asn-csv source: asns as numbers
// and AS names, inverted, and explain's AS and organisation.
func TestResolveASN(t *testing.T) {
	dir := t.TempDir()
	csv := "# first,last,ASN,name\n192.0.2.0,192.0.2.127,64496,\"Example, Inc.\"\n192.0.2.128/25,AS64497,Other\n2001:db8::/32,64496\n"
	if err := os.WriteFile(filepath.Join(dir, "asn.csv"), []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "p.yaml")
	y := "sources:\n  asn: {format: asn-csv, paths: [asn.csv]}\nrules:\n" +
		"  - {name: a, action: drop, match: {source: asn, asns: [AS64496]}}\n" +
		"  - {name: b, action: drop, match: {source: asn, asns: [64496], invert: true}}\n"
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Resolve(context.Background(), &source.Loader{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"[192.0.2.0/25 2001:db8::/32]", "[192.0.2.128/25]"} {
		if got := fmt.Sprint(prefix.Prefixes(res.Input.Rules[i].Set)); got != want {
			t.Errorf("rule %s: %s, want %s", res.Input.Rules[i].Name, got, want)
		}
	}
	ex := res.Explain("a", netip.MustParseAddr("192.0.2.9"))
	if len(ex) != 1 || ex[0].ASN != 64496 || ex[0].Org != "Example, Inc." || ex[0].Where != filepath.Join(dir, "asn.csv")+":2" {
		t.Errorf("explain 192.0.2.9 in rule a: %+v", ex)
	}
	if ex := res.Explain("b", netip.MustParseAddr("192.0.2.9")); len(ex) != 0 {
		t.Errorf("explain 192.0.2.9 in rule b (every other AS): %+v", ex)
	}
	if ex := res.Explain("b", netip.MustParseAddr("192.0.2.200")); len(ex) != 1 || ex[0].ASN != 64497 || ex[0].Org != "Other" {
		t.Errorf("explain 192.0.2.200 in rule b: %+v", ex)
	}
}

// TestSourceLabels: an mmdb source is read with what its rules select
// by; other formats are not told.
func TestSourceLabels(t *testing.T) {
	y := "sources:\n  mm: {format: mmdb, paths: [f]}\n  both: {format: mmdb, paths: [f]}\n  plain: {format: mmdb, paths: [f]}\n  csv: {format: asn-csv, paths: [f]}\n" +
		"rules:\n  - {name: a, action: drop, match: {source: mm, countries: [IT]}}\n" +
		"  - {name: b, action: drop, match: {source: both, asns: [1]}}\n  - {name: c, action: drop, match: {source: both, invert: true}}\n" +
		"  - {name: d, action: drop, match: {sources: [plain, csv]}}\n  - {name: e, action: drop, match: {source: csv, asns: [1]}}\n"
	p, err := Parse([]byte(y), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]source.Labels{"mm": source.LabelCountry, "both": source.LabelCountry | source.LabelASN, "plain": 0, "csv": 0}
	for _, sd := range p.Sources {
		if sd.Spec.Labels != want[sd.Spec.Name] {
			t.Errorf("source %s: labels %v, want %v", sd.Spec.Name, sd.Spec.Labels, want[sd.Spec.Name])
		}
	}
}

func TestResolveErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		is         error
		want       string
	}{
		{"unknown country", "sources:\n  geo: {format: country-csv, paths: [\"builtin:country-ipv4.csv.gz\"]}\nrules:\n  - {name: a, action: allow-only, family: ipv4, match: {source: geo, countries: [QQ]}}\n", nil, "QQ"},
		{"missing file", "sources:\n  f: {format: list, paths: [nope.txt]}\nrules:\n  - {name: a, action: drop, match: {source: f}}\n", nil, "nope.txt"},
		{"countries on a list", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: a, action: drop, match: {source: f, countries: [IT]}}\n", ErrNotCountry, "country"},
		{"asns on a list", "sources:\n  f: {format: list, paths: [feed.txt]}\nrules:\n  - {name: a, action: drop, match: {source: f, asns: [AS64500]}}\n", ErrNotASN, "asns need format asn-csv"},
		{"asns on countries", "sources:\n  geo: {format: country-csv, paths: [\"builtin:country-ipv4.csv.gz\"]}\nrules:\n  - {name: a, action: drop, match: {source: geo, asns: [AS64500]}}\n", ErrNotASN, "no autonomous systems"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolve(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Line == 0 {
				t.Errorf("error %v has no policy line", err)
			}
		})
	}
}

func TestCompileRefusesBlockingEverything(t *testing.T) {
	for _, y := range []string{
		"rules:\n  - {name: a, action: drop, match: {prefixes: [0.0.0.0/0]}}\n",
		"rules:\n  - {name: a, action: drop, match: {prefixes: [\"::/0\"]}}\n",
		"rules:\n  - {name: a, action: allow-only, match: {prefixes: [1.0.0.0/8]}}\n", // no IPv6 at all
	} {
		res, err := resolve(t, y)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plan.Compile(res.Input, plan.Options{}); !errors.Is(err, plan.ErrBlocksEverything) {
			t.Errorf("%q: error %v, want ErrBlocksEverything", y, err)
		}
	}
	// Limiting the allow-only rule to IPv4 is fine.
	res, err := resolve(t, "rules:\n  - {name: a, action: allow-only, family: ipv4, match: {prefixes: [1.0.0.0/8]}}\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Compile(res.Input, plan.Options{}); err != nil {
		t.Error(err)
	}
}

// FuzzParse: any input either parses into a policy whose rules all have
// names, actions and families, or fails with a *policy.Error.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("rules:\n  - {name: a, action: drop, match: {prefixes: [1.2.3.4, \"2001:db8::/32\"]}, ports: [tcp/1-2, udp/53], family: ipv6}\n"))
	f.Add([]byte("protect: [1.2.3.4-1.2.3.9]\nrules: [{name: x, action: accept, match: {prefixes: [10.0.0.0/8]}}]\n"))
	f.Add([]byte("sources: {a: {format: rir-delegated, url: http://127.0.0.1/x}}\nrules: [{name: x, action: reject, match: {source: a, countries: [it], invert: true}}]\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, "f.yaml")
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.File != "f.yaml" {
				t.Fatalf("error %v (%T) is not a *policy.Error for f.yaml", err, err)
			}
			return
		}
		for _, r := range p.Rules {
			if r.Name == "" || r.Action == "" || (!r.IPv4 && !r.IPv6) {
				t.Fatalf("rule %+v accepted incomplete", r)
			}
			for _, pt := range r.Ports {
				if pt.First == 0 || pt.First > pt.Last {
					t.Fatalf("port %+v accepted", pt)
				}
			}
		}
	})
}

func TestParsePort(t *testing.T) {
	for in, want := range map[string]plan.Port{"tcp/22": {Proto: "tcp", First: 22, Last: 22}, "udp/53-54": {Proto: "udp", First: 53, Last: 54}} {
		if got, err := ParsePort(in); err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, in := range []string{"", "tcp", "icmp/1", "tcp/0", "tcp/70000", "tcp/9-1", "tcp/a", "tcp/1-"} {
		if _, err := ParsePort(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestParseMode: a rule's mode, the policy's default for its blocking
// rules (accept rules stop nothing and keep enforcing), and MonitorAll.
func TestParseMode(t *testing.T) {
	p, err := Parse([]byte(`mode: monitor
rules:
  - {name: ok,   action: accept, match: {prefixes: [192.0.2.1]}}
  - {name: feed, action: drop, match: {prefixes: [192.0.2.0/24]}}
  - {name: ssh,  action: allow-only, ports: [tcp/22], mode: enforce, match: {prefixes: [198.51.100.0/24]}}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := []bool{p.Rules[0].Monitor, p.Rules[1].Monitor, p.Rules[2].Monitor}; !slices.Equal(got, []bool{false, true, false}) {
		t.Errorf("modes %v, want accept enforcing, feed monitoring, ssh enforcing", got)
	}
	p.MonitorAll()
	if got := []bool{p.Rules[0].Monitor, p.Rules[1].Monitor, p.Rules[2].Monitor}; !slices.Equal(got, []bool{false, true, true}) {
		t.Errorf("after MonitorAll: modes %v, want every blocking rule monitoring", got)
	}
}
