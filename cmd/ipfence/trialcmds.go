package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/trial"
)

// applyRevision is what apply keeps of its load: a copy of the policy
// resolved (trial.Store.WriteCandidate), and with --confirm the trial.
type applyRevision struct {
	store  trial.Store
	roller *trial.Roller
	rev    trial.Revision // the candidate's, Applied set once loaded
	// On trial (--confirm):
	window  time.Duration
	xf      xdpFlags
	old     *trial.Pending // the trial this one replaces (nil: none)
	pending *trial.Pending
}

// candidate writes the resolved policy's copy (pf.resolved).
func (a *applyRevision) candidate(res *policy.Resolved) error {
	pol := res.Policy
	a.rev.Policy, _ = filepath.Abs(pol.File)
	a.rev.PolicyDigest = trial.Digest([]byte(pol.Text))
	var err error
	a.rev.Digest, err = a.store.WriteCandidate(func(w io.Writer) error {
		return fleet.WriteLocal(w, res.Input, pol.RejectMark, filepath.Base(pol.File), pol.Text, time.Now())
	})
	return err
}

// checkPending refuses an apply without --confirm while one is on trial:
// it would end the trial unconfirmed, and a later rollback would put
// back what came before both.
func (a *applyRevision) checkPending(offline bool) error {
	p, err := a.store.Pending()
	if err != nil {
		return fmt.Errorf("%w (an apply may be on trial: nothing is loaded until it is readable, or removed)", err)
	}
	a.old = p
	if p != nil && p.Daemon && !offline {
		return fmt.Errorf("%w: the daemon's reload of %s, until %s; the daemon ends it (start it, and confirm through it), or ipfence apply --offline --policy %s puts back the policy it ran before",
			trial.ErrOnTrial, p.Policy, p.Deadline.Local().Format(time.TimeOnly), p.Policy)
	}
	if p != nil && a.window == 0 && !offline {
		return fmt.Errorf("%w until %s (policy %s): run ipfence confirm to keep it (or ipfence confirm --rollback), then apply; or apply with --confirm again to try this one in its place",
			trial.ErrOnTrial, p.Deadline.Local().Format(time.TimeOnly), p.Policy)
	}
	return nil
}

// restoreRefused is the boot-time restore (apply --offline) of a host
// that went down with an apply on trial, or whose policy file is the one
// a trial was rolled back from: the last confirmed revision is loaded in
// its place (done true), or, for a daemon's trial, the policy text it
// ran before is to be loaded instead of the file (instead). Anything else
// is restored as usual.
func (a *applyRevision) restoreRefused(ctx context.Context, w io.Writer, policyFile string) (done bool, instead []byte, err error) {
	if p := a.old; p != nil && p.Daemon {
		// The daemon's trial: what it ran before is loaded in the
		// file's place, from here on.
		err := a.store.Refuse(p.DaemonRefusal("the host restarted within the trial's window", time.Now()))
		if err == nil {
			err = a.store.ClearPending()
		}
		if err != nil {
			return true, nil, err
		}
		if abs, _ := filepath.Abs(policyFile); abs != p.Policy {
			return false, nil, nil // another file's trial: this one is restored as usual
		}
		a.roller.Logger.Warn("the host went down with a daemon's reload on trial, unconfirmed: loading the policy it ran before", "policy", p.Policy)
		return false, []byte(p.Previous), nil
	}
	if p := a.old; p != nil {
		a.roller.Logger.Warn("the host went down with an apply on trial, unconfirmed: putting back what was in force before it",
			"policy", p.Policy, "deadline", p.Deadline)
		if _, err := a.roller.Roll(ctx, p, "the host restarted within the trial's window"); err != nil {
			return true, nil, fmt.Errorf("rolling back the apply on trial: %w", err)
		}
		fmt.Fprintf(w, "rolled back the apply on trial of %s (the host restarted before it was confirmed)\n", p.Policy)
		return true, nil, nil
	}
	in, rev, ref, err := a.store.StandIn(policyFile)
	if ref != nil && ref.Instead != "" && err == nil {
		a.roller.Logger.Warn("the policy file is the one a daemon's trial was rolled back from: loading the policy it ran before in its place",
			"policy", policyFile, "rolled_back", ref.Time, "why", ref.Why)
		return false, []byte(ref.Instead), nil
	}
	if in == nil {
		return err != nil, nil, err // the policy file is restored as usual, or the kept copy is unreadable
	}
	a.roller.Logger.Warn("the policy file is the one an unconfirmed trial was rolled back from: loading the last confirmed ruleset in its place; apply it again (with --confirm) once it is fixed",
		"policy", policyFile, "rolled_back", ref.Time, "why", ref.Why)
	if rev.Nothing {
		fmt.Fprintf(w, "restored nothing: %s was rolled back (%s), and nothing of ipfence's was in force before it\n", policyFile, ref.Why)
		return true, nil, nil
	}
	if _, err := a.roller.LoadConfirmed(ctx, in, rev); err != nil {
		return true, nil, err
	}
	fmt.Fprintf(w, "restored the last confirmed ruleset (%s, applied %s): %s was rolled back (%s)\n",
		rev.Policy, rev.Applied.Local().Format(time.DateTime), policyFile, ref.Why)
	return true, nil, nil
}

