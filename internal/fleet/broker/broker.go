// Package broker is the fleet's NATS JetStream side: where publishers put
// bundles and move pointers, agents watch them and report, and fleet-wide
// bans travel. It holds no policy logic (package fleet does) and runs
// against an embedded server (Serve) or any NATS cluster with JetStream.
//
// What lives where:
//   - KV bucket ipfence_policy: key group.NAME, the group's signed pointer,
//     with history (rollback reads it);
//   - object store ipfence_bundles: bundles under their digest;
//   - KV bucket ipfence_status: key host.NAME, each agent's status;
//   - stream IPFENCE_BANS: subjects ipfence.bans.TOKEN, the last signed
//     ban or unban per prefix, each message expiring with its ban;
//   - stream IPFENCE_ALLOWS: subjects ipfence.allows.TOKEN, the same for
//     fleet-wide allow entries, signed with the policy key and written
//     by publishers only (ban writers may not).
package broker

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the buckets and the stream.
const (
	PolicyBucket  = "ipfence_policy"
	BundleStore   = "ipfence_bundles"
	StatusBucket  = "ipfence_status"
	BanStream     = "IPFENCE_BANS"
	banSubjects   = "ipfence.bans."
	AllowStream   = "IPFENCE_ALLOWS"
	allowSubjects = "ipfence.allows."
	maxAllows     = 1 << 12 // fleet allow entries in force (16 MiB of the account's storage)
	policyHistory = 64
	maxBanMsg     = 4 << 10 // a signed ban is well under 1 KiB
	maxBans       = 1 << 20 // fleet bans in force
	maxStatusMsg  = 64 << 10
)

// Options say how to reach NATS.
type Options struct {
	URL   string // nats://host:4222, several comma-separated
	Creds string // a .creds file (NATS accounts/JWT)
	// CA, Cert and Key are PEM files for TLS: the CA that signed the
	// servers' certificates, and this client's certificate and key.
	CA, Cert, Key string
	// Name is the connection's name in the server's monitoring.
	Name string
	// Replicas is how many copies a cluster keeps of the buckets and
	// the stream this client creates (1 on a single server).
	Replicas int
	// Timeout bounds each request (default 10s).
	Timeout time.Duration
}

// Hub is a connection to the fleet's JetStream.
type Hub struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	timeout time.Duration
	// relay: reads go through `ipfence server`'s relay (agents and ban
	// writers, whose accounts import nothing else).
	relay bool
	// noAllows is why Setup could not make the allows stream (nil: it
	// could, or did not run).
	noAllows error
}

// NoAllows is why Setup could not make the allows stream, nil if it
// did: the fleet then runs without fleet-wide allow entries.
func (h *Hub) NoAllows() error { return h.noAllows }

// defaultAPI starts the JetStream API subjects.
const defaultAPI = "$JS.API"

// ErrNATS is returned when NATS or its JetStream cannot be reached.
var ErrNATS = errors.New("NATS unreachable")

// Connect connects to NATS. With retry, a server not up yet is not an
// error: the connection keeps trying in the background (an agent keeps
// its last good revision meanwhile), as it does after every disconnect.
func Connect(o Options, retry bool, extra ...nats.Option) (*Hub, error) {
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}
	if retry {
		opts = append(opts, nats.RetryOnFailedConnect(true))
	}
	relay := false
	if o.Creds != "" {
		uc, err := credsClaims(o.Creds)
		if err != nil {
			return nil, err
		}
		// Replies on the user's own inbox: its permissions allow no other.
		opts = append(opts, nats.UserCredentials(o.Creds), nats.CustomInboxPrefix(Inbox(uc.Subject)))
		r := userRole(uc)
		relay = r == Agent || r == Bans
	}
	if o.CA != "" {
		opts = append(opts, nats.RootCAs(o.CA))
	}
	if o.Cert != "" || o.Key != "" {
		opts = append(opts, nats.ClientCert(o.Cert, o.Key))
	}
	nc, err := nats.Connect(o.URL, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v (is `ipfence server` or your NATS cluster running? --nats)", ErrNATS, o.URL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: %v", ErrNATS, err)
	}
	h := &Hub{nc: nc, js: js, timeout: o.Timeout, relay: relay}
	if h.timeout <= 0 {
		h.timeout = 10 * time.Second
	}
	return h, nil
}

// Close closes the connection.
func (h *Hub) Close() { h.nc.Close() }

// Connected reports whether the connection is up now.
func (h *Hub) Connected() bool { return h.nc.IsConnected() }

