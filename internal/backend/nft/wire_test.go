package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// A fake kernel for byte-level tests of the netlink messages Apply,
// ApplyUpdate, Flush and Status send, as google/nftables tests its own
// (expectMessages in its nftables_test.go): the package's testDial hands
// every request to it instead of a netlink socket, so these tests need
// neither root nor a kernel. decodeMessage turns a message into a tree of
// attributes that the golden files (testdata/*.wire) show in full: every
// byte of a message after its netlink header is in them, so any change
// of encoding changes them.

// fakeKernel records the requests sent to it, one entry per send (a batch
// is one send), answers NFT_MSG_GETGEN with gen, and NFT_MSG_GETTABLE of
// one inet table from tables.
type fakeKernel struct {
	gen   uint32
	sends [][]netlink.Message
	// tables are the inet tables that exist, by name, with their
	// userdata: "ipfence", with ipfence's mark, unless a test changes it.
	tables map[string][]byte
	// answer, when set, answers a send in place of the default (no reply
	// but to NFT_MSG_GETGEN and NFT_MSG_GETTABLE); returning nil falls
	// back to the default.
	answer func(req []netlink.Message) []netlink.Message
}

// newFakeKernel makes every nftables connection dial opens talk to a new
// fakeKernel until t ends (not the sockets ifindexes and ReadSet open
// for themselves). Tests using it must not run in parallel.
func newFakeKernel(t *testing.T) *fakeKernel {
	t.Helper()
	k := &fakeKernel{gen: 42, tables: map[string][]byte{"ipfence": markUserdata()}}
	testDial = k.dial
	t.Cleanup(func() { testDial = nil })
	return k
}

func (k *fakeKernel) dial(req []netlink.Message) ([]netlink.Message, error) {
	if len(req) == 0 {
		return nil, nil // a receive with nothing left to read
	}
	k.sends = append(k.sends, req)
	if k.answer != nil {
		if out := k.answer(req); out != nil {
			return out, nil
		}
	}
	switch req[0].Header.Type {
	case nftType(unix.NFT_MSG_GETGEN):
		return []netlink.Message{{
			Header: netlink.Header{Type: nftType(unix.NFT_MSG_NEWGEN), Sequence: req[0].Header.Sequence},
			Data: append([]byte{unix.AF_UNSPEC, 0, 0, 0}, nltest.MustMarshalAttributes([]netlink.Attribute{
				{Type: unix.NFTA_GEN_ID, Data: binary.BigEndian.AppendUint32(nil, k.gen)},
			})...),
		}}, nil
	case nftType(unix.NFT_MSG_GETTABLE):
		return k.getTable(req[0]), nil
	}
	return nil, nil
}

// getTable answers a get of one inet table: the table from k.tables, or
// ENOENT.
func (k *fakeKernel) getTable(req netlink.Message) []netlink.Message {
	w, err := decodeMessage(req)
	ud, ok := k.tables[w.str(unix.NFTA_TABLE_NAME)]
	if err != nil || !ok || w.nfgen[0] != unix.NFPROTO_INET {
		out, _ := nltest.Error(int(unix.ENOENT), []netlink.Message{req})
		return out
	}
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_TABLE_NAME, Data: append([]byte(w.str(unix.NFTA_TABLE_NAME)), 0)},
		{Type: unix.NFTA_TABLE_FLAGS, Data: make([]byte, 4)},
	}
	if ud != nil {
		attrs = append(attrs, netlink.Attribute{Type: nftaTableUserData, Data: ud})
	}
	return []netlink.Message{{
		Header: netlink.Header{Type: nftType(unix.NFT_MSG_NEWTABLE), Sequence: req.Header.Sequence, PID: nltest.PID},
		Data:   append([]byte{unix.NFPROTO_INET, 0, 0, 0}, nltest.MustMarshalAttributes(attrs)...),
	}}
}

