package demo

import (
	"context"
	"io"
	"testing"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestRun runs the demo end to end with a small measurement, as `make
// demo` does with bigger numbers: every verdict must match the model and
// the measurement must produce every cell.
func TestRun(t *testing.T) {
	netnstest.New(t) // skips when not root; fails in CI when the lab cannot be made
	rep, err := Run(context.Background(), Options{Sources: 6000, Rounds: 1, Packets: 20000, Progress: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mismatches != 0 || rep.SourcesV4 == 0 || rep.SourcesV6 == 0 || rep.Dropped == 0 || rep.Dropped == rep.Sources {
		t.Errorf("verdicts: %+v", rep)
	}
	if rep.Load.Elements == 0 || rep.Load.Millis == 0 {
		t.Errorf("load: %+v", rep.Load)
	}
	if rep.PerPacket == nil || len(rep.PerPacket.Cells) != 3*4 {
		t.Fatalf("per-packet cells: %+v", rep.PerPacket)
	}
	for _, c := range rep.PerPacket.Cells {
		if c.NsPerPacket <= 0 || len(c.Rounds) != 1 {
			t.Errorf("cell %+v", c)
		}
	}
}
