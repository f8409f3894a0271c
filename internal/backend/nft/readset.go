package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// ReadSet reads the elements of an address set (KeyAddress keys, hash or
// interval) back from the kernel as ranges, sorted. It dumps the set with
// one netlink request and decodes only keys and flags (google/nftables
// decodes every element fully, minutes for a million): a million elements
// take seconds. For checks and tests: ipfence keeps the desired state in
// memory and never needs to read it back.
func ReadSet(ctx context.Context, table, netns, name string) ([]netipx.IPRange, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, s, nsfd, closeConn, err := openSet(netns, table, name)
	if err != nil {
		return nil, fmt.Errorf("reading set %s: %w", name, err)
	}
	defer closeConn()
	elems, err := dumpKeys(nsfd, table, name)
	if err != nil {
		return nil, fmt.Errorf("reading elements of set %s: %w", name, err)
	}
	if !s.Interval {
		out := make([]netipx.IPRange, 0, len(elems))
		for _, e := range elems {
			a, ok := netip.AddrFromSlice(e.Key)
			if !ok {
				return nil, fmt.Errorf("set %s: key %x is not an address", name, e.Key)
			}
			out = append(out, netipx.IPRangeFrom(a, a))
		}
		slices.SortFunc(out, func(x, y netipx.IPRange) int { return x.From().Compare(y.From()) })
		return out, nil
	}
	return intervalsOf(name, elems)
}

// openSet connects to nftables in netns and looks set name of the inet
// table up; closeConn closes the connection.
func openSet(netns, table, name string) (c *nftables.Conn, s *nftables.Set, nsfd int, closeConn func(), err error) {
	c, closeConn, nsfd, err = dial(netns)
	if err != nil {
		return nil, nil, -1, nil, err
	}
	s, err = c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: table}, name)
	if err != nil {
		closeConn()
		return nil, nil, -1, nil, err
	}
	return c, s, nsfd, closeConn, nil
}

// dumpKeys dumps the elements of set name with NFT_MSG_GETSETELEM and
// returns their keys and interval flags only.
func dumpKeys(nsfd int, table, name string) ([]nftables.SetElement, error) {
	cfg := &netlink.Config{}
	if nsfd >= 0 {
		cfg.NetNS = nsfd
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetReadBuffer(32 << 20)
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: append([]byte(table), 0)},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: append([]byte(name), 0)},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, err
	}
	var out []nftables.SetElement
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					var e nftables.SetElement
					list.Nested(func(el *netlink.AttributeDecoder) error {
						el.ByteOrder = binary.BigEndian
						for el.Next() {
							switch el.Type() {
							case unix.NFTA_SET_ELEM_KEY:
								el.Nested(func(k *netlink.AttributeDecoder) error {
									for k.Next() {
										if k.Type() == unix.NFTA_DATA_VALUE {
											e.Key = k.Bytes()
										}
									}
									return nil
								})
							case unix.NFTA_SET_ELEM_FLAGS:
								e.IntervalEnd = el.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
							}
						}
						return nil
					})
					out = append(out, e)
				}
				return nil
			})
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// intervalsOf turns interval-set elements (starts, and ends flagged
// IntervalEnd at last+1) into ranges.
func intervalsOf(name string, elems []nftables.SetElement) ([]netipx.IPRange, error) {
	type point struct {
		a   netip.Addr
		end bool
	}
	ps := make([]point, 0, len(elems))
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			return nil, fmt.Errorf("set %s: key %x is not an address", name, e.Key)
		}
		ps = append(ps, point{a, e.IntervalEnd})
		if e.IntervalOpen {
			ps = append(ps, point{a, false})
		}
	}
	// At one address an end (of the range before) sorts before a start.
	slices.SortFunc(ps, func(x, y point) int {
		if c := x.a.Compare(y.a); c != 0 {
			return c
		}
		if x.end == y.end {
			return 0
		}
		if x.end {
			return -1
		}
		return 1
	})
	var out []netipx.IPRange
	var start netip.Addr
	open := false
	for _, p := range ps {
		switch {
		case !p.end && !open:
			start, open = p.a, true
		case p.end && open:
			out = append(out, netipx.IPRangeFrom(start, p.a.Prev()))
			open = false
		}
	}
	if open { // the last range runs to the family's last address
		out = append(out, netipx.IPRangeFrom(start, netipx.RangeOfPrefix(netip.PrefixFrom(start, 0)).To()))
	}
	return out, nil
}

// Present reports for each key whether the hash set name (KeyAddress keys)
// holds it, asking the kernel for the keys themselves (hundreds per
// request, each a hash lookup), not dumping the set: for checking big sets,
// whose dump costs the kernel time quadratic in their size.
func Present(ctx context.Context, table, netns, name string, keys []netip.Addr) ([]bool, error) {
	c, s, _, closeConn, err := openSet(netns, table, name)
	if err != nil {
		return nil, fmt.Errorf("probing set %s: %w", name, err)
	}
	defer closeConn()
	out := make([]bool, len(keys))
	probe := func(from, to int) error {
		es := make([]nftables.SetElement, to-from)
		for i := range es {
			es[i].Key = keys[from+i].AsSlice()
		}
		found, err := c.FindSetElements(s, es)
		if err != nil {
			return err
		}
		if len(found) != len(es) {
			return fmt.Errorf("probing set %s: %d answers for %d keys", name, len(found), len(es))
		}
		for i := from; i < to; i++ {
			out[i] = true
		}
		return nil
	}
	const batch = 512
	for from := 0; from < len(keys); from += batch {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		to := min(from+batch, len(keys))
		if probe(from, to) == nil {
			continue
		}
		// Some key is missing (the kernel answers ENOENT for the whole
		// request): one by one.
		for i := from; i < to; i++ {
			err := probe(i, i+1)
			switch {
			case err == nil:
			case errors.Is(err, unix.ENOENT):
				out[i] = false
			default:
				return nil, err
			}
		}
	}
	return out, nil
}
