// Package fleet is what one policy for many hosts is made of: signing
// keys, the bundle a publisher stores (the policy and what its sources
// resolved to) and the signed pointer that says which bundle a group of
// hosts runs. It is pure: the NATS side and the agents build on it.
package fleet

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/prefix"
)

// BundleVersion is the newest bundle format this build writes and reads:
// 2 added the rules' direction, which a version-1 reader would ignore (an
// outbound rule would load as an inbound one, and could block every
// service). A bundle whose rules are all inbound is written as version
// 1, which older agents read as this build does (they run every rule
// stateless, as they always did). 3 added the layouts the publisher
// chose (BundleRule.Layout4/6), which older agents refuse: upgrade the
// agents before the publisher. 4 added rules in monitor mode, which an
// older reader would enforce; 5 the policy's bans: (/64 aggregation),
// which an older reader would refuse as a field it does not know; 6 the
// escalation of repeat bans (bans: recidive). A bundle without them keeps
// its version.
const BundleVersion = 6

// The versions that added the layouts, monitor mode and the ban policy.
const (
	layoutsVersion = 3
	monitorVersion = 4
	bansVersion    = 5
	// recidiveVersion: the bans' policy escalates repeats (Bans.Recidive).
	recidiveVersion = 6
)

// Bundle is one revision of a group's policy: the policy file, for the
// record, and what it resolved to on the publisher, so that every agent
// applies the same prefixes whatever it could download itself. A bundle
// carries no credentials: agents use none of the policy text, which is
// kept redacted (policy.Redact).
type Bundle struct {
	Version    int       `json:"version"`
	Created    time.Time `json:"created"`
	PolicyFile string    `json:"policy_file"` // its name on the publisher
	Policy     string    `json:"policy"`      // its text without credentials ("" if it could not be redacted)
	Table      string    `json:"table"`
	Priority   int32     `json:"priority"`
	Backend    string    `json:"backend,omitempty"`
	Interfaces []string  `json:"interfaces,omitempty"`
	RejectMark uint32    `json:"reject_mark,omitempty"`
	// Bans is the policy's bans: (version 5).
	Bans ban.Policy `json:"bans,omitzero"`
	// Protect and each rule's Prefixes are prefixes, one per line:
	// compact, and gzip does the rest.
	Protect string       `json:"protect"`
	Rules   []BundleRule `json:"rules"`

	slim bool // Slim's: prefixes as sets only
	// canon is the canonical JSON a delta's check made of the bundle
	// (Delta.Apply), kept for EncodeLocal.
	canon []byte
}

// BundleRule is one rule of a Bundle.
type BundleRule struct {
	Name      string      `json:"name"`
	Action    plan.Action `json:"action"`
	Otherwise plan.Action `json:"otherwise,omitempty"`
	// Direction and Stateless: see plan.Rule ("" is in).
	Direction plan.Direction `json:"direction,omitempty"`
	Stateless bool           `json:"stateless,omitempty"`
	// Monitor: see plan.Rule (mode monitor).
	Monitor  bool        `json:"monitor,omitempty"`
	Ports    []plan.Port `json:"ports,omitempty"`
	Backend  string      `json:"backend,omitempty"`
	IPv4     bool        `json:"ipv4"`
	IPv6     bool        `json:"ipv6"`
	Where    string      `json:"where,omitempty"`
	Prefixes string      `json:"prefixes"`
	// Layout4 and Layout6 are the tree layouts the publisher chose for
	// the rule's set, as plan.Choices text: agents on nftables replay
	// them instead of searching (the search is most of a compile's CPU).
	// A layout made for another set, or that an agent's backend cannot
	// use, is searched there again; it can never make a layout wrong.
	Layout4 string `json:"layout_v4,omitempty"`
	Layout6 string `json:"layout_v6,omitempty"`

	set *prefix.Set // Prefixes as a set, once read or when known
}

// errSlim is returned for a slim bundle asked for its text.
var errSlim = errors.New("encoding the bundle: a slim bundle has no prefix text")

// Slim is b as the base of the next delta only (Delta.Apply): its rules'
// prefixes as the sets Input read, without their text, which a 400k-line
// feed's bundle holds as 6 MB of strings. An agent keeps it in memory
// where it would read the bundle back from disk at each revision. It
// cannot be encoded. Call Input first: a rule whose set is not known
// keeps its text.
func (b *Bundle) Slim() *Bundle {
	s := *b
	s.Rules = slices.Clone(b.Rules)
	for i := range s.Rules {
		if s.Rules[i].set != nil {
			s.Rules[i].Prefixes = ""
		}
	}
	s.slim, s.canon = true, nil
	return &s
}

// prefixSet is r's Prefixes as a set, read once.
func (r *BundleRule) prefixSet() (*prefix.Set, error) {
	if r.set == nil {
		set, err := parseLines(r.Prefixes)
		if err != nil {
			return nil, err
		}
		r.set = set
	}
	return r.set, nil
}

