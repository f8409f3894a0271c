package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Agents and ban writers read the streams through the relay that
// `ipfence server` runs in the fleet's account, not with direct gets of
// their own: a direct get's JSON says how many messages and bytes to
// send (a batch of a million, a GiB), and the server loads each batch
// into memory, so one agent could exhaust it. The relay takes a read
// (which stream, from where), checks it names one of the fleet's
// subjects, makes the direct get itself with bounded batches, one at a
// time per worker, and forwards the answers as they come.

// relaySubject is where the relay takes reads: in the fleet's account
// followed by the reader's role (agent, bans), which each role's account
// imports as relaySubject.
const relaySubject = "ipfence.read"

// readRequest is a read through the relay: the messages of Stream on
// Next from Seq on (a batch), or its last message on Last.
type readRequest struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq,omitempty"`
	Next   string `json:"next_by_subj,omitempty"`
	Last   string `json:"last_by_subj,omitempty"`
}

// What a read may name, per stream: the subjects agents and ban writers
// read, nothing else.
var (
	chunkSubject  = regexp.MustCompile(`^\$O\.` + BundleStore + `\.C\.[A-Za-z0-9]{1,64}$`)
	metaSubject   = regexp.MustCompile(`^\$O\.` + BundleStore + `\.M\.[A-Za-z0-9_=-]{1,256}$`)
	banSubject    = regexp.MustCompile(`^ipfence\.bans\.[0-9a-f]{8,32}_[0-9]{1,3}$`)
	pointerPrefix = "$KV." + PolicyBucket + "." + groupKey("")
)

// errRead is answered to a read the relay does not make.
var errRead = fmt.Errorf("not a read of the fleet's streams")

// check returns an error unless r is a read the relay makes for role
// (a ban writer reads the bans stream only).
func (r *readRequest) check(role Role) error {
	if (r.Next == "") == (r.Last == "") || role != Agent && (role != Bans || r.Stream != BanStream) {
		return errRead
	}
	ok := false
	switch r.Stream {
	case BanStream:
		ok = r.Next == banSubjects+">" || banSubject.MatchString(r.Last)
	case AllowStream:
		ok = r.Next == allowSubjects+">"
	case bundleStream:
		ok = chunkSubject.MatchString(r.Next) || metaSubject.MatchString(r.Last)
	case policyStream:
		group, found := strings.CutPrefix(r.Last, pointerPrefix)
		ok = found && CheckName("group", group) == nil
	}
	if !ok {
		return errRead
	}
	return nil
}

// Relay workers and queue: at most relayWorkers batches (of directBytes)
// in flight, and what waits beyond relayQueue (or maxPerUser of one
// reader's) is answered busy. A read's JSON is at most maxRead bytes.
const (
	relayWorkers = 4
	relayQueue   = 1024
	maxRead      = 1024
	// busy is the status of a read the relay has no room for (503
	// without a body is NATS's "no responders").
	busy = "429"
)

// Relay answers reads on h (the server's own connection, in the fleet's
// account) until ctx is done.
func (h *Hub) Relay(ctx context.Context, log *slog.Logger) error {
	type read struct {
		m    *nats.Msg
		user string
	}
	reqs := make(chan read, relayQueue)
	var queued perUser
	sub, err := h.nc.QueueSubscribe(relaySubject+".*", "ipfence-relay", func(m *nats.Msg) {
		if len(m.Data) > maxRead {
			relayStatus(h.nc, m.Reply, "400", errRead.Error())
			return
		}
		user := requester(m)
		if !queued.add(user) {
			relayStatus(h.nc, m.Reply, busy, "busy: read again later")
			return
		}
		select {
		case reqs <- read{m, user}:
		default:
			queued.done(user)
			relayStatus(h.nc, m.Reply, busy, "busy: read again later")
		}
	})
	if err != nil {
		return fmt.Errorf("serving reads: %w", err)
	}
	defer sub.Unsubscribe()
	var wg sync.WaitGroup
	defer wg.Wait()
	var last lastSeqs
	for range relayWorkers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case r := <-reqs:
					if err := h.relayRead(ctx, r.m, &last); err != nil && log != nil {
						log.Debug("relaying a read", "err", err)
					}
					queued.done(r.user)
				}
			}
		})
	}
	<-ctx.Done()
	return nil
}

// relayStatus answers reply with a status of the relay's own.
func relayStatus(nc *nats.Conn, reply, code, desc string) {
	if reply == "" {
		return
	}
	m := nats.NewMsg(reply)
	m.Header.Set("Status", code)
	m.Header.Set("Description", desc)
	_ = nc.PublishMsg(m)
}

