package xdp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// FromPlan returns the rules of p that run in XDP (see plan.XDPRules) as
// XDP rules: a drop rule drops its set, an allow-only rule every address
// of its families outside its set (which holds the protected prefixes);
// stateless or connection-aware as the plan's rule.
func FromPlan(p *plan.Plan) []Rule {
	var out []Rule
	for _, r := range p.XDPRules() {
		drop := r.Set
		if r.Action == plan.AllowOnly {
			drop = prefix.Complement(r.Set, r.V4.Kind != plan.KindEmpty, r.V6.Kind != plan.KindEmpty)
		}
		// The XDP tables are built from a netipx set; it lives while
		// they are.
		out = append(out, Rule{Name: r.Name, Drop: drop.IPSet(), Stateless: r.Stateless})
	}
	return out
}

// DefaultPinDir is where Attach pins what must outlive ipfence: a folder
// per network namespace holding the program, the counters and a link per
// interface.
const DefaultPinDir = "/sys/fs/bpf/ipfence"

// Mode is how a program is attached to an interface.
type Mode string

const (
	Native  Mode = "native"  // in the driver, before any allocation
	Generic Mode = "generic" // after the kernel built an skb: any driver, slower
)

// Options say where a program goes.
type Options struct {
	NetNS      string   // "" is the current namespace
	Interfaces []string // at least one
	PinDir     string   // "" is DefaultPinDir; must be on a bpffs
	// Generic attaches in generic mode even where the driver has native
	// XDP (for tests and drivers whose native XDP misbehaves).
	Generic bool
}

// Interface is one interface the program runs on.
type Interface struct {
	Name    string `json:"name"`
	Index   int    `json:"ifindex"`
	Mode    Mode   `json:"mode"`
	Program uint32 `json:"program_id"`
}

// ErrNoInterface is returned when an interface of the policy does not
// exist in the namespace.
var ErrNoInterface = errors.New("no such interface")

// ErrOtherProgram is returned when an interface already runs an XDP
// program that ipfence did not attach.
var ErrOtherProgram = errors.New("interface runs another XDP program")

// Swap replaces the XDP program of a namespace: Attach builds the
// replacement beside the old one and switches each interface to it in one
// step (bpf_link update); Commit makes it the pinned one, Revert puts the
// old program back. Close releases what is left either way.
type Swap struct {
	opt   Options
	dir   string
	objs  *Objects
	ifs   []Interface
	links []swapLink
	old   *ebpf.Program // the pinned program being replaced, if any
	Load  time.Duration // creating and filling maps, verifying the program
}

type swapLink struct {
	name    string
	link    link.Link
	created bool // attached by this swap; else updated from old
}

// Prepare loads l's maps and program for opt's namespace and interfaces
// and checks that every interface exists there. Nothing is attached: on
// error the kernel is as it was.
func Prepare(l *Layout, opt Options) (_ *Swap, err error) {
	s := &Swap{opt: opt}
	if s.dir, s.ifs, err = resolve(opt); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if s.objs, err = l.Load(LoadOptions{}); err != nil {
		return nil, loadHint(err)
	}
	s.Load = time.Since(t0)
	if p, err := ebpf.LoadPinnedProgram(filepath.Join(s.dir, "prog"), nil); err == nil {
		s.old = p
	}
	return s, nil
}

// Check returns the error Prepare would for opt's pin folder and
// interfaces, without building anything: to fail before compiling.
func Check(opt Options) error {
	_, _, err := resolve(opt)
	return err
}

// resolve returns opt's pin folder, made if missing, and its interfaces.
func resolve(opt Options) (dir string, ifs []Interface, err error) {
	if len(opt.Interfaces) == 0 {
		return "", nil, fmt.Errorf("attaching XDP rules: no interfaces given")
	}
	if dir, err = pinDir(opt); err != nil {
		return "", nil, err
	}
	err = netns.Do(opt.NetNS, func() error {
		for _, name := range opt.Interfaces {
			nl, err := netlink.LinkByName(name)
			if err != nil {
				return fmt.Errorf("%w: %s; list them with `ip link`", ErrNoInterface, name)
			}
			ifs = append(ifs, Interface{Name: name, Index: nl.Attrs().Index})
		}
		return nil
	})
	return dir, ifs, err
}

