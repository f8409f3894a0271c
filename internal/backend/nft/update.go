package nft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
)

// SetChange changes the elements of one set of a loaded table. Del
// elements are removed where present (absent ones are no error; only
// their keys matter), then Add elements are added: an element in both is
// replaced, which is how an element's timeout or verdict is changed.
type SetChange struct {
	// Set describes the set as loaded: Name, Family, Interval, KeyBits,
	// Key, Timeout and IsMap matter; its Elems are ignored.
	Set      *Set
	Add, Del []Elem
	// After, when not nil, describes the set after the change (Diff
	// fills it in where it matters), so that ApplyUpdate leaves the set
	// exactly as Apply of its elements would: a hash set without
	// timeouts is declared with the size Apply gives it (see hashSize),
	// and an interval set holds the interval-end element at the zero
	// address that nft puts before a first interval that does not start
	// there exactly when Apply writes it. With After nil the declared
	// size stays, and that element is added with any Add (it matches
	// nothing either way).
	//
	// The kernel takes a set's new size when the transaction commits
	// (Linux 6.18, where this is tested): an Update cannot make a set
	// hold more elements than its size before. Diff replaces such a set
	// instead (see Update).
	After *SetState
}

// SetState is what ApplyUpdate needs to know of a set's elements after a
// change.
type SetState struct {
	// Len is the number of elements (the size of a hash set without
	// timeouts follows from it, see hashSize).
	Len int
	// FromZero says that an element of an interval set starts at the
	// zero address (0.0.0.0 or ::).
	FromZero bool
}

// Update is a change to a loaded table in one transaction: objects
// created and deleted, element changes, and chains whose rules are
// replaced (flushed and added again). It is how bans and feed refreshes
// avoid reloading the whole table; Diff computes one from two Programs.
//
// ApplyUpdate sends it in this order, which is one the kernel accepts:
//
//  1. NewChains are created, empty (so that anything may jump to them);
//  2. Chains and DelChains are flushed (their rules are deleted, which
//     releases the sets they look up and the chains they jump to);
//  3. DelSets are deleted (nothing looks them up any more);
//  4. NewSets are created with their elements;
//  5. the element changes of Sets: every Del, then every Add;
//  6. the rules of NewChains and Chains are added;
//  7. DelChains are deleted (nothing jumps to them any more).
//
// Ensure chains go through the same steps whether or not they exist:
// created (no change if they do), flushed, given their rules at step 6,
// or deleted at step 7 when they have none.
//
// A name in both DelSets and NewSets replaces that set: it is deleted and
// created again under its name, and every chain whose rules look it up
// must be in Chains (or DelChains). Other objects an Update names must
// exist (Sets, Chains, DelSets, DelChains) or not exist (NewSets,
// NewChains: the kernel takes an existing one as no change and would add
// the elements or rules to it); the kernel checks, and rejects the whole
// transaction if not.
type Update struct {
	Table string
	// Sets lists the sets changed and every existing set the rules of
	// Chains and NewChains look up (with no Add or Del when unchanged).
	Sets []SetChange
	// Chains are existing chains whose rules are replaced; Hook is
	// ignored.
	Chains []*Chain
	// NewSets are created with their elements; NewChains with their
	// rules (a Hook makes a base chain, hooked in at commit).
	NewSets   []*Set
	NewChains []*Chain
	// DelSets and DelChains name sets and chains deleted, with their
	// elements and rules. Nothing that stays may use them.
	DelSets   []string
	DelChains []string
	// Ensure are chains that may or may not exist, such as the base
	// chain the ban sinks rewrite: each ends up with its rules, or
	// deleted when it has none.
	Ensure []*Chain
}

// Empty reports whether u changes nothing: Sets only lists sets the
// rules look up, and there is nothing else.
func (u *Update) Empty() bool {
	for _, sc := range u.Sets {
		if len(sc.Add) > 0 || len(sc.Del) > 0 || sc.After != nil {
			return false
		}
	}
	return len(u.Chains) == 0 && len(u.NewSets) == 0 && len(u.NewChains) == 0 &&
		len(u.DelSets) == 0 && len(u.DelChains) == 0 && len(u.Ensure) == 0
}

// changesObjects reports whether u creates, deletes or redefines chains
// or sets, or replaces rules: everything but adding and deleting elements
// of existing sets (a ban), for which Updater.Apply checks the table's
// mark first.
func (u *Update) changesObjects() bool {
	for _, sc := range u.Sets {
		if sc.After != nil {
			return true // may declare the set's size again
		}
	}
	return len(u.Chains) > 0 || len(u.NewSets) > 0 || len(u.NewChains) > 0 ||
		len(u.DelSets) > 0 || len(u.DelChains) > 0 || len(u.Ensure) > 0
}

