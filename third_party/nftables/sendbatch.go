// ipfence patch: a batch is marshaled straight into one buffer of its
// exact size and sent with one sendmsg.

package nftables

import (
	"errors"
	"math/rand/v2"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nlenc"
	"golang.org/x/sys/unix"
)

// nlmsgHeaderLen is the size of a netlink message header.
const nlmsgHeaderLen = 16

// nlmsgAlign rounds n up to the netlink alignment.
func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// marshalBatch sets the length and the sequence numbers (from seq) of the
// headers of msgs, and returns them marshaled, one after the other, as
// netlink.Message.MarshalBinary would, in one buffer of their exact size.
func marshalBatch(msgs []netlink.Message, seq uint32) []byte {
	size := 0
	for i := range msgs {
		size += nlmsgAlign(nlmsgHeaderLen + len(msgs[i].Data))
	}
	buf := make([]byte, 0, size)
	for i := range msgs {
		h := &msgs[i].Header
		h.Length = uint32(nlmsgAlign(nlmsgHeaderLen + len(msgs[i].Data)))
		h.Sequence = seq + uint32(i)
		var hb [nlmsgHeaderLen]byte
		putHeader(hb[:], h)
		buf = append(append(buf, hb[:]...), msgs[i].Data...)
		buf = buf[:nlmsgAlign(len(buf))] // the padding is zero: make() cleared it
	}
	return buf
}

// putHeader writes h into b as the kernel reads it.
func putHeader(b []byte, h *netlink.Header) {
	nlenc.PutUint32(b[0:4], h.Length)
	nlenc.PutUint16(b[4:6], uint16(h.Type))
	nlenc.PutUint16(b[6:8], uint16(h.Flags))
	nlenc.PutUint32(b[8:12], h.Sequence)
	nlenc.PutUint32(b[12:16], h.PID)
}

// maxIovecs is the most buffers one sendmsg takes (the kernel's
// UIO_MAXIOV).
const maxIovecs = 1024

// sendBatch sends msgs as conn.SendMessages does, one sendmsg for them
// all, and returns them with the headers sent. msgs[1:len(msgs)-1] are
// the queued messages, some in a (see gather). netlink.Conn.SendMessages
// marshals each message into a copy of its own and appends the copies to
// a growing buffer: for a batch of a million set elements that holds two
// to three times the batch at once. Here the batch goes out from where
// its messages are (gather), with runs of small buffers copied together
// past maxIovecs buffers (coalesce), or, past them still, from one
// buffer of its exact size. A connection without a file descriptor (a
// test's) goes through conn.SendMessages.
func sendBatch(conn *netlink.Conn, msgs []netlink.Message, queued []netlinkMessage, a *arena) ([]netlink.Message, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return conn.SendMessages(msgs)
	}
	// Sequence numbers start anywhere but 0 (which netlink.Conn would
	// replace), below 2^31 so that a batch does not wrap. Flushes hold
	// cc.mu, and flush drains the replies as before: a later request on a
	// lasting connection sees none of this batch's.
	seq := rand.Uint32()>>1 + 1
	bufs := gather(msgs, queued, a, seq)
	if len(bufs) > maxIovecs {
		bufs = coalesce(bufs, 64<<10)
	}
	if len(bufs) > maxIovecs {
		bufs = [][]byte{marshalBatch(msgs, seq)}
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		// The poller waits until the socket can take it; an interrupted
		// call is made again, as mdlayher/socket does.
		return !errors.Is(serr, unix.EAGAIN) && !errors.Is(serr, unix.EINTR)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, &netlink.OpError{Op: "send-messages", Err: err}
	}
	return msgs, nil
}
