package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/doctor"
	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/source"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/trial"
)

// policyFlags are the flags of every command that reads a policy.
type policyFlags struct {
	policy   string
	stateDir string
	offline  bool   // URLs from their last good copies only
	netns    string // the namespace sources are gated for (apply --netns)
	probe    bool   // backend auto probes the host (apply only: the others touch no kernel)
	backend  string // overrides the policy's backend
	iptables string // the iptables flavour: legacy, nft or "" (the one `iptables` is)
	record   bool   // keep the layout chooser's choices (publish)
	parallel bool   // build a rule's families at once (publish)
	// keepInput keeps the resolved rules' sets through the compile
	// (publish writes them into the bundle); the others let the compile
	// drop them as it goes (apply.CompileOptions.Consume).
	keepInput bool
	monitor   bool // every blocking rule in monitor mode
	// resolved, when set, is called with the policy resolved, before
	// the compile (which may consume its sets): apply keeps a copy.
	resolved func(*policy.Resolved) error
	// text, when set, is read in place of the policy file (which still
	// anchors its relative paths): a boot-time restore's stand-in.
	text []byte
}

func (f *policyFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.policy, "policy", "p", "", "policy file (YAML); relative source paths resolve from its folder")
	c.Flags().StringVar(&f.stateDir, "state", statedir.DefaultDir, "state folder: feed caches, last good loads, what was applied")
	c.Flags().StringVar(&f.backend, "backend", "", "override the policy's backend: nftables, ipset, iptables-split, xdp or auto")
	c.Flags().StringVar(&f.iptables, "iptables", "", "iptables flavour of the ipset and iptables-split backends: legacy or nft (default: the one `iptables` is)")
	c.Flags().BoolVar(&f.monitor, "monitor", false, "every rule that drops or rejects only counts what it would stop (mode: monitor), whatever the policy says")
	_ = c.MarkFlagRequired("policy")
}

// compiled is a policy taken from file to program.
type compiled struct {
	*apply.Compiled
	res      *policy.Resolved
	loader   *source.Loader
	duration time.Duration
}

// compile reads, resolves and compiles the policy; no kernel is touched
// unless f.probe, when backend auto probes in a scratch namespace.
func (f *policyFlags) compile(ctx context.Context, g *globals) (*compiled, error) {
	t0 := time.Now()
	pol, err := f.load()
	if err != nil {
		return nil, err
	}
	if !f.monitor && f.offline && f.probe {
		// The boot-time restore: a trial run (apply --monitor) stays
		// one until an apply without --offline says otherwise.
		if (statedir.Dir{Path: f.stateDir}).AppliedMonitorAll(f.netns) {
			g.logger.Warn("the last apply put every blocking rule in monitor mode (--monitor): kept; run apply without --offline to enforce")
			f.monitor = true
		}
	}
	if f.monitor {
		pol.MonitorAll()
	}
	l := &source.Loader{StateDir: f.stateDir, Logger: g.logger, Offline: f.offline, Namespace: f.netns}
	res, err := pol.Resolve(ctx, l)
	if err != nil {
		return nil, err
	}
	if f.resolved != nil {
		if err := f.resolved(res); err != nil {
			return nil, err
		}
	}
	o := apply.CompileOptions{Host: assumeNFTables, IPTables: f.iptables, Logger: g.logger, Record: f.record, Consume: !f.keepInput, Parallel: f.parallel}
	if f.probe {
		o.Host = probeBackend
	}
	if f.backend != "" {
		if o.Backend, err = plan.ParseBackend(f.backend); err != nil {
			return nil, fmt.Errorf("--backend: %w", err)
		}
	}
	c, err := apply.Compile(res.Input, o)
	if err != nil {
		return nil, err
	}
	for _, cs := range pol.CrowdSec {
		g.logger.Info("crowdsec source: ipfence daemon follows its decisions (as bans); this command does not", "source", cs.Name)
	}
	if n := c.ConnectionAware(); n > 0 {
		inUse := apply.ReadConntrack("") != nil
		g.logger.Info("connection-aware rules need conntrack (every packet then pays its lookup; stateless rules do not)",
			"rules", n, "conntrack_in_use_here", inUse)
	}
	return &compiled{Compiled: c, res: res, loader: l, duration: time.Since(t0)}, nil
}

