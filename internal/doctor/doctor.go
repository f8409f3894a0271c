// Package doctor reports what a host offers ipfence's backends: the
// kernel, nftables, the iptables flavour, ipset, XDP and bpffs, and the
// XDP pins left by namespaces that are gone. Every
// probe that changes kernel state runs in a scratch network namespace of
// its own, removed afterwards: the host's firewall is only read.
package doctor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
)

// Check is one probe's outcome.
type Check struct {
	OK      bool   `json:"ok"`
	Version string `json:"version,omitempty"`
	// Detail says what was tried, or what failed and what to do.
	Detail string `json:"detail"`
}

// IPTables is what the host's iptables commands are.
type IPTables struct {
	Check
	// Flavour is "nf_tables" (iptables-nft) or "legacy", as `iptables -V`
	// says; both are supported.
	Flavour string `json:"flavour,omitempty"`
	// Installed lists the flavours whose commands exist (iptables-legacy,
	// iptables-nft): either can be picked with update-alternatives.
	Installed []string `json:"installed"`
	// Restore says whether iptables-restore and ip6tables-restore exist.
	Restore bool `json:"restore"`
}

// XDP is what the kernel offers XDP programs.
type XDP struct {
	Check
	Native  bool `json:"native"`  // native mode attached on a veth
	Generic bool `json:"generic"` // generic mode attached on a veth
	// Interfaces are the host's interfaces and their drivers: native mode
	// depends on the driver (ipfence falls back to generic and says so).
	Interfaces []Interface `json:"interfaces"`
}

// Interface is one of the host's network interfaces.
type Interface struct {
	Name   string `json:"name"`
	Driver string `json:"driver,omitempty"` // "" for virtual interfaces
}

// Report is what the host offers.
type Report struct {
	Kernel   string   `json:"kernel"`
	NFTables Check    `json:"nftables"` // nf_tables over netlink (what ipfence uses)
	Nft      Check    `json:"nft"`      // the nft command (for `compile` output and tests)
	IPTables IPTables `json:"iptables"`
	IP6      Check    `json:"ip6tables"`
	IPSet    Check    `json:"ipset"`
	XDP      XDP      `json:"xdp"`
	BPFFS    Check    `json:"bpffs"`
	// Conntrack says whether connection tracking is in use in the
	// namespace (connection-aware rules need it) and how full it is.
	Conntrack Check `json:"conntrack"`
	// Managers are the other firewall managers in the namespace looked
	// at, conflicts first.
	Managers []Manager `json:"managers"`
	// Pins are ipfence's XDP pins: not OK when some are of namespaces
	// that are gone.
	Pins Pins `json:"pins"`
}

// Pins is the check of ipfence's XDP pin folders.
type Pins struct {
	Check
	// Stale are those of namespaces that are gone, whose program runs
	// nowhere: `ipfence flush --stale-pins` removes them.
	Stale []xdp.Pin `json:"stale,omitempty"`
}

