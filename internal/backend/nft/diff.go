package nft

import (
	"errors"
	"fmt"
	"slices"
)

// ErrNeedsReload is wrapped by the error Diff returns when no Update can
// turn a table loaded from the old Program into the new one in place: a
// set keeps its name but not its definition, or a base chain its hook or
// priority. The caller loads the new Program with Apply instead.
var ErrNeedsReload = errors.New("the change needs a full reload")

// Diff returns the Update that turns a table loaded from old (with Apply,
// or by earlier Updates from Diff) into what Apply of new loads;
// ApplyUpdate sends it in one transaction. Only what differs is in it:
//
//   - sets are matched by name. A set in both with the same definition
//     (Family, Interval, KeyBits, Key, Timeout, IsMap, Comment) gets an
//     element diff: hash keys are compared as masked prefixes, interval
//     elements as prefixes, and an element whose verdict or timeout
//     (in milliseconds) changed is deleted and added again. A hash set
//     whose declared size (see hashSize) must grow is replaced instead:
//     deleted and created again with its elements, the chains that look
//     it up with their rules, since the kernel would refuse elements
//     beyond its old size. Sets only in new are created, sets only in
//     old deleted.
//   - chains are matched by name. A chain whose rules are the same is
//     left alone, one whose rules differ is replaced (flushed, its rules
//     added again); chains only in new are created, chains only in old
//     deleted.
//
// A set whose definition changed, or a base chain whose hook or priority
// changed, or that became a regular chain or the other way round, makes
// Diff fail with an error wrapping ErrNeedsReload. Such a set could be
// replaced as one that grows is, but FromPlan names sets after what
// defines them (family, depth, key length), so only a change of
// configuration does this, and a reload is the plain way. A different
// table name is an error of its own: Apply of new would leave the old
// table in place. Diff neither validates the programs (ApplyUpdate
// validates the Update) nor changes them; the Update shares their sets
// and chains.
//
// The kernel lists sets and chains in the order they were created: after
// an Update, those it created come after the others, where Apply of new
// would list all in Program order. Nothing else depends on the order.
//
// Diff of identical programs is Empty. Timeouts are compared as the
// programs have them, not as the kernel counts them down: a caller whose
// sets hold elements with timeouts (bans) makes them the same in old and
// new, or uses DiffKeeping.
func Diff(old, new *Program) (*Update, error) {
	return DiffKeeping(old, new, nil)
}

// DiffKeeping is Diff, except that sets for which keep returns true are
// never touched: no element diff, no delete (a kept set only in new is
// created). The daemon passes its ban sets, whose elements change between
// refreshes (bans and unbans, timeouts counting down) without the feeds
// having anything to do with them. A kept set whose definition changed
// still needs a reload (ErrNeedsReload). keep nil keeps nothing.
func DiffKeeping(old, new *Program, keep func(name string) bool) (*Update, error) {
	if old.Table != new.Table {
		return nil, fmt.Errorf("diffing table %s against table %s: a different table is loaded with Apply, not updated", old.Table, new.Table)
	}
	u := &Update{Table: new.Table}
	oldSets, err := setIndex(old)
	if err != nil {
		return nil, err
	}
	newSets, err := setIndex(new)
	if err != nil {
		return nil, err
	}
	kept := func(name string) bool { return keep != nil && keep(name) }

	replaced := map[string]bool{}
	for _, s := range new.Sets {
		o := oldSets[s.Name]
		switch {
		case o == nil:
			u.NewSets = append(u.NewSets, s)
			continue
		case !sameDefinition(o, s):
			return nil, fmt.Errorf("diffing table %s: set %s: its definition changed (%s): %w",
				new.Table, s.Name, definitionChange(o, s), ErrNeedsReload)
		case kept(s.Name):
			continue
		}
		sc, changed := diffSet(o, s)
		switch {
		case !changed:
		case s.Interval:
			u.Sets = append(u.Sets, sc)
		case hashSize(s) > hashSize(o):
			replaced[s.Name] = true
			u.DelSets = append(u.DelSets, s.Name)
			u.NewSets = append(u.NewSets, s)
		default:
			if hashSize(s) == hashSize(o) {
				sc.After = nil // nothing to tell: the size stays
			}
			u.Sets = append(u.Sets, sc)
		}
	}
	for _, s := range old.Sets {
		if newSets[s.Name] == nil && !kept(s.Name) {
			u.DelSets = append(u.DelSets, s.Name)
		}
	}

	oldChains, err := chainIndex(old)
	if err != nil {
		return nil, err
	}
	newChains, err := chainIndex(new)
	if err != nil {
		return nil, err
	}
	for _, c := range new.Chains {
		o := oldChains[c.Name]
		switch {
		case o == nil:
			u.NewChains = append(u.NewChains, c)
		case (o.Hook == nil) != (c.Hook == nil) || o.Hook != nil && *o.Hook != *c.Hook:
			return nil, fmt.Errorf("diffing table %s: chain %s: its hook changed (%s to %s): %w",
				new.Table, c.Name, hookString(o.Hook), hookString(c.Hook), ErrNeedsReload)
		case !slices.EqualFunc(o.Rules, c.Rules, ruleEqual) || looksUpAny(c, replaced):
			u.Chains = append(u.Chains, c)
		}
	}
	for _, c := range old.Chains {
		if newChains[c.Name] == nil {
			u.DelChains = append(u.DelChains, c.Name)
		}
	}

	// The rules sent look sets up: existing ones are listed in Sets.
	listed := make(map[string]bool, len(u.Sets)+len(u.NewSets))
	for _, sc := range u.Sets {
		listed[sc.Set.Name] = true
	}
	for _, s := range u.NewSets {
		listed[s.Name] = true
	}
	for _, cs := range [][]*Chain{u.NewChains, u.Chains} {
		for _, c := range cs {
			for _, r := range c.Rules {
				if l := r.Lookup; l != nil && !listed[l.Set] && newSets[l.Set] != nil {
					listed[l.Set] = true
					u.Sets = append(u.Sets, SetChange{Set: newSets[l.Set]})
				}
			}
		}
	}
	return u, nil
}