// apply loads c with the bans in force (on trial with a window), and
// keeps its copy; rep gets the report.
func (a *applyRevision) apply(ctx context.Context, t *apply.Target, c *compiled, rep *applyReport, monitorAll, offline bool) error {
	bans, err := t.OpenBans(ctx, c.Plan.Table, false)
	if err != nil {
		a.store.DropCandidate()
		return err
	}
	defer bans.Close()
	if a.window > 0 {
		if err := a.begin(c.Plan.Table, t.NetNS); err != nil {
			a.store.DropCandidate()
			return err
		}
	}
	r, err := t.Apply(ctx, c.Compiled, bans.Lists, apply.Options{MonitorAll: monitorAll})
	if r != nil {
		rep.Report = r
	}
	if err != nil && (r == nil || !r.Loaded) {
		// Nothing changed: no trial, no copy.
		a.store.DropCandidate()
		if a.pending != nil {
			err = errors.Join(err, a.abandon())
			a.pending = nil
		}
		return err
	}
	if lerr := a.loaded(c, r, monitorAll, offline); lerr != nil {
		a.roller.Logger.Warn("keeping a copy of what was applied (apply --confirm needs it)", "err", lerr)
	}
	return err
}

// begin sets the ruleset in force aside and arms its rollback, before
// the trial's load.
func (a *applyRevision) begin(table, netns string) error {
	if netns == "" && trial.Systemd() && !trial.InInitNetNS() {
		// systemd would run the rollback in the host's namespace.
		return errors.New("--confirm in a network namespace other than the host's (ip netns exec?): name it with --netns instead, so that the rollback, which systemd runs, finds it")
	}
	h, ok := a.store.Dir.AppliedHead(netns)
	now := time.Now()
	pinDir, err := filepath.Abs(a.xf.pinDir)
	if err != nil {
		return err
	}
	p := &trial.Pending{ID: trial.NewID(), Started: now.UTC(), Window: a.window, Deadline: now.Add(a.window).UTC(),
		Table: table, Policy: a.rev.Policy, PolicyDigest: a.rev.PolicyDigest, PinDir: pinDir, XDPGeneric: a.xf.generic}
	switch {
	case a.old != nil:
		p.Back = a.old.Back // set aside already: what came before the first trial
	case ok:
		rev, err := a.store.Revision()
		if err != nil {
			return err
		}
		if rev == nil || rev.Nothing || !rev.Applied.Equal(h.Time) {
			return fmt.Errorf("%w: what is in force was applied at %s by an ipfence that kept no copy of it (a daemon, or an older version); apply it once without --confirm, then try again",
				trial.ErrNoRevision, h.Time.Local().Format(time.DateTime))
		}
		if err := a.store.SetAside(rev); err != nil {
			return err
		}
		p.Back = rev
	}
	// The process that rolls back starts first, and waits for its
	// trial's record: once that is written the last trial's process, if
	// any, stands down, and at no moment is a recorded trial unwatched.
	if err := a.arm(p, netns); err != nil {
		if a.old == nil {
			err = errors.Join(err, a.store.ClearPending())
		}
		return err
	}
	a.pending = p
	return nil
}

