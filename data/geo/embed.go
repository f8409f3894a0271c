// Package geo embeds the bundled country IP range data: every allocated IPv4
// and IPv6 range tagged with its ISO 3166-1 alpha-2 country code, as gzipped
// "first,last,CC" CSV (see README.md in this directory).
//
// The data is © Number Resource Organization (nro.net), CC BY 4.0
// (LICENSE-NRO); whoever ships it, or data derived from it, must give the
// attribution in Attribution. The compilation (ip-location-db
// geo-whois-asn-country) is CC0.
package geo

import (
	"embed"
	"io/fs"
)

// Names of the embedded files.
const (
	IPv4 = "country-ipv4.csv.gz"
	IPv6 = "country-ipv6.csv.gz"
)

// Attribution is the notice to show wherever the embedded data, or data
// derived from it, is shipped or printed.
const Attribution = "country data © Number Resource Organization (nro.net), CC BY 4.0"

//go:embed country-ipv4.csv.gz country-ipv6.csv.gz
var files embed.FS

// FS returns the embedded files, named IPv4 and IPv6 at its root.
// Opening any other name fails with an error wrapping fs.ErrNotExist.
func FS() fs.FS { return files }
