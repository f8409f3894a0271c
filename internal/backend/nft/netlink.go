package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// batch queues a Program on an nftables.Conn as the messages `nft -f` of
// Render's script sends, in the same order: table (add, delete, add with
// ipfence's mark), every chain, every named set with its elements, then the rules, each
// rule preceded by the anonymous sets it uses. Chains come before sets so
// that map elements can jump to them.
type batch struct {
	c       *nftables.Conn
	table   *nftables.Table
	sets    map[string]*nftables.Set
	ifindex map[string]uint32 // iif names resolved in the target namespace
	res     *ApplyResult
}

func (b *batch) queue(p *Program) error {
	old := &nftables.Table{Family: nftables.TableFamilyINet, Name: p.Table}
	b.c.AddTable(old)
	b.c.DelTable(old)
	b.table = b.c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: p.Table, UserData: markUserdata()})

	chains := make(map[string]*nftables.Chain, len(p.Chains))
	for _, ch := range p.Chains {
		chains[ch.Name] = b.c.AddChain(chainMessage(b.table, ch))
	}
	b.res.Chains = len(p.Chains)

	b.sets = make(map[string]*nftables.Set, len(p.Sets))
	for _, s := range p.Sets {
		if err := b.addSet(s); err != nil {
			return err
		}
		b.res.Sets++
		b.res.Elements += s.Elems.Len()
	}

	for _, ch := range p.Chains {
		if err := b.addRules(chains[ch.Name], ch); err != nil {
			return err
		}
		b.res.Rules += len(ch.Rules)
	}
	return nil
}

// addRules queues the rules of ch, appended to c, with the anonymous sets
// they use.
func (b *batch) addRules(c *nftables.Chain, ch *Chain) error {
	for i := range ch.Rules {
		exprs, err := b.ruleExprs(&ch.Rules[i])
		if err != nil {
			return fmt.Errorf("encoding chain %s rule %d: %w", ch.Name, i, err)
		}
		b.c.AddRule(ruleMessage(b.table, c, &ch.Rules[i], exprs))
	}
	return nil
}

// chainMessage is chain ch of table t, without its rules.
func chainMessage(t *nftables.Table, ch *Chain) *nftables.Chain {
	nc := &nftables.Chain{Name: ch.Name, Table: t}
	if ch.Hook != nil {
		nc.Type = nftables.ChainTypeFilter
		nc.Hooknum = [...]*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput, nftables.ChainHookForward}[ch.Hook.Num]
		nc.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(ch.Hook.Priority))
		policy := nftables.ChainPolicyAccept
		nc.Policy = &policy
	}
	return nc
}

// addSet queues the creation of set s with its elements. The elements of
// a hash set or map (a layout's maps: up to millions) are encoded one at a
// time, without a slice of them all (SetAddElementsFunc).
func (b *batch) addSet(s *Set) error {
	ns, err := setDecl(b.table, s)
	if err != nil {
		return err
	}
	if s.Interval {
		var rs []addrRange
		if rs, err = intervalRanges(s.Elems); err == nil {
			err = b.c.AddSet(ns, addrIntervalElems(rs))
		}
	} else if err = b.c.AddSet(ns, nil); err == nil {
		err = b.c.SetAddElementsFunc(ns, s.Elems.Len(), func(i int, e *nftables.SetElement) {
			el := s.Elems.At(i)
			hashElem(s, &el, e)
		})
	}
	if err != nil {
		return fmt.Errorf("encoding set %s: %w", s.Name, err)
	}
	b.sets[s.Name] = ns
	return nil
}

// ruleMessage is the rule r of chain ch, its expressions already encoded.
func ruleMessage(t *nftables.Table, ch *nftables.Chain, r *Rule, exprs []expr.Any) *nftables.Rule {
	nr := &nftables.Rule{Table: t, Chain: ch, Exprs: exprs}
	if r.Comment != "" {
		nr.UserData = userdata.AppendString(nil, userdata.TypeComment, r.Comment)
	}
	return nr
}

// hashElem fills in ne, the element of hash set s for e.
func hashElem(s *Set, e *Elem, ne *nftables.SetElement) {
	ne.Timeout = e.Timeout
	ne.Key = e.Key.Masked().Addr().AsSlice()
	switch s.Key {
	case KeyWords:
		ne.Key = keyWords(e.Key)
	case KeyHalf:
		ne.Key = ne.Key[:halfBits/8]
	}
	if s.IsMap {
		ne.VerdictData = verdictExpr(e.Verdict)
	}
}

