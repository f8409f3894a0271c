// Package statedir owns the state folder's layout and keeps what ipfence
// applied, so that the next apply can say what changed, and bans and
// status know what is loaded, without reading big sets back from the
// kernel (listing 400k elements takes tens of seconds).
//
// The layout of a state folder, NS being the network namespace's name
// (_current for the namespace ipfence runs in):
//
//	lock                  the folder's lock (Lock)
//	applied/NS.json       what was loaded in NS (Applied)
//	bans/NS.db            the bans of NS (a ban.Store)
//	fleet/NS/             a fleet agent's revisions for NS
//	revision/NS.bundle    a copy of what the last apply in NS loaded, and
//	revision/NS.json      its record (package trial)
//	trial/NS.json         an apply on trial in NS (apply --confirm), and
//	trial/NS.bundle       the revision it puts back unless confirmed;
//	trial/NS.refused.json the policy a trial that was not confirmed
//	                      tried; trial/NS.log the rollback's log
//	sources/NAME.json     a source's last good load (package source)
//	sources/@NS/NAME.json the same for namespace NS (--netns)
//	cache/NAME/           a source's downloads (package source), with a
//	                      committed copy per namespace
//
// Files are written atomically (temporary file, fsync, rename). A missing
// or unreadable file means "nothing known": callers treat everything as
// new.
package statedir

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

// DefaultDir is where ipfence keeps state unless told otherwise.
const DefaultDir = "/var/lib/ipfence"

// Dir is a state folder.
type Dir struct{ Path string }

// Applied is what was loaded into one namespace.
type Applied struct {
	Time     time.Time     `json:"time"`
	Table    string        `json:"table"`
	Priority int32         `json:"priority"`
	Protect  []string      `json:"protect"`
	Rules    []RuleApplied `json:"rules"`
	// Interfaces are where the XDP rules run.
	Interfaces []string `json:"interfaces,omitempty"`
	// Backend is where the rules that do not run in XDP ran ("" in
	// state written before there was a choice: nftables).
	Backend plan.Backend `json:"backend,omitempty"`
	// Heads are the nftables base chain's rule heads as loaded (rules
	// that run in XDP or iptables have heads of no family): ban updates
	// rewrite that chain from them. Records written before they were
	// kept have none (see RuleHeads).
	Heads []nft.RuleHead `json:"heads,omitempty"`
	// Flavour is the iptables flavour the iptables backends were loaded
	// with ("legacy" or "nft"; "" for nftables).
	Flavour string `json:"iptables_flavour,omitempty"`
	// Lowering is the kernel layout the record's table has: 0 for
	// tables loaded before connection-aware rules, whose base chain (at
	// raw) ran every rule; Lowering for today's.
	Lowering int `json:"lowering,omitempty"`
	// MonitorAll: `apply --monitor` put every blocking rule in monitor
	// mode, whatever the policy says; the boot-time restore (`apply
	// --offline`) keeps it that way.
	MonitorAll bool `json:"monitor_all,omitempty"`
	// Bans is how bans escalate and aggregate: `ipfence ban` without a
	// daemon reads it here.
	Bans ban.Policy `json:"bans,omitzero"`
	// Marked: written by an ipfence that marks its nftables table
	// (nft.Mark) and its iptables chains (ipt.Mark). Records from before
	// the marks have false: see Vouches and VouchesChains.
	Marked bool `json:"marked,omitempty"`
}

// Vouches reports whether a (nil: no record) vouches for an nftables
// table named table that lacks ipfence's mark (nft.ApplyOptions.Adopt):
// a record written before ipfence marked its tables, of an nftables
// apply of that table. This is how tables loaded by older versions are
// taken over (and marked by the next apply) rather than refused.
//
// The record is the migration rule rather than the table's contents:
// it is ipfence's own account of what it loaded in exactly this
// namespace under exactly this name, whereas contents prove little
// (most of ipfence's rules carry no comment, and its chain names, such
// as prerouting and forward, are common in hand-written tables). It is
// there wherever a table is replaced or deleted (apply, the daemon,
// flush, a switch of backend), and it vouches only once: the next apply
// marks the table and writes a Marked record, after which an unmarked
// table of that name (another program's, made after ipfence's was
// deleted) is refused. Without the record (another state folder, or
// one lost) an old table is refused, and the error says how to remove
// it.
func (a *Applied) Vouches(table string) bool {
	return a != nil && !a.Marked && !a.IPTables() && a.Table == table
}