// load reads the policy: the file, or the text in its place.
func (f *policyFlags) load() (*policy.Policy, error) {
	if f.text != nil {
		return policy.Parse(f.text, f.policy)
	}
	return policy.Load(f.policy)
}

func newCompileCmd(g *globals) *cobra.Command {
	var pf policyFlags
	var out string
	c := &cobra.Command{
		Use:   "compile --policy FILE [-o FILE]",
		Short: "Compile a policy into an nft script (no kernel is touched)",
		Long: `Compile reads the policy and its sources, computes every rule's prefix set and
layout, and prints the nft script that 'ipfence apply' would load (loadable with
'nft -f', which replaces a table of that name whoever made it: apply first checks
that it has ipfence's mark). With --json it prints the plan instead: per rule and family the
layout chosen, its levels and element counts, and the cost model's estimate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := pf.compile(cmd.Context(), g)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return fmt.Errorf("writing output: %w", err)
				}
				defer f.Close()
				w = f
			}
			if g.json {
				return writeJSON(w, planJSON(c))
			}
			if c.IPT != nil {
				_, err = io.WriteString(w, iptScript(c.IPT))
				return err
			}
			return nft.Write(w, c.NFT)
		},
	}
	pf.register(c)
	c.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of stdout")
	return c
}

// planSummary is the JSON form of a compiled plan.
type planSummary struct {
	*plan.Plan
	Sources       map[string]sourceSummary `json:"sources"`
	Sets          int                      `json:"nft_sets"`
	Elements      int                      `json:"nft_elements"`
	Chains        int                      `json:"nft_chains"`
	CompileMillis int64                    `json:"compile_ms"`
	// BackendWhy says why backend auto chose the plan's backend.
	BackendWhy string `json:"backend_why,omitempty"`
	// NeedsConntrack: some rule is connection-aware.
	NeedsConntrack bool `json:"needs_conntrack"`
}

type sourceSummary struct {
	Format     string `json:"format"`
	PrefixesV4 int    `json:"prefixes_ipv4"`
	PrefixesV6 int    `json:"prefixes_ipv6"`
	Stale      bool   `json:"stale,omitempty"`
}

func planJSON(c *compiled) planSummary {
	s := planSummary{Plan: c.Plan, Sources: map[string]sourceSummary{}, CompileMillis: c.duration.Milliseconds()}
	for name, src := range c.res.Sources {
		v4, v6 := src.Prefixes()
		stale, _ := src.Stale()
		s.Sources[name] = sourceSummary{Format: src.Format(), PrefixesV4: v4, PrefixesV6: v6, Stale: stale}
	}
	s.Sets, s.Elements, s.Chains = c.Counts()
	s.BackendWhy = c.BackendWhy
	s.NeedsConntrack = c.ConnectionAware() > 0
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newApplyCmd(g *globals) *cobra.Command {
	var pf policyFlags
	var xf xdpFlags
	var dry bool
	var confirm time.Duration
	c := &cobra.Command{
		Use:   "apply --policy FILE [--netns NAME] [--dry-run] [--confirm 2m]",
		Short: "Compile a policy and load it in one atomic transaction",
		Long: `Apply compiles the policy and replaces ipfence's own nftables table (inet
ipfence) in one netlink transaction: either the whole new ruleset is in force or
the old one stays. Nothing else of the host's ruleset is touched. Before loading
it refuses rules that would block this host's own addresses. It prints what
changed against the last apply.

Rules with backend xdp (the policy's top-level 'backend:' or a rule's own) run
in an XDP program on the policy's 'interfaces:', ahead of the table: the
leading drop and allow-only rules without ports. The program is swapped in one
step (bpf_link update) and pinned under --pin-dir, so it keeps running when
ipfence exits; 'ipfence flush' detaches it.

--confirm 2m loads the policy on trial: unless 'ipfence confirm' runs within two
minutes, what was in force before is put back, by a process of its own (see
ipfence confirm). Each apply keeps a copy of what it loaded for that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			netns := pf.netns
			pf.probe = true
			if confirm != 0 {
				if err := trial.CheckWindow(confirm); err != nil {
					return usageError{fmt.Errorf("--confirm: %w", err)}
				}
				if dry || pf.offline {
					return usageError{errors.New("--confirm: a trial is an apply of the operator's own (not with --dry-run or --offline)")}
				}
			}
			t := &apply.Target{NetNS: netns, State: statedir.Dir{Path: pf.stateDir}, XDP: xf.options(), Logger: g.logger}
			var rv *applyRevision
			if !dry {
				// Locked before the compile: the copy of what is
				// loaded is written as the policy resolves.
				unlock, err := t.State.Lock()
				if err != nil {
					return err
				}
				defer unlock()
				store := trial.Store{Dir: t.State, NetNS: netns}
				rv = &applyRevision{store: store, roller: &trial.Roller{Store: store, Target: t, Logger: g.logger}, window: confirm, xf: xf}
				if err := rv.checkPending(pf.offline); err != nil {
					return err
				}
				if pf.offline {
					done, instead, err := rv.restoreRefused(ctx, cmd.OutOrStdout(), pf.policy)
					if done {
						return err
					}
					pf.text = instead
				}
				pf.resolved = rv.candidate
			}
			c, err := pf.compile(ctx, g)
			if err != nil {
				if rv != nil {
					rv.store.DropCandidate()
				}
				return err
			}
			// The new rules are in force, but the last apply's backend
			// could not be emptied: said after the report, as a failure.
			var leftover error
			rep := applyReport{NetNS: netns, DryRun: dry, CompileMillis: c.duration.Milliseconds(),
				Report: &apply.Report{Backend: c.Plan.Backend}, BackendWhy: c.BackendWhy}
			rep.Sets, rep.Elements, rep.Chains = c.Counts()
			if dry {
				if err := hostaddr.CheckPlan(c.Plan, netns); err != nil {
					return err
				}
				rep.Changes = statedir.Compare(t.Previous(), statedir.Summarize(c.Plan))
			} else {
				if err := rv.apply(ctx, t, c, &rep, pf.monitor, pf.offline); err != nil {
					return err
				}
				leftover = rep.Leftover
				for _, src := range c.res.Sources {
					if err := c.loader.Commit(src); err != nil {
						g.logger.Warn("recording last good source", "source", src.Name(), "err", err)
					}
				}
			}
			if rv != nil {
				rep.Trial = rv.pending
			}
			if g.json {
				return errors.Join(writeJSON(cmd.OutOrStdout(), rep), leftover)
			}
			printApply(cmd.OutOrStdout(), c, rep)
			if rv != nil {
				printTrial(cmd.OutOrStdout(), rv.pending)
			}
			return leftover
		},
	}
	pf.register(c)
	c.Flags().StringVar(&pf.netns, "netns", "", "network namespace to apply in (as listed by `ip netns list`; default: the current one)")
	c.Flags().BoolVar(&dry, "dry-run", false, "compile and show what would change, touch nothing")
	c.Flags().BoolVar(&pf.offline, "offline", false, "download nothing: URL sources from their last good copies (boot-time restore, before the network is up)")
	c.Flags().DurationVar(&confirm, "confirm", 0, "load on trial: unless `ipfence confirm` runs within this time (e.g. 2m), what was in force before is put back")
	xf.register(c, true)
	return c
}