// relayRead makes the read m asks for and forwards the answers to its reply
// subject.
func (h *Hub) relayRead(ctx context.Context, m *nats.Msg, last *lastSeqs) error {
	if m.Reply == "" {
		return nil
	}
	var r readRequest
	role := Role(strings.TrimPrefix(m.Subject, relaySubject+"."))
	if json.Unmarshal(m.Data, &r) != nil || r.check(role) != nil {
		relayStatus(h.nc, m.Reply, "400", errRead.Error())
		return errRead
	}
	rctx, cancel := h.ctx(ctx)
	defer cancel()
	if r.Last != "" {
		// One message, at most the stream's largest: bans come without
		// the headers their writer stored.
		req, _ := json.Marshal(struct {
			Last  string `json:"last_by_subj"`
			NoHdr bool   `json:"no_hdr,omitempty"`
		}{r.Last, r.Stream == BanStream})
		a, err := h.nc.RequestWithContext(rctx, defaultAPI+".DIRECT.GET."+r.Stream, req)
		if err != nil {
			return err
		}
		a.Subject, a.Reply, a.Sub = m.Reply, "", nil
		return h.nc.PublishMsg(a)
	}
	inbox := h.nc.NewInbox()
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := h.nc.PublishRequest(defaultAPI+".DIRECT.GET."+r.Stream, inbox, batchRequest(r.Seq, r.Next)); err != nil {
		return err
	}
	for {
		a, err := sub.NextMsgWithContext(rctx)
		if err != nil {
			return err
		}
		st := a.Header.Get("Status")
		if st == "404" {
			// Where the stream ends: a reader past it (the stream was made
			// again) starts over.
			if seq, ok := last.get(rctx, h, r.Stream, r.Seq); ok {
				a.Header.Set(lastSeqHeader, strconv.FormatUint(seq, 10))
			}
		}
		a.Subject, a.Reply, a.Sub = m.Reply, "", nil
		if err := h.nc.PublishMsg(a); err != nil {
			return err
		}
		if st != "" {
			return nil
		}
	}
}

// lastSeqHeader, on a 404 the relay forwards, is the stream's last
// sequence.
const lastSeqHeader = "Ipfence-Last-Sequence"

// lastSeqs caches the streams' last sequences.
type lastSeqs struct {
	mu   sync.Mutex
	seqs map[string]uint64
	at   map[string]time.Time
}

// get returns stream's last sequence for a reader that found nothing
// from sequence from on, and whether it is known. It is cached for a
// second, but one below from is read again (the reader may be reading
// what was stored since), at most every 100ms: without a fresh one,
// nothing is said.
func (l *lastSeqs) get(ctx context.Context, h *Hub, stream string, from uint64) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seqs == nil {
		l.seqs, l.at = map[string]uint64{}, map[string]time.Time{}
	}
	seq, at := l.seqs[stream], l.at[stream]
	if time.Since(at) < time.Second && seq+1 >= from {
		return seq, true
	}
	if time.Since(at) < 100*time.Millisecond {
		return 0, false
	}
	st, err := h.js.Stream(ctx, stream)
	if err != nil {
		return 0, false
	}
	l.seqs[stream], l.at[stream] = st.CachedInfo().State.LastSeq, time.Now()
	return l.seqs[stream], true
}

// perUser counts each reader's reads waiting or in the relay: one
// reader (a compromised host) cannot hold the queue all agents share.
type perUser struct {
	mu sync.Mutex
	n  map[string]int
}

// maxPerUser is how many reads one reader may have waiting or in the
// relay.
const maxPerUser = 8

func (p *perUser) add(user string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	if p.n[user] >= maxPerUser {
		return false
	}
	p.n[user]++
	return true
}

func (p *perUser) done(user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[user]--; p.n[user] <= 0 {
		delete(p.n, user)
	}
}

// requester names who sent m: the server's Nats-Request-Info (the
// imports share it), its last value (a reader may set one of its own
// before).
func requester(m *nats.Msg) string {
	var info struct {
		Account string `json:"acc"`
		User    string `json:"user"`
		ID      uint64 `json:"id"`
		Server  string `json:"server"`
	}
	if json.Unmarshal([]byte(header(m.Header, "Nats-Request-Info")), &info) != nil {
		return ""
	}
	return fmt.Sprintf("%s/%s/%s/%d", info.Account, info.User, info.Server, info.ID)
}
