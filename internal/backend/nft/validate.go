package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ErrInvalidProgram is wrapped by every error Validate returns: the
// Program breaks a rule of the model (see Program, Set, Rule), so Render's
// script would not load, or would not mean what Apply loads.
var ErrInvalidProgram = errors.New("invalid nft program")

// Limits nft and the kernel put on names and comments.
const (
	maxNameLen    = 64  // ours; the kernel allows 255 (NFT_NAME_MAXLEN - 1)
	maxCommentLen = 128 // NFTNL_UDATA_COMMENT_MAXLEN: nft rejects longer comments
	maxIfNameLen  = 15  // IFNAMSIZ - 1
)

// Validate checks that p uses only the shapes documented on Program, Set
// and Rule, that names are unique and resolve, and that every element fits
// its set. Apply calls it before it touches the kernel; Render does not (it
// writes whatever it is given). The error wraps ErrInvalidProgram and names
// the object at fault.
//
// Names must be plain identifiers ([A-Za-z][A-Za-z0-9_]*): nft 1.0.6
// cannot quote set or chain names. They must also not be nft keywords
// ("drop", "ip", "counter", ...), which Validate does not check; the
// kernel accepts them but `nft -f` of Render's script does not.
//
// Duplicate keys in a hash set or map are not detected here (the kernel
// keeps one element, or rejects the transaction if their verdicts differ).
func (p *Program) Validate() error {
	if err := checkName("table", p.Table); err != nil {
		return err
	}
	sets := make(map[string]*Set, len(p.Sets))
	for _, s := range p.Sets {
		if err := checkSet(s); err != nil {
			return err
		}
		if _, dup := sets[s.Name]; dup {
			return invalidf("set %s: defined twice", s.Name)
		}
		sets[s.Name] = s
	}
	chains := make(map[string]*Chain, len(p.Chains))
	for _, c := range p.Chains {
		if err := checkName("chain", c.Name); err != nil {
			return err
		}
		if _, dup := chains[c.Name]; dup {
			return invalidf("chain %s: defined twice", c.Name)
		}
		chains[c.Name] = c
	}
	for _, s := range p.Sets {
		if !s.IsMap {
			continue
		}
		for i, e := range s.Elems.All() {
			if err := checkVerdict(e.Verdict, chains, true); err != nil {
				return invalidf("map %s: element %d (%s): %v", s.Name, i, e.Key, err)
			}
		}
	}
	for _, c := range p.Chains {
		for i := range c.Rules {
			if err := checkRule(&c.Rules[i], sets, chains); err != nil {
				return invalidf("chain %s: rule %d: %v", c.Name, i, err)
			}
		}
	}
	return nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidProgram, fmt.Sprintf(format, args...))
}

func checkName(what, name string) error {
	if name == "" {
		return invalidf("%s has no name", what)
	}
	if len(name) > maxNameLen {
		return invalidf("%s %.20s...: name longer than %d bytes", what, name, maxNameLen)
	}
	for i, r := range name {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if letter || i > 0 && (r == '_' || r >= '0' && r <= '9') {
			continue
		}
		return invalidf("%s %q: name must match [A-Za-z][A-Za-z0-9_]*", what, name)
	}
	return nil
}

func checkComment(c string) error {
	if len(c) > maxCommentLen {
		return fmt.Errorf("comment longer than %d bytes", maxCommentLen)
	}
	if strings.ContainsAny(c, "\"\n\r\\") {
		return fmt.Errorf("comment %q contains a quote, backslash or newline (nft cannot escape them)", c)
	}
	return nil
}

func familyBits(f Family) int {
	switch f {
	case IPv4:
		return 32
	case IPv6:
		return 128
	}
	return 0
}

