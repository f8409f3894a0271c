package broker

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ipfence/ipfence/internal/fleet"
)

// PutStatus writes s as its host's status.
func (h *Hub) PutStatus(ctx context.Context, s *fleet.Status) error {
	kv, err := h.kv(ctx, StatusBucket)
	if err != nil {
		return err
	}
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encoding the status: %w", err)
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	if _, err := kv.Put(rctx, hostKey(s.Host), data); err != nil {
		return fmt.Errorf("writing the status: %w", err)
	}
	return nil
}

// Statuses returns every agent's last status.
func (h *Hub) Statuses(ctx context.Context) ([]fleet.Status, error) {
	var out []fleet.Status
	err := h.each(ctx, StatusBucket, "host.>", func(key string, v []byte) error {
		var s fleet.Status
		if err := json.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("status %s: %w", key, err)
		}
		out = append(out, s)
		return nil
	})
	return out, err
}
