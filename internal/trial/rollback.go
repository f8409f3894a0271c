package trial

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
)

// Roller puts a trial's revision back.
type Roller struct {
	Store  Store
	Target *apply.Target // Store's namespace and folder
	Logger *slog.Logger
}

// Roll puts p's Back in force again (or, with none, flushes what the
// trial loaded), records the trial's policy as refused for why, and
// ends the trial. The caller holds the state folder's lock. On an error
// the trial stays recorded. XDP is run as the trial's apply ran it.
func (r *Roller) Roll(ctx context.Context, p *Pending, why string) (*apply.Report, error) {
	if p.PinDir != "" {
		t := *r.Target // the caller's (a daemon's) keeps its own
		t.XDP.PinDir, t.XDP.Generic = p.PinDir, p.XDPGeneric
		r = &Roller{Store: r.Store, Target: &t, Logger: r.Logger}
	}
	var rep *apply.Report
	if p.Back == nil {
		if _, err := r.Target.Flush(ctx, p.Table); err != nil {
			return nil, err
		}
		if err := r.Store.confirmNothing(); err != nil {
			r.Logger.Warn("recording that nothing is in force", "err", err)
		}
	} else {
		var err error
		if rep, err = r.load(ctx, p); err != nil {
			return nil, err
		}
	}
	if err := r.Store.Refuse(Refused{Time: time.Now().UTC(), Policy: p.Policy, PolicyDigest: p.PolicyDigest, Table: p.Table, Why: why}); err != nil {
		r.Logger.Warn("recording the policy that was rolled back", "err", err)
	}
	return rep, r.Store.ClearPending()
}

// load applies p's Back, with the bans in force, as it was applied.
func (r *Roller) load(ctx context.Context, p *Pending) (*apply.Report, error) {
	data, err := r.Store.backBundle(p)
	if err != nil {
		return nil, err
	}
	rep, err := r.Apply(ctx, data, p.Back)
	if err != nil {
		return nil, err
	}
	if p.Table != rep.Applied.Table {
		// The trial renamed the table: the apply removed the trial's.
		r.Logger.Info("the trial's table was removed", "table", p.Table)
	}
	if err := r.Store.restoreRevision(p, data, rep.Applied.Time); err != nil {
		r.Logger.Warn("keeping the copy of what was put back", "err", err)
	}
	return rep, nil
}

// Apply loads the revision whose bundle is data, recorded as rev, with
// the bans in force. The caller holds the state folder's lock.
func (r *Roller) Apply(ctx context.Context, data []byte, rev *Revision) (*apply.Report, error) {
	in, err := input(data)
	if err != nil {
		return nil, err
	}
	return r.applyInput(ctx, in, rev)
}

// applyInput loads in, of revision rev, with the bans in force.
func (r *Roller) applyInput(ctx context.Context, in *plan.Input, rev *Revision) (*apply.Report, error) {
	c, err := apply.Compile(in, apply.CompileOptions{Backend: rev.Backend, IPTables: rev.Flavour, Logger: r.Logger, Consume: true})
	if err != nil {
		return nil, fmt.Errorf("compiling the revision applied at %s: %w", rev.Applied.Format(time.RFC3339), err)
	}
	bans, err := r.Target.OpenBans(ctx, c.Plan.Table, false)
	if err != nil {
		return nil, err
	}
	defer bans.Close()
	// Repair: the revision passed the host-address check when it was
	// applied; an address the host gained since must not keep it from
	// coming back.
	return r.Target.Apply(ctx, c, bans.Lists, apply.Options{MonitorAll: rev.MonitorAll, Repair: true})
}

// LoadConfirmed loads in, the revision in force rev (the last one
// confirmed, after a rollback: StandIn's) again: the boot-time restore's
// stand-in for a policy file that was refused.
func (r *Roller) LoadConfirmed(ctx context.Context, in *plan.Input, rev *Revision) (*apply.Report, error) {
	rep, err := r.applyInput(ctx, in, rev)
	if err != nil {
		return nil, err
	}
	if err := r.Store.stamp(*rev, rep.Applied.Time); err != nil {
		r.Logger.Warn("recording the copy of what was applied", "err", err)
	}
	return rep, nil
}

// StandIn is what to load in place of the policy file policyFile: the
// revision in force (the last confirmed), when policyFile is the one a
// trial was rolled back from; nil when it is not (load the file). When
// nothing was confirmed (a rollback to nothing), it is an input without
// rules, and rev.Nothing. With ref.Instead (a daemon's trial rolled
// back) there is no input: load that text. A daemon asks it at each
// load: the file is loaded again once it changes.
func (s Store) StandIn(policyFile string) (in *plan.Input, rev *Revision, ref *Refused, err error) {
	ref, err = s.Refusal(policyFile)
	if err != nil || ref == nil || ref.Instead != "" {
		return nil, nil, ref, err // the file, or the text instead
	}
	data, rev, err := s.confirmed()
	if err == nil && rev.Nothing {
		return &plan.Input{Table: ref.Table}, rev, ref, nil
	}
	if err == nil {
		if in, err = input(data); err == nil {
			return in, rev, ref, nil
		}
	}
	return nil, nil, ref, fmt.Errorf("%s was rolled back (%s), and the ruleset confirmed before it cannot be read: %w; edit the policy file (any change), or apply it without --confirm, or remove %s",
		policyFile, ref.Why, err, s.trialPath(".refused.json"))
}

