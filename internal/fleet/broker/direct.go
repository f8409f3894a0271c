package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// Agents and ban writers reach JetStream through their account's
// imports only (see Init): reads through the relay (relay.go), and
// publishing statuses and bans. They read and write with the raw
// requests below, not with jetstream's clients, which need stream info
// and consumers.

// directPage is how many messages one direct get request returns.
const directPage = 256

// ErrNotStored is returned by directLast when the stream holds no
// message on the subject.
var ErrNotStored = errors.New("no message stored")

// header is the last value of key in h: a direct get answer carries the
// stored message's own headers first, then the server's, and a client
// may have stored any header (a Nats-Sequence of its own making).
func header(h nats.Header, key string) string {
	if v := h.Values(key); len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// directMsg is one message of a direct get answer.
type directMsg struct {
	subject string
	data    []byte
	hdr     nats.Header
}

// errStatus is a direct get answer that is a status, not a message
// (404: nothing, 408: a bad request, 429: the relay is busy).
type errStatus struct{ code, desc string }

func (e *errStatus) Error() string { return "status " + e.code + " " + e.desc }

// parseDirect reads a direct get answer of stream: a message (with the
// server's Nats-Stream, which a status has not), or an *errStatus.
func parseDirect(m *nats.Msg, stream string) (*directMsg, error) {
	if header(m.Header, "Nats-Stream") == "" {
		return nil, &errStatus{code: m.Header.Get("Status"), desc: m.Header.Get("Description")}
	}
	if s := header(m.Header, "Nats-Stream"); s != stream {
		return nil, fmt.Errorf("reading %s: an answer from stream %q", stream, s)
	}
	if seq, err := strconv.ParseUint(header(m.Header, "Nats-Sequence"), 10, 64); err != nil || seq == 0 {
		return nil, fmt.Errorf("reading %s: a message without a valid sequence", stream)
	}
	return &directMsg{subject: header(m.Header, "Nats-Subject"), data: m.Data, hdr: m.Header}, nil
}

// read sends a read of stream to the JetStream API, or through the
// relay, with its answers to reply ("": a request, whose answer is
// returned).
func (h *Hub) read(ctx context.Context, r readRequest, reply string) (*nats.Msg, error) {
	subject, body := relaySubject, []byte(nil)
	if h.relay {
		body, _ = json.Marshal(&r)
	} else if r.Last != "" {
		subject = defaultAPI + ".DIRECT.GET." + r.Stream + "." + r.Last
	} else {
		subject = defaultAPI + ".DIRECT.GET." + r.Stream
		body = batchRequest(r.Seq, r.Next)
	}
	if reply != "" {
		return nil, h.nc.PublishRequest(subject, reply, body)
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	return h.nc.RequestWithContext(rctx, subject, body)
}

// batchRequest is a direct get of the messages on next from seq on: at
// most directPage of them and directBytes, without headers.
func batchRequest(seq uint64, next string) []byte {
	b, _ := json.Marshal(struct {
		Seq      uint64 `json:"seq"`
		Next     string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes"`
		NoHdr    bool   `json:"no_hdr"`
	}{max(seq, 1), next, directPage, directBytes, true})
	return b
}

// directLast returns the last message stream holds on subject
// (ErrNotStored: none). Through the relay, a ban comes without headers.
func (h *Hub) directLast(ctx context.Context, stream, subject string) (*directMsg, error) {
	m, err := h.read(ctx, readRequest{Stream: stream, Last: subject}, "")
	if err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", subject, stream, err)
	}
	if len(m.Header) == 0 {
		return &directMsg{subject: subject, data: m.Data}, nil
	}
	d, err := parseDirect(m, stream)
	var st *errStatus
	switch {
	case errors.As(err, &st) && st.code == "404":
		return nil, ErrNotStored
	case err != nil:
		return nil, fmt.Errorf("reading %s from %s: %w", subject, stream, err)
	case d.subject != subject:
		return nil, fmt.Errorf("reading %s from %s: got a message of %q", subject, stream, d.subject)
	}
	return d, nil
}

// directEach calls fn with the data of every message of stream whose
// subject matches filter, from sequence from on, in stream order, read
// with batched direct gets: no consumer is made, so a user allowed only
// to read (an agent) can. It returns the sequence to go on from next
// time. The answers carry no headers (no_hdr): a writer may have stored
// a header block of its own making (a blank line in it hides the
// server's headers after it), so only the server's status answers have
// headers, and the sequence to go on from is the end of a batch's. fn's
// error stops the walk and is returned.
func (h *Hub) directEach(ctx context.Context, stream, filter string, from uint64, fn func(data []byte) error) (uint64, error) {
	inbox := h.nc.NewInbox()
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		return from, fmt.Errorf("reading %s: %w", stream, err)
	}
	defer sub.Unsubscribe()
	for {
		if _, err := h.read(ctx, readRequest{Stream: stream, Seq: from, Next: filter}, inbox); err != nil {
			return from, fmt.Errorf("reading %s: %w", stream, err)
		}
		next, more, err := h.directPage(ctx, sub, stream, from, fn)
		if err != nil {
			return from, err
		}
		if next > from || next == 1 {
			from = next
		}
		if !more {
			return from, nil
		}
	}
}

