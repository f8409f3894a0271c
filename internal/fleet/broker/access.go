package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Role is what a NATS user of the fleet may do. Users are NATS JWTs
// signed by the fleet's account key (Init writes it, Issue uses it): the
// server checks each user's permissions itself.
type Role string

const (
	// Publisher stores bundles, moves pointers, reads statuses and sets
	// up the buckets: the fleet's administrator (and `ipfence server`'s
	// own setup connection).
	Publisher Role = "publisher"
	// Agent reads pointers, bundles and bans, and writes its own host's
	// status, nothing else. It creates no consumers: a push consumer's
	// deliver subject is not checked against its creator's permissions,
	// so a consumer could copy one stream's messages into another
	// (pointers into group keys, anything onto a ban's subject). Agents
	// read with direct gets and plain subscriptions instead.
	Agent Role = "agent"
	// Bans publishes fleet bans and reads the ban it lifts, nothing else.
	Bans Role = "bans"
)

// Roles lists the roles.
var Roles = []Role{Publisher, Agent, Bans}

// ErrRole is returned for an unknown role.
var ErrRole = errors.New("unknown role")

// ParseRole returns the role s names.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("%w %q: use publisher, agent or bans", ErrRole, s)
}

// The streams behind the buckets, as JetStream names them.
const (
	policyStream = "KV_" + PolicyBucket
	statusStream = "KV_" + StatusBucket
	bundleStream = "OBJ_" + BundleStore
)

// Permissions are r's subjects for a user whose NATS public key is
// upub, and for an agent, the host it writes the status of. Replies
// reach each user on its own inbox prefix (Inbox), so that no user reads
// another's replies.
func (r Role) Permissions(upub, host string) (jwt.Permissions, error) {
	var p jwt.Permissions
	inbox := Inbox(upub) + ".>"
	info := func(streams ...string) {
		for _, s := range streams {
			p.Pub.Allow.Add("$JS.API.STREAM.INFO." + s)
		}
	}
	direct := func(streams ...string) {
		for _, s := range streams {
			p.Pub.Allow.Add("$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>", "$JS.API.STREAM.MSG.GET."+s)
		}
	}
	switch r {
	case Publisher:
		// Everything in the fleet's account: it is the fleet's owner.
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
		return p, nil
	case Agent:
		if err := CheckName("host", host); err != nil {
			return p, err
		}
		info(policyStream, statusStream, bundleStream, BanStream)
		direct(policyStream, bundleStream, BanStream)
		p.Pub.Allow.Add("$KV." + StatusBucket + "." + hostKey(host))
		p.Sub.Allow.Add(inbox, "$KV."+PolicyBucket+".group.>", banSubjects+">")
	case Bans:
		info(BanStream)
		direct(BanStream)
		p.Pub.Allow.Add(banSubjects + ">")
		p.Sub.Allow.Add(inbox)
	default:
		return p, fmt.Errorf("%w %q", ErrRole, r)
	}
	return p, nil
}

// Inbox is the inbox prefix of the user whose public key is upub.
func Inbox(upub string) string { return "_INBOX." + upub }

// userLimits are a role's per-connection limits: agents and ban writers
// send small messages only.
func (r Role) limits() jwt.NatsLimits {
	l := jwt.NatsLimits{Subs: jwt.NoLimit, Data: jwt.NoLimit, Payload: jwt.NoLimit}
	switch r {
	case Agent:
		l.Subs, l.Payload = 256, 64<<10
	case Bans:
		l.Subs, l.Payload = 64, 16<<10
	}
	return l
}

// Issue makes the credentials (a .creds file's bytes) of a user of role
// r named name, signed by the account key akp; an agent's name is its
// host. expires 0 is never.
func Issue(akp nkeys.KeyPair, r Role, name string, expires time.Duration, now time.Time) ([]byte, error) {
	if err := CheckName("user", name); err != nil {
		return nil, err
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("making a user key: %w", err)
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("making a user key: %w", err)
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = string(r) + ":" + name
	uc.IssuedAt = now.Unix()
	if expires > 0 {
		uc.Expires = now.Add(expires).Unix()
	}
	if uc.Permissions, err = r.Permissions(upub, name); err != nil {
		return nil, err
	}
	uc.Limits.NatsLimits = r.limits()
	uc.Tags.Add("ipfence-role:"+string(r), "ipfence-name:"+strings.ToLower(name))
	ujwt, err := uc.Encode(akp)
	if err != nil {
		return nil, fmt.Errorf("signing the user: %w", err)
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, fmt.Errorf("making a user key: %w", err)
	}
	return jwt.FormatUserConfig(ujwt, seed)
}

// CredsUser returns the public key of the user in a .creds file.
func CredsUser(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the NATS credentials: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("%s: not NATS credentials: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("%s: not NATS user credentials: %w", path, err)
	}
	return uc.Subject, nil
}