// UpdateResult says what ApplyUpdate sent and how long it took.
type UpdateResult struct {
	// Added counts the elements added, those of NewSets included;
	// Deleted the Del elements (not those of deleted sets).
	Added, Deleted int
	// Rules counts the rules added.
	Rules int
	// Objects created and deleted (a replaced set counts in both).
	NewSets, NewChains, DelSets, DelChains int
	Flush                                  time.Duration
}

// ApplyUpdate sends u to the table in the target namespace in one netlink
// transaction: all of it takes effect, or (error) none of it. An Update
// that breaks the rules of the model fails (ErrInvalidProgram) before the
// kernel is asked; chains it neither creates nor replaces are assumed to
// exist. An Update that does more than add and delete elements of
// existing sets is refused (ErrNotOwned) when the table lacks ipfence's
// mark (see ApplyOptions.Adopt). If an object it names is missing, one it
// deletes is still in use, or a set would hold more elements than its
// size, the kernel rejects the transaction, and the error says which
// message failed and what that usually means.
func ApplyUpdate(ctx context.Context, u *Update, opts ApplyOptions) (UpdateResult, error) {
	up, err := NewUpdater(opts)
	if err != nil {
		return UpdateResult{}, fmt.Errorf("updating table %s: %w", u.Table, err)
	}
	defer up.Close()
	return up.Apply(ctx, u)
}

// Updater sends Updates to one namespace over a netlink connection it
// keeps open, which saves opening one per transaction (a tenth of a
// millisecond: a good part of a ban). It is not safe for concurrent use.
type Updater struct {
	opts      ApplyOptions
	c         *nftables.Conn
	nsfd      int
	closeConn func()
}

// NewUpdater opens the connection to the namespace opts.NetNS.
func NewUpdater(opts ApplyOptions) (*Updater, error) {
	c, closeConn, nsfd, err := dial(opts.NetNS)
	if err != nil {
		return nil, err
	}
	return &Updater{opts: opts, c: c, nsfd: nsfd, closeConn: closeConn}, nil
}

// Close closes the connection.
func (up *Updater) Close() { up.closeConn() }

// Apply is ApplyUpdate on the Updater's connection.
func (up *Updater) Apply(ctx context.Context, u *Update) (UpdateResult, error) {
	var res UpdateResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if err := u.validate(); err != nil {
		return res, err
	}
	if u.changesObjects() {
		// Read before the batch, without a generation check (a ban must
		// not fail because another program changed its own tables): the
		// table is one that Apply, which checks with the generation,
		// loaded.
		if _, err := checkOwner(up.c, u.Table, up.opts); err != nil {
			return res, fmt.Errorf("updating table %s: %w", u.Table, err)
		}
	}
	idx, err := ifindexes(iifNames(&Program{Chains: slices.Concat(u.NewChains, u.Chains, u.Ensure)}), up.nsfd, up.opts.NetNS)
	if err != nil {
		return res, fmt.Errorf("updating table %s: %w", u.Table, err)
	}
	b := &batch{c: up.c, ifindex: idx, res: &ApplyResult{},
		table: &nftables.Table{Family: nftables.TableFamilyINet, Name: u.Table},
		sets:  map[string]*nftables.Set{}}
	if err := b.queueUpdate(u, &res); err != nil {
		return res, fmt.Errorf("updating table %s: %w", u.Table, err)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	start := time.Now()
	err = up.c.Flush()
	res.Flush = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("updating table %s: kernel rejected the transaction, nothing was changed%s: %w",
			u.Table, kernelHint(err), err)
	}
	return res, nil
}

