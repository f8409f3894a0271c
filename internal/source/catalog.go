package source

import (
	"slices"
	"strings"
	"time"
)

// A CatalogEntry is a feed known by name: a policy's source says
// `catalog: NAME` where it would give the feed's URLs, format and refresh
// (`ipfence feeds` lists them). The catalog is data in the binary: its
// URLs are the publishers' current ones (Spamhaus DROP as JSON, which
// merged EDROP in 2024 and is the only form of DROPv6).
type CatalogEntry struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Use is what the feed is for: "block" (threats) or "allow" (a
	// provider's published ranges, for an allow rule).
	Use     string        `json:"use"`
	Format  string        `json:"format"`
	URLs    []string      `json:"urls"`
	Refresh time.Duration `json:"refresh_ns"`
	// Licence is the publisher's terms, in short, and where they are.
	Licence string `json:"licence"`
	// Note is what to know before using it ("" when nothing).
	Note string `json:"note,omitempty"`
	// MinRefresh is the shortest refresh the publisher allows: a
	// source's own refresh may not be shorter.
	MinRefresh time.Duration `json:"min_refresh_ns"`
	// AllowBroad: the feed holds prefixes broader than /8 or /16 on
	// purpose (Spec.AllowBroad).
	AllowBroad bool `json:"allow_broad,omitempty"`
	// NoShrinkGate: the feed is small and changes wholesale (a few
	// hundred live servers), so a load that lost half of it is news,
	// not a failure: the shrink gate is off unless the source sets
	// max_shrink.
	NoShrinkGate bool `json:"no_shrink_gate,omitempty"`
}

// The uses of catalog entries.
const (
	UseBlock = "block"
	UseAllow = "allow"
)