// VouchesChains is Vouches for the iptables backends (ipt.Options.Adopt):
// a record written before ipfence marked its chains, of an ipset or
// iptables-split apply of table, vouches for the chains of that name.
func (a *Applied) VouchesChains(table string) bool {
	return a != nil && !a.Marked && a.IPTables() && a.Table == table
}

// Lowering is the kernel layout this ipfence loads: 2, connection-aware
// rules after conntrack (nft.ConnChain), bans and stateless rules before.
const Lowering = 2

// RuleHeads are the base chain's heads as loaded: Heads, or for a record
// written before they were kept, its nftables rules' heads.
func (a *Applied) RuleHeads() []nft.RuleHead {
	if a.Lowering < Lowering {
		// Every rule of an older table runs in its one base chain:
		// rewriting it for a ban must keep them all there.
		hs := a.heads()
		for i := range hs {
			hs[i].Stateless = true
		}
		return hs
	}
	return a.heads()
}

func (a *Applied) heads() []nft.RuleHead {
	if a.Heads != nil || len(a.Rules) == 0 {
		return slices.Clone(a.Heads)
	}
	hs := make([]nft.RuleHead, len(a.Rules))
	for i, r := range a.Rules {
		on := r.backend() == plan.NFTables && !a.IPTables()
		hs[i] = nft.RuleHead{Name: r.Name, Action: r.Action, Ports: r.Ports, V4: on && r.PrefixesV4 > 0, V6: on && r.PrefixesV6 > 0}
	}
	return hs
}

// XDPRules names the rules that ran in XDP, in order (class k of the
// XDP program's counters is the k-th).
func (a *Applied) XDPRules() []string {
	var out []string
	for _, r := range a.Rules {
		if r.Backend == plan.XDP {
			out = append(out, r.Name)
		}
	}
	return out
}

// ConnectionAware reports whether some rule relies on conntrack (none
// did in tables loaded before connection-aware rules).
func (a *Applied) ConnectionAware() bool {
	if a.Lowering < Lowering {
		return false
	}
	for _, r := range a.Rules {
		if !r.Stateless {
			return true
		}
	}
	return false
}

// HasXDP reports whether some rule ran in XDP.
func (a *Applied) HasXDP() bool { return len(a.XDPRules()) > 0 }

// IPTables reports whether the rules ran in an iptables backend.
func (a *Applied) IPTables() bool { return a.Backend.IPTables() }

// RuleApplied is one rule as loaded: its effective prefixes.
type RuleApplied struct {
	Name       string       `json:"name"`
	Action     plan.Action  `json:"action"`
	Ports      []plan.Port  `json:"ports,omitempty"`
	Backend    plan.Backend `json:"backend,omitempty"`
	PrefixesV4 int          `json:"prefixes_ipv4"`
	PrefixesV6 int          `json:"prefixes_ipv6"`
	// Prefixes are a record's prefixes as read from disk; a record made
	// here (Summarize) holds its plan's set instead (set), written
	// straight from it (PrefixList gives both as text).
	Prefixes []string `json:"prefixes"`
	set      *prefix.Set
	// Direction and Stateless are the rule's (see plan.Rule).
	Direction plan.Direction `json:"direction,omitempty"`
	Stateless bool           `json:"stateless,omitempty"`
	// Monitor: the rule only counted what it would stop (mode monitor).
	Monitor bool `json:"monitor,omitempty"`
}

// backend is where the rule ran; records older than backends say
// nothing: nftables.
func (r RuleApplied) backend() plan.Backend {
	if r.Backend == "" {
		return plan.NFTables
	}
	return r.Backend
}

