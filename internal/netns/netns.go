// Package netns runs code and commands inside named network namespaces and
// builds the two-namespace test lab ("fw" and "gen" joined by a veth pair)
// that every kernel test, the demo and the benchmarks use.
//
// It is ipfence's one way into a namespace: Do runs Go code in one, Open
// opens its file (for netlink connections made from outside it), and
// Command and Exec run a program in it. Everywhere a namespace is a name,
// "" meaning the current one.
//
// Named namespaces live where iproute2 keeps them, /run/netns/NAME, so
// `ip netns exec NAME ...` and an `--netns NAME` flag can target them. This
// package never changes the namespace the process was started in: all
// configuration happens on OS threads switched into a lab namespace, and a
// thread whose namespace cannot be restored is never reused.
//
// Every namespace this package creates has the prefix "ipf-"; Sweep removes
// such namespaces left behind by crashed runs (no live process holds them).
package netns

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RunDir is where named network namespaces are bind-mounted, as by iproute2.
const RunDir = "/run/netns"

// Prefix starts the name of every namespace this package creates.
const Prefix = "ipf-"

// ErrNotFound is wrapped by errors for a namespace name with no mounted
// namespace under RunDir.
var ErrNotFound = errors.New("network namespace not found")

// ErrExist is wrapped by errors for a namespace name that is already taken.
var ErrExist = errors.New("network namespace already exists")

// nsfsMagic is NSFS_MAGIC, the file system type of a namespace file.
const nsfsMagic = 0x6e736673

// Path returns the file under RunDir for namespace name.
func Path(name string) string { return filepath.Join(RunDir, name) }

// Key names namespace ns in a state folder, the same for every package
// that keeps files per namespace: "" (the current namespace) is
// "_current", a name or a file under RunDir (or /var/run/netns) is that
// name, and any other path is the path with its separators spelled "_"
// ("path_proc_42_ns_net"): namespaces given as /proc/PID/ns/net must not
// share one record.
func Key(ns string) string {
	switch dir := filepath.Dir(ns); {
	case ns == "":
		return "_current"
	case !filepath.IsAbs(ns), dir == RunDir, dir == "/var/run/netns", dir == "/run/netns", filepath.Clean(ns) == "/":
		return filepath.Base(ns) // "/" for the root, which callers refuse
	}
	return "path" + unsafeKey.ReplaceAllString(filepath.Clean(ns), "_")
}

var unsafeKey = regexp.MustCompile(`[^A-Za-z0-9.-]`)

// checkName rejects names that are not a single path element.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return fmt.Errorf("invalid network namespace name %q", name)
	}
	return nil
}

// Open returns the file of network namespace ns, for setns(2) or
// nftables.WithNetNSFd(int(f.Fd())): a name as `ip netns add` makes
// (RunDir/NAME), or an absolute path to a namespace file such as
// /proc/PID/ns/net. The caller closes it; the namespace stays alive at
// least as long as the file is open.
//
// It fails with an error wrapping ErrNotFound (and fs.ErrNotExist when
// there is no such file) when ns names no mounted namespace.
func Open(ns string) (*os.File, error) {
	path := ns
	if !filepath.IsAbs(ns) {
		if err := checkName(ns); err != nil {
			return nil, err
		}
		path = Path(ns)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: network namespace %s not found; list them with `ip netns list`: %w", ErrNotFound, ns, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", ns, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("opening network namespace %s: %w", ns, err)
	}
	if st.Type != nsfsMagic {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a mounted network namespace (stale file?); list them with `ip netns list`", ErrNotFound, path)
	}
	return f, nil
}

// Do runs fn in network namespace ns (see Open; "" is the current one) and
// returns fn's error.
//
// For "" it simply calls fn. Otherwise fn runs on a locked OS thread
// switched into ns: sockets and netlink handles fn creates belong to that
// namespace and stay usable from any goroutine afterwards; goroutines fn
// starts do NOT run in the namespace. fn runs on a goroutine of its own: a
// panic in fn is re-raised in the caller, but fn must not call
// runtime.Goexit (t.FailNow, t.Fatal): that is reported as an error. If the
// thread cannot be switched back to its original namespace, the error says
// so and the thread is left locked, so the runtime terminates it instead of
// reusing it.
func Do(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	f, err := Open(ns)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := doFile(f, fn); err != nil {
		return fmt.Errorf("in network namespace %s: %w", ns, err)
	}
	return nil
}

// doFile is Do for an open namespace file.
func doFile(f *os.File, fn func() error) error {
	fd := int(f.Fd())
	err := onThread(func() error {
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("entering network namespace: %w", err)
		}
		return nil
	}, fn)
	runtime.KeepAlive(f)
	return err
}

