// Package geo embeds the bundled country IP range data: every allocated IPv4
// and IPv6 range tagged with its ISO 3166-1 alpha-2 country code, as gzipped
// "first,last,CC" CSV (see README.md in this directory).
//
// The data is © Number Resource Organization (nro.net), CC BY 4.0
// (LICENSE-NRO); whoever ships it, or data derived from it, must give the
// attribution in Attribution. The compilation (ip-location-db
// geo-whois-asn-country) is CC0.
package geo

import (
	_ "embed" // the files below
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Names of the embedded files.
const (
	IPv4 = "country-ipv4.csv.gz"
	IPv6 = "country-ipv6.csv.gz"
)

// Attribution is the notice to show wherever the embedded data, or data
// derived from it, is shipped or printed.
const Attribution = "country data © Number Resource Organization (nro.net), CC BY 4.0"

var (
	//go:embed country-ipv4.csv.gz
	ipv4 string
	//go:embed country-ipv6.csv.gz
	ipv6 string
)

// Open returns a reader of the embedded file IPv4 or IPv6. Any other name
// gives an error wrapping fs.ErrNotExist.
//
// Closing the reader hands the file's pages back: the process's memory
// maps them from the binary, and once read they would count in its
// resident memory for as long as it runs (3.4 MB; a daemon reads them
// once, at load). They stay in the page cache, and a later Open reads
// them from there.
func Open(name string) (io.ReadCloser, error) {
	var data string
	switch name {
	case IPv4:
		data = ipv4
	case IPv6:
		data = ipv6
	default:
		return nil, fmt.Errorf("embedded file %q: %w", name, fs.ErrNotExist)
	}
	return embedded{strings.NewReader(data), data}, nil
}

type embedded struct {
	*strings.Reader
	data string
}

// Close drops the whole pages of the file from the process's memory
// (madvise MADV_DONTNEED: the binary's read-only mapping, read again from
// the file on the next access). Only where the data is mapped from a file:
// in an anonymous mapping (a binary unpacked into memory by a packer such
// as UPX) the pages would read back as zeros. It never fails: memory that
// stays mapped is only memory.
func (e embedded) Close() error {
	if b := pages(e.data); len(b) > 0 && fileBacked(uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b)) {
		_ = unix.Madvise(b, unix.MADV_DONTNEED)
	}
	return nil
}

// fileBacked reports whether /proc/self/maps shows [addr, addr+n) within
// one read-only mapping of a file (an inode), not anonymous memory.
func fileBacked(addr uintptr, n int) bool {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(maps)) {
		// start-end perms offset dev inode [path]
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || uint64(addr) < start || uint64(addr) >= end {
			continue
		}
		return uint64(addr)+uint64(n) <= end && !strings.Contains(f[1], "w") && f[4] != "0"
	}
	return false
}

// pages returns the whole pages within data's bytes, as a slice that
// must not be written.
func pages(data string) []byte {
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.StringData(data)))
	lo, hi := (start+page-1)&^(page-1), (start+uintptr(len(data)))&^(page-1)
	if hi <= lo {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.StringData(data)), lo-start)), hi-lo)
}
