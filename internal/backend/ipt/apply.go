package ipt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
)

// Flavours of iptables: the legacy x_tables, or iptables-nft, which puts
// the same rules into nf_tables.
const (
	Legacy = "legacy"
	NFT    = "nft"
)

// Options say where and with which iptables Apply, Flush and Status work.
type Options struct {
	// NetNS is the network namespace (`ip netns` name); "" the current.
	NetNS string
	// Flavour is Legacy or NFT; "" is the flavour the `iptables` command
	// is (update-alternatives).
	Flavour string
	// Adopt takes chains of the name without ipfence's mark (Mark) as
	// ipfence's: those an older ipfence loaded, which its record of the
	// last apply vouches for (statedir.Applied.VouchesChains). Without
	// it, Apply and Flush refuse them (ErrNotOwned).
	Adopt bool
}

// ErrNotOwned is wrapped by the error of Apply and Flush when chains of
// ipfence's name exist in a table without its mark: another program
// (or the operator) made them, and nothing was changed.
var ErrNotOwned = errors.New("exist and were not made by ipfence")

// markLine matches a rule that carries Mark, as iptables-save writes
// it: the end of an entry chain, or a jump to one.
var markLine = regexp.MustCompile(` -m comment --comment "?` + Mark + `"? -j \S+$`)

// unowned returns the tables of st that hold chains of ipfence's name
// without the mark in any of them or of the jumps to them.
func (st *State) unowned() []string {
	var out []string
	for i, t := range []*Table{&st.Raw, &st.Mangle, &st.Filter} {
		if len(t.Chains) > 0 && !slices.ContainsFunc(t.Rules, markLine.MatchString) && !slices.ContainsFunc(t.Jumps, markLine.MatchString) {
			out = append(out, savedTables[i])
		}
	}
	return out
}

// checkOwned refuses family f's state st of flavour fl when a table holds
// chains of prefix without ipfence's mark, unless o.Adopt.
func checkOwned(st *State, o *Options, fl string, f Family, prefix string) error {
	tables := st.unowned()
	if len(tables) == 0 || o.Adopt {
		return nil
	}
	return fmt.Errorf("chains %s and %s-* of %s-%s's table %s in %s %w (no rule of theirs or jump to them has comment %q): ipfence replaces and deletes only its own chains; "+
		"choose another name (table: in the policy, or --table), or, if an older ipfence loaded them, remove them yourself",
		prefix, prefix, f.Command(), fl, strings.Join(tables, ", "), netns.Describe(o.NetNS), ErrNotOwned, Mark)
}

// ErrFlavour is returned for an unknown flavour.
var ErrFlavour = errors.New("unknown iptables flavour")

// InUse returns the flavour the `iptables` command is.
func InUse() (string, error) {
	out, err := exec.Command("iptables", "-V").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("running iptables -V: %w: %s (install the iptables package)", err, bytes.TrimSpace(out))
	}
	if bytes.Contains(out, []byte("nf_tables")) {
		return NFT, nil
	}
	return Legacy, nil
}

// flavour resolves o.Flavour.
func (o *Options) flavour() (string, error) { return ResolveFlavour(o.Flavour) }

// ResolveFlavour returns the flavour name stands for: name itself (Legacy
// or NFT), or for "" the one `iptables` is.
func ResolveFlavour(name string) (string, error) {
	switch name {
	case "":
		return InUse()
	case Legacy, NFT:
		return name, nil
	}
	return "", fmt.Errorf("%w %q (use legacy or nft)", ErrFlavour, name)
}

// tool is the command of family f and flavour fl: "iptables-nft-restore".
func tool(f Family, fl, what string) string {
	return f.Command() + "-" + fl + "-" + what
}

// run runs argv in namespace ns with stdin.
func run(ctx context.Context, ns, stdin string, argv ...string) ([]byte, error) {
	cmd, err := netns.Command(ctx, ns, argv...)
	if err != nil {
		return nil, err
	}
	argv = cmd.Args
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), &CommandError{Argv: argv, Err: err, Stderr: strings.TrimSpace(errb.String())}
	}
	return out.Bytes(), nil
}

