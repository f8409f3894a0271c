package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Lab addresses. Hosts use the benchmarking ranges 198.18.0.0/15 and
// 2001:2::/48 (RFC 2544, RFC 5180); packets never leave the lab's veth.
var (
	fwAddr4  = netip.MustParsePrefix("198.18.0.1/24")
	genAddr4 = netip.MustParsePrefix("198.18.0.2/24")
	fwAddr6  = netip.MustParsePrefix("2001:2::1/64")
	genAddr6 = netip.MustParsePrefix("2001:2::2/64")
	// Off-link destinations in fw's subnets that nobody owns: fw routes
	// packets to them and drops them because forwarding is off.
	sink4 = netip.MustParseAddr("198.18.0.77")
	sink6 = netip.MustParseAddr("2001:2::77")
)

// ErrClosed is returned by Lab methods after Close.
var ErrClosed = errors.New("lab is closed")

// Lab is two network namespaces joined by a veth pair: FW, the firewall
// host under test, and Gen, the traffic generator. FW has forwarding off,
// rp_filter off, route_localnet and accept_local on (so spoofed 127/8 and
// own-address sources reach the firewall), and no default route: replies
// (TCP resets, ICMP errors) to spoofed sources are dropped there, except
// to sources on the lab's own subnets, which go to Gen and die there. IPv6
// addresses are added without DAD and router solicitation is off; NewLab
// waits (some 50 ms) until both links are up and the IPv6 addresses are
// routed as local, so the lab is usable as soon as it returns.
//
// The exported fields are read-only after NewLab.
type Lab struct {
	Name string // as passed to NewLab

	FW, Gen     string // namespace names, ipf-NAME-fw and ipf-NAME-gen; /run/netns/<name> exists
	FWIf, GenIf string // veth names inside FW and Gen
	FWMAC       net.HardwareAddr
	GenMAC      net.HardwareAddr
	FWIndex     int // ifindex of FWIf inside FW
	GenIndex    int // ifindex of GenIf inside Gen

	FWAddr4, GenAddr4 netip.Prefix // 198.18.0.1/24, 198.18.0.2/24
	FWAddr6, GenAddr6 netip.Prefix // 2001:2::1/64, 2001:2::2/64
	Sink4, Sink6      netip.Addr   // 198.18.0.77, 2001:2::77: on fw's subnets, not local, dropped after routing

	fwNS, genNS *os.File

	mu     sync.Mutex
	closed bool
	err    error
}

// NewLab creates the namespaces ipf-NAME-fw and ipf-NAME-gen and the veth
// pair between them. name is 1 to 40 characters of [A-Za-z0-9_.-]. It fails
// with an error wrapping ErrExist when either namespace exists already (a
// stale one is removed by Sweep). On any error nothing is left behind.
func NewLab(name string) (*Lab, error) {
	if err := checkLabName(name); err != nil {
		return nil, err
	}
	l := &Lab{
		Name:     name,
		FW:       Prefix + name + "-fw",
		Gen:      Prefix + name + "-gen",
		FWIf:     "fw0",
		GenIf:    "gen0",
		FWAddr4:  fwAddr4,
		GenAddr4: genAddr4,
		FWAddr6:  fwAddr6,
		GenAddr6: genAddr6,
		Sink4:    sink4,
		Sink6:    sink6,
	}
	var err error
	if l.fwNS, err = create(l.FW); err != nil {
		return nil, fmt.Errorf("creating lab %s: %w", name, err)
	}
	if l.genNS, err = create(l.Gen); err != nil {
		return nil, errors.Join(fmt.Errorf("creating lab %s: %w", name, err), l.Close())
	}
	if err := l.setup(); err != nil {
		return nil, errors.Join(fmt.Errorf("creating lab %s: %w", name, err), l.Close())
	}
	return l, nil
}

func checkLabName(name string) error {
	if len(name) == 0 || len(name) > 40 {
		return fmt.Errorf("invalid lab name %q: want 1 to 40 characters", name)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("invalid lab name %q: want only [A-Za-z0-9_.-]", name)
		}
	}
	return nil
}