// onThread runs enter and then fn on a fresh goroutine locked to its OS
// thread, then switches the thread back to its original network namespace.
// enter must leave the thread's namespace unchanged when it fails.
func onThread(enter, fn func() error) error {
	type result struct {
		err      error
		panicked bool
		value    any
	}
	ch := make(chan result, 1)
	go func() {
		var res result
		finished := false
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("opening current network namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		if err := enter(); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		// Runs on return, panic and runtime.Goexit alike.
		defer func() {
			if !finished && !res.panicked {
				res.err = errors.New("function called runtime.Goexit (t.Fatal?) inside a network namespace")
			}
			if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
				// Leave the thread locked: when this goroutine exits the
				// runtime terminates the thread instead of reusing it.
				res.err = errors.Join(res.err, fmt.Errorf("restoring original network namespace (thread discarded): %w", err))
			} else {
				runtime.UnlockOSThread()
			}
			ch <- res
		}()
		defer func() {
			if p := recover(); p != nil {
				res.panicked, res.value = true, p
			}
		}()
		res.err = fn()
		finished = true
	}()
	res := <-ch
	if res.panicked {
		panic(res.value)
	}
	return res.err
}

// Command returns the command that runs argv in network namespace ns: as
// is for "" (the current namespace), under `ip netns exec NS` otherwise.
// It fails if argv is empty or ns is not a namespace name.
func Command(ctx context.Context, ns string, argv ...string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("exec in network namespace: no command")
	}
	if ns != "" {
		if err := checkName(ns); err != nil {
			return nil, err
		}
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...), nil
}

// Exec runs argv in network namespace ns ("" is the current one; see
// Command) and returns its combined output. A non-zero exit is an error
// that includes the output.
func Exec(ns string, argv ...string) ([]byte, error) {
	cmd, err := Command(context.Background(), ns, argv...)
	if err != nil {
		return nil, err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("running %q in %s: %w: %s", strings.Join(argv, " "), Describe(ns), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Describe names namespace ns in messages: "network namespace NAME", or
// "the current network namespace" for "".
func Describe(ns string) string {
	if ns == "" {
		return "the current network namespace"
	}
	return "network namespace " + ns
}

// ensureRunDir creates RunDir and makes it a shared mount point, as
// `ip netns add` does, so namespace mounts propagate to other mount
// namespaces (those of `ip netns exec`).
func ensureRunDir() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", RunDir, err)
	}
	bound := false
	for {
		err := unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if err != unix.EINVAL || bound {
			return fmt.Errorf("making %s a shared mount: %w", RunDir, err)
		}
		if err := unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on itself: %w", RunDir, err)
		}
		bound = true
	}
}

// create makes a new named network namespace and returns its file. It fails
// with an error wrapping ErrExist when the name is taken.
func create(name string) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := ensureRunDir(); err != nil {
		return nil, err
	}
	p := Path(name)
	mark, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s (stale from a crashed run? remove it with `ip netns del %s`)", ErrExist, name, name)
	}
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", p, err)
	}
	mark.Close()
	var f *os.File
	err = onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unsharing network namespace: %w", err)
		}
		return nil
	}, func() error {
		// Open the namespace before leaving it, so that a Sweep in
		// another process never sees it unused.
		var err error
		if f, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		if err := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting namespace on %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		if f != nil {
			f.Close()
		}
		remove(name)
		return nil, fmt.Errorf("creating network namespace %s: %w", name, err)
	}
	return f, nil
}

// Scratch makes an empty network namespace named like a lab's (Prefix +
// name + "-fw", so that Sweep removes it if this process dies) for short
// probes, and returns its name and how to remove it.
func Scratch(name string) (string, func() error, error) {
	full := Prefix + name + "-fw"
	if err := checkLabName(name); err != nil {
		return "", nil, err
	}
	f, err := create(full)
	if err != nil {
		return "", nil, err
	}
	return full, func() error { return errors.Join(f.Close(), remove(full)) }, nil
}

