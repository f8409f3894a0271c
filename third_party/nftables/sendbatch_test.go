// ipfence patch: the batch marshaled in one buffer against
// netlink.Message.MarshalBinary.

package nftables

import (
	"bytes"
	"math/rand/v2"
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
