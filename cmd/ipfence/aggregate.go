package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/prefix"
)

// aggregateOpts are the flags of `ipfence aggregate`.
type aggregateOpts struct {
	exclude    []string
	complement bool
	ranges     bool
	count      bool
}

func newAggregateCmd(g *globals) *cobra.Command {
	var o aggregateOpts
	cmd := &cobra.Command{
		Use:   "aggregate [FILE...]",
		Short: "Print the minimal exact CIDR cover of IP lists",
		Long: `Aggregate reads IP addresses, CIDR prefixes and first-last ranges, IPv4 and
IPv6, from each FILE (standard input when there is none, or for "-"), and
prints the fewest CIDR prefixes that cover exactly the same addresses: IPv4
first, then IPv6, each in address order, one per line, always with the
length (192.0.2.7/32).

For IPv4 the output is that of FireHOL's "iprange --print-suffix-ips /32"
(plain iprange prints a /32 as a bare address), and --ranges prints what
"iprange -j" does, except that a single address is printed alone rather
than as "A-A".

Input: one entry per line; comments after '#' or ';'; "A/N" with host bits
set means its network; "A/255.255.255.0" netmasks; "A - B" ranges, each side
possibly a prefix. Octets with leading zeros (010.0.0.1) and hostnames are
errors. An error names the file and line, and nothing is printed.

--complement prints what the input does not hold, within the address
families the input has entries of (both when it has none). --exclude is
applied last: excluded addresses are never printed, with --complement too.

--count prints, per family, the number of prefixes, of maximal ranges and of
addresses. With --json it prints one object:
  {"ipv4":{"prefixes":N,"ranges":N,"addresses":"N"},"ipv6":{...}}
(addresses as a decimal string: IPv6 counts exceed 2^64). Otherwise --json
prints {"ipv4":["192.0.2.0/24",...],"ipv6":[...]}, with ranges under
--ranges.`,
		Example: `  ipfence aggregate blocklist.netset
  cat a.txt b.txt | ipfence aggregate --exclude allow.txt
  ipfence aggregate --complement --ranges europe.txt
  ipfence aggregate --count --json firehol_level1.netset`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAggregate(cmd, g, o, args)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.exclude, "exclude", nil, "remove the addresses listed in `FILE` from the output (repeatable; - for stdin)")
	f.BoolVar(&o.complement, "complement", false, "print the addresses NOT in the input, within its address families")
	f.BoolVar(&o.ranges, "ranges", false, "print maximal first-last ranges instead of CIDR prefixes")
	f.BoolVar(&o.count, "count", false, "print the number of prefixes, ranges and addresses per family")
	cmd.MarkFlagsMutuallyExclusive("ranges", "count")
	return cmd
}

func runAggregate(cmd *cobra.Command, g *globals, o aggregateOpts, args []string) error {
	if len(args) == 0 {
		args = []string{"-"}
	}
	if n := countStdin(args) + countStdin(o.exclude); n > 1 {
		return usageError{errors.New(`standard input ("-") can be read only once`)}
	}
	var b prefix.Builder
	for _, name := range args {
		if err := readList(cmd, name, b.Read); err != nil {
			return err
		}
	}
	v4, v6 := b.Len()
	g.logger.Debug("read input", "files", len(args), "ipv4_entries", v4, "ipv6_entries", v6)
	if o.complement {
		set, err := b.Build()
		if err != nil {
			return fmt.Errorf("aggregating: %w", err)
		}
		none := v4 == 0 && v6 == 0
		b = prefix.Builder{}
		b.AddSet(prefix.Complement(set, v4 > 0 || none, v6 > 0 || none))
	}
	for _, name := range o.exclude {
		err := readList(cmd, name, func(r io.Reader, file string) error {
			return prefix.Read(r, file, func(rng netipx.IPRange, _ int) { b.RemoveRange(rng) })
		})
		if err != nil {
			return err
		}
	}
	set, err := b.Build()
	if err != nil {
		return fmt.Errorf("aggregating: %w", err)
	}

	out := cmd.OutOrStdout()
	switch {
	case o.count:
		return writeCounts(out, set, g.json)
	case g.json:
		return prefix.WriteJSON(out, set, o.ranges)
	case o.ranges:
		return prefix.WriteRanges(out, set)
	}
	return prefix.WriteCIDRs(out, set)
}

// readList calls read with the named list, or with standard input for "-".
func readList(cmd *cobra.Command, name string, read func(r io.Reader, file string) error) error {
	if name == "-" {
		return read(cmd.InOrStdin(), "stdin")
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return read(f, name)
}

func countStdin(names []string) int {
	n := 0
	for _, name := range names {
		if name == "-" {
			n++
		}
	}
	return n
}

// familyCounts is the --count --json schema for one family.
type familyCounts struct {
	Prefixes  int    `json:"prefixes"`
	Ranges    int    `json:"ranges"`
	Addresses string `json:"addresses"` // decimal: IPv6 counts exceed 2^64
}

func writeCounts(w io.Writer, set *prefix.Set, asJSON bool) error {
	p4, p6 := prefix.Count(set)
	a4, a6 := prefix.NumAddrs(set)
	r4, r6 := 0, 0
	for _, r := range set.Ranges() {
		if r.From().Is4() {
			r4++
		} else {
			r6++
		}
	}
	counts := struct {
		IPv4 familyCounts `json:"ipv4"`
		IPv6 familyCounts `json:"ipv6"`
	}{
		familyCounts{p4, r4, strconv.FormatUint(a4, 10)},
		familyCounts{p6, r6, a6.String()},
	}
	if asJSON {
		return json.NewEncoder(w).Encode(counts)
	}
	_, err := fmt.Fprintf(w, "ipv4: %d prefixes, %d ranges, %s addresses\nipv6: %d prefixes, %d ranges, %s addresses\n",
		counts.IPv4.Prefixes, counts.IPv4.Ranges, counts.IPv4.Addresses,
		counts.IPv6.Prefixes, counts.IPv6.Ranges, counts.IPv6.Addresses)
	return err
}
