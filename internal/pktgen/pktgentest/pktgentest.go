// Package pktgentest checks the verdicts of the firewall in a lab's fw
// namespace against what a test expects: a list of fates, the fates of
// another run, or the reference model (plan.Plan.Verdict). Packets go
// through pktgen.Check, one UDP packet per source. The checks fail the
// test when the run is void (pktgen.ErrLost, an untestable source) and
// for every source whose fate differs, naming at most MaxReported of them
// and counting them all.
package pktgentest

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
)

// MaxReported is how many differing sources a check names.
const MaxReported = 10

// Send sends one UDP packet from each of srcs to port through lab and
// returns which passed (pktgen.Check). It fails t when the check fails.
func Send(t testing.TB, lab *netns.Lab, srcs []netip.Addr, port uint16) []bool {
	t.Helper()
	passed, err := pktgen.Check(lab, srcs, port)
	if err != nil {
		t.Fatal(err)
	}
	return passed
}

// Model is what p does with a UDP packet from each of srcs to port.
func Model(p *plan.Plan, srcs []netip.Addr, port uint16) []plan.Decision {
	ds := make([]plan.Decision, len(srcs))
	for i, a := range srcs {
		ds[i] = p.Verdict(plan.Packet{Src: a, Proto: "udp", DPort: port})
	}
	return ds
}

// Passes is which of decisions let the packet through (accept).
func Passes(decisions []plan.Decision) []bool {
	pass := make([]bool, len(decisions))
	for i, d := range decisions {
		pass[i] = d.Verdict == "accept"
	}
	return pass
}

// Differ returns the indexes at which got and want differ.
func Differ(got, want []bool) []int {
	var idx []int
	for i := range got {
		if got[i] != want[i] {
			idx = append(idx, i)
		}
	}
	return idx
}

// Expect sends one UDP packet from each of srcs to port through lab and
// fails t, saying what, for each source whose fate is not want[i]. It
// returns which passed.
func Expect(t testing.TB, lab *netns.Lab, srcs []netip.Addr, port uint16, want []bool, what string) []bool {
	t.Helper()
	if len(want) != len(srcs) {
		t.Fatalf("%s: %d sources, %d expected fates", what, len(srcs), len(want))
	}
	passed := Send(t, lab, srcs, port)
	report(t, what, srcs, passed, Differ(passed, want), func(i int) string { return fate(want[i]) })
	return passed
}

// ExpectModel sends one UDP packet from each of srcs to port through lab
// and fails t for each source whose fate differs from p's decision (passed
// when it accepts). It also fails t when the sources do not exercise both
// fates and both families. It returns p's decisions, per source.
func ExpectModel(t testing.TB, lab *netns.Lab, p *plan.Plan, srcs []netip.Addr, port uint16) []plan.Decision {
	t.Helper()
	model := Model(p, srcs, port)
	want := Passes(model)
	passed := Send(t, lab, srcs, port)
	differ := Differ(passed, want)
	what := fmt.Sprintf("port %d", port)
	report(t, what, srcs, passed, differ, func(i int) string { return decision(model[i]) })
	v4, dropped := 0, 0
	for i, a := range srcs {
		if a.Unmap().Is4() {
			v4++
		}
		if !passed[i] {
			dropped++
		}
	}
	t.Logf("%s: %d sources (%d IPv4, %d IPv6): %d dropped, %d differ from the model", what, len(srcs), v4, len(srcs)-v4, dropped, len(differ))
	if v4 == 0 || v4 == len(srcs) || dropped == 0 || dropped == len(srcs) {
		t.Errorf("%s: the sample does not exercise both fates and both families", what)
	}
	return model
}

// report fails t for the sources at the indexes differ, naming at most
// MaxReported; want(i) says what source i should have met.
func report(t testing.TB, what string, srcs []netip.Addr, passed []bool, differ []int, want func(i int) string) {
	t.Helper()
	for k, i := range differ {
		if k == MaxReported {
			t.Errorf("%s: and %d more: %d of %d sources differ", what, len(differ)-k, len(differ), len(srcs))
			break
		}
		t.Errorf("%s: %s %s, want %s", what, srcs[i], fate(passed[i]), want(i))
	}
}

func fate(passed bool) string {
	if passed {
		return "passed"
	}
	return "dropped"
}

// decision is the model's decision d in words: "drop (model: rule feeds)".
func decision(d plan.Decision) string {
	rule := d.Rule
	if rule == "" {
		rule = "none"
	}
	return fmt.Sprintf("%s (model: rule %s, in its set %v)", d.Verdict, rule, d.InSet)
}