// setDecl is the declaration of the named set s: its flags, size and key
// byte order as nft writes them (its elements: addSet).
func setDecl(t *nftables.Table, s *Set) (*nftables.Set, error) {
	ns := &nftables.Set{
		Table:        t,
		Name:         s.Name,
		Interval:     s.Interval,
		IsMap:        s.IsMap,
		KeyType:      nftables.TypeIPAddr,
		KeyByteOrder: binaryutil.BigEndian,
		Comment:      s.Comment,
		HasTimeout:   s.Timeout,
	}
	if s.Timeout {
		ns.GcInterval = GCInterval
	}
	if s.Family == IPv6 {
		ns.KeyType = nftables.TypeIP6Addr
	}
	if s.Key == KeyWords {
		kt, err := wordsType(words(s.KeyBits))
		if err != nil {
			return nil, fmt.Errorf("encoding set %s: %w", s.Name, err)
		}
		ns.KeyType = kt
		if words(s.KeyBits) > 1 {
			ns.KeyByteOrder = nil // nft writes byte order 0 for a concatenation
		}
		ns.UserData = typeofUserdata(s)
	}
	if s.Key == KeyHalf {
		kt := nftables.TypeInteger
		kt.Bytes = halfBits / 8
		ns.KeyType = kt
		ns.UserData = typeofUserdata(s)
	}
	if s.IsMap {
		ns.DataType = nftables.TypeVerdict
	}
	if !s.Interval {
		ns.Size = hashSize(s)
	}
	return ns, nil
}

// wordsType is the key type of a KeyWords set of n words: integer, or a
// concatenation of n integers.
func wordsType(n int) (nftables.SetDatatype, error) {
	if n == 1 {
		return nftables.TypeInteger, nil
	}
	ts := make([]nftables.SetDatatype, n)
	for i := range ts {
		ts[i] = nftables.TypeInteger
	}
	return nftables.ConcatSetType(ts...)
}

// Expression types and payload fields of nft's typeof userdata
// (nftables src/expression.c, src/payload.c).
const (
	udataExprPayload = 7
	udataExprVerdict = 1
	udataExprConcat  = 13

	udataTypeofExpr = 0 // NFTNL_UDATA_SET_TYPEOF_EXPR
	udataTypeofData = 1 // NFTNL_UDATA_SET_TYPEOF_DATA

	udataPayloadDesc   = 0
	udataPayloadType   = 1
	udataPayloadBase   = 2
	udataPayloadOffset = 3
	udataPayloadLen    = 4

	nftPayloadNetworkHeader = 2 // nft's PROTO_BASE_NETWORK_HDR
)

// typeofUserdata is the userdata nft writes for "typeof" a KeyWords set's
// words or a KeyHalf set's half word (and ": verdict" for a map), without
// which nft cannot list it.
func typeofUserdata(s *Set) []byte {
	wordBits := uint32(32)
	if s.Key == KeyHalf {
		wordBits = halfBits
	}
	word := func(i int) []byte {
		var d []byte
		d = userdata.AppendUint32(d, udataPayloadDesc, 0)
		d = userdata.AppendUint32(d, udataPayloadType, 0)
		d = userdata.AppendUint32(d, udataPayloadBase, nftPayloadNetworkHeader)
		d = userdata.AppendUint32(d, udataPayloadOffset, uint32(8*wordsOffset(s.Family, s.Dst)+32*i))
		d = userdata.AppendUint32(d, udataPayloadLen, wordBits)
		var e []byte
		e = userdata.AppendUint32(e, udataTypeofExpr, udataExprPayload)
		return userdata.Append(e, udataTypeofData, d)
	}
	var key []byte
	if n := words(s.KeyBits); n == 1 {
		key = word(0)
	} else {
		var subs []byte
		for i := range n {
			subs = userdata.Append(subs, userdata.Type(i), word(i))
		}
		key = userdata.AppendUint32(key, udataTypeofExpr, udataExprConcat)
		key = userdata.Append(key, udataTypeofData, subs)
	}
	var ud []byte
	if words(s.KeyBits) > 1 {
		ud = userdata.AppendUint32(ud, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 0)
	}
	ud = userdata.Append(ud, userdata.NFTNL_UDATA_SET_KEY_TYPEOF, key)
	if s.IsMap {
		var data []byte
		data = userdata.AppendUint32(data, udataTypeofExpr, udataExprVerdict)
		data = userdata.Append(data, udataTypeofData, nil)
		ud = userdata.Append(ud, userdata.NFTNL_UDATA_SET_DATA_TYPEOF, data)
	}
	return ud
}

