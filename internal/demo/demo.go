// Package demo runs ipfence's main job end to end in a throw-away lab:
// compile "allow only Europe" from the bundled country data, load it into
// a fresh network namespace, check verdicts packet by packet against the
// model, and measure the per-packet cost against a plain nft interval set.
// It never touches the host's own firewall; the lab is removed at the end,
// also on error or Ctrl-C.
package demo

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/examples"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/source"
)

// Options tune the demo.
type Options struct {
	// PolicyFile is the policy to run; "" runs the embedded
	// examples/europe.yaml.
	PolicyFile string
	// Sources is how many source addresses the verdict check sends.
	Sources int
	// Rounds and Packets shape the per-packet measurement (0 skips it).
	Rounds, Packets int
	// Pass is how the measurement draws legitimate ("pass") sources: one
	// of PassModes; "" means PassAddresses.
	Pass string
	// CompareV1 adds a config "ipfence-v1" to the measurement: the same
	// policy laid out with plan.ModelV1, the chooser's traffic model
	// before issue 23, measured in the same interleaved rounds.
	CompareV1 bool
	// Out receives the report; Progress, progress lines (stderr).
	Out, Progress io.Writer
}

// Report is what the demo found (the --json form).
type Report struct {
	Policy      string                 `json:"policy"`
	Plan        *plan.Plan             `json:"plan"`
	CompileMs   int64                  `json:"compile_ms"`
	Load        LoadReport             `json:"load"`
	Sources     int                    `json:"verdict_sources"`
	SourcesV4   int                    `json:"verdict_sources_ipv4"`
	SourcesV6   int                    `json:"verdict_sources_ipv6"`
	Mismatches  int                    `json:"verdict_mismatches"`
	Dropped     int                    `json:"verdict_dropped"`
	PerPacket   *bench.PerPacketResult `json:"per_packet,omitempty"`
	PlainLoadMs int64                  `json:"plain_load_ms,omitempty"`
	// Pass is how legitimate sources were drawn; Model, the layout's
	// lookups for each measured traffic (the chooser's model, evaluated
	// on the very sources sent), keyed by traffic; with CompareV1 also
	// "v1/" + traffic for the ipfence-v1 config, whose plan is PlanV1.
	Pass   string                `json:"pass_sources,omitempty"`
	Model  map[string]ModelStats `json:"model,omitempty"`
	PlanV1 *plan.Plan            `json:"plan_v1,omitempty"`
}

// ModelStats are what the compiled layouts do for one traffic, on
// average per packet: map lookups, 32-bit key words loaded (IPv4: one per
// lookup; IPv6: the words a level's key reads), lookups in a rest
// interval set, and the model's prediction of lookups for the
// family's traffic type (LookupsPass or LookupsRandom), summed over rules.
type ModelStats struct {
	Lookups   float64 `json:"lookups"`
	Words     float64 `json:"words"`
	Rest      float64 `json:"rest_lookups"`
	Predicted float64 `json:"predicted_lookups"`
}

// LoadReport describes the apply.
type LoadReport struct {
	Sets     int   `json:"sets"`
	Elements int   `json:"elements"`
	Chains   int   `json:"chains"`
	Millis   int64 `json:"ms"`
}