// Summarize records a plan's rules, and the base chain's heads the
// nftables backend loads for it.
func Summarize(p *plan.Plan) *Applied {
	a := &Applied{Time: time.Now().UTC(), Table: p.Table, Priority: p.Priority, Protect: p.Protect, Interfaces: p.Interfaces, Backend: p.Backend,
		Lowering: Lowering, Marked: true, Bans: p.Bans}
	if !p.Backend.IPTables() {
		a.Heads = nft.Heads(p)
	}
	for _, r := range p.Rules {
		ra := RuleApplied{Name: r.Name, Action: r.Action, Ports: r.Ports, Backend: r.Backend, PrefixesV4: r.V4.Prefixes, PrefixesV6: r.V6.Prefixes,
			Direction: r.Direction, Stateless: r.Stateless, Monitor: r.Monitor}
		if r.V4.Kind == plan.KindEmpty {
			ra.PrefixesV4 = 0
		}
		if r.V6.Kind == plan.KindEmpty {
			ra.PrefixesV6 = 0
		}
		a.Rules = append(a.Rules, ra)
	}
	for i, r := range p.Rules {
		// The plan's set, not its text: 400k strings took 40 MB beside
		// the loaded program, and as much again in the JSON.
		a.Rules[i].set = r.Set
	}
	return a
}

// DropPrefixes empties the prefix lists a read from disk (nil: no
// record); the rest of the record stays. Compare is what reads them: an
// apply lets its last record's go before the kernel loads.
func (a *Applied) DropPrefixes() {
	if a == nil {
		return
	}
	for i := range a.Rules {
		a.Rules[i].Prefixes = nil
	}
}

// PrefixList is the rule's prefixes as text: the minimal cover, IPv4
// then IPv6, each in address order.
func (r RuleApplied) PrefixList() []string {
	if r.set == nil {
		return r.Prefixes
	}
	var out []string
	for _, p := range prefix.Prefixes(r.set) {
		out = append(out, p.String())
	}
	return out
}

// count is the number of the rule's prefixes.
func (r RuleApplied) count() int {
	if r.set == nil {
		return len(r.Prefixes)
	}
	n4, n6 := prefix.Count(r.set)
	return n4 + n6
}

// Change is one difference between two applies.
type Change struct {
	Rule    string `json:"rule"`
	Kind    string `json:"kind"` // "added", "removed", "changed"
	Added   int    `json:"prefixes_added"`
	Removed int    `json:"prefixes_removed"`
	Note    string `json:"note,omitempty"`
}

func (c Change) String() string {
	switch c.Kind {
	case "added":
		return fmt.Sprintf("rule %s: new (%d prefixes)", c.Rule, c.Added)
	case "removed":
		return fmt.Sprintf("rule %s: removed (%d prefixes)", c.Rule, c.Removed)
	}
	s := fmt.Sprintf("rule %s: +%d -%d prefixes", c.Rule, c.Added, c.Removed)
	if c.Note != "" {
		s += " (" + c.Note + ")"
	}
	return s
}

// Compare lists what changed from prev (nil: nothing applied) to cur.
func Compare(prev, cur *Applied) []Change {
	var out []Change
	old := map[string]RuleApplied{}
	if prev != nil {
		for _, r := range prev.Rules {
			old[r.Name] = r
		}
	}
	for _, r := range cur.Rules {
		o, ok := old[r.Name]
		if !ok {
			out = append(out, Change{Rule: r.Name, Kind: "added", Added: r.count()})
			continue
		}
		delete(old, r.Name)
		added, removed := diff(o, r)
		var notes []string
		if o.Action != r.Action {
			notes = append(notes, fmt.Sprintf("action %s → %s", o.Action, r.Action))
		}
		if fmt.Sprint(o.Ports) != fmt.Sprint(r.Ports) {
			notes = append(notes, "ports changed")
		}
		if o.backend() != r.backend() {
			notes = append(notes, fmt.Sprintf("backend %s → %s", o.backend(), r.backend()))
		}
		if o.Monitor != r.Monitor {
			notes = append(notes, fmt.Sprintf("mode %s → %s", plan.ModeName(o.Monitor), plan.ModeName(r.Monitor)))
		}
		note := strings.Join(notes, ", ")
		if added+removed > 0 || note != "" {
			out = append(out, Change{Rule: r.Name, Kind: "changed", Added: added, Removed: removed, Note: note})
		}
	}
	if prev != nil {
		for _, r := range prev.Rules {
			if _, gone := old[r.Name]; gone {
				out = append(out, Change{Rule: r.Name, Kind: "removed", Removed: r.count()})
			}
		}
	}
	return out
}