// Reattach attaches the pinned program of opt's namespace to those of
// opt.Interfaces that do not run it (an interface made again, a link pin
// removed), building nothing, and returns their names. It returns
// ErrNotLoaded when no program is pinned.
func Reattach(opt Options) ([]string, error) {
	dir, ifs, err := resolve(opt)
	if err != nil {
		return nil, err
	}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotLoaded
	}
	if err != nil {
		return nil, fmt.Errorf("opening the pinned XDP program: %w", err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("reading the pinned XDP program: %w", err)
	}
	id, _ := info.ID()
	s := &Swap{opt: opt, dir: dir, objs: &Objects{Program: prog}}
	var fixed []string
	err = netns.Do(opt.NetNS, func() error {
		for i := range ifs {
			_, running, err := attached(ifs[i].Index)
			if err != nil {
				return err
			}
			if running == uint32(id) {
				continue
			}
			if err := s.attach(&ifs[i]); err != nil {
				return fmt.Errorf("attaching XDP to %s again: %w", ifs[i].Name, err)
			}
			fixed = append(fixed, ifs[i].Name)
		}
		return nil
	})
	for _, sl := range s.links {
		sl.link.Close() // pinned: stays attached
	}
	return fixed, err
}

// loadHint adds what to do to a load error.
func loadHint(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: loading XDP programs needs root (CAP_BPF and CAP_NET_ADMIN)", err)
	case errors.Is(err, ErrRejected):
		return fmt.Errorf("%w (a bug in ipfence, or a kernel older than it supports: please report it with this message)", err)
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.E2BIG):
		return fmt.Errorf("%w: the XDP tables do not fit in the memory ipfence may use (the machine's, or its cgroup's limit such as systemd's MemoryMax=); raise it, or keep the largest rules in nftables (backend: nftables)", err)
	}
	return err
}

// Attach switches every interface to the new program: interfaces that
// run ipfence's previous program switch atomically (bpf_link update), the
// others get a new link, natively where the driver can and generic
// otherwise. On error every interface is put back as it was.
func (s *Swap) Attach() error {
	err := netns.Do(s.opt.NetNS, func() error {
		for i := range s.ifs {
			if err := s.attach(&s.ifs[i]); err != nil {
				return fmt.Errorf("attaching XDP to %s: %w", s.ifs[i].Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return errors.Join(err, s.Revert())
	}
	return nil
}

func (s *Swap) attach(ifc *Interface) error {
	path := s.linkPath(ifc.Name)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, err := l.Info()
		if err == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifc.Index {
			if err := l.Update(s.objs.Program); err != nil {
				l.Close()
				return fmt.Errorf("replacing the program: %w", err)
			}
			s.links = append(s.links, swapLink{name: ifc.Name, link: l})
			return s.describe(ifc)
		}
		// The interface was deleted or made again: that link is dead.
		l.Close()
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("removing the stale link: %w", err)
		}
	}
	modes := []link.XDPAttachFlags{link.XDPDriverMode, link.XDPGenericMode}
	if s.opt.Generic {
		modes = modes[1:]
	}
	var errs []error
	for _, m := range modes {
		l, err := link.AttachXDP(link.XDPOptions{Program: s.objs.Program, Interface: ifc.Index, Flags: m})
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w (see `ip link show %s`); detach it first", ErrOtherProgram, ifc.Name)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pinning the link: %w", err)
		}
		s.links = append(s.links, swapLink{name: ifc.Name, link: l, created: true})
		return s.describe(ifc)
	}
	return errors.Join(errs...)
}

// describe fills in ifc's mode and program as the kernel reports them.
func (s *Swap) describe(ifc *Interface) error {
	m, id, err := attached(ifc.Index)
	ifc.Mode, ifc.Program = m, id
	return err
}

// attached returns the mode and program of the XDP program on the
// interface of index (in the current namespace).
func attached(index int) (Mode, uint32, error) {
	nl, err := netlink.LinkByIndex(index)
	if err != nil {
		return "", 0, fmt.Errorf("reading interface %d: %w", index, err)
	}
	x := nl.Attrs().Xdp
	if x == nil || !x.Attached {
		return "", 0, nil
	}
	mode := Native
	if x.AttachMode == nl2XDPGeneric {
		mode = Generic
	}
	return mode, x.ProgId, nil
}

// nl2XDPGeneric is XDP_ATTACHED_SKB of IFLA_XDP_ATTACHED.
const nl2XDPGeneric = 2

// Interfaces are where the new program runs (after Attach).
func (s *Swap) Interfaces() []Interface { return s.ifs }

// Revert puts every interface Attach switched back as it was: updated
// links get the old program again, new links are removed.
func (s *Swap) Revert() error {
	var errs []error
	for _, sl := range s.links {
		if sl.created {
			errs = append(errs, sl.link.Unpin(), sl.link.Close())
			continue
		}
		if s.old != nil {
			errs = append(errs, sl.link.Update(s.old))
		}
		errs = append(errs, sl.link.Close())
	}
	s.links = nil
	return errors.Join(errs...)
}

