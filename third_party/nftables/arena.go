// ipfence patch: the messages of long element lists are written into
// big chunks of memory, and the batch is sent from them without a copy.

package nftables

import (
	"bytes"

	"github.com/mdlayher/netlink"
)

// arenaChunk is the size of an arena's chunks (a variable for tests).
var arenaChunk = 4 << 20

// arenaRoom is the most one appendElems message takes with its header:
// the set's attributes, maxElemBatchSize bytes of elements and the
// element that goes past them (moved to the next message before the
// message is committed), with room to spare.
const arenaRoom = nlmsgHeaderLen + maxElemBatchSize + 16<<10

// arena holds the data of a batch's element messages, each after room
// for its netlink header, one after the other in chunks that never
// move: the batch goes out from them as a few buffers of a sendmsg
// (gather), where it used to be copied whole into one buffer.
type arena struct {
	chunks [][]byte
}

// next returns an empty buffer to write a message's data into, in place
// in the arena, and where it is (its chunk, and the offset of the room
// for its header). want is about how much the list's messages still to
// come take: a short list goes into what is left of the last chunk, and
// a new chunk is no bigger than it needs (a short list does not take 4
// MiB). A message that outgrows its room moves out (commit). Only one
// message is written at a time: commit it before asking for the next.
func (a *arena) next(want int) (b []byte, chunk, off int) {
	n := len(a.chunks)
	if n == 0 || cap(a.chunks[n-1])-len(a.chunks[n-1]) < min(arenaRoom, want) {
		a.chunks = append(a.chunks, make([]byte, 0, max(arenaRoom, min(arenaChunk, want))))
		n++
	}
	c := a.chunks[n-1]
	off = len(c)
	return c[off+nlmsgHeaderLen : off+nlmsgHeaderLen], n - 1, off
}

// commit takes the data written into the buffer next returned at (chunk,
// off) as a message's, and reports whether it is still in place (an
// append past the buffer's room would have moved it: the message is then
// sent as any other).
func (a *arena) commit(data []byte, chunk, off int) bool {
	c := a.chunks[chunk]
	start := off + nlmsgHeaderLen
	if len(data) == 0 || cap(c) < start+len(data) || &data[0] != &c[:cap(c)][start] {
		return false
	}
	// nlmsgAlign adds nothing: attributes are padded to 4 bytes, and so
	// is the nfgenmsg header.
	a.chunks[chunk] = c[:off+nlmsgAlign(nlmsgHeaderLen+len(data))]
	return true
}

// gather sets the length and sequence number (from seq) of the headers
// of msgs, as marshalBatch does, and returns buffers whose concatenation
// is what marshalBatch returns. msgs[1:len(msgs)-1] are the queued
// messages queued (msgs[0] and the last are the batch's begin and end):
// those in the arena go out in place, their headers written in the room
// before them, and runs of them one after the other as one buffer; the
// others are copied into one buffer of their own.
func gather(msgs []netlink.Message, queued []netlinkMessage, a *arena, seq uint32) [][]byte {
	inArena := func(i int) *netlinkMessage {
		if i == 0 || i == len(msgs)-1 || queued[i-1].chunk == 0 {
			return nil
		}
		return &queued[i-1]
	}
	size := 0
	for i := range msgs {
		h := &msgs[i].Header
		h.Length = uint32(nlmsgAlign(nlmsgHeaderLen + len(msgs[i].Data)))
		h.Sequence = seq + uint32(i)
		if inArena(i) == nil {
			size += int(h.Length)
		}
	}
	own := make([]byte, 0, size)
	// A buffer under way: region -1 is own, k >= 0 the arena's chunk k.
	var out [][]byte
	region, from, to := -2, 0, 0
	flush := func() {
		switch {
		case region == -1:
			out = append(out, own[from:to])
		case region >= 0:
			out = append(out, a.chunks[region][from:to])
		}
	}
	for i := range msgs {
		var hb [nlmsgHeaderLen]byte
		putHeader(hb[:], &msgs[i].Header)
		r, start := -1, len(own)
		if q := inArena(i); q != nil {
			r, start = q.chunk-1, q.off
			copy(a.chunks[r][start:], hb[:])
		} else {
			own = append(append(own, hb[:]...), msgs[i].Data...)
			own = own[:nlmsgAlign(len(own))] // zero padding: make() cleared it
		}
		end := start + int(msgs[i].Header.Length)
		if r == region && start == to {
			to = end
			continue
		}
		flush()
		region, from, to = r, start, end
	}
	flush()
	return out
}

// coalesce returns bufs with each run of buffers shorter than small
// copied into one buffer: a batch of many small sets has two buffers a
// set (its declaration, its elements), more than one sendmsg takes.
func coalesce(bufs [][]byte, small int) [][]byte {
	var out [][]byte
	for i := 0; i < len(bufs); {
		j := i
		for j < len(bufs) && len(bufs[j]) < small {
			j++
		}
		switch {
		case j == i:
			out, j = append(out, bufs[i]), i+1
		case j == i+1:
			out = append(out, bufs[i])
		default:
			out = append(out, bytes.Join(bufs[i:j], nil))
		}
		i = j
	}
	return out
}