// CommandError is a command that failed.
type CommandError struct {
	Argv   []string
	Err    error
	Stderr string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Argv, " "), e.Err, e.Stderr)
}

func (e *CommandError) Unwrap() error { return e.Err }

// restore runs `iptables-restore --noflush -w` of family f with text.
func restore(ctx context.Context, o *Options, fl string, f Family, text string) error {
	if text == "" {
		return nil
	}
	_, err := run(ctx, o.NetNS, text, tool(f, fl, "restore"), "--noflush", "-w", "10")
	return err
}

// ipsetRestore runs `ipset restore` of text.
func ipsetRestore(ctx context.Context, o *Options, text string) error {
	if text == "" {
		return nil
	}
	_, err := run(ctx, o.NetNS, text, "ipset", "restore")
	return err
}

// save returns iptables-save's output of family f's raw, mangle and
// filter tables
// (counters: with packet and byte counts). For iptables-nft it saves every
// table (those that do not exist are simply absent). For legacy it saves
// only the tables /proc/net/ip_tables_names lists, since saving a table
// that is not loaded would load it (and make every packet pass it).
func save(ctx context.Context, o *Options, fl string, f Family, counters bool) (string, error) {
	argv := []string{tool(f, fl, "save")}
	if counters {
		argv = append(argv, "-c")
	}
	if fl == NFT {
		out, err := run(ctx, o.NetNS, "", argv...)
		if err != nil {
			return "", fmt.Errorf("reading the rules: %w", err)
		}
		return string(out), nil
	}
	names := [...]string{"/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"}[f]
	loaded, err := run(ctx, o.NetNS, "", "cat", names)
	if err != nil {
		return "", nil // the x_tables module is not loaded: no table
	}
	var b strings.Builder
	for _, t := range strings.Fields(string(loaded)) {
		if !slices.Contains(savedTables, t) {
			continue
		}
		out, err := run(ctx, o.NetNS, "", append(argv, "-t", t)...)
		if err != nil {
			return "", fmt.Errorf("reading the %s table: %w", t, err)
		}
		b.Write(out)
	}
	return b.String(), nil
}

// current reads what family f's tables hold of ipfence's (prefix), and
// the save it read that from.
func current(ctx context.Context, o *Options, fl string, f Family, prefix string, counters bool) (State, string, error) {
	text, err := save(ctx, o, fl, f, counters)
	if err != nil {
		return State{}, "", err
	}
	return ParseSave(prefix, stripCounters(text)), text, nil
}

// counterPrefix matches the "[packets:bytes] " iptables-save -c writes.
var counterPrefix = regexp.MustCompile(`(?m)^\[\d+:\d+\] `)

func stripCounters(s string) string { return counterPrefix.ReplaceAllString(s, "") }

// ownSets returns the sets of prefix's program naming scheme that exist;
// none where ipset is not installed (the split backend's hosts).
func ownSets(ctx context.Context, o *Options, prefix string) ([]string, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, nil
	}
	out, err := run(ctx, o.NetNS, "", "ipset", "list", "-n")
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	re := setPattern(prefix)
	var names []string
	for _, n := range strings.Fields(string(out)) {
		if re.MatchString(n) {
			names = append(names, n)
		}
	}
	return names, nil
}

// Result is what Apply did.
type Result struct {
	Flavour  string        `json:"flavour"`
	Sets     int           `json:"sets"`
	Elements int           `json:"elements"`
	Chains   int           `json:"chains"`
	Rules    int           `json:"rules"`
	Load     time.Duration `json:"-"`
}

