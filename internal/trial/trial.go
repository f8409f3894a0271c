// Package trial is commit-confirmed apply (`ipfence apply --confirm 2m`):
// an apply on trial puts the ruleset it replaced back by itself unless
// `ipfence confirm` runs within its window, as Juniper's commit
// confirmed, iptables-apply or netplan try do. An operator who locks
// themselves out over SSH gets the old ruleset back.
//
// What is put back is a revision: every apply keeps a copy of what it
// loaded (the policy resolved, as a fleet bundle: its rules and their
// prefixes, whatever the sources say later) beside the record of what
// it applied. A trial copies the revision in force aside before it
// loads, and a process that is not the command's own (a transient
// systemd unit where systemd runs the host, else a process in a session
// of its own, which a closed SSH connection does not reach) waits for
// the window to end and loads that copy again. A reboot within the
// window kills that process: the boot-time restore (`apply --offline`)
// rolls the trial back instead, and then, like a daemon starting, loads
// the last confirmed revision for as long as the policy file is the one
// that was not confirmed.
package trial

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// The bounds of a trial's window.
const (
	MinWindow = 5 * time.Second
	MaxWindow = 24 * time.Hour
)

var (
	// ErrOnTrial: an apply is on trial, and this one would end it
	// without a confirmation.
	ErrOnTrial = errors.New("a ruleset is on trial")
	// ErrNoRevision: what is in force has no copy to put back.
	ErrNoRevision = errors.New("no copy of the ruleset in force to put back")
	// ErrNoTrial: nothing is on trial (to confirm, or roll back).
	ErrNoTrial = errors.New("nothing is on trial")
	// ErrTooLate: the trial's window ended before the confirmation.
	ErrTooLate = errors.New("too late: the trial's window has ended")
)

// ErrWindow: a trial's window out of bounds.
var ErrWindow = errors.New("a trial's window is out of bounds")

// CheckWindow checks a trial's window.
func CheckWindow(d time.Duration) error {
	if d < MinWindow || d > MaxWindow {
		return fmt.Errorf("%w: give %v to %v, not %v", ErrWindow, MinWindow, MaxWindow, d)
	}
	return nil
}

// Revision is the record of a kept copy of what an apply loaded.
type Revision struct {
	// Applied is the time of the applied record (statedir.Head) the
	// copy goes with: a copy of another load is no copy of what is in
	// force.
	Applied time.Time `json:"applied"`
	// Digest is the bundle file's SHA-256.
	Digest string `json:"digest"`
	// Policy is the policy file, and PolicyDigest its text's SHA-256.
	Policy       string `json:"policy"`
	PolicyDigest string `json:"policy_digest"`
	// Backend is where it ran (auto and --backend resolved), Flavour the
	// iptables flavour of the iptables backends, MonitorAll whether it
	// was applied with --monitor.
	Backend    plan.Backend `json:"backend"`
	Flavour    string       `json:"iptables_flavour,omitempty"`
	MonitorAll bool         `json:"monitor_all,omitempty"`
	// Nothing: nothing of ipfence's is in force by the operator's word
	// (a trial with nothing before it was rolled back): there is no
	// copy, and nothing is what a refused policy file stands in for.
	Nothing bool `json:"nothing,omitempty"`
}

// Pending is an apply on trial.
type Pending struct {
	// ID names the trial to the process that rolls it back: a trial
	// applied again gets a new one, and the old process stops.
	ID       string        `json:"id"`
	Started  time.Time     `json:"started"`
	Window   time.Duration `json:"window_ns"`
	Deadline time.Time     `json:"deadline"`
	// Trial is the trial's applied record's time, once it is loaded.
	Trial time.Time `json:"trial,omitzero"`
	// Back is the revision that is put back (its copy beside this
	// record); nil when nothing of ipfence's was loaded: the rollback
	// flushes Table.
	Back  *Revision `json:"back,omitempty"`
	Table string    `json:"table"`
	// Policy and PolicyDigest are the trial's policy file and its
	// text's SHA-256.
	Policy       string `json:"policy"`
	PolicyDigest string `json:"policy_digest"`
	// PinDir and XDPGeneric are the XDP options the apply ran with.
	PinDir     string `json:"pin_dir,omitempty"`
	XDPGeneric bool   `json:"xdp_generic,omitempty"`
	// Armed says what rolls the trial back.
	Armed string `json:"armed,omitempty"`
	// Daemon: the daemon's trial (`ipfence reload --confirm`), which the
	// daemon rolls back itself, and whose Back is Previous: the policy
	// text it ran before the trial (with its sources as they are when
	// it is put back).
	Daemon   bool   `json:"daemon,omitempty"`
	Previous string `json:"previous,omitempty"`
}

// DaemonRefusal is the refusal of p, a daemon's trial rolled back for
// why at now: its policy file as it is then (an edit during the trial is
// unconfirmed too), with the text the daemon ran before in its place.
func (p *Pending) DaemonRefusal(why string, now time.Time) Refused {
	return Refused{Time: now.UTC(), Policy: p.Policy, PolicyDigest: FileDigest(p.Policy, p.PolicyDigest), Table: p.Table, Why: why, Instead: p.Previous}
}

// Refused is the policy of a trial that was rolled back.
type Refused struct {
	Time         time.Time `json:"time"`
	Policy       string    `json:"policy"`
	PolicyDigest string    `json:"policy_digest"`
	// Table is the trial's table: what a stand-in for nothing is named.
	Table string `json:"table"`
	// Why: "not confirmed in time", "rolled back by ipfence confirm
	// --rollback", "the host restarted within the trial's window".
	Why string `json:"why"`
	// Instead is the policy text loaded in the file's place (a daemon's
	// trial: the policy it ran before); "" for the revision in force.
	Instead string `json:"instead,omitempty"`
}

