package source

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/oschwald/maxminddb-golang/v2"
	"go4.org/netipx"
)

// FormatMMDB is a MaxMind DB file (.mmdb, gzip or not): GeoLite2 and
// GeoIP2 Country or City, DB-IP lite, IPinfo lite, the ip-location-db
// builds. Its networks are read with the country each record names:
// country.iso_code (MaxMind, DB-IP), else country_code (IPinfo,
// ip-location-db), else a two-letter country (IPinfo's older files),
// else registered_country.iso_code; and with the autonomous system each
// names: autonomous_system_number and autonomous_system_organization
// (GeoLite2 ASN, DB-IP, ip-location-db), else asn ("AS15169") and
// as_name (IPinfo). Networks with neither are skipped; a file where none
// has either is refused.
const FormatMMDB = "mmdb"

// mmdbRecord is what ipfence reads of an mmdb record.
type mmdbRecord struct {
	cc    uint16 // noCountry for none
	asn   uint32 // 0 for none
	org   string
	valid bool // a country or an ASN
}

// readRecord decodes what ipfence reads of res's record: the labels of
// want (0: both).
func readRecord(res maxminddb.Result, want Labels) mmdbRecord {
	rec := mmdbRecord{cc: noCountry}
	if want == 0 || want&LabelCountry != 0 {
		if cc, ok := codeIndex(mmdbCode(res)); ok {
			rec.cc, rec.valid = cc, true
		}
	}
	if want != 0 && want&LabelASN == 0 {
		return rec
	}
	var n uint32
	if res.DecodePath(&n, "autonomous_system_number") == nil && n != 0 {
		rec.asn = n
		_ = res.DecodePath(&rec.org, "autonomous_system_organization")
	} else {
		var as string
		if res.DecodePath(&as, "asn") == nil {
			if n, err := ParseASN(as); err == nil && n != 0 {
				rec.asn = n
				_ = res.DecodePath(&rec.org, "as_name")
			}
		}
	}
	rec.valid = rec.valid || rec.asn != 0
	return rec
}

// mmdbCode is the country code of res's record, as the publishers lay
// their records out ("" for none). A path of another type is no code.
func mmdbCode(res maxminddb.Result) string {
	for _, path := range [][]any{{"country", "iso_code"}, {"country_code"}, {"country"}, {"registered_country", "iso_code"}} {
		var cc string
		if res.DecodePath(&cc, path...) == nil && len(cc) == 2 {
			return cc
		}
	}
	return ""
}

// ErrMMDBTree: an mmdb whose search tree shares nodes, which makes its
// networks (2^128 of them, for 128 nodes) a walk without end.
var ErrMMDBTree = errors.New("a search tree whose nodes are shared")

