package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/prefix"
	"go4.org/netipx"
)

// Loader reads sources. The zero value reads files and the embedded data,
// keeps no state (no shrink or growth gate) and cannot read URLs. A Loader is safe
// for concurrent use by loads of different sources.
type Loader struct {
	// StateDir holds the gates' record of each source's last good
	// load (sources/NAME.json) and the download cache (cache/NAME/). ""
	// means no state: no gates, and URLs cannot be used.
	StateDir string
	// Client downloads URLs; nil means one with sensible timeouts.
	Client *http.Client
	// Logger gets a warning whenever a cached copy stands in for a
	// download; nil discards.
	Logger *slog.Logger
	// Namespace is the network namespace the sources are loaded for (""
	// for the current one): the gates' record and the committed copies
	// are kept per namespace, so that a policy applied in one namespace
	// does not gate, or fall back on, what was applied in another.
	// Downloads are cached once for all.
	Namespace string
	// Offline reads URLs from their last good (committed) copies only and
	// downloads nothing: for restoring the ruleset at boot, before the
	// network is up.
	Offline bool
}

// maxFiles is how many paths and URLs a source can have: rows keep the
// index of their file in 16 bits.
const maxFiles = 1<<16 - 1

// SpecError reports a Spec that cannot be loaded as written.
type SpecError struct {
	Source  string // Spec.Name
	Problem string
}

func (e *SpecError) Error() string { return fmt.Sprintf("source %q: %s", e.Source, e.Problem) }

// Load reads every path and URL of spec into a Source.
//
// It fails with a *SpecError for a malformed spec; with an error naming
// the file and line for bad input (wrapping a *ParseError or
// *prefix.ParseError) or naming the file that cannot be opened; with a
// *DownloadError for a URL that cannot be downloaded and has no cached
// copy; with a *LimitError for input over the spec's byte or entry limit
// and a *BroadError for a list row broader than /8 or /16 (see
// Spec.MaxBytes); and with a *ShrinkError or *GrowthError when the prefix
// count fell or rose by more than spec.MaxShrink or spec.MaxGrowth
// against the last Commit. A URL whose download fails, does not parse or
// is over a limit is read from its cached copy instead (a download is
// cached only once it has been read within the limits), and so is every
// URL when the fresh load trips a gate but the copies committed last do
// not: Load then succeeds with a stale Source (see Source.Stale) and
// logs a warning. Every error starts with "source NAME".
//
// Every error is an *Error naming the source (its Unwrap gives the errors
// above).
func (l *Loader) Load(ctx context.Context, spec Spec) (*Source, error) {
	start := time.Now()
	if err := l.check(spec); err != nil {
		return nil, &Error{Source: spec.Name, Err: err}
	}
	src, err := l.load(ctx, spec, false)
	var le *LimitError
	if errors.As(err, &le) && le.File == allFiles && len(spec.URLs) > 0 {
		// Each download within the limits, together over max_entries: the
		// copies committed last, as for a source that trips a gate.
		if old, oerr := l.load(ctx, spec, true); oerr == nil && old.rows() <= spec.limits().entries {
			old.stale = append(old.stale, err)
			src, err = old, nil
		}
	}
	if err != nil {
		return nil, &Error{Source: spec.Name, Err: err, prefix: true}
	}
	if src, err = l.gate(ctx, spec, src); err != nil {
		return nil, &Error{Source: spec.Name, Err: err}
	}
	for _, e := range src.stale {
		l.logger().Warn("source is stale: using cached copies", "source", spec.Name, "reason", e)
	}
	l.logger().Debug("source loaded", "source", spec.Name, "format", spec.Format,
		"rows_v4", src.rows4, "rows_v6", src.rows6, "kept_v4", src.v4.n, "kept_v6", src.v6.n, "prefixes_v4", src.n4, "prefixes_v6", src.n6,
		"elapsed", time.Since(start))
	return src, nil
}

// allFiles is LimitError.File for a source's rows together.
const allFiles = "all files"

// rows is the number of rows read into s, both families.
func (s *Source) rows() int { return s.rows4 + s.rows6 }

// Error is an error of Load: which source failed, and why.
type Error struct {
	Source string
	Err    error
	prefix bool // the message of Err does not name the source yet
}

