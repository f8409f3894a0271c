// ipfence patch: the batch marshaled in one buffer against
// netlink.Message.MarshalBinary.

package nftables

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mdlayher/netlink"
)

func TestMarshalBatchMatchesMarshalBinary(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 100 {
		msgs := make([]netlink.Message, 1+r.IntN(20))
		for i := range msgs {
			data := make([]byte, r.IntN(200))
			for k := range data {
				data[k] = byte(r.Uint32())
			}
			msgs[i] = netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(r.Uint32()), Flags: netlink.HeaderFlags(r.Uint32()), PID: r.Uint32()}, Data: data}
		}
		seq := r.Uint32()>>1 + 1
		got := marshalBatch(msgs, seq)
		var want []byte
		for i, m := range msgs {
			if m.Header.Sequence != seq+uint32(i) || m.Header.Length != uint32(nlmsgAlign(16+len(m.Data))) {
				t.Fatalf("round %d, message %d: header %+v", round, i, m.Header)
			}
			b, err := m.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, b...)
		}
		if !bytes.Equal(got, want) || cap(got) != len(got) {
			t.Fatalf("round %d: %d bytes (cap %d), want %d:\n got % x\nwant % x", round, len(got), cap(got), len(want), got[:min(64, len(got))], want[:min(64, len(want))])
		}
	}
}

// TestGatherMatchesMarshalBatch: the buffers gather returns, put end to
// end, are marshalBatch's bytes, for batches mixing messages in the
// arena (over several chunks, some moved out by appends past their
// room) and others; runs of arena messages go out as one buffer.
func TestGatherMatchesMarshalBatch(t *testing.T) {
	defer func(n int) { arenaChunk = n }(arenaChunk)
	arenaChunk = 3 * arenaRoom // a few messages a chunk
	r := rand.New(rand.NewPCG(5, 6))
	random := func(b []byte, n int) []byte {
		for range n {
			b = append(b, byte(r.Uint32()))
		}
		return b
	}
	for round := range 200 {
		var a arena
		var queued []netlinkMessage
		for range r.IntN(12) {
			h := netlink.Header{Type: netlink.HeaderType(r.Uint32()), Flags: netlink.HeaderFlags(r.Uint32()), PID: r.Uint32()}
			if r.IntN(3) == 0 {
				queued = append(queued, netlinkMessage{Header: h, Data: random(nil, r.IntN(300))})
				continue
			}
			n := 4 * (1 + r.IntN(maxElemBatchSize/4))
			if r.IntN(10) == 0 {
				n = arenaRoom // past the room: moved out
			}
			want := nlmsgHeaderLen + n + r.IntN(2*arenaChunk)
			if r.IntN(4) == 0 {
				want = r.IntN(n) // a bad guess: may move out
			}
			b, chunk, off := a.next(want)
			m := netlinkMessage{Header: h, Data: random(b, n)}
			if a.commit(m.Data, chunk, off) {
				m.chunk, m.off = chunk+1, off
			} else if n != arenaRoom && want >= nlmsgHeaderLen+n {
				t.Fatalf("round %d: a message of %d bytes left the arena", round, n)
			}
			queued = append(queued, m)
		}
		msgs, err := batch(queued, 0)
		if err != nil {
			t.Fatal(err)
		}
		seq := r.Uint32()>>1 + 1
		bufs := gather(msgs, queued, &a, seq)
		want := marshalBatch(slices.Clone(msgs), seq)
		if got := bytes.Join(bufs, nil); !bytes.Equal(got, want) {
			t.Fatalf("round %d: gathered %d bytes in %d buffers, want %d", round, len(got), len(bufs), len(want))
		}
		// Buffers: one per run of arena messages in one chunk, one per
		// run of the others.
		runs, prev := 0, -2
		for i := range msgs {
			region := -1
			if i > 0 && i < len(msgs)-1 && queued[i-1].chunk > 0 {
				region = queued[i-1].chunk - 1
			}
			if region != prev {
				runs++
			}
			prev = region
		}
		if len(bufs) != runs {
			t.Errorf("round %d: %d buffers for %d runs", round, len(bufs), runs)
		}
	}
}

// TestArenaManySmallSets: the element lists of many small sets share the
// arena's chunks, and their batch goes out in fewer buffers than one
// sendmsg takes once the small ones are copied together, with the same
// bytes.
func TestArenaManySmallSets(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	cc := &Conn{}
	for i := range 2000 {
		s := &Set{Name: fmt.Sprintf("s%d", i), ID: uint32(i + 1), Table: &Table{Name: "t", Family: TableFamilyINet}, KeyType: TypeIPAddr}
		cc.AddSet(s, nil)
		vals := make([]SetElement, 1+r.IntN(100))
		for k := range vals {
			vals[k].Key = []byte{10, byte(i >> 8), byte(i), byte(k)}
		}
		if err := cc.SetAddElementsFunc(s, len(vals), func(k int, e *SetElement) { *e = vals[k] }); err != nil {
			t.Fatal(err)
		}
	}
	size := 0
	for _, c := range cc.arena.chunks {
		size += cap(c)
	}
	if used := cc.getMessageSize(); size > 2*used+arenaRoom {
		t.Errorf("the arena holds %d bytes in %d chunks for %d bytes of messages", size, len(cc.arena.chunks), used)
	}
	msgs, err := batch(cc.messages, 0)
	if err != nil {
		t.Fatal(err)
	}
	bufs := gather(msgs, cc.messages, &cc.arena, 1)
	if len(bufs) <= maxIovecs {
		t.Fatalf("%d buffers: the test wants more than %d before coalesce", len(bufs), maxIovecs)
	}
	small := coalesce(bufs, 64<<10)
	if len(small) > maxIovecs {
		t.Errorf("coalesce left %d buffers", len(small))
	}
	if want := marshalBatch(slices.Clone(msgs), 1); !bytes.Equal(bytes.Join(small, nil), want) || !bytes.Equal(bytes.Join(bufs, nil), want) {
		t.Error("the buffers are not the batch's bytes")
	}
}
