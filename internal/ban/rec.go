package ban

import (
	"encoding/binary"
	"math"
	"net/netip"
	"time"
)

// rec is a Ban as a Set holds it, without its prefix (the map key) and
// without pointers: times as Unix nanoseconds, strings as indexes into
// the Set's strtab. (A Ban holds five pointers: the prefix's address, two
// time zones, two strings.)
type rec struct {
	expires, created int64  // Unix nanoseconds; 0: the zero time
	reason, origin   uint32 // strtab indexes
}

// live reports whether the record is in force at now (Unix nanoseconds,
// see nowNanos), as Ban.Live.
func (r rec) live(now int64) bool { return r.expires == 0 || r.expires > now }

// ban rebuilds the Ban of prefix p from its record.
func (s *Set) ban(p netip.Prefix, r rec) Ban {
	return Ban{Prefix: p, Expires: fromNanos(r.expires), Created: fromNanos(r.created),
		Reason: s.strs.str(r.reason), Origin: s.strs.str(r.origin)}
}

// nanos is t in Unix nanoseconds, 0 for the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// nowNanos is now in Unix nanoseconds, clamped to the int64 range (a
// caller may ask about the zero time, before every ban).
func nowNanos(now time.Time) int64 {
	switch {
	case now.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case now.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return now.UnixNano()
}

// pkey is a CIDR prefix as a map key without pointers.
type pkey struct {
	a    [16]byte
	bits uint8
	v4   bool
}

func prefixKey(p netip.Prefix) pkey {
	return pkey{a: p.Addr().As16(), bits: uint8(p.Bits()), v4: p.Addr().Is4()}
}

func (k pkey) prefix() netip.Prefix {
	a := netip.AddrFrom16(k.a)
	if k.v4 {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, int(k.bits))
}

// addrKey4 is an IPv4 address as a map key.
func addrKey4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addrOf4(k uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], k)
	return netip.AddrFrom4(b)
}

// strtab interns the reasons and origins of a Set's bans, counting
// references so that a string no ban uses any more is forgotten. Index 0
// is "".
type strtab struct {
	strs []string
	refs []int
	ids  map[string]uint32
	free []uint32
	last uint32 // the index ref returned last: bulk bans share strings
}

// ref returns the index of str, adding a reference.
func (t *strtab) ref(str string) uint32 {
	if str == "" {
		return 0
	}
	if id := t.last; id != 0 && t.refs[id] > 0 && t.strs[id] == str {
		t.refs[id]++
		return id
	}
	id, ok := t.ids[str]
	if !ok {
		if t.ids == nil {
			t.ids = map[string]uint32{}
			t.strs, t.refs = []string{""}, []int{0}
		}
		if n := len(t.free); n > 0 {
			id, t.free = t.free[n-1], t.free[:n-1]
			t.strs[id] = str
		} else {
			id = uint32(len(t.strs))
			t.strs, t.refs = append(t.strs, str), append(t.refs, 0)
		}
		t.ids[str] = id
	}
	t.refs[id]++
	t.last = id
	return id
}

// unref drops a reference to index id.
func (t *strtab) unref(id uint32) {
	if id == 0 {
		return
	}
	if t.refs[id]--; t.refs[id] == 0 {
		delete(t.ids, t.strs[id])
		t.strs[id] = ""
		t.free = append(t.free, id)
	}
}

func (t *strtab) str(id uint32) string {
	if id == 0 {
		return ""
	}
	return t.strs[id]
}