type applyReport struct {
	NetNS  string `json:"netns,omitempty"`
	DryRun bool   `json:"dry_run"`
	*apply.Report
	Sets          int    `json:"nft_sets"`
	Elements      int    `json:"nft_elements"`
	Chains        int    `json:"nft_chains"`
	CompileMillis int64  `json:"compile_ms"`
	BackendWhy    string `json:"backend_why,omitempty"`
	// Trial is the apply on trial it began (apply --confirm).
	Trial *trial.Pending `json:"trial,omitempty"`
}

func printApply(w io.Writer, c *compiled, rep applyReport) {
	verb := "applied"
	if rep.DryRun {
		verb = "would apply (dry run)"
	}
	where := "the current network namespace"
	if rep.NetNS != "" {
		where = "network namespace " + rep.NetNS
	}
	what, sets := "table inet "+c.Plan.Table, "maps/sets"
	if c.IPT != nil {
		what, sets = "backend "+string(c.Plan.Backend), "ipsets"
		if rep.IPTables != nil {
			what += " (" + rep.IPTables.Flavour + " flavour)"
		}
	}
	fmt.Fprintf(w, "%s %s in %s: %d rules, %d %s, %d elements, %d chains (compile %d ms, load %d ms)\n",
		verb, what, where, len(c.Plan.Rules), rep.Sets, sets, rep.Elements, rep.Chains, rep.CompileMillis, rep.LoadMillis)
	if c.BackendWhy != "" {
		fmt.Fprintf(w, "backend auto chose %s: %s\n", c.Plan.Backend, c.BackendWhy)
	}
	for _, r := range c.Plan.Rules {
		if r.Backend == plan.XDP {
			fmt.Fprintf(w, "  rule %-16s %-10s XDP on %s: %d IPv4 + %d IPv6 prefixes\n", r.Name, r.Action,
				strings.Join(c.Plan.Interfaces, ", "), r.V4.Prefixes, r.V6.Prefixes)
			continue
		}
		fmt.Fprintf(w, "  rule %-16s %-10s ipv4 %s; ipv6 %s\n", r.Name, ruleMode(r), describeLayout(r.V4), describeLayout(r.V6))
	}
	printXDPApply(w, rep.XDP)
	if len(rep.Changes) == 0 {
		fmt.Fprintln(w, "no change against the last apply")
	}
	for _, ch := range rep.Changes {
		fmt.Fprintf(w, "  %s\n", ch)
	}
}

