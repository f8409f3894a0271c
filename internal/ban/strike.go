package ban

import (
	"fmt"
	"math"
	"net/netip"
	"time"
)

// Recidive is how bans escalate: a prefix banned again within Window of
// the end of its last temporary ban gets Factor times that ban's
// duration (at most Max), when that is longer than asked. The zero
// Recidive is off.
type Recidive struct {
	Window time.Duration `json:"window,omitempty"`
	Factor float64       `json:"factor,omitempty"`
	Max    time.Duration `json:"max,omitempty"`
}

// On reports whether escalation is on.
func (r Recidive) On() bool { return r.Window > 0 }

// Check reports what is wrong with r.
func (r Recidive) Check() error {
	if r == (Recidive{}) {
		return nil
	}
	switch {
	case r.Window < time.Minute || r.Window > MaxTTL:
		return fmt.Errorf("recidive window %v: give how long a prefix's last ban is remembered after it ends, 1m to %v (e.g. 24h, 7d)", r.Window, fmtDays(MaxTTL))
	case math.IsNaN(r.Factor) || r.Factor <= 1 || r.Factor > 100:
		return fmt.Errorf("recidive factor %v: give what a repeat ban's duration is multiplied by, more than 1 and at most 100 (e.g. 2)", r.Factor)
	case r.Max < MinTTL || r.Max > MaxTTL:
		return fmt.Errorf("recidive max %v: give the longest escalated ban, %v to %v (e.g. 30d)", r.Max, MinTTL, fmtDays(MaxTTL))
	}
	return nil
}

// Escalate is the duration of a ban asked for ask (0: permanent, which
// never escalates) of a prefix whose last ban lasted last: Factor times
// last, at most Max, when that is longer than ask.
func (r Recidive) Escalate(ask, last time.Duration) time.Duration {
	if !r.On() || ask == 0 || last <= 0 {
		return ask
	}
	esc := r.Max
	if f := float64(last) * r.Factor; f < float64(r.Max) {
		esc = time.Duration(f)
	}
	return max(ask, esc)
}

// Strike is what is remembered of a prefix's last temporary ban once it
// ended (ran out, or was lifted): how long it was given for, and until
// when it counts (its end plus the recidive window).
type Strike struct {
	Prefix netip.Prefix  `json:"prefix"`
	TTL    time.Duration `json:"ttl"`
	Until  time.Time     `json:"until"`
}

// strike is a Strike as a Set holds it, without pointers.
type strike struct{ ttl, until int64 } // nanoseconds; Unix nanoseconds

// StrikeOf is the strike b leaves when it ends at end under r (false
// for a permanent ban, or with escalation off).
func (r Recidive) StrikeOf(b Ban, end time.Time) (Strike, bool) {
	if !r.On() || b.Expires.IsZero() {
		return Strike{}, false
	}
	ttl := b.Expires.Sub(b.Created)
	if ttl <= 0 {
		return Strike{}, false
	}
	return Strike{Prefix: b.Prefix.Masked(), TTL: ttl, Until: end.Add(r.Window)}, true
}

// PutStrike remembers st in place of the ban of its prefix, which it
// deletes (a prefix has a ban or a strike: one record).
func (s *Set) PutStrike(st Strike) {
	p := st.Prefix.Masked()
	s.Delete(p)
	if s.past == nil {
		s.past = make(map[pkey]strike)
	}
	s.past[prefixKey(p)] = strike{ttl: int64(st.TTL), until: nanos(st.Until)}
}

// Strike returns the strike of prefix p (masked) that still counts at
// now.
func (s *Set) Strike(p netip.Prefix, now time.Time) (Strike, bool) {
	if len(s.past) == 0 {
		return Strike{}, false // every ban asks: no key built for nothing
	}
	p = p.Masked()
	r, ok := s.past[prefixKey(p)]
	if !ok || r.until <= nowNanos(now) {
		return Strike{}, false
	}
	return Strike{Prefix: p, TTL: time.Duration(r.ttl), Until: fromNanos(r.until)}, true
}

// ForgetStrike forgets the strike of prefix p (masked), and reports
// whether there was one.
func (s *Set) ForgetStrike(p netip.Prefix) bool {
	k := prefixKey(p.Masked())
	_, ok := s.past[k]
	delete(s.past, k)
	return ok
}

// Strikes is the number of strikes held, counting or not.
func (s *Set) Strikes() int { return len(s.past) }

// PruneStrikes forgets the strikes that no longer count at now and
// returns their prefixes.
func (s *Set) PruneStrikes(now time.Time) []netip.Prefix {
	t := nowNanos(now)
	var gone []netip.Prefix
	for k, r := range s.past {
		if r.until <= t {
			gone = append(gone, k.prefix())
			delete(s.past, k)
		}
	}
	return gone
}
