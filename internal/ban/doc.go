// Package ban holds the bans of `ipfence ban` and of the daemon: prefixes
// blocked interactively or automatically, for a while or for good, kept
// apart from the compiled policy.
//
// A Ban is one banned prefix with its expiry and provenance. ParsePrefix
// and ParseTTL read what a user types; Guard refuses bans that would cut
// this host off (its own addresses, protected networks). A Set is the
// desired state of all bans in memory; its Elements are what the kernel
// sets must hold (single addresses for hash sets, disjoint prefixes with
// per-piece expiry for interval sets) and Diff turns one kernel content
// into another. A Store keeps bans on disk in a bbolt file so they survive
// restarts.
//
// Everything but Store is pure and deterministic: no clock is read here,
// callers pass now.
//
// Errors wrap the sentinels ErrInvalid, ErrTooBroad, ErrProtected,
// ErrOwnAddress, ErrTTL and ErrLocked; match them with errors.Is.
package ban