// ruleMode is a rule's action as listed, "monitor (drop)" for one in
// monitor mode.
func ruleMode(r *plan.Rule) string {
	if r.Monitor {
		return monitorLabel(r.Hit())
	}
	return string(r.Action)
}

// monitorLabel is how a rule in monitor mode that would act a is listed.
func monitorLabel(a plan.Action) string { return "monitor (" + string(a) + ")" }

func describeLayout(l *plan.Layout) string {
	switch l.Kind {
	case plan.KindTree:
		st := l.Strides()
		bitmap := ""
		if l.BitmapRoot() {
			bitmap, st = "/16 bitmaps, then ", st[1:]
		}
		return fmt.Sprintf("%d prefixes → %s%d hash maps of %d lengths (/%d../%d), %d elements, ≤ %d lookups (model: %.2f for legitimate traffic)",
			l.Prefixes, bitmap, l.Maps(), len(st), st[0], st[len(st)-1], l.Entries(), l.MaxLookups(), l.Cost.LookupsPass)
	case plan.KindPlain:
		return fmt.Sprintf("%d prefixes → interval set", l.Prefixes)
	case plan.KindXDP:
		return fmt.Sprintf("%d prefixes → XDP tables", l.Prefixes)
	case plan.KindIPSet:
		return fmt.Sprintf("%d prefixes → ipsets", l.Prefixes)
	case plan.KindSplit:
		return fmt.Sprintf("%d prefixes → chains per /%d", l.Prefixes, map[bool]int{true: 8, false: 16}[l.Is4])
	}
	return string(l.Kind)
}

// kernelFlags are the flags of commands that only read or change the
// kernel side (no policy).
type kernelFlags struct{ netns, stateDir, table string }

