package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/nats-io/nats.go"
	"strings"

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

// Statuses returns every agent's last status.
func (h *Hub) Statuses(ctx context.Context) ([]fleet.Status, error) {
	var out []fleet.Status
	err := h.each(ctx, StatusBucket, "host.>", func(key string, v []byte) error {
		// An agent may write anything under its key: a status that does
		// not read, or names another host, is reported as such.
		host := strings.TrimPrefix(key, "host.")
		var s fleet.Status
		if err := json.Unmarshal(v, &s); err != nil {
			s = fleet.Status{Host: host, Unreadable: fmt.Sprintf("not a status: %v", err)}
		} else if s.Host != host {
			s = fleet.Status{Host: host, Unreadable: fmt.Sprintf("written for host %q", s.Host)}
		}
		if s.Unreadable != "" {
			s.LastError = "unreadable status: " + s.Unreadable
		}
		out = append(out, s)
		return nil
	})
	return out, err
}