// Apply loads p: the sets filled beside the live ones and swapped in
// (never empty, never half filled), then each family's chains replaced
// in one iptables-restore commit per table, then the sets no rule uses
// any more destroyed. If a step fails, what the earlier steps changed is
// put back: the old rules and the old set contents.
func Apply(ctx context.Context, p *Program, o Options) (Result, error) {
	t0 := time.Now()
	fl, err := o.flavour()
	if err != nil {
		return Result{}, err
	}
	res := Result{Flavour: fl, Sets: len(p.Sets)}
	for _, s := range p.Sets {
		res.Elements += len(s.Elems)
	}
	var cur, want [2]State
	for _, f := range []Family{IPv4, IPv6} {
		if cur[f], _, err = current(ctx, &o, fl, f, p.Prefix, false); err != nil {
			return res, err
		}
		if err := checkOwned(&cur[f], &o, fl, f, p.Prefix); err != nil {
			return res, err
		}
		want[f] = p.Desired(f)
		res.Chains += len(want[f].Raw.Chains) + len(want[f].Mangle.Chains) + len(want[f].Filter.Chains)
		res.Rules += len(want[f].Raw.Rules) + len(want[f].Mangle.Rules) + len(want[f].Filter.Rules)
	}
	existing, err := ownSets(ctx, &o, p.Prefix)
	if err != nil {
		return res, err
	}
	live := map[string]bool{}
	for _, n := range existing {
		live[n] = true
	}
	if len(p.Sets) > 0 {
		var stale []string
		for _, s := range p.Sets {
			if live[s.Name+TempSuffix] {
				stale = append(stale, s.Name+TempSuffix)
			}
		}
		if err := ipsetRestore(ctx, &o, p.FillScript(stale)); err != nil {
			var temps []string
			for _, s := range p.Sets {
				temps = append(temps, s.Name+TempSuffix)
			}
			_, _ = run(ctx, o.NetNS, destroyScript(temps), "ipset", "restore", "-exist")
			return res, fmt.Errorf("loading the ipsets (nothing was changed): %w", err)
		}
		if err := ipsetRestore(ctx, &o, p.SwapScript(live)); err != nil {
			return res, errors.Join(fmt.Errorf("swapping the new ipsets in: %w", err),
				ipsetRestore(ctx, &o, p.UndoSwapScript(live)))
		}
	}
	if p.Bans {
		// Created where missing, never replaced: they hold the bans
		// in force across loads.
		if _, err := run(ctx, o.NetNS, p.banSetsScript(), "ipset", "restore", "-exist"); err != nil {
			return res, errors.Join(fmt.Errorf("creating the ban sets: %w", err), ipsetRestore(ctx, &o, p.UndoSwapScript(live)))
		}
	}
	undo := func(done int, cause error) error {
		errs := []error{cause}
		for f := range Family(done) {
			errs = append(errs, restore(ctx, &o, fl, f, Transition(&want[f], &cur[f])))
		}
		// The failed family may have committed its filter table.
		if now, _, err := current(ctx, &o, fl, Family(done), p.Prefix, false); err == nil {
			errs = append(errs, restore(ctx, &o, fl, Family(done), Transition(&now, &cur[done])))
		}
		if len(p.Sets) > 0 {
			errs = append(errs, ipsetRestore(ctx, &o, p.UndoSwapScript(live)))
		}
		return errors.Join(errs...)
	}
	for _, f := range []Family{IPv4, IPv6} {
		if err := restore(ctx, &o, fl, f, Transition(&cur[f], &want[f])); err != nil {
			return res, undo(int(f), fmt.Errorf("loading the %s rules (the old rules were put back): %w", f.Command(), err))
		}
	}
	var gone []string
	for _, s := range p.Sets {
		gone = append(gone, s.Name+TempSuffix)
	}
	for _, n := range existing {
		keep := p.Bans && slices.Contains(dynSets(p.Prefix), n)
		if !keep && !slices.ContainsFunc(p.Sets, func(s *Set) bool { return s.Name == n || s.Name+TempSuffix == n }) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		if err := ipsetRestore(ctx, &o, destroyScript(gone)); err != nil {
			return res, fmt.Errorf("the rules are in force, but destroying the ipsets they no longer use failed: %w", err)
		}
	}
	res.Load = time.Since(t0)
	return res, nil
}

// MaxBanTimeout is the longest time ipset keeps an element (its
// timeout is a 32-bit count of milliseconds, halved); longer bans are
// held that long.
const MaxBanTimeout = 2147483 * time.Second

// BanMaxElem is the most bans a ban set holds.
const BanMaxElem = 1 << 20

