package geo

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"testing"
	"unsafe"
)

// resident counts the pages of b mapped into this process
// (/proc/self/pagemap's present bit).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	defer f.Close()
	page := uintptr(os.Getpagesize())
	buf := make([]byte, (hi-lo)/page*8)
	if _, err := f.ReadAt(buf, int64(lo/page*8)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 0; i < len(buf); i += 8 {
		if binary.LittleEndian.Uint64(buf[i:])>>63 == 1 {
			n++
		}
	}
	return n
}

// TestOpenRelease: an embedded file reads the same after its pages were
// handed back, and closing it does hand them back.
func TestOpenRelease(t *testing.T) {
	for _, name := range []string{IPv4, IPv6} {
		read := func() [32]byte {
			r, err := Open(name)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			if _, err := io.Copy(h, r); err != nil {
				t.Fatal(err)
			}
			b := pages(r.(embedded).data)
			if n, all := resident(t, b), len(b)/os.Getpagesize(); n < all/2 {
				t.Errorf("%s: %d pages resident after reading it, want most of %d", name, n, all)
			}
			r.Close()
			if n := resident(t, b); n != 0 {
				t.Errorf("%s: %d pages still resident after Close", name, n)
			}
			return [32]byte(h.Sum(nil))
		}
		if a, b := read(), read(); a != b {
			t.Errorf("%s reads differently after Close", name)
		}
	}
	// Anonymous memory (a packed binary's data) is never dropped: it would
	// read back as zeros.
	anon := make([]byte, 3*os.Getpagesize())
	if fileBacked(uintptr(unsafe.Pointer(unsafe.SliceData(anon))), len(anon)) {
		t.Error("fileBacked: the heap counts as a file's mapping")
	}
	if b := pages(ipv4); !fileBacked(uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b)) {
		t.Error("fileBacked: the binary's embedded data does not count as a file's mapping")
	}
	if _, err := Open("country.csv"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of an unknown name: %v, want fs.ErrNotExist", err)
	}
}