// Commit pins the new program and counters in place of the old, and
// detaches ipfence's program from interfaces no longer listed.
func (s *Swap) Commit() error {
	for _, sl := range s.links {
		sl.link.Close() // pinned: stays attached
	}
	s.links = nil
	errs := []error{
		repin(s.objs.Program, filepath.Join(s.dir, "prog")),
		repin(s.objs.Stats, filepath.Join(s.dir, "stats")),
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "link_")
		if ok && !slices.Contains(s.opt.Interfaces, name) {
			errs = append(errs, os.Remove(filepath.Join(s.dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// repin pins obj at path, replacing what is there in one rename.
func repin(obj interface{ Pin(string) error }, path string) error {
	tmp := path + "_new" // bpffs refuses names with dots
	os.Remove(tmp)
	if err := obj.Pin(tmp); err != nil {
		return fmt.Errorf("pinning %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pinning %s: %w", path, err)
	}
	return nil
}

// Close releases the swap's file descriptors; what is pinned or attached
// stays.
func (s *Swap) Close() error {
	errs := []error{s.Revert()}
	if s.objs != nil {
		errs = append(errs, s.objs.Close())
	}
	if s.old != nil {
		errs = append(errs, s.old.Close())
	}
	return errors.Join(errs...)
}

func (s *Swap) linkPath(ifname string) string { return filepath.Join(s.dir, "link_"+ifname) }

// Flush detaches ipfence's XDP program from every interface of the
// namespace and removes its pins. It reports whether there was one.
//
// The interfaces are read over netlink too, not only through the pins:
// under `ip netns exec` the bpffs with the pins is not mounted, and a
// program whose pins were lost stays attached all the same. A program
// counts as ipfence's by its name.
func Flush(opt Options) (bool, error) {
	dir, err := pinPath(opt)
	if err != nil {
		return false, err
	}
	found, err := detachByName(opt)
	if err != nil {
		return found, err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return found, nil
	}
	return true, removePins(dir)
}

// removePins detaches the links pinned in a namespace's pin folder dir
// and removes the folder.
func removePins(dir string) error {
	// The links are detached first: removing a pin drops the last
	// reference to a link, a program or a map, but bpffs frees the inode
	// after an RCU grace period, so the program would stay attached for
	// a moment after the pins are gone.
	links, _ := filepath.Glob(filepath.Join(dir, "link_*"))
	for _, path := range links {
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			continue // not a link any more: removed below all the same
		}
		err = l.Detach()
		l.Close()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("detaching XDP link %s: %w", path, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the XDP pins in %s: %w", dir, err)
	}
	return nil
}

// Status is what runs in XDP in a namespace.
type Status struct {
	PinDir     string      `json:"pin_dir"`
	Program    uint32      `json:"program_id"`
	Name       string      `json:"program_name"`
	Interfaces []Interface `json:"interfaces"`
	// Counters are by class (0: passed, k: dropped by the k-th rule), each
	// per CPU.
	Counters [][]Counters `json:"counters"`
	// Conn counts, per CPU, the packets of connection-aware rules' sets
	// passed on as parts of known connections (see ConnSlot); nil for a
	// program loaded before ipfence had them.
	Conn []Counters `json:"conn,omitempty"`
}

// ErrNotLoaded is returned by ReadStatus when no XDP program is pinned.
var ErrNotLoaded = errors.New("no XDP program is loaded")

// ReadStatus reports the pinned program of opt's namespace, where it runs
// and its counters for classes 0..classes.
func ReadStatus(opt Options, classes int) (Status, error) {
	dir, err := pinPath(opt)
	if err != nil {
		return Status{}, err
	}
	st := Status{PinDir: dir}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return st, ErrNotLoaded
	}
	if err != nil {
		return st, fmt.Errorf("opening the pinned XDP program: %w", err)
	}
	defer prog.Close()
	if info, err := prog.Info(); err == nil {
		id, _ := info.ID()
		st.Program, st.Name = uint32(id), info.Name
	}
	stats, err := ebpf.LoadPinnedMap(filepath.Join(dir, "stats"), nil)
	if err != nil {
		return st, fmt.Errorf("opening the pinned XDP counters: %w", err)
	}
	defer stats.Close()
	for c := range min(classes, MaxRules) + 1 {
		var per []Counters
		if err := stats.Lookup(uint32(c), &per); err != nil {
			return st, fmt.Errorf("reading the XDP counters of class %d: %w", c, err)
		}
		st.Counters = append(st.Counters, per)
	}
	if err := stats.Lookup(uint32(ConnSlot), &st.Conn); err != nil {
		st.Conn = nil // an older program's map, one slot shorter
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return st, err
	}
	err = netns.Do(opt.NetNS, func() error {
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), "link_")
			if !ok {
				continue
			}
			ifc := Interface{Name: name}
			if nl, err := netlink.LinkByName(name); err == nil {
				ifc.Index = nl.Attrs().Index
				if ifc.Mode, ifc.Program, err = attached(ifc.Index); err != nil {
					return err
				}
			}
			st.Interfaces = append(st.Interfaces, ifc)
		}
		return nil
	})
	return st, err
}

// Sum adds counters over CPUs.
func Sum(per []Counters) Counters {
	var s Counters
	for _, c := range per {
		s.Packets += c.Packets
		s.Bytes += c.Bytes
	}
	return s
}

// pinPath is the pin folder of opt's namespace: a folder per namespace,
// named by the namespace's inode so that the current one and a named one
// never share pins.
func pinPath(opt Options) (string, error) {
	root := opt.PinDir
	if root == "" {
		root = DefaultPinDir
	}
	nsFile := "/proc/self/ns/net"
	if opt.NetNS != "" {
		nsFile = netns.Path(opt.NetNS)
	}
	var st unix.Stat_t
	if err := unix.Stat(nsFile, &st); err != nil {
		return "", fmt.Errorf("%s: %w", netns.Describe(opt.NetNS), err)
	}
	return filepath.Join(root, fmt.Sprintf("netns-%d", st.Ino)), nil
}

// pinDir returns the pin folder of opt's namespace, made if missing on
// the bpffs that holds the root. The default root's bpffs is mounted at
// /sys/fs/bpf if nothing is (as bpftool does).
func pinDir(opt Options) (string, error) {
	dir, err := pinPath(opt)
	if err != nil {
		return "", err
	}
	root := filepath.Dir(dir)
	if opt.PinDir == "" || opt.PinDir == DefaultPinDir {
		if err := ensureBPFFS(filepath.Dir(DefaultPinDir)); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the XDP pin folder: %w", err)
	}
	if err := checkBPFFS(root); err != nil {
		return "", err
	}
	if err := markPins(dir, opt.NetNS); err != nil {
		return "", err
	}
	return dir, nil
}

// checkBPFFS fails unless root, an XDP pin root, is on a bpffs.
func checkBPFFS(root string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return fmt.Errorf("XDP pin folder %s: %w", root, err)
	}
	if fs.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("XDP pin folder %s is not on a bpf filesystem; mount one with `mount -t bpf bpf %s`", root, root)
	}
	return nil
}

