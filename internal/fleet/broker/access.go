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
// signed by their role's account key (Init writes them, Issue uses
// them): the server checks each user's permissions itself.
//
// Publishers live in the fleet's account, which holds the streams.
// Agents and ban writers live in accounts of their own, without
// JetStream, which import only what they may use: JetStream answers a
// request on the reply subject its sender names, and inside the fleet's
// account that subject could be any stream's or an API call (a direct
// get answered to $JS.API.STREAM.DELETE.X deletes X). Across an import
// the answer can only go back to the importing account.
type Role string

const (
	// Publisher stores bundles, moves pointers, reads statuses and sets
	// up the buckets: the fleet's administrator (and `ipfence server`'s
	// own setup connection).
	Publisher Role = "publisher"
	// Agent reads pointers, bundles and bans (direct gets and
	// subscriptions: no consumer, whose deliver subject nobody checks)
	// and writes its own host's status, nothing else.
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

// Permissions are r's subjects, in its account, for a user whose NATS
// public key is upub, and for an agent, the host it writes the status
// of. Replies reach each user on its own inbox prefix (Inbox). The
// accounts' imports (Init) bound the same a second time.
func (r Role) Permissions(upub, host string) (jwt.Permissions, error) {
	var p jwt.Permissions
	inbox := Inbox(upub) + ".>"
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
		// Reads through the relay, and its own status key. Its inbox only:
		// all agents share their account, and any could aim answers at a
		// subject they all followed.
		p.Pub.Allow.Add(relaySubject, "$KV."+StatusBucket+"."+hostKey(host))
		p.Sub.Allow.Add(inbox)
	case Bans:
		p.Pub.Allow.Add(relaySubject, banSubjects+"*")
		p.Sub.Allow.Add(inbox)
	default:
		return p, fmt.Errorf("%w %q", ErrRole, r)
	}
	return p, nil
}

// exports are what the fleet's account offers the agents' and ban
// writers' accounts, and imports what each takes: reads through the
// relay (answers of several messages), and writing a status or a ban
// (a publish acknowledged). Host names may have dots: a status key is
// host.> (an agent's permission names its own).
func exports() jwt.Exports {
	var e jwt.Exports
	e.Add(&jwt.Export{Name: "agents' reads", Subject: relaySubject + ".agent", Type: jwt.Service, ResponseType: jwt.ResponseTypeStream},
		&jwt.Export{Name: "ban writers' reads", Subject: relaySubject + ".bans", Type: jwt.Service, ResponseType: jwt.ResponseTypeStream},
		&jwt.Export{Name: "status", Subject: jwt.Subject("$KV." + StatusBucket + ".host.>"), Type: jwt.Service},
		&jwt.Export{Name: "bans", Subject: jwt.Subject(banSubjects + "*"), Type: jwt.Service})
	return e
}

func imports(r Role, fleet string) jwt.Imports {
	var im jwt.Imports
	// Each role's reads reach the relay on a subject of their own: the
	// relay serves a ban writer the bans stream only.
	// Share: the relay learns who reads, to keep one reader from holding
	// its queue.
	im.Add(&jwt.Import{Name: "reads", Account: fleet, Type: jwt.Service, Subject: jwt.Subject(relaySubject + "." + string(r)),
		LocalSubject: jwt.RenamingSubject(relaySubject), Share: true})
	switch r {
	case Agent:
		im.Add(&jwt.Import{Name: "status", Account: fleet, Type: jwt.Service, Subject: jwt.Subject("$KV." + StatusBucket + ".host.>")})
	case Bans:
		im.Add(&jwt.Import{Name: "bans", Account: fleet, Type: jwt.Service, Subject: jwt.Subject(banSubjects + "*")})
	}
	return im
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
// r named name, signed by its role's account key akp; an agent's name
// is its host. expires 0 is never.
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
	uc.Tags.Add(roleTag + string(r))
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

// roleTag starts the tag that names a user's role in its JWT.
const roleTag = "ipfence-role:"

// userRole is the role uc's tag names ("" for none: a user of another
// tool's making, which gets the fleet account's API).
func userRole(uc *jwt.UserClaims) Role {
	for _, t := range uc.Tags {
		if r, ok := strings.CutPrefix(t, roleTag); ok {
			return Role(r)
		}
	}
	return ""
}

// CredsUser returns the public key of the user in a .creds file.
func CredsUser(path string) (string, error) {
	uc, err := credsClaims(path)
	if err != nil {
		return "", err
	}
	return uc.Subject, nil
}

// credsClaims reads the user JWT of a .creds file.
func credsClaims(path string) (*jwt.UserClaims, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the NATS credentials: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("%s: not NATS credentials: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return nil, fmt.Errorf("%s: not NATS user credentials: %w", path, err)
	}
	return uc, nil
}
