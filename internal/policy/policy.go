// Package policy reads ipfence policy files (YAML) and resolves them into
// the input of plan.Compile.
//
// Load validates everything it can without reading sources: unknown
// fields, actions, ports, families, references to undefined sources and
// duplicate names are reported as *Error with file and line. Resolve then
// loads the sources (through a source.Loader, which applies the feed
// sanity gates) and computes each rule's prefix set.
package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// Error is a problem at a place in a policy file.
type Error struct {
	File string
	Line int // 0 when unknown
	Msg  string
	Err  error // the underlying error, if any
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Policy is a parsed, validated policy file.
type Policy struct {
	File string
	// Text is the file as read, for the record (a fleet bundle keeps it
	// without credentials: Redact).
	Text     string
	Table    string
	Priority int32
	Sources  []*SourceDef
	// CrowdSec are the crowdsec sources: Local APIs whose decisions a
	// daemon turns into bans (no rule matches them).
	CrowdSec []*CrowdSecDef
	Protect  []ProtectEntry
	Rules    []*RuleDef
	// Backend is the rules' default backend ("" is nftables) and
	// Interfaces where XDP rules run.
	Backend    plan.Backend
	Interfaces []string
	// Stateless is the rules' default: judge every packet before
	// conntrack (false: connection-aware, the default).
	Stateless bool
	// Monitor is the blocking rules' default mode: monitor (only count
	// what they would drop or reject) rather than enforce.
	Monitor bool
	// RejectMark is the packet mark bit the iptables backends use to
	// reject in the filter table what reject rules match in raw (0: the
	// backend's default).
	RejectMark uint32
	// Bans is what `bans:` says of bans (/64 aggregation).
	Bans ban.Policy
}

// SourceDef is a source as defined in the policy.
type SourceDef struct {
	Spec source.Spec
	Line int
	// Catalog is the catalog entry it names ("" for none).
	Catalog string
}

// CrowdSecDef is a source of format crowdsec: a CrowdSec Local API whose
// decisions stream a daemon follows, banning what it decides.
type CrowdSecDef struct {
	Name string // also the origin of its bans
	URL  string
	// APIKey is the bouncer key, or APIKeyFile the file that holds it
	// (read when the daemon starts following).
	APIKey, APIKeyFile string
	Every              time.Duration // how often to pull (default 10s)
	Line               int
}

// DefaultCrowdSecEvery is how often a crowdsec source is pulled unless
// its refresh says otherwise (the firewall bouncer's default).
const DefaultCrowdSecEvery = 10 * time.Second

// Key returns the bouncer key: APIKey, or the first line of APIKeyFile.
func (c *CrowdSecDef) Key() (string, error) {
	if c.APIKeyFile == "" {
		return c.APIKey, nil
	}
	b, err := os.ReadFile(c.APIKeyFile)
	if err != nil {
		return "", fmt.Errorf("crowdsec source %s: reading the API key: %w", c.Name, err)
	}
	k, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if k = strings.TrimSpace(k); k == "" {
		return "", fmt.Errorf("crowdsec source %s: %s is empty (put the key from cscli bouncers add there)", c.Name, c.APIKeyFile)
	}
	return k, nil
}

// ProtectEntry is one protected address, prefix or range.
type ProtectEntry struct {
	Range netipx.IPRange
	Line  int
}

// RuleDef is a rule as written in the policy.
type RuleDef struct {
	Name      string
	Action    plan.Action
	Otherwise plan.Action
	Sources   []string
	Countries []string
	// ASNs are the autonomous systems picked of an ASN source.
	ASNs      []uint32
	Invert    bool
	Prefixes  []netipx.IPRange
	Ports     []plan.Port
	IPv4      bool
	IPv6      bool
	Backend   plan.Backend
	Direction plan.Direction
	Stateless bool
	// Monitor: mode monitor (only count what it would drop or reject).
	Monitor bool
	Line    int
}

// Where is "file:line" of the rule.
func (r *RuleDef) where(file string) string { return fmt.Sprintf("%s:%d", file, r.Line) }

type doc struct {
	Table    string               `yaml:"table"`
	Priority *int32               `yaml:"priority"`
	Sources  map[string]sourceDoc `yaml:"sources"`
	Protect  []string             `yaml:"protect"`
	Rules    []ruleDoc            `yaml:"rules"`
	Backend  string               `yaml:"backend"`
	// RejectMark: the mark bit of the iptables backends' reject rules.
	RejectMark string `yaml:"reject_mark"`
	// Interfaces: where XDP rules are attached.
	Interfaces []string `yaml:"interfaces"`
	// Stateless: the rules' default statefulness.
	Stateless bool `yaml:"stateless"`
	// Mode: the blocking rules' default mode (enforce or monitor).
	Mode string `yaml:"mode"`
	// Bans: how bans aggregate.
	Bans bansDoc `yaml:"bans"`
}

// bansDoc is the policy's `bans:`.
type bansDoc struct {
	AggregateV6 int          `yaml:"aggregate_v6"`
	Recidive    *recidiveDoc `yaml:"recidive"`
}

// recidiveDoc is `bans: {recidive: ...}`: window, and factor and max
// (defaults 2 and 30d).
type recidiveDoc struct {
	Window string  `yaml:"window"`
	Factor float64 `yaml:"factor"`
	Max    string  `yaml:"max"`
}

// Defaults of `bans: {recidive: ...}`.
const (
	defaultRecidiveFactor = 2
	defaultRecidiveMax    = "30d"
)

// banPolicy reads d.
func (d bansDoc) banPolicy() (ban.Policy, error) {
	p := ban.Policy{Aggregate6: d.AggregateV6}
	if r := d.Recidive; r != nil {
		if r.Window == "" {
			return p, errors.New("recidive needs a window: how long after a ban ends a new one of the prefix is a repeat")
		}
		var err error
		if p.Recidive.Window, err = ban.ParseTTL(r.Window); err != nil || p.Recidive.Window == 0 {
			return p, fmt.Errorf("recidive window %q: a duration such as 24h or 7d", r.Window)
		}
		if r.Max == "" {
			r.Max = defaultRecidiveMax
		}
		if p.Recidive.Max, err = ban.ParseTTL(r.Max); err != nil || p.Recidive.Max == 0 {
			return p, fmt.Errorf("recidive max %q: a duration such as 7d or 30d", r.Max)
		}
		p.Recidive.Factor = r.Factor
		if r.Factor == 0 {
			p.Recidive.Factor = defaultRecidiveFactor
		}
	}
	return p, p.Check()
}

type sourceDoc struct {
	// Catalog names a feed of the catalog (source.Catalog), which gives
	// the URLs, format and refresh.
	Catalog   string   `yaml:"catalog"`
	Format    string   `yaml:"format"`
	Paths     []string `yaml:"paths"`
	Path      string   `yaml:"path"`
	URL       string   `yaml:"url"`
	URLs      []string `yaml:"urls"`
	MaxShrink *float64 `yaml:"max_shrink"`
	Refresh   string   `yaml:"refresh"`
	// Input limits (source.Spec): growth gate, bytes per file after
	// decompression ("64MiB", or a number of bytes), rows, and whether a
	// list may hold prefixes broader than /8 or /16.
	MaxGrowth  *float64 `yaml:"max_growth"`
	MaxBytes   string   `yaml:"max_bytes"`
	MaxEntries int      `yaml:"max_entries"`
	AllowBroad *bool    `yaml:"allow_broad"`
	// JSON formats: the records picked by service and region.
	Services []string `yaml:"services"`
	Regions  []string `yaml:"regions"`
	// crowdsec sources: the bouncer key, or a file holding it.
	APIKey     string `yaml:"api_key"`
	APIKeyFile string `yaml:"api_key_file"`
}

// fromCatalog fills sd's URLs, format, refresh and input limits from its
// catalog entry, where sd does not set them; a refresh more often than
// the publisher allows is refused.
func fromCatalog(sd *sourceDoc) error {
	e, ok := source.LookupCatalog(sd.Catalog)
	if !ok {
		return fmt.Errorf("catalog %q is not in the catalog (%s; ipfence feeds lists them)", sd.Catalog, source.CatalogNames())
	}
	if sd.Format != "" || sd.URL != "" || len(sd.URLs) > 0 || sd.Path != "" || len(sd.Paths) > 0 {
		return fmt.Errorf("catalog %s gives the URLs and format: drop format, url, urls, path and paths (or drop catalog)", e.Name)
	}
	sd.Format, sd.URLs = e.Format, e.URLs
	if sd.Refresh == "" {
		sd.Refresh = e.Refresh.String()
	}
	if d, err := time.ParseDuration(sd.Refresh); err == nil && d < e.MinRefresh {
		return fmt.Errorf("refresh %s: %s asks its users to fetch at most every %s (clients that fetch more often may be blocked); give %s or more", sd.Refresh, e.Name, e.MinRefresh, e.MinRefresh)
	}
	if sd.AllowBroad == nil {
		sd.AllowBroad = &e.AllowBroad
	}
	if sd.MaxShrink == nil && e.NoShrinkGate {
		off := 0.0 // an explicit 0 turns the gate off
		sd.MaxShrink = &off
	}
	return nil
}

type ruleDoc struct {
	Name      string   `yaml:"name"`
	Action    string   `yaml:"action"`
	Otherwise string   `yaml:"otherwise"`
	Match     matchDoc `yaml:"match"`
	Ports     []string `yaml:"ports"`
	Family    string   `yaml:"family"`
	Backend   string   `yaml:"backend"`
	Direction string   `yaml:"direction"`
	Stateless *bool    `yaml:"stateless"`
	Mode      string   `yaml:"mode"`
}

type matchDoc struct {
	Source    string   `yaml:"source"`
	Sources   []string `yaml:"sources"`
	Countries []string `yaml:"countries"`
	ASNs      []string `yaml:"asns"`
	Invert    bool     `yaml:"invert"`
	Prefixes  []string `yaml:"prefixes"`
}

// Load reads and validates the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading policy: %w", err)
	}
	return Parse(data, path)
}

