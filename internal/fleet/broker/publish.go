package broker

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// ErrConflict is returned when another publisher moved a group's pointer
// between reading and writing it: nothing was changed, run again.
var ErrConflict = errors.New("the group's pointer moved meanwhile (another publish or rollback); nothing changed, run again")

// ErrNoRevision is returned for a rollback or canary without the
// revision it needs.
var ErrNoRevision = errors.New("no such revision")

// Publish stores the bundle data (under its digest, unless it is there
// already) and moves group's pointer to it, signed with priv: every
// host of the group, or with canary (1–99) that percentage of them
// while the others stay on the revision they run. A stored pointer that
// is not the group's latest revision signed with priv is replaced
// (Moved.Replaced says why); with no such revision left at all, the new
// one's seq follows what the group's hosts report (see nextSeq).
//
// deltas are difference bundles of data (fleet.Delta) from the bundles
// the group's hosts run now: stored too, and named in the pointer.
func (h *Hub) Publish(ctx context.Context, group string, data []byte, priv ed25519.PrivateKey, canary int, now time.Time, deltas ...Delta) (*Moved, error) {
	if err := CheckName("group", group); err != nil {
		return nil, err
	}
	digest := fleet.Digest(data)
	if err := h.putBundle(ctx, digest, data); err != nil {
		return nil, err
	}
	var refs []fleet.DeltaRef
	for _, d := range deltas {
		ref := fleet.DeltaRef{Base: d.Base, Digest: fleet.Digest(d.Data), Size: int64(len(d.Data))}
		if err := h.putBundle(ctx, ref.Digest, d.Data); err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return h.move(ctx, group, priv, func(prev *fleet.Pointer) (*fleet.Pointer, error) {
		p := &fleet.Pointer{Group: group, Digest: digest, Size: int64(len(data)), Created: now.UTC(), Deltas: refs}
		if canary > 0 && canary < 100 {
			if prev == nil {
				return nil, fmt.Errorf("%w: a canary needs a revision signed with this key that the other hosts keep, group %s has none; publish to the whole group first", ErrNoRevision, group)
			}
			stable := prev.For("") // a canary's other hosts stay where they are
			if prev.Canary > 0 && prev.Stable != nil {
				stable = *prev.Stable
			}
			p.Canary, p.Stable = canary, &stable
		}
		return p, nil
	})
}

// Delta is a difference bundle to store with a publish: the digest of
// the bundle it applies to, and its bytes (fleet.Delta.Encode).
type Delta struct {
	Base string
	Data []byte
}

// Rollback moves group's pointer back to the bundle of revision to (0:
// the last one before the current whose bundle differs), for every host.
// It is a new revision with a higher seq: agents never take a lower one.
func (h *Hub) Rollback(ctx context.Context, group string, to uint64, priv ed25519.PrivateKey, now time.Time) (*Moved, error) {
	hist, err := h.History(ctx, group, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	if len(hist) == 0 {
		return nil, fmt.Errorf("%w: group %s has no revision", ErrNoRevision, group)
	}
	cur := hist[len(hist)-1]
	var target *fleet.Pointer
	for i := len(hist) - 1; i >= 0 && target == nil; i-- {
		if p := hist[i]; (to == 0 && p.Digest != cur.Digest && p.Canary == 0) || (to != 0 && p.Seq == to) {
			target = p
		}
	}
	if target == nil {
		if to == 0 {
			return nil, fmt.Errorf("%w: group %s has no earlier revision with another bundle in the last %d", ErrNoRevision, group, len(hist))
		}
		return nil, fmt.Errorf("%w: group %s has no revision %d in its last %d", ErrNoRevision, group, to, len(hist))
	}
	if err := h.hasBundle(ctx, target.Digest); err != nil {
		return nil, err
	}
	return h.move(ctx, group, priv, func(*fleet.Pointer) (*fleet.Pointer, error) {
		return &fleet.Pointer{Group: group, Digest: target.Digest, Size: target.Size, Created: now.UTC()}, nil
	})
}

// Moved is a group's pointer after a publish or rollback.
type Moved struct {
	*fleet.Pointer
	// Replaced says why the pointer stored before was not the group's
	// latest revision signed with this key (another key's, another
	// group's, an older one replayed); "" when it was, or none was
	// stored. The publisher should hear of it.
	Replaced string
}

// maxSeq bounds sequence numbers: far beyond any count of revisions,
// exact in JSON readers that use doubles, and never wrapping around.
const maxSeq = 1 << 53

// maxReported bounds the revisions a host's status may report and count.
const maxReported = 1 << 32

// ErrSeq is returned when a group's next sequence number would be out of
// range.
var ErrSeq = errors.New("sequence number out of range")

// move writes the pointer next makes of the group's latest revision
// signed with priv (nil: none) with the next seq, if nobody moved the
// pointer meanwhile.
func (h *Hub) move(ctx context.Context, group string, priv ed25519.PrivateKey, next func(prev *fleet.Pointer) (*fleet.Pointer, error)) (*Moved, error) {
	pub := priv.Public().(ed25519.PublicKey)
	kv, err := h.kv(ctx, PolicyBucket)
	if err != nil {
		return nil, err
	}
	var cur []byte
	var rev uint64
	rctx, cancel := h.ctx(ctx)
	e, err := kv.Get(rctx, groupKey(group))
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return nil, fmt.Errorf("reading group %s's pointer: %w", group, err)
	default:
		cur, rev = e.Value(), e.Revision()
	}
	hist, err := h.History(ctx, group, pub)
	if err != nil {
		return nil, err
	}
	var prev *fleet.Pointer
	if len(hist) > 0 {
		prev = hist[len(hist)-1]
	}
	p, err := next(prev)
	if err != nil {
		return nil, err
	}
	if p.Seq, err = h.nextSeq(ctx, group, prev); err != nil {
		return nil, err
	}
	data, err := fleet.Sign(p, priv)
	if err != nil {
		return nil, err
	}
	rctx, cancel = h.ctx(ctx)
	defer cancel()
	if rev == 0 {
		_, err = kv.Create(rctx, groupKey(group), data)
	} else {
		_, err = kv.Update(rctx, groupKey(group), data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil, ErrConflict
	}
	if err != nil {
		return nil, fmt.Errorf("moving group %s's pointer: %w", group, err)
	}
	return &Moved{Pointer: p, Replaced: stale(cur, group, pub, prev)}, nil
}

// stale says why cur, group's pointer as stored, is not prev, the
// group's latest revision signed with pub ("" when it is, or none was
// stored).
func stale(cur []byte, group string, pub ed25519.PublicKey, prev *fleet.Pointer) string {
	if cur == nil {
		return ""
	}
	p, err := fleet.Verify(cur, group, pub)
	switch {
	case err != nil:
		return err.Error()
	case prev == nil || p.Seq < prev.Seq:
		return fmt.Sprintf("revision %d, replayed over a later one", p.Seq)
	}
	return ""
}

// nextSeq is the seq after prev, group's latest revision. Without one (a
// first publish, or nothing this key signed left in the history: a
// forged first pointer, a flooded history) it follows the highest seq
// the group's hosts report having run or refused: agents take no lower.
func (h *Hub) nextSeq(ctx context.Context, group string, prev *fleet.Pointer) (uint64, error) {
	if prev != nil {
		if prev.Seq >= maxSeq {
			return 0, fmt.Errorf("%w: group %s is at revision %d", ErrSeq, group, prev.Seq)
		}
		return prev.Seq + 1, nil
	}
	sts, err := h.Statuses(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the revisions group %s's hosts run: %w", group, err)
	}
	var last uint64
	for _, s := range sts {
		if s.Group != group || s.Unreadable != "" {
			continue
		}
		// An agent writes its own status, and may claim anything there:
		// a revision no publisher could have reached (2^32 publishes)
		// would use up the group's seqs, so it does not count.
		if seq := max(s.Seq, s.FailedSeq, s.Watermark); seq < maxReported {
			last = max(last, seq)
		}
	}
	return last + 1, nil
}

// History returns group's revisions, oldest first, as far back as the
// bucket keeps them (64): the pointers pub signed for group. Others
// (forged, another group's) are left out, and so is an older revision
// replayed after newer ones: seqs grow along the history.
func (h *Hub) History(ctx context.Context, group string, pub ed25519.PublicKey) ([]*fleet.Pointer, error) {
	kv, err := h.kv(ctx, PolicyBucket)
	if err != nil {
		return nil, err
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	es, err := kv.History(rctx, groupKey(group))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading group %s's history: %w", group, err)
	}
	var ps []*fleet.Pointer
	for _, e := range es {
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		p, err := fleet.Verify(e.Value(), group, pub)
		if err == nil && (len(ps) == 0 || p.Seq > ps[len(ps)-1].Seq) {
			ps = append(ps, p)
		}
	}
	return ps, nil
}

// Pointers returns every group's current pointer, checked against pub,
// or only decoded without it (reports); a pointer that names another
// group than its key's is an error either way.
func (h *Hub) Pointers(ctx context.Context, pub ed25519.PublicKey) (map[string]*fleet.Pointer, error) {
	out := map[string]*fleet.Pointer{}
	err := h.each(ctx, PolicyBucket, "group.>", func(key string, v []byte) error {
		group := strings.TrimPrefix(key, "group.")
		p, err := fleet.Peek(v, group)
		if pub != nil {
			p, err = fleet.Verify(v, group, pub)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out[group] = p
		return nil
	})
	return out, err
}

// Pointer returns group's current pointer as stored (nil when it has
// none), for the caller to verify.
func (h *Hub) Pointer(ctx context.Context, group string) ([]byte, error) {
	d, err := h.directLast(ctx, policyStream, "$KV."+PolicyBucket+"."+groupKey(group))
	switch {
	case errors.Is(err, ErrNotStored):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading group %s's pointer: %w", group, err)
	case header(d.hdr, "KV-Operation") != "": // deleted or purged
		return nil, nil
	}
	return d.data, nil
}

// WatchPointer calls fn with group's pointer as stored, now and at every
// change, until ctx is done. It reads every period (an agent subscribes
// to nothing but its inbox: in the agents' shared account any agent
// could aim answers at a subject they all follow), and calls fn only
// when what it read differs from what it passed last: a revision the
// caller refused is retried on its own schedule, not at every read.
func (h *Hub) WatchPointer(ctx context.Context, group string, period time.Duration, fn func([]byte)) error {
	tick := time.NewTicker(period)
	defer tick.Stop()
	var last []byte
	for {
		cur, err := h.Pointer(ctx, group)
		if err != nil {
			return err
		}
		if cur != nil && !bytes.Equal(cur, last) {
			last = cur
			fn(cur)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (h *Hub) putBundle(ctx context.Context, digest string, data []byte) error {
	obs, err := h.store(ctx)
	if err != nil {
		return err
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	if _, err := obs.GetInfo(rctx, digest); err == nil {
		return nil // the same bytes are there: content addressed
	}
	if _, err := obs.PutBytes(rctx, digest, data); err != nil {
		return fmt.Errorf("storing bundle %s: %w", digest, err)
	}
	return nil
}

func (h *Hub) hasBundle(ctx context.Context, digest string) error {
	obs, err := h.store(ctx)
	if err != nil {
		return err
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	if _, err := obs.GetInfo(rctx, digest); err != nil {
		return fmt.Errorf("%w: bundle %s is no longer stored: %v", ErrNoRevision, digest, err)
	}
	return nil
}

// ErrBundleSize is returned for a stored bundle of another size than
// its pointer names (a fleet.ErrDigest too: it is not the signed one).
var ErrBundleSize = fmt.Errorf("%w: another size", fleet.ErrDigest)

// Bundle returns the bytes stored under digest, if they are size bytes
// long (the signed pointer's size: nothing larger is read), for the
// caller to check against the pointer. It reads the object's chunks
// with direct gets: an agent may make no consumer.
func (h *Hub) Bundle(ctx context.Context, digest string, size int64) ([]byte, error) {
	d, err := h.directLast(ctx, bundleStream, "$O."+BundleStore+".M."+base64.URLEncoding.EncodeToString([]byte(digest)))
	if err != nil {
		return nil, fmt.Errorf("fetching bundle %s: %w", digest, err)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(d.data, &info); err != nil || info.NUID == "" || strings.ContainsAny(info.NUID, ".*> ") {
		return nil, fmt.Errorf("fetching bundle %s: unreadable object information", digest)
	}
	if info.Deleted || info.Size != uint64(size) {
		return nil, fmt.Errorf("%w: %s is %d bytes (deleted: %v), its pointer says %d", ErrBundleSize, digest, info.Size, info.Deleted, size)
	}
	data := make([]byte, 0, size)
	_, err = h.directEach(ctx, bundleStream, "$O."+BundleStore+".C."+info.NUID, 1, func(chunk []byte) error {
		if int64(len(data)+len(chunk)) > size {
			return fmt.Errorf("%w: %s has more than %d bytes", ErrBundleSize, digest, size)
		}
		data = append(data, chunk...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fetching bundle %s: %w", digest, err)
	}
	if int64(len(data)) != size {
		return nil, fmt.Errorf("%w: %s has %d bytes, its pointer says %d", ErrBundleSize, digest, len(data), size)
	}
	return data, nil
}

func (h *Hub) kv(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	kv, err := h.js.KeyValue(rctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("%w: bucket %s: %v (run `ipfence server`, or `ipfence publish` once against this cluster)", ErrNATS, bucket, err)
	}
	return kv, nil
}

func (h *Hub) store(ctx context.Context) (jetstream.ObjectStore, error) {
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	obs, err := h.js.ObjectStore(rctx, BundleStore)
	if err != nil {
		return nil, fmt.Errorf("%w: object store %s: %v (run `ipfence server`, or `ipfence publish` once against this cluster)", ErrNATS, BundleStore, err)
	}
	return obs, nil
}

// each calls fn with every key matching filter in bucket and its value.
func (h *Hub) each(ctx context.Context, bucket, filter string, fn func(key string, v []byte) error) error {
	kv, err := h.kv(ctx, bucket)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 6*h.timeout)
	defer cancel()
	w, err := kv.Watch(rctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("listing %s: %w", bucket, err)
	}
	defer w.Stop()
	for {
		select {
		case <-rctx.Done():
			return fmt.Errorf("listing %s: %w", bucket, rctx.Err())
		case e := <-w.Updates():
			if e == nil {
				return nil
			}
			if err := fn(e.Key(), e.Value()); err != nil {
				return err
			}
		}
	}
}

// Deltas makes difference bundles of next (compiled into plans whose rule
// sets are nextSets, by name) from the bundles the hosts of group run
// now: its pointer's, signed with pub, and a canary's other one. A delta
// no smaller than half of the whole bundle's bytes, which full returns,
// is left out: full is called once the deltas are made, so that a caller
// can encode the bundle meanwhile. It is best effort: the errors say
// which bases have no delta, whose hosts then fetch the whole bundle.
func (h *Hub) Deltas(ctx context.Context, group string, pub ed25519.PublicKey, next *fleet.Bundle, nextSets map[string]*prefix.Set, full func() int) ([]Delta, []error) {
	raw, err := h.Pointer(ctx, group)
	switch {
	case err != nil:
		return nil, []error{err}
	case raw == nil: // a first publish
		return nil, nil
	}
	p, err := fleet.Verify(raw, group, pub)
	if err != nil {
		return nil, []error{err}
	}
	bases := []fleet.Target{{Seq: p.Seq, Digest: p.Digest, Size: p.Size}}
	if p.Stable != nil && p.Stable.Digest != p.Digest {
		bases = append(bases, *p.Stable)
	}
	made := make([][]byte, len(bases))
	var errs []error
	for i, t := range bases {
		data, err := h.delta(ctx, t, next, nextSets)
		if err != nil {
			errs = append(errs, fmt.Errorf("from revision %d: %w", t.Seq, err))
		}
		made[i] = data
	}
	var out []Delta
	size := full()
	for i, t := range bases {
		switch data := made[i]; {
		case data == nil:
		case len(data)*2 >= size:
			errs = append(errs, fmt.Errorf("from revision %d: the difference (%d bytes) is not under half the bundle (%d)", t.Seq, len(data), size))
		default:
			out = append(out, Delta{Base: t.Digest, Data: data})
		}
	}
	return out, errs
}

// delta is the encoded delta of next from base's bundle.
func (h *Hub) delta(ctx context.Context, base fleet.Target, next *fleet.Bundle, nextSets map[string]*prefix.Set) ([]byte, error) {
	raw, err := h.Bundle(ctx, base.Digest, base.Size)
	if err != nil {
		return nil, err
	}
	b, err := base.Check(raw)
	if err != nil {
		return nil, err
	}
	in, err := b.Input()
	if err != nil {
		return nil, err
	}
	sets, err := plan.Sets(in)
	if err != nil {
		return nil, err
	}
	d, err := fleet.MakeDelta(b, base.Digest, next, sets, nextSets)
	if err != nil {
		return nil, err
	}
	return d.Encode()
}