// readMMDB reads a MaxMind DB file's networks, countries and autonomous
// systems (the file is read whole: the format is a tree, not a stream).
// Hostile files are bounded: a tree whose nodes are shared is refused
// before the walk (Verify does not catch it), and the walk stops past
// one network a node. Adjacent networks of one country and AS are one
// row. Its rows have no line: their origin is the file.
func readMMDB(r io.Reader, name string, file uint16, lim limits) (*part, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	db, err := maxminddb.OpenBytes(data)
	if err != nil {
		return nil, fmt.Errorf("reading %s: not a MaxMind DB file (.mmdb; a MaxMind .tar.gz must be unpacked first): %w", name, err)
	}
	defer db.Close()
	md := db.Metadata
	if err := checkTree(data, md.NodeCount, md.RecordSize, md.IPVersion); err != nil {
		return nil, fmt.Errorf("reading %s: not a MaxMind DB file ipfence reads: %w", name, err)
	}
	p := new(part)
	// Networks share records (a country's, an ASN's): each is decoded
	// once, by its offset in the data section.
	records := map[uintptr]mmdbRecord{}
	budget := int(md.NodeCount) + 1
	var cur struct {
		lo, hi netip.Addr
		cc     uint16
		asn    uint32
		ok     bool
	}
	flush := func() error {
		if !cur.ok {
			return nil
		}
		if p.rows() >= lim.entries {
			return &LimitError{File: name, What: "entries", Limit: int64(lim.entries), Key: "max_entries"}
		}
		p.add(cur.lo, cur.hi, cur.cc, cur.asn, file, 0)
		cur.ok = false
		return nil
	}
	networks := 0
	var have Labels
	for res := range db.Networks() {
		if err := res.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: a damaged MaxMind DB file: %w", name, err)
		}
		if networks++; networks > budget {
			return nil, fmt.Errorf("reading %s: more networks than the search tree has nodes (%d): %w", name, md.NodeCount, ErrMMDBTree)
		}
		rec, seen := records[res.Offset()]
		if !seen {
			rec = readRecord(res, lim.labels)
			records[res.Offset()] = mmdbRecord{cc: rec.cc, asn: rec.asn, valid: rec.valid} // the name is in p
			p.name(rec.asn, rec.org)
		}
		if !rec.valid {
			continue // neither a country nor an AS
		}
		if rec.cc != noCountry {
			have |= LabelCountry
		}
		if rec.asn != 0 {
			have |= LabelASN
		}
		pr := res.Prefix().Masked()
		lo, hi := pr.Addr(), netipx.PrefixLastIP(pr)
		if cur.ok && cur.cc == rec.cc && cur.asn == rec.asn && cur.lo.Is4() == lo.Is4() && cur.hi.Next() == lo {
			cur.hi = hi // the next network of the same country and AS
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		cur.lo, cur.hi, cur.cc, cur.asn, cur.ok = lo, hi, rec.cc, rec.asn, true
	}
	if err := flush(); err != nil {
		return nil, err
	}
	for _, l := range []struct {
		label Labels
		what  string
	}{{LabelCountry, "a country (country.iso_code, country_code, country, registered_country.iso_code), which the policy's countries: rules need"},
		{LabelASN, "an autonomous system (autonomous_system_number, asn), which the policy's asns: rules need"}} {
		if networks > 0 && lim.labels&l.label != 0 && have&l.label == 0 {
			return nil, fmt.Errorf("reading %s: %d networks, none with %s (database type %q)", name, networks, l.what, md.DatabaseType)
		}
	}
	if networks > 0 && p.rows() == 0 {
		return nil, fmt.Errorf("reading %s: %d networks, none with a country or an autonomous system (database type %q; looked for country.iso_code, country_code, country, registered_country.iso_code, autonomous_system_number, asn): not country or ASN data",
			name, networks, md.DatabaseType)
	}
	return p, nil
}

// checkTree refuses a search tree (the first nodes*recordSize/4 bytes of
// data) in which a node is the child of more than one node, but for the
// IPv4 subtree of an IPv6 tree, which its aliases (::ffff:0:0/96,
// 2001::/32, 2002::/16) share.
func checkTree(data []byte, nodes, recordSize, ipVersion uint) error {
	size := int(nodes) * int(recordSize) / 4
	if recordSize != 24 && recordSize != 28 && recordSize != 32 || size > len(data) {
		return fmt.Errorf("record size %d for %d nodes in %d bytes", recordSize, nodes, len(data))
	}
	child := func(n uint, right bool) uint {
		b := data[int(n)*int(recordSize)/4:]
		switch recordSize {
		case 24:
			if right {
				b = b[3:]
			}
			return uint(b[0])<<16 | uint(b[1])<<8 | uint(b[2])
		case 28:
			if right {
				return uint(b[3]&0x0f)<<24 | uint(b[4])<<16 | uint(b[5])<<8 | uint(b[6])
			}
			return uint(b[3]&0xf0)<<20 | uint(b[0])<<16 | uint(b[1])<<8 | uint(b[2])
		}
		if right {
			b = b[4:]
		}
		return uint(binary.BigEndian.Uint32(b))
	}
	ipv4 := nodes // none
	if ipVersion == 6 {
		n := uint(0)
		for range 96 {
			if n >= nodes {
				break
			}
			n = child(n, false)
		}
		ipv4 = n
	}
	parents := make([]uint8, nodes)
	for n := range nodes {
		for _, right := range []bool{false, true} {
			c := child(n, right)
			if c >= nodes || c == ipv4 {
				continue // data, no data, or the shared IPv4 subtree
			}
			if c == 0 || parents[c] > 0 {
				return fmt.Errorf("%w (node %d)", ErrMMDBTree, c)
			}
			parents[c]++
		}
	}
	return nil
}
