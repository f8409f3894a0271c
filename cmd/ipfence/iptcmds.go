package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/state"
)

// resolveBackend applies the --backend override to in and resolves
// backend auto by probing the host; it returns why auto chose.
func resolveBackend(in *plan.Input, override string) (string, error) {
	if override != "" {
		b, err := plan.ParseBackend(override)
		if err != nil {
			return "", fmt.Errorf("--backend: %w", err)
		}
		in.Backend = b
	}
	if in.Backend != plan.Auto {
		return "", nil
	}
	b, why, err := doctor.Pick()
	if err != nil {
		return "", fmt.Errorf("backend auto: %w", err)
	}
	in.Backend = b
	return why, nil
}

// iptScript is what `compile` prints for the iptables backends: the
// ipset restore input (loading into temporary sets, then swapping), and
// each family's iptables-restore --noflush input from an empty state.
func iptScript(p *ipt.Program) string {
	var b strings.Builder
	if len(p.Sets) > 0 {
		b.WriteString("# ipset restore < this part: the sets, loaded beside the live ones and swapped in\n")
		b.WriteString(p.FillScript(nil))
		b.WriteString(p.SwapScript(nil))
	}
	for _, f := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
		fmt.Fprintf(&b, "# %s-restore --noflush < this part\n", f.Command())
		want := p.Desired(f)
		b.WriteString(ipt.Transition(&ipt.State{}, &want))
	}
	return b.String()
}

// applyIPT loads c's iptables program, then removes what an earlier
// nftables policy left: its table and XDP program (the new rules are in
// force first, so nothing is unguarded in between).
func applyIPT(ctx context.Context, c *compiled, netns string, prev *state.Applied, xf *xdpFlags) (*ipt.Result, error) {
	r, err := ipt.Apply(ctx, c.ipt, ipt.Options{NetNS: netns, Flavour: c.flavour})
	if err != nil {
		return nil, fmt.Errorf("applying to the kernel: %w", err)
	}
	if _, err := nft.Flush(ctx, c.plan.Table, netns); err != nil {
		return &r, fmt.Errorf("the %s rules are in force, but removing the nftables table of the last apply failed: %w", c.plan.Backend, err)
	}
	if prev != nil && prev.HasXDP() {
		if _, err := xdp.Flush(xf.options(netns, nil)); err != nil {
			return &r, fmt.Errorf("the %s rules are in force, but detaching the XDP program of the last apply failed: %w", c.plan.Backend, err)
		}
	}
	return &r, nil
}

// removeIPT removes the iptables chains and ipsets of an earlier apply
// with an iptables backend, once the nftables rules are in force.
func removeIPT(ctx context.Context, table, netns string, prev *state.Applied) error {
	if prev == nil || !prev.IPTables() {
		return nil
	}
	if _, err := ipt.Flush(ctx, table, ipt.Options{NetNS: netns}); err != nil {
		return fmt.Errorf("the nftables rules are in force, but removing the %s rules of the last apply failed: %w", prev.Backend, err)
	}
	return nil
}

// ErrNotNFTables is returned by the commands that need ipfence's
// nftables table (bans, the daemon) when the policy runs elsewhere.
var ErrNotNFTables = errors.New("needs the nftables backend")
