package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Agents and ban writers reach JetStream through their account's
// imports only (see Init): direct gets, and publishing statuses and
// bans. They read and write with the raw requests below, not with
// jetstream's clients, which need stream info and consumers.

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
	seq     uint64
	data    []byte
	hdr     nats.Header
}

// errStatus is a direct get answer that is a status, not a message
// (404: nothing, 204: end of a batch, 408: a bad request).
type errStatus struct {
	code, desc string
	pending    uint64
}

func (e *errStatus) Error() string { return "status " + e.code + " " + e.desc }

// parseDirect reads a direct get answer of stream: a message (with the
// server's Nats-Stream, which a status has not), or an *errStatus.
func parseDirect(m *nats.Msg, stream string) (*directMsg, error) {
	if header(m.Header, "Nats-Stream") == "" {
		st := &errStatus{code: m.Header.Get("Status"), desc: m.Header.Get("Description")}
		st.pending, _ = strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
		return nil, st
	}
	if s := header(m.Header, "Nats-Stream"); s != stream {
		return nil, fmt.Errorf("reading %s: an answer from stream %q", stream, s)
	}
	seq, err := strconv.ParseUint(header(m.Header, "Nats-Sequence"), 10, 64)
	if err != nil || seq == 0 {
		return nil, fmt.Errorf("reading %s: a message without a valid sequence", stream)
	}
	return &directMsg{subject: header(m.Header, "Nats-Subject"), seq: seq, data: m.Data, hdr: m.Header}, nil
}

// directLast returns the last message stream holds on subject
// (ErrNotStored: none).
func (h *Hub) directLast(ctx context.Context, stream, subject string) (*directMsg, error) {
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	m, err := h.nc.RequestWithContext(rctx, h.api+".DIRECT.GET."+stream+"."+subject, nil)
	if err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", subject, stream, err)
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

// directEach calls fn with every message of stream whose subject matches
// filter, in stream order, read with batched direct gets: no consumer is
// made, so a user allowed only to read (an agent) can. fn's error stops
// the walk and is returned.
func (h *Hub) directEach(ctx context.Context, stream, filter string, fn func(m *directMsg) error) error {
	inbox := h.nc.NewInbox()
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("reading %s: %w", stream, err)
	}
	defer sub.Unsubscribe()
	for seq := uint64(1); ; {
		req, _ := json.Marshal(struct {
			Seq   uint64 `json:"seq"`
			Next  string `json:"next_by_subj"`
			Batch int    `json:"batch"`
		}{seq, filter, directPage})
		if err := h.nc.PublishRequest(h.api+".DIRECT.GET."+stream, inbox, req); err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		next, err := h.directPage(ctx, sub, stream, seq, fn)
		if err != nil || next == 0 {
			return err
		}
		seq = next
	}
}

// directPage reads one batch's answers, from sequence from on: the
// sequence to go on from, 0 when done.
func (h *Hub) directPage(ctx context.Context, sub *nats.Subscription, stream string, from uint64, fn func(m *directMsg) error) (uint64, error) {
	last := from - 1
	for {
		rctx, cancel := h.ctx(ctx)
		m, err := sub.NextMsgWithContext(rctx)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", stream, err)
		}
		d, err := parseDirect(m, stream)
		var st *errStatus
		switch {
		case errors.As(err, &st) && st.code == "404": // nothing (more) matches
			return 0, nil
		case errors.As(err, &st) && st.code == "204": // end of this batch
			if st.pending == 0 || last < from {
				return 0, nil
			}
			return last + 1, nil
		case err != nil:
			return 0, fmt.Errorf("reading %s: %w", stream, err)
		case d.seq <= last:
			// The server answers in stream order: a sequence that does not
			// grow is not its answer.
			return 0, fmt.Errorf("reading %s: sequence %d after %d", stream, d.seq, last)
		}
		last = d.seq
		if err := fn(d); err != nil {
			return 0, err
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