// banSetsScript creates the ban and allow sets where missing (ipset
// restore -exist).
func (p *Program) banSetsScript() string {
	var b strings.Builder
	for _, k := range []SetKind{KindBan, KindAllow} {
		for _, f := range []Family{IPv4, IPv6} {
			fmt.Fprintf(&b, "create %s hash:net family %s timeout 0 maxelem %d\n", dynSet(p.Prefix, k, f), ipsetFamily[f], BanMaxElem)
		}
	}
	return b.String()
}

// BanEntry is one ban for Ban: a prefix and how long it holds (0: until
// it is lifted).
type BanEntry struct {
	Prefix netip.Prefix
	TTL    time.Duration
}

// banLine is an ipset restore line adding e to set.
func banLine(b *strings.Builder, set string, e BanEntry) {
	secs := 0 // until lifted
	if e.TTL > 0 {
		secs = int(min(e.TTL, MaxBanTimeout).Round(time.Second) / time.Second)
		secs = max(secs, 1)
	}
	fmt.Fprintf(b, "add %s %s timeout %d\n", set, e.Prefix, secs)
}

// SetBans makes the ban sets of prefix's program hold exactly bans: each
// family's set is filled beside the live one and swapped in (never empty,
// never half filled), so that bans the kernel holds and the caller does
// not (of a lost or other state folder) go too.
func SetBans(ctx context.Context, prefix string, o Options, bans []BanEntry) error {
	return FillSets(ctx, prefix, KindBan, o, bans)
}

// FillSets is SetBans for the sets of kind.
func FillSets(ctx context.Context, prefix string, kind SetKind, o Options, bans []BanEntry) error {
	var b strings.Builder
	for _, f := range []Family{IPv4, IPv6} {
		live := dynSet(prefix, kind, f)
		tmp := live + TempSuffix
		fmt.Fprintf(&b, "create %s hash:net family %s timeout 0 maxelem %d\nflush %s\n", tmp, ipsetFamily[f], BanMaxElem, tmp)
		for _, e := range bans {
			if e.Prefix.Addr().Is4() == (f == IPv4) {
				banLine(&b, tmp, e)
			}
		}
		fmt.Fprintf(&b, "create %s hash:net family %s timeout 0 maxelem %d\nswap %s %s\ndestroy %s\n", live, ipsetFamily[f], BanMaxElem, tmp, live, tmp)
	}
	if _, err := run(ctx, o.NetNS, b.String(), "ipset", "restore", "-exist"); err != nil {
		return fmt.Errorf("loading %d entries into the %s sets: %w", len(bans), kind, err)
	}
	return nil
}

// Ban lifts the bans of lift, then adds bans to the ban sets of prefix's
// program, replacing the time left of those already there, in one ipset
// restore. The kernel lets each ban go when its time is up. Protected and
// own addresses are the caller's to refuse.
func Ban(ctx context.Context, prefix string, o Options, add []BanEntry, lift []netip.Prefix) error {
	return UpdateSets(ctx, prefix, KindBan, o, add, lift)
}

// UpdateSets is Ban for the sets of kind.
func UpdateSets(ctx context.Context, prefix string, kind SetKind, o Options, add []BanEntry, lift []netip.Prefix) error {
	var b strings.Builder
	set := func(p netip.Prefix) string {
		if p.Addr().Is4() {
			return dynSet(prefix, kind, IPv4)
		}
		return dynSet(prefix, kind, IPv6)
	}
	// Lifts first: a ban replaced in one call is lifted and added again.
	for _, p := range lift {
		fmt.Fprintf(&b, "del %s %s\n", set(p), p)
	}
	for _, e := range add {
		banLine(&b, set(e.Prefix), e)
	}
	if b.Len() == 0 {
		return nil
	}
	if _, err := run(ctx, o.NetNS, b.String(), "ipset", "restore", "-exist"); err != nil {
		return fmt.Errorf("adding %d and removing %d entries of the %s sets: %w", len(add), len(lift), kind, err)
	}
	return nil
}