func (e *Error) Error() string {
	if e.prefix {
		return "source " + e.Source + ": " + e.Err.Error()
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrorNames reports whether err is (or wraps) a Load error of the
// source named name.
func ErrorNames(err error, name string) bool {
	var e *Error
	return errors.As(err, &e) && e.Source == name
}

// IsBuiltin reports whether a Spec path names data embedded in ipfence.
func IsBuiltin(path string) bool { return strings.HasPrefix(path, BuiltinPrefix) }

func (l *Loader) logger() *slog.Logger {
	if l.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Logger
}

// check validates spec.
func (l *Loader) check(spec Spec) error {
	bad := func(format string, args ...any) error {
		return &SpecError{Source: spec.Name, Problem: fmt.Sprintf(format, args...)}
	}
	if !validName(spec.Name) {
		return bad("a source name is 1 to 100 letters, digits, '.', '_' and '-', not starting with '.'")
	}
	if !slices.Contains(Formats(), spec.Format) {
		return bad("unknown format %q: use %s", spec.Format, strings.Join(Formats(), ", "))
	}
	if err := CheckPicks(spec.Format, spec.Services, spec.Regions); err != nil {
		return bad("%v", err)
	}
	if len(spec.Paths) == 0 && len(spec.URLs) == 0 {
		return bad("no paths and no URLs: nothing to read")
	}
	if n := len(spec.Paths) + len(spec.URLs); n > maxFiles {
		return bad("%d paths and URLs, more than the %d a source can have: split it", n, maxFiles)
	}
	for _, p := range spec.Paths {
		if b, ok := strings.CutPrefix(p, BuiltinPrefix); ok {
			if b != geo.IPv4 && b != geo.IPv6 {
				return bad("unknown embedded file %q: use %s%s or %s%s", p, BuiltinPrefix, geo.IPv4, BuiltinPrefix, geo.IPv6)
			}
			if spec.Format != FormatCountryCSV {
				return bad("embedded file %s has format %s, not %s", p, FormatCountryCSV, spec.Format)
			}
		}
	}
	for _, u := range spec.URLs {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return bad("%q is not an http or https URL", RedactURL(u))
		}
	}
	if ns := l.nsKey(); ns != "" && (strings.ContainsAny(ns, "/\x00") || ns == "." || ns == ".." || ns[0] == '.') {
		return bad("namespace %q cannot name a state folder", l.Namespace)
	}
	if len(spec.URLs) > 0 && l.StateDir == "" {
		return bad("URLs need a state directory to cache their downloads in")
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 100 || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// load reads spec's files and URLs, in parallel; with committed, every URL
// is read from the copy last committed (or, lacking one, the latest cached
// copy) without going to the network.
func (l *Loader) load(ctx context.Context, spec Spec, committed bool) (*Source, error) {
	src := &Source{name: spec.Name, format: spec.Format}
	n := len(spec.Paths) + len(spec.URLs)
	results := make([]inputResult, n)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i := range n {
		file := uint16(i) // check keeps n <= maxFiles
		var read func() inputResult
		if i < len(spec.Paths) {
			p := spec.Paths[i]
			name := p
			if b, ok := strings.CutPrefix(p, BuiltinPrefix); ok {
				name = b
			}
			src.files = append(src.files, name)
			read = func() (r inputResult) {
				r.part, r.err = readPath(p, spec.Format, name, file, spec.limits())
				return r
			}
		} else {
			u := spec.URLs[i-len(spec.Paths)]
			src.files = append(src.files, RedactURL(u))
			read = func() inputResult { return l.readURL(ctx, spec, u, file, committed) }
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				results[i].err = err
				return
			}
			results[i] = read()
		})
	}
	wg.Wait()

	var parts []*part
	rows := 0
	for _, r := range results {
		if r.err != nil {
			return nil, r.err // the first in the order of the spec
		}
		if rows += r.part.rows(); rows > spec.limits().entries {
			return nil, &LimitError{File: allFiles, What: "entries", Limit: int64(spec.limits().entries), Key: "max_entries"}
		}
		parts = append(parts, r.part)
		if r.stale != nil {
			src.stale = append(src.stale, r.stale)
		}
		if r.cached != nil {
			src.cached = append(src.cached, *r.cached)
		}
	}
	src.finish(parts)
	return src, nil
}

// inputResult is what reading one path or URL gave.
type inputResult struct {
	part   *part
	cached *cachedCopy // the cached download read, for a URL
	stale  error       // why a URL was read from its cache
	err    error
}

// readPath reads a file or an embedded file.
func readPath(path, format, name string, file uint16, lim limits) (*part, error) {
	var f io.ReadCloser
	var err error
	if b, ok := strings.CutPrefix(path, BuiltinPrefix); ok {
		f, err = geo.Open(b)
	} else {
		f, err = os.Open(path)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	return readPart(f, format, name, file, lim)
}

// readFile reads a local file (a cached download), its rows shown as
// coming from name, and returns the SHA-256 of its bytes.
func readFile(path, format, name string, file uint16, lim limits) (*part, [32]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, [32]byte{}, err
	}
	defer f.Close()
	h := newHashReader(f)
	p, err := readPart(h, format, name, file, lim)
	if err != nil {
		return nil, [32]byte{}, err
	}
	if _, err := io.Copy(io.Discard, h); err != nil {
		return nil, [32]byte{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return p, h.sum(), nil
}

// finish joins the parts into sorted tables and builds the set of
// everything.
func (s *Source) finish(parts []*part) {
	p4, p6 := make([]chunks[k4], len(parts)), make([]chunks[k6], len(parts))
	for i, p := range parts {
		p4[i], p6[i] = p.v4, p.v6
		s.rows4 += p.rows4
		s.rows6 += p.rows6
	}
	// What the rows say is counted while they are a slice, before the
	// table packs them (reading them back costs a pass each).
	// The set itself is built when a rule takes it (Set, Countries):
	// a daemon keeps the rows, for explain and for the loads that reuse
	// the source, and a second copy of them as a set would cost more
	// (48 bytes a range) than building it again.
	e4, e6 := join(p4), join(p6)
	s.n4, s.n6 = tally(e4, s), tally(e6, s)
	s.v4.pack(e4)
	s.v6.pack(e6)
	s.names = packNames(parts)
}

// tally marks the countries and ASNs of es in s and returns how many
// prefixes the minimal cover of es has.
func tally[K key[K]](es []entry[K], s *Source) (prefixes int) {
	for i := range es {
		if es[i].cc < numCodes {
			s.present[es[i].cc], s.hasCountry = true, true
		}
		if es[i].asn != 0 {
			s.hasASN = true
		}
	}
	unionRanges(slices.Values(es), nil, func(r netipx.IPRange) { prefixes += prefix.CountRange(r) })
	return prefixes
}