// Run probes the host, reads the ruleset of the namespace ns ("" the
// current one) for other firewall managers and the XDP pins under
// pinDir ("" is xdp.DefaultPinDir) for those of namespaces that are gone.
func Run(ns, pinDir string) (*Report, error) {
	r := &Report{}
	// Before the probes' scratch namespace, which could take the inode
	// of one that is gone.
	r.Pins = pins(pinDir)
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		r.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	r.Nft = version("nft", []string{"--version"}, `v(\d+\.\d+\.\d+)`)
	r.IPSet = version("ipset", []string{"version"}, `v(\d+\.\d+)`)
	ipt := version("iptables", []string{"-V"}, `v(\d+\.\d+\.\d+)`)
	r.IPTables.Check = ipt
	if ipt.OK {
		r.IPTables.Flavour = "legacy"
		if strings.Contains(ipt.Detail, "nf_tables") {
			r.IPTables.Flavour = "nf_tables"
		}
	}
	r.IP6 = version("ip6tables", []string{"-V"}, `v(\d+\.\d+\.\d+)`)
	_, e1 := exec.LookPath("iptables-restore")
	_, e2 := exec.LookPath("ip6tables-restore")
	r.IPTables.Restore = e1 == nil && e2 == nil
	for _, f := range []struct{ cmd, flavour string }{{"iptables-legacy", "legacy"}, {"iptables-nft", "nf_tables"}} {
		if _, err := exec.LookPath(f.cmd); err == nil {
			r.IPTables.Installed = append(r.IPTables.Installed, f.flavour)
		}
	}
	r.BPFFS = bpffs()
	r.Conntrack = conntrack(ns)
	r.XDP.Interfaces = interfaces()
	rs, err := ReadRuleset(ns)
	if err != nil {
		return nil, fmt.Errorf("reading the ruleset for other firewall managers: %w", err)
	}
	r.Managers = Managers(rs, plan.DefaultPriority)

	name, remove, err := netns.Scratch(fmt.Sprintf("doctor%d", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("making a scratch network namespace for the probes: %w", err)
	}
	defer remove()
	r.NFTables = probeNFTables(name)
	if r.IPSet.OK {
		r.IPSet = probeIPSet(r.IPSet, name)
	}
	if r.IPTables.OK {
		r.IPTables.Check = probe(r.IPTables.Check, name, "listing the raw table",
			[]string{"iptables", "-w", "-t", "raw", "-S"})
	}
	if r.IP6.OK {
		r.IP6 = probe(r.IP6, name, "listing the raw table", []string{"ip6tables", "-w", "-t", "raw", "-S"})
	}
	r.XDP = probeXDP(name, r.XDP.Interfaces)
	if err := remove(); err != nil {
		return r, fmt.Errorf("removing the scratch namespace %s: %w", name, err)
	}
	return r, nil
}

// version runs a command's version option and keeps the version match.
func version(cmd string, args []string, re string) Check {
	path, err := exec.LookPath(cmd)
	if err != nil {
		return Check{Detail: fmt.Sprintf("%s not found; install the Debian package of that name", cmd)}
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return Check{Detail: fmt.Sprintf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, text)}
	}
	c := Check{OK: true, Detail: text}
	if m := regexp.MustCompile(re).FindStringSubmatch(text); m != nil {
		c.Version = m[1]
	}
	return c
}

// probe runs cmds in the scratch namespace ns; the first failure fails c.
func probe(c Check, ns, what string, cmds ...[]string) Check {
	for _, argv := range cmds {
		if _, err := netns.Exec(ns, argv...); err != nil {
			c.OK, c.Detail = false, fmt.Sprintf("%s in a scratch namespace failed: %v", what, err)
			return c
		}
	}
	c.Detail += "; " + what + " in a scratch namespace works"
	return c
}

// probeIPSet makes and destroys a hash:net set in ns.
func probeIPSet(c Check, ns string) Check {
	return probe(c, ns, "creating and destroying a hash:net set",
		[]string{"ipset", "create", "ipf_doctor", "hash:net"}, []string{"ipset", "destroy", "ipf_doctor"})
}

// probeNFTables makes and deletes a table over netlink in ns.
func probeNFTables(ns string) Check {
	f, err := netns.Open(ns)
	if err != nil {
		return Check{Detail: err.Error()}
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return Check{Detail: fmt.Sprintf("opening netlink: %v", err)}
	}
	defer conn.CloseLasting()
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "ipfence_doctor"})
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return Check{Detail: fmt.Sprintf("making an inet table over netlink in a scratch namespace: %v (kernel without nf_tables?)", err)}
	}
	return Check{OK: true, Detail: "an inet table made and removed over netlink in a scratch namespace"}
}

// probeXDP loads a program that passes everything and attaches it to a
// veth in ns, natively and generically.
func probeXDP(ns string, ifs []Interface) XDP {
	x := XDP{Interfaces: ifs}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "ipfence_doctor", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // XDP_PASS
	if err != nil {
		x.Detail = fmt.Sprintf("loading an XDP program: %v (needs root and a kernel with BPF)", err)
		return x
	}
	defer prog.Close()
	err = netns.Do(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "doc0"}, PeerName: "doc1"}); err != nil {
			return fmt.Errorf("adding a veth: %w", err)
		}
		for _, n := range []string{"doc0", "doc1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("doc0")
		if err != nil {
			return err
		}
		for _, m := range []struct {
			ok    *bool
			flags link.XDPAttachFlags
		}{{&x.Native, link.XDPDriverMode}, {&x.Generic, link.XDPGenericMode}} {
			if lk, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: l.Attrs().Index, Flags: m.flags}); err == nil {
				*m.ok = true
				lk.Close()
			}
		}
		return nil
	})
	x.OK = err == nil && (x.Native || x.Generic)
	switch {
	case err != nil:
		x.Detail = err.Error()
	case !x.OK:
		x.Detail = "an XDP program loads but attaches to a veth in no mode"
	default:
		x.Detail = fmt.Sprintf("a program loaded and attached to a veth in a scratch namespace (native %v, generic %v); native mode on a real interface depends on its driver", x.Native, x.Generic)
	}
	return x
}