// BanCount returns the number of bans in the ban sets of prefix's
// program (expired ones are gone).
func BanCount(ctx context.Context, prefix string, o Options) (int, error) {
	out, err := run(ctx, o.NetNS, "", "ipset", "list", "-t")
	if err != nil {
		return 0, fmt.Errorf("reading the ban sets: %w", err)
	}
	names := []string{dynSet(prefix, KindBan, IPv4), dynSet(prefix, KindBan, IPv6)}
	sets := setHeaders(out, func(name string) bool { return slices.Contains(names, name) })
	if len(sets) != len(names) {
		return 0, fmt.Errorf("reading the ban sets: %d of %v exist (apply again to create them)", len(sets), names)
	}
	return sets[0].Elements + sets[1].Elements, nil
}

// setHeaders parses `ipset list -t` output: the sets keep says yes to,
// with their element count and memory.
func setHeaders(out []byte, keep func(name string) bool) []SetStatus {
	var sets []SetStatus
	var ss *SetStatus
	for line := range strings.Lines(string(out)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		switch {
		case k == "Name":
			ss = nil
			if keep(v) {
				sets = append(sets, SetStatus{Name: v})
				ss = &sets[len(sets)-1]
			}
		case ss == nil:
		case k == "Number of entries":
			ss.Elements, _ = strconv.Atoi(v)
		case k == "Size in memory":
			ss.Memory, _ = strconv.Atoi(v)
		}
	}
	return sets
}

// Installed returns the iptables flavours whose commands exist.
func Installed() []string {
	var out []string
	for _, fl := range []string{Legacy, NFT} {
		if _, err := exec.LookPath(tool(IPv4, fl, "restore")); err == nil {
			out = append(out, fl)
		}
	}
	return out
}

// Flush removes every chain, jump and set of ipfence's (prefix), in every
// flavour installed, and nothing else. It reports whether there was any.
func Flush(ctx context.Context, prefix string, o Options) (bool, error) {
	found := false
	fls := Installed()
	if o.Flavour != "" {
		fls = []string{o.Flavour}
	}
	// Every flavour and family is checked before anything is removed.
	type part struct {
		fl  string
		f   Family
		cur State
	}
	var parts []part
	for _, fl := range fls {
		for _, f := range []Family{IPv4, IPv6} {
			cur, _, err := current(ctx, &o, fl, f, prefix, false)
			if err != nil {
				return found, err
			}
			if cur.Empty() {
				continue
			}
			if err := checkOwned(&cur, &o, fl, f, prefix); err != nil {
				return found, err
			}
			parts = append(parts, part{fl, f, cur})
		}
	}
	for _, pt := range parts {
		found = true
		if err := restore(ctx, &o, pt.fl, pt.f, Transition(&pt.cur, &State{})); err != nil {
			return found, fmt.Errorf("removing ipfence's %s-%s chains: %w", pt.f.Command(), pt.fl, err)
		}
	}
	sets, err := ownSets(ctx, &o, prefix)
	if err != nil {
		return found, err
	}
	if len(sets) > 0 {
		found = true
		if err := ipsetRestore(ctx, &o, destroyScript(sets)); err != nil {
			return found, fmt.Errorf("destroying ipfence's ipsets: %w", err)
		}
	}
	return found, nil
}

