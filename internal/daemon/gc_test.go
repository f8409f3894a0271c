package daemon

import (
	"runtime/debug"
	"testing"
)

// TestCollectSooner: a reload lowers GOGC to reloadGCPercent, never raises
// it, never turns a disabled collector on, and gives back what was set.
func TestCollectSooner(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	for _, c := range []struct{ set, during int }{{100, 50}, {200, 50}, {50, 50}, {20, 20}, {-1, -1}} {
		debug.SetGCPercent(c.set)
		old := collectSooner(50)
		if during := debug.SetGCPercent(old); during != c.during || old != c.set {
			t.Errorf("GOGC %d: %d during the reload and %d given back, want %d and %d", c.set, during, old, c.during, c.set)
		}
	}
}
