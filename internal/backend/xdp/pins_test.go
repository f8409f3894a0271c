package xdp

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestParsePinName: only "netns-" and a namespace inode as strconv
// writes it name a pin folder.
func TestParsePinName(t *testing.T) {
	if n, ok := parsePinName("netns-4026531840"); !ok || n != 4026531840 {
		t.Errorf("netns-4026531840: %d, %v", n, ok)
	}
	for _, bad := range []string{"netns-", "netns-01", "netns-+1", "netns--1", "netns-1x", "netns-99999999999999999999", "maps.debug", "netns_cookie_1"} {
		if _, ok := parsePinName(bad); ok {
			t.Errorf("%q parsed as a pin folder", bad)
		}
	}
}

// TestGone: a namespace is gone when no live one has its inode, or the
// one that has it has another cookie than the pins record; an unmarked
// folder goes by the inode, and a cookie that cannot be read keeps it.
func TestGone(t *testing.T) {
	live := map[uint64]string{10: "/proc/1/ns/net", 11: "/run/netns/b"}
	cookies := map[string]uint64{"/proc/1/ns/net": 1, "/run/netns/b": 7}
	cookie := func(path string) (uint64, error) {
		if c, ok := cookies[path]; ok {
			return c, nil
		}
		return 0, errors.New("gone meanwhile")
	}
	for _, tc := range []struct {
		ino   uint64
		marks []uint64
		gone  bool
	}{
		{10, []uint64{1}, false},
		{10, nil, false},
		{11, []uint64{6}, true}, // inode reused by a new namespace
		{11, []uint64{6, 7}, false},
		{12, nil, true},
		{12, []uint64{9}, true},
	} {
		if got := gone(tc.ino, tc.marks, live, cookie); got != tc.gone {
			t.Errorf("inode %d, marks %v: gone %v, want %v", tc.ino, tc.marks, got, tc.gone)
		}
	}
	delete(cookies, "/run/netns/b")
	if gone(11, []uint64{6}, live, cookie) {
		t.Errorf("a namespace whose cookie cannot be read counts as gone")
	}
	if p := (Pin{Gone: true, Attached: 1}); p.Stale() {
		t.Errorf("%v is stale although attached", p)
	}
}

// TestPinMarks: a pin folder records its namespace's cookie, replacing
// that of an earlier namespace with the same inode; RemoveStale removes
// the folder of a namespace that is gone and nothing else.
func TestPinMarks(t *testing.T) {
	lab := netnstest.New(t)
	root := netnstest.BPFFS(t)
	opt := Options{NetNS: lab.FW, PinDir: root}
	dir, err := pinPath(opt)
	if err != nil {
		t.Fatal(err)
	}
	// An earlier namespace's folder, as the kernel reuses inodes.
	if err := os.MkdirAll(filepath.Join(dir, cookiePrefix+"1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := pinDir(opt); err != nil {
		t.Fatal(err)
	}
	c, err := netns.Cookie(lab.FW)
	if err != nil {
		t.Fatal(err)
	}
	if marks, _ := readPinDir(dir); !slices.Equal(marks, []uint64{c}) {
		t.Errorf("marks %v, want the lab's cookie %d", marks, c)
	}
	// Inode 1 is never a namespace's (theirs start at 0xF0000000).
	gonePins := filepath.Join(root, "netns-1")
	other := filepath.Join(root, "other")
	for _, d := range []string{gonePins, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	pins, err := Pins(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 2 {
		t.Fatalf("pins %v, want the lab's and netns-1", pins)
	}
	for _, p := range pins {
		if want := p.Dir == gonePins; p.Stale() != want || p.Gone != want {
			t.Errorf("%v: stale %v, want %v", p, p.Stale(), want)
		}
	}
	removed, err := RemoveStale(root)
	if err != nil || len(removed) != 1 || removed[0].Dir != gonePins {
		t.Errorf("RemoveStale: %v, %v; want %s", removed, err, gonePins)
	}
	for _, d := range []string{dir, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("RemoveStale removed %s: %v", d, err)
		}
	}
	if _, err := RemoveStale(t.TempDir()); err == nil {
		t.Errorf("RemoveStale in a folder that is not on a bpffs: no error")
	}
}