// catalog is the entries, by name.
var catalog = []CatalogEntry{
	{Name: "spamhaus-drop", Title: "Spamhaus DROP (Don't Route Or Peer), IPv4 and IPv6, EDROP included", Use: UseBlock, Format: FormatSpamhausJSON,
		URLs:    []string{"https://www.spamhaus.org/drop/drop_v4.json", "https://www.spamhaus.org/drop/drop_v6.json"},
		Refresh: 12 * time.Hour, MinRefresh: time.Hour,
		Licence: "free to use under Spamhaus's DROP terms, https://www.spamhaus.org/blocklists/do-not-route-or-peer/; fetch at most once an hour",
		Note:    "netblocks hijacked or leased by professional spam and cyber-crime operations: safe to drop both ways (direction: both)"},
	{Name: "firehol-level1", Title: "FireHOL level 1: attacks, with minimum false positives", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://iplists.firehol.org/files/firehol_level1.netset"},
		Refresh: time.Hour, MinRefresh: 5 * time.Minute,
		Licence: "compiled by FireHOL from lists under their own terms, https://iplists.firehol.org/",
		Note: "inbound only (never direction: out or both): it holds the unroutable (bogon) ranges, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, " +
			"100.64.0.0/10 (carrier-grade NAT, Tailscale) and 224.0.0.0/3 (multicast: VRRP, mDNS, OSPF) among them; list your private networks " +
			"and the ones your admins connect from under protect:, or ipfence refuses the rule where it would block this host's own addresses",
		AllowBroad: true}, // 224.0.0.0/3
	{Name: "firehol-level2", Title: "FireHOL level 2: attacks seen in the last 48 hours", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://iplists.firehol.org/files/firehol_level2.netset"},
		Refresh: time.Hour, MinRefresh: 5 * time.Minute,
		Licence: "compiled by FireHOL from lists under their own terms, https://iplists.firehol.org/",
		Note:    "more false positives than level 1: dynamic addresses of infected hosts; inbound only"},
	{Name: "firehol-level3", Title: "FireHOL level 3: attacks, spyware and viruses seen in the last 30 days", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://iplists.firehol.org/files/firehol_level3.netset"},
		Refresh: time.Hour, MinRefresh: 5 * time.Minute,
		Licence: "compiled by FireHOL from lists under their own terms, https://iplists.firehol.org/",
		Note:    "the most false positives of the three (it has listed CDN and code-hosting addresses): inbound only, and try it in monitor mode first (mode: monitor)"},
	{Name: "feodo", Title: "abuse.ch Feodo Tracker: botnet command-and-control servers (recommended list)", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://feodotracker.abuse.ch/downloads/ipblocklist_recommended.txt"},
		Refresh: 30 * time.Minute, MinRefresh: 5 * time.Minute,
		Licence:      "CC0, abuse.ch, https://feodotracker.abuse.ch/blocklist/",
		Note:         "tens to hundreds of live servers, so its size swings (the shrink gate is off unless max_shrink says otherwise); drop both ways (direction: both) to cut infected hosts off from their controllers",
		NoShrinkGate: true},
	{Name: "blocklist-de", Title: "blocklist.de: all addresses reported for attacks in the last 48 hours", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://lists.blocklist.de/lists/all.txt"},
		Refresh: time.Hour, MinRefresh: 15 * time.Minute,
		Licence: "free to use, https://www.blocklist.de/en/export.html",
		Note:    "fail2ban reports from many servers: addresses of compromised hosts, IPv4 and IPv6; inbound only"},
	{Name: "tor-exits", Title: "Tor exit nodes", Use: UseBlock, Format: FormatList,
		URLs:    []string{"https://check.torproject.org/torbulkexitlist"},
		Refresh: time.Hour, MinRefresh: 30 * time.Minute,
		Licence: "published by the Tor Project, https://check.torproject.org/",
		Note:    "blocks Tor users, not attackers as such: a policy choice"},
	{Name: "cloudflare", Title: "Cloudflare's published ranges (its proxies)", Use: UseAllow, Format: FormatList,
		URLs:    []string{"https://www.cloudflare.com/ips-v4", "https://www.cloudflare.com/ips-v6"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by Cloudflare for allowlists, https://www.cloudflare.com/ips/",
		Note:    "for an origin behind Cloudflare: allow-only these on ports 80 and 443"},
	{Name: "fastly", Title: "Fastly's published ranges (its caches)", Use: UseAllow, Format: FormatFastlyJSON,
		URLs:    []string{"https://api.fastly.com/public-ip-list"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by Fastly for allowlists, https://api.fastly.com/public-ip-list"},
	{Name: "google-cloud", Title: "Google Cloud's external ranges, by scope (region): its customers' VMs", Use: UseAllow, Format: FormatGoogleJSON,
		URLs:    []string{"https://www.gstatic.com/ipranges/cloud.json"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by Google, https://support.google.com/a/answer/10026322",
		Note:    "regions: picks scopes (europe-west1, ...); these are anyone's VMs, not Google"},
	{Name: "google", Title: "Google's ranges (goog.json): its services, and Google Cloud's customers", Use: UseAllow, Format: FormatGoogleJSON,
		URLs:    []string{"https://www.gstatic.com/ipranges/goog.json"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by Google, https://support.google.com/a/answer/10026322",
		Note:    "holds cloud.json's ranges too (Google documents its own services as goog.json minus cloud.json): allowing it allows every Google Cloud VM"},
	{Name: "aws", Title: "Amazon Web Services' ranges, by service and region", Use: UseAllow, Format: FormatAWSJSON,
		URLs:    []string{"https://ip-ranges.amazonaws.com/ip-ranges.json"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by AWS, https://docs.aws.amazon.com/vpc/latest/userguide/aws-ip-ranges.html",
		Note:    "services: and regions: pick (CLOUDFRONT, ROUTE53_HEALTHCHECKS, EC2; eu-central-1, ...); all of AWS is most of its customers too"},
	{Name: "github", Title: "GitHub's ranges (meta API), by service", Use: UseAllow, Format: FormatGitHubMeta,
		URLs:    []string{"https://api.github.com/meta"},
		Refresh: 24 * time.Hour, MinRefresh: time.Hour,
		Licence: "published by GitHub, https://docs.github.com/en/rest/meta/meta",
		Note:    "services: picks the lists (hooks for webhooks, git, web, api, ...); actions is most of Azure, anyone's machines"},
}

// Catalog is the catalog's entries, in order.
func Catalog() []CatalogEntry {
	out := slices.Clone(catalog)
	for i := range out {
		out[i].URLs = slices.Clone(out[i].URLs)
	}
	return out
}

// LookupCatalog is the entry named name.
func LookupCatalog(name string) (CatalogEntry, bool) {
	i := slices.IndexFunc(catalog, func(e CatalogEntry) bool { return e.Name == name })
	if i < 0 {
		return CatalogEntry{}, false
	}
	e := catalog[i]
	e.URLs = slices.Clone(e.URLs)
	return e, true
}

// CatalogNames is the entries' names, comma-separated: what an unknown
// name's error lists.
func CatalogNames() string {
	var names []string
	for _, e := range catalog {
		names = append(names, e.Name)
	}
	return strings.Join(names, ", ")
}