// Parse validates a policy; file names it in errors and anchors relative
// source paths (they resolve from the policy file's folder).
func Parse(data []byte, file string) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var d doc
	if err := dec.Decode(&d); err != nil {
		return nil, yamlError(file, err)
	}
	// One policy per file: a second document would be ignored silently
	// (an empty one, as after a trailing ---, is harmless).
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, yamlError(file, err)
		}
		if len(next.Content) > 0 && next.Content[0].Tag != "!!null" {
			return nil, &Error{File: file, Line: next.Line, Msg: "a second YAML document (after ---): a policy file holds one policy; merge them or remove the ---"}
		}
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, yamlError(file, err)
	}
	lines := nodeLines(&root)
	p := &Policy{File: file, Text: string(data), Table: d.Table}
	if p.Table == "" {
		p.Table = "ipfence"
	} else if err := plan.CheckTable(p.Table); err != nil {
		return nil, &Error{File: file, Line: lines.key("table"), Msg: err.Error(), Err: err}
	}
	p.Priority = -300
	if d.Priority != nil {
		p.Priority = *d.Priority
	}
	var err error
	if p.Backend, err = plan.ParseBackend(d.Backend); err != nil {
		return nil, &Error{File: file, Line: lines.key("backend"), Msg: err.Error()}
	}
	if p.Bans, err = d.Bans.banPolicy(); err != nil {
		return nil, &Error{File: file, Line: lines.key("bans"), Msg: "bans: " + err.Error() + ` (e.g. bans: {aggregate_v6: 4, recidive: {window: 24h, factor: 2, max: 30d}})`}
	}
	if d.RejectMark != "" {
		m, err := strconv.ParseUint(d.RejectMark, 0, 32)
		if err != nil || bits.OnesCount64(m) != 1 {
			return nil, &Error{File: file, Line: lines.key("reject_mark"), Msg: fmt.Sprintf("reject_mark %q: give one bit of the packet mark, e.g. 0x100000", d.RejectMark)}
		}
		p.RejectMark = uint32(m)
	}
	p.Stateless = d.Stateless
	switch d.Mode {
	case "", "enforce":
	case "monitor":
		p.Monitor = true
	default:
		return nil, &Error{File: file, Line: lines.key("mode"), Msg: fmt.Sprintf("mode %q: use enforce or monitor", d.Mode)}
	}
	seenIf := map[string]bool{}
	for _, name := range d.Interfaces {
		if !validIfName(name) {
			return nil, &Error{File: file, Line: lines.key("interfaces"), Msg: fmt.Sprintf("interface name %q: at most 15 characters, no '/', ':' or spaces", name)}
		}
		if seenIf[name] {
			return nil, &Error{File: file, Line: lines.key("interfaces"), Msg: fmt.Sprintf("interface %q is listed twice", name)}
		}
		seenIf[name] = true
		p.Interfaces = append(p.Interfaces, name)
	}
	dir := filepath.Dir(file)
	names := make([]string, 0, len(d.Sources))
	for n := range d.Sources {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		sd := d.Sources[n]
		line := lines.sources[n]
		if sd.Catalog != "" {
			if err := fromCatalog(&sd); err != nil {
				return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: %v", n, err)}
			}
		}
		if sd.Format == FormatCrowdSec {
			if len(sd.Services)+len(sd.Regions) > 0 {
				return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: services and regions are for JSON address lists, not crowdsec", n)}
			}
			cs, err := crowdSecDef(file, n, line, sd)
			if err != nil {
				return nil, err
			}
			p.CrowdSec = append(p.CrowdSec, cs)
			continue
		}
		if sd.APIKey != "" || sd.APIKeyFile != "" {
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: api_key and api_key_file are for crowdsec sources", n)}
		}
		spec := source.Spec{Name: n, Format: sd.Format, URLs: sd.URLs}
		if sd.URL != "" {
			spec.URLs = append([]string{sd.URL}, spec.URLs...)
		}
		paths := sd.Paths
		if sd.Path != "" {
			paths = append([]string{sd.Path}, paths...)
		}
		for _, pth := range paths {
			if !strings.HasPrefix(pth, "builtin:") && !filepath.IsAbs(pth) {
				pth = filepath.Join(dir, pth)
			}
			spec.Paths = append(spec.Paths, pth)
		}
		if sd.MaxShrink != nil {
			spec.MaxShrink = *sd.MaxShrink
			if spec.MaxShrink == 0 {
				spec.MaxShrink = -1 // an explicit 0 turns the gate off
			}
		}
		if sd.MaxShrink != nil && (math.IsNaN(*sd.MaxShrink) || *sd.MaxShrink < 0) {
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: max_shrink %v: give a share (0.5 = 50%%), or 0 to turn the gate off", n, *sd.MaxShrink)}
		}
		if sd.MaxGrowth != nil {
			if math.IsNaN(*sd.MaxGrowth) || math.IsInf(*sd.MaxGrowth, 0) || *sd.MaxGrowth < 0 {
				return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: max_growth %v is negative: give a share (4 = +400%%), or 0 to turn the gate off", n, *sd.MaxGrowth)}
			}
			spec.MaxGrowth = *sd.MaxGrowth
			if spec.MaxGrowth == 0 {
				spec.MaxGrowth = -1 // an explicit 0 turns the gate off
			}
		}
		if sd.MaxBytes != "" {
			b, err := parseBytes(sd.MaxBytes)
			if err != nil {
				return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: max_bytes %q: %v", n, sd.MaxBytes, err)}
			}
			spec.MaxBytes = b
		}
		if sd.MaxEntries < 0 {
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: max_entries %d is negative", n, sd.MaxEntries)}
		}
		spec.MaxEntries, spec.AllowBroad = sd.MaxEntries, sd.AllowBroad != nil && *sd.AllowBroad
		spec.Services, spec.Regions = sd.Services, sd.Regions
		if e, ok := source.LookupCatalog(sd.Catalog); ok {
			spec.MinAge = e.MinRefresh
		}
		switch sd.Refresh {
		case "":
		case "never":
			spec.Refresh = -1
		default:
			d, err := time.ParseDuration(sd.Refresh)
			if err != nil || d < time.Minute {
				return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: refresh %q is not a duration of at least 1m (e.g. 15m, 6h) or never", n, sd.Refresh)}
			}
			spec.Refresh = d
		}
		formats := strings.Join(append(source.Formats(), FormatCrowdSec), ", ")
		switch {
		case spec.Format == "":
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q has no format (use %s)", n, formats)}
		case !slices.Contains(source.Formats(), spec.Format):
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: unknown format %q (use %s)", n, spec.Format, formats)}
		}
		if err := source.CheckPicks(spec.Format, spec.Services, spec.Regions); err != nil {
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q: %v", n, err)}
		}
		if len(spec.Paths) == 0 && len(spec.URLs) == 0 {
			return nil, &Error{File: file, Line: line, Msg: fmt.Sprintf("source %q has neither paths nor url", n)}
		}
		p.Sources = append(p.Sources, &SourceDef{Spec: spec, Line: line, Catalog: sd.Catalog})
	}
	for i, s := range d.Protect {
		r, ok, err := prefix.ParseLine(s)
		if err != nil || !ok {
			return nil, &Error{File: file, Line: lines.protect[i], Msg: fmt.Sprintf("protect entry %q is not an IP address, prefix or range", s), Err: err}
		}
		p.Protect = append(p.Protect, ProtectEntry{Range: r, Line: lines.protect[i]})
	}
	if len(d.Rules) == 0 && len(p.CrowdSec) == 0 {
		return nil, &Error{File: file, Msg: "the policy has no rules"}
	}
	seen := map[string]int{}
	for i, rd := range d.Rules {
		r, err := p.rule(rd, lines.rules[i], seen)
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, r)
	}
	p.labelSources()
	return p, nil
}

