package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/bansets"
	"github.com/ipfence/ipfence/internal/crowdsec"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/version"
)

// resyncEvery is how often a crowdsec source is pulled whole again
// (startup=true), which also repairs anything a lost answer left behind.
const resyncEvery = time.Hour

// follower follows one crowdsec source.
type follower struct {
	def    policy.CrowdSecDef
	state  *sourceState
	cancel context.CancelFunc
}

// syncFollowers starts a follower for each crowdsec source of the policy
// in force and stops the ones for sources gone or changed. Called with
// d.mu held; it does nothing before Run serves (Run calls it then).
func (d *Daemon) syncFollowers() {
	if d.runCtx == nil || d.pol == nil {
		return
	}
	want := map[string]policy.CrowdSecDef{}
	for _, c := range d.pol.CrowdSec {
		def := *c
		def.Line = 0
		want[def.Name] = def
	}
	for name, f := range d.followers {
		if w, ok := want[name]; ok && w == f.def {
			delete(want, name)
			continue
		}
		f.cancel()
		delete(d.followers, name)
		delete(d.sources, name)
	}
	for name, def := range want {
		ctx, cancel := context.WithCancel(d.runCtx)
		f := &follower{def: def, state: &sourceState{refresh: def.Every}, cancel: cancel}
		d.followers[name] = f
		d.sources[name] = f.state
		go d.follow(ctx, f)
	}
}

// follow pulls f's decisions stream every f.def.Every until ctx is done:
// a startup pull first (and after any failure, and hourly), then the
// changes. While the Local API is down the bans stay as they are.
func (d *Daemon) follow(ctx context.Context, f *follower) {
	var tr *crowdsec.Tracker // nil: the next pull is a startup pull
	var lastFull time.Time
	for {
		key, err := f.def.Key()
		if err == nil {
			startup := tr == nil || time.Since(lastFull) >= resyncEvery
			if startup {
				tr = crowdsec.NewTracker(d.heldBy(f.def.Name))
			}
			cl := &crowdsec.Client{URL: f.def.URL, Key: key, UserAgent: "ipfence/" + version.String()}
			err = d.pull(ctx, f, cl, tr, startup)
			switch {
			case err != nil:
				tr = nil
			case startup:
				lastFull = time.Now()
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.pulled(f, tr, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.def.Every):
		}
	}
}

// pull pulls once and makes the bans the answer asks for: lifts first
// (of this source's own bans only), then bans, each one transaction.
func (d *Daemon) pull(ctx context.Context, f *follower, cl *crowdsec.Client, tr *crowdsec.Tracker, startup bool) error {
	s, err := cl.Pull(ctx, startup)
	if err != nil {
		return err
	}
	now := time.Now()
	bans, lifts, ignored := tr.Update(s, startup, now)
	for i, ig := range ignored {
		if !errors.Is(ig.Err, crowdsec.ErrUnsupported) && i < 10 {
			d.log.Warn("crowdsec decision ignored", "source", f.def.Name, "id", ig.Decision.ID, "value", ig.Decision.Value, "err", ig.Err)
		}
	}
	if len(lifts) > 0 {
		ls := make([]bansets.Lift, len(lifts))
		for i, p := range lifts {
			// A decision lifted before it expires was deleted: the
			// ban it escalated to goes too.
			ls[i] = bansets.Lift{Prefix: p, Origin: f.def.Name, Escalated: true}
		}
		if _, err := d.Unban(ctx, ls); err != nil {
			return err
		}
	}
	if len(bans) == 0 {
		return nil
	}
	reqs := make([]bansets.Request, len(bans))
	for i, b := range bans {
		ttl := b.Expires.Sub(now)
		ttl = min(max((ttl+time.Second-1).Truncate(time.Second), ban.MinTTL), ban.MaxTTL)
		reqs[i] = bansets.Request{Prefix: b.Prefix, TTL: ttl, Reason: b.Reason, Origin: f.def.Name, NoShorten: true}
	}
	prep, errs := d.ctl.PrepareEach(reqs)
	refused := 0
	for i, err := range errs {
		if err != nil {
			tr.Drop(reqs[i].Prefix)
			if refused++; refused <= 10 {
				d.log.Warn("crowdsec decision refused", "source", f.def.Name, "prefix", reqs[i].Prefix, "err", err)
			}
		}
	}
	if prep.Len() == 0 {
		return nil
	}
	_, err = d.bans.Ban(ctx, prep, true)
	return err
}

// pulled records how a pull went in the source's status.
func (d *Daemon) pulled(f *follower, tr *crowdsec.Tracker, err error) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.followers[f.def.Name] != f {
		return // stopped meanwhile
	}
	ss := f.state
	ss.checked = now
	if err != nil {
		if ss.lastErr == "" {
			d.log.Warn("crowdsec source failing; its bans stay in force, retrying", "source", f.def.Name, "every", f.def.Every, "err", err)
		}
		ss.lastErr = err.Error()
		ss.failures++
		d.metrics.feedErrors.WithLabelValues(f.def.Name).Inc()
		return
	}
	if ss.lastErr != "" {
		d.log.Info("crowdsec source back", "source", f.def.Name, "decisions", tr.Decisions())
	}
	ss.loaded, ss.lastErr = now, ""
	ss.v4, ss.v6 = tr.Held()
}

// heldBy returns the bans in force of origin.
func (d *Daemon) heldBy(origin string) []crowdsec.Ban {
	var out []crowdsec.Ban
	d.ctl.View(func(s *ban.Set) {
		bs, _ := s.List(time.Now(), ban.Filter{Origin: origin}, 0, 0)
		out = make([]crowdsec.Ban, len(bs))
		for i, b := range bs {
			out[i] = crowdsec.Ban{Prefix: b.Prefix, Expires: b.Expires, Reason: b.Reason}
		}
	})
	return out
}