// Store is the revisions and trial of one namespace in a state folder.
type Store struct {
	Dir   statedir.Dir
	NetNS string
}

func (s Store) key() string { return netns.Key(s.NetNS) }

func (s Store) revisionPath(ext string) string {
	return filepath.Join(s.Dir.Path, "revision", s.key()+ext)
}

func (s Store) trialPath(ext string) string {
	return filepath.Join(s.Dir.Path, "trial", s.key()+ext)
}

// LogPath is where the process that rolls a trial back logs, when
// systemd's journal does not take it.
func (s Store) LogPath() string { return s.trialPath(".log") }

// Digest is data's SHA-256, in hex.
func Digest(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// FileDigest is the SHA-256 of the file at path, in hex, or def when it
// cannot be read.
func FileDigest(path, def string) string {
	text, err := os.ReadFile(path)
	if err != nil {
		return def
	}
	return Digest(text)
}

// NewID is a fresh trial ID.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail
	return hex.EncodeToString(b[:])
}

// WriteCandidate keeps what write writes, the bundle of what an apply is
// about to load, until CommitRevision makes it the revision in force, and
// returns its digest.
func (s Store) WriteCandidate(write func(io.Writer) error) (digest string, err error) {
	err = statedir.WriteFileAtomicFunc(s.revisionPath(".next.bundle"), func(w io.Writer) error {
		h := sha256.New()
		if err := write(io.MultiWriter(w, h)); err != nil {
			return err
		}
		digest = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return digest, err
}

// CommitRevision makes the candidate the revision in force, recorded as
// rev (its Digest the candidate's).
func (s Store) CommitRevision(rev Revision) error {
	if err := os.Rename(s.revisionPath(".next.bundle"), s.revisionPath(".bundle")); err != nil {
		return fmt.Errorf("keeping a copy of what was applied: %w", err)
	}
	return writeJSON(s.revisionPath(".json"), rev)
}

// DropCandidate removes a candidate that was not applied.
func (s Store) DropCandidate() { _ = os.Remove(s.revisionPath(".next.bundle")) }

// ForgetRevision removes the revision in force (nothing is loaded).
func (s Store) ForgetRevision() error {
	return errors.Join(removeIfAny(s.revisionPath(".json")), removeIfAny(s.revisionPath(".bundle")))
}

// confirmNothing records that nothing of ipfence's is in force by the
// operator's word (a rollback to nothing).
func (s Store) confirmNothing() error {
	return errors.Join(removeIfAny(s.revisionPath(".bundle")), writeJSON(s.revisionPath(".json"), Revision{Nothing: true}))
}

// Revision is the record of the revision in force (nil: none).
func (s Store) Revision() (*Revision, error) { return readJSON[Revision](s.revisionPath(".json")) }

// Pending is the apply on trial (nil: none).
func (s Store) Pending() (*Pending, error) { return readJSON[Pending](s.trialPath(".json")) }

// SavePending records p.
func (s Store) SavePending(p *Pending) error { return writeJSON(s.trialPath(".json"), p) }

// ClearPending removes the trial and the copy it would have put back.
func (s Store) ClearPending() error {
	return errors.Join(removeIfAny(s.trialPath(".json")), removeIfAny(s.trialPath(".bundle")))
}

// Refused is the policy of the last trial rolled back (nil: none, or
// one applied since).
func (s Store) Refused() (*Refused, error) { return readJSON[Refused](s.trialPath(".refused.json")) }

// ClearRefused forgets the refused policy: an apply of the operator's
// own says what is wanted now.
func (s Store) ClearRefused() error { return removeIfAny(s.trialPath(".refused.json")) }

// Refuse records r, the policy of a trial rolled back.
func (s Store) Refuse(r Refused) error { return writeJSON(s.trialPath(".refused.json"), r) }

// SetAside copies the revision in force, rev, beside the trial as the
// one to put back, checking its digest.
func (s Store) SetAside(rev *Revision) error {
	data, err := readDigested(s.revisionPath(".bundle"), rev.Digest)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoRevision, err)
	}
	return statedir.WriteFileAtomic(s.trialPath(".bundle"), data)
}

// backBundle reads the copy p puts back, checking its digest.
func (s Store) backBundle(p *Pending) ([]byte, error) {
	data, err := readDigested(s.trialPath(".bundle"), p.Back.Digest)
	if err != nil {
		return nil, fmt.Errorf("reading the revision to put back: %w", err)
	}
	return data, nil
}

// readDigested reads the file at path, which must be the one whose
// SHA-256 is digest.
func readDigested(path, digest string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if got := Digest(data); got != digest {
		return nil, fmt.Errorf("%s changed since it was written (SHA-256 %s, recorded %s)", path, got, digest)
	}
	return data, nil
}

// restoreRevision makes the copy p put back the revision in force again,
// now recorded for the applied record of time applied.
func (s Store) restoreRevision(p *Pending, data []byte, applied time.Time) error {
	if err := statedir.WriteFileAtomic(s.revisionPath(".bundle"), data); err != nil {
		return err
	}
	return s.stamp(*p.Back, applied)
}

// stamp records rev, its copy in place, as the revision of the applied
// record of time applied.
func (s Store) stamp(rev Revision, applied time.Time) error {
	rev.Applied = applied
	return writeJSON(s.revisionPath(".json"), rev)
}

func readJSON[T any](path string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return v, nil
}

func writeJSON(path string, v any) error {
	return statedir.WriteFileAtomicFunc(path, func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(v)
	})
}

// removeIfAny removes path if it is there, durably: a confirmation
// whose trial record came back after a reset would be rolled back.
func removeIfAny(path string) error {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return statedir.SyncDir(filepath.Dir(path))
}
