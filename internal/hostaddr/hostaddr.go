package main

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipfence/ipfence/internal/plan"
)

// ErrBlocksOwnAddress is returned when a plan would block one of the
// host's own addresses.
var ErrBlocksOwnAddress = errors.New("the policy would block this host's own address")

// checkOwnAddresses refuses a plan that blocks an address configured on an
// interface of the target namespace (loopback and link-local are always
// protected by the plan itself).
func checkOwnAddresses(p *plan.Plan, ns string) error {
	h, err := netlinkHandle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the host's addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if rule, blocked := p.Blocked(ip); blocked {
			dev := ""
			if l, err := h.LinkByIndex(a.LinkIndex); err == nil {
				dev = " on " + l.Attrs().Name
			}
			return fmt.Errorf("rule %q: %w %s%s; add it (or its network) to protect: in the policy", rule, ErrBlocksOwnAddress, ip, dev)
		}
	}
	return nil
}

func netlinkHandle(ns string) (*netlink.Handle, error) {
	if ns == "" {
		return netlink.NewHandle()
	}
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s (see `ip netns list`): %w", ns, err)
	}
	defer nsh.Close()
	return netlink.NewHandleAt(nsh)
}