// NewBundle records in, resolved from the policy file name holding text
// (which it redacts: see Bundle.Policy).
func NewBundle(in *plan.Input, rejectMark uint32, name, text string, now time.Time) *Bundle {
	b := newBundle(in, rejectMark, name, text, now)
	for i := range b.Rules {
		b.Rules[i].Prefixes = prefixLines(b.Rules[i].set)
	}
	return b
}

// WriteLocal writes the bundle NewBundle makes of its arguments to w as
// JSON that DecodeLocal reads, each rule's prefixes written from its set
// as they are made: no text of them is held (a 400k-line feed's is 6 MB,
// and as much again as JSON), for a copy kept on this host's disk (an
// apply's revision, package trial).
func WriteLocal(w io.Writer, in *plan.Input, rejectMark uint32, name, text string, now time.Time) error {
	b := newBundle(in, rejectMark, name, text, now)
	bw := bufio.NewWriterSize(w, 64<<10)
	// The bundle and each rule without their rules and prefixes (an
	// outer field of the name, left out, hides the embedded one), their
	// closing brace then replaced by what follows.
	head, err := json.Marshal(struct {
		*Bundle
		Rules *struct{} `json:"rules,omitempty"`
	}{Bundle: b})
	if err != nil {
		return fmt.Errorf("encoding the bundle: %w", err)
	}
	bw.Write(head[:len(head)-1])
	bw.WriteString(`,"rules":[`)
	for i := range b.Rules {
		r := &b.Rules[i]
		rb, err := json.Marshal(struct {
			*BundleRule
			Prefixes *struct{} `json:"prefixes,omitempty"`
		}{BundleRule: r})
		if err != nil {
			return fmt.Errorf("encoding the bundle: %w", err)
		}
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(rb[:len(rb)-1])
		bw.WriteString(`,"prefixes":`)
		if err := prefix.WriteJSONString(bw, r.set); err != nil {
			return err
		}
		bw.WriteByte('}')
	}
	bw.WriteString("]}\n")
	return bw.Flush()
}

// newBundle is NewBundle without the rules' prefix text.
func newBundle(in *plan.Input, rejectMark uint32, name, text string, now time.Time) *Bundle {
	redacted, err := policy.Redact(text)
	if err != nil {
		redacted = "" // never the text as written
	}
	b := &Bundle{Version: BundleVersion, Created: now.UTC(), PolicyFile: name, Policy: redacted,
		Table: in.Table, Priority: in.Priority, Backend: string(in.Backend), Interfaces: in.Interfaces,
		RejectMark: rejectMark, Protect: prefixLines(in.Protect), Bans: in.Bans}
	b.Version = 1
	if in.Bans != (ban.Policy{}) {
		b.Version = bansVersion
		if in.Bans.Recidive.On() {
			b.Version = recidiveVersion
		}
	}
	for _, r := range in.Rules {
		if r.Direction.Out() {
			b.Version = max(b.Version, 2)
		}
		if r.Monitor {
			b.Version = max(b.Version, monitorVersion)
		}
		b.Rules = append(b.Rules, BundleRule{Name: r.Name, Action: r.Action, Otherwise: r.Otherwise, Ports: r.Ports, Direction: r.Direction, Stateless: r.Stateless, Monitor: r.Monitor,
			Backend: string(r.Backend), IPv4: r.IPv4, IPv6: r.IPv6, Where: r.Where, set: r.Set})
	}
	return b
}

// AddLayouts records in b the layouts p chose (compiled from the input b
// was made of, with plan.Options.Record): the bundle becomes version 3.
func (b *Bundle) AddLayouts(p *plan.Plan) error {
	b.canon = nil // the layouts change the canonical form
	if len(p.Rules) != len(b.Rules) {
		return fmt.Errorf("the plan has %d rules, the bundle %d", len(p.Rules), len(b.Rules))
	}
	for i, r := range p.Rules {
		br := &b.Rules[i]
		if r.Name != br.Name {
			return fmt.Errorf("the plan's rule %d is %q, the bundle's %q", i, r.Name, br.Name)
		}
		for _, f := range []struct {
			l   *plan.Layout
			out *string
		}{{r.V4, &br.Layout4}, {r.V6, &br.Layout6}} {
			if f.l == nil || f.l.Choices == nil {
				continue
			}
			text, err := f.l.Choices.MarshalText()
			if err != nil {
				return fmt.Errorf("rule %s: %w", r.Name, err)
			}
			*f.out = string(text)
			b.Version = max(b.Version, layoutsVersion)
		}
	}
	return nil
}

func prefixLines(s *prefix.Set) string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	_ = prefix.WriteCIDRs(&b, s) // a strings.Builder does not fail
	return b.String()
}

// ErrBundle is returned for a bundle that cannot be read.
var ErrBundle = errors.New("malformed bundle")