// ensureBPFFS mounts a bpffs at dir unless one is there.
func ensureBPFFS(dir string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting the bpf filesystem at %s (needed to keep XDP programs across restarts): %w", dir, err)
	}
	return nil
}

// progName is the name of ipfence's XDP program (ProgramSpec.Name), by
// which Flush finds it on interfaces.
const progName = "ipfence"

// detachByName detaches every XDP program named progName from the
// interfaces of opt's namespace: through its bpf_link where it has one
// (as ipfence attaches), else over netlink. It reports whether there
// was any.
func detachByName(opt Options) (bool, error) {
	type attachment struct {
		link  netlink.Link
		prog  ebpf.ProgramID
		flags uint32
	}
	var ours []attachment
	err := netns.Do(opt.NetNS, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("listing interfaces: %w", err)
		}
		for _, l := range links {
			x := l.Attrs().Xdp
			if x == nil || !x.Attached || x.ProgId == 0 {
				continue
			}
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId))
			if err != nil {
				continue // detached meanwhile
			}
			info, err := p.Info()
			p.Close()
			if err != nil || info.Name != progName {
				continue
			}
			flags := uint32(unix.XDP_FLAGS_DRV_MODE)
			if x.AttachMode == nl2XDPGeneric {
				flags = unix.XDP_FLAGS_SKB_MODE
			}
			ours = append(ours, attachment{link: l, prog: ebpf.ProgramID(x.ProgId), flags: flags})
		}
		return nil
	})
	if err != nil || len(ours) == 0 {
		return false, err
	}
	// bpf_links by program (link IDs are global; a program is attached
	// to one interface of this namespace per link).
	byProg := map[ebpf.ProgramID][]link.Link{}
	it := new(link.Iterator)
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.XDPType {
			continue
		}
		byProg[info.Program] = append(byProg[info.Program], it.Take())
	}
	defer func() {
		for _, ls := range byProg {
			for _, l := range ls {
				l.Close()
			}
		}
	}()
	if err := it.Err(); err != nil {
		return true, fmt.Errorf("listing bpf links: %w", err)
	}
	for _, a := range ours {
		detached := false
		for _, l := range byProg[a.prog] {
			if err := l.Detach(); err == nil {
				detached = true
			}
		}
		if detached {
			continue
		}
		err := netns.Do(opt.NetNS, func() error {
			return netlink.LinkSetXdpFdWithFlags(a.link, -1, int(a.flags))
		})
		if err != nil {
			return true, fmt.Errorf("detaching XDP program %d from %s: %w", a.prog, a.link.Attrs().Name, err)
		}
	}
	return true, nil
}