// labelSources tells each mmdb source what its rules select by (its
// Spec.Labels): an mmdb is read with those labels only, and refused when
// it lacks one (a wrong edition downloaded keeps the cached copy).
func (p *Policy) labelSources() {
	for _, sd := range p.Sources {
		if sd.Spec.Format != source.FormatMMDB {
			continue
		}
		for _, r := range p.Rules {
			if !slices.Contains(r.Sources, sd.Spec.Name) {
				continue
			}
			switch {
			case len(r.ASNs) > 0:
				sd.Spec.Labels |= source.LabelASN
			case len(r.Countries) > 0 || r.Invert:
				sd.Spec.Labels |= source.LabelCountry
			}
		}
	}
}

func (p *Policy) rule(rd ruleDoc, line int, seen map[string]int) (*RuleDef, error) {
	bad := func(format string, args ...any) error {
		return &Error{File: p.File, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	if rd.Name == "" {
		return nil, bad("rule has no name")
	}
	if !validName(rd.Name) {
		return nil, bad("rule name %q: use letters, digits, _ and - only", rd.Name)
	}
	if l, dup := seen[rd.Name]; dup {
		return nil, bad("rule %q is defined twice (also at line %d)", rd.Name, l)
	}
	seen[rd.Name] = line
	act, err := plan.ParseAction(rd.Action)
	if err != nil {
		return nil, bad("rule %q: %v", rd.Name, err)
	}
	r := &RuleDef{Name: rd.Name, Action: act, Line: line, Countries: rd.Match.Countries, Invert: rd.Match.Invert}
	r.Sources = rd.Match.Sources
	if rd.Match.Source != "" {
		r.Sources = append([]string{rd.Match.Source}, r.Sources...)
	}
	for _, s := range r.Sources {
		if slices.ContainsFunc(p.CrowdSec, func(c *CrowdSecDef) bool { return c.Name == s }) {
			return nil, bad("rule %q: source %q is a crowdsec source: its decisions become bans (see ipfence bans), not a set a rule matches", rd.Name, s)
		}
		sd := p.source(s)
		if sd == nil {
			return nil, bad("rule %q: unknown source %q (defined: %s)", rd.Name, s, strings.Join(p.sourceNames(), ", "))
		}
		if e, ok := source.LookupCatalog(sd.Catalog); ok && e.Use == source.UseBlock && !rd.Match.Invert && (act == plan.Accept || act == plan.AllowOnly) {
			return nil, bad("rule %q: source %q is the block list %s: a rule that %s it lets attackers in (drop or reject it; invert: true to %s everything else)",
				rd.Name, s, e.Name, act, act)
		}
	}
	for _, s := range rd.Match.Prefixes {
		rg, ok, err := prefix.ParseLine(s)
		if err != nil || !ok {
			return nil, bad("rule %q: match prefix %q is not an IP address, prefix or range", rd.Name, s)
		}
		r.Prefixes = append(r.Prefixes, rg)
	}
	if len(r.Sources) == 0 && len(r.Prefixes) == 0 {
		return nil, bad("rule %q matches nothing: give match.source, match.sources or match.prefixes", rd.Name)
	}
	for _, a := range rd.Match.ASNs {
		n, err := source.ParseASN(a)
		if err != nil || n == 0 {
			return nil, bad("rule %q: asns: %q is not an AS number (like AS15169 or 15169)", rd.Name, a)
		}
		r.ASNs = append(r.ASNs, n)
	}
	if len(r.Countries) > 0 && len(r.ASNs) > 0 {
		return nil, bad("rule %q: give countries or asns, not both (write two rules)", rd.Name)
	}
	if (len(r.Countries) > 0 || len(r.ASNs) > 0 || r.Invert) && len(r.Sources) == 0 {
		return nil, bad("rule %q: countries/asns/invert need a country or ASN source in match.source", rd.Name)
	}
	for _, ps := range rd.Ports {
		pt, err := ParsePort(ps)
		if err != nil {
			return nil, bad("rule %q: %v", rd.Name, err)
		}
		r.Ports = append(r.Ports, pt)
	}
	switch rd.Family {
	case "", "both", "any":
		r.IPv4, r.IPv6 = true, true
	case "ipv4", "ip":
		r.IPv4 = true
	case "ipv6", "ip6":
		r.IPv6 = true
	default:
		return nil, bad("rule %q: family %q (use ipv4, ipv6 or both)", rd.Name, rd.Family)
	}
	switch rd.Otherwise {
	case "":
	case string(plan.Drop), string(plan.Reject):
		if r.Action != plan.AllowOnly {
			return nil, bad("rule %q: otherwise is for allow-only rules (what they do with sources outside the set)", rd.Name)
		}
		r.Otherwise = plan.Action(rd.Otherwise)
	default:
		return nil, bad("rule %q: otherwise %q (use drop or reject)", rd.Name, rd.Otherwise)
	}
	if r.Backend, err = plan.ParseRuleBackend(rd.Backend); err != nil {
		return nil, bad("rule %q: %v", rd.Name, err)
	}
	if r.Direction, err = plan.ParseDirection(rd.Direction); err != nil {
		return nil, bad("rule %q: %v", rd.Name, err)
	}
	r.Stateless = p.Stateless
	if rd.Stateless != nil {
		r.Stateless = *rd.Stateless
	}
	switch rd.Mode {
	case "":
		r.Monitor = p.Monitor && r.Action != plan.Accept // accept rules stop nothing
	case "enforce":
	case "monitor":
		if r.Action == plan.Accept {
			return nil, bad("rule %q: %v; remove `mode: monitor`", rd.Name, plan.ErrMonitorAccept)
		}
		r.Monitor = true
	default:
		return nil, bad("rule %q: mode %q (use enforce or monitor)", rd.Name, rd.Mode)
	}
	return r, nil
}

// MonitorAll puts every rule that drops or rejects in monitor mode
// (apply --monitor): it only counts what it would stop. Accept rules,
// which stop nothing, are left as they are.
func (p *Policy) MonitorAll() {
	p.Monitor = true
	for _, r := range p.Rules {
		if r.Action != plan.Accept {
			r.Monitor = true
		}
	}
}

// validIfName reports whether s can name a network interface.
func validIfName(s string) bool {
	return s != "" && len(s) < 16 && s != "." && s != ".." && !strings.ContainsAny(s, "/: \t\n")
}

// ParsePort parses "tcp/22", "udp/53" or "tcp/80-443".
func ParsePort(s string) (plan.Port, error) {
	proto, rng, ok := strings.Cut(s, "/")
	if !ok || (proto != "tcp" && proto != "udp") {
		return plan.Port{}, fmt.Errorf("port %q: write tcp/PORT, udp/PORT or tcp/FIRST-LAST", s)
	}
	first, last, isRange := strings.Cut(rng, "-")
	if !isRange {
		last = first
	}
	f, err1 := strconv.ParseUint(first, 10, 16)
	l, err2 := strconv.ParseUint(last, 10, 16)
	if err1 != nil || err2 != nil || f == 0 || f > l {
		return plan.Port{}, fmt.Errorf("port %q: ports are 1-65535 and ranges go up", s)
	}
	return plan.Port{Proto: proto, First: uint16(f), Last: uint16(l)}, nil
}

// FormatCrowdSec is the format of a crowdsec source.
const FormatCrowdSec = "crowdsec"

// crowdSecDef validates a crowdsec source.
func crowdSecDef(file, name string, line int, sd sourceDoc) (*CrowdSecDef, error) {
	bad := func(format string, args ...any) error {
		return &Error{File: file, Line: line, Msg: fmt.Sprintf("crowdsec source %q: ", name) + fmt.Sprintf(format, args...)}
	}
	if len(sd.Paths) > 0 || sd.Path != "" || sd.MaxShrink != nil || sd.MaxGrowth != nil || sd.MaxBytes != "" || sd.MaxEntries != 0 || sd.AllowBroad != nil {
		return nil, bad("paths, max_shrink, max_growth, max_bytes, max_entries and allow_broad do not apply (give url and api_key or api_key_file)")
	}
	urls := sd.URLs
	if sd.URL != "" {
		urls = append([]string{sd.URL}, urls...)
	}
	if len(urls) != 1 {
		return nil, bad("give the Local API's url once (e.g. url: http://127.0.0.1:8080/)")
	}
	u, err := url.Parse(urls[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, bad("url %q is not http(s)://HOST:PORT/", urls[0])
	}
	if (sd.APIKey == "") == (sd.APIKeyFile == "") {
		return nil, bad("give api_key or api_key_file, one of them (the key from cscli bouncers add ipfence)")
	}
	c := &CrowdSecDef{Name: name, URL: urls[0], APIKey: sd.APIKey, APIKeyFile: sd.APIKeyFile, Every: DefaultCrowdSecEvery, Line: line}
	if c.APIKeyFile != "" && !filepath.IsAbs(c.APIKeyFile) {
		c.APIKeyFile = filepath.Join(filepath.Dir(file), c.APIKeyFile)
	}
	if sd.Refresh != "" {
		d, err := time.ParseDuration(sd.Refresh)
		if err != nil || d < time.Second || d > time.Hour {
			return nil, bad("refresh %q: how often to pull, from 1s to 1h (default 10s)", sd.Refresh)
		}
		c.Every = d
	}
	return c, nil
}

func (p *Policy) source(name string) *SourceDef {
	for _, s := range p.Sources {
		if s.Spec.Name == name {
			return s
		}
	}
	return nil
}

func (p *Policy) sourceNames() []string {
	var n []string
	for _, s := range p.Sources {
		n = append(n, s.Spec.Name)
	}
	if len(n) == 0 {
		return []string{"none"}
	}
	return n
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// yamlError turns a YAML decoding error into an *Error; yaml reports
// "line N: ..." which becomes the position.
func yamlError(file string, err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	msg = strings.TrimSpace(msg)
	var line int
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ":"); ok {
			if v, e := strconv.Atoi(n); e == nil {
				line, msg = v, strings.TrimSpace(tail)
			}
		}
	}
	if i := strings.Index(msg, "\n"); i >= 0 {
		msg = msg[:i] + " (and more)"
	}
	return &Error{File: file, Line: line, Msg: msg + "; see the policy format in README.md", Err: err}
}

// lineIndex holds the lines of the policy's parts.
type lineIndex struct {
	keys    map[string]int
	sources map[string]int
	protect []int
	rules   []int
}

func (l lineIndex) key(k string) int { return l.keys[k] }

func nodeLines(root *yaml.Node) lineIndex {
	li := lineIndex{keys: map[string]int{}, sources: map[string]int{}}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return li
	}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		li.keys[k.Value] = k.Line
		switch k.Value {
		case "sources":
			for j := 0; j+1 < len(v.Content); j += 2 {
				li.sources[v.Content[j].Value] = v.Content[j].Line
			}
		case "protect":
			for _, c := range v.Content {
				li.protect = append(li.protect, c.Line)
			}
		case "rules":
			for _, c := range v.Content {
				li.rules = append(li.rules, c.Line)
			}
		}
	}
	return li
}