// Setup creates the buckets, the object store and the stream that do
// not exist yet, with replicas copies each in a cluster; existing ones
// are left as their operator set them.
func (h *Hub) Setup(ctx context.Context, replicas int) error {
	replicas = max(replicas, 1)
	steps := []setupStep{
		{PolicyBucket, func(c context.Context) error { _, err := h.js.KeyValue(c, PolicyBucket); return err },
			func(c context.Context) error {
				_, err := h.js.CreateKeyValue(c, jetstream.KeyValueConfig{Bucket: PolicyBucket, History: policyHistory,
					Description: "ipfence: signed revision pointer per host group", Storage: jetstream.FileStorage, Replicas: replicas})
				return err
			}},
		{StatusBucket, func(c context.Context) error { _, err := h.js.KeyValue(c, StatusBucket); return err },
			func(c context.Context) error {
				_, err := h.js.CreateKeyValue(c, jetstream.KeyValueConfig{Bucket: StatusBucket, History: 1,
					Description: "ipfence: agent status", Storage: jetstream.FileStorage, Replicas: replicas})
				return err
			}},
		{BundleStore, func(c context.Context) error { _, err := h.js.ObjectStore(c, BundleStore); return err },
			func(c context.Context) error {
				_, err := h.js.CreateObjectStore(c, jetstream.ObjectStoreConfig{Bucket: BundleStore,
					Description: "ipfence: policy bundles by digest", Storage: jetstream.FileStorage, Replicas: replicas})
				return err
			}},
		h.entryStream(BanStream, banSubjects, "ipfence: fleet-wide bans, the last per prefix", maxBans, replicas, jetstream.DiscardOld),
		// Full, it refuses new entries rather than forget one: a lost
		// removal would leave an allow open.
		h.entryStream(AllowStream, allowSubjects, "ipfence: fleet-wide allow entries, the last per prefix", maxAllows, replicas, jetstream.DiscardNew),
	}
	for _, s := range steps {
		rctx, cancel := h.ctx(ctx)
		err := s.exists(rctx)
		if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			err = s.create(rctx)
		}
		cancel()
		if err != nil && s.name == AllowStream {
			// Added after fleets were made: an account whose storage
			// (server init --max-disk) cannot hold it still runs the
			// rest; publishing an allow entry says why.
			h.noAllows = err
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: setting up %s: %v", ErrNATS, s.name, err)
		}
	}
	return h.harden(ctx)
}

// setupStep is a bucket or stream Setup makes unless it exists.
type setupStep struct {
	name   string
	exists func(context.Context) error
	create func(context.Context) error
}

// entryStream is the setup of a stream of signed entries (bans, allow
// entries): subjects under prefix, the last message per subject, each
// with its own TTL, read by direct gets, at most max of them.
func (h *Hub) entryStream(name, prefix, description string, max int64, replicas int, discard jetstream.DiscardPolicy) setupStep {
	return setupStep{name, func(c context.Context) error { _, err := h.js.Stream(c, name); return err },
		func(c context.Context) error {
			_, err := h.js.CreateStream(c, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ">"},
				Description: description, Storage: jetstream.FileStorage, Replicas: replicas,
				MaxMsgsPerSubject: 1, AllowMsgTTL: true, Discard: discard, AllowDirect: true,
				MaxMsgSize: maxBanMsg, MaxMsgs: max, MaxBytes: max * maxBanMsg})
			return err
		}}
}

// harden sets what agents' restricted permissions rely on, also on
// streams made by an older ipfence: the bans stream answers direct gets
// (agents may make no consumer), and the status bucket refuses rollups
// (an agent may write its own key: a rollup there would purge every
// host's status).
func (h *Hub) harden(ctx context.Context) error {
	for name, fix := range map[string]func(*jetstream.StreamConfig) bool{
		BanStream: func(c *jetstream.StreamConfig) bool {
			changed := !c.AllowDirect || c.MaxMsgSize <= 0 || c.MaxMsgs <= 0 || c.MaxBytes <= 0
			c.AllowDirect = true
			if c.MaxMsgSize <= 0 {
				c.MaxMsgSize = maxBanMsg
			}
			if c.MaxMsgs <= 0 {
				c.MaxMsgs = maxBans
			}
			if c.MaxBytes <= 0 {
				c.MaxBytes = maxBans * maxBanMsg
			}
			return changed
		},
		statusStream: func(c *jetstream.StreamConfig) bool {
			changed := c.AllowRollup || c.MaxMsgSize <= 0
			c.AllowRollup, c.MaxMsgSize = false, maxStatusMsg
			return changed
		},
	} {
		rctx, cancel := h.ctx(ctx)
		st, err := h.js.Stream(rctx, name)
		if err == nil {
			if cfg := st.CachedInfo().Config; fix(&cfg) {
				_, err = h.js.UpdateStream(rctx, cfg)
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("%w: setting up %s: %v", ErrNATS, name, err)
		}
	}
	return nil
}

// ctx bounds one request.
func (h *Hub) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, h.timeout)
}

// name is what group and host names may be: a KV key token.
var name = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// ErrName is returned for a group or host name that cannot be a key.
var ErrName = errors.New("invalid name")

// CheckName returns an error unless s can name a group or a host.
func CheckName(what, s string) error {
	if len(s) > 128 || !name.MatchString(s) {
		return fmt.Errorf("%w: %s %q: use letters, digits, '-', '_' and single dots between them (up to 128)", ErrName, what, s)
	}
	return nil
}

func groupKey(group string) string { return "group." + group }
func hostKey(host string) string   { return "host." + host }
