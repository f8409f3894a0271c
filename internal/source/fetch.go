package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Downloads are cached per source in StateDir/cache/NAME/, per URL under a
// key derived from the URL:
//
//	KEY.data   the latest download that parsed
//	KEY.json   its metadata: URL, ETag, Last-Modified, time, SHA-256
//	KEY.good   the copy of KEY.data last committed (see Loader.Commit);
//	           KEY.good@NS for network namespace NS (Loader.Namespace)
//
// Only a download that parses replaces KEY.data, so the cache never holds
// a copy that cannot be read.

// DownloadTimeout bounds one download, from the request to the last
// byte, with the default client.
const DownloadTimeout = 3 * time.Minute

// maxDownload bounds the size of one download.
const maxDownload = 1 << 30

// DownloadError reports a URL that could not be downloaded.
type DownloadError struct {
	URL    string
	Status int // the HTTP status, 0 when there was no response
	Err    error
}

func (e *DownloadError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("downloading %s: server answered %d %s", e.URL, e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("downloading %s: %v", e.URL, e.Err)
}

// Unwrap returns e.Err.
func (e *DownloadError) Unwrap() error { return e.Err }

// cacheMeta is KEY.json.
type cacheMeta struct {
	URL          string    `json:"url"`
	ETag         string    `json:"etag,omitempty"`
	LastModified string    `json:"last_modified,omitempty"`
	Fetched      time.Time `json:"fetched"`
	SHA256       string    `json:"sha256"`
}

// cachedCopy records a cached file a Source was read from, for Commit.
type cachedCopy struct {
	url    string
	path   string // KEY.data or KEY.good
	digest [32]byte
}

// cachePaths returns the cache directory of source name and the path of
// rawURL's files without their extension.
func (l *Loader) cachePaths(name, rawURL string) (dir, base string) {
	sum := sha256.Sum256([]byte(rawURL))
	dir = filepath.Join(l.StateDir, "cache", name)
	return dir, filepath.Join(dir, hex.EncodeToString(sum[:8]))
}

var defaultClient = &http.Client{
	// A download has this long in all, answer and body: a feed that
	// stalls or drips one line a second is given up (and the last good
	// copy used) instead of holding a refresh for good.
	Timeout: DownloadTimeout,
	Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	},
	// net/http sends the previous URL, query string included, as the
	// Referer of a redirect: a feed's key would reach the next host.
	CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		req.Header.Del("Referer")
		return nil
	},
}

func (l *Loader) client() *http.Client {
	if l.Client != nil {
		return l.Client
	}
	return defaultClient
}

// readURL reads rawURL: downloaded afresh if it changed, else (or if the
// download fails or does not parse) from the cache. With committed, it
// reads the committed copy without going to the network.
func (l *Loader) readURL(ctx context.Context, spec Spec, rawURL string, file uint16, committed bool) inputResult {
	dir, base := l.cachePaths(spec.Name, rawURL)
	shown := RedactURL(rawURL)
	data := base + ".data"
	if committed || l.Offline {
		// This namespace's committed copy, else the one committed before
		// state was per namespace, else the latest download.
		path := base + l.goodExt()
		for _, p := range []string{base + ".good", data} {
			if _, err := os.Stat(path); err == nil {
				break
			}
			path = p
		}
		return readCached(spec, shown, path, file)
	}
	meta := readMeta(base + ".json")
	_, err := os.Stat(data)
	haveCache := err == nil
	if haveCache && meta != nil && meta.URL == rawURL && spec.MinAge > 0 && time.Since(meta.Fetched) < spec.MinAge {
		// Asked too recently: the publisher allows one download per
		// MinAge (a compile or explain run again and again would
		// otherwise hit its limit and be blocked).
		return readCached(spec, shown, data, file)
	}

	res, why := l.download(ctx, spec, rawURL, dir, base, file, haveCache, meta)
	if why == nil {
		return res
	}
	if !haveCache {
		return inputResult{err: fmt.Errorf("%w; there is no cached copy to fall back on", why)}
	}
	when := "at an unknown time"
	if meta != nil {
		when = "on " + meta.Fetched.UTC().Format(time.RFC3339)
	}
	res = readCached(spec, shown, data, file)
	res.stale = fmt.Errorf("%w; using the copy downloaded %s", why, when)
	return res
}

// readCached reads the cached copy at path of the URL shown as shown
// (RedactURL).
func readCached(spec Spec, shown, path string, file uint16) inputResult {
	p, digest, err := readFile(path, spec.Format, shown, file, spec.limits())
	if err != nil {
		return inputResult{err: fmt.Errorf("reading the cached copy of %s (%s): %w", shown, path, err)}
	}
	return inputResult{part: p, cached: &cachedCopy{url: shown, path: path, digest: digest}}
}