// addrIntervalElems encodes sorted, disjoint address ranges the way nft
// does for an interval set: an interval-end element at the zero address
// when the first range does not start there, then for every range its
// start and an interval-end element at last+1; a range that runs to the
// last address has no end element and its start is flagged open.
func addrIntervalElems(rs []addrRange) []nftables.SetElement {
	elems := make([]nftables.SetElement, 0, 2*len(rs)+1)
	if len(rs) > 0 && !rs[0].first.IsUnspecified() {
		elems = append(elems, nftables.SetElement{
			Key:         make([]byte, rs[0].first.BitLen()/8),
			IntervalEnd: true,
		})
	}
	for _, r := range rs {
		end := r.last.Next()
		elems = append(elems, nftables.SetElement{Key: r.first.AsSlice(), IntervalOpen: !end.IsValid(), Timeout: r.timeout})
		if end.IsValid() {
			elems = append(elems, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return elems
}

// portIntervalElems is addrIntervalElems for canonical port ranges.
func portIntervalElems(rs []PortRange) []nftables.SetElement {
	elems := make([]nftables.SetElement, 0, 2*len(rs)+1)
	if rs[0].First != 0 {
		elems = append(elems, nftables.SetElement{Key: be16(0), IntervalEnd: true})
	}
	for _, r := range rs {
		open := r.Last == 0xffff
		elems = append(elems, nftables.SetElement{Key: be16(r.First), IntervalOpen: open})
		if !open {
			elems = append(elems, nftables.SetElement{Key: be16(r.Last + 1), IntervalEnd: true})
		}
	}
	return elems
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func verdictExpr(v Verdict) *expr.Verdict {
	e := &expr.Verdict{Chain: v.Chain}
	switch v.Kind {
	case Accept:
		e.Kind = expr.VerdictAccept
	case Drop:
		e.Kind = expr.VerdictDrop
	case Return:
		e.Kind = expr.VerdictReturn
	case Jump:
		e.Kind = expr.VerdictJump
	case Goto:
		e.Kind = expr.VerdictGoto
	default:
		e.Kind = expr.VerdictContinue
	}
	return e
}

func nfproto(f Family) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if f == IPv6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// anonSet queues a constant anonymous set (as nft does for "{ ... }" in a
// rule) and returns the lookup expression that uses it.
func (b *batch) anonSet(key nftables.SetDatatype, interval bool, elems []nftables.SetElement) (expr.Any, error) {
	s := &nftables.Set{
		Table:     b.table,
		Anonymous: true,
		Constant:  true,
		Interval:  interval,
		AutoMerge: interval,
		KeyType:   key,
	}
	if interval && len(elems) > 0 && elems[len(elems)-1].IntervalOpen {
		// nft declares the size of an anonymous interval set before it
		// drops the end element of a range that runs to the last value,
		// so the size is one more than the elements sent. AddSet writes
		// the element count for a constant set; a second NFTA_SET_DESC
		// with Size follows it, and the kernel keeps the last one.
		s.Size = uint32(len(elems) + 1)
	}
	if err := b.c.AddSet(s, elems); err != nil {
		return nil, fmt.Errorf("encoding anonymous set: %w", err)
	}
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}, nil
}

// wordsExprs loads a KeyWords key as nft does for a concatenation of raw
// payloads: word i into 32-bit register i (the first one named as the
// 128-bit register 1, which starts there), then masks the last word.
func wordsExprs(l *Lookup) []expr.Any {
	bits := effectiveMask(l)
	n := words(bits)
	reg := func(i int) uint32 {
		if i == 0 {
			return unix.NFT_REG_1
		}
		return unix.NFT_REG32_00 + uint32(i)
	}
	es := make([]expr.Any, 0, n+1)
	for i := range n {
		es = append(es, &expr.Payload{
			DestRegister: reg(i), Base: expr.PayloadBaseNetworkHeader,
			Offset: uint32(wordsOffset(l.Family, l.Dst) + 4*i), Len: 4,
		})
	}
	if m, ok := lastWordMask(bits); ok {
		es = append(es, &expr.Bitwise{
			SourceRegister: reg(n - 1), DestRegister: reg(n - 1), Len: 4,
			Mask: binary.BigEndian.AppendUint32(nil, m), Xor: make([]byte, 4),
		})
	}
	return es
}

// Conntrack state bits (NF_CT_STATE_BIT: 1 << ctinfo, established 0 and
// related 1 after the invalid bit), as ct state expressions load them.
const (
	ctStateEstablished = 1 << 1
	ctStateRelated     = 1 << 2
)

// ruleExprs translates one rule into the expressions nft generates for
// appendRule's text, statement by statement.
func (b *batch) ruleExprs(r *Rule) ([]expr.Any, error) {
	var es []expr.Any
	if r.Iif != "" {
		idx, ok := b.ifindex[r.Iif]
		if !ok {
			return nil, fmt.Errorf("interface %q not resolved", r.Iif)
		}
		es = append(es,
			&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(idx)})
	}
	if r.Family != FamilyAny && (r.Lookup == nil || r.Lookup.Key != KeyAddress) {
		es = append(es, nfproto(r.Family)...)
	}
	if r.Proto != 0 {
		es = append(es, l4proto(byte(r.Proto))...)
		if len(r.Ports) > 0 {
			es = append(es, &expr.Payload{
				DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2,
			})
			rs := canonicalPorts(r.Ports)
			switch {
			case len(rs) == 1 && rs[0].First == rs[0].Last:
				es = append(es, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(rs[0].First)})
			case len(rs) == 1:
				es = append(es,
					&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: be16(rs[0].First)},
					&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: be16(rs[0].Last)})
			default:
				interval := false
				for _, pr := range rs {
					interval = interval || pr.First != pr.Last
				}
				var elems []nftables.SetElement
				if interval {
					elems = portIntervalElems(rs)
				} else {
					for _, pr := range rs {
						elems = append(elems, nftables.SetElement{Key: be16(pr.First)})
					}
				}
				lookup, err := b.anonSet(nftables.TypeInetService, interval, elems)
				if err != nil {
					return nil, err
				}
				es = append(es, lookup)
			}
		}
	}
	if r.Known {
		// ct state established,related: the state bits, masked.
		es = append(es,
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ctStateEstablished | ctStateRelated), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	if r.NDP {
		es = append(es, l4proto(unix.IPPROTO_ICMPV6)...)
		es = append(es, &expr.Payload{
			DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1,
		})
		elems := make([]nftables.SetElement, len(ndpTypes))
		for i, t := range ndpTypes {
			elems[i].Key = []byte{t.typ}
		}
		lookup, err := b.anonSet(nftables.TypeICMP6Type, false, elems)
		if err != nil {
			return nil, err
		}
		es = append(es, lookup)
	}
	if l := r.Lookup; l != nil {
		s, ok := b.sets[l.Set]
		if !ok {
			// Validate rejects this; the kernel would too. Reference the
			// name anyway so that a test can check the kernel's answer.
			s = &nftables.Set{Name: l.Set}
		}
		switch l.Key {
		case KeyWords:
			es = append(es, wordsExprs(l)...)
		case KeyHalf:
			es = append(es, &expr.Payload{
				DestRegister: 1, Base: expr.PayloadBaseNetworkHeader,
				Offset: uint32(wordsOffset(l.Family, l.Dst)), Len: halfBits / 8,
			})
		default:
			es = append(es, nfproto(l.Family)...)
			offset, size := uint32(wordsOffset(l.Family, l.Dst)), uint32(4) // ip saddr/daddr
			if l.Family == IPv6 {
				size = 16 // ip6 saddr/daddr
			}
			es = append(es, &expr.Payload{
				DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size,
			})
			if m, ok := lookupMask(l); ok {
				es = append(es, &expr.Bitwise{
					SourceRegister: 1, DestRegister: 1, Len: size,
					Mask: m.AsSlice(), Xor: make([]byte, size),
				})
			}
		}
		es = append(es, &expr.Lookup{
			SourceRegister: 1, SetName: s.Name, SetID: s.ID,
			IsDestRegSet: l.IsMap, DestRegister: 0,
		})
	}
	if r.Counter {
		es = append(es, &expr.Counter{})
	}
	switch r.Reject {
	case RejectTCPReset:
		es = append(es, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	case RejectAdminProhibited:
		es = append(es, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	}
	if r.Verdict.Kind != Continue {
		es = append(es, verdictExpr(r.Verdict))
	}
	return es, nil
}