// Resolved is a policy with its sources loaded.
type Resolved struct {
	Policy  *Policy
	Sources map[string]*source.Source
	Input   *plan.Input
}

// Resolve loads every source the rules use and computes the rules' sets.
// Nothing is written: the caller commits the sources (Loader.Commit) once
// the kernel accepted the result.
func (p *Policy) Resolve(ctx context.Context, l *source.Loader) (*Resolved, error) {
	return p.ResolveReusing(ctx, l, nil)
}

// ResolveReusing is Resolve, taking a source from reuse where it returns
// one instead of loading it (a daemon's sources that are not due).
func (p *Policy) ResolveReusing(ctx context.Context, l *source.Loader, reuse func(source.Spec) *source.Source) (*Resolved, error) {
	res := &Resolved{Policy: p, Sources: map[string]*source.Source{}}
	for _, sd := range p.Sources {
		used := false
		for _, r := range p.Rules {
			used = used || slices.Contains(r.Sources, sd.Spec.Name)
		}
		if !used {
			continue
		}
		if reuse != nil {
			if src := reuse(sd.Spec); src != nil {
				res.Sources[sd.Spec.Name] = src
				continue
			}
		}
		src, err := l.Load(ctx, sd.Spec)
		if err != nil {
			return nil, &Error{File: p.File, Line: sd.Line, Msg: fmt.Sprintf("loading source %s: %v", sd.Spec.Name, err), Err: err}
		}
		res.Sources[sd.Spec.Name] = src
	}
	in := &plan.Input{Table: p.Table, Priority: p.Priority, Backend: p.Backend, Interfaces: p.Interfaces, RejectMark: p.RejectMark, Bans: p.Bans}
	var pb prefix.Builder
	for _, e := range p.Protect {
		pb.AddRange(e.Range)
	}
	prot, err := pb.Build()
	if err != nil {
		return nil, &Error{File: p.File, Msg: "protect: " + err.Error(), Err: err}
	}
	in.Protect = prot
	for _, r := range p.Rules {
		set, err := res.ruleSet(r)
		if err != nil {
			return nil, &Error{File: p.File, Line: r.Line, Msg: fmt.Sprintf("rule %q: %v", r.Name, err), Err: err}
		}
		in.Rules = append(in.Rules, plan.RuleInput{Name: r.Name, Action: r.Action, Otherwise: r.Otherwise, Ports: r.Ports,
			IPv4: r.IPv4, IPv6: r.IPv6, Backend: r.Backend, Direction: r.Direction, Stateless: r.Stateless, Monitor: r.Monitor, Set: set, Where: r.where(p.File)})
	}
	res.Input = in
	return res, nil
}

