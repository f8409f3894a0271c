package pktgen

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"

	"github.com/ipfence/ipfence/internal/netns"
)

// nsStats reads the kernel counters of one namespace. Its files are opened
// inside the namespace, and a /proc/.../net file keeps reporting the
// namespace it was opened in, so it can be read from any thread.
type nsStats struct {
	snmp, snmp6, dev *os.File
	conntrack        *os.File // nil when conntrack is not loaded
	buf              []byte
	ifname           string
	xdp              bool // an XDP program runs on ifname
}

// counters is a snapshot of the counters Check and Measure watch.
type counters struct {
	ipIn                  uint64 // Ip InReceives: IPv4 packets that reached IP, before prerouting
	ip6In                 uint64 // Ip6InReceives minus Ip6InMcastPkts: unicast IPv6 packets, so not MLD noise
	addrErr               uint64 // Ip InAddrErrors + Ip6InAddrErrors: dropped by routing (the sink, with forwarding off)
	noPorts               uint64 // Udp NoPorts + Udp6NoPorts: reached UDP, no socket
	udpRcvbuf, udp6Rcvbuf uint64 // receive buffer overflows
	udpInErr, udp6InErr   uint64 // all UDP receive errors
	udpCsum, udp6Csum     uint64 // bad UDP checksums
	rxPackets, rxDropped  uint64 // the veth's receive counters
	rxErrors, rxFIFO      uint64
	ctDrop, ctInsFailed   uint64 // packets conntrack dropped (table full, insert clash)
}

func openStats(lab *netns.Lab) (*nsStats, error) {
	s := &nsStats{buf: make([]byte, 0, 64<<10), ifname: lab.FWIf}
	err := lab.DoFW(func() error {
		var err error
		// thread-self, not self: /proc/self/net is the namespace of the
		// process's main thread, not of this one.
		if s.snmp, err = os.Open("/proc/thread-self/net/snmp"); err != nil {
			return err
		}
		if s.snmp6, err = os.Open("/proc/thread-self/net/snmp6"); err != nil {
			return err
		}
		if s.dev, err = os.Open("/proc/thread-self/net/dev"); err != nil {
			return err
		}
		s.conntrack, _ = os.Open("/proc/thread-self/net/stat/nf_conntrack")
		l, err := netlink.LinkByName(lab.FWIf)
		if err != nil {
			return err
		}
		s.xdp = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
		return nil
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("opening counters of %s: %w", lab.FW, err)
	}
	return s, nil
}

func (s *nsStats) close() {
	for _, f := range []*os.File{s.snmp, s.snmp6, s.dev, s.conntrack} {
		if f != nil {
			f.Close()
		}
	}
}

// readAll rereads a proc file from its start into s.buf.
func (s *nsStats) readAll(f *os.File) ([]byte, error) {
	b := s.buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := f.ReadAt(b[len(b):cap(b)], int64(len(b)))
		b = b[:len(b)+n]
		if err == io.EOF || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f.Name(), err)
		}
	}
	s.buf = b
	return b, nil
}

// read takes a snapshot of all counters.
func (s *nsStats) read() (counters, error) {
	var c counters
	b, err := s.readAll(s.snmp)
	if err != nil {
		return c, err
	}
	ip, udp := snmpSection(b, "Ip:"), snmpSection(b, "Udp:")
	c.ipIn = ip["InReceives"]
	c.addrErr, c.noPorts = ip["InAddrErrors"], udp["NoPorts"]
	c.udpRcvbuf, c.udpInErr, c.udpCsum = udp["RcvbufErrors"], udp["InErrors"], udp["InCsumErrors"]
	if b, err = s.readAll(s.snmp6); err != nil {
		return c, err
	}
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseUint(string(f[1]), 10, 64)
		switch string(f[0]) {
		case "Ip6InReceives":
			c.ip6In += v
		case "Ip6InMcastPkts":
			c.ip6In -= v
		case "Ip6InAddrErrors":
			c.addrErr += v
		case "Udp6NoPorts":
			c.noPorts += v
		case "Udp6RcvbufErrors":
			c.udp6Rcvbuf = v
		case "Udp6InErrors":
			c.udp6InErr = v
		case "Udp6InCsumErrors":
			c.udp6Csum = v
		}
	}
	if b, err = s.readAll(s.dev); err != nil {
		return c, err
	}
	found := false
	for line := range bytes.Lines(b) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(bytes.TrimSpace(name)) != s.ifname {
			continue
		}
		// rx: bytes packets errs drop fifo frame compressed multicast
		f := bytes.Fields(rest)
		if len(f) < 8 {
			break
		}
		v := func(i int) uint64 { n, _ := strconv.ParseUint(string(f[i]), 10, 64); return n }
		c.rxPackets, c.rxErrors, c.rxDropped, c.rxFIFO = v(1), v(2), v(3), v(4)
		found = true
	}
	if !found {
		return c, fmt.Errorf("reading counters: interface %s not in /proc/net/dev", s.ifname)
	}
	if s.conntrack != nil {
		if b, err = s.readAll(s.conntrack); err != nil {
			return c, err
		}
		c.ctDrop, c.ctInsFailed = conntrackStat(b)
	}
	return c, nil
}

// conntrackStat sums the drop and insert_failed columns of
// /proc/net/stat/nf_conntrack: a header line, then one line of hexadecimal
// values per CPU.
func conntrackStat(b []byte) (drop, insertFailed uint64) {
	var names [][]byte
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if names == nil {
			names = f
			continue
		}
		for i := range min(len(names), len(f)) {
			v, _ := strconv.ParseUint(string(f[i]), 16, 64)
			switch string(names[i]) {
			case "drop":
				drop += v
			case "insert_failed":
				insertFailed += v
			}
		}
	}
	return drop, insertFailed
}

// snmpSection parses the two lines of /proc/net/snmp starting with tag
// ("Ip:", "Udp:"): field names, then values.
func snmpSection(b []byte, tag string) map[string]uint64 {
	m := map[string]uint64{}
	var names [][]byte
	for line := range bytes.Lines(b) {
		if !bytes.HasPrefix(line, []byte(tag)) {
			continue
		}
		f := bytes.Fields(line[len(tag):])
		if names == nil {
			names = f
			continue
		}
		for i := range min(len(names), len(f)) {
			v, _ := strconv.ParseUint(string(f[i]), 10, 64)
			m[string(names[i])] = v
		}
		break
	}
	return m
}
