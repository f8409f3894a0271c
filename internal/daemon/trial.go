package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ipfence/ipfence/internal/trial"
)

// Trials through the daemon (`ipfence reload --confirm 2m`): the daemon
// reloads its policy file on trial and, unless Confirm runs within the
// window, loads the policy text it ran before again (with its sources as
// they are then) and keeps loading it in the file's place while the file
// stays as it was. The trial is recorded in the state folder before the
// load, so a daemon that restarts (or a host that reboots) within the
// window takes it up again: rolled back at once when the window is over,
// else watched until it ends.

// ErrFleetTrial: a fleet agent's policy comes from its group.
var ErrFleetTrial = errors.New("a fleet agent runs its group's revisions: roll back with ipfence rollback, not a trial")

// ReloadTrial reloads the policy on trial: Reload, then a rollback to
// the policy the daemon ran before unless Confirm runs within window. A
// trial applied again keeps what came before the first one, with a new
// window. If the reload fails, nothing changes (a trial in force goes on).
func (d *Daemon) ReloadTrial(ctx context.Context, window time.Duration) (ReloadResult, *trial.Pending, error) {
	if err := trial.CheckWindow(window); err != nil {
		return ReloadResult{}, nil, err
	}
	if d.cfg.Input != nil {
		return ReloadResult{}, nil, ErrFleetTrial
	}
	d.trialMu.Lock()
	defer d.trialMu.Unlock()
	ts := d.trials()
	old, err := ts.Pending()
	if err != nil {
		return ReloadResult{}, nil, err
	}
	d.mu.Lock()
	prev, table := "", ""
	if d.pol != nil {
		prev = d.pol.Text
	}
	if d.plan != nil {
		table = d.plan.Table
	}
	d.mu.Unlock()
	if old != nil {
		prev = old.Previous // what came before the first trial
	}
	if prev == "" {
		return ReloadResult{}, nil, errors.New("the daemon runs the last confirmed revision in place of a policy file that was rolled back, and has no policy text to put back: edit the policy file and reload without --confirm")
	}
	abs, _ := filepath.Abs(d.cfg.Policy)
	now := time.Now()
	p := &trial.Pending{ID: trial.NewID(), Started: now.UTC(), Window: window, Deadline: now.Add(window).UTC(), Table: table,
		Policy: abs, PolicyDigest: trial.FileDigest(d.cfg.Policy, ""), Daemon: true, Previous: prev,
		Armed: fmt.Sprintf("the daemon (process %d)", os.Getpid())}
	// Recorded before the load: a daemon killed during it finds the
	// trial when it starts again. The file on trial is refused no more
	// (the trial decides), unless the load fails.
	ref, err := ts.Refused()
	if err != nil {
		return ReloadResult{}, nil, err
	}
	if err := errors.Join(ts.SavePending(p), ts.ClearRefused()); err != nil {
		return ReloadResult{}, nil, err
	}
	res, err := d.reload(ctx, false, true)
	if err != nil {
		restore := ts.ClearPending()
		if old != nil {
			restore = ts.SavePending(old)
		}
		if ref != nil {
			restore = errors.Join(restore, ts.Refuse(*ref))
		}
		return res, nil, errors.Join(err, restore)
	}
	p.Trial, p.Deadline = time.Now().UTC(), time.Now().Add(window).UTC()
	if err := ts.SavePending(p); err != nil {
		d.log.Warn("recording the trial", "err", err)
	}
	d.watchTrial(p)
	return res, p, nil
}

// Confirm ends the trial in force: kept, or with rollback put back now.
// After the window it is too late: the trial is rolled back (if the
// daemon has not yet) and the error wraps trial.ErrTooLate.
func (d *Daemon) Confirm(ctx context.Context, rollback bool) (*trial.Pending, error) {
	d.trialMu.Lock()
	defer d.trialMu.Unlock()
	ts := d.trials()
	p, err := ts.Pending()
	if err != nil {
		return nil, err
	}
	if p == nil {
		if ref, _ := ts.Refused(); ref != nil {
			return nil, fmt.Errorf("%w: the last one (%s) was rolled back at %s (%s)", trial.ErrNoTrial, ref.Policy, ref.Time.Local().Format(time.DateTime), ref.Why)
		}
		return nil, trial.ErrNoTrial
	}
	switch {
	case rollback:
		return p, d.rollBack(ctx, p, "rolled back by ipfence confirm --rollback")
	case !time.Now().Before(p.Deadline):
		if err := d.rollBack(ctx, p, "not confirmed in time"); err != nil {
			return p, err
		}
		return p, fmt.Errorf("%w (at %s): the daemon loads the policy it ran before the reload on trial", trial.ErrTooLate, p.Deadline.Local().Format(time.TimeOnly))
	}
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	return p, errors.Join(ts.ClearPending(), ts.ClearRefused())
}

