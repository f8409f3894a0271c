package xdp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// A pin root holds a folder per network namespace, "netns-INODE" (see
// pinPath). The kernel gives a new namespace the lowest free inode
// number, often that of one just deleted, so the folder also holds an
// empty folder "netns_cookie_COOKIE" with the namespace's cookie, which is
// never reused: the pins of a deleted namespace are told from those of a
// new one with its inode.
const (
	pinPrefix    = "netns-"
	cookiePrefix = "netns_cookie_"
)

// Pin is the pin folder of one network namespace.
type Pin struct {
	Dir   string `json:"dir"`
	NetNS uint64 `json:"netns_inode"` // the inode of the namespace it was made for
	// Gone: that namespace no longer exists (no live namespace has its
	// inode, or the one that has it has another cookie).
	Gone bool `json:"gone"`
	// Attached counts its links still attached to an interface (a link
	// that cannot be read counts, to be safe).
	Attached int `json:"attached"`
	// MapBytes is the kernel memory of its program's maps, 0 if unknown.
	MapBytes uint64   `json:"map_bytes,omitempty"`
	marks    []uint64 // the cookies it records
}

// Stale reports whether p can go: its namespace is gone and its program
// runs nowhere, yet its pins keep the program and its maps in memory.
func (p Pin) Stale() bool { return p.Gone && p.Attached == 0 }

// String is p for messages: "DIR (network namespace INODE, gone, 12.3
// MiB of maps)".
func (p Pin) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (network namespace %d", p.Dir, p.NetNS)
	if p.Gone {
		b.WriteString(", gone")
	}
	if p.Attached > 0 {
		fmt.Fprintf(&b, ", %d links attached", p.Attached)
	}
	if p.MapBytes > 0 {
		fmt.Fprintf(&b, ", %.1f MiB of maps", float64(p.MapBytes)/(1<<20))
	}
	b.WriteString(")")
	return b.String()
}

// Pins lists the namespaces' pin folders under root ("" is
// DefaultPinDir), each with whether its namespace still exists; nil when
// root does not exist.
func Pins(root string) ([]Pin, error) {
	if root == "" {
		root = DefaultPinDir
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the XDP pins in %s: %w", root, err)
	}
	var live map[uint64]string
	var out []Pin
	for _, e := range entries {
		ino, ok := parsePinName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if live == nil {
			if live, err = netns.Live(); err != nil {
				return nil, fmt.Errorf("listing the XDP pins in %s: %w", root, err)
			}
		}
		p := Pin{Dir: filepath.Join(root, e.Name()), NetNS: ino}
		var links []string
		p.marks, links = readPinDir(p.Dir)
		p.Gone = gone(ino, p.marks, live, netns.Cookie)
		p.Attached = attachedLinks(p.Dir, links)
		p.MapBytes = mapBytes(p.Dir)
		out = append(out, p)
	}
	return out, nil
}

// RemoveStale removes the stale pin folders under root ("" is
// DefaultPinDir; see Pin.Stale) and returns them. It removes nothing
// else: not the pins of a namespace that exists, nor anything but
// "netns-INODE" folders on a bpffs.
func RemoveStale(root string) ([]Pin, error) {
	if root == "" {
		root = DefaultPinDir
	}
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err := checkBPFFS(root); err != nil {
		return nil, err
	}
	pins, err := Pins(root)
	if err != nil {
		return nil, err
	}
	var removed []Pin
	var errs []error
	for _, p := range pins {
		if !p.Stale() {
			continue
		}
		// A namespace made meanwhile with the same inode marks the
		// folder as its own when ipfence applies there.
		if marks, _ := readPinDir(p.Dir); !slices.Equal(marks, p.marks) {
			continue
		}
		if err := removePins(p.Dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// parsePinName returns the namespace inode of a pin folder's name,
// "netns-INODE".
func parsePinName(name string) (uint64, bool) {
	return parseNumbered(name, pinPrefix)
}

// parseNumbered returns N of a name that is prefix and the decimal N,
// written as strconv does.
func parseNumbered(name, prefix string) (uint64, bool) {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != digits {
		return 0, false
	}
	return n, true
}

// readPinDir returns the cookies a pin folder records and the names of
// its links.
func readPinDir(dir string) (marks []uint64, links []string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if c, ok := parseNumbered(e.Name(), cookiePrefix); ok {
			marks = append(marks, c)
		} else if strings.HasPrefix(e.Name(), "link_") {
			links = append(links, e.Name())
		}
	}
	return marks, links
}

// gone reports whether the namespace of inode ino whose pins record the
// cookies marks is gone, given the live namespaces (netns.Live) and how
// to read a namespace's cookie. Unmarked pins (of an older ipfence, or a
// kernel without cookies) go by the inode alone; a cookie that cannot be
// read keeps the namespace alive.
func gone(ino uint64, marks []uint64, live map[uint64]string, cookie func(string) (uint64, error)) bool {
	path, ok := live[ino]
	if !ok {
		return true
	}
	if len(marks) == 0 {
		return false
	}
	c, err := cookie(path)
	return err == nil && !slices.Contains(marks, c)
}

// markPins records the cookie of namespace ns in its pin folder dir,
// replacing the mark of an earlier namespace that had the same inode. A
// kernel without namespace cookies (before 5.14) leaves it unmarked.
func markPins(dir, ns string) error {
	c, err := netns.Cookie(ns)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("marking the XDP pin folder: %w", err)
	}
	want := cookiePrefix + strconv.FormatUint(c, 10)
	marks, _ := readPinDir(dir)
	for _, m := range marks {
		if m == c {
			continue
		}
		p := filepath.Join(dir, cookiePrefix+strconv.FormatUint(m, 10))
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("removing the mark %s of an earlier namespace: %w", p, err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, want), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("marking the XDP pin folder: %w", err)
	}
	return nil
}

// attachedLinks counts the links of dir (names) attached to an
// interface; a link that cannot be read counts.
func attachedLinks(dir string, names []string) int {
	n := 0
	for _, name := range names {
		l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
		if err != nil {
			n++
			continue
		}
		info, err := l.Info()
		l.Close()
		// An XDP link whose interface was deleted, as with its
		// namespace, reports ifindex 0.
		if err != nil || info.XDP() == nil || info.XDP().Ifindex != 0 {
			n++
		}
	}
	return n
}

// mapBytes is the kernel memory of the maps of the program pinned in dir
// (0 if unknown).
func mapBytes(dir string) uint64 {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog"), nil)
	if err != nil {
		return 0
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return 0
	}
	ids, _ := info.MapIDs()
	var n uint64
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		if mi, err := m.Info(); err == nil {
			b, _ := mi.Memlock()
			n += b
		}
		m.Close()
	}
	return n
}
