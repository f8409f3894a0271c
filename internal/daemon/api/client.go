package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoDaemon is returned when nothing listens on the socket.
var ErrNoDaemon = errors.New("no ipfence daemon on the socket")

// callTimeout bounds a call whose context has no deadline.
const callTimeout = 2 * time.Minute

// maxIdle bounds the connections a Client keeps open between calls.
const maxIdle = 64

// Client talks to the daemon over its Unix socket. It is safe for
// concurrent use; each call has a connection to itself, taken from a
// small pool of kept-alive ones. The zero value is not usable; use
// NewClient.
//
// The client speaks HTTP/1.1 on the connection itself rather than
// through net/http's Transport: a call is one write and one read on the
// caller's goroutine, with no hand-off to the Transport's reader and
// writer goroutines. Log watchers ban in bursts under attack, and on a
// small server the client's CPU competes with the daemon's.
type Client struct {
	socket string

	mu   sync.Mutex
	idle []*clientConn
}

type clientConn struct {
	c   net.Conn
	r   *bufio.Reader
	buf []byte // the request being written
}

// NewClient returns a client for the daemon listening on socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket}
}

// Close closes the connections kept open between calls.
func (c *Client) Close() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, cc := range idle {
		cc.c.Close()
	}
}

// Ban bans the request's prefixes.
func (c *Client) Ban(ctx context.Context, r BanRequest) (*BanResponse, error) {
	var out BanResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/bans", r, &out)
}

// Unban lifts the ban of exactly prefix; with an origin, only a ban made
// by that origin.
func (c *Client) Unban(ctx context.Context, prefix, origin string) (*UnbanResponse, error) {
	return c.UnbanForget(ctx, prefix, origin, false)
}

// UnbanForget is Unban that, with forget, also forgets the prefix's
// strike (bans: recidive): its next ban is not escalated.
func (c *Client) UnbanForget(ctx context.Context, prefix, origin string, forget bool) (*UnbanResponse, error) {
	var out UnbanResponse
	return &out, c.do(ctx, http.MethodDelete, deletePath("/v1/bans/", prefix, origin, forget), nil, &out)
}

// Allow makes the request's allow entries.
func (c *Client) Allow(ctx context.Context, r AllowRequest) (*AllowResponse, error) {
	var out AllowResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/allows", r, &out)
}

// Unallow removes the allow entry of exactly prefix; with an origin,
// only one made by that origin.
func (c *Client) Unallow(ctx context.Context, prefix, origin string) (*UnallowResponse, error) {
	var out UnallowResponse
	return &out, c.do(ctx, http.MethodDelete, deletePath("/v1/allows/", prefix, origin, false), nil, &out)
}

// Allows returns a page of allow entries.
func (c *Client) Allows(ctx context.Context, o ListOptions) (*AllowList, error) {
	var out AllowList
	return &out, c.do(ctx, http.MethodGet, "/v1/allows?"+o.query(), nil, &out)
}

