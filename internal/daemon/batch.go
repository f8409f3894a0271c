package daemon

import (
	"context"
	"net/netip"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
)

// maxBatch bounds the requests coalesced into one transaction.
const maxBatch = 65536

// banOp is one API call waiting for its transaction: bans or unbans.
type banOp struct {
	bans   bansets.Prepared
	unbans []bansets.Lift
	quiet  bool // the caller wants the count only, not the bans
	done   chan banResult
}

type banResult struct {
	bans []ban.Ban
	n    int // how many bans were made or lifted
	err  error
}

// banQueue coalesces concurrent ban and unban calls: whatever queued up
// while the previous transaction committed goes into the next one, so a
// lone ban costs one transaction and a burst costs few. Calls are
// applied in arrival order; consecutive calls of the same kind share a
// transaction. A batch that fails (a call the guard refuses, or the
// kernel refusing the transaction) is retried call by call,
// so that one bad call does not fail the others.
type banQueue struct {
	d  *Daemon
	ch chan *banOp
	// carry is a call taken from ch that did not fit in the previous
	// transaction; it starts the next one.
	carry *banOp
}

func newBanQueue(d *Daemon) *banQueue {
	return &banQueue{d: d, ch: make(chan *banOp, 4096)}
}

// submit queues op and waits for its result.
func (q *banQueue) submit(ctx context.Context, op *banOp) (banResult, error) {
	op.done = make(chan banResult, 1)
	select {
	case q.ch <- op:
	case <-ctx.Done():
		return banResult{}, ctx.Err()
	}
	select {
	case r := <-op.done:
		return r, r.err
	case <-ctx.Done():
		// The transaction goes ahead; the caller no longer waits.
		return banResult{}, ctx.Err()
	}
}

func (q *banQueue) run(ctx context.Context) {
	for {
		ops := q.next(ctx)
		if ops == nil {
			return
		}
		for len(ops) > 0 {
			k := 1
			for k < len(ops) && (ops[k].bans.Len() > 0) == (ops[0].bans.Len() > 0) {
				k++
			}
			q.apply(ctx, ops[:k])
			ops = ops[k:]
		}
	}
}

// next waits for a call and returns it with the calls queued behind it,
// up to maxBatch bans and unbans in all; nil when ctx is done. A call
// that would take the batch past maxBatch waits for the next one: two
// bulk calls are not merged, so that while one is in the kernel, the
// next one's request is read and parsed.
func (q *banQueue) next(ctx context.Context) []*banOp {
	first := q.carry
	q.carry = nil
	if first == nil {
		select {
		case <-ctx.Done():
			return nil
		case first = <-q.ch:
		}
	}
	ops := []*banOp{first}
	n := first.size()
	for n < maxBatch {
		select {
		case op := <-q.ch:
			if n+op.size() > maxBatch {
				q.carry = op
				return ops
			}
			ops = append(ops, op)
			n += op.size()
		default:
			return ops
		}
	}
	return ops
}

// size is how many bans or unbans op asks for.
func (op *banOp) size() int { return op.bans.Len() + len(op.unbans) }

// apply runs calls of one kind in one transaction.
func (q *banQueue) apply(ctx context.Context, ops []*banOp) {
	t0 := time.Now()
	n := 0
	var lifted []ban.Ban
	var err error
	if ops[0].bans.Len() > 0 {
		ps := make([]bansets.Prepared, len(ops))
		for i, op := range ops {
			ps[i] = op.bans
			n += op.bans.Len()
		}
		_, err = q.d.ctl.BanPrepared(ctx, ps...)
	} else {
		var ps []bansets.Lift
		for _, op := range ops {
			ps = append(ps, op.unbans...)
		}
		n = len(ps)
		lifted, err = q.d.ctl.Unban(ctx, ps)
	}
	if err != nil && len(ops) > 1 {
		for _, op := range ops {
			q.apply(ctx, []*banOp{op})
		}
		return
	}
	q.d.metrics.banBatch.Observe(float64(n))
	q.d.metrics.applySeconds.WithLabelValues("ban").Observe(time.Since(t0).Seconds())
	var byPrefix map[netip.Prefix]ban.Ban // lifted bans, when several calls share them
	if len(ops) > 1 && len(lifted) > 0 {
		byPrefix = make(map[netip.Prefix]ban.Ban, len(lifted))
		for _, b := range lifted {
			byPrefix[b.Prefix] = b
		}
	}
	for _, op := range ops {
		r := banResult{err: err}
		switch {
		case err != nil:
		case op.bans.Len() > 0:
			r.n = op.bans.Len()
			if !op.quiet {
				r.bans = op.bans.Bans()
			}
		case len(ops) == 1:
			r.bans, r.n = lifted, len(lifted)
		default:
			for _, l := range op.unbans {
				if b, ok := byPrefix[l.Prefix.Masked()]; ok && (l.Origin == "" || l.Origin == b.Origin) {
					r.bans = append(r.bans, b)
				}
			}
			r.n = len(r.bans)
		}
		op.done <- r
	}
}
