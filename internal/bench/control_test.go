package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

func TestCountElements(t *testing.T) {
	for _, tc := range []struct {
		listing string
		want    int
	}{
		{"table inet t {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\n", 0},
		{"set s {\n\t\telements = { 10.0.0.1 timeout 6h expires 5h59m }\n\t}", 1},
		{"set s {\n\t\telements = { 10.0.0.0/31 timeout 6h expires 5h,\n\t\t\t     10.0.0.4/31 timeout 6h expires 5h,\n\t\t\t     10.0.0.8/31 }\n\t}", 3},
	} {
		if got := countElements(tc.listing); got != tc.want {
			t.Errorf("countElements(%q) = %d, want %d", tc.listing, got, tc.want)
		}
	}
}

// TestControl runs a small control scenario in a lab: every row is there,
// the sets held what they were loaded with, and the bench table is gone.
func TestControl(t *testing.T) {
	lab := netnstest.New(t)
	o := ControlOptions{Sizes: []int{0, 300}, Writers: []int{1, 3}, Adds: 30, Bulk: 600, Batches: []int{7, 600},
		CountUpTo: 300, RowTime: time.Minute}
	res, err := Control(context.Background(), lab, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Adds) != 8 || len(res.Loads) != 4 || len(res.Bulk) != 4 {
		t.Fatalf("rows: %d adds, %d loads, %d bulk; want 8, 4, 4", len(res.Adds), len(res.Loads), len(res.Bulk))
	}
	for _, a := range res.Adds {
		if a.Adds != 30 || a.P50us <= 0 || a.P99us < a.P50us || a.MaxUs < a.P99us {
			t.Errorf("single adds: %+v", a)
		}
	}
	for _, l := range res.Loads {
		if l.Counted != l.Size || l.LoadMs <= 0 || l.CountMs <= 0 {
			t.Errorf("load: %+v (counted must equal the elements loaded)", l)
		}
	}
	for _, b := range res.Bulk {
		if b.PerSec <= 0 || b.Inserted != 600 {
			t.Errorf("bulk: %+v", b)
		}
	}
	out, err := netns.Exec(lab.FW, "nft", "list", "tables")
	if err != nil || strings.Contains(string(out), controlTable) {
		t.Errorf("the bench table is still there: %s %v", out, err)
	}
	if csv := res.CSV(); strings.Count(csv, "\n") != 1+8+4+4 {
		t.Errorf("CSV has %d lines:\n%s", strings.Count(csv, "\n"), csv)
	}
	if md := res.Markdown(); !strings.Contains(md, "| interval | 300 | 3 |") {
		t.Errorf("report lacks the interval row:\n%s", md)
	}
}

func TestPercentile(t *testing.T) {
	ds := make([]time.Duration, 200)
	for i := range ds {
		ds[i] = time.Duration(200-i) * time.Microsecond // 200 µs down to 1 µs
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 100 * time.Microsecond}, {99, 198 * time.Microsecond}, {100, 200 * time.Microsecond}, {0, time.Microsecond}} {
		if got := Percentile(ds, tc.p); got != tc.want {
			t.Errorf("Percentile(1..200 µs, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if ds[0] != 200*time.Microsecond {
		t.Error("Percentile sorted its argument")
	}
	if got := Percentile(nil, 99); got != 0 {
		t.Errorf("Percentile(nil) = %v", got)
	}
}