// rollBack ends p: a daemon's trial by loading the policy it ran before
// in the file's place, a command line's (found at start) by its own
// revision. The caller holds trialMu. On an error the trial stays.
func (d *Daemon) rollBack(ctx context.Context, p *trial.Pending, why string) error {
	ts := d.trials()
	if !p.Daemon {
		r := &trial.Roller{Store: ts, Target: d.target, Logger: d.log}
		_, err := r.Roll(ctx, p, why)
		return err
	}
	d.log.Warn("the reload on trial ends unconfirmed: loading the policy the daemon ran before", "policy", p.Policy, "why", why)
	// Refused (the file as it is now), and no longer pending: the load
	// reads the refusal (a pending trial has the file loaded).
	if err := errors.Join(ts.Refuse(p.DaemonRefusal(why, time.Now())), ts.ClearPending()); err != nil {
		return err
	}
	if d.ctl == nil {
		return nil // starting: the load that follows reads the refusal
	}
	if _, err := d.reload(ctx, false, false); err != nil {
		return errors.Join(fmt.Errorf("rolling back the reload on trial: %w", err), ts.SavePending(p), ts.ClearRefused())
	}
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	return nil
}

// watchTrial ends p when its window does (trialMu held): a failed
// rollback is tried again, less and less often.
func (d *Daemon) watchTrial(p *trial.Pending) {
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	backoff := time.Second
	var expire func()
	expire = func() {
		d.trialMu.Lock()
		defer d.trialMu.Unlock()
		if d.trialStopped {
			return // the daemon stops: its next start takes the trial up
		}
		cur, err := d.trials().Pending()
		if err == nil && (cur == nil || cur.ID != p.ID) {
			return // confirmed, rolled back, or tried again
		}
		if err == nil && time.Now().Before(cur.Deadline) {
			d.trialTimer = time.AfterFunc(time.Until(cur.Deadline), expire)
			return
		}
		if err == nil {
			err = d.rollBack(d.ctx(), cur, "not confirmed in time")
		}
		if err != nil {
			d.log.Error("rolling back the reload on trial failed; trying again", "in", backoff, "err", err)
			d.trialTimer = time.AfterFunc(backoff, expire)
			backoff = min(2*backoff, time.Minute)
		}
	}
	d.trialTimer = time.AfterFunc(time.Until(p.Deadline), expire)
}

// ctx is the context of the daemon's run (background before it runs).
func (d *Daemon) ctx() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.runCtx != nil {
		return d.runCtx
	}
	return context.Background()
}

// takeUpTrial deals with a trial found as the daemon starts (before its
// load): a command line's apply on trial is rolled back (with the state
// folder locked for the daemon's life, neither ipfence confirm nor its
// rollback process could end it), as is a daemon's whose window is over;
// a daemon's still in its window is watched again once loaded (resume).
func (d *Daemon) takeUpTrial(ctx context.Context) (resume *trial.Pending, err error) {
	if d.cfg.Input != nil {
		return nil, nil // a fleet agent's revisions are no trial's
	}
	p, err := d.trials().Pending()
	if err != nil || p == nil {
		return nil, err
	}
	d.trialMu.Lock()
	defer d.trialMu.Unlock()
	abs, _ := filepath.Abs(d.cfg.Policy)
	switch {
	case !p.Daemon:
		d.log.Warn("an apply is on trial, and the daemon that starts now holds the state folder: it cannot be confirmed any more, and is rolled back",
			"policy", p.Policy, "deadline", p.Deadline)
		return nil, d.rollBack(ctx, p, "the daemon started within the trial's window")
	case p.Policy != abs:
		d.log.Warn("a reload on trial of another policy file: it ends, its file refused", "trial_policy", p.Policy, "policy", abs)
		return nil, d.rollBack(ctx, p, "the daemon started with another policy file")
	case !time.Now().Before(p.Deadline):
		return nil, d.rollBack(ctx, p, "not confirmed in time (the daemon was down when the window ended)")
	}
	d.log.Warn("a reload is on trial: the daemon takes it up again", "policy", p.Policy, "deadline", p.Deadline)
	return p, nil
}