// diff counts addresses-as-prefixes added and removed: the prefixes of
// cur not covered by prev and of prev not covered by cur. A set is read
// as it is; text (a record from disk) is parsed into ranges.
func diff(prev, cur RuleApplied) (added, removed int) {
	switch {
	case cur.set != nil && prev.set == nil:
		return prefix.CoverDiffSet(cur.set, prev.Prefixes)
	case cur.set == nil && prev.set != nil:
		removed, added = prefix.CoverDiffSet(prev.set, cur.Prefixes)
		return added, removed
	case cur.set != nil && prev.set != nil:
		return prefix.CoverDiffSets(cur.set, prev.set)
	}
	return prefix.CoverDiffText(cur.Prefixes, prev.Prefixes) // both text (records read from disk)
}

// key is the name a namespace's files have in the state folder
// (netns.Key).
func key(ns string) string { return netns.Key(ns) }

func (d Dir) appliedPath(netns string) string {
	return filepath.Join(d.Path, "applied", key(netns)+".json")
}

// BansPath is where netns's bans are kept (a ban.Store); its folder is
// made, root-only, by OpenBans' callers through MkdirBans.
func (d Dir) BansPath(netns string) string {
	return filepath.Join(d.Path, "bans", key(netns)+".db")
}

// AllowsPath is the allow store (`ipfence allow`) for netns.
func (d Dir) AllowsPath(netns string) string {
	return filepath.Join(d.Path, "allows", key(netns)+".db")
}

// MkdirBans makes the bans and allows folders (mode 0700).
func (d Dir) MkdirBans() error {
	for _, dir := range []string{"bans", "allows"} {
		if err := os.MkdirAll(filepath.Join(d.Path, dir), 0o700); err != nil {
			return fmt.Errorf("creating the %s folder: %w", dir, err)
		}
	}
	return nil
}

// FleetDir is where a fleet agent for netns keeps its revisions.
func (d Dir) FleetDir(netns string) string {
	return filepath.Join(d.Path, "fleet", key(netns))
}

// LoadApplied reads what was applied in netns ("" = current namespace).
func (d Dir) LoadApplied(netns string) (*Applied, error) {
	data, err := os.ReadFile(d.appliedPath(netns))
	if err != nil {
		return nil, err
	}
	var a Applied
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.appliedPath(netns), err)
	}
	return &a, nil
}

// Head is what an applied record says besides its rules: read without
// their prefix lists as strings.
type Head struct {
	Time  time.Time `json:"time"`
	Table string    `json:"table"`
	// MonitorAll: see Applied.
	MonitorAll bool `json:"monitor_all"`
}

// AppliedHead reads the Head of what was applied in netns (false when
// nothing readable was): the boot-time restore asks it before its
// compile, and a trial (package trial) whether what it loaded is still
// in force.
func (d Dir) AppliedHead(netns string) (Head, bool) {
	f, err := os.Open(d.appliedPath(netns))
	if err != nil {
		return Head{}, false
	}
	defer f.Close()
	h, err := readHead(bufio.NewReaderSize(f, 16<<10))
	return h, err == nil
}

// readHead reads the Head of the applied record r holds, up to its rules:
// the Head's fields come before them (the time and table in every
// record's order; monitor_all, newer than the rules-last order of
// writeApplied, too), so their prefix lists (400k strings for a 400k-line
// feed, which an apply read in full once more after its load, at its
// peak) are never read.
func readHead(r io.Reader) (Head, error) {
	var h Head
	dec := json.NewDecoder(r)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return h, fmt.Errorf("reading an applied record: not a JSON object (%v)", err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return h, err
		}
		var field any = new(json.RawMessage) // a small field: read past
		switch t {
		case "rules":
			return h, nil
		case "time":
			field = &h.Time
		case "table":
			field = &h.Table
		case "monitor_all":
			field = &h.MonitorAll
		}
		if err := dec.Decode(field); err != nil {
			return h, err
		}
	}
	return h, nil
}

// AppliedMonitorAll reads only Applied.MonitorAll of what was applied in
// netns (false when nothing readable was).
func (d Dir) AppliedMonitorAll(netns string) bool {
	h, ok := d.AppliedHead(netns)
	return ok && h.MonitorAll
}