// remove unmounts and deletes a named namespace; the kernel frees it once
// no process or open file refers to it. A missing name is not an error.
func remove(name string) error {
	p := Path(name)
	err := unix.Unmount(p, unix.MNT_DETACH)
	if err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmounting %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// Sweep removes lab namespaces (ipf-NAME-fw, ipf-NAME-gen under RunDir)
// that no live process uses (no task in it, no open file for it): the
// leftovers of a crashed or timed-out run. Namespaces of live labs, in this
// or another process, are kept because their Lab holds them open. Other
// namespaces, even with the "ipf-" prefix, are left alone. It returns the
// names it removed.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweeping stale namespaces: %w", err)
	}
	var cands []string
	for _, e := range entries {
		if isLabNS(e.Name()) {
			cands = append(cands, e.Name())
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	used := usedNetNS()
	var removed []string
	var errs []error
	for _, name := range cands {
		var st unix.Stat_t
		if err := unix.Stat(Path(name), &st); err == nil {
			var sfs unix.Statfs_t
			if err := unix.Statfs(Path(name), &sfs); err != nil {
				continue
			}
			if _, inUse := used[st.Ino]; sfs.Type == nsfsMagic && inUse {
				continue
			}
			// A plain file is a mount point being set up by create, or the
			// remains of a crash; only the latter is old.
			if sfs.Type != nsfsMagic && time.Since(time.Unix(st.Mtim.Unix())) < time.Minute {
				continue
			}
		}
		if err := remove(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("sweeping stale namespaces: %w", err)
	}
	return removed, nil
}

// isLabNS reports whether name is that of a lab namespace, ipf-NAME-fw or
// ipf-NAME-gen. Other "ipf-" namespaces (made with `ip netns add` by other
// tools) are never swept: nothing tells whether they are still in use.
func isLabNS(name string) bool {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return false
	}
	lab, ok := strings.CutSuffix(rest, "-fw")
	if !ok {
		lab, ok = strings.CutSuffix(rest, "-gen")
	}
	return ok && checkLabName(lab) == nil
}

// usedNetNS returns the network namespaces that some live task is in or
// has an open file for, by inode, each with a path that opens it.
func usedNetNS() map[uint64]string {
	used := map[uint64]string{}
	add := func(link string) {
		target, err := os.Readlink(link)
		if err != nil {
			return
		}
		var ino uint64
		if _, err := fmt.Sscanf(target, "net:[%d]", &ino); err == nil {
			used[ino] = link
			return
		}
		// A namespace file opened through its bind mount reads as that
		// path; stat what the link refers to.
		if strings.HasPrefix(target, RunDir+"/") || strings.HasPrefix(target, "/var"+RunDir+"/") {
			var st unix.Stat_t
			var sfs unix.Statfs_t
			if unix.Stat(link, &st) == nil && unix.Statfs(link, &sfs) == nil && sfs.Type == nsfsMagic {
				used[st.Ino] = link
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		tasks, _ := filepath.Glob(proc + "/task/[0-9]*")
		for _, task := range tasks {
			add(task + "/ns/net")
		}
		fds, _ := os.ReadDir(proc + "/fd")
		for _, fd := range fds {
			add(proc + "/fd/" + fd.Name())
		}
	}
	return used
}

// Live returns the network namespaces that exist, by inode, each with a
// path that opens it (see Open): those a task of this PID namespace is
// in or holds open (usedNetNS), and those bind-mounted in the mount
// namespace of any such task, as `ip netns add` and container runtimes
// do. A namespace that only a socket keeps alive is not seen. It fails
// when it does not even see its own namespace: then it knows nothing.
func Live() (map[uint64]string, error) {
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return nil, fmt.Errorf("listing network namespaces: %w", err)
	}
	live := usedNetNS()
	seen := map[string]bool{} // mount namespaces read
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		mnt, err := os.Readlink(proc + "/ns/mnt")
		if err != nil || seen[mnt] {
			continue
		}
		seen[mnt] = true
		data, err := os.ReadFile(proc + "/mountinfo")
		if err != nil {
			continue // gone meanwhile
		}
		for ino, at := range nsfsMounts(string(data)) {
			if _, ok := live[ino]; !ok {
				live[ino] = proc + "/root" + at
			}
		}
	}
	if _, ok := live[self.Ino]; !ok {
		return nil, fmt.Errorf("listing network namespaces: this process's own (%d) is not among those /proc shows", self.Ino)
	}
	return live, nil
}

// nsfsMounts returns the network namespaces mounted in a mountinfo
// listing (proc_pid_mountinfo(5)), by inode, with their mount points.
func nsfsMounts(mountinfo string) map[uint64]string {
	out := map[uint64]string{}
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 6 || sep+1 >= len(f) || f[sep+1] != "nsfs" {
			continue
		}
		var ino uint64
		if _, err := fmt.Sscanf(f[3], "net:[%d]", &ino); err != nil {
			continue
		}
		out[ino] = unescapeMount(f[4])
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Cookie returns the cookie of network namespace ns (see Open; "" is the
// current one), which unlike its inode number is never reused while the
// system runs (SO_NETNS_COOKIE, Linux 5.14).
func Cookie(ns string) (uint64, error) {
	var c uint64
	err := Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		c, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reading the cookie of %s: %w", Describe(ns), err)
	}
	return c, nil
}

// Sysctl reads the sysctl name ("net/netfilter/nf_conntrack_count") as
// namespace ns sees it ("" = current): net.* values are per namespace.
func Sysctl(ns, name string) (string, error) {
	var v []byte
	err := Do(ns, func() (err error) {
		v, err = os.ReadFile(filepath.Join("/proc/sys", name))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(v)), nil
}

// Conntrack reads the fill level of namespace ns's connection tracking
// table: its entries and nf_conntrack_max; ok is false when conntrack is
// not loaded (no rule of the host has needed it yet).
func Conntrack(ns string) (entries, limit int, ok bool) {
	n, err1 := Sysctl(ns, "net/netfilter/nf_conntrack_count")
	m, err2 := Sysctl(ns, "net/netfilter/nf_conntrack_max")
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	entries, err1 = strconv.Atoi(n)
	limit, err2 = strconv.Atoi(m)
	return entries, limit, err1 == nil && err2 == nil
}
