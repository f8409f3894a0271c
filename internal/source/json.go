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

// CheckPicks reports whether a source of format may pick records by
// services and regions: only the JSON formats that label their records
// with them can.
func CheckPicks(format string, services, regions []string) error {
	jf, isJSON := jsonFormats[format]
	switch {
	case len(services)+len(regions) == 0:
	case !isJSON:
		return fmt.Errorf("services and regions pick records of the JSON formats that have them (%s, %s, %s), not of %s", FormatAWSJSON, FormatGoogleJSON, FormatGitHubMeta, format)
	case len(services) > 0 && !jf.services:
		return fmt.Errorf("format %s has no services to pick", format)
	case len(regions) > 0 && !jf.regions:
		return fmt.Errorf("format %s has no regions to pick", format)
	}
	return nil
}

// IsJSONFormat reports whether format is one of the JSON formats.
func IsJSONFormat(format string) bool { _, ok := jsonFormats[format]; return ok }

// Formats are the formats of the sources of rules' sets.
func Formats() []string {
	return []string{FormatList, FormatCountryCSV, FormatRIRDelegated, FormatASNCSV, FormatMMDB, FormatSpamhausJSON, FormatAWSJSON, FormatGoogleJSON, FormatGitHubMeta, FormatFastlyJSON}
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

// errNoRecords is a file of a JSON format that holds none of its records.
var errNoRecords = errors.New("no record of the format: is it the right file and format?")

// labels keeps, for the error about a pick that matches nothing, the
// values a file has for one label: at most maxLabels of them, distinct.
type labels struct {
	seen map[string]bool // lower case
	have []string
	more bool
}

const maxLabels = 40

func (l *labels) add(v string) {
	if v == "" {
		return
	}
	k := strings.ToLower(v)
	if l.seen[k] {
		return
	}
	if len(l.seen) == maxLabels {
		l.more = true
		return
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[k] = true
	l.have = append(l.have, v)
}

// readJSON reads a file of one of the JSON formats (whole: these lists
// are at most a few MiB, and lim bounds them) into a part, with the
// records lim's pick selects, each checked as it is decoded. A pick
// value that no record of the file has, when the file has the label at
// all, is an error, which lists the values it has: a typo would
// otherwise load nothing, or everything once the list changes. A file
// with no record of the format is an error too (an error page, another
// format's file): it would load an empty set.
func readJSON(r io.Reader, format, name string, file uint16, lim limits) (*part, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	p := new(part)
	var services, regions labels
	records := 0
	take := func(rec jsonRecord) error {
		records++
		services.add(rec.service)
		regions.add(rec.region)
		if !lim.pick.match(lim.pick.services, rec.service) || !lim.pick.match(lim.pick.regions, rec.region) {
			return nil
		}
		rng, ok, err := prefix.ParseLine(rec.prefix)
		if err != nil || !ok {
			var pe *prefix.ParseError
			switch {
			case errors.As(err, &pe):
				err = pe.Err
			case err == nil:
				err = errNoPrefix
			}
			return &ParseError{File: name, Line: rec.line, Text: cut(rec.prefix), Err: err, Want: `a prefix ("192.0.2.0/24")`}
		}
		if !lim.broad {
			if b, broad := broadest(rng); broad {
				return &BroadError{File: name, Line: rec.line, Prefix: b}
			}
		}
		if p.rows() >= lim.entries {
			return &LimitError{File: name, What: "entries", Limit: int64(lim.entries), Key: "max_entries"}
		}
		p.add(rng.From(), rng.To(), noCountry, 0, file, rec.line)
		return nil
	}
	if format == FormatSpamhausJSON {
		err = spamhausRecords(data, name, take)
	} else {
		err = objectRecords(data, format, name, take)
	}
	if err != nil {
		return nil, err
	}
	if records == 0 {
		return nil, &ParseError{File: name, Line: 1, Text: cut(strings.TrimSpace(string(data[:min(len(data), 80)]))), Err: errNoRecords, Want: "the JSON of " + format}
	}
	for _, f := range []struct {
		what string
		want []string
		l    *labels
	}{{"service", lim.pick.services, &services}, {"region", lim.pick.regions, &regions}} {
		if len(f.l.have) == 0 {
			continue // the file has no such label (goog.json): it picks nothing
		}
		for _, w := range f.want {
			if f.l.seen[strings.ToLower(w)] || f.l.more {
				continue
			}
			slices.Sort(f.l.have)
			return nil, fmt.Errorf("%s: no record has %s %q (it has: %s)", name, f.what, w, strings.Join(f.l.have, ", "))
		}
	}
	return p, nil
}

// cut is s cut at maxErrText bytes, for error messages.
func cut(s string) string {
	if len(s) > maxErrText {
		return s[:maxErrText]
	}
	return s
}

// spamhausRecords reads Spamhaus DROP's JSON lines, each record to take.
func spamhausRecords(data []byte, name string, take func(jsonRecord) error) error {
	for line := 1; len(data) > 0; line++ {
		row := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			row, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		row = bytes.TrimSpace(row)
		if len(row) == 0 {
			continue
		}
		var rec struct {
			CIDR string `json:"cidr"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(row, &rec); err != nil {
			return &ParseError{File: name, Line: line, Text: cut(string(row)), Err: err, Want: `{"cidr": "192.0.2.0/24", ...}`}
		}
		if rec.Type == "metadata" {
			continue
		}
		if err := take(jsonRecord{prefix: rec.CIDR, line: line}); err != nil {
			return err
		}
	}
	return nil
}

// objectRecords reads the records of a JSON object format, each to take:
// the arrays its format names (for GitHub's meta, every list of
// prefixes), each element with the line it begins on. The object must
// be whole, with nothing after it.
func objectRecords(data []byte, format, name string, take func(jsonRecord) error) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	lines := lineCounter{data: data}
	badAt := func(off int, err error) error {
		off = min(off, len(data))
		return &ParseError{File: name, Line: lines.at(off), Text: cut(strings.TrimSpace(string(data[off:min(len(data), off+80)]))), Err: err, Want: "the JSON of " + format}
	}
	bad := func(err error) error { return badAt(int(dec.InputOffset()), err) }
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		if err == nil {
			err = errors.New("not a JSON object")
		}
		return bad(err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		key, _ := t.(string)
		if !arrayKey(format, key) {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return bad(err)
			}
			continue
		}
		if format == FormatGitHubMeta {
			if err := githubList(dec, data, key, &lines, badAt, take); err != nil {
				return err
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			if err == nil {
				err = fmt.Errorf("%q is not a list", key)
			}
			return bad(err)
		}
		for dec.More() {
			off := int(dec.InputOffset()) + leadingSpace(data[dec.InputOffset():])
			rec, err := decodeRecord(dec, format)
			if err != nil {
				return badAt(off, err)
			}
			rec.line = lines.at(off)
			if err := take(rec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // ]
			return bad(err)
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		if err == nil {
			err = errors.New("the object does not end")
		}
		return bad(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad(errors.New("data after the object"))
	}
	return nil
}

// githubList reads the value of key of GitHub's meta: a list of strings
// of which any is a prefix or an address is a list of prefixes, all read
// (a bad one is an error); any other value (ssh_keys, the domains
// object, a boolean) is skipped.
func githubList(dec *json.Decoder, data []byte, key string, lines *lineCounter, badAt func(int, error) error, take func(jsonRecord) error) error {
	start := int(dec.InputOffset()) + leadingSpace(data[dec.InputOffset():])
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return badAt(start, err)
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return nil
	}
	if !slices.ContainsFunc(list, func(el json.RawMessage) bool {
		var s string
		return json.Unmarshal(el, &s) == nil && isPrefixText(s)
	}) {
		return nil
	}
	// The elements' lines: found in raw, in order.
	at := start
	for _, el := range list {
		if i := bytes.Index(data[at:], el); i >= 0 {
			at += i
		}
		var s string
		if err := json.Unmarshal(el, &s); err != nil {
			return badAt(at, fmt.Errorf("list %q: %w", key, err))
		}
		if err := take(jsonRecord{prefix: s, service: key, line: lines.at(at)}); err != nil {
			return err
		}
		at += len(el)
	}
	return nil
}

// isPrefixText reports whether s is a prefix or an address.
func isPrefixText(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
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

// decodeRecord decodes one element of an array of format (not GitHub's
// meta: githubList).
func decodeRecord(dec *json.Decoder, format string) (jsonRecord, error) {
	if format == FormatFastlyJSON {
		var s string
		err := dec.Decode(&s)
		return jsonRecord{prefix: s}, err
	}
	// AWS names the prefix ip_prefix or ipv6_prefix and has a region;
	// Google ipv4Prefix or ipv6Prefix, and a scope.
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
