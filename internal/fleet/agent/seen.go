package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"
)

// seenFor is how long the newest fleet ban message of a prefix is
// remembered: longer than any timed ban lasts (366 days), so that an
// older message replayed meanwhile is still ignored.
const seenFor = 400 * 24 * time.Hour

var seenBucket = []byte("seen")

// seenBans remembers, per prefix, the time of the newest fleet ban or
// unban applied, on disk: after a restart an older message replayed on
// the stream (a ban lifted since, an unban of a newer ban) is still
// ignored. Only applyBans' goroutine uses it.
type seenBans struct {
	db *bolt.DB
	m  map[netip.Prefix]time.Time
}

// openSeen opens (or makes) the record at path, forgetting what is
// older than seenFor at now.
func openSeen(path string, now time.Time) (*seenBans, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening the fleet ban record %s: %w", path, err)
	}
	s := &seenBans{db: db, m: map[netip.Prefix]time.Time{}}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(seenBucket)
		if err != nil {
			return err
		}
		var old [][]byte
		err = b.ForEach(func(k, v []byte) error {
			var p netip.Prefix
			if p.UnmarshalBinary(k) != nil || len(v) != 8 {
				old = append(old, k) // not ours: a record is only a cache of the stream's order
				return nil
			}
			t := time.Unix(0, int64(binary.BigEndian.Uint64(v)))
			if now.Sub(t) > seenFor {
				old = append(old, k)
				return nil
			}
			s.m[p] = t
			return nil
		})
		for _, k := range old {
			err = errors.Join(err, b.Delete(k))
		}
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("reading the fleet ban record %s: %w", path, err)
	}
	return s, nil
}

// older reports whether a message of p created at t is not newer than
// the newest one applied: a replay, or the same message read again.
func (s *seenBans) older(p netip.Prefix, t time.Time) bool {
	seen, ok := s.m[p]
	return ok && !t.After(seen)
}

// record remembers the messages of a batch, in one transaction (only in
// memory when the file could not be opened).
func (s *seenBans) record(seen map[netip.Prefix]time.Time) error {
	for p, t := range seen {
		s.m[p] = t
	}
	if len(seen) == 0 || s.db == nil {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(seenBucket)
		for p, t := range seen {
			k, _ := p.MarshalBinary()
			if err := b.Put(k, binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing the fleet ban record: %w", err)
	}
	return nil
}

func (s *seenBans) Close() error {
	if s.db == nil {
		return nil
	}
	return s.db.Close()
}
