package nft

import (
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Names of the nf_tables attributes ipfence sends, for the golden dumps
// (linux include/uapi/linux/netfilter/nf_tables.h). They only label the
// bytes: an attribute missing here is shown by number.

// attrKind says how a value is shown after its bytes.
type attrKind uint8

const (
	kBytes   attrKind = iota
	kU32              // big-endian, as nf_tables sends integers
	kI32              // a signed one: a hook priority
	kU64              // milliseconds, handles
	kFlags            // a bit set
	kVerdict          // NF_DROP, NFT_JUMP, ...
)

// attrField names one attribute type. sub names the attributes nested in
// it, or list when every one of them is the same thing whatever its type
// (google/nftables numbers set elements 1, 2, 3, ...). expr marks an
// element of a rule's expression list, whose data is named after the
// expression.
type attrField struct {
	name string
	kind attrKind
	sub  attrSchema
	list *attrField
	expr bool
}

type attrSchema map[uint16]attrField

// numbered names attributes 1, 2, 3, ... in order: nf_tables.h numbers
// the attributes of each object and expression from 1 (0 is UNSPEC).
func numbered(fs ...attrField) attrSchema {
	s := make(attrSchema, len(fs))
	for i, f := range fs {
		s[uint16(i+1)] = f
	}
	return s
}

func named(name string) attrField                { return attrField{name: name} }
func u32(name string) attrField                  { return attrField{name: name, kind: kU32} }
func u64(name string) attrField                  { return attrField{name: name, kind: kU64} }
func flags(name string) attrField                { return attrField{name: name, kind: kFlags} }
func nest(name string, sub attrSchema) attrField { return attrField{name: name, sub: sub} }

var (
	dataSchema = numbered(named("NFTA_DATA_VALUE"), nest("NFTA_DATA_VERDICT", numbered(
		attrField{name: "NFTA_VERDICT_CODE", kind: kVerdict}, named("NFTA_VERDICT_CHAIN"))))
	tableSchema = numbered(named("NFTA_TABLE_NAME"), flags("NFTA_TABLE_FLAGS"), u32("NFTA_TABLE_USE"),
		u64("NFTA_TABLE_HANDLE"), named("NFTA_TABLE_PAD"), named("NFTA_TABLE_USERDATA"))
	chainSchema = numbered(named("NFTA_CHAIN_TABLE"), u64("NFTA_CHAIN_HANDLE"), named("NFTA_CHAIN_NAME"),
		nest("NFTA_CHAIN_HOOK", numbered(u32("NFTA_HOOK_HOOKNUM"), attrField{name: "NFTA_HOOK_PRIORITY", kind: kI32})),
		attrField{name: "NFTA_CHAIN_POLICY", kind: kVerdict}, u32("NFTA_CHAIN_USE"), named("NFTA_CHAIN_TYPE"))
	ruleSchema = numbered(named("NFTA_RULE_TABLE"), named("NFTA_RULE_CHAIN"), u64("NFTA_RULE_HANDLE"),
		attrField{name: "NFTA_RULE_EXPRESSIONS", list: &attrField{name: "NFTA_LIST_ELEM", expr: true}},
		named("NFTA_RULE_COMPAT"), u64("NFTA_RULE_POSITION"), named("NFTA_RULE_USERDATA"), named("NFTA_RULE_PAD"),
		u32("NFTA_RULE_ID"))
	setSchema = numbered(named("NFTA_SET_TABLE"), named("NFTA_SET_NAME"), flags("NFTA_SET_FLAGS"),
		u32("NFTA_SET_KEY_TYPE"), u32("NFTA_SET_KEY_LEN"), flags("NFTA_SET_DATA_TYPE"), u32("NFTA_SET_DATA_LEN"),
		u32("NFTA_SET_POLICY"), nest("NFTA_SET_DESC", numbered(u32("NFTA_SET_DESC_SIZE"))), u32("NFTA_SET_ID"),
		u64("NFTA_SET_TIMEOUT"), u32("NFTA_SET_GC_INTERVAL"), named("NFTA_SET_USERDATA"))
	elemSchema = numbered(nest("NFTA_SET_ELEM_KEY", dataSchema), nest("NFTA_SET_ELEM_DATA", dataSchema),
		flags("NFTA_SET_ELEM_FLAGS"), u64("NFTA_SET_ELEM_TIMEOUT"), u64("NFTA_SET_ELEM_EXPIRATION"),
		named("NFTA_SET_ELEM_USERDATA"))
	elemListSchema = numbered(named("NFTA_SET_ELEM_LIST_TABLE"), named("NFTA_SET_ELEM_LIST_SET"),
		attrField{name: "NFTA_SET_ELEM_LIST_ELEMENTS", list: &attrField{name: "NFTA_LIST_ELEM", sub: elemSchema}},
		u32("NFTA_SET_ELEM_LIST_SET_ID"))
	genSchema   = numbered(u32("NFTA_GEN_ID"))
	batchSchema = numbered(u32("NFNL_BATCH_GENID"))
)

// exprSchemas name the data of the expressions ipfence's rules use.
var exprSchemas = map[string]attrSchema{
	"immediate": numbered(u32("NFTA_IMMEDIATE_DREG"), nest("NFTA_IMMEDIATE_DATA", dataSchema)),
	"lookup": numbered(named("NFTA_LOOKUP_SET"), u32("NFTA_LOOKUP_SREG"), u32("NFTA_LOOKUP_DREG"),
		u32("NFTA_LOOKUP_SET_ID"), flags("NFTA_LOOKUP_FLAGS")),
	"payload": numbered(u32("NFTA_PAYLOAD_DREG"), u32("NFTA_PAYLOAD_BASE"), u32("NFTA_PAYLOAD_OFFSET"),
		u32("NFTA_PAYLOAD_LEN")),
	"meta": numbered(u32("NFTA_META_DREG"), u32("NFTA_META_KEY"), u32("NFTA_META_SREG")),
	"cmp":  numbered(u32("NFTA_CMP_SREG"), u32("NFTA_CMP_OP"), nest("NFTA_CMP_DATA", dataSchema)),
	"bitwise": numbered(u32("NFTA_BITWISE_SREG"), u32("NFTA_BITWISE_DREG"), u32("NFTA_BITWISE_LEN"),
		nest("NFTA_BITWISE_MASK", dataSchema), nest("NFTA_BITWISE_XOR", dataSchema)),
	"counter": numbered(u64("NFTA_COUNTER_BYTES"), u64("NFTA_COUNTER_PACKETS")),
	"reject":  numbered(u32("NFTA_REJECT_TYPE"), named("NFTA_REJECT_ICMP_CODE")),
}

// exprElemSchema names the attributes of one element of a rule's
// expression list: its name, and its data as that expression has it.
func exprElemSchema(attrs []wireAttr) attrSchema {
	var data attrSchema
	if a := attrAt(attrs, unix.NFTA_EXPR_NAME); a != nil {
		data = exprSchemas[strings.TrimSuffix(string(a.value), "\x00")]
	}
	return numbered(named("NFTA_EXPR_NAME"), nest("NFTA_EXPR_DATA", data))
}

// messageSchema names the attributes of a message of type t.
func messageSchema(t netlink.HeaderType) attrSchema {
	if t == unix.NFNL_MSG_BATCH_BEGIN || t == unix.NFNL_MSG_BATCH_END {
		return batchSchema
	}
	switch int(t & 0xff) {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_GETTABLE, unix.NFT_MSG_DELTABLE:
		return tableSchema
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_GETCHAIN, unix.NFT_MSG_DELCHAIN:
		return chainSchema
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_GETRULE, unix.NFT_MSG_DELRULE:
		return ruleSchema
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_GETSET, unix.NFT_MSG_DELSET:
		return setSchema
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_GETSETELEM, unix.NFT_MSG_DELSETELEM, msgDestroySetElem:
		return elemListSchema
	case unix.NFT_MSG_NEWGEN, unix.NFT_MSG_GETGEN:
		return genSchema
	}
	return nil
}

// Verdict codes x/sys/unix does not name (linux netfilter.h).
const (
	nfDrop   = 0
	nfAccept = 1
)

// nftaTableUserData is NFTA_TABLE_USERDATA (Linux 5.13), which x/sys/unix
// does not name.
const nftaTableUserData = 6

// msgDestroySetElem is NFT_MSG_DESTROYSETELEM (Linux 6.3), which
// x/sys/unix does not name: a delete that ignores absent elements.
const msgDestroySetElem = 30