// arm starts the process that rolls p back, then records p.
func (a *applyRevision) arm(p *trial.Pending, netns string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	state, err := filepath.Abs(a.store.Dir.Path) // the process runs in /
	if err != nil {
		return err
	}
	args := []string{exe, "confirm", "--expire", p.ID, "--state", state, "--netns", netns}
	if p.Armed, err = trial.Arm(args, "ipfence-trial-"+p.ID, trial.Store{Dir: statedir.Dir{Path: state}, NetNS: a.store.NetNS}.LogPath()); err != nil {
		return err
	}
	return a.store.SavePending(p)
}

// abandon undoes begin when nothing was loaded: the trial in force
// before, if any, goes on (under the new rollback process, whose ID it
// takes: the old one stops), else none.
func (a *applyRevision) abandon() error {
	if a.old == nil {
		return a.store.ClearPending()
	}
	if a.pending != nil {
		a.old.ID, a.old.Armed = a.pending.ID, a.pending.Armed
	}
	return a.store.SavePending(a.old)
}

// loaded records the candidate as the revision in force, and the trial
// as loaded: its window starts now.
func (a *applyRevision) loaded(c *compiled, r *apply.Report, monitorAll, offline bool) error {
	applied := r.Applied.Time // the record the apply wrote (if it could)
	a.rev.Applied, a.rev.Backend, a.rev.Flavour, a.rev.MonitorAll = applied, c.Plan.Backend, c.Flavour, monitorAll
	err := a.store.CommitRevision(a.rev)
	if p := a.pending; p != nil {
		p.Trial, p.Deadline = applied, time.Now().Add(a.window).UTC()
		err = errors.Join(err, a.store.SavePending(p))
	} else if !offline {
		// The operator applied without a trial: what is refused is
		// their call now.
		err = errors.Join(err, a.store.ClearRefused())
	}
	return err
}

// printTrial says how the trial ends.
func printTrial(w io.Writer, p *trial.Pending) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "ON TRIAL: run `ipfence confirm` before %s (%s from now) to keep it; otherwise %s is put back\n  rollback armed: %s\n",
		p.Deadline.Local().Format(time.TimeOnly), p.Window, backName(p), p.Armed)
}