// directBytes bounds the data of one batch.
const directBytes = 1 << 20

// directPage reads one batch's answers, asked from sequence from: the
// sequence after its last message (0: none; 1: start over, the stream
// ends before from), and whether more are pending.
func (h *Hub) directPage(ctx context.Context, sub *nats.Subscription, stream string, from uint64, fn func(data []byte) error) (uint64, bool, error) {
	for n := 0; ; n++ {
		rctx, cancel := h.ctx(ctx)
		m, err := sub.NextMsgWithContext(rctx)
		cancel()
		if err != nil {
			return 0, false, fmt.Errorf("reading %s: %w", stream, err)
		}
		if len(m.Header) == 0 { // a message's data
			if n >= directPage {
				return 0, false, fmt.Errorf("reading %s: more answers than the batch asked for", stream)
			}
			if err := fn(m.Data); err != nil {
				return 0, false, err
			}
			continue
		}
		switch st := m.Header.Get("Status"); st {
		case "404": // nothing (more) matches
			// The relay says where the stream ends: before from, it was
			// made again.
			if last, err := strconv.ParseUint(m.Header.Get(lastSeqHeader), 10, 64); err == nil && last+1 < from {
				return 1, false, nil
			}
			return 0, false, nil
		case "204": // end of the batch
			last, err := strconv.ParseUint(m.Header.Get("Nats-Last-Sequence"), 10, 64)
			if err != nil || last == 0 {
				return 0, false, fmt.Errorf("reading %s: the end of a batch without its last sequence", stream)
			}
			// Without headers the server counts what was pending before
			// the batch, the batch's messages included.
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return last + 1, pending > uint64(n), nil
		default:
			return 0, false, fmt.Errorf("reading %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
	}
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// ErrRefused is returned when JetStream refused a message.
var ErrRefused = errors.New("the fleet's NATS refused the message")

// publishStored publishes m and waits for the stream to store it.
func (h *Hub) publishStored(ctx context.Context, m *nats.Msg) error {
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	r, err := h.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		// The server refuses a subject the user may not publish on
		// apart from the request, which then times out: say why.
		if le := h.nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) && strings.Contains(le.Error(), m.Subject) {
			return fmt.Errorf("%w: %v", ErrRefused, le)
		}
		return err
	}
	var ack pubAck
	if err := json.Unmarshal(r.Data, &ack); err != nil {
		return fmt.Errorf("%w: an answer that is no acknowledgement: %v", ErrRefused, err)
	}
	if ack.Error != nil {
		return fmt.Errorf("%w: %s (code %d)", ErrRefused, ack.Error.Description, ack.Error.ErrCode)
	}
	if ack.Seq == 0 {
		return fmt.Errorf("%w: not stored", ErrRefused)
	}
	return nil
}