func setIndex(p *Program) (map[string]*Set, error) {
	m := make(map[string]*Set, len(p.Sets))
	for _, s := range p.Sets {
		if m[s.Name] != nil {
			return nil, invalidf("diffing table %s: set %s: defined twice", p.Table, s.Name)
		}
		m[s.Name] = s
	}
	return m, nil
}

func chainIndex(p *Program) (map[string]*Chain, error) {
	m := make(map[string]*Chain, len(p.Chains))
	for _, c := range p.Chains {
		if m[c.Name] != nil {
			return nil, invalidf("diffing table %s: chain %s: defined twice", p.Table, c.Name)
		}
		m[c.Name] = c
	}
	return m, nil
}

func sameDefinition(a, b *Set) bool {
	return a.Family == b.Family && a.Interval == b.Interval && a.KeyBits == b.KeyBits && a.Key == b.Key &&
		a.Timeout == b.Timeout && a.IsMap == b.IsMap && a.Comment == b.Comment
}

// definitionChange names the first field of a set's definition that
// differs between a and b.
func definitionChange(a, b *Set) string {
	switch {
	case a.Family != b.Family:
		return fmt.Sprintf("family %s to %s", a.Family, b.Family)
	case a.Interval != b.Interval:
		return fmt.Sprintf("interval %v to %v", a.Interval, b.Interval)
	case a.KeyBits != b.KeyBits:
		return fmt.Sprintf("key bits %d to %d", a.KeyBits, b.KeyBits)
	case a.Key != b.Key:
		return fmt.Sprintf("key form %d to %d", a.Key, b.Key)
	case a.Timeout != b.Timeout:
		return fmt.Sprintf("timeout %v to %v", a.Timeout, b.Timeout)
	case a.IsMap != b.IsMap:
		return fmt.Sprintf("map %v to %v", a.IsMap, b.IsMap)
	}
	return fmt.Sprintf("comment %q to %q", a.Comment, b.Comment)
}

func hookString(h *Hook) string {
	if h == nil {
		return "none"
	}
	return fmt.Sprintf("%s priority %d", h.Num, h.Priority)
}

