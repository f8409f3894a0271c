package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/plan"
)

// Byte-level tests of the messages Apply, Updater and Flush send, against
// fakeKernel (wire_test.go): no root, no kernel. Each test pins the whole
// exchange with a golden file (testdata/*.wire, rewritten by go test
// -update) and states the properties that matter in code as well, so
// that a golden file rewritten without a look still fails them.

// wireProgram is small and has one of each thing whose encoding matters:
// a verdict map with jump, goto and drop; an interval set; a hash set
// with timeouts; a base chain; a rule with an anonymous set.
func wireProgram() *Program {
	return &Program{
		Table: "ipfence",
		Sets: []*Set{
			{Name: "v4_16", Family: IPv4, KeyBits: 16, IsMap: true, Elems: ElemsOf(
				Elem{Key: pfx("10.1.0.0/16"), Verdict: Verdict{Kind: Drop}},
				Elem{Key: pfx("10.2.0.0/16"), Verdict: Verdict{Kind: Jump, Chain: "v4_10_2"}},
				Elem{Key: pfx("172.16.0.0/16"), Verdict: Verdict{Kind: Goto, Chain: "v4_10_2"}},
			)},
			{Name: "allow6", Family: IPv6, Interval: true, Comment: "allowlist", Elems: ElemsOf(
				Elem{Key: pfx("2001:db8:ffff::/48")},
			)},
			{Name: "ban4", Family: IPv4, KeyBits: 32, Timeout: true, Elems: ElemsOf(
				Elem{Key: pfx("198.51.100.20/32"), Timeout: time.Hour},
				Elem{Key: pfx("198.51.100.21/32")},
			)},
		},
		Chains: []*Chain{
			{Name: "v4_10_2", Rules: []Rule{{Counter: true, Verdict: Verdict{Kind: Drop}}}},
			{Name: "blocked", Rules: []Rule{{Counter: true, Reject: RejectAdminProhibited}}},
			{Name: "pre", Hook: &Hook{Priority: -300}, Rules: []Rule{
				{Proto: ProtoTCP, Ports: []PortRange{{22, 22}, {443, 443}}, Verdict: Verdict{Kind: Accept}},
				{Lookup: &Lookup{Family: IPv6, Set: "allow6"}, Verdict: Verdict{Kind: Accept}},
				{Lookup: &Lookup{Family: IPv4, Set: "ban4"}, Verdict: Verdict{Kind: Goto, Chain: "blocked"}},
				{Lookup: &Lookup{Family: IPv4, MaskBits: 16, Set: "v4_16", IsMap: true}, Comment: "v4 blocklist"},
				{Counter: true, Verdict: Verdict{Kind: Accept}},
			}},
		},
	}
}