// Input is the plan input b records.
func (b *Bundle) Input() (*plan.Input, error) {
	if b.Version < 1 || b.Version > BundleVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d (upgrade ipfence on this host)", ErrBundle, b.Version, BundleVersion)
	}
	protect, err := parseLines(b.Protect)
	if err != nil {
		return nil, fmt.Errorf("%w: protected prefixes: %v", ErrBundle, err)
	}
	if err := b.Bans.Check(); err != nil {
		return nil, fmt.Errorf("%w: bans: %v", ErrBundle, err)
	}
	in := &plan.Input{Table: b.Table, Priority: b.Priority, Backend: plan.Backend(b.Backend), Interfaces: b.Interfaces, Protect: protect, RejectMark: b.RejectMark, Bans: b.Bans}
	for i := range b.Rules {
		r := &b.Rules[i]
		set, err := r.prefixSet()
		if err != nil {
			return nil, fmt.Errorf("%w: rule %s: %v", ErrBundle, r.Name, err)
		}
		ri := plan.RuleInput{Name: r.Name, Action: r.Action, Otherwise: r.Otherwise, Ports: r.Ports, Direction: r.Direction, Stateless: r.Stateless, Monitor: r.Monitor,
			Backend: plan.Backend(r.Backend), IPv4: r.IPv4, IPv6: r.IPv6, Where: r.Where, Set: set}
		for _, f := range []struct {
			text string
			out  **plan.Choices
		}{{r.Layout4, &ri.Chosen4}, {r.Layout6, &ri.Chosen6}} {
			if f.text == "" {
				continue
			}
			ch := new(plan.Choices)
			if err := ch.UnmarshalText([]byte(f.text)); err != nil {
				// Searched here instead: the prefixes are what counts.
				ri.ChosenNote = fmt.Sprintf("the bundle's layout does not read: %v", err)
				continue
			}
			*f.out = ch
		}
		in.Rules = append(in.Rules, ri)
	}
	return in, nil
}

// parseLines reads prefixLines' text (and any other prefix.Read text).
func parseLines(text string) (*prefix.Set, error) {
	return prefix.ReadSet(strings.NewReader(text), "the bundle")
}

// Encode is b as stored: gzipped JSON.
func (b *Bundle) Encode() ([]byte, error) {
	if b.slim {
		return nil, errSlim
	}
	return encodeGzip(b, "bundle", gzip.DefaultCompression)
}

// EncodeLocal is b as a copy kept on this host's disk, which
// DecodeLocal reads: its canonical JSON (Canonical), not compressed. A
// bundle a delta made (Delta.Apply) has it already: the copy costs no
// encoding at all, where gzip took a tenth of an agent's CPU for each
// revision. The bytes are b's own: do not change them, nor b's fields
// after Apply (AddLayouts drops them).
func (b *Bundle) EncodeLocal() ([]byte, error) {
	if b.canon != nil {
		return b.canon, nil
	}
	return b.canonicalJSON()
}

// encodeGzip is v as gzipped JSON (what names it in errors).
func encodeGzip(v any, what string, level int) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, level) // a valid level
	if err := errors.Join(json.NewEncoder(zw).Encode(v), zw.Close()); err != nil {
		return nil, fmt.Errorf("encoding the %s: %w", what, err)
	}
	return buf.Bytes(), nil
}

// MaxBundle is the largest bundle DecodeBundle reads, decompressed: a
// policy of several million prefixes.
const MaxBundle = 256 << 20

// DecodeBundle reads a bundle Encode wrote. Check its digest against a
// verified Pointer first: the bytes are only as good as their source.
func DecodeBundle(data []byte) (*Bundle, error) { return decodeGzip[Bundle](data, ErrBundle) }

// DecodeLocal reads a bundle kept on this host's disk: EncodeLocal's JSON,
// or a fetched bundle as Encode wrote it. Check its digest against the one
// recorded when it was written first.
func DecodeLocal(data []byte) (*Bundle, error) {
	if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) { // gzip's magic
		return DecodeBundle(data)
	}
	return decodeJSON[Bundle](bytes.NewReader(data), ErrBundle)
}

// decodeGzip reads what encodeGzip wrote, at most MaxBundle bytes of
// JSON, every field known; errors wrap bad.
func decodeGzip[T any](data []byte, bad error) (*T, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", bad, err)
	}
	return decodeJSON[T](zr, bad)
}

// decodeJSON reads one JSON value of r, at most MaxBundle bytes, every
// field known; errors wrap bad.
func decodeJSON[T any](r io.Reader, bad error) (*T, error) {
	var v T
	dec := json.NewDecoder(io.LimitReader(r, MaxBundle))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", bad, err)
	}
	return &v, nil
}

// Digest is the name a bundle's bytes are stored under: "sha256-" and
// the hex SHA-256.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256-" + hex.EncodeToString(sum[:])
}
