package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/source"
)

func newFeedsCmd(g *globals) *cobra.Command {
	var long bool
	c := &cobra.Command{
		Use:   "feeds [-l]",
		Short: "List the feed catalog: the feeds a source names with `catalog: NAME`",
		Long: `Feeds lists the catalog: feeds that a policy's source names with catalog: NAME
in place of their URLs, format and refresh (a source's own refresh: and, for
JSON feeds, services: and regions: stand). -l adds the URLs, the licence and a
note on each. For example:

  sources:
    drop:       {catalog: spamhaus-drop}
    cloudflare: {catalog: cloudflare}
  rules:
    - {name: drop, action: drop, direction: both, match: {source: drop}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.json {
				return writeJSON(cmd.OutOrStdout(), source.Catalog())
			}
			printFeeds(cmd.OutOrStdout(), source.Catalog(), long)
			return nil
		},
	}
	c.Flags().BoolVarP(&long, "long", "l", false, "also the URLs, licence and notes")
	return c
}

func printFeeds(w io.Writer, es []source.CatalogEntry, long bool) {
	fmt.Fprintf(w, "%-15s %-5s %-14s %-8s %s\n", "NAME", "USE", "FORMAT", "REFRESH", "WHAT")
	for _, e := range es {
		fmt.Fprintf(w, "%-15s %-5s %-14s %-8s %s\n", e.Name, e.Use, e.Format, shortDuration(e.Refresh), e.Title)
		if !long {
			continue
		}
		for _, u := range e.URLs {
			fmt.Fprintf(w, "    %s\n", u)
		}
		fmt.Fprintf(w, "    licence: %s\n", e.Licence)
		fmt.Fprintf(w, "    refresh: at most every %s\n", shortDuration(e.MinRefresh))
		if e.Note != "" {
			fmt.Fprintf(w, "    note: %s\n", e.Note)
		}
	}
}

// shortDuration is d without its zero units: 12h, 30m, 1h30m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
