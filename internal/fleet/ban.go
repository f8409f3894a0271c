package fleet

import (
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"net/netip"
	"time"
)

// Ban is a fleet-wide ban, or the lifting of one, as published on the
// bans stream: every agent applies it with the time it has left. A
// fleet-wide allow entry (or its removal: Unban) is a Ban too, signed as
// an allow (SignAllow) with the policy key, on the allows stream.
type Ban struct {
	Prefix netip.Prefix `json:"prefix"`
	Unban  bool         `json:"unban,omitempty"`
	// Created orders the messages of one prefix: an agent ignores one
	// older than the last it applied for the prefix.
	Created time.Time `json:"created"`
	// Expires is when the ban ends; zero is for good.
	Expires time.Time `json:"expires,omitzero"`
	Reason  string    `json:"reason,omitempty"`
	// Origin says who banned: a host, a person, a tool.
	Origin string `json:"origin,omitempty"`
}

// SignBan signs b with priv.
func SignBan(b *Ban, priv ed25519.PrivateKey) ([]byte, error) { return sign(kindBan, b, priv) }

// VerifyBan returns the ban in data if pub signed it.
func VerifyBan(data []byte, pub ed25519.PublicKey) (*Ban, error) {
	return verifyEntry(kindBan, data, pub)
}

// SignAllow signs a, a fleet-wide allow entry, with priv (the policy
// key): a signed allow is never taken for a ban, nor the other way.
func SignAllow(a *Ban, priv ed25519.PrivateKey) ([]byte, error) { return sign(kindAllow, a, priv) }

// VerifyAllow returns the allow entry in data if pub signed it.
func VerifyAllow(data []byte, pub ed25519.PublicKey) (*Ban, error) {
	return verifyEntry(kindAllow, data, pub)
}

// verifyEntry returns the ban or allow entry (kind) in data if pub
// signed it.
func verifyEntry(kind string, data []byte, pub ed25519.PublicKey) (*Ban, error) {
	var b Ban
	if err := open(kind, data, pub, true, &b); err != nil {
		return nil, err
	}
	if !b.Prefix.IsValid() {
		return nil, fmt.Errorf("%w: a %s without a prefix", ErrSignature, kind)
	}
	return &b, nil
}

// Remaining is the time b has left at now, and whether it is in force
// (a ban for good has 0 left and is).
func (b *Ban) Remaining(now time.Time) (time.Duration, bool) {
	if b.Unban {
		return 0, false
	}
	if b.Expires.IsZero() {
		return 0, true
	}
	left := b.Expires.Sub(now)
	return left, left > 0
}

// BanToken is p as one token of a NATS subject, the same for every
// spelling of p: the address bytes in hex and the length. The bans
// stream keeps the last message per subject, so a ban and its unban
// replace each other.
func BanToken(p netip.Prefix) string {
	p = p.Masked()
	return fmt.Sprintf("%s_%d", hex.EncodeToString(p.Addr().AsSlice()), p.Bits())
}