// batches returns the batches among the sends, failing t unless each is
// a whole batch: begin first, end last, neither in between.
func (k *fakeKernel) batches(t *testing.T) [][]netlink.Message {
	t.Helper()
	var out [][]netlink.Message
	for _, send := range k.sends {
		var begins, ends []int
		for i, m := range send {
			switch m.Header.Type {
			case unix.NFNL_MSG_BATCH_BEGIN:
				begins = append(begins, i)
			case unix.NFNL_MSG_BATCH_END:
				ends = append(ends, i)
			}
		}
		switch {
		case len(begins) == 0 && len(ends) == 0:
			continue
		case len(begins) != 1 || len(ends) != 1 || begins[0] != 0 || ends[0] != len(send)-1:
			t.Fatalf("a send of %d messages has batch begins at %v and ends at %v, want one begin first and one end last", len(send), begins, ends)
		}
		out = append(out, send)
	}
	return out
}

// oneBatch returns the only batch sent, failing t unless exactly one
// was: one Apply, one transaction.
func (k *fakeKernel) oneBatch(t *testing.T) []wireMessage {
	t.Helper()
	bs := k.batches(t)
	if len(bs) != 1 {
		t.Fatalf("%d batches sent, want 1", len(bs))
	}
	return decodeMessages(t, bs[0])
}

// nftType is the header type of nf_tables message m.
func nftType(m int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | m)
}

// rejectWith returns an answer that fails the first message of type typ
// whose name attribute (attr) is name with errno, as the kernel fails a
// batch: an error message for it, and nothing else.
func rejectWith(errno unix.Errno, typ int, attr uint16, name string) func([]netlink.Message) []netlink.Message {
	return func(req []netlink.Message) []netlink.Message {
		for _, m := range req {
			if m.Header.Type != nftType(typ) {
				continue
			}
			w, err := decodeMessage(m)
			if err == nil && w.str(attr) == name {
				out, _ := nltest.Error(int(errno), []netlink.Message{m})
				return out
			}
		}
		return nil
	}
}

// wireMessage is a netlink message as sent, its attributes decoded.
type wireMessage struct {
	typ    netlink.HeaderType
	flags  netlink.HeaderFlags
	nfgen  []byte // struct nfgenmsg: family, version, resource id
	attrs  []wireAttr
	schema attrSchema
}

// wireAttr is one attribute: its type with the nested and byte-order
// flags, and its value, or the attributes nested in it.
type wireAttr struct {
	typ    uint16
	value  []byte
	nested []wireAttr // when typ has NLA_F_NESTED and the value parses
}

func (a *wireAttr) kind() uint16 { return a.typ &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) }

// errLossy marks attribute bytes that do not parse back exactly (bad
// length, padding not zero): they are shown as raw bytes.
var errLossy = errors.New("attributes do not parse exactly")

