package api

import (
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
	"time"
)

// ErrNoDaemon is returned when nothing listens on the socket.
var ErrNoDaemon = errors.New("no ipfence daemon on the socket")

// Client talks to the daemon over its Unix socket. The zero value is not
// usable; use NewClient.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Ban bans the request's prefixes.
func (c *Client) Ban(ctx context.Context, r BanRequest) (*BanResponse, error) {
	var out BanResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/bans", r, &out)
}

// Unban lifts the ban of exactly prefix.
func (c *Client) Unban(ctx context.Context, prefix string) (*UnbanResponse, error) {
	var out UnbanResponse
	return &out, c.do(ctx, http.MethodDelete, "/v1/bans/"+prefix, nil, &out)
}

// ListOptions filter and page List.
type ListOptions struct {
	Within, Origin string
	Offset, Limit  int
}

// List returns a page of bans.
func (c *Client) List(ctx context.Context, o ListOptions) (*BanList, error) {
	q := url.Values{}
	if o.Within != "" {
		q.Set("within", o.Within)
	}
	if o.Origin != "" {
		q.Set("origin", o.Origin)
	}
	q.Set("offset", strconv.Itoa(o.Offset))
	q.Set("limit", strconv.Itoa(o.Limit))
	var out BanList
	return &out, c.do(ctx, http.MethodGet, "/v1/bans?"+q.Encode(), nil, &out)
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
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://ipfence"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" {
			return fmt.Errorf("%w %s: %v", ErrNoDaemon, c.socket, err)
		}
		return fmt.Errorf("calling the daemon (%s %s): %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the daemon's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Message == "" {
			e.Code, e.Message = "internal", fmt.Sprintf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(data))
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