// download fetches rawURL and reads it. When why is nil, res holds the
// URL's rows (fresh, or cached and unchanged, or an error reading the
// cache); else why says what went wrong: a *DownloadError or the parse
// error of the download.
func (l *Loader) download(ctx context.Context, spec Spec, rawURL, dir, base string, file uint16, haveCache bool, meta *cacheMeta) (res inputResult, why error) {
	shown := RedactURL(rawURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return res, &DownloadError{URL: shown, Err: redactErr(err, shown)}
	}
	req.Header.Set("User-Agent", "ipfence")
	if haveCache && meta != nil && meta.URL == rawURL {
		if meta.ETag != "" {
			req.Header.Set("If-None-Match", meta.ETag)
		}
		if meta.LastModified != "" {
			req.Header.Set("If-Modified-Since", meta.LastModified)
		}
	}
	resp, err := l.client().Do(req)
	if err != nil {
		return res, &DownloadError{URL: shown, Err: redactErr(err, shown)}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && haveCache:
		return readCached(spec, shown, base+".data", file), nil
	case resp.StatusCode != http.StatusOK:
		return res, &DownloadError{URL: shown, Status: resp.StatusCode}
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return inputResult{err: fmt.Errorf("creating the download cache: %w", err)}, nil
	}
	// A download larger than the source's byte limit decompresses to as
	// much or more (gzip only adds a few bytes to what it cannot
	// compress): stop at the limit rather than fill the disk.
	limit := min(maxDownload, spec.limits().bytes)
	tmp, err := writeTemp(dir, func(w io.Writer) error {
		n, err := io.Copy(w, io.LimitReader(resp.Body, limit+1))
		if err == nil && n > limit {
			err = &LimitError{File: shown, What: "bytes downloaded", Limit: limit, Key: "max_bytes"}
		}
		if err != nil {
			return &DownloadError{URL: shown, Err: redactErr(err, shown)}
		}
		return nil
	})
	var de *DownloadError
	if errors.As(err, &de) {
		return res, err
	} else if err != nil {
		return inputResult{err: fmt.Errorf("writing to the download cache: %w", err)}, nil
	}
	defer os.Remove(tmp) // no-op once renamed
	p, digest, err := readFile(tmp, spec.Format, shown, file, spec.limits())
	if err != nil {
		return res, fmt.Errorf("the download of %s does not parse: %w", shown, err)
	}
	if err := commitFile(tmp, base+".data"); err != nil {
		return inputResult{err: fmt.Errorf("writing to the download cache: %w", err)}, nil
	}
	m := cacheMeta{
		URL:          rawURL,
		ETag:         resp.Header.Get("ETag"),
		LastModified: resp.Header.Get("Last-Modified"),
		Fetched:      time.Now().UTC(),
		SHA256:       hex.EncodeToString(digest[:]),
	}
	// The metadata only saves a download next time: losing it is harmless.
	if err := writeJSON(base+".json", m); err != nil {
		l.logger().Warn("cannot record download metadata", "source", spec.Name, "url", shown, "err", err)
	}
	return inputResult{part: p, cached: &cachedCopy{url: shown, path: base + ".data", digest: digest}}, nil
}

// readMeta returns the cache metadata at path, or nil if it is missing or
// unreadable (the next download is then unconditional).
func readMeta(path string) *cacheMeta {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var m cacheMeta
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return &m
}

// hashReader computes the SHA-256 of what is read through it.
type hashReader struct {
	r io.Reader
	h hash.Hash
}

func newHashReader(r io.Reader) *hashReader { return &hashReader{r: r, h: sha256.New()} }

func (h *hashReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	return n, err
}

func (h *hashReader) sum() (d [32]byte) {
	h.h.Sum(d[:0])
	return d
}

// RedactURL returns rawURL as ipfence shows it in messages, logs,
// origins and fleet bundles: without its password (or its user name when
// it has no password: a token passed as https://TOKEN@host/) and with
// every query value replaced by "xxxxx" (feeds pass keys both ways).
// Unparsable URLs are shown as "(unparsable URL)".
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"xxxxx"}
		}
		u.RawQuery = q.Encode()
	}
	if u.User != nil {
		// A token is often the user name, with no password or an empty
		// one: then the user name is not shown either.
		if pw, _ := u.User.Password(); pw == "" {
			u.User = url.User("xxxxx")
		}
	}
	return u.Redacted()
}

// redactErr is err with the URL of a *url.Error (net/http's, which
// keeps query strings) replaced by shown.
func redactErr(err error, shown string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = shown
	}
	return err
}