// diffSet is the element change from o to s, which have the same
// definition; changed is false when they hold the same elements.
func diffSet(o, s *Set) (sc SetChange, changed bool) {
	// Elements alike at the start (most of them, in sets that change
	// little and keep their order) need no map.
	same, no, ns := 0, o.Elems.Len(), s.Elems.Len()
	for same < no && same < ns && o.Elems.equalAt(same, s.Elems, same) {
		same++
	}
	if same == no && same == ns {
		return SetChange{}, false
	}
	olds, news := o.Elems.Slice(same, no), s.Elems.Slice(same, ns)
	sc = SetChange{Set: s, After: &SetState{Len: ns}}
	if olds.sortedKeys() && news.sortedKeys() {
		sc.Add, sc.Del = mergeDiff(olds, news)
	} else {
		sc.Add, sc.Del = mapDiff(olds, news)
	}
	if s.Interval {
		for _, e := range s.Elems.All() {
			sc.After.FromZero = sc.After.FromZero || e.Key.Masked().Addr().IsUnspecified()
		}
	}
	return sc, len(sc.Add) > 0 || len(sc.Del) > 0
}

// mapDiff returns the elements to add and delete to turn olds into news:
// a new element whose key is not among olds, or whose value changed
// (then deleted first); an old one whose key is not among news.
func mapDiff(olds, news Elems) (add, del []Elem) {
	idx := make(map[elemKey]int32, olds.Len()) // key -> index in olds
	seen := make([]bool, olds.Len())           // matched, not to be deleted
	for i := range olds.Len() {
		k := olds.keyAt(i)
		if j, dup := idx[k]; dup { // the kernel holds one element per key
			seen[j] = true
		}
		idx[k] = int32(i)
	}
	for j := range news.Len() {
		i, ok := idx[news.keyAt(j)]
		if ok && !seen[i] {
			seen[i] = true
			if olds.sameValueAt(int(i), news, j) {
				continue
			}
			del = append(del, Elem{Key: news.At(j).Key.Masked()})
		}
		add = append(add, news.At(j))
	}
	for i := range olds.Len() {
		if !seen[i] {
			del = append(del, Elem{Key: olds.At(i).Key.Masked()})
		}
	}
	return add, del
}

// mergeDiff is mapDiff, in the same order, for elements sorted by key
// without repeats (a layout's maps as lowered): one pass, without the
// map of every old key (25 MB for a 400k-line feed's 689k elements).
func mergeDiff(olds, news Elems) (add, del []Elem) {
	var gone []Elem // old keys not among news: mapDiff deletes them last
	i, no := 0, olds.Len()
	var ok elemKey // olds.keyAt(i), while i < no
	if no > 0 {
		ok = olds.keyAt(0)
	}
	for j := range news.Len() {
		k := news.keyAt(j)
		for ; i < no && ok.less(k); i++ {
			gone = append(gone, Elem{Key: olds.At(i).Key.Masked()})
			if i+1 < no {
				ok = olds.keyAt(i + 1)
			}
		}
		if i < no && ok == k {
			same := olds.sameValueAt(i, news, j)
			if i++; i < no {
				ok = olds.keyAt(i)
			}
			if same {
				continue
			}
			del = append(del, Elem{Key: news.At(j).Key.Masked()})
		}
		add = append(add, news.At(j))
	}
	for ; i < no; i++ {
		gone = append(gone, Elem{Key: olds.At(i).Key.Masked()})
	}
	return add, append(del, gone...)
}

// elemKey is an element's key as the kernel tells elements apart: the
// masked address, and for interval sets the prefix length. It hashes
// faster than a netip.Prefix.
type elemKey struct {
	hi, lo uint64 // the 16-byte address, big-endian halves
	bits   uint8
}

// less orders keys by address, then length.
func (k elemKey) less(o elemKey) bool {
	if k.hi != o.hi {
		return k.hi < o.hi
	}
	if k.lo != o.lo {
		return k.lo < o.lo
	}
	return k.bits < o.bits
}

// ruleEqual reports whether two rules are the same.
func ruleEqual(a, b Rule) bool {
	return a.Iif == b.Iif && a.Family == b.Family && a.Proto == b.Proto && slices.Equal(a.Ports, b.Ports) &&
		a.NDP == b.NDP && (a.Lookup == nil) == (b.Lookup == nil) && (a.Lookup == nil || *a.Lookup == *b.Lookup) &&
		a.Counter == b.Counter && a.Reject == b.Reject && a.Verdict == b.Verdict && a.Comment == b.Comment
}

// looksUpAny reports whether a rule of c looks up one of sets.
func looksUpAny(c *Chain, sets map[string]bool) bool {
	if len(sets) == 0 {
		return false
	}
	for _, r := range c.Rules {
		if r.Lookup != nil && sets[r.Lookup.Set] {
			return true
		}
	}
	return false
}
