package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/plan"
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

// ErrNotNFTables is returned by the commands that need ipfence's
// nftables table (bans, the daemon) when the policy runs elsewhere.
var ErrNotNFTables = errors.New("needs the nftables backend")
