package broker

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ipfence/ipfence/internal/fleet"
)

// PublishBan signs b with priv and publishes it on the bans stream,
// where it replaces the prefix's previous ban or unban and expires with
// the ban. An unban lives as long as the ban it lifts had left, so that
// an agent offline meanwhile still learns of it.
func (h *Hub) PublishBan(ctx context.Context, b *fleet.Ban, priv ed25519.PrivateKey) error {
	subject := BanSubject(b.Prefix)
	var ttl time.Duration
	if b.Unban {
		msg, err := h.directLast(ctx, BanStream, subject)
		if errors.Is(err, ErrNotStored) {
			return fmt.Errorf("%w: no fleet ban of %s in force", ErrNoRevision, b.Prefix)
		}
		if err != nil {
			return fmt.Errorf("reading the ban of %s: %w", b.Prefix, err)
		}
		prev, err := fleet.VerifyBan(msg.data, priv.Public().(ed25519.PublicKey))
		if err != nil {
			return err
		}
		// An unban must come after the ban it lifts, even when the ban's
		// writer's clock runs ahead: agents order a prefix's messages by
		// their time.
		if !b.Created.After(prev.Created) {
			b.Created = prev.Created.Add(time.Millisecond)
		}
		if left, live := prev.Remaining(b.Created); !live {
			return fmt.Errorf("%w: the fleet ban of %s is not in force", ErrNoRevision, b.Prefix)
		} else if left > 0 {
			ttl = left
		}
	} else if !b.Expires.IsZero() {
		ttl = b.Expires.Sub(b.Created)
	}
	data, err := fleet.SignBan(b, priv)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, max(ttl, time.Second).String())
	}
	if err := h.publishStored(ctx, m); err != nil {
		return fmt.Errorf("publishing the ban of %s: %w", b.Prefix, err)
	}
	return nil
}

// BanSubject is the subject a ban or unban of p is published on. A
// message read on another subject is not p's, whatever it says: it
// could push p's real ban out of the stream's last-per-subject.
func BanSubject(p netip.Prefix) string { return banSubjects + fleet.BanToken(p) }

// FollowBans calls fn with every ban message in force on the stream,
// then with each new one as it arrives, until ctx is done; after a
// reconnect it reads the stream again (fn may see a message twice, and
// an older one after a newer: the caller orders by the signed time). It
// subscribes and reads with direct gets: an agent may make no consumer.
func (h *Hub) FollowBans(ctx context.Context, fn func(subject string, data []byte)) error {
	ch := make(chan *nats.Msg, 4096)
	reconnects := h.nc.Stats().Reconnects
	sub, err := h.nc.ChanSubscribe(bansStored+">", ch)
	if err != nil {
		return fmt.Errorf("following the fleet bans: %w", err)
	}
	defer sub.Unsubscribe()
	// Subscribed first, then read: nothing published in between is lost.
	if err := h.directEach(ctx, BanStream, banSubjects+">", func(m *directMsg) error {
		fn(m.subject, m.data)
		return nil
	}); err != nil {
		return fmt.Errorf("following the fleet bans: %w", err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			// The stream's copy: the subject it was stored under is the
			// server's header, after any the writer set.
			fn(header(m.Header, "Nats-Subject"), m.Data)
		case <-tick.C:
			// Messages published while away are in the stream only: start
			// over (the caller calls again).
			if h.nc.Stats().Reconnects != reconnects {
				return fmt.Errorf("following the fleet bans: NATS reconnected")
			}
			if dropped, err := sub.Dropped(); err == nil && dropped > 0 {
				return fmt.Errorf("following the fleet bans: %d messages dropped", dropped)
			}
		}
	}
}