// parseAttrs parses netlink attributes, nested ones too, such that the
// bytes are exactly those of the attributes' types and values with zero
// padding, or fails.
func parseAttrs(b []byte) ([]wireAttr, error) {
	var out []wireAttr
	for len(b) > 0 {
		if len(b) < unix.SizeofNlAttr {
			return nil, errLossy
		}
		n := int(binary.NativeEndian.Uint16(b))
		padded := (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if n < unix.SizeofNlAttr || padded > len(b) {
			return nil, errLossy
		}
		for _, p := range b[n:padded] {
			if p != 0 {
				return nil, errLossy
			}
		}
		a := wireAttr{typ: binary.NativeEndian.Uint16(b[2:]), value: b[unix.SizeofNlAttr:n]}
		if a.typ&unix.NLA_F_NESTED != 0 {
			if kids, err := parseAttrs(a.value); err == nil {
				a.nested = kids
			}
		}
		out = append(out, a)
		b = b[padded:]
	}
	return out, nil
}

func decodeMessage(m netlink.Message) (wireMessage, error) {
	w := wireMessage{typ: m.Header.Type, flags: m.Header.Flags}
	if len(m.Data) < 4 {
		return w, fmt.Errorf("message %s: %d bytes, no nfgenmsg", typeName(m.Header.Type), len(m.Data))
	}
	w.nfgen = m.Data[:4]
	attrs, err := parseAttrs(m.Data[4:])
	if err != nil {
		return w, fmt.Errorf("message %s: %w", typeName(m.Header.Type), err)
	}
	w.attrs = attrs
	w.schema = messageSchema(m.Header.Type)
	return w, nil
}

func decodeMessages(t *testing.T, ms []netlink.Message) []wireMessage {
	t.Helper()
	out := make([]wireMessage, len(ms))
	for i, m := range ms {
		w, err := decodeMessage(m)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		out[i] = w
	}
	return out
}

// attr returns the attribute at path (attribute types, without flags;
// the first of each type), nil when there is none.
func attrAt(attrs []wireAttr, path ...uint16) *wireAttr {
	for i := range attrs {
		if attrs[i].kind() != path[0] {
			continue
		}
		if len(path) == 1 {
			return &attrs[i]
		}
		return attrAt(attrs[i].nested, path[1:]...)
	}
	return nil
}

// str returns the NUL-terminated string attribute of type typ, "" when
// there is none.
func (w *wireMessage) str(typ uint16) string {
	a := attrAt(w.attrs, typ)
	if a == nil {
		return ""
	}
	return strings.TrimSuffix(string(a.value), "\x00")
}

// shortName is the message type without its prefix: NEWSETELEM,
// BATCH_BEGIN.
func (w *wireMessage) shortName() string {
	n := typeName(w.typ)
	_, short, _ := strings.Cut(n, "MSG_")
	return short
}

// kinds lists the short names of messages, as a transaction's outline.
func kinds(ms []wireMessage) string {
	names := make([]string, len(ms))
	for i := range ms {
		names[i] = ms[i].shortName()
	}
	return strings.Join(names, " ")
}

// find returns the messages of type typ whose attribute attr is name.
func find(ms []wireMessage, typ int, attr uint16, name string) []wireMessage {
	var out []wireMessage
	for _, m := range ms {
		if m.typ == nftType(typ) && m.str(attr) == name {
			out = append(out, m)
		}
	}
	return out
}

var nftMsgNames = [...]string{
	"NEWTABLE", "GETTABLE", "DELTABLE", "NEWCHAIN", "GETCHAIN", "DELCHAIN",
	"NEWRULE", "GETRULE", "DELRULE", "NEWSET", "GETSET", "DELSET",
	"NEWSETELEM", "GETSETELEM", "DELSETELEM", "NEWGEN", "GETGEN", "TRACE",
	"NEWOBJ", "GETOBJ", "DELOBJ", "GETOBJ_RESET", "NEWFLOWTABLE",
	"GETFLOWTABLE", "DELFLOWTABLE", "GETRULE_RESET", "DESTROYTABLE",
	"DESTROYCHAIN", "DESTROYRULE", "DESTROYSET", "DESTROYSETELEM",
}

func typeName(t netlink.HeaderType) string {
	switch t {
	case unix.NFNL_MSG_BATCH_BEGIN:
		return "NFNL_MSG_BATCH_BEGIN"
	case unix.NFNL_MSG_BATCH_END:
		return "NFNL_MSG_BATCH_END"
	}
	if t>>8 == unix.NFNL_SUBSYS_NFTABLES && int(t&0xff) < len(nftMsgNames) {
		return "NFT_MSG_" + nftMsgNames[t&0xff]
	}
	return fmt.Sprintf("type %#x", uint16(t))
}

// flagNames spells header flags; those above 0xff mean one thing in a
// request that creates or deletes and another in one that gets.
func flagNames(typ netlink.HeaderType, f netlink.HeaderFlags) string {
	names := []struct {
		bit  netlink.HeaderFlags
		name string
	}{{netlink.Request, "request"}, {netlink.Multi, "multi"}, {netlink.Acknowledge, "ack"}, {netlink.Echo, "echo"},
		{netlink.Replace, "replace"}, {netlink.Excl, "excl"}, {netlink.Create, "create"}, {netlink.Append, "append"}}
	if strings.Contains(typeName(typ), "_GET") {
		names[4].name, names[5].name = "root", "match"
	}
	var out []string
	for _, n := range names {
		if f&n.bit != 0 {
			out = append(out, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		out = append(out, fmt.Sprintf("%#x", uint16(f)))
	}
	return strings.Join(out, "|")
}

// dumpSends renders every send: message types and flags, nfgenmsg and
// every attribute's bytes, named where known. Sequence numbers and port
// ids are left out (they depend on the connection), and so is the
// netlink header's length (it follows from the bytes shown).
func dumpSends(t *testing.T, sends [][]netlink.Message) string {
	t.Helper()
	var b strings.Builder
	for i, send := range sends {
		fmt.Fprintf(&b, "send %d\n", i+1)
		for _, w := range decodeMessages(t, send) {
			fmt.Fprintf(&b, "  %s %s\n", typeName(w.typ), flagNames(w.typ, w.flags))
			fmt.Fprintf(&b, "    nfgenmsg %s\n", hexBytes(w.nfgen))
			dumpAttrs(&b, w.attrs, w.schema, nil, "    ")
		}
	}
	return b.String()
}

// dumpAttrs writes attrs, named by s, or all by list when it is not nil.
func dumpAttrs(b *strings.Builder, attrs []wireAttr, s attrSchema, list *attrField, indent string) {
	for _, a := range attrs {
		f, known := s[a.kind()]
		if list != nil {
			f, known = *list, true
		}
		name := f.name
		if !known {
			name = fmt.Sprint(a.kind())
		}
		fmt.Fprintf(b, "%s%s(%d", indent, name, a.kind())
		if a.typ&unix.NLA_F_NESTED != 0 {
			b.WriteString(",nested")
		}
		if a.typ&unix.NLA_F_NET_BYTEORDER != 0 {
			b.WriteString(",netorder")
		}
		b.WriteString(")")
		if a.nested != nil || (a.typ&unix.NLA_F_NESTED != 0 && len(a.value) == 0) {
			b.WriteString("\n")
			sub := f.sub
			if f.expr {
				sub = exprElemSchema(a.nested)
			}
			dumpAttrs(b, a.nested, sub, f.list, indent+"  ")
			continue
		}
		if len(a.value) > 0 {
			b.WriteString(" " + hexBytes(a.value))
		}
		if h := hint(f.kind, a.value); h != "" {
			b.WriteString(" = " + h)
		}
		b.WriteString("\n")
	}
}

func hexBytes(v []byte) string {
	var b strings.Builder
	for i, c := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%02x", c)
	}
	return b.String()
}

// hint shows a value as what it means; it is derived from the bytes shown
// before it.
func hint(k attrKind, v []byte) string {
	switch {
	case k == kU32 && len(v) == 4:
		return fmt.Sprint(binary.BigEndian.Uint32(v))
	case k == kI32 && len(v) == 4:
		return fmt.Sprint(int32(binary.BigEndian.Uint32(v)))
	case k == kFlags && len(v) == 4:
		return fmt.Sprintf("%#x", binary.BigEndian.Uint32(v))
	case k == kU64 && len(v) == 8:
		return fmt.Sprint(binary.BigEndian.Uint64(v))
	case k == kVerdict && len(v) == 4:
		switch int32(binary.BigEndian.Uint32(v)) {
		case nfDrop:
			return "drop"
		case nfAccept:
			return "accept"
		case unix.NFT_CONTINUE:
			return "continue"
		case unix.NFT_JUMP:
			return "jump"
		case unix.NFT_GOTO:
			return "goto"
		case unix.NFT_RETURN:
			return "return"
		}
	}
	if len(v) >= 2 && v[len(v)-1] == 0 {
		s := string(v[:len(v)-1])
		for _, r := range s {
			if r < ' ' || r > '~' {
				return ""
			}
		}
		return fmt.Sprintf("%q", s)
	}
	return ""
}
