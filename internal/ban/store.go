package ban

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// bucket is the bbolt bucket holding bans: key the canonical prefix
// ("203.0.113.5/32", "2001:db8::/32"), value the Ban as a record (see
// encodeBan).
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

// Store keeps bans on disk, so that they survive restarts: a bbolt file
// and, in front of it, a journal (see journal.go). Every Put and Delete is
// one journal frame, synced to disk before it returns; closed journal
// segments are folded into the bbolt file in the background. A Store is
// safe for concurrent use; only one process can hold the file at a time.
type Store struct {
	db   *bolt.DB
	path string

	mu        sync.Mutex // held through a write and its sync
	cur       *segment   // the segment being written; nil until a write needs it
	next      uint64     // the number of the next segment
	closed    bool
	lastWrite time.Time
	sealed    int // closed segments not folded yet (about)

	fold    sync.Mutex    // held while folding segments, and by Load
	kick    chan struct{} // wakes the folder
	quit    chan struct{} // closed by Close
	stopped chan struct{} // closed when the folder has returned
	foldErr error         // the folder's last error (under fold)
	folded  int           // records folded since the folder last told afterFold (under fold)
	// afterFold, when set (OnFold), is told how many records the folder
	// folded.
	afterFold atomic.Pointer[func(records int)]
}

// OnFold makes the store call fn (from its folder goroutine) with the
// number of records each time its folder has folded written bans into
// its file: a fold of a bulk load leaves much garbage, which a daemon may
// want to hand back to the kernel.
func (st *Store) OnFold(fn func(records int)) { st.afterFold.Store(&fn) }

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
	var folded uint64
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucket); err != nil {
			return err
		}
		mb, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		folded = foldedThrough(mb)
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening ban store %s: creating buckets: %w", path, err)
	}
	segs, err := segments(path)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening ban store %s: listing its journal: %w", path, err)
	}
	st := &Store{db: db, path: path, next: folded + 1, kick: make(chan struct{}, 1), quit: make(chan struct{}), stopped: make(chan struct{})}
	if len(segs) > 0 {
		// Writes go to a fresh segment; the old ones (perhaps ending in
		// a torn frame) are only read.
		st.next = max(st.next, segs[len(segs)-1]+1)
		st.kick <- struct{}{}
	}
	go st.folder()
	return st, nil
}

// foldedThrough reads the number of the last segment folded into the file.
func foldedThrough(mb *bolt.Bucket) uint64 {
	if v := mb.Get(journalDone); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Close folds the journal into the bbolt file and releases the file.
// Using the store afterwards fails.
func (st *Store) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	var errs []error
	if st.cur != nil {
		errs = append(errs, st.cur.f.Close())
		st.cur = nil
	}
	close(st.kick)
	close(st.quit)
	st.mu.Unlock()
	<-st.stopped
	errs = append(errs, st.foldSealed())
	if err := st.db.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing ban store %s: %w", st.path, err)
	}
	return nil
}

// write appends f to the journal and syncs it; a full segment is closed
// and handed to the folder.
func (st *Store) write(f *frame) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return errClosed
	}
	if st.cur == nil {
		seg, err := createSegment(st.path, st.next)
		if err != nil {
			return fmt.Errorf("creating a journal segment: %w", err)
		}
		st.cur = seg
		st.next++
	}
	if err := st.cur.append(f.bytes()); err != nil {
		// Start a fresh segment next time: this one may end in a torn
		// frame, after which nothing would be replayed.
		st.cur.f.Close()
		st.cur = nil
		st.signal()
		return err
	}
	st.lastWrite = time.Now()
	if st.cur.size >= compactAt {
		// The frame is on disk: an error closing the file does not undo
		// it, and must not make the caller think it failed.
		_ = st.cur.f.Close()
		st.cur = nil
		st.sealed++
		st.signal()
	}
	return nil
}

