package bench

import (
	"strings"
	"testing"
	"time"
)

// TestProgressEstimate checks that the time left follows the recent steps:
// after many 1 s steps and then 8 steps of 20 s, the estimate is 20 s per
// step left, not the mean over all steps.
func TestProgressEstimate(t *testing.T) {
	var out strings.Builder
	p := NewProgress(&out, 40)
	clock := p.start
	p.now = func() time.Time { return clock }
	for range 30 {
		p.Step("short")
		clock = clock.Add(time.Second)
	}
	for range 9 {
		p.Step("long")
		clock = clock.Add(20 * time.Second)
	}
	out.Reset()
	p.Step("last")
	// 40th step starts after 30×1 s + 9×20 s; the last 8 steps took 20 s.
	if want := "[40/40, 3m30s, ~20s left] last\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	out.Reset()
	p.Step("over")
	if want := "[41/41, 3m30s, ~0s left] over\n"; out.String() != want {
		t.Errorf("past the total: got %q, want %q", out.String(), want)
	}
}
