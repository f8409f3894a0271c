// Package api is the daemon's local API: HTTP/JSON over a Unix socket,
// versioned under /v1, and a typed client for it.
//
//	POST   /v1/bans            {"prefix": "203.0.113.5", "ttl": "1h", "reason": "ssh"}
//	                           or {"prefixes": [...], "ttl": ..., "reason": ..., "origin": ...,
//	                               "quiet": true (answer with the count only)}
//	DELETE /v1/bans/{prefix}   e.g. /v1/bans/203.0.113.0/24
//	GET    /v1/bans            ?within=PREFIX&origin=NAME&offset=N&limit=N
//	GET    /v1/bans/count
//	POST   /v1/allows          {"prefix": "198.51.100.7", "ttl": "1h", "reason": "vendor"}
//	                           or {"prefixes": [...], ...}: allow entries, which beat every rule and ban
//	DELETE /v1/allows/{prefix}
//	GET    /v1/allows          ?within=PREFIX&origin=NAME&offset=N&limit=N
//	GET    /v1/status
//	POST   /v1/reload
//	GET    /v1/explain         ?addr=ADDR&proto=tcp&port=22
//
// Errors are 4xx/5xx responses with an Error body; nothing was changed.
package api

import (
	"time"

	"github.com/ipfence/ipfence/internal/ban"
)

// MaxBody bounds a request's body (a bulk ban of about 100,000
// addresses); the daemon refuses longer ones.
const MaxBody = 8 << 20

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/ipfence/api.sock"

// BanRequest asks for one or more bans with the same TTL, reason and
// origin. Prefix and Prefixes may both be given.
type BanRequest struct {
	Prefix   string   `json:"prefix,omitempty"`
	Prefixes []string `json:"prefixes,omitempty"`
	// TTL is a duration ("90s", "1h", "7d"); empty: for good.
	TTL    string `json:"ttl,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Origin says who bans ("fail2ban", "crowdsec", ...); default "api".
	Origin string `json:"origin,omitempty"`
	// NoShorten keeps a ban of a prefix from another origin that lasts at
	// least as long (see bansets.Request).
	NoShorten bool `json:"no_shorten,omitempty"`
	// Quiet asks for the count of bans made only, not the list (for bulk
	// loads: the list of 50,000 bans costs more to encode than to make).
	Quiet bool `json:"quiet,omitempty"`
}

// BanResponse lists the bans made (none with Quiet) and counts them.
type BanResponse struct {
	Banned []ban.Ban `json:"banned,omitempty"`
	Count  int       `json:"count"`
}

// AllowRequest asks for one or more allow entries with the same TTL,
// reason and origin. Prefix and Prefixes may both be given.
type AllowRequest struct {
	Prefix   string   `json:"prefix,omitempty"`
	Prefixes []string `json:"prefixes,omitempty"`
	// TTL is a duration ("90s", "1h", "7d"); empty: for good.
	TTL    string `json:"ttl,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Origin says who allows; default "api".
	Origin string `json:"origin,omitempty"`
}

// AllowResponse lists the allow entries made.
type AllowResponse struct {
	Allowed []ban.Ban `json:"allowed"`
}

// UnallowResponse lists the allow entries removed (none when the prefix
// had none).
type UnallowResponse struct {
	Unallowed []ban.Ban `json:"unallowed"`
}

// AllowList is a page of allow entries.
type AllowList struct {
	Allows []ban.Ban `json:"allows"`
	Total  int       `json:"total"` // matching entries before paging
	Counts Counts    `json:"counts"`
}

// UnbanResponse lists the bans lifted (none when the prefix was not
// banned).
type UnbanResponse struct {
	Unbanned []ban.Ban `json:"unbanned"`
}

// BanList is a page of bans.
type BanList struct {
	Bans   []ban.Ban `json:"bans"`
	Total  int       `json:"total"` // matching bans before paging
	Counts Counts    `json:"counts"`
}

// Counts counts the bans in force.
type Counts struct {
	Total    int            `json:"total"`
	Addr4    int            `json:"addresses_ipv4"`
	Addr6    int            `json:"addresses_ipv6"`
	Net4     int            `json:"prefixes_ipv4"`
	Net6     int            `json:"prefixes_ipv6"`
	ByOrigin map[string]int `json:"by_origin"`
}