// queueUpdate queues u in the order documented on Update.
func (b *batch) queueUpdate(u *Update, res *UpdateResult) error {
	chains := make(map[string]*nftables.Chain, len(u.NewChains)+len(u.Chains))
	for _, ch := range u.NewChains {
		chains[ch.Name] = b.c.AddChain(chainMessage(b.table, ch))
		res.NewChains++
	}
	for _, ch := range u.Chains {
		chains[ch.Name] = &nftables.Chain{Name: ch.Name, Table: b.table}
		b.c.FlushChain(chains[ch.Name])
	}
	for _, name := range u.DelChains {
		b.c.FlushChain(&nftables.Chain{Name: name, Table: b.table})
	}
	for _, ch := range u.Ensure {
		chains[ch.Name] = b.c.AddChain(chainMessage(b.table, ch))
		b.c.FlushChain(chains[ch.Name])
	}
	for _, name := range u.DelSets {
		b.c.DelSet(&nftables.Set{Name: name, Table: b.table})
		res.DelSets++
	}
	for _, s := range u.NewSets {
		if err := b.addSet(s); err != nil {
			return err
		}
		res.NewSets++
		res.Added += s.Elems.Len()
	}
	for _, sc := range u.Sets {
		if err := b.queueSetChange(sc); err != nil {
			return fmt.Errorf("encoding set %s: %w", sc.Set.Name, err)
		}
		res.Added += len(sc.Add)
		res.Deleted += len(sc.Del)
	}
	for _, chs := range [][]*Chain{u.NewChains, u.Chains, u.Ensure} {
		for _, ch := range chs {
			if err := b.addRules(chains[ch.Name], ch); err != nil {
				return err
			}
			res.Rules += len(ch.Rules)
		}
	}
	for _, name := range u.DelChains {
		b.c.DelChain(&nftables.Chain{Name: name, Table: b.table})
		res.DelChains++
	}
	for _, ch := range u.Ensure {
		if len(ch.Rules) == 0 {
			b.c.DelChain(chains[ch.Name])
			res.DelChains++
		}
	}
	return nil
}

// queueSetChange queues the element changes of one existing set, and its
// new declared size when sc.After gives one.
func (b *batch) queueSetChange(sc SetChange) error {
	def := *sc.Set
	def.Elems = Elems{}
	ns, err := setDecl(b.table, &def)
	if err != nil {
		return err
	}
	b.sets[ns.Name] = ns
	a := sc.After
	if a != nil && !def.Interval && !def.Timeout {
		// The kernel takes the new size of an existing set at commit.
		ns.Size = sizeFor(&def, a.Len)
		if err := b.c.AddSet(ns, nil); err != nil {
			return err
		}
	}
	// The interval-end element at the zero address: kept with any Add,
	// or as After says.
	zero := []nftables.SetElement{{Key: make([]byte, familyBits(def.Family)/8), IntervalEnd: true}}
	keepZero := len(sc.Add) > 0
	if a != nil {
		keepZero = a.Len > 0 && !a.FromZero
	}
	del := elemMessages(&def, sc.Del, false)
	if def.Interval && a != nil && !keepZero {
		del = append(zero, del...)
	}
	if len(del) > 0 {
		if err := b.c.SetDestroyElements(ns, del); err != nil {
			return err
		}
	}
	add := elemMessages(&def, sc.Add, true)
	if def.Interval && keepZero {
		add = append(zero, add...)
	}
	if len(add) > 0 {
		if err := b.c.SetAddElements(ns, add); err != nil {
			return err
		}
	}
	return nil
}

