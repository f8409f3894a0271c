package ban

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// bucket is the bbolt bucket holding bans: key the canonical prefix
// ("203.0.113.5/32", "2001:db8::/32"), value the Ban as JSON.
var bucket = []byte("bans")

// lockTimeout is how long Open waits for another process to release the
// file.
const lockTimeout = time.Second

// initialMmapSize is the address space Open maps up front. A write that
// outgrows the mapping makes bbolt copy every page the transaction touched
// out of it and map again, several times over for a big first Put (a
// third of the time of storing 100k bans). On Linux a mapping larger than
// the file costs address space, not disk or memory; 64 MiB covers a file
// of about 100k bans, and stays modest on 32-bit systems.
const initialMmapSize = 64 << 20

// Store keeps bans on disk in a bbolt file, so that they survive restarts.
// Every Put and Delete is one transaction, synced to disk before it
// returns. A Store is safe for concurrent use; only one process can hold
// the file at a time.
type Store struct {
	db   *bolt.DB
	path string
}

// Open opens the ban store at path, creating the file (mode 0600) and its
// bucket if needed. If another process holds the file, Open gives up after
// a second with an error wrapping ErrLocked. Other failures (missing
// directory, permissions, a file that is not a bbolt database) are
// returned wrapped, naming the path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, InitialMmapSize: initialMmapSize})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("opening ban store %s: %w (is another ipfence running? stop it, or use another file)", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("opening ban store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening ban store %s: creating bucket: %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// Close releases the file. Using the store afterwards fails.
func (st *Store) Close() error {
	if err := st.db.Close(); err != nil {
		return fmt.Errorf("closing ban store %s: %w", st.path, err)
	}
	return nil
}

// record is one encoded ban.
type record struct{ key, val []byte }

// storeKey is the key of prefix p: its canonical masked form.
func storeKey(p netip.Prefix) []byte {
	return p.Masked().AppendTo(nil)
}

// Put stores bans, replacing those of the same prefixes, in one
// transaction: all or nothing. A ban whose prefix is not valid fails the
// whole call with an error wrapping ErrInvalid before anything is
// written. Prefixes are stored masked.
func (st *Store) Put(bans ...Ban) error {
	if len(bans) == 0 {
		return nil
	}
	recs := make([]record, len(bans))
	for i, b := range bans {
		if !b.Prefix.IsValid() {
			return fmt.Errorf("storing ban %d of %d: %w: prefix %v is not valid", i+1, len(bans), ErrInvalid, b.Prefix)
		}
		b.Prefix = b.Prefix.Masked()
		recs[i] = record{storeKey(b.Prefix), encodeBan(b)}
	}
	// bbolt writes sorted keys much faster: each page is touched once.
	// Stable, so that the last of several bans of one prefix wins.
	slices.SortStableFunc(recs, func(a, b record) int { return bytes.Compare(a.key, b.key) })
	err := st.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		for _, r := range recs {
			if err := bk.Put(r.key, r.val); err != nil {
				return fmt.Errorf("%s: %w", r.key, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storing %d bans in %s: %w", len(bans), st.path, err)
	}
	return nil
}

// Delete removes the bans of prefixes ps (masked) in one transaction.
// Prefixes with no stored ban are skipped; an invalid prefix fails the
// whole call with an error wrapping ErrInvalid before anything is deleted.
func (st *Store) Delete(ps ...netip.Prefix) error {
	if len(ps) == 0 {
		return nil
	}
	keys := make([][]byte, len(ps))
	for i, p := range ps {
		if !p.IsValid() {
			return fmt.Errorf("deleting ban %d of %d: %w: prefix %v is not valid", i+1, len(ps), ErrInvalid, p)
		}
		keys[i] = storeKey(p)
	}
	slices.SortFunc(keys, bytes.Compare)
	err := st.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		for _, k := range keys {
			if err := bk.Delete(k); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("deleting %d bans from %s: %w", len(ps), st.path, err)
	}
	return nil
}

// Load returns every stored ban, expired ones too: callers Prune. A record
// that cannot be decoded, or whose prefix does not match its key, fails
// the load with an error wrapping ErrInvalid that names the key (delete
// it, or the file, to recover).
func (st *Store) Load() (*Set, error) {
	s := NewSet()
	err := st.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			b, err := decodeBan(k, v)
			if err != nil {
				return fmt.Errorf("ban %q: %w: %v", k, ErrInvalid, err)
			}
			if !b.Prefix.IsValid() || !bytes.Equal(storeKey(b.Prefix), k) {
				return fmt.Errorf("ban %q: %w: its prefix is %v", k, ErrInvalid, b.Prefix)
			}
			s.Put(b)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("loading bans from %s: %w", st.path, err)
	}
	return s, nil
}

// Records are binary: a version byte (1), then the expiry and the
// creation time as Unix nanoseconds (varints; 0: the zero time, for an
// expiry permanent), then
// reason and origin, each a length (uvarint) and its bytes. The prefix is
// the key. A record starting with '{' is the JSON of a Ban (the format of
// earlier versions), still read.
const recordV1 = 1

func encodeBan(b Ban) []byte {
	buf := make([]byte, 0, 1+2*binary.MaxVarintLen64+2+len(b.Reason)+len(b.Origin))
	buf = append(buf, recordV1)
	for _, t := range []time.Time{b.Expires, b.Created} {
		var n int64 // the zero time (a permanent ban's expiry) as 0
		if !t.IsZero() {
			n = t.UnixNano()
		}
		buf = binary.AppendVarint(buf, n)
	}
	for _, s := range []string{b.Reason, b.Origin} {
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	return buf
}

func decodeBan(key, v []byte) (Ban, error) {
	var b Ban
	if len(v) > 0 && v[0] == '{' {
		err := json.Unmarshal(v, &b)
		return b, err
	}
	if len(v) == 0 || v[0] != recordV1 {
		return b, errors.New("unknown record format")
	}
	p, err := netip.ParsePrefix(string(key))
	if err != nil {
		return b, err
	}
	b.Prefix = p
	r := v[1:]
	var ns [2]int64
	for i := range ns {
		n, k := binary.Varint(r)
		if k <= 0 {
			return b, errors.New("truncated record")
		}
		ns[i], r = n, r[k:]
	}
	for i, t := range []*time.Time{&b.Expires, &b.Created} {
		if ns[i] != 0 {
			*t = time.Unix(0, ns[i])
		}
	}
	for _, dst := range []*string{&b.Reason, &b.Origin} {
		n, k := binary.Uvarint(r)
		if k <= 0 || uint64(len(r)-k) < n {
			return b, errors.New("truncated record")
		}
		*dst, r = string(r[k:k+int(n)]), r[k+int(n):]
	}
	return b, nil
}
