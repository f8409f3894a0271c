package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/ipfence/ipfence/internal/fleet"
)

// PutStatus writes s as its host's status (an agent may write its own
// key only).
func (h *Hub) PutStatus(ctx context.Context, s *fleet.Status) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encoding the status: %w", err)
	}
	if err := h.publishStored(ctx, &nats.Msg{Subject: "$KV." + StatusBucket + "." + hostKey(s.Host), Data: data}); err != nil {
		return fmt.Errorf("writing the status: %w", err)
	}
	return nil
}

// Statuses returns every agent's last status. It lists the status keys
// from the stream's information and reads each with a message get,
// whose answer is JSON: an agent may store anything under its key, and
// headers of its making would confuse a watch (a "Status: 100" is taken
// for a heartbeat) or a direct get.
func (h *Hub) Statuses(ctx context.Context) ([]fleet.Status, error) {
	rctx, cancel := context.WithTimeout(ctx, 6*h.timeout)
	defer cancel()
	st, err := h.js.Stream(rctx, statusStream)
	if err != nil {
		return nil, fmt.Errorf("%w: bucket %s: %v", ErrNATS, StatusBucket, err)
	}
	prefix := "$KV." + StatusBucket + ".host."
	info, err := st.Info(rctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("listing the statuses: %w", err)
	}
	subjects := slices.Sorted(maps.Keys(info.State.Subjects))
	out := make([]*fleet.Status, len(subjects))
	var g errgroup.Group
	g.SetLimit(32)
	for i, subj := range subjects {
		g.Go(func() error {
			s, err := h.status(rctx, strings.TrimPrefix(subj, prefix), subj)
			out[i] = s
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var sts []fleet.Status
	for _, s := range out {
		if s != nil {
			sts = append(sts, *s)
		}
	}
	return sts, nil
}

// status reads host's status, stored under subj (nil: deleted). A
// status that does not read, or names another host, is reported as
// such.
func (h *Hub) status(ctx context.Context, host, subj string) (*fleet.Status, error) {
	req, _ := json.Marshal(struct {
		Last string `json:"last_by_subj"`
	}{subj})
	m, err := h.nc.RequestWithContext(ctx, defaultAPI+".STREAM.MSG.GET."+statusStream, req)
	if err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", host, err)
	}
	var r struct {
		Message *struct {
			Subject string `json:"subject"`
			Hdrs    []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	switch err := json.Unmarshal(m.Data, &r); {
	case err != nil:
		return nil, fmt.Errorf("reading the status of %s: %w", host, err)
	case r.Error != nil && r.Error.Code == 404:
		return nil, nil
	case r.Error != nil:
		return nil, fmt.Errorf("reading the status of %s: %s", host, r.Error.Description)
	case r.Message == nil || r.Message.Subject != subj:
		return nil, fmt.Errorf("reading the status of %s: not its message", host)
	case kvDeleted(r.Message.Hdrs):
		return nil, nil // deleted or purged
	}
	var s fleet.Status
	if err := json.Unmarshal(r.Message.Data, &s); err != nil {
		s = fleet.Status{Host: host, Unreadable: fmt.Sprintf("not a status: %v", err)}
	} else if s.Host != host {
		s = fleet.Status{Host: host, Unreadable: fmt.Sprintf("written for host %q", s.Host)}
	}
	if s.Unreadable != "" {
		s.LastError = "unreadable status: " + s.Unreadable
	}
	return &s, nil
}

// kvDeleted reports whether a KV message's header block (hdrs, as
// stored) marks the key deleted or purged.
func kvDeleted(hdrs []byte) bool {
	for line := range strings.Lines(string(hdrs)) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if ok && k == "KV-Operation" {
			switch strings.TrimSpace(v) {
			case "DEL", "PURGE":
				return true
			}
		}
	}
	return false
}
