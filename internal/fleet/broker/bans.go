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
	return h.publishEntry(ctx, bansOf, b, priv)
}

// PublishAllow is PublishBan for a fleet-wide allow entry (or its
// removal), signed with priv, the policy key, on the allows stream: only
// publishers may write there.
func (h *Hub) PublishAllow(ctx context.Context, a *fleet.Ban, priv ed25519.PrivateKey) error {
	return h.publishEntry(ctx, allowsOf, a, priv)
}

// entries is a stream of signed entries: the bans or the allow entries.
type entries struct {
	stream, subjects, what string
	sign                   func(*fleet.Ban, ed25519.PrivateKey) ([]byte, error)
	verify                 func([]byte, ed25519.PublicKey) (*fleet.Ban, error)
}

var (
	bansOf   = entries{BanStream, banSubjects, "ban", fleet.SignBan, fleet.VerifyBan}
	allowsOf = entries{AllowStream, allowSubjects, "allow entry", fleet.SignAllow, fleet.VerifyAllow}
)

// publishEntry publishes b on es (see PublishBan).
func (h *Hub) publishEntry(ctx context.Context, es entries, b *fleet.Ban, priv ed25519.PrivateKey) error {
	subject := es.subjects + fleet.BanToken(b.Prefix)
	var ttl time.Duration
	if b.Unban {
		msg, err := h.directLast(ctx, es.stream, subject)
		if errors.Is(err, ErrNotStored) {
			return fmt.Errorf("%w: no fleet %s of %s in force", ErrNoRevision, es.what, b.Prefix)
		}
		if err != nil {
			return fmt.Errorf("reading the %s of %s: %w", es.what, b.Prefix, err)
		}
		prev, err := es.verify(msg.data, priv.Public().(ed25519.PublicKey))
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
			return fmt.Errorf("%w: the fleet %s of %s is not in force", ErrNoRevision, es.what, b.Prefix)
		} else if left > 0 {
			ttl = left
		}
	} else if !b.Expires.IsZero() {
		ttl = b.Expires.Sub(b.Created)
	}
	data, err := es.sign(b, priv)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, max(ttl, time.Second).String())
	}
	if err := h.publishStored(ctx, m); err != nil {
		if es.stream == AllowStream && errors.Is(err, nats.ErrNoResponders) {
			err = fmt.Errorf("%w (the stream %s: `ipfence server` makes it at start, unless the fleet account's storage is too small; its log says so)", err, AllowStream)
		}
		return fmt.Errorf("publishing the %s of %s: %w", es.what, b.Prefix, err)
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
	h.follow(ctx, bansOf, period, fn, failed)
}

// FollowAllows is FollowBans for the allows stream.
func (h *Hub) FollowAllows(ctx context.Context, period time.Duration, fn func(data []byte), failed func(error)) {
	h.follow(ctx, allowsOf, period, fn, failed)
}

// follow follows es (see FollowBans).
func (h *Hub) follow(ctx context.Context, es entries, period time.Duration, fn func(data []byte), failed func(error)) {
	each := func(data []byte) error {
		fn(data)
		return nil
	}
	var next uint64
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		var err error
		if next, err = h.directEach(ctx, es.stream, es.subjects+">", next, each); err != nil && ctx.Err() == nil {
			failed(fmt.Errorf("following the fleet stream %s: %w", es.stream, err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
