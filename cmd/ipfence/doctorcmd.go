package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/doctor"
)

func newDoctorCmd(g *globals) *cobra.Command {
	var ns string
	var xf xdpFlags
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Report what this host offers ipfence's backends (nftables, iptables, ipset, XDP)",
		Long: `Doctor reports the kernel, whether nf_tables works over netlink, the nft,
iptables (legacy or nf_tables flavour), ip6tables and ipset commands, whether XDP
programs load and attach (native and generic) and whether /sys/fs/bpf is a bpf
file system, with the host's interfaces and their drivers (native XDP depends on
the driver). Probes that change kernel state run in a scratch network namespace
that is removed afterwards: the host's own firewall is never touched.

It also reads the ruleset (of --netns, default the current namespace) for other
firewall managers — firewalld, Docker, kube-proxy, ufw, fail2ban, a CrowdSec
bouncer, nftables.service — and says how each gets along with ipfence; "warn"
marks a conflict (something that deletes ipfence's table or bans twice).

And it lists ipfence's XDP pins (under --pin-dir) of network namespaces that
are gone: deleted without a flush, their program runs nowhere but its maps stay
in memory until ` + "`ipfence flush --stale-pins`" + ` removes them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := doctor.Run(ns, xf.pinDir)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			printDoctor(cmd.OutOrStdout(), r)
			return nil
		},
	}
	c.Flags().StringVar(&ns, "netns", "", "network namespace whose ruleset to read for other managers (default: the current one)")
	xf.register(c, false)
	return c
}

func printDoctor(w io.Writer, r *doctor.Report) {
	fmt.Fprintf(w, "kernel     %s\n", r.Kernel)
	line := func(name string, c doctor.Check, extra string) {
		state := "no"
		if c.OK {
			state = "ok"
		}
		fmt.Fprintf(w, "%-10s %-3s %s%s\n", name, state, extra, c.Detail)
	}
	line("nftables", r.NFTables, "")
	line("nft", r.Nft, "")
	line("iptables", r.IPTables.Check, fmt.Sprintf("[in use: %s; installed: %s; restore commands: %v] ",
		r.IPTables.Flavour, strings.Join(r.IPTables.Installed, ", "), r.IPTables.Restore))
	line("ip6tables", r.IP6, "")
	line("ipset", r.IPSet, "")
	line("xdp", r.XDP.Check, "")
	line("bpffs", r.BPFFS, "")
	line("conntrack", r.Conntrack, "")
	var ifs []string
	for _, i := range r.XDP.Interfaces {
		if i.Driver != "" {
			ifs = append(ifs, fmt.Sprintf("%s (%s)", i.Name, i.Driver))
		} else {
			ifs = append(ifs, i.Name+" (virtual)")
		}
	}
	fmt.Fprintf(w, "interfaces %s\n", strings.Join(ifs, ", "))
	if len(r.Managers) == 0 {
		fmt.Fprintf(w, "managers   none besides ipfence\n")
	}
	for _, m := range r.Managers {
		level := "info"
		if m.Warn {
			level = "WARN"
		}
		fmt.Fprintf(w, "manager    %s %s (%s): %s\n", level, m.Name, m.Evidence, m.Advice)
	}
	line("pins", r.Pins.Check, "")
	for _, p := range r.Pins.Stale {
		fmt.Fprintf(w, "pins       WARN %s: remove with `%s`\n", p, doctor.FlushStalePins(filepath.Dir(p.Dir)))
	}
}
