// Package hostaddr lists the addresses of a network namespace, so that
// ipfence never blocks the host it runs on.
package hostaddr

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
)

// ErrBlocksOwnAddress is returned when a plan would block one of the
// host's own addresses.
var ErrBlocksOwnAddress = errors.New("the policy would block this host's own address")

// CheckPlan refuses a plan that blocks an address configured on an
// interface of the target namespace (loopback and link-local are always
// protected by the plan itself).
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
	return nil
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
