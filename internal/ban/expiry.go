package ban

import (
	"math"
	"net/netip"
)

// wheel indexes bans by the second they expire in, so that Prune finds the
// expired ones without walking every ban: the daemon prunes every few
// seconds, and a walk of millions of bans under the controller's lock
// stalls every ban call meanwhile (17 ms at a million).
//
// An entry is not removed when its ban is lifted or replaced; Prune checks
// each entry of a due second against the set and drops the stale ones, and
// the Set rebuilds the wheel when stale entries outnumber its bans (a
// watcher that bans the same addresses again and again with a long TTL).
// The buckets hold keys only, no pointers, for the garbage collector's
// sake.
type wheel struct {
	buckets map[int64]*slot
	// lo is at or below the lowest second with a bucket.
	lo int64
	// last is the bucket added to last, and its second: bulk bans share
	// their expiry.
	last    *slot
	lastSec int64
	// n counts the entries, stale ones included.
	n int
}

// slot is the bucket of one second: the keys of the bans expiring in it.
type slot struct {
	a4   []uint32
	a6   [][16]byte
	nets []pkey
}

func (w *wheel) at(sec int64) *slot {
	if w.last != nil && sec == w.lastSec {
		return w.last
	}
	if w.buckets == nil {
		w.buckets, w.lo = make(map[int64]*slot), math.MaxInt64
	}
	b := w.buckets[sec]
	if b == nil {
		b = &slot{}
		w.buckets[sec] = b
		w.lo = min(w.lo, sec)
	}
	w.last, w.lastSec = b, sec
	return b
}

// add indexes the ban of p (masked) expiring at expires (Unix
// nanoseconds; 0: never).
func (w *wheel) add(p netip.Prefix, expires int64) {
	if expires != 0 {
		w.put(second(expires), p)
	}
}

// put adds p (masked) to the bucket of second sec.
func (w *wheel) put(sec int64, p netip.Prefix) {
	b := w.at(sec)
	w.n++
	switch a := p.Addr(); {
	case !p.IsSingleIP():
		b.nets = append(b.nets, prefixKey(p))
	case a.Is4():
		b.a4 = append(b.a4, addrKey4(a))
	default:
		b.a6 = append(b.a6, a.As16())
	}
}

// second is the second that Unix nanoseconds t fall in.
func second(t int64) int64 {
	s := t / 1e9
	if t < 0 && t%1e9 != 0 {
		s--
	}
	return s
}

// due calls fn for the prefix of every entry in a second up to now's,
// and takes those seconds' buckets out of the wheel; keep puts an entry
// back (its ban is due later in now's second).
func (w *wheel) due(now int64, fn func(p netip.Prefix) (keep bool)) {
	if w.buckets == nil {
		return
	}
	end := second(now)
	var secs []int64
	if end-w.lo+1 <= int64(len(w.buckets)) {
		for s := w.lo; s <= end; s++ {
			if w.buckets[s] != nil {
				secs = append(secs, s)
			}
		}
	} else { // fewer buckets than seconds to look at
		for s := range w.buckets {
			if s <= end {
				secs = append(secs, s)
			}
		}
	}
	w.lo = max(w.lo, end) // every bucket up to end is taken out
	// Take the due buckets out first: an entry kept goes into a new
	// bucket for now's second.
	due := make([]*slot, len(secs))
	for i, s := range secs {
		due[i] = w.buckets[s]
		delete(w.buckets, s)
	}
	w.last = nil
	for _, b := range due {
		w.n -= len(b.a4) + len(b.a6) + len(b.nets)
		keep := func(p netip.Prefix) {
			if fn(p) {
				w.put(end, p)
			}
		}
		for _, k := range b.a4 {
			keep(netip.PrefixFrom(addrOf4(k), 32))
		}
		for _, k := range b.a6 {
			keep(netip.PrefixFrom(netip.AddrFrom16(k), 128))
		}
		for _, k := range b.nets {
			keep(k.prefix())
		}
	}
}
