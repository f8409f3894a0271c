package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/fleet"
)

// fleetEntry is a fleet-wide ban or allow entry of p made at now,
// lasting d (0: for good), by origin on this host.
func fleetEntry(p netip.Prefix, now time.Time, d time.Duration, reason, origin string) *fleet.Ban {
	if host, err := os.Hostname(); err == nil {
		origin += "@" + host
	}
	b := &fleet.Ban{Prefix: p, Created: now, Reason: reason, Origin: origin}
	if d > 0 {
		b.Expires = now.Add(d)
	}
	return b
}

func newAllowCmd(g *globals) *cobra.Command {
	var f kernelFlags
	fb := fleetBanFlags{allow: true}
	var ttl, reason, origin, socket string
	c := &cobra.Command{
		Use:   "allow ADDRESS|PREFIX|-... [--ttl 1h] [--reason TEXT]",
		Short: "Let addresses or prefixes in whatever the rules and bans say, in one transaction",
		Long: `Allow puts addresses or prefixes into ipfence's allow sets, which every base
chain looks up first: an allow entry beats every rule of the policy (drop,
reject, allow-only), every ban and every fleet ban, also inside a blocked
prefix, for packets from it and (outbound rules) to it. Like bans, single
addresses go into hash sets and prefixes into interval sets, each with its own
timeout (--ttl: 90s, 15m, 1h, 7d, 2w; no --ttl: for good): an allowed /64
inside a blocked /32 is one element, never the block's complement. Allowing
something allowed already replaces its entry (a new expiry). Allow entries
survive ipfence apply and restarts (kept in the state folder). Prefixes
shorter than /8 (IPv4) or /16 (IPv6) are refused. nftables (without rules in
XDP) and ipset only. "-" reads more targets from standard input, one per
line. --fleet publishes the entries for every agent of the fleet instead,
signed with the policy key (publishers only: ban writers may not).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := ban.ParseTTL(ttl)
			if err != nil {
				return usageError{err}
			}
			targets, err := banTargets(args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if fb.on {
				err := fb.publish(cmd, targets, func(p netip.Prefix, now time.Time) *fleet.Ban {
					return fleetEntry(p, now, d, reason, origin)
				})
				if err != nil {
					return err
				}
				return printFleetBans(cmd.OutOrStdout(), g, "allowed", targets, d)
			}
			var done []ban.Ban
			ok, err := viaDaemon(socket, func(cl *api.Client) error {
				req := api.AllowRequest{TTL: ttl, Reason: reason, Origin: origin}
				for _, p := range targets {
					req.Prefixes = append(req.Prefixes, p.String())
				}
				resp, err := cl.Allow(cmd.Context(), req)
				if err == nil {
					done = resp.Allowed
				}
				return err
			})
			if !ok {
				reqs := make([]bansets.Request, len(targets))
				for i, p := range targets {
					reqs[i] = bansets.Request{Prefix: p, TTL: d, Reason: reason, Origin: origin}
				}
				err = withLists(cmd.Context(), &f, true, func(l bansets.Lists) (err error) {
					done, err = l.Allows.Ban(cmd.Context(), reqs)
					return err
				})
			}
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"allowed": done})
			}
			for _, b := range done {
				fmt.Fprintf(cmd.OutOrStdout(), "allowed %s%s\n", b.Prefix, describeExpiry(b, time.Now()))
			}
			return nil
		},
	}
	f.register(c)
	fb.register(c)
	c.Flags().StringVar(&ttl, "ttl", "", "how long the entry lasts (90s, 15m, 1h, 7d, 2w; default: for good)")
	c.Flags().StringVar(&reason, "reason", "", "why (shown by ipfence allows)")
	c.Flags().StringVar(&origin, "origin", "cli", "who allows")
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, socketHelp)
	return c
}

func newUnallowCmd(g *globals) *cobra.Command {
	var f kernelFlags
	fb := fleetBanFlags{allow: true}
	var socket, origin string
	c := &cobra.Command{
		Use:   "unallow ADDRESS|PREFIX|-... [--origin NAME]",
		Short: "Remove allow entries (exactly these prefixes), in one transaction",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := banTargets(args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if fb.on {
				err := fb.publish(cmd, ps, func(p netip.Prefix, now time.Time) *fleet.Ban {
					return &fleet.Ban{Prefix: p, Created: now, Unban: true}
				})
				if err != nil {
					return err
				}
				return printFleetBans(cmd.OutOrStdout(), g, "unallowed", ps, 0)
			}
			var gone []ban.Ban
			ok, err := viaDaemon(socket, func(cl *api.Client) error {
				for _, p := range ps {
					resp, err := cl.Unallow(cmd.Context(), p.String(), origin)
					if err != nil {
						return err
					}
					gone = append(gone, resp.Unallowed...)
				}
				return nil
			})
			if !ok {
				err = withLists(cmd.Context(), &f, false, func(l bansets.Lists) (err error) {
					ls := make([]bansets.Lift, len(ps))
					for i, p := range ps {
						ls[i] = bansets.Lift{Prefix: p, Origin: origin}
					}
					gone, err = l.Allows.Unban(cmd.Context(), ls)
					return err
				})
			}
			if err != nil {
				return err
			}
			return printRemoved(cmd.OutOrStdout(), g, "unallowed", gone, len(ps), "had no allow entry")
		},
	}
	f.register(c)
	fb.register(c)
	c.Flags().StringVar(&origin, "origin", "", "remove only entries made by this origin")
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, socketHelp)
	return c
}

func newAllowsCmd(g *globals) *cobra.Command {
	return newListCmd(g, listKind{
		name: "allows", title: "allow entries", short: "List the allow entries in force, from ipfence's state (never from the kernel)",
		controller: func(l bansets.Lists) *bansets.Controller { return l.Allows },
		fetch: func(ctx context.Context, cl *api.Client, o api.ListOptions) ([]ban.Ban, int, api.Counts, error) {
			l, err := cl.Allows(ctx, o)
			if err != nil {
				return nil, 0, api.Counts{}, err
			}
			return l.Allows, l.Total, l.Counts, nil
		},
	})
}
