// Package handover moves a namespace's policy between ipfence's backends
// in the safe order: the new backend's rules are in force before the old
// backend's are removed, so no packet passes unchecked in between.
package handover

import (
	"context"
	"fmt"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/statedir"
)

// ToIPT loads prog (ipset or iptables-split), then removes what an
// earlier nftables apply left in o.NetNS: the table named prog.Prefix and,
// when prev ran rules in XDP, the XDP program (xo says where it is
// pinned).
func ToIPT(ctx context.Context, prog *ipt.Program, o ipt.Options, prev *statedir.Applied, xo xdp.Options) (*ipt.Result, error) {
	r, err := ipt.Apply(ctx, prog, o)
	if err != nil {
		return nil, fmt.Errorf("applying to the kernel: %w", err)
	}
	if _, err := nft.Flush(ctx, prog.Prefix, o.NetNS); err != nil {
		return &r, fmt.Errorf("the %s rules are in force, but removing the nftables table of the last apply failed: %w", prog.Backend, err)
	}
	if prev != nil && prev.HasXDP() {
		xo.NetNS = o.NetNS
		if _, err := xdp.Flush(xo); err != nil {
			return &r, fmt.Errorf("the %s rules are in force, but detaching the XDP program of the last apply failed: %w", prog.Backend, err)
		}
	}
	return &r, nil
}

// FromIPT removes the iptables chains and ipsets of an earlier apply with
// an iptables backend (prev), once the nftables rules are in force.
func FromIPT(ctx context.Context, table, netns string, prev *statedir.Applied) error {
	if prev == nil || !prev.IPTables() {
		return nil
	}
	if _, err := ipt.Flush(ctx, table, ipt.Options{NetNS: netns}); err != nil {
		return fmt.Errorf("the nftables rules are in force, but removing the %s rules of the last apply failed: %w", prev.Backend, err)
	}
	return nil
}