// Run runs the demo.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	say := func(format string, a ...any) { fmt.Fprintf(o.Progress, format+"\n", a...) }
	rep = &Report{Policy: o.PolicyFile}

	data, name := examples.Europe, "examples/europe.yaml (built in)"
	if o.PolicyFile != "" {
		if data, err = os.ReadFile(o.PolicyFile); err != nil {
			return nil, fmt.Errorf("reading policy: %w", err)
		}
		name = o.PolicyFile
	}
	rep.Policy = name
	t0 := time.Now()
	pol, err := policy.Parse(data, name)
	if err != nil {
		return nil, err
	}
	stateDir, err := os.MkdirTemp("", "ipfence-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stateDir)
	res, err := pol.Resolve(ctx, &source.Loader{StateDir: stateDir})
	if err != nil {
		return nil, err
	}
	p, err := plan.Compile(res.Input, plan.Options{})
	if err != nil {
		return nil, err
	}
	rep.Plan = p
	rep.CompileMs = time.Since(t0).Milliseconds()
	say("compiled %s in %d ms", name, rep.CompileMs)

	say("creating lab namespaces (ipf-demo-fw, ipf-demo-gen) joined by a veth pair")
	if _, err := netns.Sweep(); err != nil {
		return nil, err
	}
	lab, err := netns.NewLab(fmt.Sprintf("demo%d", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("creating the lab: %w", err)
	}
	defer func() {
		if cerr := lab.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("removing the lab: %w", cerr)
		}
		say("removed the lab namespaces")
	}()

	prog := nft.FromPlan(p, nft.Dynamic{})
	ar, err := nft.Apply(ctx, prog, nft.ApplyOptions{NetNS: lab.FW})
	if err != nil {
		return nil, fmt.Errorf("applying: %w", err)
	}
	rep.Load = LoadReport{Sets: ar.Sets, Elements: ar.Elements, Chains: ar.Chains, Millis: (ar.Build + ar.Flush).Milliseconds()}
	say("applied in one transaction: %d maps/sets, %d elements, %d chains in %d ms", ar.Sets, ar.Elements, ar.Chains, rep.Load.Millis)

	// Verdicts: boundaries of every rule's set, addresses inside and
	// outside, random ones, IPv4 and IPv6; one packet each.
	r := rand.New(rand.NewPCG(2, 6))
	var srcs []netip.Addr
	for _, rule := range p.Rules {
		srcs = append(srcs, Sample(r, rule.Set.IPSet(), o.Sources/len(p.Rules))...)
	}
	say("sending %d packets (one per source) through the firewall namespace", len(srcs))
	passed, err := pktgen.Check(lab, srcs, 9999)
	if err != nil {
		return nil, fmt.Errorf("checking verdicts: %w", err)
	}
	rep.Sources = len(srcs)
	for i, a := range srcs {
		if a.Is4() {
			rep.SourcesV4++
		} else {
			rep.SourcesV6++
		}
		want := p.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: 9999}).Verdict == "accept"
		if !passed[i] {
			rep.Dropped++
		}
		if passed[i] != want {
			rep.Mismatches++
		}
	}
	if rep.Mismatches > 0 {
		return rep, fmt.Errorf("%d of %d verdicts differ from the model", rep.Mismatches, rep.Sources)
	}

	if o.Rounds > 0 && o.Packets > 0 {
		plain, err := plan.Compile(res.Input, plan.Options{PlainMax: 1 << 30})
		if err != nil {
			return nil, err
		}
		if o.Pass == "" {
			o.Pass = PassAddresses
		}
		traffic, err := Traffic(r, p, o.Pass, 100_000)
		if err != nil {
			return nil, err
		}
		rep.Pass = o.Pass
		rep.Model = map[string]ModelStats{}
		for _, tr := range traffic {
			rep.Model[tr.Name] = Model(p, tr.Srcs, strings.HasPrefix(tr.Name, "pass"))
		}
		cfgs := []bench.Config{{Name: "none"}, {Name: "plain-set", Program: nft.FromPlan(plain, nft.Dynamic{})}, {Name: "ipfence", Program: prog}}
		if o.CompareV1 {
			v1, err := plan.Compile(res.Input, plan.Options{Model: plan.ModelV1})
			if err != nil {
				return nil, err
			}
			rep.PlanV1 = v1
			for _, tr := range traffic {
				rep.Model["v1/"+tr.Name] = Model(v1, tr.Srcs, strings.HasPrefix(tr.Name, "pass"))
			}
			cfgs = append(cfgs, bench.Config{Name: "ipfence-v1", Program: nft.FromPlan(v1, nft.Dynamic{})})
		}
		say("measuring per-packet cost: %d rounds × %d configs × %d traffics × %d packets", o.Rounds+1, len(cfgs), len(traffic), o.Packets)
		// One lab per config, each loaded once: the rounds measure the
		// same kernel objects.
		pp, err := bench.PerPacketLabs(ctx, fmt.Sprintf("demo%dc", os.Getpid()), cfgs, traffic, bench.PerPacketOptions{
			Rounds: o.Rounds, Packets: o.Packets, Progress: func(s string) { say("  %s", s) }})
		if err != nil {
			return nil, err
		}
		rep.PerPacket = pp
		rep.PlainLoadMs = pp.LoadTimes["plain-set"].Milliseconds()
	}
	return rep, nil
}

// Sample draws verdict-test sources for a rule's set: boundaries (half),
// addresses inside it, and random IPv4 and IPv6 addresses.
func Sample(r *rand.Rand, set *netipx.IPSet, n int) []netip.Addr {
	var out []netip.Addr
	b := pktgen.Boundaries(set)
	r.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	out = append(out, b[:min(len(b), n/2)]...)
	out = append(out, pktgen.RandomFromSet(r, pktgen.TestableSet(set), n/6)...)
	out = append(out, pktgen.RandomV4(r, n/6)...)
	out = append(out, pktgen.RandomV6(r, n/6)...)
	return out
}

