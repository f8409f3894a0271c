package source

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipfence/ipfence/internal/prefix"
)

// The JSON formats of published address lists. Each record's prefix is
// read as a list line is (broad prefixes need AllowBroad), and its line
// in the file is its origin.
const (
	// FormatSpamhausJSON is Spamhaus DROP's JSON (drop_v4.json,
	// drop_v6.json): a record per line, {"cidr": "...", "sblid": ...},
	// and a last line of "type": "metadata", which is skipped.
	FormatSpamhausJSON = "spamhaus-json"
	// FormatAWSJSON is AWS's ip-ranges.json: "prefixes" (ip_prefix) and
	// "ipv6_prefixes" (ipv6_prefix), each with a service and a region.
	FormatAWSJSON = "aws-json"
	// FormatGoogleJSON is Google's cloud.json and goog.json: "prefixes"
	// of ipv4Prefix or ipv6Prefix, cloud.json's with a service and a
	// scope (its region).
	FormatGoogleJSON = "google-json"
	// FormatGitHubMeta is GitHub's meta API (api.github.com/meta): an
	// object whose lists of prefixes are named by service (hooks, web,
	// api, git, actions, ...); its other keys are skipped.
	FormatGitHubMeta = "github-meta"
	// FormatFastlyJSON is Fastly's public-ip-list: "addresses" and
	// "ipv6_addresses".
	FormatFastlyJSON = "fastly-json"
)

// jsonFormats are the JSON formats, and whether they can filter by
// service and by region.
var jsonFormats = map[string]struct{ services, regions bool }{
	FormatSpamhausJSON: {},
	FormatAWSJSON:      {true, true},
	FormatGoogleJSON:   {true, true},
	FormatGitHubMeta:   {true, false},
	FormatFastlyJSON:   {},
}

// IsJSONFormat reports whether format is one of the JSON formats.
func IsJSONFormat(format string) bool { _, ok := jsonFormats[format]; return ok }

// Formats are the formats of the sources of rules' sets.
func Formats() []string {
	return []string{FormatList, FormatCountryCSV, FormatRIRDelegated, FormatSpamhausJSON, FormatAWSJSON, FormatGoogleJSON, FormatGitHubMeta, FormatFastlyJSON}
}

// pick is what a source takes of a JSON file's records: those of one of
// its services and one of its regions (none listed: all), compared
// without case.
type pick struct {
	services, regions []string
}

func (p pick) match(list []string, v string) bool {
	return len(list) == 0 || slices.ContainsFunc(list, func(s string) bool { return strings.EqualFold(s, v) })
}

// jsonRecord is one prefix of a JSON file, with its line and labels.
type jsonRecord struct {
	prefix, service, region string
	line                    int
}

// errNoPrefix is a record without the prefix its format names.
var errNoPrefix = errors.New("the record has no prefix")

// readJSON reads a file of one of the JSON formats (whole: these lists
// are at most a few MiB, and lim bounds them) into a part, with the
// records pick selects. A filter value that no record of the file has
// is an error, which lists the values it has: a typo would otherwise
// load nothing, or everything once the list changes.
func readJSON(r io.Reader, format, name string, file uint16, lim limits) (*part, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	var recs []jsonRecord
	if format == FormatSpamhausJSON {
		recs, err = spamhausRecords(data, name)
	} else {
		recs, err = objectRecords(data, format, name)
	}
	if err != nil {
		return nil, err
	}
	if err := checkPick(recs, lim.pick, name); err != nil {
		return nil, err
	}
	p := new(part)
	for _, rec := range recs {
		if !lim.pick.match(lim.pick.services, rec.service) || !lim.pick.match(lim.pick.regions, rec.region) {
			continue
		}
		rng, ok, err := prefix.ParseLine(rec.prefix)
		if err != nil || !ok {
			if err == nil {
				err = errNoPrefix
			}
			return nil, &ParseError{File: name, Line: rec.line, Text: cut(rec.prefix), Err: err, Want: "a prefix (\"192.0.2.0/24\")"}
		}
		if !lim.broad {
			if b, broad := broadest(rng); broad {
				return nil, &BroadError{File: name, Line: rec.line, Prefix: b}
			}
		}
		if p.rows() >= lim.entries {
			return nil, &LimitError{File: name, What: "entries", Limit: int64(lim.entries), Key: "max_entries"}
		}
		p.add(rng.From(), rng.To(), noCountry, file, rec.line)
	}
	return p, nil
}

// checkPick fails when a service or region pick asks for is on no
// record of recs.
func checkPick(recs []jsonRecord, pk pick, name string) error {
	for _, f := range []struct {
		what   string
		want   []string
		values func(jsonRecord) string
	}{{"service", pk.services, func(r jsonRecord) string { return r.service }}, {"region", pk.regions, func(r jsonRecord) string { return r.region }}} {
		for _, w := range f.want {
			if slices.ContainsFunc(recs, func(r jsonRecord) bool { return strings.EqualFold(f.values(r), w) }) {
				continue
			}
			var have []string
			for _, r := range recs {
				if v := f.values(r); v != "" && !slices.Contains(have, v) {
					have = append(have, v)
				}
			}
			slices.Sort(have)
			if len(have) > 30 {
				have = append(have[:30], "…")
			}
			return fmt.Errorf("%s: no record has %s %q (it has: %s)", name, f.what, w, strings.Join(have, ", "))
		}
	}
	return nil
}