// target is the namespace and state folder the flags name.
func (f *kernelFlags) target() *apply.Target {
	return &apply.Target{NetNS: f.netns, State: statedir.Dir{Path: f.stateDir}}
}

func (f *kernelFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.netns, "netns", "", "network namespace (as listed by `ip netns list`; default: the current one)")
	c.Flags().StringVar(&f.stateDir, "state", statedir.DefaultDir, "state folder")
	c.Flags().StringVar(&f.table, "table", "ipfence", "ipfence's table name (the policy's `table:`)")
	// Flush deletes the table of that name: never another manager's.
	prev := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := plan.CheckTable(f.table); err != nil {
			return usageError{fmt.Errorf("--table: %w", err)}
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

func newStatusCmd(g *globals) *cobra.Command {
	var kf kernelFlags
	var xf xdpFlags
	var socket string
	c := &cobra.Command{
		Use:   "status [--netns NAME]",
		Short: "Show ipfence's table in the kernel: rules, counters, what was applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t := kf.target()
			t.XDP = xf.options()
			st, err := t.Status(cmd.Context(), kf.table)
			if err != nil {
				return fmt.Errorf("reading status: %w", err)
			}
			var ds *api.Status
			if _, err := viaDaemon(socket, func(cl *api.Client) (err error) {
				ds, err = cl.Status(cmd.Context())
				return err
			}); err != nil {
				return err
			}
			ts := trial.Store{Dir: t.State, NetNS: kf.netns}
			pending, err := ts.Pending()
			if err != nil {
				return err
			}
			refused, err := ts.Refused()
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), struct {
					*apply.Status
					Daemon *api.Status    `json:"daemon,omitempty"`
					Trial  *trial.Pending `json:"trial,omitempty"`
					// RolledBack is the last trial rolled back.
					RolledBack *trial.Refused `json:"rolled_back,omitempty"`
				}{st, ds, pending, refused})
			}
			printTrialStatus(cmd.OutOrStdout(), pending, refused)
			if st.IPTables != nil {
				printIPTStatus(cmd.OutOrStdout(), st.IPTables, st.Applied)
			} else {
				printStatus(cmd.OutOrStdout(), st.Kernel, st.Applied)
			}
			printXDPStatus(cmd.OutOrStdout(), st.XDP)
			if ct := st.Conntrack; ct != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "conntrack: %d of %d entries (%.1f%%); connection-aware rules rely on it\n",
					ct.Entries, ct.Max, 100*float64(ct.Entries)/float64(max(ct.Max, 1)))
			}
			if ds != nil {
				printDaemonStatus(cmd.OutOrStdout(), ds)
			}
			return nil
		},
	}
	kf.register(c)
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the daemon's API socket (its status is shown when it runs)")
	xf.register(c, false)
	return c
}

func printDaemonStatus(w io.Writer, s *api.Status) {
	now := time.Now()
	fmt.Fprintf(w, "daemon: running since %s, policy %s loaded %s ago; %d bans; %d drift repairs\n",
		s.Started.Format(time.RFC3339), s.Policy, now.Sub(s.Applied).Round(time.Second), s.Bans.Total, s.Drift)
	for _, src := range s.Sources {
		note := ""
		if src.Stale {
			note += " [stale: cached copy]"
		}
		if src.LastError != "" {
			note += " [last attempt failed: " + src.LastError + "]"
		}
		if src.Kind == policy.FormatCrowdSec {
			last := "never"
			if !src.Loaded.IsZero() {
				last = now.Sub(src.Loaded).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "  crowdsec %-14s %d+%d bans, last pulled %s, every %s%s\n",
				src.Name, src.PrefixesV4, src.PrefixesV6, last, src.Refresh, note)
			continue
		}
		fmt.Fprintf(w, "  source %-16s %d+%d prefixes, loaded %s ago, refresh %s%s\n",
			src.Name, src.PrefixesV4, src.PrefixesV6, now.Sub(src.Loaded).Round(time.Second), src.Refresh, note)
	}
	if s.LastError != "" {
		fmt.Fprintf(w, "  last error: %s\n", s.LastError)
	}
}