// How the measurement draws legitimate ("pass") sources, from the
// addresses the policy lets through:
const (
	// PassAddresses: IPv4 uniform over the addresses (big networks
	// weigh most), IPv6 a uniformly chosen prefix of the minimal cover,
	// then an address in it (pktgen.RandomFromSet).
	PassAddresses = "addresses"
	// PassRanges: a uniformly chosen range (maximal run of allowed
	// addresses), then an address in it, both families: every network
	// is equally busy whatever its size.
	PassRanges = "ranges"
	// PassZipf: 4,096 sources drawn as for PassRanges, sending with
	// Zipf(s = 1.1) weights (a few busy clients and a long tail).
	PassZipf = "zipf"
)

// PassModes lists the values of Options.Pass.
var PassModes = []string{PassAddresses, PassRanges, PassZipf}

// Traffic returns the measurement traffics: "pass" sources (that the
// policy lets through: legitimate traffic) drawn as mode says (one of
// PassModes), and uniformly random sources, per family. It fails on an
// unknown mode.
func Traffic(r *rand.Rand, p *plan.Plan, mode string, n int) ([]bench.Traffic, error) {
	var pass4, pass6 []netip.Addr
	keep := func(cand []netip.Addr) {
		for _, a := range cand {
			if p.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: 9}).Verdict != "accept" {
				continue
			}
			if a.Is4() && len(pass4) < n {
				pass4 = append(pass4, a)
			} else if !a.Is4() && len(pass6) < n {
				pass6 = append(pass6, a)
			}
		}
	}
	pass := passSet(p)
	switch mode {
	case PassAddresses:
		keep(append(pktgen.RandomFromSet(r, pass, 4*n), pktgen.RandomV4(r, 4*n)...))
	case PassRanges, PassZipf:
		m := n
		if mode == PassZipf {
			m = 4096
		}
		keep(pktgen.RandomFromRanges(r, pass, true, m))
		keep(pktgen.RandomFromRanges(r, pass, false, m))
		if mode == PassZipf {
			pass4, pass6 = pktgen.Zipf(r, pass4, 1.1, n), pktgen.Zipf(r, pass6, 1.1, n)
		}
	default:
		return nil, fmt.Errorf("pass sources %q: want one of %s", mode, strings.Join(PassModes, ", "))
	}
	return []bench.Traffic{
		{Name: "pass-ipv4", Srcs: pass4},
		{Name: "random-ipv4", Srcs: pktgen.RandomV4(r, n)},
		{Name: "pass-ipv6", Srcs: pass6},
		{Name: "random-ipv6", Srcs: pktgen.RandomV6(r, n)},
	}, nil
}

// Model evaluates the plan's layouts on srcs as the kernel runs them
// (plan.Layout.Lookups) and averages per packet; pass says which of the
// layouts' predictions to report. Rules a packet never reaches (an
// earlier rule decided it) count too: an upper bound for such plans.
func Model(p *plan.Plan, srcs []netip.Addr, pass bool) ModelStats {
	var m ModelStats
	if len(srcs) == 0 {
		return m
	}
	for _, rule := range p.Rules {
		for _, l := range []*plan.Layout{rule.V4, rule.V6} {
			if l == nil || l.Kind != plan.KindTree || l.Is4 != srcs[0].Is4() {
				continue
			}
			if pass {
				m.Predicted += l.Cost.LookupsPass
			} else {
				m.Predicted += l.Cost.LookupsRandom
			}
			for _, a := range srcs {
				w, lk, rest := l.Trace(a)
				m.Words += float64(w)
				m.Lookups += float64(lk)
				if rest {
					m.Rest++
				}
			}
		}
	}
	n := float64(len(srcs))
	m.Words /= n
	m.Lookups /= n
	m.Rest /= n
	return m
}

// passSet is where legitimate traffic comes from: for allow-only rules
// their sets, otherwise everything outside the blocking rules' sets.
func passSet(p *plan.Plan) *netipx.IPSet {
	var b netipx.IPSetBuilder
	b.AddPrefix(netip.MustParsePrefix("0.0.0.0/0"))
	b.AddPrefix(netip.MustParsePrefix("2000::/3"))
	for _, r := range p.Rules {
		switch r.Action {
		case plan.AllowOnly:
			b.Intersect(r.Set.IPSet())
		case plan.Drop, plan.Reject:
			b.RemoveSet(r.Set.IPSet())
		}
	}
	s, _ := b.IPSet()
	return pktgen.TestableSet(s)
}
