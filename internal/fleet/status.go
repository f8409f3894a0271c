package fleet

import (
	"cmp"
	"slices"
	"time"
)

// Status is what an agent reports about itself, at every change and as
// a heartbeat.
type Status struct {
	Host string `json:"host"`
	// Unreadable, set by the reader, says why what the host's key holds
	// is no status (the host is then reported failing).
	Unreadable string `json:"unreadable,omitempty"`
	Group      string `json:"group"`
	// Seq and Digest are the revision in force: the pointer the host
	// last applied and the bundle it runs.
	Seq     uint64    `json:"seq"`
	Digest  string    `json:"digest"`
	Applied time.Time `json:"applied,omitzero"` // when the bundle was applied
	// ApplyMillis is how long the last apply took, from the pointer
	// seen to the kernel committed (the jitter included); Mode says how
	// it loaded: "full", "update" or "none".
	ApplyMillis int64  `json:"apply_ms"`
	Mode        string `json:"mode,omitempty"`
	// Layout is "replayed" when the rules run the layouts the bundle
	// chose, "not replayed: WHY" when a rule whose bundle had one does
	// not (another backend, another set: the layout was chosen here, or
	// the backend builds its own tables), and "" for a bundle without
	// layouts.
	Layout string `json:"layout,omitempty"`
	// Fetched is how many bytes the revision in force took to fetch,
	// and Via how: "bundle", or "delta" (a difference from the one
	// before); 0 and "" when it needed no fetch (the same bundle, or
	// the last good one at start).
	Fetched    int64  `json:"fetched,omitempty"`
	Via        string `json:"via,omitempty"`
	Rules      int    `json:"rules"`
	PrefixesV4 int    `json:"prefixes_ipv4"`
	PrefixesV6 int    `json:"prefixes_ipv6"`
	Elements   int    `json:"elements"`
	Bans       int    `json:"bans"`
	Backend    string `json:"backend"`
	Kernel     string `json:"kernel"`
	Version    string `json:"version"`
	// LastError is why the host is not on the revision it should run
	// (FailedSeq, the pointer that named it); "" once it is.
	LastError string `json:"last_error,omitempty"`
	FailedSeq uint64 `json:"failed_seq,omitempty"`
	// Watermark is the highest revision of its group the host took or
	// refused: it takes no lower one (a replay), nor that one again
	// unless it is retrying it. A publisher whose key has no revision of
	// the group left follows it.
	Watermark uint64    `json:"watermark,omitempty"`
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
}

// HostState is where a host stands against its group's pointer.
type HostState string

const (
	Latest  HostState = "latest"  // runs the bundle the pointer gives it
	Behind  HostState = "behind"  // runs another one, no error (yet)
	Failing HostState = "failing" // tried the one it should run and failed
	Silent  HostState = "silent"  // no heartbeat for longer than allowed
	NoGroup HostState = "no-policy"
)

// HostReport is one host in a drift report.
type HostReport struct {
	Status
	State HostState `json:"state"`
	// Want is the bundle the host should run (nil: its group has no
	// pointer).
	Want *Target `json:"want,omitempty"`
	// Silence is how long ago the last heartbeat was.
	Silence time.Duration `json:"silence_ns"`
}

// Report is the drift report of a fleet: every host's state and the
// count per state.
type Report struct {
	Time     time.Time           `json:"time"`
	Pointers map[string]*Pointer `json:"pointers"`
	Hosts    []HostReport        `json:"hosts"`
	Counts   map[HostState]int   `json:"counts"`
}

// Drift compares each host's status with its group's pointer at now; a
// host without a heartbeat for silentAfter is silent, whatever it last
// said.
func Drift(pointers map[string]*Pointer, statuses []Status, now time.Time, silentAfter time.Duration) Report {
	r := Report{Time: now, Pointers: pointers, Counts: map[HostState]int{}}
	for _, s := range statuses {
		h := HostReport{Status: s, Silence: now.Sub(s.Heartbeat)}
		p := pointers[s.Group]
		if p != nil {
			want := p.For(s.Host)
			h.Want = &want
		}
		switch {
		case h.Silence > silentAfter:
			h.State = Silent
		case p == nil:
			h.State = NoGroup
		case s.Digest == h.Want.Digest:
			h.State = Latest
		case s.LastError != "":
			h.State = Failing
		default:
			h.State = Behind
		}
		r.Counts[h.State]++
		r.Hosts = append(r.Hosts, h)
	}
	slices.SortFunc(r.Hosts, func(a, b HostReport) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Host, b.Host))
	})
	return r
}