// setup configures both namespaces and the veth pair.
func (l *Lab) setup() error {
	// Defaults first, so the veth ends inherit them when they appear.
	common := map[string]string{
		"ipv6/conf/all/accept_dad":     "0",
		"ipv6/conf/default/accept_dad": "0",
		"ipv6/conf/all/accept_ra":      "0",
		"ipv6/conf/default/accept_ra":  "0",
		// Address setup waits a random time up to this delay, even nodad.
		"ipv6/conf/all/router_solicitation_delay":     "0",
		"ipv6/conf/default/router_solicitation_delay": "0",
		"ipv6/conf/all/forwarding":                    "0",
		"ipv4/ip_forward":                             "0",
	}
	fwDefaults := map[string]string{
		"ipv4/conf/all/rp_filter":     "0",
		"ipv4/conf/default/rp_filter": "0",
	}
	err := l.DoFW(func() error {
		if err := sysctls(common, fwDefaults); err != nil {
			return err
		}
		return linkUp("lo")
	})
	if err != nil {
		return fmt.Errorf("configuring %s: %w", l.FW, err)
	}
	err = l.DoGen(func() error {
		if err := sysctls(common); err != nil {
			return err
		}
		if err := linkUp("lo"); err != nil {
			return err
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("opening netlink: %w", err)
		}
		defer h.Close()
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: l.GenIf},
			PeerName:      l.FWIf,
			PeerNamespace: netlink.NsFd(int(l.fwNS.Fd())),
		}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding veth %s/%s: %w", l.GenIf, l.FWIf, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("configuring %s: %w", l.Gen, err)
	}
	err = l.DoFW(func() error {
		dev := "ipv4/conf/" + l.FWIf + "/"
		dev6 := "ipv6/conf/" + l.FWIf + "/"
		err := sysctls(map[string]string{
			dev + "rp_filter":      "0",
			dev + "route_localnet": "1",
			dev + "accept_local":   "1",
			dev6 + "accept_dad":    "0",
			dev6 + "accept_ra":     "0",
		})
		if err != nil {
			return err
		}
		l.FWMAC, l.FWIndex, err = configure(l.FWIf, l.FWAddr4, l.FWAddr6)
		return err
	})
	if err != nil {
		return fmt.Errorf("configuring %s: %w", l.FW, err)
	}
	err = l.DoGen(func() error {
		dev6 := "ipv6/conf/" + l.GenIf + "/"
		err := sysctls(map[string]string{dev6 + "accept_dad": "0", dev6 + "accept_ra": "0"})
		if err != nil {
			return err
		}
		l.GenMAC, l.GenIndex, err = configure(l.GenIf, l.GenAddr4, l.GenAddr6)
		return err
	})
	if err != nil {
		return fmt.Errorf("configuring %s: %w", l.Gen, err)
	}
	// IPv6 addresses stay tentative, and so refuse packets, until the
	// kernel's link watcher has seen the link come up (up to a second).
	if err := l.DoFW(func() error { return waitReady(l.FWIf, l.FWAddr6.Addr()) }); err != nil {
		return fmt.Errorf("waiting for %s: %w", l.FW, err)
	}
	if err := l.DoGen(func() error { return waitReady(l.GenIf, l.GenAddr6.Addr()) }); err != nil {
		return fmt.Errorf("waiting for %s: %w", l.Gen, err)
	}
	return nil
}

// readyTimeout bounds how long NewLab waits for the links to come up.
const readyTimeout = 5 * time.Second

// waitReady waits until the link in the current namespace is operationally
// up and its IPv6 address a6 is no longer tentative and routed as local.
func waitReady(name string, a6 netip.Addr) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer h.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("finding link %s: %w", name, err)
		}
		ready := link.Attrs().OperState == netlink.OperUp
		addrs, err := h.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", name, err)
		}
		found := false
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == a6 {
				found = true
				if a.Flags&unix.IFA_F_DADFAILED != 0 {
					return fmt.Errorf("address %s on %s: duplicate address detection failed", a6, name)
				}
				ready = ready && a.Flags&unix.IFA_F_TENTATIVE == 0
			}
		}
		if !found {
			return fmt.Errorf("address %s missing from %s", a6, name)
		}
		// The local route comes a moment after the tentative flag goes.
		if ready {
			routes, err := h.RouteGet(a6.AsSlice())
			ready = err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s not up with %s usable after %v (operstate %v)", name, a6, readyTimeout, link.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sysctls writes net.* sysctls of the current thread's namespace; keys are
// paths below /proc/sys/net.
func sysctls(sets ...map[string]string) error {
	for _, set := range sets {
		for k, v := range set {
			p := filepath.Join("/proc/sys/net", k)
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return fmt.Errorf("setting sysctl %s=%s: %w", k, v, err)
			}
		}
	}
	return nil
}

func linkUp(name string) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting link %s up: %w", name, err)
	}
	return nil
}

// configure adds the addresses to the link in the current namespace, sets
// it up, and returns its MAC and ifindex.
func configure(name string, a4, a6 netip.Prefix) (net.HardwareAddr, int, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, 0, fmt.Errorf("opening netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return nil, 0, fmt.Errorf("finding link %s: %w", name, err)
	}
	for _, p := range []netip.Prefix{a4, a6} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return nil, 0, fmt.Errorf("adding %s to %s: %w", p, name, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, 0, fmt.Errorf("setting link %s up: %w", name, err)
	}
	attrs := link.Attrs()
	return attrs.HardwareAddr, attrs.Index, nil
}

// DoFW is Do in the FW namespace, through the file the lab holds open.
func (l *Lab) DoFW(fn func() error) error { return l.do(l.FW, l.fwNS, fn) }

// DoGen is Do in the Gen namespace, through the file the lab holds open.
func (l *Lab) DoGen(fn func() error) error { return l.do(l.Gen, l.genNS, fn) }

func (l *Lab) do(name string, f *os.File, fn func() error) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return fmt.Errorf("in network namespace %s: %w", name, ErrClosed)
	}
	if err := doFile(f, fn); err != nil {
		return fmt.Errorf("in network namespace %s: %w", name, err)
	}
	return nil
}

// Close removes both namespaces, and with them the veth pair. It is safe to
// call more than once and from several goroutines; later calls return the
// first call's result. Do not call it while DoFW or DoGen runs.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.err
	}
	l.closed = true
	var errs []error
	for _, ns := range []struct {
		name string
		f    *os.File
	}{{l.Gen, l.genNS}, {l.FW, l.fwNS}} {
		if ns.f == nil {
			continue // never created
		}
		ns.f.Close()
		if err := remove(ns.name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		l.err = fmt.Errorf("closing lab %s: %w", l.Name, err)
	}
	return l.err
}