// CountsOf converts ban.Counts.
func CountsOf(c ban.Counts) Counts {
	return Counts{Total: c.Total(), Addr4: c.Addr4, Addr6: c.Addr6, Net4: c.Net4, Net6: c.Net6, ByOrigin: c.ByOrigin}
}

// Status is what the daemon runs.
type Status struct {
	Policy    string       `json:"policy"`
	NetNS     string       `json:"netns,omitempty"`
	Table     string       `json:"table"`
	Started   time.Time    `json:"started"`
	Applied   time.Time    `json:"applied"`
	Rules     []RuleStatus `json:"rules"`
	Sources   []Source     `json:"sources"`
	Bans      Counts       `json:"bans"`
	Allows    Counts       `json:"allows"`
	Elements  int          `json:"nft_elements"`
	Drift     int          `json:"drift_repairs"`
	LastError string       `json:"last_error,omitempty"`
}

// RuleStatus is one rule of the applied policy.
type RuleStatus struct {
	Name    string `json:"name"`
	Action  string `json:"action"`
	Backend string `json:"backend"` // nftables or xdp
	// Mode is "monitor" for a rule that only counts what it would
	// drop or reject, "enforce" otherwise.
	Mode       string `json:"mode"`
	PrefixesV4 int    `json:"prefixes_ipv4"`
	PrefixesV6 int    `json:"prefixes_ipv6"`
	// Layout is "replayed" when the rule runs the layout its fleet
	// bundle chose, "not replayed: WHY" when the bundle chose one this
	// host could not use, and "" otherwise.
	Layout string `json:"layout,omitempty"`
}

// Source is one source of the policy and how fresh it is.
type Source struct {
	Name string `json:"name"`
	// Kind is "crowdsec" for a crowdsec source, whose Loaded is the last
	// good pull and whose prefix counts are the bans it holds; empty for
	// the sources of the rules' sets.
	Kind       string    `json:"kind,omitempty"`
	Loaded     time.Time `json:"loaded"`  // last load that went into the kernel
	Checked    time.Time `json:"checked"` // last attempt
	Refresh    string    `json:"refresh"`
	Stale      bool      `json:"stale,omitempty"` // serving a cached copy
	LastError  string    `json:"last_error,omitempty"`
	PrefixesV4 int       `json:"prefixes_ipv4"`
	PrefixesV6 int       `json:"prefixes_ipv6"`
}

// ReloadResponse says what a reload changed.
type ReloadResponse struct {
	Changed  bool   `json:"changed"`
	Mode     string `json:"mode"` // "none", "update" (diff), "full"
	Millis   int64  `json:"ms"`
	Elements int    `json:"nft_elements"`
	// Trial is the reload on trial (POST /v1/reload?confirm=2m).
	Trial *Trial `json:"trial,omitempty"`
}

// Trial is a reload on trial: unless POST /v1/confirm comes before
// Deadline, the daemon loads the policy it ran before again.
type Trial struct {
	Policy   string    `json:"policy"`
	Deadline time.Time `json:"deadline"`
	Window   string    `json:"window"`
}

// ConfirmResponse says how a trial ended (POST /v1/confirm, with
// ?rollback=1 to put the policy before it back now).
type ConfirmResponse struct {
	Policy     string `json:"policy"`
	RolledBack bool   `json:"rolled_back"`
}

// Explanation says which rule decides a packet.
type Explanation struct {
	Addr    string   `json:"addr"`
	Verdict string   `json:"verdict"`
	Rule    string   `json:"rule,omitempty"`
	Banned  *ban.Ban `json:"ban,omitempty"`
	// Allowed is the allow entry that lets the address in, whatever
	// the rules and bans say (Rule "allow").
	Allowed *ban.Ban `json:"allow,omitempty"`
	// Monitored are the rules in monitor mode that would have dropped
	// or rejected it (they only count it).
	Monitored []string `json:"monitored,omitempty"`
	Detail    []string `json:"detail,omitempty"`
}

// Error is the body of an error response.
type Error struct {
	// Code is a stable word: "invalid", "too_broad", "protected",
	// "own_address", "ttl", "bad_request", "not_found", "internal".
	Code    string `json:"code"`
	Message string `json:"error"`
	// Status is the HTTP status (not sent; set by the client).
	Status int `json:"-"`
}

func (e *Error) Error() string { return e.Message }