// signal wakes the folder (with st.mu held, before Close).
func (st *Store) signal() {
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

// Folding costs CPU and disk time that bans under attack need more: the
// folder waits until no write came for foldIdle, unless maxSealed
// segments wait to be folded (which bounds the journal, and the time a
// restart spends replaying it, to about 256 MiB).
// (Variables for tests.)
var (
	foldIdle  = time.Second
	maxSealed = 32
)

// folder folds closed segments into the bbolt file when woken, once the
// store is idle.
func (st *Store) folder() {
	defer close(st.stopped)
	for range st.kick {
		for {
			st.mu.Lock()
			wait := foldIdle - time.Since(st.lastWrite)
			if st.closed || st.sealed >= maxSealed {
				wait = 0
			}
			st.mu.Unlock()
			if wait <= 0 {
				break
			}
			select {
			case <-time.After(wait):
			case <-st.quit:
			}
		}
		_ = st.foldSealed() // kept in foldErr; the next wake retries
		st.fold.Lock()
		n := st.folded
		st.folded = 0
		st.fold.Unlock()
		if fn := st.afterFold.Load(); fn != nil && n > 0 {
			(*fn)(n)
		}
	}
}

// foldSealed folds every closed segment into the bbolt file, oldest
// first, one transaction each (which also records the segment's number,
// so a crash before its file is removed does not replay it again), and
// removes them.
func (st *Store) foldSealed() error {
	st.fold.Lock()
	defer st.fold.Unlock()
	// Segments below open are closed: a segment created later gets a
	// higher number.
	st.mu.Lock()
	open := st.next
	if st.cur != nil {
		open = st.cur.n
	}
	st.mu.Unlock()
	segs, err := segments(st.path)
	if err == nil {
		for _, n := range segs {
			if n >= open {
				break
			}
			if err = st.foldSegment(n); err != nil {
				break
			}
			st.mu.Lock()
			st.sealed = max(st.sealed-1, 0)
			st.mu.Unlock()
		}
	}
	st.foldErr = err
	return err
}

func (st *Store) foldSegment(n uint64) error {
	path := segmentPath(st.path, n)
	last := map[string][]byte{} // key → record, nil: deleted
	err := readSegment(path, func(e entry) error {
		last[string(e.key)] = e.val
		return nil
	})
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	slices.Sort(keys) // bbolt writes sorted keys much faster
	st.folded += len(keys)
	err = st.db.Update(func(tx *bolt.Tx) error {
		mb := tx.Bucket(metaBucket)
		if foldedThrough(mb) >= n {
			return nil // folded before a crash kept the file
		}
		bk := tx.Bucket(bucket)
		for _, k := range keys {
			var err error
			if v := last[k]; v != nil {
				err = bk.Put([]byte(k), v)
			} else {
				err = bk.Delete([]byte(k))
			}
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return mb.Put(journalDone, binary.BigEndian.AppendUint64(nil, n))
	})
	if err != nil {
		return fmt.Errorf("folding journal segment %d into %s: %w", n, st.path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

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
	f := newFrame(len(bans) * 40)
	var key [64]byte
	for i, b := range bans {
		if !b.Prefix.IsValid() {
			return fmt.Errorf("storing ban %d of %d: %w: prefix %v is not valid", i+1, len(bans), ErrInvalid, b.Prefix)
		}
		b.Prefix = b.Prefix.Masked()
		f.put(b.Prefix.AppendTo(key[:0]), encodeBan(b))
	}
	if err := st.write(f); err != nil {
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
	f := newFrame(len(ps) * 20)
	var key [64]byte
	for i, p := range ps {
		if !p.IsValid() {
			return fmt.Errorf("deleting ban %d of %d: %w: prefix %v is not valid", i+1, len(ps), ErrInvalid, p)
		}
		f.delete(p.Masked().AppendTo(key[:0]))
	}
	if err := st.write(f); err != nil {
		return fmt.Errorf("deleting %d bans from %s: %w", len(ps), st.path, err)
	}
	return nil
}

// Change stores put and deletes the bans of del in one transaction (one
// journal frame: after a crash, both or neither). Invalid prefixes fail
// it as Put and Delete do.
func (st *Store) Change(put []Ban, del []netip.Prefix) error {
	return st.Commit(put, nil, del)
}

// Commit is Change with strikes too: each one stored in place of its
// prefix's ban (a prefix has one record, a ban or a strike).
func (st *Store) Commit(put []Ban, strikes []Strike, del []netip.Prefix) error {
	if len(put)+len(strikes)+len(del) == 0 {
		return nil
	}
	f := newFrame(len(put)*40 + len(strikes)*30 + len(del)*20)
	var key [64]byte
	for _, b := range put {
		if !b.Prefix.IsValid() {
			return fmt.Errorf("storing ban %v: %w: the prefix is not valid", b.Prefix, ErrInvalid)
		}
		b.Prefix = b.Prefix.Masked()
		f.put(b.Prefix.AppendTo(key[:0]), encodeBan(b))
	}
	for _, s := range strikes {
		if !s.Prefix.IsValid() {
			return fmt.Errorf("storing the strike of %v: %w: the prefix is not valid", s.Prefix, ErrInvalid)
		}
		f.put(s.Prefix.Masked().AppendTo(key[:0]), encodeStrike(s))
	}
	for _, p := range del {
		if !p.IsValid() {
			return fmt.Errorf("deleting ban %v: %w: the prefix is not valid", p, ErrInvalid)
		}
		f.delete(p.Masked().AppendTo(key[:0]))
	}
	if err := st.write(f); err != nil {
		return fmt.Errorf("storing %d bans and %d strikes and deleting %d in %s: %w", len(put), len(strikes), len(del), st.path, err)
	}
	return nil
}

// Load returns every stored ban, expired ones too: callers Prune. A record
// that cannot be decoded, or whose prefix does not match its key, fails
// the load with an error wrapping ErrInvalid that names the key (delete
// it, or the file, to recover).
func (st *Store) Load() (*Set, error) {
	st.fold.Lock()
	defer st.fold.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	s := NewSet()
	var folded uint64
	err := st.db.View(func(tx *bolt.Tx) error {
		folded = foldedThrough(tx.Bucket(metaBucket))
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			return loadRecord(s, k, v)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("loading bans from %s: %w", st.path, err)
	}
	segs, err := segments(st.path)
	if err != nil {
		return nil, fmt.Errorf("loading bans from %s: listing its journal: %w", st.path, err)
	}
	for _, n := range segs {
		if n <= folded {
			continue
		}
		err := readSegment(segmentPath(st.path, n), func(e entry) error {
			if e.val != nil {
				return loadRecord(s, e.key, e.val)
			}
			p, err := netip.ParsePrefix(string(e.key))
			if err != nil {
				return fmt.Errorf("ban %q: %w: %v", e.key, ErrInvalid, err)
			}
			s.Delete(p)
			s.ForgetStrike(p)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("loading bans from %s: %w", st.path, err)
		}
	}
	return s, nil
}

// loadRecord decodes one stored ban or strike into s.
func loadRecord(s *Set, k, v []byte) error {
	if len(v) > 0 && v[0] == recordStrike {
		st, err := decodeStrike(k, v)
		if err != nil || !bytes.Equal(storeKey(st.Prefix), k) {
			return fmt.Errorf("strike %q: %w: %v", k, ErrInvalid, err)
		}
		s.PutStrike(st)
		return nil
	}
	b, err := decodeBan(k, v)
	if err != nil {
		return fmt.Errorf("ban %q: %w: %v", k, ErrInvalid, err)
	}
	if !b.Prefix.IsValid() || !bytes.Equal(storeKey(b.Prefix), k) {
		return fmt.Errorf("ban %q: %w: its prefix is %v", k, ErrInvalid, b.Prefix)
	}
	s.Put(b)
	return nil
}

// Records are binary: a version byte (1), then the expiry and the
// creation time as Unix nanoseconds (varints; 0: the zero time, for an
// expiry permanent), then
// reason and origin, each a length (uvarint) and its bytes. The prefix is
// the key. A record starting with '{' is the JSON of a Ban (the format of
// earlier versions), still read.
const recordV1 = 1

// A strike's record (Recidive): a version byte (2), then its ban's
// duration in nanoseconds and until when it counts, in Unix nanoseconds
// (varints). Versions before recidive cannot read it.
const recordStrike = 2

func encodeStrike(s Strike) []byte {
	buf := make([]byte, 0, 1+2*binary.MaxVarintLen64)
	buf = append(buf, recordStrike)
	buf = binary.AppendVarint(buf, int64(s.TTL))
	return binary.AppendVarint(buf, nanos(s.Until))
}

func decodeStrike(key, v []byte) (Strike, error) {
	var s Strike
	p, err := netip.ParsePrefix(string(key))
	if err != nil {
		return s, err
	}
	s.Prefix = p
	r := v[1:]
	ttl, k := binary.Varint(r)
	if k <= 0 {
		return s, errors.New("truncated strike")
	}
	until, k2 := binary.Varint(r[k:])
	if k2 <= 0 || ttl <= 0 || until == 0 {
		return s, errors.New("truncated or bad strike")
	}
	s.TTL, s.Until = time.Duration(ttl), fromNanos(until)
	return s, nil
}

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