// bpffs checks that /sys/fs/bpf is a bpf file system.
func bpffs() Check {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return Check{OK: true, Detail: "/sys/fs/bpf is a bpf file system"}
	}
	return Check{Detail: "/sys/fs/bpf is not a bpf file system; `ipfence apply` mounts one there for XDP pins (as bpftool does)"}
}

// pins checks ipfence's XDP pins under root for namespaces that are gone.
func pins(root string) Pins {
	if root == "" {
		root = xdp.DefaultPinDir
	}
	all, err := xdp.Pins(root)
	if err != nil {
		return Pins{Check: Check{Detail: err.Error()}}
	}
	var c Pins
	var bytes uint64
	running := 0 // of gone namespaces, still attached somewhere
	for _, p := range all {
		switch {
		case p.Stale():
			c.Stale = append(c.Stale, p)
			bytes += p.MapBytes
		case p.Gone:
			running++
		}
	}
	c.OK = len(c.Stale) == 0
	c.Detail = fmt.Sprintf("XDP pins of %d network namespaces in %s", len(all), root)
	if len(all) == 0 {
		c.Detail = "no XDP pins in " + root
	}
	if len(c.Stale) > 0 {
		c.Detail += fmt.Sprintf("; those of %d that are gone keep %.1f MiB of maps in memory: remove them with `%s`",
			len(c.Stale), float64(bytes)/(1<<20), FlushStalePins(root))
	}
	if running > 0 {
		c.Detail += fmt.Sprintf("; %d more are gone but their program is still attached to an interface (moved to another namespace?): left alone", running)
	}
	return c
}

// FlushStalePins is the command that removes the stale XDP pins under
// root.
func FlushStalePins(root string) string {
	if root == xdp.DefaultPinDir {
		return "ipfence flush --stale-pins"
	}
	return "ipfence flush --stale-pins --pin-dir " + root
}

// interfaces lists the host's interfaces and their drivers from sysfs.
func interfaces() []Interface {
	entries, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil
	}
	var out []Interface
	for _, e := range entries {
		ifc := Interface{Name: e.Name()}
		if target, err := os.Readlink(filepath.Join("/sys/class/net", e.Name(), "device", "driver")); err == nil {
			ifc.Driver = filepath.Base(target)
		} else if !errors.Is(err, os.ErrNotExist) {
			continue
		}
		out = append(out, ifc)
	}
	return out
}

// Pick chooses the backend of a policy that says `backend: auto`: nftables
// when the kernel takes an inet table over netlink, else ipset when ipset
// and iptables-restore work, else iptables-split when iptables-restore
// does. It probes in a scratch namespace and says why it chose.
func Pick() (plan.Backend, string, error) {
	name, remove, err := netns.Scratch(fmt.Sprintf("pick%d", os.Getpid()))
	if err != nil {
		return "", "", fmt.Errorf("making a scratch network namespace for the probes: %w", err)
	}
	defer remove()
	nf := probeNFTables(name)
	if nf.OK {
		return plan.NFTables, "nftables: " + nf.Detail, nil
	}
	why := "nftables unavailable (" + nf.Detail + ")"
	ipt := probe(Check{OK: true}, name, "loading the raw table with iptables-restore and ip6tables-restore",
		[]string{"sh", "-c", "printf '*raw\\nCOMMIT\\n' | iptables-restore --noflush && printf '*raw\\nCOMMIT\\n' | ip6tables-restore --noflush"})
	if !ipt.OK {
		return "", "", fmt.Errorf("no backend works on this host: %s; iptables: %s", why, ipt.Detail)
	}
	set := probeIPSet(Check{OK: true}, name)
	if set.OK {
		return plan.IPSet, why + "; ipset and iptables-restore work", nil
	}
	return plan.IPTablesSplit, why + "; ipset unavailable (" + set.Detail + "); iptables-restore works", nil
}

// conntrack reports on connection tracking in namespace ns: whether it
// is loaded (and so already costs every packet a lookup) and its fill.
func conntrack(ns string) Check {
	n, m, ok := netns.Conntrack(ns)
	if !ok {
		return Check{OK: true, Detail: "not in use yet: connection-aware rules (the default) load it, and every packet then pays a conntrack lookup; stateless rules do not need it"}
	}
	return Check{OK: true, Detail: fmt.Sprintf("in use: %d of %d entries; connection-aware rules (the default) rely on it", n, m)}
}
