// ipfence patch: the fast element encoder against the package's own.

package nftables

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// referenceElemList is appendElemList's encoding before the patch: every
// element through marshalSetElement and netlink.MarshalAttributes.
func referenceElemList(t *testing.T, cc *Conn, s *Set, vals []SetElement) [][]byte {
	var elements []netlink.Attribute
	batchSize := 0
	var batches [][]netlink.Attribute
	for i, v := range vals {
		item, err := cc.marshalSetElement(s, &v)
		if err != nil {
			t.Fatal(err)
		}
		itemSize := unix.NLA_HDRLEN + len(item)
		if batchSize+itemSize > maxElemBatchSize {
			batches = append(batches, elements)
			elements, batchSize = nil, 0
		}
		elements = append(elements, netlink.Attribute{Type: uint16(i+1) | unix.NLA_F_NESTED, Data: item})
		batchSize += itemSize
	}
	batches = append(batches, elements)
	var out [][]byte
	for _, b := range batches {
		enc, err := netlink.MarshalAttributes(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, enc)
	}
	return out
}

func TestEncodeElemListMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		s, vals := randomElems(r, round)
		cc := &Conn{}
		want := referenceElemList(t, cc, s, vals)
		got, err := cc.encodeElemList(s, vals)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d element lists, want %d", round, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("round %d, list %d differs:\n got % x\nwant % x", round, i, got[i][:min(len(got[i]), 96)], want[i][:min(len(want[i]), 96)])
			}
		}
	}
}

func BenchmarkEncodeElemList(b *testing.B) {
	s := &Set{Name: "bans_v4", Table: &Table{Name: "ipfence", Family: TableFamilyINet}, HasTimeout: true}
	vals := make([]SetElement, 50000)
	for i := range vals {
		vals[i] = SetElement{Key: []byte{11, byte(i >> 16), byte(i >> 8), byte(i)}, Timeout: 6 * time.Hour}
	}
	cc := &Conn{}
	b.Run("patched", func(b *testing.B) {
		for range b.N {
			cc.encodeElemList(s, vals)
		}
	})
	b.Run("reference", func(b *testing.B) {
		t := &testing.T{}
		for range b.N {
			referenceElemList(t, cc, s, vals)
		}
	})
}

// randomElems is a random set of the kinds of element the encoders see.
func randomElems(r *rand.Rand, round int) (*Set, []SetElement) {
	key := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	s := &Set{Name: "s", Table: &Table{Name: "t", Family: TableFamilyINet}, HasTimeout: r.IntN(2) == 0}
	n := r.IntN(40)
	if round%20 == 0 {
		n = 5000 + r.IntN(5000) // several messages
	}
	vals := make([]SetElement, n)
	for i := range vals {
		e := &vals[i]
		e.Key = key([]int{4, 16, 8, 3}[r.IntN(4)])
		switch r.IntN(12) {
		case 0:
			e.IntervalEnd = true
		case 1:
			e.IntervalOpen = true
		case 2:
			e.KeyEnd = key(len(e.Key))
		case 3:
			e.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: "c"}
		case 7:
			e.VerdictData = &expr.Verdict{Kind: []expr.VerdictKind{expr.VerdictAccept, expr.VerdictDrop, expr.VerdictReturn}[r.IntN(3)]}
		case 8:
			e.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: []string{"r0_europe_v4_d2_l24_out", "abc", "abcd"}[r.IntN(3)]}
		case 4:
			e.Val = key(4)
		case 5:
			e.Comment = "why"
		case 6:
			e.Counter = &expr.Counter{Packets: 1}
		}
		if r.IntN(2) == 0 {
			e.Timeout = time.Duration(r.IntN(1e6)) * time.Millisecond
		}
	}
	return s, vals
}

// TestSetAddElementsFuncMatchesSetAddElements: the messages written in
// place are the bytes of those SetAddElements queues.
func TestSetAddElementsFuncMatchesSetAddElements(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for round := range 100 {
		s, vals := randomElems(r, round)
		s.ID = r.Uint32()
		want, got := &Conn{}, &Conn{}
		if err := want.SetAddElements(s, vals); err != nil {
			t.Fatal(err)
		}
		if err := got.SetAddElementsFunc(s, len(vals), func(i int, e *SetElement) { *e = vals[i] }); err != nil {
			t.Fatal(err)
		}
		if len(got.messages) != len(want.messages) {
			t.Fatalf("round %d (%d elements): %d messages, want %d", round, len(vals), len(got.messages), len(want.messages))
		}
		for i := range got.messages {
			g, w := got.messages[i], want.messages[i]
			if g.Header != w.Header || !bytes.Equal(g.Data, w.Data) {
				t.Fatalf("round %d, message %d differs:\n got %+v % x\nwant %+v % x", round, i, g.Header, g.Data[:min(len(g.Data), 96)], w.Header, w.Data[:min(len(w.Data), 96)])
			}
		}
	}
}