// cut is s cut at maxErrText bytes, for error messages.
func cut(s string) string {
	if len(s) > maxErrText {
		return s[:maxErrText]
	}
	return s
}

// spamhausRecords reads Spamhaus DROP's JSON lines.
func spamhausRecords(data []byte, name string) ([]jsonRecord, error) {
	var recs []jsonRecord
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var rec struct {
			CIDR string `json:"cidr"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			return nil, &ParseError{File: name, Line: i + 1, Text: cut(string(line)), Err: err, Want: `{"cidr": "192.0.2.0/24", ...}`}
		}
		if rec.Type == "metadata" {
			continue
		}
		recs = append(recs, jsonRecord{prefix: rec.CIDR, line: i + 1})
	}
	return recs, nil
}

// objectRecords reads the records of a JSON object format: the arrays
// its format names (any array of strings, for GitHub's meta), each
// element with the line it starts on.
func objectRecords(data []byte, format, name string) ([]jsonRecord, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	lines := lineCounter{data: data}
	bad := func(err error) error {
		off := int(dec.InputOffset())
		return &ParseError{File: name, Line: lines.at(off), Text: cut(strings.TrimSpace(string(data[off:min(len(data), off+80)]))), Err: err, Want: "the JSON of " + format}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		if err == nil {
			err = errors.New("not a JSON object")
		}
		return nil, bad(err)
	}
	var recs []jsonRecord
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		key, _ := t.(string)
		if !arrayKey(format, key) {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, bad(err)
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			if format == FormatGitHubMeta && err == nil {
				// Not a list: skip the value (an object such as ssh_key_fingerprints).
				if d, ok := t.(json.Delim); ok && d == '{' {
					if err := skipObject(dec); err != nil {
						return nil, bad(err)
					}
				}
				continue
			}
			if err == nil {
				err = fmt.Errorf("%q is not a list", key)
			}
			return nil, bad(err)
		}
		for dec.More() {
			line := lines.at(int(dec.InputOffset()) + leadingSpace(data[dec.InputOffset():]))
			rec, err := decodeRecord(dec, format, key)
			if err != nil {
				return nil, bad(err)
			}
			rec.line = line
			if rec.prefix != "" || format != FormatGitHubMeta {
				recs = append(recs, rec)
			}
		}
		if _, err := dec.Token(); err != nil { // ]
			return nil, bad(err)
		}
	}
	return recs, nil
}

// arrayKey reports whether key names an array of records in format.
func arrayKey(format, key string) bool {
	switch format {
	case FormatAWSJSON:
		return key == "prefixes" || key == "ipv6_prefixes"
	case FormatGoogleJSON:
		return key == "prefixes"
	case FormatFastlyJSON:
		return key == "addresses" || key == "ipv6_addresses"
	case FormatGitHubMeta:
		return true // lists of strings; the others are skipped
	}
	return false
}

// decodeRecord decodes one element of array key of format.
func decodeRecord(dec *json.Decoder, format, key string) (jsonRecord, error) {
	switch format {
	case FormatAWSJSON, FormatGoogleJSON:
		// AWS names the prefix ip_prefix or ipv6_prefix and has a
		// region; Google ipv4Prefix or ipv6Prefix, and a scope.
		var r struct {
			AWS4    string `json:"ip_prefix"`
			AWS6    string `json:"ipv6_prefix"`
			Google4 string `json:"ipv4Prefix"`
			Google6 string `json:"ipv6Prefix"`
			Service string `json:"service"`
			Region  string `json:"region"`
			Scope   string `json:"scope"`
		}
		err := dec.Decode(&r)
		return jsonRecord{prefix: r.AWS4 + r.AWS6 + r.Google4 + r.Google6, service: r.Service, region: r.Region + r.Scope}, err
	case FormatGitHubMeta:
		// A list of prefixes, or another list ("ssh_keys"), whose
		// elements are skipped (prefix "").
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return jsonRecord{}, err
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return jsonRecord{service: key}, nil
		}
		if _, err := netip.ParsePrefix(s); err != nil {
			if _, err := netip.ParseAddr(s); err != nil {
				return jsonRecord{service: key}, nil
			}
		}
		return jsonRecord{prefix: s, service: key}, nil
	}
	var s string // Fastly: strings
	err := dec.Decode(&s)
	return jsonRecord{prefix: s}, err
}

// skipObject reads past the rest of an object whose '{' was read.
func skipObject(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// leadingSpace is the number of JSON whitespace and ',' bytes b starts
// with: where the next value begins after a decoder's offset.
func leadingSpace(b []byte) int {
	n := 0
	for n < len(b) && strings.IndexByte(" \t\r\n,", b[n]) >= 0 {
		n++
	}
	return n
}

// lineCounter gives the 1-based line of byte offsets of data, asked in
// increasing order.
type lineCounter struct {
	data      []byte
	off, line int
}

func (l *lineCounter) at(off int) int {
	off = min(off, len(l.data))
	if off < l.off { // not increasing: count again
		l.off, l.line = 0, 0
	}
	l.line += bytes.Count(l.data[l.off:off], []byte("\n"))
	l.off = off
	return l.line + 1
}