func TestApplyWire(t *testing.T) {
	k := newFakeKernel(t)
	res, err := Apply(context.Background(), wireProgram(), ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.GenID != k.gen {
		t.Errorf("ApplyResult.GenID = %d, want %d", res.GenID, k.gen)
	}
	golden(t, "apply.wire", dumpSends(t, k.sends))

	// The generation is read first, then the table (its mark), then
	// everything goes in one batch checked against the generation.
	if len(k.sends) != 3 || kinds(decodeMessages(t, []netlink.Message{k.sends[0][0], k.sends[1][0]})) != "GETGEN GETTABLE" {
		t.Fatalf("%d sends, want NFT_MSG_GETGEN, NFT_MSG_GETTABLE, then one batch", len(k.sends))
	}
	ms := k.oneBatch(t)
	for _, i := range []int{0, len(ms) - 1} {
		if a := attrAt(ms[i].attrs, unix.NFNL_BATCH_GENID); a == nil || !slices.Equal(a.value, be32(k.gen)) {
			t.Errorf("%s does not carry generation %d", typeName(ms[i].typ), k.gen)
		}
	}
	// The order of `nft -f`: the table added, deleted and added again,
	// chains, sets each with its elements, then rules, each after the
	// anonymous set it uses.
	checkOutline(t, ms, `BATCH_BEGIN NEWTABLE DELTABLE NEWTABLE
		NEWCHAIN NEWCHAIN NEWCHAIN
		NEWSET NEWSETELEM NEWSET NEWSETELEM NEWSET NEWSETELEM
		NEWRULE NEWRULE
		NEWSET NEWSETELEM NEWRULE
		NEWRULE NEWRULE NEWRULE NEWRULE
		BATCH_END`)
	for _, m := range ms[1 : len(ms)-1] {
		if m.flags&netlink.Request == 0 || m.nfgen[0] != unix.NFPROTO_INET {
			t.Errorf("%s: flags %s, family %d: want a request for the inet family", typeName(m.typ), flagNames(m.typ, m.flags), m.nfgen[0])
		}
	}
	// The table created carries ipfence's mark; the one added to be
	// deleted does not need to.
	checkAttr(t, "table mark", ms[3].attrs, markUserdata(), nftaTableUserData)
	if attrAt(ms[1].attrs, nftaTableUserData) != nil {
		t.Error("the table added before the delete carries userdata")
	}

	pre := find(ms, unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_NAME, "pre")
	if len(pre) != 1 {
		t.Fatalf("%d NEWCHAIN messages for pre", len(pre))
	}
	checkAttr(t, "pre hook", pre[0].attrs, be32(unix.NF_INET_PRE_ROUTING), unix.NFTA_CHAIN_HOOK, unix.NFTA_HOOK_HOOKNUM)
	checkAttr(t, "pre priority", pre[0].attrs, be32(uint32(0xffffffff-300+1)), unix.NFTA_CHAIN_HOOK, unix.NFTA_HOOK_PRIORITY)
	checkAttr(t, "pre policy", pre[0].attrs, be32(nfAccept), unix.NFTA_CHAIN_POLICY)
	checkAttr(t, "pre type", pre[0].attrs, []byte("filter\x00"), unix.NFTA_CHAIN_TYPE)
	for _, name := range []string{"v4_10_2", "blocked"} {
		if c := find(ms, unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_NAME, name); len(c) != 1 || attrAt(c[0].attrs, unix.NFTA_CHAIN_HOOK) != nil {
			t.Errorf("chain %s: want one NEWCHAIN without a hook", name)
		}
	}

	ban := find(ms, unix.NFT_MSG_NEWSET, unix.NFTA_SET_NAME, "ban4")
	if len(ban) != 1 {
		t.Fatalf("%d NEWSET messages for ban4", len(ban))
	}
	checkAttr(t, "ban4 flags", ban[0].attrs, be32(unix.NFT_SET_TIMEOUT), unix.NFTA_SET_FLAGS)
	checkAttr(t, "ban4 gc-interval", ban[0].attrs, be32(uint32(GCInterval.Milliseconds())), unix.NFTA_SET_GC_INTERVAL)
	checkAttr(t, "ban4 key type", ban[0].attrs, be32(7), unix.NFTA_SET_KEY_TYPE) // ipv4_addr
	elems := setElems(t, ms, unix.NFT_MSG_NEWSETELEM, "ban4")
	checkElems(t, "ban4", elems, []wantElem{
		{key: "198.51.100.20", timeout: time.Hour},
		{key: "198.51.100.21"},
	})

	checkAttr(t, "v4_16 flags", find(ms, unix.NFT_MSG_NEWSET, unix.NFTA_SET_NAME, "v4_16")[0].attrs,
		be32(unix.NFT_SET_MAP), unix.NFTA_SET_FLAGS)
	checkElems(t, "v4_16", setElems(t, ms, unix.NFT_MSG_NEWSETELEM, "v4_16"), []wantElem{
		{key: "10.1.0.0", verdict: nfDrop},
		{key: "10.2.0.0", verdict: unix.NFT_JUMP, chain: "v4_10_2"},
		{key: "172.16.0.0", verdict: unix.NFT_GOTO, chain: "v4_10_2"},
	})

	checkAttr(t, "allow6 flags", find(ms, unix.NFT_MSG_NEWSET, unix.NFTA_SET_NAME, "allow6")[0].attrs,
		be32(unix.NFT_SET_INTERVAL), unix.NFTA_SET_FLAGS)
	// An interval is a start and an end flagged at last+1, after the
	// end at :: that nft puts before a first interval not starting there.
	checkElems(t, "allow6", setElems(t, ms, unix.NFT_MSG_NEWSETELEM, "allow6"), []wantElem{
		{key: "::", end: true},
		{key: "2001:db8:ffff::"},
		{key: "2001:db9::", end: true},
	})
}

// checkOutline compares the message types of ms with want (short names,
// any spacing).
func checkOutline(t *testing.T, ms []wireMessage, want string) {
	t.Helper()
	if got, want := kinds(ms), strings.Join(strings.Fields(want), " "); got != want {
		t.Errorf("messages:\n got  %s\n want %s", got, want)
	}
}

// checkAttr checks the value of the attribute at path.
func checkAttr(t *testing.T, what string, attrs []wireAttr, want []byte, path ...uint16) {
	t.Helper()
	a := attrAt(attrs, path...)
	switch {
	case a == nil:
		t.Errorf("%s: no attribute %v", what, path)
	case !slices.Equal(a.value, want):
		t.Errorf("%s: % x, want % x", what, a.value, want)
	}
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// setElems returns the elements of set name in the messages of type typ,
// in the order sent.
func setElems(t *testing.T, ms []wireMessage, typ int, name string) []wireAttr {
	t.Helper()
	var out []wireAttr
	for _, m := range find(ms, typ, unix.NFTA_SET_ELEM_LIST_SET, name) {
		list := attrAt(m.attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		if list == nil {
			t.Fatalf("%s of set %s without elements", typeName(m.typ), name)
		}
		out = append(out, list.nested...)
	}
	return out
}

// wantElem is what an element says: its key, flags, timeout, verdict.
type wantElem struct {
	key     string // an address
	end     bool   // NFT_SET_ELEM_INTERVAL_END
	timeout time.Duration
	verdict int32 // with chain, for a map; 0 is drop
	chain   string
}

func checkElems(t *testing.T, set string, got []wireAttr, want []wantElem) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("set %s: %d elements sent, want %d", set, len(got), len(want))
	}
	for i, w := range want {
		what := set + " element " + w.key
		e := got[i].nested
		checkAttr(t, what+" key", e, netip.MustParseAddr(w.key).AsSlice(), unix.NFTA_SET_ELEM_KEY, unix.NFTA_DATA_VALUE)
		if w.end {
			checkAttr(t, what+" flags", e, be32(unix.NFT_SET_ELEM_INTERVAL_END), unix.NFTA_SET_ELEM_FLAGS)
		} else if a := attrAt(e, unix.NFTA_SET_ELEM_FLAGS); a != nil && !slices.Equal(a.value, be32(0)) {
			t.Errorf("%s: flags % x, want none", what, a.value)
		}
		if w.timeout != 0 {
			checkAttr(t, what+" timeout", e, binary.BigEndian.AppendUint64(nil, uint64(w.timeout.Milliseconds())), unix.NFTA_SET_ELEM_TIMEOUT)
		} else if attrAt(e, unix.NFTA_SET_ELEM_TIMEOUT) != nil {
			t.Errorf("%s: a timeout, want none", what)
		}
		if w.verdict != 0 || w.chain != "" || attrAt(e, unix.NFTA_SET_ELEM_DATA) != nil {
			checkAttr(t, what+" verdict", e, be32(uint32(w.verdict)), unix.NFTA_SET_ELEM_DATA, unix.NFTA_DATA_VERDICT, unix.NFTA_VERDICT_CODE)
		}
		if w.chain != "" {
			checkAttr(t, what+" chain", e, []byte(w.chain+"\x00"), unix.NFTA_SET_ELEM_DATA, unix.NFTA_DATA_VERDICT, unix.NFTA_VERDICT_CHAIN)
		}
	}
}

// TestApplyWireShapes pins the bytes of every rule shape and kind of set
// (shapesProgram, less its iif rule: resolving an interface needs a
// namespace), and that the whole table is one batch.
func TestApplyWireShapes(t *testing.T) {
	k := newFakeKernel(t)
	p := shapesProgram()
	pre := chainOf(p, "pre")
	pre.Rules = slices.DeleteFunc(pre.Rules, func(r Rule) bool { return r.Iif != "" })
	res, err := Apply(context.Background(), p, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "shapes.wire", dumpSends(t, k.sends))
	ms := k.oneBatch(t)
	count := func(typ int) int {
		n := 0
		for _, m := range ms {
			if m.typ == nftType(typ) {
				n++
			}
		}
		return n
	}
	if got := count(unix.NFT_MSG_NEWRULE); got != res.Rules {
		t.Errorf("%d NEWRULE messages for %d rules", got, res.Rules)
	}
	if got := count(unix.NFT_MSG_NEWCHAIN); got != len(p.Chains) {
		t.Errorf("%d NEWCHAIN messages for %d chains", got, len(p.Chains))
	}
	if got, named := count(unix.NFT_MSG_NEWSET), len(p.Sets); got <= named {
		t.Errorf("%d NEWSET messages for %d named sets and some anonymous ones", got, named)
	}
}

// TestApplyWireConcurrentChange: when the kernel refuses the batch for
// its generation (ERESTART on the batch begin), Apply reads the new one
// and says so.
func TestApplyWireConcurrentChange(t *testing.T) {
	k := newFakeKernel(t)
	k.answer = func(req []netlink.Message) []netlink.Message {
		if req[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN {
			return nil
		}
		k.gen++
		out, _ := nltest.Error(int(unix.ERESTART), req)
		return out
	}
	_, err := Apply(context.Background(), wireProgram(), ApplyOptions{})
	var ce *ConcurrentChangeError
	if !errors.As(err, &ce) {
		t.Fatalf("Apply: %v, want a *ConcurrentChangeError", err)
	}
	if ce.GenID != 42 || ce.Now != 43 {
		t.Errorf("generations %d, now %d; want 42, now 43", ce.GenID, ce.Now)
	}
	if len(k.sends) != 4 {
		t.Fatalf("%d sends, want the generation and table read, the batch, the generation read again", len(k.sends))
	}
	if got := kinds(decodeMessages(t, []netlink.Message{k.sends[0][0], k.sends[3][0]})); got != "GETGEN GETGEN" {
		t.Errorf("before and after the batch: %s, want GETGEN GETGEN", got)
	}
}

// TestApplyWireRejected: the kernel's error for one message of the batch
// names that message, and the errno is kept for errors.Is.
func TestApplyWireRejected(t *testing.T) {
	k := newFakeKernel(t)
	k.answer = rejectWith(unix.ENOENT, unix.NFT_MSG_NEWSETELEM, unix.NFTA_SET_ELEM_LIST_SET, "v4_16")
	_, err := Apply(context.Background(), wireProgram(), ApplyOptions{})
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("Apply: %v, want ENOENT", err)
	}
	for _, s := range []string{"NFT_MSG_NEWSETELEM", "refers to a set or chain that does not exist", "nothing was changed"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// TestFlushWire: Flush reads the generation and the table, then deletes
// it in one batch checked against that generation; a missing table is
// no error and sends no batch, and the kernel's ENOENT means there was
// none. A table without ipfence's mark is refused unless adopted.
func TestFlushWire(t *testing.T) {
	k := newFakeKernel(t)
	existed, err := Flush(context.Background(), "ipfence", ApplyOptions{})
	if err != nil || !existed {
		t.Fatalf("Flush: %v, %v; want true, nil", existed, err)
	}
	if got := kinds(decodeMessages(t, []netlink.Message{k.sends[0][0], k.sends[1][0]})); got != "GETGEN GETTABLE" {
		t.Errorf("before the batch: %s, want GETGEN GETTABLE", got)
	}
	ms := k.oneBatch(t)
	checkOutline(t, ms, "BATCH_BEGIN DELTABLE BATCH_END")
	checkAttr(t, "table", ms[1].attrs, []byte("ipfence\x00"), unix.NFTA_TABLE_NAME)
	if ms[1].nfgen[0] != unix.NFPROTO_INET {
		t.Errorf("family %d, want inet", ms[1].nfgen[0])
	}
	if a := attrAt(ms[0].attrs, unix.NFNL_BATCH_GENID); a == nil || !slices.Equal(a.value, be32(k.gen)) {
		t.Errorf("the batch does not carry generation %d", k.gen)
	}

	k.answer = rejectWith(unix.ENOENT, unix.NFT_MSG_DELTABLE, unix.NFTA_TABLE_NAME, "ipfence")
	existed, err = Flush(context.Background(), "ipfence", ApplyOptions{})
	if err != nil || existed {
		t.Errorf("Flush of a table deleted meanwhile: %v, %v; want false, nil", existed, err)
	}
	k.answer = nil

	k.sends = nil
	existed, err = Flush(context.Background(), "other", ApplyOptions{})
	if err != nil || existed || len(k.batches(t)) != 0 {
		t.Errorf("Flush of a missing table: %v, %v, %d batches; want false, nil, none", existed, err, len(k.batches(t)))
	}

	k.tables["other"] = nil
	_, err = Flush(context.Background(), "other", ApplyOptions{})
	if !errors.Is(err, ErrNotOwned) || len(k.batches(t)) != 0 {
		t.Errorf("Flush of a table without the mark: %v, %d batches; want ErrNotOwned, none", err, len(k.batches(t)))
	}
	existed, err = Flush(context.Background(), "other", ApplyOptions{Adopt: true})
	if err != nil || !existed || len(k.batches(t)) != 1 {
		t.Errorf("Flush of a table adopted: %v, %v, %d batches; want true, nil, one", existed, err, len(k.batches(t)))
	}
}

// TestApplyWireNotOwned: Apply and an Update that changes objects refuse
// a table without ipfence's mark before they send a batch; an Update of
// elements alone does not read the table.
func TestApplyWireNotOwned(t *testing.T) {
	k := newFakeKernel(t)
	k.tables["ipfence"] = userdata.AppendString(nil, userdata.TypeComment, "someone else's")
	if _, err := Apply(context.Background(), wireProgram(), ApplyOptions{}); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Apply: %v, want ErrNotOwned", err)
	}
	u := &Update{Table: "ipfence", DelSets: []string{"allow6"}}
	if _, err := ApplyUpdate(context.Background(), u, ApplyOptions{}); !errors.Is(err, ErrNotOwned) {
		t.Errorf("ApplyUpdate deleting a set: %v, want ErrNotOwned", err)
	}
	if n := len(k.batches(t)); n != 0 {
		t.Fatalf("%d batches sent to a table without the mark", n)
	}
	k.sends = nil
	bans := &Update{Table: "ipfence", Sets: []SetChange{{Set: BanSets()[0], Add: []Elem{{Key: pfx("198.51.100.7/32")}}}}}
	if _, err := ApplyUpdate(context.Background(), bans, ApplyOptions{}); err != nil {
		t.Errorf("ApplyUpdate of elements: %v", err)
	}
	if got := kinds(decodeMessages(t, slices.Concat(k.sends...))); strings.Contains(got, "GETTABLE") {
		t.Errorf("an update of elements alone sent %s", got)
	}
	if _, err := Apply(context.Background(), wireProgram(), ApplyOptions{Adopt: true}); err != nil {
		t.Errorf("Apply adopting the table: %v", err)
	}
}

// TestUpdaterBansWire sends two ban updates over one Updater, as the ban
// controller does when the ban sets' presence changes: each reads the
// table (it rewrites the base chain, so the table must have ipfence's
// mark) and sends one batch with no generation check, the elements with
// their timeouts in milliseconds, deletes by key alone
// (NFT_MSG_DESTROYSETELEM: an absent element is no error), and the base
// chain rewritten (flushed, its rules added again) in the same batch.
func TestUpdaterBansWire(t *testing.T) {
	k := newFakeKernel(t)
	up, err := NewUpdater(ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	sets := BanSets()
	heads := []RuleHead{{Name: "block", Action: plan.Drop, V4: true, Stateless: true}}
	updates := []*Update{
		{Table: "ipfence", Sets: []SetChange{
			{Set: sets[0], Add: []Elem{{Key: pfx("198.51.100.7/32"), Timeout: 10 * time.Minute}}},
			{Set: sets[2], Add: []Elem{{Key: pfx("203.0.113.0/24"), Timeout: 2 * time.Hour}}},
		}, Chains: []*Chain{BaseChain(heads, -300, Presence{Bans: [4]bool{true, false, true}})}},
		// The address's ban extended (deleted, added with its new
		// timeout), another address banned, the prefix unbanned.
		{Table: "ipfence", Sets: []SetChange{
			{Set: sets[0], Del: []Elem{{Key: pfx("198.51.100.7/32")}}, Add: []Elem{
				{Key: pfx("198.51.100.7/32"), Timeout: time.Hour},
				{Key: pfx("198.51.100.8/32"), Timeout: 1500 * time.Millisecond},
			}},
			{Set: sets[2], Del: []Elem{{Key: pfx("203.0.113.0/24")}}},
		}, Chains: []*Chain{BaseChain(heads, -300, Presence{Bans: [4]bool{true}})}},
	}
	wantRes := []UpdateResult{{Added: 2, Rules: 3}, {Added: 2, Deleted: 2, Rules: 2}}
	for i, u := range updates {
		res, err := up.Apply(context.Background(), u)
		if err != nil {
			t.Fatalf("update %d: %v", i+1, err)
		}
		res.Flush = 0
		if res != wantRes[i] {
			t.Errorf("update %d: %+v, want %+v", i+1, res, wantRes[i])
		}
	}
	golden(t, "bans.wire", dumpSends(t, k.sends))

	bs := k.batches(t)
	if len(k.sends) != 4 || len(bs) != 2 {
		t.Fatalf("%d sends, %d of them batches: want a table read and a batch per update and nothing else", len(k.sends), len(bs))
	}
	if got := kinds(decodeMessages(t, []netlink.Message{k.sends[0][0], k.sends[2][0]})); got != "GETTABLE GETTABLE" {
		t.Errorf("before the batches: %s, want GETTABLE GETTABLE", got)
	}
	first, second := decodeMessages(t, bs[0]), decodeMessages(t, bs[1])
	for _, ms := range [][]wireMessage{first, second} {
		if attrAt(ms[0].attrs, unix.NFNL_BATCH_GENID) != nil {
			t.Error("an update checks a generation it never read")
		}
	}
	checkOutline(t, first, "BATCH_BEGIN DELRULE NEWSETELEM NEWSETELEM NEWRULE NEWRULE NEWRULE BATCH_END")
	checkAttr(t, "flushed chain", first[1].attrs, []byte(BaseChainName+"\x00"), unix.NFTA_RULE_CHAIN)
	if attrAt(first[1].attrs, unix.NFTA_RULE_HANDLE) != nil {
		t.Error("the base chain's flush names one rule")
	}
	checkElems(t, BanAddrs4, setElems(t, first, unix.NFT_MSG_NEWSETELEM, BanAddrs4), []wantElem{
		{key: "198.51.100.7", timeout: 10 * time.Minute},
	})
	// The interval-end element at 0.0.0.0 comes with any add to an
	// interval set (see SetChange.After).
	checkElems(t, BanNets4, setElems(t, first, unix.NFT_MSG_NEWSETELEM, BanNets4), []wantElem{
		{key: "0.0.0.0", end: true},
		{key: "203.0.113.0", timeout: 2 * time.Hour},
		{key: "203.0.114.0", end: true},
	})

	checkOutline(t, second, "BATCH_BEGIN DELRULE DESTROYSETELEM NEWSETELEM DESTROYSETELEM NEWRULE NEWRULE BATCH_END")
	checkElems(t, BanAddrs4, setElems(t, second, msgDestroySetElem, BanAddrs4), []wantElem{{key: "198.51.100.7"}})
	checkElems(t, BanAddrs4, setElems(t, second, unix.NFT_MSG_NEWSETELEM, BanAddrs4), []wantElem{
		{key: "198.51.100.7", timeout: time.Hour},
		{key: "198.51.100.8", timeout: 1500 * time.Millisecond},
	})
	checkElems(t, BanNets4, setElems(t, second, msgDestroySetElem, BanNets4), []wantElem{
		{key: "203.0.113.0"},
		{key: "203.0.114.0", end: true},
	})
}

// TestApplyUpdateDiffWire sends what Diff makes of a change to
// wireProgram touching every kind of object, and checks the order
// documented on Update, in one batch.
func TestApplyUpdateDiffWire(t *testing.T) {
	k := newFakeKernel(t)
	cur, next := wireProgram(), wireProgram()
	setOf(next, "v4_16").Elems = ElemsOf(
		Elem{Key: pfx("10.1.0.0/16"), Verdict: Verdict{Kind: Drop}},
		Elem{Key: pfx("10.2.0.0/16"), Verdict: Verdict{Kind: Jump, Chain: "v4_10_2"}},
		Elem{Key: pfx("10.3.0.0/16"), Verdict: Verdict{Kind: Accept}},
	)
	next.Sets = append(next.Sets, &Set{Name: "v4_10_2_24", Family: IPv4, KeyBits: 24, IsMap: true, Elems: ElemsOf(
		Elem{Key: pfx("10.2.3.0/24"), Verdict: Verdict{Kind: Drop}},
	)})
	chainOf(next, "v4_10_2").Rules = []Rule{{Lookup: &Lookup{Family: IPv4, MaskBits: 24, Set: "v4_10_2_24", IsMap: true}}}
	dropSet(next, "allow6")
	dropChain(next, "blocked")
	next.Chains = append(next.Chains, &Chain{Name: "services", Rules: []Rule{{Verdict: Verdict{Kind: Accept}}}})
	chainOf(next, "pre").Rules = []Rule{
		{Proto: ProtoTCP, Ports: []PortRange{{22, 22}}, Verdict: Verdict{Kind: Jump, Chain: "services"}},
		{Lookup: &Lookup{Family: IPv4, Set: "ban4"}, Verdict: Verdict{Kind: Drop}},
		{Lookup: &Lookup{Family: IPv4, MaskBits: 16, Set: "v4_16", IsMap: true}},
	}
	u, err := Diff(cur, next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyUpdate(context.Background(), u, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	golden(t, "diff.wire", dumpSends(t, k.sends))
	if len(k.sends) != 2 {
		t.Errorf("%d sends, want the table read and one batch", len(k.sends))
	}
	ms := k.oneBatch(t)
	// 1. new chains; 2. replaced and deleted chains flushed; 3. sets
	// deleted; 4. sets created; 5. element changes; 6. rules; 7. chains
	// deleted.
	checkOutline(t, ms, `BATCH_BEGIN
		NEWCHAIN
		DELRULE DELRULE DELRULE
		DELSET
		NEWSET NEWSETELEM
		DESTROYSETELEM NEWSETELEM
		NEWRULE
		NEWRULE NEWRULE NEWRULE
		NEWRULE
		DELCHAIN
		BATCH_END`)
}

// TestStatusWire reads a table back through Status from a fake kernel
// that answers its gets and dumps with the messages an Apply of
// wireProgram sent (the kernel's answers carry more: handles, use
// counts), in the order they were created: it pins how Status decodes
// chains, hooks, rules' comments and counters, and sets, and which
// requests it makes.
func TestStatusWire(t *testing.T) {
	k := newFakeKernel(t)
	if _, err := Apply(context.Background(), wireProgram(), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	loaded := k.batches(t)[0]
	k.sends = nil
	k.answer = func(req []netlink.Message) []netlink.Message {
		var out []netlink.Message
		for _, m := range loaded {
			if m.Header.Type != req[0].Header.Type-1 { // NFT_MSG_GETx follows NFT_MSG_NEWx
				continue
			}
			if req[0].Header.Type == nftType(unix.NFT_MSG_GETRULE) && !sameAttr(m, req[0], unix.NFTA_RULE_CHAIN) {
				continue
			}
			m.Header.Flags, m.Header.Sequence, m.Header.PID = 0, req[0].Header.Sequence, nltest.PID
			out = append(out, m)
		}
		if req[0].Header.Type == nftType(unix.NFT_MSG_GETTABLE) {
			out = out[len(out)-1:] // the table as the last NEWTABLE left it
		}
		if req[0].Header.Flags&netlink.Dump == 0 || len(out) == 0 {
			return out
		}
		out = append(out, netlink.Message{Header: netlink.Header{Type: netlink.Done, Sequence: req[0].Header.Sequence, PID: nltest.PID}, Data: make([]byte, 4)})
		out, _ = nltest.Multipart(out)
		return out
	}
	st, err := Status(context.Background(), "ipfence", "")
	if err != nil {
		t.Fatal(err)
	}
	counted := []RuleStatus{{HasCounter: true}}
	want := TableStatus{
		Table: "ipfence", Exists: true, Marked: true, GenID: k.gen,
		Chains: []ChainStatus{
			{Name: "v4_10_2", Rules: counted},
			{Name: "blocked", Rules: counted},
			{Name: "pre", Hook: "prerouting", Priority: -300, Rules: []RuleStatus{{}, {}, {}, {Comment: "v4 blocklist"}, {HasCounter: true}}},
		},
		Sets: []SetStatus{
			{Name: "v4_16", Family: IPv4, IsMap: true, Size: 16},
			{Name: "allow6", Family: IPv6, Flags: []string{"interval"}, Comment: "allowlist"},
			{Name: "ban4", Family: IPv4, Flags: []string{"timeout"}},
		},
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("Status:\n got  %+v\n want %+v", st, want)
	}
	got := kinds(decodeMessages(t, slices.Concat(k.sends...)))
	if want := "GETGEN GETTABLE GETCHAIN GETRULE GETRULE GETRULE GETSET"; got != want {
		t.Errorf("requests %s, want %s", got, want)
	}
}

// sameAttr reports whether messages a and b have attribute typ, the same.
func sameAttr(a, b netlink.Message, typ uint16) bool {
	wa, erra := decodeMessage(a)
	wb, errb := decodeMessage(b)
	return erra == nil && errb == nil && wa.str(typ) != "" && wa.str(typ) == wb.str(typ)
}
