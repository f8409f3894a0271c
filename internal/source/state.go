package source

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// ShrinkError reports a load refused by the shrink gate: the source's
// prefix count fell by more than Spec.MaxShrink against the last Commit.
type ShrinkError struct {
	Source    string
	From, To  int     // prefixes (both families) of the last good load and of this one
	MaxShrink float64 // the share allowed
}

func (e *ShrinkError) Error() string {
	return gateMessage(e.Source, "shrank", e.From, e.To, "", e.MaxShrink, "max_shrink")
}

// gateMessage is a gate's refusal: "source S shrank from 100 to 40
// prefixes (-60%), more than the allowed 50%; ..."; sign prefixes the
// percentages of growth.
func gateMessage(source, verb string, from, to int, sign string, allowed float64, key string) string {
	return fmt.Sprintf("source %s %s from %s to %s prefixes (%s%d%%), more than the allowed %s%s%%; "+
		"the last good copy stays in force; raise %s or check the feed",
		source, verb, thousands(from), thousands(to), sign,
		int(math.Round(float64(to-from)/float64(max(from, 1))*100)),
		sign, strconv.FormatFloat(allowed*100, 'f', -1, 64), key)
}

// GrowthError reports a load refused by the growth gate: the source's
// prefix count rose by more than Spec.MaxGrowth against the last Commit
// (a feed that suddenly lists far more than it did is more likely broken
// or poisoned than right).
type GrowthError struct {
	Source    string
	From, To  int     // prefixes (both families) of the last good load and of this one
	MaxGrowth float64 // the share allowed
}

func (e *GrowthError) Error() string {
	return gateMessage(e.Source, "grew", e.From, e.To, "+", e.MaxGrowth, "max_growth")
}

// thousands formats n with commas: 41205 → "41,205".
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// goodState is StateDir/sources/NAME.json: the last good load of a source.
type goodState struct {
	Name       string    `json:"name"`
	Format     string    `json:"format"`
	PrefixesV4 int       `json:"prefixes_v4"`
	PrefixesV6 int       `json:"prefixes_v6"`
	Committed  time.Time `json:"committed"`
}

// nsKey names Namespace in the state folder as package statedir does
// (netns.Key); "" for the current namespace.
func (l *Loader) nsKey() string {
	if l.Namespace == "" {
		return ""
	}
	return netns.Key(l.Namespace)
}

// statePath is where the last good load of source name is recorded.
func (l *Loader) statePath(name string) string {
	if ns := l.nsKey(); ns != "" {
		return filepath.Join(l.StateDir, "sources", "@"+ns, name+".json")
	}
	return filepath.Join(l.StateDir, "sources", name+".json")
}

// goodExt is the extension of a URL's committed copy in the cache:
// ".good" for the current namespace, ".good@NS" for namespace NS.
func (l *Loader) goodExt() string {
	if ns := l.nsKey(); ns != "" {
		return ".good@" + ns
	}
	return ".good"
}

// lastGood returns the state of the last Commit of source name, nil if
// there is none.
func (l *Loader) lastGood(name string) (*goodState, error) {
	// Not sources/NAME.json, the record from before state was per
	// namespace, for another namespace: any namespace may have written
	// it, and its gate would refuse this one's loads for good. A
	// namespace's first load after the upgrade is ungated, as any first
	// load.
	path := l.statePath(name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("source %s: reading its last good state: %w", name, err)
	}
	var st goodState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("source %s: reading its last good state: %s is corrupt (%v); delete it to accept the next load whatever its size", name, path, err)
	}
	return &st, nil
}

// gate applies the shrink and growth gates to src and returns the
// source to use: src if it passes. If it changed too much and has URLs,
// their committed copies are tried instead: that stale load is returned
// if it passes.
func (l *Loader) gate(ctx context.Context, spec Spec, src *Source) (*Source, error) {
	shrink, growth := spec.MaxShrink, spec.MaxGrowth
	if shrink == 0 {
		shrink = DefaultMaxShrink
	}
	if growth == 0 {
		growth = DefaultMaxGrowth
	}
	if l.StateDir == "" || shrink < 0 && growth < 0 {
		return src, nil
	}
	last, err := l.lastGood(spec.Name)
	if err != nil {
		return nil, err
	}
	if last == nil {
		return src, nil // never committed
	}
	from := last.PrefixesV4 + last.PrefixesV6
	check := func(s *Source) error {
		to := s.n4 + s.n6
		switch {
		case shrink >= 0 && from > 0 && float64(from-to)/float64(from) > shrink:
			return &ShrinkError{Source: spec.Name, From: from, To: to, MaxShrink: shrink}
		case growth >= 0 && to > GrowthFloor && float64(to-from) > growth*float64(from):
			return &GrowthError{Source: spec.Name, From: from, To: to, MaxGrowth: growth}
		}
		return nil
	}
	gerr := check(src)
	if gerr == nil {
		return src, nil
	}
	if len(spec.URLs) == 0 {
		return nil, gerr
	}
	old, err := l.load(ctx, spec, true)
	if err != nil || check(old) != nil {
		return nil, gerr
	}
	old.stale = append(append(old.stale, src.stale...), gerr)
	return old, nil
}

// Commit records src as the last good load of its source: its prefix
// counts, against which the next load's shrink is measured, and for each
// URL the cached copy it was read from (KEY.good), which a load refused by
// the shrink gate falls back on. Apply calls it once the kernel has
// accepted src. With no StateDir it does nothing.
//
// It fails if the state cannot be written, or if a cached copy src was
// read from has changed since (load again, then commit).
func (l *Loader) Commit(src *Source) error {
	if l.StateDir == "" {
		return nil
	}
	for _, c := range src.cached {
		base, fresh := strings.CutSuffix(c.path, ".data")
		if !fresh {
			continue // read from the committed copy already
		}
		good := base + l.goodExt()
		if err := copyVerified(c.path, good, c.digest); err != nil {
			return fmt.Errorf("committing source %s: keeping the download of %s: %w", src.name, c.url, err)
		}
	}
	st := goodState{Name: src.name, Format: src.format, PrefixesV4: src.n4, PrefixesV6: src.n6, Committed: time.Now().UTC()}
	path := l.statePath(src.name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("committing source %s: %w", src.name, err)
	}
	if err := writeJSON(path, st); err != nil {
		return fmt.Errorf("committing source %s: %w", src.name, err)
	}
	return nil
}

// errChanged is returned by Commit when a cached copy changed after the
// load (a later load replaced it).
var errChanged = errors.New("changed since the source was loaded")

// copyVerified atomically copies src to dst if src's SHA-256 is digest.
func copyVerified(src, dst string, digest [32]byte) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	tmp, err := writeTemp(filepath.Dir(dst), func(w io.Writer) error {
		_, err := io.Copy(io.MultiWriter(w, h), f)
		return err
	})
	if err != nil {
		return err
	}
	if [32]byte(h.Sum(nil)) != digest {
		os.Remove(tmp)
		return fmt.Errorf("%s %w; load the source again, then commit", src, errChanged)
	}
	return commitFile(tmp, dst)
}

// writeJSON atomically replaces path with v as indented JSON.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := writeTemp(filepath.Dir(path), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return err
	}
	return commitFile(tmp, path)
}

// writeTemp writes a new temporary file in dir with fill, syncs it to
// disk and returns its path. On error nothing is left behind.
func writeTemp(dir string, fill func(io.Writer) error) (string, error) {
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// commitFile renames the synced temporary file tmp to path and syncs the
// directory, so that path is either the old or the new file, even after a
// crash.
func commitFile(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
