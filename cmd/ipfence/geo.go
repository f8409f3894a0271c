package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/data/geo"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// geoOpts are the flags of `ipfence geo`.
type geoOpts struct {
	data      []string
	countries []string
	invert    bool
	format    string
	count     bool
}

func newGeoCmd(g *globals) *cobra.Command {
	var o geoOpts
	cmd := &cobra.Command{
		Use:   "geo --countries CC[,CC...] [--invert] [--data FILE]...",
		Short: "Print the prefixes of countries, or of all other countries",
		Long: `Geo prints the fewest CIDR prefixes that cover exactly the addresses of the
given countries (ISO 3166-1 alpha-2 codes, either case; XK is Kosovo), IPv4
first, then IPv6, one per line. With --invert it prints those of every other
country in the data instead: addresses the data does not mention (private
and unallocated space) are in neither.

Without --data it uses the country data built into ipfence: ` + geo.Attribution + `
(data/geo/README.md). --data reads "first,last,CC" or "cidr,CC" CSV files,
or with --format rir-delegated RIR delegated-stats files; gzip is detected.
A bad row is an error naming its file and line, and nothing is printed.

A code that is not ISO 3166-1 alpha-2 and not in the data is an error (exit
status 2); a valid code the data lacks selects nothing.

--count prints the number of prefixes per family. With --json it prints one
object:
  {"countries":["IT"],"invert":false,"data":["builtin:country-ipv4.csv.gz",...],
   "attribution":"...","ipv4":["2.32.0.0/11",...],"ipv6":["2001:760::/32",...]}
where, with --count, "ipv4" and "ipv6" are {"prefixes":N} instead;
"attribution" is present when the built-in data was used.`,
		Example: `  ipfence geo --countries IT
  ipfence geo --countries IT,DE,FR --count
  ipfence geo --invert --countries AT,CH,DE > outside-dach.txt
  ipfence geo --data delegated-ripencc-extended-latest --format rir-delegated --countries IT`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGeo(cmd, g, o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.data, "data", nil, "read country data from `FILE`s (repeatable or comma-separated) instead of the built-in data")
	f.StringSliceVar(&o.countries, "countries", nil, "country `CODES`, comma-separated (required)")
	f.BoolVar(&o.invert, "invert", false, "print the prefixes of every other country in the data")
	f.StringVar(&o.format, "format", source.FormatCountryCSV, "format of the --data files: "+source.FormatCountryCSV+" or "+source.FormatRIRDelegated)
	f.BoolVar(&o.count, "count", false, "print the number of prefixes per family")
	return cmd
}

func runGeo(cmd *cobra.Command, g *globals, o geoOpts) error {
	var codes []string
	for _, c := range o.countries {
		if c = strings.TrimSpace(c); c != "" {
			codes = append(codes, strings.ToUpper(c))
		}
	}
	if len(codes) == 0 {
		return usageError{errors.New("geo needs --countries, e.g. --countries IT,DE")}
	}
	if o.format != source.FormatCountryCSV && o.format != source.FormatRIRDelegated {
		return usageError{fmt.Errorf("unknown --format %q: use %s or %s", o.format, source.FormatCountryCSV, source.FormatRIRDelegated)}
	}
	paths, builtin := o.data, len(o.data) == 0
	if builtin {
		if o.format != source.FormatCountryCSV {
			return usageError{fmt.Errorf("--format %s needs --data: the built-in data is %s", o.format, source.FormatCountryCSV)}
		}
		paths = []string{source.BuiltinPrefix + geo.IPv4, source.BuiltinPrefix + geo.IPv6}
	}

	l := source.Loader{Logger: g.logger}
	src, err := l.Load(cmd.Context(), source.Spec{Name: "geo", Format: o.format, Paths: paths})
	if err != nil {
		return err
	}
	set, err := src.Countries(codes, o.invert)
	var uc *source.UnknownCountryError
	if errors.As(err, &uc) {
		return usageError{err}
	} else if err != nil {
		return err
	}

	out := cmd.OutOrStdout()
	if !g.json {
		if o.count {
			v4, v6 := prefix.Count(set)
			_, err := fmt.Fprintf(out, "ipv4: %d prefixes\nipv6: %d prefixes\n", v4, v6)
			return err
		}
		return prefix.WriteCIDRs(out, set)
	}
	doc := geoJSON{Countries: codes, Invert: o.invert, Data: paths}
	if builtin {
		doc.Attribution = geo.Attribution
	}
	if o.count {
		v4, v6 := prefix.Count(set)
		doc.IPv4, doc.IPv6 = geoCount{v4}, geoCount{v6}
	} else {
		all := prefix.Prefixes(set)
		v4, _ := prefix.Count(set)
		doc.IPv4, doc.IPv6 = geoList(all[:v4]), geoList(all[v4:])
	}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	return enc.Encode(doc)
}

// geoJSON is the --json schema of `ipfence geo`.
type geoJSON struct {
	Countries   []string `json:"countries"` // upper case, as given
	Invert      bool     `json:"invert"`
	Data        []string `json:"data"` // files read; builtin:NAME for the built-in data
	Attribution string   `json:"attribution,omitempty"`
	IPv4        any      `json:"ipv4"` // []netip.Prefix, or geoCount with --count
	IPv6        any      `json:"ipv6"`
}

// geoCount is "ipv4" and "ipv6" of geoJSON with --count.
type geoCount struct {
	Prefixes int `json:"prefixes"`
}

// geoList makes an empty list print as [] rather than null.
func geoList(p []netip.Prefix) []netip.Prefix {
	if p == nil {
		return []netip.Prefix{}
	}
	return p
}