func printStatus(w io.Writer, ts nft.TableStatus, a *statedir.Applied) {
	if !ts.Exists {
		fmt.Fprintln(w, "no ipfence table loaded")
		return
	}
	fmt.Fprintf(w, "table inet %s loaded: %d chains, %d sets/maps\n", ts.Table, len(ts.Chains), len(ts.Sets))
	if !ts.Marked {
		fmt.Fprintf(w, "  without ipfence's mark (comment %q): an older ipfence loaded it (the next apply marks it), or it is not ipfence's\n", nft.Mark)
	}
	printApplied(w, a)
	for _, c := range ts.Chains {
		for _, r := range c.Rules {
			if r.HasCounter {
				note := ""
				if verb, ok := strings.CutPrefix(r.Comment, nft.MonitorComment); ok {
					note = " (monitor mode: would " + verb + ", passed on)"
				}
				fmt.Fprintf(w, "  chain %-24s %12d packets %14d bytes%s\n", c.Name, r.Packets, r.Bytes, note)
			}
		}
	}
}

// printApplied prints what was applied, rule by rule.
func printApplied(w io.Writer, a *statedir.Applied) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "applied %s from %d rules\n", a.Time.Format(time.RFC3339), len(a.Rules))
	for _, r := range a.Rules {
		act := string(r.Action)
		if r.Monitor {
			act = monitorLabel(r.Action)
		}
		fmt.Fprintf(w, "  rule %-16s %-10s %d IPv4 + %d IPv6 prefixes\n", r.Name, act, r.PrefixesV4, r.PrefixesV6)
	}
}

// printIPTStatus prints the iptables backends' status: chains, the
// rules' counters (both families), the reject chain's and the sets.
func printIPTStatus(w io.Writer, s *ipt.Status, a *statedir.Applied) {
	if !s.Loaded {
		fmt.Fprintf(w, "no ipfence chains loaded (iptables %s flavour)\n", s.Flavour)
		return
	}
	fmt.Fprintf(w, "backend %s loaded (iptables %s flavour): %d chains, %d ipsets\n", a.Backend, s.Flavour, s.Chains, len(s.Sets))
	printApplied(w, a)
	for _, r := range s.Rules {
		fmt.Fprintf(w, "  rule %-24s %12d packets %14d bytes", r.Rule, r.Packets, r.Bytes)
		if r.Out.Packets > 0 {
			fmt.Fprintf(w, " (in %d, out %d packets)", r.In.Packets, r.Out.Packets)
		}
		fmt.Fprintln(w)
	}
	if s.Rejected > 0 {
		fmt.Fprintf(w, "  rejected in the filter table %12d packets\n", s.Rejected)
	}
	for _, set := range s.Sets {
		fmt.Fprintf(w, "  ipset %-26s %10d elements %12d bytes\n", set.Name, set.Elements, set.Memory)
	}
}