func newConfirmCmd(g *globals) *cobra.Command {
	var kf kernelFlags
	var xf xdpFlags
	var rollback bool
	var expire, socket string
	c := &cobra.Command{
		Use:   "confirm [--rollback] [--netns NAME]",
		Short: "Keep the ruleset an `apply --confirm` or `reload --confirm` put on trial (or roll it back now)",
		Long: `Confirm keeps the ruleset that ipfence apply --confirm DURATION loaded (or, when
the daemon runs on --socket, its reload --confirm DURATION): without
it, once DURATION is over, ipfence puts back what was in force before (a process
started by the apply does, in a transient systemd unit where systemd runs the
host, or in a session of its own otherwise: closing the SSH connection that ran
the apply does not stop it). --rollback puts it back at once.

A reboot within the window rolls the trial back at boot (apply --offline). The
policy file of a trial that was rolled back is not loaded at boot (nor by a
starting daemon) while it stays as it was: the last confirmed ruleset is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t := kf.target()
			t.XDP, t.Logger = xf.options(), g.logger
			store := trial.Store{Dir: t.State, NetNS: kf.netns}
			r := &trial.Roller{Store: store, Target: t, Logger: g.logger}
			if expire != "" {
				return r.Watch(cmd.Context(), expire)
			}
			w := cmd.OutOrStdout()
			unlock, err := t.State.Lock()
			if errors.Is(err, statedir.ErrLocked) {
				// The daemon holds the state folder: its trial is
				// its to end.
				return confirmViaDaemon(cmd.Context(), w, socket, rollback, err)
			}
			if err != nil {
				return err
			}
			defer unlock()
			p, err := store.Pending()
			if err != nil {
				return err
			}
			if p == nil {
				if ref, _ := store.Refused(); ref != nil {
					return fmt.Errorf("%w: the last one (%s) was rolled back at %s (%s)", trial.ErrNoTrial, ref.Policy, ref.Time.Local().Format(time.DateTime), ref.Why)
				}
				return trial.ErrNoTrial
			}
			switch {
			case p.Daemon && (rollback || !time.Now().Before(p.Deadline)):
				return fmt.Errorf("the reload on trial is the daemon's, which is not running: start it (it rolls the trial back when the window is over, at once if it is), or ipfence apply --offline --policy %s puts back the policy it ran before now", p.Policy)
			case rollback:
				if _, err := r.Roll(cmd.Context(), p, "rolled back by ipfence confirm --rollback"); err != nil {
					return err
				}
				fmt.Fprintf(w, "rolled back: %s\n", backName(p))
				return nil
			case !time.Now().Before(p.Deadline):
				if err := r.Expired(cmd.Context(), p); err != nil {
					return err
				}
				return fmt.Errorf("%w (at %s): %s was put back", trial.ErrTooLate, p.Deadline.Local().Format(time.TimeOnly), backName(p))
			}
			// What is confirmed is refused no more (a refused file
			// tried again and kept).
			if err := errors.Join(store.ClearPending(), store.ClearRefused()); err != nil {
				return err
			}
			fmt.Fprintf(w, "confirmed: %s stays in force; the rollback (%s) stands down\n", p.Policy, p.Armed)
			return nil
		},
	}
	kf.register(c)
	xf.register(c, true)
	c.Flags().BoolVar(&rollback, "rollback", false, "put back what was in force before the trial, now")
	c.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the daemon's API socket: a daemon that runs there ends its reload on trial")
	c.Flags().StringVar(&expire, "expire", "", "wait for trial ID's window to end, then roll it back unless it was confirmed (the process apply --confirm starts)")
	_ = c.Flags().MarkHidden("expire")
	return c
}

// confirmViaDaemon ends the daemon's reload on trial through its API
// (locked: the state folder's lock error, said when no daemon answers).
func confirmViaDaemon(ctx context.Context, w io.Writer, socket string, rollback bool, locked error) error {
	var cr *api.ConfirmResponse
	ok, err := viaDaemon(socket, func(cl *api.Client) (err error) {
		cr, err = cl.Confirm(ctx, rollback)
		return err
	})
	switch {
	case !ok:
		return locked
	case err != nil:
		return err
	case cr.RolledBack:
		fmt.Fprintf(w, "rolled back: the daemon runs the policy it ran before %s\n", cr.Policy)
	default:
		fmt.Fprintf(w, "confirmed: the daemon keeps %s\n", cr.Policy)
	}
	return nil
}

// backName is what rolling p back puts in force.
func backName(p *trial.Pending) string {
	if p.Daemon {
		return "the policy the daemon ran before " + p.Policy
	}
	if p.Back == nil {
		return "no ipfence ruleset (there was none before the trial)"
	}
	return fmt.Sprintf("the ruleset of %s applied %s", p.Back.Policy, p.Back.Applied.Local().Format(time.DateTime))
}

// printTrialStatus is the status's part about a trial: the one pending,
// and the last rolled back.
func printTrialStatus(w io.Writer, p *trial.Pending, ref *trial.Refused) {
	if p != nil {
		fmt.Fprintf(w, "ON TRIAL: %s, until %s (%s left); then %s is put back unless `ipfence confirm` runs\n",
			p.Policy, p.Deadline.Local().Format(time.TimeOnly), time.Until(p.Deadline).Round(time.Second), backName(p))
	}
	if ref != nil {
		instead := "the last confirmed ruleset"
		if ref.Instead != "" {
			instead = "the policy in force before the trial"
		}
		fmt.Fprintf(w, "rolled back at %s (%s): %s; while the file stays as it was, the boot-time restore and the daemon load %s in its place\n",
			ref.Time.Local().Format(time.DateTime), ref.Why, ref.Policy, instead)
	}
}
