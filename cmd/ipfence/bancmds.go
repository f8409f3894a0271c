package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/fleet"
)

// bulkQuiet: a ban of more targets than this asks the daemon for a count
// only, not the list of bans made.
const bulkQuiet = 1000

const socketHelp = "the daemon's API socket: used when a daemon listens there, else the kernel and state are changed directly"

// viaDaemon calls fn with a client of the daemon on socket. ok is false
// (and err nil) when no daemon listens there: the caller then works on
// the kernel directly.
func viaDaemon(socket string, fn func(*api.Client) error) (ok bool, err error) {
	if socket == "" {
		return false, nil
	}
	if _, err := os.Stat(socket); err != nil {
		return false, nil
	}
	cl := api.NewClient(socket)
	defer cl.Close()
	err = fn(cl)
	if errors.Is(err, api.ErrNoDaemon) {
		return false, nil
	}
	return true, err
}

// withBans runs fn with the state lock held and the namespace's ban
// service open (see apply.Target.OpenBans).
func withBans(ctx context.Context, f *kernelFlags, ensure bool, fn func(c *bansets.Controller) error) error {
	return withLists(ctx, f, ensure, func(l bansets.Lists) error { return fn(l.Bans) })
}

// withLists is withBans with both Controllers: bans and allow entries.
func withLists(ctx context.Context, f *kernelFlags, ensure bool, fn func(l bansets.Lists) error) error {
	t := f.target()
	unlock, err := t.State.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	b, err := t.OpenBans(ctx, f.table, ensure)
	if err != nil {
		return err
	}
	defer b.Close()
	return fn(b.Lists)
}