// LoadAppliedFor reads what was applied in netns, as LoadApplied, but
// takes each rule's prefixes from p, the plan that record was made of,
// when the caller still holds it (the daemon): the record's prefix lists
// are read past, not made into strings (400k of them for a 400k-line
// feed). A rule p does not have has none.
func (d Dir) LoadAppliedFor(netns string, p *plan.Plan) (*Applied, error) {
	data, err := os.ReadFile(d.appliedPath(netns))
	if err != nil {
		return nil, err
	}
	// An outer field of the same name hides the embedded one.
	var h struct {
		Applied
		Rules []struct {
			RuleApplied
			Prefixes skipJSON `json:"prefixes"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.appliedPath(netns), err)
	}
	a := h.Applied
	a.Rules = make([]RuleApplied, len(h.Rules))
	sets := p.Sets()
	for i, r := range h.Rules {
		a.Rules[i] = r.RuleApplied
		a.Rules[i].set = sets[r.Name]
	}
	return &a, nil
}

// skipJSON is a JSON value read past.
type skipJSON struct{}

func (*skipJSON) UnmarshalJSON([]byte) error { return nil }

// A Stamp tells versions of a file apart: WriteFileAtomic writes each
// as a new inode, whose number a later file may reuse, so the size and
// the modification and change times (as fine as the file system keeps
// them) count too. It guards against a writer in the same process, or
// one that ignored the state folder's lock, which a daemon holds for
// its whole life.
type Stamp struct {
	ino, size    uint64
	mtime, ctime int64
}

// AppliedStamp returns the stamp of netns's record (false: none).
func (d Dir) AppliedStamp(netns string) (Stamp, bool) {
	var st unix.Stat_t
	if err := unix.Stat(d.appliedPath(netns), &st); err != nil {
		return Stamp{}, false
	}
	return Stamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// SaveApplied records what was applied in netns.
func (d Dir) SaveApplied(netns string, a *Applied) error {
	return WriteFileAtomicFunc(d.appliedPath(netns), func(w io.Writer) error { return writeApplied(w, a) })
}

// writeApplied writes a as JSON, what json.Marshal writes of it, with each
// rule's prefixes written as they come from its set: no list of them,
// and no copy of the whole text in memory.
func writeApplied(w io.Writer, a *Applied) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	// The record and each rule without their lists (an outer field of
	// the same name, left out, hides the embedded one), their closing
	// brace then replaced by the list.
	head, err := json.Marshal(struct {
		*Applied
		Rules *struct{} `json:"rules,omitempty"`
	}{Applied: a})
	if err != nil {
		return err
	}
	bw.Write(head[:len(head)-1])
	bw.WriteString(`,"rules":[`)
	for i := range a.Rules {
		r := &a.Rules[i]
		rb, err := json.Marshal(struct {
			*RuleApplied
			Prefixes *struct{} `json:"prefixes,omitempty"`
		}{RuleApplied: r})
		if err != nil {
			return err
		}
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(rb[:len(rb)-1])
		bw.WriteString(`,"prefixes":`)
		if r.set != nil {
			err = prefix.WriteJSONArray(bw, r.set)
		} else {
			var pb []byte
			pb, err = json.Marshal(r.Prefixes)
			bw.Write(pb)
		}
		if err != nil {
			return err
		}
		bw.WriteByte('}')
	}
	bw.WriteString("]}")
	return bw.Flush()
}

// ForgetApplied removes the record (after a flush).
func (d Dir) ForgetApplied(netns string) error {
	err := os.Remove(d.appliedPath(netns))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// ErrLocked is returned by Lock when another ipfence holds the state.
var ErrLocked = errors.New("another ipfence (an apply, or the daemon) holds this state folder")

// Lock takes the state folder's lock (an flock on its "lock" file) so that
// two applies or flushes never interleave; unlock releases it. It does not
// wait: a held lock is an error wrapping ErrLocked.
func (d Dir) Lock() (unlock func(), err error) {
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		return nil, fmt.Errorf("creating state folder: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(d.Path, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the state lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w; try again when it is done (with ipfence daemon running, edit the policy and run ipfence reload, and ban through it)", d.Path, ErrLocked)
		}
		return nil, fmt.Errorf("locking %s: %w", d.Path, err)
	}
	return func() { f.Close() }, nil
}

// WriteFileAtomic writes data to path via a synced temporary file and a
// rename, creating the folder, and syncs the folder.
func WriteFileAtomic(path string, data []byte) error {
	return WriteFileAtomicFunc(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFileAtomicFunc is WriteFileAtomic of what write writes.
func WriteFileAtomicFunc(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("creating state folder: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// The rename is durable once the folder is: a reset right after
	// must not bring the old file back (a trial's record, say).
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the renames and removals in the folder dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