func checkSet(s *Set) error {
	if err := checkName("set", s.Name); err != nil {
		return err
	}
	bits := familyBits(s.Family)
	if bits == 0 {
		return invalidf("set %s: family must be ipv4 or ipv6", s.Name)
	}
	if err := checkComment(s.Comment); err != nil {
		return invalidf("set %s: %v", s.Name, err)
	}
	switch {
	case s.Interval && s.IsMap:
		return invalidf("set %s: interval maps are not supported", s.Name)
	case s.Interval && s.KeyBits != 0:
		return invalidf("set %s: an interval set has KeyBits 0, not %d", s.Name, s.KeyBits)
	case !s.Interval && (s.KeyBits < 1 || s.KeyBits > bits):
		return invalidf("set %s: KeyBits %d out of range 1..%d", s.Name, s.KeyBits, bits)
	case s.Key > KeyHalf:
		return invalidf("set %s: unknown key form %d", s.Name, s.Key)
	case s.Timeout && s.IsMap:
		return invalidf("set %s: maps with timeouts are not supported", s.Name)
	case s.Key == KeyWords && (s.Interval || s.Family != IPv6):
		return invalidf("set %s: only IPv6 hash sets are keyed on words", s.Name)
	case s.Key == KeyHalf && (s.Interval || s.IsMap || s.Timeout || s.Family != IPv4 || s.KeyBits != halfBits):
		return invalidf("set %s: only IPv4 sets (not maps, no timeouts) of /%d keys are keyed on the address's leading half", s.Name, halfBits)
	}
	for i, e := range s.Elems.All() {
		if !e.Key.IsValid() || e.Key.Addr().Is4() != (s.Family == IPv4) || e.Key.Addr().Is4In6() {
			return invalidf("set %s: element %d (%s) is not an %s prefix", s.Name, i, e.Key, s.Family)
		}
		if !s.Interval && e.Key.Bits() != s.KeyBits {
			return invalidf("set %s: element %d (%s) is not a /%d prefix", s.Name, i, e.Key, s.KeyBits)
		}
		if e.Timeout < 0 || (e.Timeout > 0 && (!s.Timeout || e.Timeout < time.Millisecond)) {
			return invalidf("set %s: element %d (%s) has timeout %v (needs a set with Timeout, at least 1ms)", s.Name, i, e.Key, e.Timeout)
		}
		if !s.IsMap && e.Verdict != (Verdict{}) {
			return invalidf("set %s: element %d (%s) has a verdict but the set is not a map", s.Name, i, e.Key)
		}
	}
	if s.Interval {
		if _, err := intervalRanges(s.Elems); err != nil {
			return invalidf("set %s: %v", s.Name, err)
		}
	}
	return nil
}

// checkVerdict checks a verdict of a rule (inMap false) or of a map
// element (inMap true: Continue is not a verdict a map can return). With
// chains nil, a jump target is only checked to be a valid name.
func checkVerdict(v Verdict, chains map[string]*Chain, inMap bool) error {
	switch v.Kind {
	case Continue:
		if inMap {
			return errors.New("map element without a verdict")
		}
	case Accept, Drop, Return:
	case Jump, Goto:
		if chains == nil { // a loaded table's chains: the kernel checks
			return checkName("chain", v.Chain)
		}
		c, ok := chains[v.Chain]
		if !ok {
			return fmt.Errorf("%s to undefined chain %q", verdictWord(v.Kind), v.Chain)
		}
		if c.Hook != nil {
			return fmt.Errorf("%s to base chain %q", verdictWord(v.Kind), v.Chain)
		}
		return nil
	default:
		return fmt.Errorf("unknown verdict kind %d", v.Kind)
	}
	if v.Chain != "" {
		return fmt.Errorf("%s verdict names a chain (%q)", verdictWord(v.Kind), v.Chain)
	}
	return nil
}

