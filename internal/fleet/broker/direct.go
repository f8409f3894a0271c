package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// directPage is how many messages one direct get request returns.
const directPage = 256

// directEach calls fn with every message of stream whose subject matches
// filter, in stream order, read with batched direct gets: no consumer is
// made, so a user allowed only to read (an agent) can. fn's error stops
// the walk and is returned.
func (h *Hub) directEach(ctx context.Context, stream, filter string, fn func(subject string, data []byte) error) error {
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
		if err := h.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		more, next, err := h.directPage(ctx, sub, stream, fn)
		if err != nil || !more {
			return err
		}
		seq = next
	}
}

// directPage reads one batch's answers: whether more follow, and from
// which sequence.
func (h *Hub) directPage(ctx context.Context, sub *nats.Subscription, stream string, fn func(subject string, data []byte) error) (bool, uint64, error) {
	var last uint64
	for n := 0; ; n++ {
		rctx, cancel := h.ctx(ctx)
		m, err := sub.NextMsgWithContext(rctx)
		cancel()
		if err != nil {
			return false, 0, fmt.Errorf("reading %s: %w", stream, err)
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "404": // nothing (more) matches
			return false, 0, nil
		case "204": // end of this batch
			if np, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64); np == 0 || n == 0 {
				return false, 0, nil
			}
			return true, last + 1, nil
		default:
			return false, 0, fmt.Errorf("reading %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil || seq <= last {
			return false, 0, fmt.Errorf("reading %s: a message without a valid sequence", stream)
		}
		last = seq
		if err := fn(m.Header.Get("Nats-Subject"), m.Data); err != nil {
			return false, 0, err
		}
	}
}