func newFlushCmd(g *globals) *cobra.Command {
	var kf kernelFlags
	var xf xdpFlags
	var staleOnly bool
	c := &cobra.Command{
		Use:   "flush [--netns NAME] [--stale-pins]",
		Short: "Remove ipfence's table, XDP program, iptables chains and ipsets (nothing else)",
		Long: `Flush removes what ipfence loaded in the namespace (--netns, default the
current one): its nftables table, its XDP program and pins, its iptables chains
and ipsets, nothing else. An nftables table of the name without ipfence's mark
(comment "ipfence") is not ipfence's: flush refuses it and removes nothing. In the current namespace it also removes the XDP pins
of namespaces that are gone (deleted without a flush: their program runs
nowhere but its maps stay in memory); --stale-pins removes only those, and
leaves every firewall alone. Pins of a namespace that exists are never removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			if staleOnly {
				if kf.netns != "" {
					return usageError{errors.New("--stale-pins removes the XDP pins of every namespace that is gone: give it without --netns")}
				}
				removed, err := xdp.RemoveStale(xf.pinDir)
				if g.json {
					if err != nil {
						return err
					}
					return writeJSON(w, map[string][]xdp.Pin{"stale_pins_removed": removed})
				}
				printStalePins(w, removed)
				if err == nil && len(removed) == 0 {
					fmt.Fprintln(w, "no XDP pins of namespaces that are gone")
				}
				return err
			}
			t := kf.target()
			t.XDP, t.Logger = xf.options(), g.logger
			unlock, err := t.State.Lock()
			if err != nil {
				return err
			}
			defer unlock()
			r, err := t.Flush(cmd.Context(), kf.table)
			if err != nil {
				return err
			}
			// Nothing of ipfence's is loaded: no copy of it is kept,
			// and a trial has nothing left to put back.
			store := trial.Store{Dir: t.State, NetNS: kf.netns}
			p, _ := store.Pending()
			if err := errors.Join(store.ClearPending(), store.ForgetRevision(), store.ClearRefused()); err != nil {
				g.logger.Warn("forgetting the copy of what was applied", "err", err)
			}
			if g.json {
				return writeJSON(w, r)
			}
			if p != nil {
				fmt.Fprintf(w, "the apply on trial (%s) ends: nothing is put back\n", p.Policy)
			}
			switch {
			case r.Table:
				fmt.Fprintf(w, "removed table inet %s\n", kf.table)
			case !r.IPTables:
				fmt.Fprintln(w, "no ipfence table was loaded")
			}
			if r.IPTables {
				fmt.Fprintf(w, "removed ipfence's iptables chains and ipsets (%s*)\n", kf.table)
			}
			if r.XDP {
				fmt.Fprintln(w, "detached the XDP program")
			}
			printStalePins(w, r.StalePins)
			return nil
		},
	}
	kf.register(c)
	xf.register(c, false)
	c.Flags().BoolVar(&staleOnly, "stale-pins", false, "only remove the XDP pins of namespaces that are gone")
	return c
}

// printStalePins says which pins of gone namespaces were removed.
func printStalePins(w io.Writer, pins []xdp.Pin) {
	for _, p := range pins {
		fmt.Fprintf(w, "removed the XDP pins of a namespace that is gone: %s\n", p)
	}
}

func newExplainCmd(g *globals) *cobra.Command {
	var pf policyFlags
	var port, to string
	c := &cobra.Command{
		Use:   "explain --policy FILE (ADDR | --to ADDR) [--port tcp/22]",
		Short: "Say which rule decides a new connection from a source (or to a destination), and from which source entry",
		Long: `Explain says which rule decides a new inbound connection from ADDR (or,
with --to, a new connection from this host or a client it forwards to ADDR),
and the source entries (file:line, country, AS) the address comes from. Packets
of connections conntrack knows pass every connection-aware rule; only
stateless rules judge them.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, out := to, true
			if len(args) == 1 {
				text, out = args[0], false
			}
			if (len(args) == 1) == (to != "") {
				return usageError{errors.New("give one address: a source (ADDR) or a destination (--to ADDR)")}
			}
			addr, err := netip.ParseAddr(text)
			if err != nil {
				return usageError{fmt.Errorf("%q is not an IP address", text)}
			}
			pkt := plan.Packet{Src: addr.Unmap()}
			if out {
				pkt = plan.Packet{Out: true, Dst: addr.Unmap()}
			}
			if port != "" {
				pt, err := policy.ParsePort(port)
				if err != nil {
					return usageError{err}
				}
				pkt.Proto, pkt.DPort = pt.Proto, pt.First
			}
			c, err := pf.compile(cmd.Context(), g)
			if err != nil {
				return err
			}
			ex := explain(c, pkt)
			if g.json {
				return writeJSON(cmd.OutOrStdout(), ex)
			}
			printExplain(cmd.OutOrStdout(), ex)
			return nil
		},
	}
	pf.register(c)
	c.Flags().StringVar(&port, "port", "", "destination, e.g. tcp/22 (rules with ports only apply to matching packets)")
	c.Flags().StringVar(&to, "to", "", "explain a new outbound connection to this destination instead")
	return c
}

