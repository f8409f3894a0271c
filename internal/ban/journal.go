package ban

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The journal is what makes a ban durable quickly. bbolt syncs twice per
// transaction and rewrites the pages it touches; a ban under attack needs
// one append and one fdatasync. So Put and Delete append a frame to the
// current journal segment and sync it; a background compaction folds
// closed segments into the bbolt file (one transaction per segment, which
// also records the segment's number) and removes them. Load reads the
// bbolt file, then replays the segments it has not folded, in order.
//
// A segment is the file "<store>.journal-<n>" (n counts up from 1),
// preallocated and filled with frames:
//
//	uint32 payload length (little endian), uint32 CRC-32C of the payload,
//	payload: entries, each 'P' key value (a put) or 'D' key (a delete),
//	with key and value as uvarint length + bytes (key and record as in
//	the bbolt bucket).
//
// A frame is synced before the call that wrote it returns. A frame that is
// cut short or fails its checksum (a write the process or machine died
// in, never acknowledged) ends its segment: replay stops there. A zero
// length ends it too (the preallocated rest of the file).
const (
	journalPrefix = ".journal-"
	// preallocate is how much a segment grows by; a sync after writing
	// into allocated space is cheaper than after growing the file.
	preallocate = 1 << 20
	frameHeader = 8
	opPut       = 'P'
	opDelete    = 'D'
)

// compactAt is the size at which a segment is closed and folded into the
// bbolt file (a variable for tests).
var compactAt int64 = 8 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaBucket holds "journal": the number of the last segment folded into
// the bbolt file (uint64, big endian).
var (
	metaBucket  = []byte("meta")
	journalDone = []byte("journal")
)

// frame is one journal frame being built.
type frame struct{ buf []byte }

func newFrame(sizeHint int) *frame {
	return &frame{buf: make([]byte, frameHeader, frameHeader+sizeHint)}
}

func (f *frame) put(key, val []byte) {
	f.buf = append(f.buf, opPut)
	f.buf = binary.AppendUvarint(f.buf, uint64(len(key)))
	f.buf = append(f.buf, key...)
	f.buf = binary.AppendUvarint(f.buf, uint64(len(val)))
	f.buf = append(f.buf, val...)
}

func (f *frame) delete(key []byte) {
	f.buf = append(f.buf, opDelete)
	f.buf = binary.AppendUvarint(f.buf, uint64(len(key)))
	f.buf = append(f.buf, key...)
}

// bytes seals the frame: length and checksum.
func (f *frame) bytes() []byte {
	p := f.buf[frameHeader:]
	binary.LittleEndian.PutUint32(f.buf[0:], uint32(len(p)))
	binary.LittleEndian.PutUint32(f.buf[4:], crc32.Checksum(p, castagnoli))
	return f.buf
}

// entry is one decoded journal entry; val is nil for a delete.
type entry struct {
	key, val []byte
}

// errCorrupt marks an entry list that does not parse although its frame's
// checksum matched: not a torn write but a bug or tampering.
var errCorrupt = errors.New("corrupt journal entry")

// decodeEntries parses a frame's payload.
func decodeEntries(p []byte, fn func(entry) error) error {
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(p)
		if k <= 0 || uint64(len(p)-k) < n {
			return nil, errCorrupt
		}
		b := p[k : k+int(n)]
		p = p[k+int(n):]
		return b, nil
	}
	for len(p) > 0 {
		op := p[0]
		p = p[1:]
		key, err := next()
		if err != nil {
			return err
		}
		var e entry
		e.key = key
		switch op {
		case opPut:
			if e.val, err = next(); err != nil {
				return err
			}
		case opDelete:
		default:
			return fmt.Errorf("%w: operation %q", errCorrupt, op)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// readSegment calls fn for every entry of the segment at path, in order,
// up to the first frame that is cut short, fails its checksum or has
// length zero.
func readSegment(path string, fn func(entry) error) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for len(data) >= frameHeader {
		n := binary.LittleEndian.Uint32(data)
		sum := binary.LittleEndian.Uint32(data[4:])
		if n == 0 || uint64(len(data)-frameHeader) < uint64(n) {
			return nil
		}
		p := data[frameHeader : frameHeader+int(n)]
		if crc32.Checksum(p, castagnoli) != sum {
			return nil
		}
		if err := decodeEntries(p, fn); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		data = data[frameHeader+int(n):]
	}
	return nil
}

// segments returns the numbers of the journal segments of the store at
// path, ascending.
func segments(path string) ([]uint64, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, de := range des {
		rest, ok := strings.CutPrefix(de.Name(), base+journalPrefix)
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

func segmentPath(path string, n uint64) string {
	return path + journalPrefix + strconv.FormatUint(n, 10)
}

// segment is the journal segment being written.
type segment struct {
	f         *os.File
	n         uint64
	size, cap int64 // bytes written, bytes allocated
}

func createSegment(path string, n uint64) (*segment, error) {
	f, err := os.OpenFile(segmentPath(path, n), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	// The new name must survive a crash, or its frames would be lost.
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, err
	}
	return &segment{f: f, n: n}, nil
}

// append writes b at the end and syncs it.
func (s *segment) append(b []byte) error {
	if end := s.size + int64(len(b)); end > s.cap {
		grow := max(preallocate, end-s.cap)
		if err := unix.Fallocate(int(s.f.Fd()), 0, s.cap, grow); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("preallocating the journal: %w", err)
		}
		s.cap += grow
	}
	if _, err := s.f.WriteAt(b, s.size); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(s.f.Fd())); err != nil {
		// The frame may or may not be on disk; what follows it must not
		// land after a hole. Zero it so replay stops before it.
		_, _ = s.f.WriteAt(make([]byte, frameHeader), s.size)
		return fmt.Errorf("syncing the journal: %w", err)
	}
	s.size += int64(len(b))
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// errClosed is returned by writes to a closed Store.
var errClosed = errors.New("the store is closed")
