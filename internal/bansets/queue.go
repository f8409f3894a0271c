package bansets

import (
	"context"
	"net/netip"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// maxBatch bounds the requests coalesced into one transaction.
const maxBatch = 65536

// banOp is one call waiting for its transaction: bans or unbans.
type banOp struct {
	bans   Prepared
	unbans []Lift
	quiet  bool // the caller wants the count only, not the bans
	done   chan Result
}

// Result is what a queued call did.
type Result struct {
	// Bans are the bans made or lifted (none for a quiet ban).
	Bans []ban.Ban
	// N is how many bans were made or lifted.
	N   int
	err error
}

// Queue coalesces concurrent ban and unban calls into the Controller's
// transactions: whatever queued up
// while the previous transaction committed goes into the next one, so a
// lone ban costs one transaction and a burst costs few. Calls are
// applied in arrival order; consecutive calls of the same kind share a
// transaction. A batch that fails (a call the guard refuses, or the
// kernel refusing the transaction) is retried call by call,
// so that one bad call does not fail the others.
type Queue struct {
	ctl *Controller
	// observe, when set, is told each transaction's size and duration.
	observe func(n int, took time.Duration)
	ch      chan *banOp
	// carry is a call taken from ch that did not fit in the previous
	// transaction; it starts the next one.
	carry *banOp
}

// NewQueue returns a queue; calls wait until Run serves it. observe,
// when not nil, is told each transaction's size and duration (metrics).
func NewQueue(observe func(n int, took time.Duration)) *Queue {
	return &Queue{observe: observe, ch: make(chan *banOp, 4096)}
}

// Ban queues prepared bans (see Controller.Prepare: the guard and TTL
// checks run on the caller's goroutine) for the next transaction and
// waits for it; quiet leaves the bans out of the result.
func (q *Queue) Ban(ctx context.Context, p Prepared, quiet bool) (Result, error) {
	return q.submit(ctx, &banOp{bans: p, quiet: quiet})
}

// Unban queues lifts for the next transaction and waits for it.
func (q *Queue) Unban(ctx context.Context, ls []Lift) (Result, error) {
	return q.submit(ctx, &banOp{unbans: ls})
}

// submit queues op and waits for its result.
func (q *Queue) submit(ctx context.Context, op *banOp) (Result, error) {
	op.done = make(chan Result, 1)
	select {
	case q.ch <- op:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	select {
	case r := <-op.done:
		return r, r.err
	case <-ctx.Done():
		// The transaction goes ahead; the caller no longer waits.
		return Result{}, ctx.Err()
	}
}

// Run serves the queue with ctl's transactions until ctx is done.
func (q *Queue) Run(ctx context.Context, ctl *Controller) {
	q.ctl = ctl
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
func (q *Queue) next(ctx context.Context) []*banOp {
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
func (q *Queue) apply(ctx context.Context, ops []*banOp) {
	t0 := time.Now()
	n := 0
	var lifted []ban.Ban
	var err error
	if ops[0].bans.Len() > 0 {
		ps := make([]Prepared, len(ops))
		for i, op := range ops {
			ps[i] = op.bans
			n += op.bans.Len()
		}
		_, err = q.ctl.BanPrepared(ctx, ps...)
	} else {
		var ps []Lift
		for _, op := range ops {
			ps = append(ps, op.unbans...)
		}
		n = len(ps)
		lifted, err = q.ctl.Unban(ctx, ps)
	}
	if err != nil && len(ops) > 1 {
		for _, op := range ops {
			q.apply(ctx, []*banOp{op})
		}
		return
	}
	if q.observe != nil {
		q.observe(n, time.Since(t0))
	}
	var byPrefix map[netip.Prefix]ban.Ban // lifted bans, when several calls share them
	if len(ops) > 1 && len(lifted) > 0 {
		byPrefix = make(map[netip.Prefix]ban.Ban, len(lifted))
		for _, b := range lifted {
			byPrefix[b.Prefix] = b
		}
	}
	for _, op := range ops {
		r := Result{err: err}
		switch {
		case err != nil:
		case op.bans.Len() > 0:
			r.N = op.bans.Len()
			if !op.quiet {
				r.Bans = op.bans.Bans()
			}
		case len(ops) == 1:
			r.Bans, r.N = lifted, len(lifted)
		default:
			for _, l := range op.unbans {
				if b, ok := byPrefix[l.Prefix.Masked()]; ok && (l.Origin == "" || l.Origin == b.Origin) {
					r.Bans = append(r.Bans, b)
				}
			}
			r.N = len(r.Bans)
		}
		op.done <- r
	}
}
