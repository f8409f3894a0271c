package bench

import (
	"context"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestScale runs the scale scenario small: every ruleset of every family
// must load, unload, and pass the traffic it does not match (checked from
// the firewall's counters), and every DDoS hook must drop all of the
// attack.
func TestScale(t *testing.T) {
	lab := netnstest.New(t)
	o := QuickScale
	o.Steps = []int{0, 3}
	o.Rounds, o.Packets = 1, 1000
	p := NewProgress(nil, ScaleSteps(o))
	res, err := Scale(context.Background(), lab, o, p)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, f := range o.Families {
		want += len(o.Steps) * (len(scaleConfigs(f, 0)) - 1)
	}
	if len(res.Rows) != want {
		t.Errorf("%d rows, want %d", len(res.Rows), want)
	}
	if want := len(ddosConfigs(tcDropWorks(context.Background(), lab) == nil)); len(res.DDoS) != want {
		t.Errorf("%d DDoS rows, want %d", len(res.DDoS), want)
	}
	for _, r := range res.Rows {
		if r.NsPerPacket <= 0 || r.Packets <= 0 {
			t.Errorf("row %+v: no measurement", r)
		}
	}
	t.Logf("%+v", res.DDoS)
}