// ErrNotCountry is returned for countries on a source without country
// data, ErrNotASN for asns on one without ASNs.
var (
	ErrNotCountry = errors.New("source has no country data")
	ErrNotASN     = errors.New("source has no autonomous systems")
)

func (res *Resolved) ruleSet(r *RuleDef) (*prefix.Set, error) {
	sets := make([]*prefix.Set, 0, len(r.Sources))
	for _, name := range r.Sources {
		src := res.Sources[name]
		var s *prefix.Set
		var err error
		switch {
		case len(r.ASNs) > 0:
			if !src.IsASN() {
				return nil, fmt.Errorf("source %s: %w (asns need format asn-csv, or an mmdb with ASNs)", name, ErrNotASN)
			}
			s, err = src.ASNs(r.ASNs, r.Invert)
		case len(r.Countries) > 0 || r.Invert:
			if !src.IsCountry() {
				return nil, fmt.Errorf("source %s: %w (countries need format country-csv, rir-delegated, or an mmdb with countries)", name, ErrNotCountry)
			}
			s, err = src.Countries(r.Countries, r.Invert)
		default:
			s = src.Set()
		}
		if err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	if len(sets) == 1 && len(r.Prefixes) == 0 {
		// The rule is its one source (or the source's countries): share
		// that set rather than copy it (sets are not modified once
		// built).
		return sets[0], nil
	}
	var b prefix.Builder
	for _, s := range sets {
		b.AddSet(s)
	}
	for _, rg := range r.Prefixes {
		b.AddRange(rg)
	}
	return b.Build()
}

// Origin is where an address of a rule's set comes from.
type Origin struct {
	Source  string `json:"source"`
	Range   string `json:"range"`
	Where   string `json:"where"`
	Country string `json:"country,omitempty"`
	// ASN and Org: the row's autonomous system and its organisation.
	ASN uint32 `json:"asn,omitempty"`
	Org string `json:"org,omitempty"`
}

// Explain lists, for rule r, the source entries that contain addr and
// that the rule selects.
func (res *Resolved) Explain(ruleName string, addr netip.Addr) []Origin {
	var out []Origin
	for _, r := range res.Policy.Rules {
		if r.Name != ruleName {
			continue
		}
		for _, name := range r.Sources {
			src := res.Sources[name]
			for _, m := range src.Explain(addr) {
				if !r.picks(m) {
					continue
				}
				out = append(out, Origin{Source: name, Range: rangeString(m.Range), Where: m.Origin, Country: m.Country, ASN: m.ASN, Org: m.Org})
			}
		}
		for _, rg := range r.Prefixes {
			if rg.Contains(addr) {
				out = append(out, Origin{Source: "match.prefixes", Range: rangeString(rg), Where: r.where(res.Policy.File)})
			}
		}
	}
	return out
}

// picks reports whether the rule's selection (asns, countries, invert)
// takes the row m, as Source.ASNs and Source.Countries do.
func (r *RuleDef) picks(m source.Match) bool {
	switch {
	case len(r.ASNs) > 0:
		return m.ASN != 0 && slices.Contains(r.ASNs, m.ASN) != r.Invert
	case len(r.Countries) > 0 || r.Invert:
		return m.Country != "" && slices.Contains(upper(r.Countries), m.Country) != r.Invert
	}
	return true
}

func upper(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ToUpper(s)
	}
	return out
}

func rangeString(r netipx.IPRange) string {
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.String()
}

// parseBytes reads a byte count: a number, or a number and a unit (k, M,
// G as powers of 1000; KiB, MiB, GiB as powers of 1024; B optional).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive number of bytes, e.g. 64MiB or 50000000")
	}
	units := map[string]int64{"": 1, "B": 1, "k": 1e3, "kB": 1e3, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9,
		"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
	u, ok := units[strings.TrimSpace(t[i:])]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q: use B, k, M, G, KiB, MiB or GiB", strings.TrimSpace(t[i:]))
	}
	if n > math.MaxInt64/u {
		return 0, errors.New("too large")
	}
	return n * u, nil
}
