package main

import (
	"fmt"
	"strings"

	"github.com/ipfence/ipfence/internal/backend/ipt"
)

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