// RuleCount is one rule's packets and bytes, from the counters of its
// hit chains' verdict rules: in both directions, and in each.
type RuleCount struct {
	Rule    string `json:"rule"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	In      Count  `json:"in"`
	Out     Count  `json:"out"`
}

// Count is a number of packets and bytes.
type Count struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Status is what Status reads.
type Status struct {
	Flavour string      `json:"flavour"`
	Loaded  bool        `json:"loaded"`
	Chains  int         `json:"chains"`
	Rules   []RuleCount `json:"rules"`
	// Rejected counts the packets the filter table's reject chain
	// rejected (reject rules mark them in raw or mangle).
	Rejected uint64      `json:"rejected"`
	Sets     []SetStatus `json:"sets"`
}

// SetStatus is one ipset's size.
type SetStatus struct {
	Name     string `json:"name"`
	Elements int    `json:"elements"`
	Memory   int    `json:"memory_bytes"`
}

// hitLine matches a hit chain's verdict rule with its counters and the
// chain's letter (h: inbound, o: outbound), and rejectLine the reject
// chain's.
var (
	hitLine    = regexp.MustCompile(`^\[(\d+):(\d+)\] -A \S+-([ho])\d+ .*--comment "ipfence rule (.*?)"`)
	rejectLine = regexp.MustCompile(`^\[(\d+):\d+\] -A \S+ .*-j REJECT`)
)

// ReadStatus reads ipfence's chains of prefix and their counters (both
// families summed, in the flavour in use) and its sets' sizes.
func ReadStatus(ctx context.Context, prefix string, o Options) (*Status, error) {
	fl, err := o.flavour()
	if err != nil {
		return nil, err
	}
	st := &Status{Flavour: fl}
	idx := map[string]int{}
	for _, f := range []Family{IPv4, IPv6} {
		cur, save, err := current(ctx, &o, fl, f, prefix, true)
		if err != nil {
			return nil, err
		}
		st.Loaded = st.Loaded || !cur.Empty()
		st.Chains += len(cur.Raw.Chains) + len(cur.Mangle.Chains) + len(cur.Filter.Chains)
		for line := range strings.Lines(save) {
			if m := rejectLine.FindStringSubmatch(line); m != nil {
				n, _ := strconv.ParseUint(m[1], 10, 64)
				st.Rejected += n
				continue
			}
			m := hitLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name, err := strconv.Unquote(`"` + m[4] + `"`)
			if err != nil {
				name = m[4]
			}
			i, ok := idx[name]
			if !ok {
				i = len(st.Rules)
				idx[name] = i
				st.Rules = append(st.Rules, RuleCount{Rule: name})
			}
			pk, _ := strconv.ParseUint(m[1], 10, 64)
			by, _ := strconv.ParseUint(m[2], 10, 64)
			rc := &st.Rules[i]
			rc.Packets += pk
			rc.Bytes += by
			dir := &rc.In
			if m[3] == "o" {
				dir = &rc.Out
			}
			dir.Packets += pk
			dir.Bytes += by
		}
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		return st, nil
	}
	// Every set's header in one listing; ipfence's by their names.
	out, err := run(ctx, o.NetNS, "", "ipset", "list", "-t")
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	st.Sets = setHeaders(out, setPattern(prefix).MatchString)
	return st, nil
}

// InForce reports whether the kernel still holds what Apply loaded for p
// in both families: the same chains with as many rules in the raw,
// mangle and filter tables, the jumps into them, and every set of p (its ban sets included). False means another
// program removed or changed them (a firewall reload, `iptables -F`);
// the daemon then loads p again. Counters and rule order are not
// compared.
func InForce(ctx context.Context, p *Program, o Options) (bool, error) {
	fl, err := o.flavour()
	if err != nil {
		return false, err
	}
	same := func(a, b *Table) bool {
		return len(a.Rules) == len(b.Rules) && slices.Equal(a.Jumps, b.Jumps) &&
			slices.Equal(slices.Sorted(slices.Values(a.Chains)), slices.Sorted(slices.Values(b.Chains)))
	}
	for _, f := range []Family{IPv4, IPv6} {
		cur, _, err := current(ctx, &o, fl, f, p.Prefix, false)
		if err != nil {
			return false, err
		}
		want := p.Desired(f)
		if !same(&cur.Raw, &want.Raw) || !same(&cur.Mangle, &want.Mangle) || !same(&cur.Filter, &want.Filter) {
			return false, nil
		}
	}
	have, err := ownSets(ctx, &o, p.Prefix)
	if err != nil {
		return false, err
	}
	need := make([]string, 0, len(p.Sets)+2)
	for _, s := range p.Sets {
		need = append(need, s.Name)
	}
	if p.Bans {
		need = append(need, dynSets(p.Prefix)...)
	}
	for _, n := range need {
		if !slices.Contains(have, n) {
			return false, nil
		}
	}
	return true, nil
}