type explanation struct {
	Addr string `json:"addr"`
	// Direction is "out" for a destination (--to), "" for a source.
	Direction plan.Direction `json:"direction,omitempty"`
	Decision  plan.Decision  `json:"decision"`
	Protected bool           `json:"protected"`
	Rules     []ruleExplain  `json:"rules"`
}

type ruleExplain struct {
	Name    string      `json:"name"`
	Action  plan.Action `json:"action"`
	InSet   bool        `json:"in_set"`
	Applies bool        `json:"applies"`
	// Stateless: the rule also judges packets of known connections.
	Stateless bool `json:"stateless,omitempty"`
	// Monitor: the rule is in monitor mode (it only counts).
	Monitor bool            `json:"monitor,omitempty"`
	Origins []policy.Origin `json:"origins,omitempty"`
}

func explain(c *compiled, pkt plan.Packet) explanation {
	addr := pkt.Src
	if pkt.Out {
		addr = pkt.Dst
	}
	ex := explanation{Addr: addr.String(), Decision: c.Plan.Verdict(pkt), Protected: c.Plan.Protected(addr)}
	if pkt.Out {
		ex.Direction = plan.Outbound
	}
	for _, r := range c.Plan.Rules {
		if pkt.Out && !r.Direction.Out() || !pkt.Out && !r.Direction.In() {
			continue
		}
		l := r.V4
		if !addr.Is4() {
			l = r.V6
		}
		re := ruleExplain{Name: r.Name, Action: r.Action, InSet: r.Set.Contains(addr), Applies: l.Kind != plan.KindEmpty, Stateless: r.Stateless, Monitor: r.Monitor}
		re.Origins = c.res.Explain(r.Name, addr)
		ex.Rules = append(ex.Rules, re)
	}
	return ex
}

func printExplain(w io.Writer, ex explanation) {
	who := "no rule stops it"
	switch ex.Decision.Rule {
	case "":
	case "protect":
		who = "protected"
	default:
		who = "rule " + ex.Decision.Rule
	}
	what := ex.Addr
	if ex.Direction == plan.Outbound {
		what = "to " + ex.Addr
	}
	fmt.Fprintf(w, "%s: %s (%s)\n", what, ex.Decision.Verdict, who)
	if len(ex.Decision.Monitored) > 0 {
		fmt.Fprintf(w, "  rule %s would have stopped it: in monitor mode, counted and passed on\n", strings.Join(ex.Decision.Monitored, ", rule "))
	}
	if ex.Protected {
		fmt.Fprintln(w, "  the address is protected: no rule blocks it")
	}
	for _, r := range ex.Rules {
		in := "not in set"
		if r.InSet {
			in = "in set"
		}
		if !r.Applies {
			in += ", rule does not apply to this family"
		}
		act := string(r.Action)
		if r.Monitor {
			act += ", monitor"
		}
		fmt.Fprintf(w, "  rule %s (%s): %s\n", r.Name, act, in)
		for _, o := range r.Origins {
			cc := ""
			if o.Country != "" {
				cc = " " + o.Country
			}
			if o.ASN != 0 {
				cc += fmt.Sprintf(" AS%d", o.ASN)
				if o.Org != "" {
					cc += " " + strconv.Quote(o.Org)
				}
			}
			fmt.Fprintf(w, "    from %s: %s%s (%s)\n", o.Source, o.Range, cc, o.Where)
		}
	}
}

// probeBackend is doctor.Pick: a variable, so that tests can see who
// probes.
var probeBackend = doctor.Pick

// assumeNFTables is backend auto's choice for the commands that touch no
// kernel (compile, explain, publish): what most hosts have, unprobed.
func assumeNFTables() (plan.Backend, string, error) {
	return plan.NFTables, "nftables: assumed, not probed (this command touches no kernel; apply and the daemon probe the host)", nil
}
