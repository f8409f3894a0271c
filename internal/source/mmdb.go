package source

import (
	"fmt"
	"io"

	"github.com/oschwald/maxminddb-golang/v2"
	"go4.org/netipx"
)

// FormatMMDB is a MaxMind DB file (.mmdb, gzip or not): GeoLite2 and
// GeoIP2 Country or City, DB-IP lite, IPinfo lite, the ip-location-db
// builds. Its networks are read with the country each record names:
// country.iso_code (MaxMind, DB-IP), else country_code (IPinfo,
// ip-location-db), else registered_country.iso_code. Networks without
// one, and codes that are no country (EU, AP), are skipped.
const FormatMMDB = "mmdb"

// mmdbCode is the country code of res's record, as the publishers lay
// their records out ("" for none): country.iso_code (MaxMind, DB-IP),
// country_code (IPinfo, ip-location-db; their "country" is a name), then
// registered_country.iso_code. A path of another type is no code.
func mmdbCode(res maxminddb.Result) string {
	for _, path := range [][]any{{"country", "iso_code"}, {"country_code"}, {"registered_country", "iso_code"}} {
		var cc string
		if res.DecodePath(&cc, path...) == nil && cc != "" {
			return cc
		}
	}
	return ""
}

// readMMDB reads a MaxMind DB file's networks and countries (the file is
// read whole: the format is a tree, not a stream). Its rows have no line:
// their origin is the file.
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
	p := new(part)
	// Networks share records (a country's, an ASN's): each is decoded
	// once, by its offset in the data section.
	codes := map[uintptr]string{}
	for res := range db.Networks() {
		if err := res.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: a damaged MaxMind DB file: %w", name, err)
		}
		code, seen := codes[res.Offset()]
		if !seen {
			code = mmdbCode(res)
			codes[res.Offset()] = code
		}
		cc, ok := codeIndex(code)
		if !ok {
			continue // no country, or a code that is none (EU, AP)
		}
		if p.rows() >= lim.entries {
			return nil, &LimitError{File: name, What: "entries", Limit: int64(lim.entries), Key: "max_entries"}
		}
		pr := res.Prefix().Masked()
		p.add(pr.Addr(), netipx.PrefixLastIP(pr), cc, file, 0)
	}
	return p, nil
}
