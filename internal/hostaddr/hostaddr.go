// Package hostaddr lists the addresses of a network namespace, so that
// ipfence never blocks the host it runs on.
package hostaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
)

// ErrBlocksOwnAddress is returned when a plan would block one of the
// host's own addresses.
var ErrBlocksOwnAddress = errors.New("the policy would block this host's own address")

// ErrBlocksUpstream is returned when a plan's outbound rules would block
// new connections to one of the host's upstreams: a resolver it uses or
// its default gateway.
var ErrBlocksUpstream = errors.New("an outbound rule would block this host's upstream")

// CheckPlan refuses a plan that blocks an address configured on an
// interface of the target namespace (loopback and link-local are always
// protected by the plan itself), and one whose outbound rules block the
// namespace's upstreams: the resolvers of resolvConf and the default
// gateways (unless protected).
func CheckPlan(p *plan.Plan, ns string) error {
	addrs, err := ownAddrs(ns)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if rule, blocked := p.Blocked(a.ip); blocked {
			return fmt.Errorf("rule %q: %w %s%s; add it (or its network) to protect: in the policy", rule, ErrBlocksOwnAddress, a.ip, a.dev)
		}
	}
	if !p.HasOutbound() {
		return nil
	}
	ups, err := upstreams(ns)
	if err != nil {
		return err
	}
	// The host's connections to its own addresses (its public name
	// from a local program) leave through loopback.
	for _, a := range addrs {
		ups = append(ups, ownAddr{ip: a.ip, dev: "this host's own address" + a.dev})
	}
	for _, u := range ups {
		if rule, blocked := p.BlockedOut(u.ip); blocked {
			return fmt.Errorf("rule %q: %w %s (%s); add it to protect: in the policy", rule, ErrBlocksUpstream, u.ip, u.dev)
		}
	}
	return nil
}

// resolvConf is where the namespace's resolvers are read; `ip netns
// exec` binds /etc/netns/NAME/resolv.conf over it where that exists.
// resolvedConf lists the upstreams of systemd-resolved.
var (
	resolvConf   = "/etc/resolv.conf"
	resolvedConf = "/run/systemd/resolve/resolv.conf"
)

// upstreams are the resolvers (dev: "resolver in /etc/resolv.conf") and
// default gateways (dev: "default gateway on eth0") of namespace ns.
func upstreams(ns string) ([]ownAddr, error) {
	var out []ownAddr
	confs := []string{resolvConf}
	if ns != "" {
		if alt := filepath.Join("/etc/netns", filepath.Base(ns), "resolv.conf"); fileExists(alt) {
			confs[0] = alt
		}
	} else if fileExists(resolvedConf) {
		// systemd-resolved's stub (127.0.0.53) hides the resolvers it
		// asks: they are listed here.
		confs = append(confs, resolvedConf)
	}
	for _, conf := range confs {
		data, err := os.ReadFile(conf)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "nameserver" {
				if ip, err := netip.ParseAddr(strings.Split(f[1], "%")[0]); err == nil {
					out = append(out, ownAddr{ip: ip.Unmap(), dev: "resolver in " + conf})
				}
			}
		}
	}
	h, err := netlinkHandle(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	// Every routing table's default routes (policy routing too).
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing the host's routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && !isDefault(r.Dst) {
			continue
		}
		for _, gw := range append([]*netlink.NexthopInfo{{Gw: r.Gw, LinkIndex: r.LinkIndex}}, r.MultiPath...) {
			ip, ok := netip.AddrFromSlice(gw.Gw)
			if !ok {
				continue
			}
			u := ownAddr{ip: ip.Unmap(), dev: "default gateway"}
			if l, err := h.LinkByIndex(gw.LinkIndex); err == nil {
				u.dev += " on " + l.Attrs().Name
			}
			out = append(out, u)
		}
	}
	return out, nil
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// List returns the addresses configured in namespace ns ("" = current).
func List(ns string) ([]netip.Addr, error) {
	addrs, err := ownAddrs(ns)
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.ip
	}
	return out, err
}

type ownAddr struct {
	ip  netip.Addr
	dev string // " on eth0"
}

func ownAddrs(ns string) ([]ownAddr, error) {
	h, err := netlinkHandle(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the host's addresses: %w", err)
	}
	var out []ownAddr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		oa := ownAddr{ip: ip.Unmap()}
		if l, err := h.LinkByIndex(a.LinkIndex); err == nil {
			oa.dev = " on " + l.Attrs().Name
		}
		out = append(out, oa)
	}
	return out, nil
}

// netlinkHandle returns a netlink handle whose sockets are in ns.
func netlinkHandle(ns string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := netns.Do(ns, func() (err error) {
		h, err = netlink.NewHandle()
		return err
	})
	return h, err
}