// validate checks u as Validate checks a Program: names, elements and
// rule shapes, and that what u uses is there. Chains u neither creates
// nor replaces are assumed to exist; whether they are base chains is not
// known here (the kernel refuses a jump to one).
func (u *Update) validate() error {
	if err := checkName("table", u.Table); err != nil {
		return err
	}
	delSets := make(map[string]bool, len(u.DelSets))
	for _, name := range u.DelSets {
		if err := checkName("set", name); err != nil {
			return err
		}
		if delSets[name] {
			return invalidf("set %s: deleted twice", name)
		}
		delSets[name] = true
	}
	delChains := make(map[string]bool, len(u.DelChains))
	for _, name := range u.DelChains {
		if err := checkName("chain", name); err != nil {
			return err
		}
		if delChains[name] {
			return invalidf("chain %s: deleted twice", name)
		}
		delChains[name] = true
	}
	chains := make(map[string]*Chain, len(u.NewChains)+len(u.Chains))
	for _, cs := range [][]*Chain{u.NewChains, u.Chains, u.Ensure} {
		for _, c := range cs {
			if err := checkName("chain", c.Name); err != nil {
				return err
			}
			if _, dup := chains[c.Name]; dup {
				return invalidf("chain %s: in the update twice", c.Name)
			}
			if delChains[c.Name] {
				return invalidf("chain %s: both deleted and created or replaced", c.Name)
			}
			chains[c.Name] = c
		}
	}
	// target checks a jump of a rule or map element.
	target := func(v Verdict, inMap bool) error {
		if err := checkVerdict(v, nil, inMap); err != nil {
			return err
		}
		if v.Kind != Jump && v.Kind != Goto {
			return nil
		}
		if delChains[v.Chain] {
			return fmt.Errorf("%s to chain %q, which the update deletes", verdictWord(v.Kind), v.Chain)
		}
		if c := chains[v.Chain]; c != nil && c.Hook != nil {
			return fmt.Errorf("%s to base chain %q", verdictWord(v.Kind), v.Chain)
		}
		return nil
	}
	checkMap := func(s *Set, es Elems) error {
		if !s.IsMap {
			return nil
		}
		for i, e := range es.All() {
			if err := target(e.Verdict, true); err != nil {
				return invalidf("map %s: element %d (%s): %v", s.Name, i, e.Key, err)
			}
		}
		return nil
	}

	sets := make(map[string]*Set, len(u.Sets)+len(u.NewSets))
	for _, s := range u.NewSets {
		if err := checkSet(s); err != nil {
			return err
		}
		if err := checkMap(s, s.Elems); err != nil {
			return err
		}
		if _, dup := sets[s.Name]; dup {
			return invalidf("set %s: created twice", s.Name)
		}
		sets[s.Name] = s
	}
	for _, sc := range u.Sets {
		if sc.Set == nil {
			return invalidf("a set change names no set")
		}
		s := *sc.Set
		// Each list checked as the set's elements, packed once.
		add, del := s, s
		add.Elems, del.Elems = ElemsOf(sc.Add...), ElemsOf(sc.Del...)
		for _, x := range []*Set{&add, &del} {
			if err := checkSet(x); err != nil {
				return err
			}
		}
		if err := checkMap(&s, add.Elems); err != nil {
			return err
		}
		if sc.After != nil && (sc.After.Len < 0 || sc.After.Len < len(sc.Add)) {
			return invalidf("set %s: %d elements after adding %d", s.Name, sc.After.Len, len(sc.Add))
		}
		if _, dup := sets[s.Name]; dup {
			return invalidf("set %s: in the update twice", s.Name)
		}
		if delSets[s.Name] {
			return invalidf("set %s: both deleted and changed", s.Name)
		}
		sets[s.Name] = sc.Set
	}
	for _, c := range slices.Concat(u.NewChains, u.Chains, u.Ensure) {
		for i := range c.Rules {
			r := &c.Rules[i]
			if l := r.Lookup; l != nil && sets[l.Set] == nil {
				return invalidf("chain %s: rule %d: lookup in set %q, which the update neither creates nor lists in Sets", c.Name, i, l.Set)
			}
			if err := checkRule(r, sets, nil); err != nil {
				return invalidf("chain %s: rule %d: %v", c.Name, i, err)
			}
			if err := target(r.Verdict, false); err != nil {
				return invalidf("chain %s: rule %d: %v", c.Name, i, err)
			}
		}
	}
	return nil
}

// elemMessages encodes elements for an element change of set s: hash keys
// as setMessage does; an interval as its start element and its end
// element, as nft sends them. Timeouts and verdicts are sent with adds
// only: a delete matches on the key.
func elemMessages(s *Set, es []Elem, add bool) []nftables.SetElement {
	if !s.Interval {
		out := make([]nftables.SetElement, len(es))
		keys := make([]byte, 0, 16*len(es)) // one allocation for all keys
		for i, e := range es {
			at := len(keys)
			keys = appendAddr(keys, e.Key.Masked().Addr())
			out[i].Key = keys[at:len(keys):len(keys)]
			switch s.Key {
			case KeyWords:
				out[i].Key = out[i].Key[:4*words(e.Key.Bits())]
			case KeyHalf:
				out[i].Key = out[i].Key[:halfBits/8]
			}
			if add {
				out[i].Timeout = e.Timeout
				if s.IsMap {
					out[i].VerdictData = verdictExpr(e.Verdict)
				}
			}
		}
		return out
	}
	out := make([]nftables.SetElement, 0, 2*len(es))
	for _, e := range es {
		p := e.Key.Masked()
		end := lastAddr(p).Next()
		start := nftables.SetElement{Key: p.Addr().AsSlice(), IntervalOpen: !end.IsValid()}
		if add {
			start.Timeout = e.Timeout
		}
		out = append(out, start)
		if end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// appendAddr appends a's 4 or 16 bytes to b.
func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		k := a.As4()
		return append(b, k[:]...)
	}
	k := a.As16()
	return append(b, k[:]...)
}
