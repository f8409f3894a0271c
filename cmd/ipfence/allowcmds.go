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

// publishEntries publishes a fleet-wide ban or allow entry of each of
// targets (see fleetEntry) and says so (verb: "banned", "allowed").
func (f *fleetBanFlags) publishEntries(cmd *cobra.Command, g *globals, verb string, targets []netip.Prefix, d time.Duration, reason, origin string) error {
	err := f.publish(cmd, targets, func(p netip.Prefix, now time.Time) *fleet.Ban {
		return fleetEntry(p, now, d, reason, origin)
	})
	if err != nil {
		return err
	}
	return printFleetBans(cmd.OutOrStdout(), g, verb, targets, d)
}

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
				return fb.publishEntries(cmd, g, "allowed", targets, d, reason, origin)
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
	return newRemoveCmd(g, removeKind{
		use:   "unallow ADDRESS|PREFIX|-... [--origin NAME]",
		short: "Remove allow entries (exactly these prefixes), in one transaction",
		verb:  "unallowed", none: "had no allow entry", originHelp: "remove only entries made by this origin", allow: true,
		viaDaemon: func(ctx context.Context, cl *api.Client, p netip.Prefix, origin string) ([]ban.Ban, error) {
			resp, err := cl.Unallow(ctx, p.String(), origin)
			if err != nil {
				return nil, err
			}
			return resp.Unallowed, nil
		},
		direct: func(ctx context.Context, l bansets.Lists, ls []bansets.Lift) ([]ban.Ban, error) {
			return l.Allows.Unban(ctx, ls)
		},
	})
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