// deletePath is the DELETE path under base of prefix, with its query.
func deletePath(base, prefix, origin string, forget bool) string {
	addr, bits, cut := strings.Cut(prefix, "/")
	path := base + url.PathEscape(addr)
	if cut {
		path += "/" + url.PathEscape(bits)
	}
	q := url.Values{}
	if origin != "" {
		q.Set("origin", origin)
	}
	if forget {
		q.Set("forget", "1")
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

// ListOptions filter and page List.
type ListOptions struct {
	Within, Origin string
	Offset, Limit  int
}

// List returns a page of bans.
func (c *Client) List(ctx context.Context, o ListOptions) (*BanList, error) {
	var out BanList
	return &out, c.do(ctx, http.MethodGet, "/v1/bans?"+o.query(), nil, &out)
}

// query is o as a URL query.
func (o ListOptions) query() string {
	q := url.Values{}
	if o.Within != "" {
		q.Set("within", o.Within)
	}
	if o.Origin != "" {
		q.Set("origin", o.Origin)
	}
	q.Set("offset", strconv.Itoa(o.Offset))
	q.Set("limit", strconv.Itoa(o.Limit))
	return q.Encode()
}

// Count returns the ban counts.
func (c *Client) Count(ctx context.Context) (*Counts, error) {
	var out Counts
	return &out, c.do(ctx, http.MethodGet, "/v1/bans/count", nil, &out)
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var out Status
	return &out, c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
}

// Reload makes the daemon load its policy and sources again.
func (c *Client) Reload(ctx context.Context) (*ReloadResponse, error) {
	var out ReloadResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/reload", nil, &out)
}

// ReloadTrial makes the daemon reload its policy on trial: unless
// Confirm comes within window, it loads the policy it ran before again.
func (c *Client) ReloadTrial(ctx context.Context, window time.Duration) (*ReloadResponse, error) {
	var out ReloadResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/reload?"+url.Values{"confirm": {window.String()}}.Encode(), nil, &out)
}

// Confirm keeps the reload on trial, or with rollback puts the policy
// before it back now.
func (c *Client) Confirm(ctx context.Context, rollback bool) (*ConfirmResponse, error) {
	var out ConfirmResponse
	path := "/v1/confirm"
	if rollback {
		path += "?rollback=1"
	}
	return &out, c.do(ctx, http.MethodPost, path, nil, &out)
}

// Explain says which rule (or ban) decides a packet from addr.
func (c *Client) Explain(ctx context.Context, addr, proto string, port int) (*Explanation, error) {
	q := url.Values{"addr": {addr}}
	if proto != "" {
		q.Set("proto", proto)
	}
	if port != 0 {
		q.Set("port", strconv.Itoa(port))
	}
	var out Explanation
	return &out, c.do(ctx, http.MethodGet, "/v1/explain?"+q.Encode(), nil, &out)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return fmt.Errorf("calling the daemon: bad path %q: %w", path, err)
	}
	var body []byte
	if in != nil {
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	status, data, err := c.roundTrip(ctx, method, u.RequestURI(), body)
	if err != nil {
		return err
	}
	if status >= 300 {
		e := &Error{Status: status}
		if json.Unmarshal(data, e) != nil || e.Message == "" {
			e.Code, e.Message = "internal", fmt.Sprintf("daemon answered %d %s: %s", status, http.StatusText(status), bytes.TrimSpace(data))
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the daemon's answer: %w", err)
	}
	return nil
}

// roundTrip sends one request and reads its answer. A kept-alive
// connection the daemon has closed meanwhile (idle timeout, restart)
// fails before any answer arrives; the call is then sent once more on a
// new connection. Every call of the API may be repeated: a ban again
// sets the same expiry, an unban of a lifted ban lifts nothing.
func (c *Client) roundTrip(ctx context.Context, method, uri string, body []byte) (int, []byte, error) {
	if err := ctxErr(ctx); err != nil {
		return 0, nil, fmt.Errorf("calling the daemon (%s %s): %w", method, uri, err)
	}
	if len(body) > MaxBody {
		return 0, nil, fmt.Errorf("calling the daemon (%s %s): a request of %d bytes is over the daemon's limit of %d; send it in parts", method, uri, len(body), MaxBody)
	}
	for retried := false; ; retried = true {
		cc, reused, err := c.get(ctx, retried)
		if err != nil {
			return 0, nil, err
		}
		status, data, keep, err := cc.call(ctx, method, uri, body)
		if err == nil {
			if keep {
				c.put(cc)
			} else {
				cc.c.Close()
			}
			return status, data, nil
		}
		cc.c.Close()
		if cerr := ctxErr(ctx); cerr != nil {
			err = cerr
		} else if reused && !retried && stale(err) {
			// The daemon closed it, so it closed the other idle ones
			// too (a restart, most likely): retry on a new connection.
			c.Close()
			continue
		}
		return 0, nil, fmt.Errorf("calling the daemon (%s %s): %w", method, uri, err)
	}
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline
// has passed even if its timer has not fired yet: the connection's
// deadline (the same instant) may fire first, and the caller must see
// why the call ended, not an i/o timeout.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// stale reports whether err is what a connection the daemon has closed
// gives before any answer.
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// get returns a kept-alive connection, or a new one (always when fresh).
func (c *Client) get(ctx context.Context, fresh bool) (*clientConn, bool, error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 && !fresh {
		cc := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cc, true, nil
	}
	c.mu.Unlock()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, false, fmt.Errorf("%w %s: %v", ErrNoDaemon, c.socket, err)
	}
	return &clientConn{c: conn, r: bufio.NewReaderSize(conn, 16<<10)}, false, nil
}

func (c *Client) put(cc *clientConn) {
	c.mu.Lock()
	if len(c.idle) < maxIdle {
		c.idle = append(c.idle, cc)
		cc = nil
	}
	c.mu.Unlock()
	if cc != nil {
		cc.c.Close()
	}
}

// aLongTimeAgo is a deadline that has passed: setting it interrupts a
// blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// call writes one HTTP/1.1 request on cc and reads the whole answer.
// keep reports whether the connection may carry another call.
func (cc *clientConn) call(ctx context.Context, method, uri string, body []byte) (status int, data []byte, keep bool, err error) {
	deadline := time.Now().Add(callTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := cc.c.SetDeadline(deadline); err != nil {
		return 0, nil, false, err
	}
	stop := context.AfterFunc(ctx, func() { cc.c.SetDeadline(aLongTimeAgo) })
	defer func() {
		// ctx was cancelled as the call ended: its deadline may land
		// on the connection at any moment, so no other call gets it.
		if !stop() {
			keep = false
		}
	}()

	b := append(cc.buf[:0], method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: ipfence\r\n"...)
	if method != http.MethodGet {
		if body != nil {
			b = append(b, "Content-Type: application/json\r\n"...)
		}
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	b = append(b, body...)
	cc.buf = b
	if cap(b) > 64<<10 { // a bulk call: do not keep its buffer
		cc.buf = nil
	}
	if _, err := cc.c.Write(b); err != nil {
		return 0, nil, false, err
	}
	// Nothing at all back (io.EOF) is a connection the daemon had
	// closed; http.ReadResponse would report it as a cut-short answer.
	if _, err := cc.r.Peek(1); err != nil {
		return 0, nil, false, err
	}
	resp, err := http.ReadResponse(cc.r, nil)
	if err != nil {
		return 0, nil, false, err
	}
	data, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, false, fmt.Errorf("reading the daemon's answer: %w", err)
	}
	return resp.StatusCode, data, !resp.Close, nil
}
