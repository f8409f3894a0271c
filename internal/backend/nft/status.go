package nft

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TableStatus is what the kernel holds of one inet table, read cheaply: chains
// and their rules' counters, and set descriptions without their elements.
type TableStatus struct {
	Table  string
	Exists bool
	// Marked says that the table has ipfence's mark (Mark); a table an
	// older ipfence loaded has none until it is applied again.
	Marked bool
	// GenID is the ruleset generation when the table was read.
	GenID  uint32
	Chains []ChainStatus
	Sets   []SetStatus
}

// ChainStatus is one chain of the table.
type ChainStatus struct {
	Name string
	// Hook is the hook of a base chain ("prerouting", ...), "" for a
	// regular chain; Priority is its priority.
	Hook     string
	Priority int32
	Rules    []RuleStatus
}

// RuleStatus is one rule: its handle, comment, and the packets and bytes
// of its counter statement (HasCounter false when it has none).
type RuleStatus struct {
	Handle     uint64
	Comment    string
	HasCounter bool
	Packets    uint64
	Bytes      uint64
}

// SetStatus describes a named set or map; its elements are not read.
type SetStatus struct {
	Name    string
	Family  Family
	IsMap   bool
	Flags   []string // nft's words: "constant", "interval", "timeout", "dynamic"
	Size    uint32   // declared size, 0 when none
	Comment string
}

// Status reads the inet table named table in the namespace netns (see
// ApplyOptions.NetNS). A missing table is not an error: Exists is false.
// It never lists set or map elements (reading hundreds of thousands back
// takes seconds); it costs one rule dump per chain.
func Status(ctx context.Context, table, netns string) (TableStatus, error) {
	return StatusChains(ctx, table, netns, nil)
}

// StatusChains is Status reading the rules of only the chains for which
// want returns true (all when want is nil); other chains are listed
// without rules.
func StatusChains(ctx context.Context, table, netns string, want func(chain string) bool) (TableStatus, error) {
	st := TableStatus{Table: table}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	c, closeConn, _, err := dial(netns)
	if err != nil {
		return st, fmt.Errorf("reading table %s: %w", table, err)
	}
	defer closeConn()

	gen, err := c.GetGen()
	if err != nil {
		return st, fmt.Errorf("reading table %s: reading ruleset generation: %w", table, err)
	}
	st.GenID = gen.ID
	t, err := c.ListTableOfFamily(table, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("reading table %s: %w", table, err)
	}
	st.Exists, st.Marked = true, marked(t.UserData)

	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return st, fmt.Errorf("reading chains of table %s: %w", table, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != table {
			continue
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		cs := ChainStatus{Name: ch.Name}
		if ch.Hooknum != nil {
			cs.Hook = HookName(*ch.Hooknum)
		}
		if ch.Priority != nil {
			cs.Priority = int32(*ch.Priority)
		}
		if want != nil && !want(ch.Name) {
			st.Chains = append(st.Chains, cs)
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return st, fmt.Errorf("reading rules of chain %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			rs := RuleStatus{Handle: r.Handle}
			rs.Comment, _ = userdata.GetString(r.UserData, userdata.TypeComment)
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					rs.HasCounter = true
					rs.Packets += ctr.Packets
					rs.Bytes += ctr.Bytes
				}
			}
			cs.Rules = append(cs.Rules, rs)
		}
		st.Chains = append(st.Chains, cs)
	}

	sets, err := c.GetSets(t)
	if err != nil {
		return st, fmt.Errorf("reading sets of table %s: %w", table, err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue
		}
		ss := SetStatus{Name: s.Name, IsMap: s.IsMap, Size: s.Size, Comment: s.Comment}
		ss.Family = keyFamily(s.KeyType)
		for _, f := range []struct {
			on   bool
			name string
		}{{s.Constant, "constant"}, {s.Interval, "interval"}, {s.HasTimeout, "timeout"}, {s.Dynamic, "dynamic"}} {
			if f.on {
				ss.Flags = append(ss.Flags, f.name)
			}
		}
		st.Sets = append(st.Sets, ss)
	}
	return st, nil
}

// keyFamily is the family of a set's keys: an address type, or the
// integer words of an IPv6 KeyWords set.
func keyFamily(t nftables.SetDatatype) Family {
	switch t.GetNFTMagic() {
	case nftables.TypeIPAddr.GetNFTMagic():
		return IPv4
	case nftables.TypeIP6Addr.GetNFTMagic():
		return IPv6
	}
	if t.GetNFTMagic() == nftables.TypeInteger.GetNFTMagic() && t.Bytes == halfBits/8 {
		return IPv4 // KeyHalf
	}
	for n := 1; n <= 4; n++ {
		if w, err := wordsType(n); err == nil && w.GetNFTMagic() == t.GetNFTMagic() && w.Bytes == t.Bytes {
			return IPv6
		}
	}
	return FamilyAny
}

// HookName is the name nft gives hook h of the ip, ip6 and inet families.
func HookName(h nftables.ChainHook) string {
	switch h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", h)
}