func checkRule(r *Rule, sets map[string]*Set, chains map[string]*Chain) error {
	if r.Iif != "" && (len(r.Iif) > maxIfNameLen || strings.ContainsAny(r.Iif, "\" \t\n\\/")) {
		return fmt.Errorf("bad interface name %q", r.Iif)
	}
	if r.Family > IPv6 {
		return fmt.Errorf("unknown family %d", r.Family)
	}
	switch r.Proto {
	case 0, ProtoTCP, ProtoUDP:
	default:
		return fmt.Errorf("unsupported l4 protocol %d", r.Proto)
	}
	if len(r.Ports) > 0 && r.Proto == 0 {
		return errors.New("ports without a protocol")
	}
	for _, pr := range r.Ports {
		if pr.First > pr.Last {
			return fmt.Errorf("port range %d-%d is reversed", pr.First, pr.Last)
		}
	}
	if r.NDP && (r.Proto != 0 || r.Family == IPv4) {
		return errors.New("NDP matches ipv6-icmp: it excludes Proto and Family ipv4")
	}
	if l := r.Lookup; l != nil {
		s, ok := sets[l.Set]
		if !ok {
			return fmt.Errorf("lookup in undefined set %q", l.Set)
		}
		if l.Family != s.Family {
			return fmt.Errorf("%s lookup in %s set %s", l.Family, s.Family, s.Name)
		}
		if r.Family != FamilyAny && r.Family != l.Family {
			return fmt.Errorf("rule family %s contradicts its %s lookup", r.Family, l.Family)
		}
		if l.Key != s.Key {
			return fmt.Errorf("lookup key form %d differs from set %s's %d", l.Key, s.Name, s.Key)
		}
		if l.IsMap != s.IsMap {
			return fmt.Errorf("vmap/set mismatch: lookup IsMap %v, set %s IsMap %v", l.IsMap, s.Name, s.IsMap)
		}
		bits := familyBits(l.Family)
		if l.MaskBits < 0 || l.MaskBits > bits {
			return fmt.Errorf("mask /%d out of range for %s", l.MaskBits, l.Family)
		}
		if !s.Interval && effectiveMask(l) != s.KeyBits {
			return fmt.Errorf("lookup masks to /%d but set %s holds /%d keys", effectiveMask(l), s.Name, s.KeyBits)
		}
		if l.IsMap && (r.Counter || r.Reject != NoReject || r.Verdict.Kind != Continue) {
			return errors.New("a vmap lookup ends the rule: no counter, reject or verdict after it")
		}
	}
	switch r.Reject {
	case NoReject:
	case RejectTCPReset:
		if r.Proto != ProtoTCP {
			return errors.New("reject with tcp reset needs Proto tcp")
		}
	case RejectAdminProhibited:
	default:
		return fmt.Errorf("unknown reject kind %d", r.Reject)
	}
	if r.Reject != NoReject && r.Verdict.Kind != Continue {
		return errors.New("reject is a verdict of its own: no Verdict with it")
	}
	if err := checkVerdict(r.Verdict, chains, false); err != nil {
		return err
	}
	if err := checkComment(r.Comment); err != nil {
		return err
	}
	if r.Iif == "" && r.Family == FamilyAny && r.Proto == 0 && !r.NDP && !r.Known && r.Lookup == nil &&
		!r.Counter && r.Reject == NoReject && r.Verdict.Kind == Continue {
		return errors.New("empty rule")
	}
	return nil
}

// effectiveMask is the prefix length a lookup's key has after masking.
func effectiveMask(l *Lookup) int {
	if l.MaskBits == 0 {
		return familyBits(l.Family)
	}
	return l.MaskBits
}

// addrRange is an inclusive range of addresses of one family, with the
// timeout of the element it came from.
type addrRange struct {
	first, last netip.Addr
	timeout     time.Duration
}

// intervalRanges returns the elements of an interval set as sorted address
// ranges, or an error if two of them overlap (nft and the kernel reject
// overlapping intervals in a set without auto-merge).
func intervalRanges(elems Elems) ([]addrRange, error) {
	rs := make([]addrRange, elems.Len())
	for i, e := range elems.All() {
		p := e.Key.Masked()
		rs[i] = addrRange{p.Addr(), lastAddr(p), e.Timeout}
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.first.Compare(b.first) })
	for i := 1; i < len(rs); i++ {
		if rs[i].first.Compare(rs[i-1].last) <= 0 {
			return nil, fmt.Errorf("elements %s-%s and %s-%s overlap", rs[i-1].first, rs[i-1].last, rs[i].first, rs[i].last)
		}
	}
	return rs, nil
}

// lastAddr is the last address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	for i := p.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	last, _ := netip.AddrFromSlice(a)
	return last
}
