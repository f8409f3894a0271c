// ipfence patch: set elements are encoded by appending to one buffer per
// message instead of building netlink.Attribute slices per element.

package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nlenc"
	"golang.org/x/sys/unix"
)

// appendAttr appends a netlink attribute (header, data, padding to 4
// bytes) to b, as netlink.MarshalAttributes lays it out.
func appendAttr(b []byte, typ uint16, data []byte) []byte {
	var h [unix.NLA_HDRLEN]byte
	nlenc.PutUint16(h[0:2], uint16(unix.NLA_HDRLEN+len(data)))
	nlenc.PutUint16(h[2:4], typ)
	b = append(b, h[:]...)
	b = append(b, data...)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// appendStringAttr is appendAttr of str with its terminating NUL, without
// copying str into a slice first.
func appendStringAttr(b []byte, typ uint16, str string) []byte {
	var h [unix.NLA_HDRLEN]byte
	nlenc.PutUint16(h[0:2], uint16(unix.NLA_HDRLEN+len(str)+1))
	nlenc.PutUint16(h[2:4], typ)
	b = append(append(append(b, h[:]...), str...), 0)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// beginNested appends the header of a nested attribute whose length is
// filled in by endNested, and returns where it starts.
func beginNested(b []byte, typ uint16) ([]byte, int) {
	at := len(b)
	var h [unix.NLA_HDRLEN]byte
	nlenc.PutUint16(h[2:4], typ|unix.NLA_F_NESTED)
	return append(b, h[:]...), at
}

func endNested(b []byte, at int) []byte {
	nlenc.PutUint16(b[at:at+2], uint16(len(b)-at))
	return b
}

// appendSetElement appends element e of s, as the nested attribute typ,
// to b: the same bytes as marshalSetElement wrapped by
// netlink.MarshalAttributes. Elements with a value, a comment or a
// counter are left to marshalSetElement (false); they are not the ones
// sent by the hundred thousand. Verdict map elements are (ipfence's
// layouts load hundreds of thousands).
func appendSetElement(b []byte, s *Set, e *SetElement, typ uint16) ([]byte, bool) {
	if len(e.Val) > 0 || len(e.Comment) > 0 || e.Counter != nil {
		return b, false
	}
	b, item := beginNested(b, typ)
	if e.IntervalEnd {
		var f [4]byte
		binary.BigEndian.PutUint32(f[:], unix.NFT_SET_ELEM_INTERVAL_END)
		b = appendAttr(b, unix.NFTA_SET_ELEM_FLAGS|unix.NLA_F_NESTED, f[:])
	}
	b, key := beginNested(b, unix.NFTA_SET_ELEM_KEY)
	b = endNested(appendAttr(b, unix.NFTA_DATA_VALUE, e.Key), key)
	if len(e.KeyEnd) > 0 {
		var end int
		b, end = beginNested(b, NFTA_SET_ELEM_KEY_END)
		b = endNested(appendAttr(b, unix.NFTA_DATA_VALUE, e.KeyEnd), end)
	}
	if s.HasTimeout && e.Timeout != 0 {
		var t [8]byte
		binary.BigEndian.PutUint64(t[:], uint64(e.Timeout.Milliseconds()))
		b = appendAttr(b, unix.NFTA_SET_ELEM_TIMEOUT, t[:])
	}
	if v := e.VerdictData; v != nil {
		var data, verdict int
		b, data = beginNested(b, unix.NFTA_SET_ELEM_DATA)
		b, verdict = beginNested(b, unix.NFTA_DATA_VERDICT)
		var k [4]byte
		binary.BigEndian.PutUint32(k[:], uint32(v.Kind))
		b = appendAttr(b, unix.NFTA_VERDICT_CODE, k[:])
		if v.Chain != "" {
			b = appendStringAttr(b, unix.NFTA_VERDICT_CHAIN, v.Chain)
		}
		b = endNested(endNested(b, verdict), data)
	}
	if e.IntervalOpen {
		var ud [16]byte
		b = appendAttr(b, unix.NFTA_SET_ELEM_USERDATA,
			userdata.AppendUint32(ud[:0], userdata.NFTNL_UDATA_SET_ELEM_FLAGS, userdata.NFTNL_UDATA_SET_ELEM_F_INTERVAL_OPEN))
	}
	return endNested(b, item), true
}

// encodeElemList encodes vals as the contents of NFTA_SET_ELEM_LIST_ELEMENTS
// attributes, a new one whenever maxElemBatchSize would be passed.
func (cc *Conn) encodeElemList(s *Set, vals []SetElement) ([][]byte, error) {
	var lists [][]byte
	cur := make([]byte, 0, min(maxElemBatchSize, 64*len(vals)))
	for i := range vals {
		start := len(cur)
		typ := uint16(i+1) | unix.NLA_F_NESTED
		var ok bool
		if cur, ok = appendSetElement(cur, s, &vals[i], typ); !ok {
			item, err := cc.marshalSetElement(s, &vals[i])
			if err != nil {
				return nil, fmt.Errorf("marshal item %d: %v", i, err)
			}
			cur = appendAttr(cur, typ, item)
		}
		if len(cur) > maxElemBatchSize {
			lists = append(lists, cur[:start:start])
			next := make([]byte, 0, min(maxElemBatchSize, 64*(len(vals)-i)))
			cur = append(next, cur[start:]...)
		}
	}
	return append(lists, cur), nil
}

// SetAddElementsFunc adds n elements to the named set s, as
// SetAddElements does, without a slice of them: elem fills in element i
// (into an element that is cleared and reused), and each netlink message
// is written once, its elements encoded in place. ipfence loads maps of
// hundreds of thousands of elements; a []SetElement of them took about
// 150 bytes an element, and the encoded elements were copied once more
// into each message. elem runs with the Conn locked: it must not call the
// Conn.
func (cc *Conn) SetAddElementsFunc(s *Set, n int, elem func(i int, e *SetElement)) error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if s.Anonymous {
		err := errors.New("anonymous sets cannot be updated")
		cc.setErr(err)
		return err
	}
	var e SetElement
	get := func(i int) *SetElement {
		e = SetElement{}
		elem(i, &e)
		return &e
	}
	if err := cc.appendElems(s, n, get, nftMsgNewSetElem); err != nil {
		cc.setErr(err)
		return err
	}
	return nil
}

// appendElems queues the messages of msgType for the n elements get
// gives, in messages of at most maxElemBatchSize bytes of elements, each
// written in place: the same bytes as appendElemList.
func (cc *Conn) appendElems(s *Set, n int, get func(i int) *SetElement, msgType nftMsgType) error {
	if n == 0 {
		return nil
	}
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], s.ID)
	// start begins a message in the arena: the header of nfnetlink, the
	// set's attributes, and the nested attribute of the elements.
	start := func(left int) (b []byte, at, first, chunk, off int) {
		b, chunk, off = cc.arena.next(nlmsgHeaderLen + 256 + 64*left)
		b = append(b, extraHeader(uint8(s.Table.Family), 0)...)
		b = appendStringAttr(b, unix.NFTA_SET_ELEM_LIST_SET, s.Name)
		b = appendAttr(b, unix.NFTA_SET_ELEM_LIST_SET_ID, id[:])
		b = appendStringAttr(b, unix.NFTA_SET_ELEM_LIST_TABLE, s.Table.Name)
		b, at = beginNested(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		return b, at, len(b), chunk, off
	}
	queue := func(b []byte, at, chunk, off int) {
		m := netlinkMessage{
			Header: netlink.Header{Type: msgType.HeaderType(), Flags: netlink.Request | netlink.Create},
			Data:   endNested(b, at),
		}
		if cc.arena.commit(m.Data, chunk, off) {
			m.chunk, m.off = chunk+1, off
		}
		cc.messages = append(cc.messages, m)
	}
	cur, at, first, chunk, off := start(n)
	for i := range n {
		from := len(cur)
		typ := uint16(i+1) | unix.NLA_F_NESTED
		e := get(i)
		var ok bool
		if cur, ok = appendSetElement(cur, s, e, typ); !ok {
			item, err := cc.marshalSetElement(s, e)
			if err != nil {
				return fmt.Errorf("marshal item %d: %v", i, err)
			}
			cur = appendAttr(cur, typ, item)
		}
		if len(cur)-first > maxElemBatchSize {
			// This element starts the next message, which the arena
			// puts after this one: it moves out while this one is
			// committed.
			moved := bytes.Clone(cur[from:])
			queue(cur[:from], at, chunk, off)
			cur, at, first, chunk, off = start(n - i)
			cur = append(cur, moved...)
		}
	}
	queue(cur, at, chunk, off)
	return nil
}
