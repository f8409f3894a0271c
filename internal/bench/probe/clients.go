package probe

import (
	"fmt"
	"math/bits"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// clientBase is the address the client addresses count up from: the
// start of 198.19.0.0/16, the half of the benchmarking range 198.18.0.0/15
// that the lab's own subnet (198.18.0.0/24) is not in.
var clientBase = netip.MustParseAddr("198.19.0.0")

// MaxClients is the most client addresses AddClients adds: 198.19.0.1 to
// 198.19.255.254.
const MaxClients = 1<<16 - 2

// AddClients gives Gen n more IPv4 addresses, 198.19.0.1 upward, as /32s
// on lab.GenIf, and routes them in FW through Gen (198.19.0.0/P via
// lab.GenAddr4 on lab.FWIf, P the shortest prefix that covers them), so
// FW's replies to them reach Gen. It returns the addresses in order.
// Calling it again is harmless: addresses and route are replaced.
//
// The route goes via Gen's lab address rather than on-link on purpose:
// on-link, FW would resolve every client by ARP, adding a round trip to
// each client's first packet and one neighbour entry per client; the
// kernel's limit on neighbour entries (net.ipv4.neigh.default.gc_thresh3,
// 1024 by default) is shared by all namespaces, so a thousand clients
// could make the host drop packets as "neighbour table overflow".
//
// It fails when n is not in 1 to MaxClients or on a netlink error, which
// may leave some of the addresses added.
func AddClients(lab *netns.Lab, n int) ([]netip.Addr, error) {
	if n < 1 || n > MaxClients {
		return nil, fmt.Errorf("adding clients: %d addresses, want 1 to %d", n, MaxClients)
	}
	addrs := make([]netip.Addr, n)
	a := clientBase
	for i := range addrs {
		a = a.Next()
		addrs[i] = a
	}
	// Offsets 0 to n fit in bits.Len(n) bits.
	route := netip.PrefixFrom(clientBase, 32-bits.Len(uint(n)))
	err := lab.DoGen(func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("opening netlink: %w", err)
		}
		defer h.Close()
		link, err := h.LinkByName(lab.GenIf)
		if err != nil {
			return fmt.Errorf("finding link %s: %w", lab.GenIf, err)
		}
		for _, a := range addrs {
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := h.AddrReplace(link, addr); err != nil {
				return fmt.Errorf("adding %s to %s: %w", a, lab.GenIf, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("adding clients: %w", err)
	}
	err = lab.DoFW(func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("opening netlink: %w", err)
		}
		defer h.Close()
		link, err := h.LinkByName(lab.FWIf)
		if err != nil {
			return fmt.Errorf("finding link %s: %w", lab.FWIf, err)
		}
		r := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       &net.IPNet{IP: route.Addr().AsSlice(), Mask: net.CIDRMask(route.Bits(), 32)},
			Gw:        lab.GenAddr4.Addr().AsSlice(),
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("routing %s via %s: %w", route, lab.GenAddr4.Addr(), err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("adding clients: %w", err)
	}
	return addrs, nil
}
