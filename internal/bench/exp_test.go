package bench

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/source"
)

func TestExpPerPacket(t *testing.T) {
	if os.Getenv("IPF_EXP") == "" {
		t.Skip()
	}
	pol, err := policy.Load("../../examples/europe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := pol.Resolve(context.Background(), &source.Loader{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]plan.Options{
		"plain": {PlainMax: 1 << 30},
		"auto":  {},
		"cheap": {ElementPrice: 1},
		"s16":   {Strides4: []int{16, 24, 32}, Strides6: nil},
	}
	cfgs := []Config{{"none", nil}}
	var set *plan.Plan
	for _, name := range []string{"plain", "auto"} {
		p, err := plan.Compile(res.Input, opts[name])
		if err != nil {
			t.Fatal(name, err)
		}
		set = p
		prog := nft.FromPlan(p)
		n := 0
		for _, s := range prog.Sets {
			n += len(s.Elems)
		}
		t.Logf("%s: v4 %v v6 %v elements %d", name, p.Rules[0].V4.Strides(), p.Rules[0].V6.Strides(), n)
		cfgs = append(cfgs, Config{name, prog})
	}
	lab := netnstest.New(t)
	r := rand.New(rand.NewPCG(1, 1))
	legit := pktgen.RandomFromSet(r, pktgen.TestableSet(set.Rules[0].Set), 200000)
	var l4, l6 []netip.Addr
	for _, a := range legit {
		if a.Is4() {
			l4 = append(l4, a)
		} else {
			l6 = append(l6, a)
		}
	}
	traffic := []Traffic{
		{"legit4", l4}, {"random4", pktgen.RandomV4(r, 100000)},
		{"legit6", l6}, {"random6", pktgen.RandomV6(r, 100000)},
	}
	out, err := PerPacket(context.Background(), lab, cfgs, traffic, 6, 300000, func(s string) {})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range out.Cells {
		t.Logf("%-6s %-8s %7.0f ns/pkt  overhead %7.0f ns  %v", c.Config, c.Traffic, c.NsPerPacket, c.OverheadNs, c.Rounds)
	}
	t.Logf("loads %v", out.LoadTimes)
}