func newBanCmd(g *globals) *cobra.Command {
	var f kernelFlags
	var fb fleetBanFlags
	var ttl, reason, origin, socket, since string
	var noShorten, clamp bool
	c := &cobra.Command{
		Use:   "ban ADDRESS|PREFIX|-... [--ttl 1h] [--reason TEXT]",
		Short: "Ban addresses or prefixes, now, in one transaction",
		Long: `Ban puts addresses or prefixes into ipfence's ban sets, apart from the compiled
policy: single addresses into hash sets, prefixes into interval sets, each with
its own timeout (--ttl: 90s, 15m, 1h30m, 7d, 2w; 0 or no --ttl: for good). All
of them in one transaction, or none when one is refused: a protected network,
one of this host's addresses, a prefix shorter than /8 (IPv4) or /16 (IPv6).
Banning something banned already replaces its ban, unless --no-shorten is
given and the ban in force is another origin's and lasts at least as long.
Bans survive ipfence apply and restarts (kept in the state folder). Bans come
after the policy's leading accept rules and before all other rules. "-" reads
more targets from standard input, one per line (# comments and blank lines
skipped), for bulk bans.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := ban.ParseTTL(ttl)
			if clamp {
				var clamped bool
				if d, clamped, err = ban.ClampTTL(ttl); clamped {
					fmt.Fprintf(cmd.ErrOrStderr(), "ipfence: warning: ban duration %s is longer than ipfence's longest: banning for 366d\n", strings.TrimSpace(ttl))
					ttl = d.String()
				}
			}
			if err != nil {
				return usageError{err}
			}
			if since != "" && d > 0 {
				left, err := timeLeft(since, d, time.Now())
				if err != nil {
					return usageError{err}
				}
				if left <= 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "nothing to ban: a ban of %v since %s is over\n", d, since)
					return nil
				}
				d, ttl = left, left.String()
			}
			targets, err := banTargets(args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if fb.on {
				return fb.publishEntries(cmd, g, "banned", targets, d, reason, origin)
			}
			reqs := make([]bansets.Request, len(targets))
			for i, p := range targets {
				reqs[i] = bansets.Request{Prefix: p, TTL: d, Reason: reason, Origin: origin, NoShorten: noShorten}
			}
			var done []ban.Ban
			count := -1 // from the daemon when it answers with a count only
			ok, err := viaDaemon(socket, func(cl *api.Client) error {
				req := api.BanRequest{TTL: ttl, Reason: reason, Origin: origin, NoShorten: noShorten, Quiet: len(targets) > bulkQuiet}
				for _, p := range targets {
					req.Prefixes = append(req.Prefixes, p.String())
				}
				resp, err := cl.Ban(cmd.Context(), req)
				if err == nil {
					done, count = resp.Banned, resp.Count
				}
				return err
			})
			if !ok {
				err = withBans(cmd.Context(), &f, true, func(c *bansets.Controller) error {
					done, err = c.Ban(cmd.Context(), reqs)
					return err
				})
			}
			if err != nil {
				return err
			}
			if count < 0 || len(done) > 0 {
				count = len(done)
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"banned": done, "count": count})
			}
			if len(done) < count {
				fmt.Fprintf(cmd.OutOrStdout(), "banned %d prefixes\n", count)
			}
			for _, b := range done {
				fmt.Fprintf(cmd.OutOrStdout(), "banned %s%s\n", b.Prefix, describeExpiry(b, time.Now()))
			}
			return nil
		},
	}
	f.register(c)
	fb.register(c)
	c.Flags().StringVar(&ttl, "ttl", "", "how long the ban lasts (90s, 15m, 1h, 7d, 2w; default: for good)")
	c.Flags().StringVar(&reason, "reason", "", "why (shown by ipfence bans)")
	c.Flags().StringVar(&origin, "origin", "cli", "who bans (fail2ban, crowdsec, ...)")
	c.Flags().StringVar(&since, "since", "", "when the ban began, as a Unix time (fail2ban's <time>): the TTL counts from then")
	c.Flags().BoolVar(&noShorten, "no-shorten", false, "keep another origin's ban of a target that lasts at least as long (for integrations)")
	c.Flags().BoolVar(&clamp, "clamp", false, "ban for the longest ipfence allows (366d), with a warning, when --ttl is longer (for integrations: fail2ban's recidive and increasing ban times)")
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, socketHelp)
	return c
}

// timeLeft is what is left at now of a ban of d that began at since (a
// Unix time, with or without a fraction), rounded up to a whole second;
// ≤ 0 when it is over.
func timeLeft(since string, d time.Duration, now time.Time) (time.Duration, error) {
	secs, err := strconv.ParseFloat(since, 64)
	if err != nil || secs < 0 || secs > float64(now.Unix()+86400) {
		return 0, fmt.Errorf("--since %q: expected a Unix time in seconds, such as fail2ban's <time>", since)
	}
	start := time.Unix(0, int64(secs*float64(time.Second)))
	left := start.Add(d).Sub(now)
	if left <= 0 {
		return left, nil
	}
	return (left + time.Second - 1).Truncate(time.Second), nil
}

func newUnbanCmd(g *globals) *cobra.Command {
	var forget bool
	c := newRemoveCmd(g, removeKind{
		use:   "unban ADDRESS|PREFIX|-... [--origin NAME] [--forget]",
		short: "Lift bans (exactly these prefixes), in one transaction",
		long: `Unban lifts the bans of exactly these prefixes, in one transaction. With
--origin, only the ones that origin made: an integration lifting its own ban
(fail2ban's unban) leaves an operator's ban of the same address in force.
Under bans: {recidive: ...} a lifted temporary ban counts as one that ran
out: banned again within the window, the prefix gets a longer ban.
--forget forgets that too (a ban made by mistake).`,
		verb: "unbanned", none: "were not banned", originHelp: "lift only bans made by this origin",
		fleetCheck: func() error {
			if forget {
				return usageError{errors.New("--forget is for this host's bans: a fleet unban leaves each agent's strikes (unban --forget there)")}
			}
			return nil
		},
		viaDaemon: func(ctx context.Context, cl *api.Client, p netip.Prefix, origin string) ([]ban.Ban, error) {
			resp, err := cl.UnbanForget(ctx, p.String(), origin, forget)
			if err != nil {
				return nil, err
			}
			return resp.Unbanned, nil
		},
		direct: func(ctx context.Context, l bansets.Lists, ls []bansets.Lift) ([]ban.Ban, error) {
			for i := range ls {
				ls[i].Forget = forget
			}
			return l.Bans.Unban(ctx, ls)
		},
	})
	c.Flags().BoolVar(&forget, "forget", false, "also forget that the prefix was banned (bans: recidive): its next ban is not escalated")
	return c
}

// removeKind is what newRemoveCmd removes: bans (unban) or allow
// entries (unallow).
type removeKind struct {
	use, short, long string
	// verb says what was done to each ("unbanned"), none what the
	// targets that had nothing to remove were.
	verb, none, originHelp string
	allow                  bool // allow entries: the fleet's --key is the policy key
	// fleetCheck refuses flags that do not go with --fleet (nil: none).
	fleetCheck func() error
	// viaDaemon removes p's entry through a daemon; direct removes ls's
	// in the kernel and state folder.
	viaDaemon func(ctx context.Context, cl *api.Client, p netip.Prefix, origin string) ([]ban.Ban, error)
	direct    func(ctx context.Context, l bansets.Lists, ls []bansets.Lift) ([]ban.Ban, error)
}

// newRemoveCmd is the command that removes k's entries of exactly the
// prefixes given, in one transaction: on this host (through its daemon
// when one runs), or with --fleet on every agent of the fleet.
func newRemoveCmd(g *globals, k removeKind) *cobra.Command {
	var f kernelFlags
	fb := fleetBanFlags{allow: k.allow}
	var socket, origin string
	c := &cobra.Command{
		Use:   k.use,
		Short: k.short,
		Long:  k.long,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := banTargets(args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if fb.on {
				if k.fleetCheck != nil {
					if err := k.fleetCheck(); err != nil {
						return err
					}
				}
				err := fb.publish(cmd, ps, func(p netip.Prefix, now time.Time) *fleet.Ban {
					return &fleet.Ban{Prefix: p, Created: now, Unban: true}
				})
				if err != nil {
					return err
				}
				return printFleetBans(cmd.OutOrStdout(), g, k.verb, ps, 0)
			}
			var gone []ban.Ban
			ok, err := viaDaemon(socket, func(cl *api.Client) error {
				for _, p := range ps {
					bs, err := k.viaDaemon(cmd.Context(), cl, p, origin)
					if err != nil {
						return err
					}
					gone = append(gone, bs...)
				}
				return nil
			})
			if !ok {
				err = withLists(cmd.Context(), &f, false, func(l bansets.Lists) (err error) {
					ls := make([]bansets.Lift, len(ps))
					for i, p := range ps {
						ls[i] = bansets.Lift{Prefix: p, Origin: origin}
					}
					gone, err = k.direct(cmd.Context(), l, ls)
					return err
				})
			}
			if err != nil {
				return err
			}
			return printRemoved(cmd.OutOrStdout(), g, k.verb, gone, len(ps), k.none)
		},
	}
	f.register(c)
	fb.register(c)
	c.Flags().StringVar(&origin, "origin", "", k.originHelp)
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, socketHelp)
	return c
}

func newBansCmd(g *globals) *cobra.Command {
	return newListCmd(g, listKind{
		name: "bans", title: "bans", short: "List the bans in force, from ipfence's state (never from the kernel)",
		controller: func(l bansets.Lists) *bansets.Controller { return l.Bans },
		fetch: func(ctx context.Context, cl *api.Client, o api.ListOptions) ([]ban.Ban, int, api.Counts, error) {
			l, err := cl.List(ctx, o)
			if err != nil {
				return nil, 0, api.Counts{}, err
			}
			return l.Bans, l.Total, l.Counts, nil
		},
	})
}

// listKind is what newListCmd lists: bans or allow entries.
type listKind struct {
	// name is the command's and the JSON key's; title the entries' in
	// the text output.
	name, title, short string
	// controller is the list's Controller of a namespace's lists.
	controller func(bansets.Lists) *bansets.Controller
	// fetch asks a daemon for a page.
	fetch func(context.Context, *api.Client, api.ListOptions) ([]ban.Ban, int, api.Counts, error)
}

// newListCmd is the command that lists k's entries in force: the bans
// or the allow entries.
func newListCmd(g *globals, k listKind) *cobra.Command {
	var f kernelFlags
	var within, origin, socket string
	var offset, limit int
	c := &cobra.Command{
		Use:   k.name + " [--within PREFIX] [--origin NAME] [--offset N] [--limit N]",
		Short: k.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var flt ban.Filter
			if within != "" {
				p, err := netip.ParsePrefix(within)
				if err != nil {
					return usageError{fmt.Errorf("--within %q: %w", within, err)}
				}
				flt.Within = p.Masked()
			}
			flt.Origin = origin
			var page []ban.Ban
			var total int
			var counts api.Counts
			now := time.Now()
			ok, err := viaDaemon(socket, func(cl *api.Client) (err error) {
				page, total, counts, err = k.fetch(cmd.Context(), cl, api.ListOptions{Within: within, Origin: origin, Offset: offset, Limit: limit})
				return err
			})
			if !ok {
				err = withLists(cmd.Context(), &f, false, func(l bansets.Lists) error {
					k.controller(l).View(func(s *ban.Set) {
						page, total = s.List(now, flt, offset, limit)
						counts = api.CountsOf(s.Counts(now))
					})
					return nil
				})
			}
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{k.name: page, "total": total, "counts": counts})
			}
			printBans(cmd.OutOrStdout(), k.title, page, total, counts, now)
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&within, "within", "", "only entries inside this prefix")
	c.Flags().StringVar(&origin, "origin", "", "only entries from this origin")
	c.Flags().IntVar(&offset, "offset", 0, "skip this many")
	c.Flags().IntVar(&limit, "limit", 100, "show at most this many (0: all)")
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, socketHelp)
	return c
}

// printRemoved prints what an unban or unallow removed (verb: its JSON
// key too), and how many of its n targets had nothing to remove (none
// says what they were).
func printRemoved(w io.Writer, g *globals, verb string, gone []ban.Ban, n int, none string) error {
	if g.json {
		return writeJSON(w, map[string]any{verb: gone})
	}
	for _, b := range gone {
		fmt.Fprintf(w, "%s %s\n", verb, b.Prefix)
	}
	if len(gone) < n {
		fmt.Fprintf(w, "%d of %d %s\n", n-len(gone), n, none)
	}
	return nil
}

// banTargets parses the targets of ban and unban: arguments, and for "-"
// the lines of stdin.
func banTargets(args []string, stdin io.Reader) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for _, a := range args {
		if a != "-" {
			p, err := ban.ParsePrefix(a)
			if err != nil {
				return nil, usageError{err}
			}
			ps = append(ps, p)
			continue
		}
		sc := bufio.NewScanner(stdin)
		for line := 1; sc.Scan(); line++ {
			t, _, _ := strings.Cut(sc.Text(), "#")
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			p, err := ban.ParsePrefix(t)
			if err != nil {
				return nil, fmt.Errorf("standard input line %d: %w", line, err)
			}
			ps = append(ps, p)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
	}
	return ps, nil
}

// printBans prints a page of entries (bans, or allow entries when what
// says "allows").
func printBans(w io.Writer, what string, page []ban.Ban, total int, c api.Counts, now time.Time) {
	fmt.Fprintf(w, "%d %s in force: %d IPv4 + %d IPv6 addresses, %d IPv4 + %d IPv6 prefixes\n",
		c.Total, what, c.Addr4, c.Addr6, c.Net4, c.Net6)
	for _, b := range page {
		fmt.Fprintf(w, "  %-24s%s  %s %s\n", b.Prefix, describeExpiry(b, now), b.Origin, b.Reason)
	}
	if len(page) < total {
		fmt.Fprintf(w, "(%d of %d shown; --offset, --limit)\n", len(page), total)
	}
}

func describeExpiry(b ban.Ban, now time.Time) string {
	if b.Expires.IsZero() {
		return " for good"
	}
	return " for " + b.Remaining(now).Round(time.Second).String()
}
