package daemon

import (
	"context"
	"net/netip"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/banctl"
)

// maxBatch bounds the requests coalesced into one transaction.
const maxBatch = 65536

// banOp is one API call waiting for its transaction: bans or unbans.
type banOp struct {
	bans   []banctl.Request
	unbans []netip.Prefix
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
		var first *banOp
		select {
		case <-ctx.Done():
			return
		case first = <-q.ch:
		}
		ops := []*banOp{first}
		n := len(first.bans) + len(first.unbans)
	drain:
		for n < maxBatch {
			select {
			case op := <-q.ch:
				ops = append(ops, op)
				n += len(op.bans) + len(op.unbans)
			default:
				break drain
			}
		}
		for len(ops) > 0 {
			k := 1
			for k < len(ops) && (len(ops[k].bans) > 0) == (len(ops[0].bans) > 0) {
				k++
			}
			q.apply(ctx, ops[:k])
			ops = ops[k:]
		}
	}
}

// apply runs calls of one kind in one transaction.
func (q *banQueue) apply(ctx context.Context, ops []*banOp) {
	t0 := time.Now()
	var reqs []banctl.Request
	var ps []netip.Prefix
	for _, op := range ops {
		reqs = append(reqs, op.bans...)
		ps = append(ps, op.unbans...)
	}
	var done []ban.Ban
	var err error
	if len(reqs) > 0 {
		done, err = q.d.ctl.Ban(ctx, reqs)
	} else {
		done, err = q.d.ctl.Unban(ctx, ps)
	}
	if err != nil && len(ops) > 1 {
		for _, op := range ops {
			q.apply(ctx, []*banOp{op})
		}
		return
	}
	q.d.metrics.banBatch.Observe(float64(len(reqs) + len(ps)))
	q.d.metrics.applySeconds.WithLabelValues("ban").Observe(time.Since(t0).Seconds())
	if len(ops) == 1 { // the common case: a lone call, or a bulk one
		ops[0].done <- banResult{bans: done, n: len(done), err: err}
		return
	}
	byPrefix := make(map[netip.Prefix]ban.Ban, len(done))
	for _, b := range done {
		byPrefix[b.Prefix] = b
	}
	for _, op := range ops {
		r := banResult{err: err}
		for _, p := range op.prefixes() {
			if b, ok := byPrefix[p]; ok {
				r.n++
				if !op.quiet {
					r.bans = append(r.bans, b)
				}
			}
		}
		op.done <- r
	}
}

// prefixes are the (masked) prefixes op bans or unbans.
func (op *banOp) prefixes() []netip.Prefix {
	ps := make([]netip.Prefix, 0, len(op.bans)+len(op.unbans))
	for _, r := range op.bans {
		ps = append(ps, r.Prefix.Masked())
	}
	for _, p := range op.unbans {
		ps = append(ps, p.Masked())
	}
	return ps
}
