// ipfence patch: the batch marshaled in one buffer against
// netlink.Message.MarshalBinary.

package nftables

import (
	"bytes"
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
			b, chunk, off := a.next(r.IntN(2 * arenaChunk))
			n := 4 * (1 + r.IntN(maxElemBatchSize/4))
			if r.IntN(10) == 0 {
				n = arenaRoom // past the room: moved out
			}
			m := netlinkMessage{Header: h, Data: random(b, n)}
			if a.commit(m.Data, chunk, off) {
				m.chunk, m.off = chunk+1, off
			} else if n != arenaRoom {
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