// Refusal is the refusal of policyFile: nil when no trial of it was
// rolled back, or the file changed since (load it). A refusal of
// another text is stale, the operator having moved on: it is removed,
// so that going back to the refused text later is their word too.
func (s Store) Refusal(policyFile string) (*Refused, error) {
	ref, err := s.Refused()
	if err != nil || ref == nil {
		return nil, err
	}
	text, err := os.ReadFile(policyFile)
	if err != nil {
		return nil, nil // loaded (or refused) as usual
	}
	if Digest(text) != ref.PolicyDigest {
		return nil, s.ClearRefused()
	}
	return ref, nil
}

// input is the plan input of the bundle data.
func input(data []byte) (*plan.Input, error) {
	b, err := fleet.DecodeLocal(data)
	if err != nil {
		return nil, err
	}
	return b.Input()
}

// confirmed reads the revision in force and its bundle.
func (s Store) confirmed() ([]byte, *Revision, error) {
	rev, err := s.Revision()
	if err != nil {
		return nil, nil, err
	}
	if rev == nil {
		return nil, nil, ErrNoRevision
	}
	if rev.Nothing {
		return nil, rev, nil
	}
	data, err := readDigested(s.revisionPath(".bundle"), rev.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrNoRevision, err)
	}
	return data, rev, nil
}

// Watch waits for the window of trial id to end and rolls it back, unless
// it was confirmed, rolled back or applied again (a new id) before: it is
// the process Arm starts, before the trial is recorded under id (it waits
// up to idGrace for that). A rollback that fails (the state folder locked
// by another ipfence, a kernel error) is tried again, less and less often,
// for as long as the trial stays recorded.
func (r *Roller) Watch(ctx context.Context, id string) error {
	start, seen := time.Now(), false
	backoff := time.Second
	for {
		p, err := r.Store.Pending()
		switch {
		case err != nil:
			r.Logger.Error("reading the trial; trying again", "trial", id, "err", err)
			if err := sleep(ctx, backoff); err != nil {
				return err
			}
			backoff = min(2*backoff, time.Minute)
			continue
		case (p == nil || p.ID != id) && !seen && time.Since(start) < idGrace:
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
			continue
		case p == nil || p.ID != id:
			r.Logger.Info("the trial ended before its window did: nothing to roll back", "trial", id)
			return nil
		}
		seen = true
		if wait := time.Until(p.Deadline); wait > 0 {
			if err := sleep(ctx, min(wait, time.Second)); err != nil {
				return err
			}
			continue
		}
		done, err := r.expire(ctx, id)
		if done {
			return nil
		}
		if err != nil {
			r.Logger.Error("rolling back the apply on trial failed; trying again", "trial", id, "in", backoff, "err", err)
		}
		if err := sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// idGrace is how long the process Arm starts waits for its trial to be
// recorded.
const idGrace = 30 * time.Second

// expire rolls trial id back if its window is over, when the state
// folder's lock is free: done once the trial has ended (rolled back, or
// ended by another).
func (r *Roller) expire(ctx context.Context, id string) (done bool, err error) {
	unlock, err := r.Target.State.Lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	p, err := r.Store.Pending()
	if err != nil || p == nil || p.ID != id || time.Now().Before(p.Deadline) {
		return err == nil && (p == nil || p.ID != id), err // the window moves only with a new id
	}
	err = r.Expired(ctx, p)
	return err == nil, err
}

// Expired rolls back p, whose window is over. The caller holds the lock.
func (r *Roller) Expired(ctx context.Context, p *Pending) error {
	r.Logger.Warn("the apply on trial was not confirmed in time: putting back what was in force before", "trial", p.ID,
		"policy", p.Policy, "window", p.Window, "deadline", p.Deadline)
	if _, err := r.Roll(ctx, p, "not confirmed in time"); err != nil {
		return fmt.Errorf("rolling back the apply on trial: %w", err)
	}
	r.Logger.Warn("rolled back", "trial", p.ID, "put_back", p.Back)
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// InInitNetNS reports whether this process is in the network namespace of
// PID 1 (systemd's).
func InInitNetNS() bool {
	self, err1 := os.Readlink("/proc/self/ns/net")
	init, err2 := os.Readlink("/proc/1/ns/net")
	return err1 == nil && err2 == nil && self == init
}

// Systemd reports whether systemd runs this host (sd_booted(3)) and has
// systemd-run: Arm then starts a transient unit.
func Systemd() bool {
	if fi, err := os.Stat("/run/systemd/system"); err != nil || !fi.IsDir() {
		return false
	}
	_, err := exec.LookPath("systemd-run")
	return err == nil
}

// Arm starts args (the watcher's command line, the executable first),
// which must outlive the command that arms it and the session it runs
// in: as the transient systemd unit unit where systemd runs the host,
// else as a process in a session of its own (no terminal, immune to the
// SSH connection's hangup) that appends its output to logPath. It says
// how it armed.
func Arm(args []string, unit, logPath string) (string, error) {
	if Systemd() {
		sr := append([]string{"--unit=" + unit, "--collect", "--quiet",
			"--description=ipfence: roll back the apply on trial unless it is confirmed", "--"}, args...)
		out, err := exec.Command("systemd-run", sr...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("arming the rollback (systemd-run): %w: %s", err, strings.TrimSpace(string(out)))
		}
		return "systemd unit " + unit + ".service", nil
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o750); err != nil {
		return "", fmt.Errorf("arming the rollback: %w", err)
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", fmt.Errorf("arming the rollback: %w", err)
	}
	defer lf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("arming the rollback: %w", err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	return fmt.Sprintf("process %d (log: %s)", pid, logPath), nil
}
