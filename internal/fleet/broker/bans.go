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
// then with each new one, read every period, until ctx is done. It
// reads in batches from where the last read ended (an agent makes no
// consumer and subscribes to nothing but its inbox), and after a
// failed read (passed to failed) goes on from there; it reads the whole
// stream again only when it was made again. fn may see a message twice,
// and an older one after a newer: the caller orders a prefix's
// messages by their signed time. The messages come without the subject
// they were stored under: fn goes by the signed prefix.
func (h *Hub) FollowBans(ctx context.Context, period time.Duration, fn func(data []byte), failed func(error)) {
	each := func(data []byte) error {
		fn(data)
		return nil
	}
	var next uint64
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		var err error
		if next, err = h.directEach(ctx, BanStream, banSubjects+">", next, each); err != nil && ctx.Err() == nil {
			failed(fmt.Errorf("following the fleet bans: %w", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
