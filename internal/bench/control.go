package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/bench/plot"
	"github.com/ipfence/ipfence/internal/netns"
)

// The control scenario measures the control plane of nft sets: what a
// single ban costs as a set grows, for the two kinds of set a ban can go
// into (a hash set, as ipfence's address bans; an interval set, as the
// plain "one big set" tools use), with one writer and with several;
// loading a set whole; bulk inserts by transaction size; and counting the
// elements by listing the set, as scripts do.

// ControlOptions configure Control.
type ControlOptions struct {
	Sizes   []int // elements in the set before the single adds
	Writers []int // concurrent writers, each on its own netlink socket
	Adds    int   // single-element transactions per row (split among writers)
	// Bulk is how many elements the bulk rows insert, in transactions of
	// each of Batches elements.
	Bulk    int
	Batches []int
	// CountUpTo bounds the sets counted by listing them: the kernel's
	// dump restarts its walk for every message, so listing takes time
	// quadratic in the set's size.
	CountUpTo int
	// RowTime bounds each row of single adds: a row stops when it has
	// run this long (an interval set of a million takes tens of
	// milliseconds per add).
	RowTime time.Duration
}

// QuickControl is a smoke run (seconds); FullControl the published one.
var (
	QuickControl = ControlOptions{Sizes: []int{0, 1000, 10000}, Writers: []int{1, 8}, Adds: 400,
		Bulk: 20000, Batches: []int{100, 1000, 20000}, CountUpTo: 10000, RowTime: 2 * time.Second}
	FullControl = ControlOptions{Sizes: []int{0, 1000, 10000, 100000, 437000, 1000000}, Writers: []int{1, 8}, Adds: 2000,
		Bulk: 200000, Batches: []int{1, 100, 1000, 10000, 100000}, CountUpTo: 100000, RowTime: 20 * time.Second}
)

// SetKinds are the kinds of set Control compares.
var SetKinds = []string{"hash", "interval"}

// AddRow is the single-element transaction latency into a set of Size
// elements.
type AddRow struct {
	Kind    string  `json:"set"`
	Size    int     `json:"elements"`
	Writers int     `json:"writers"`
	Adds    int     `json:"adds"`
	P50us   float64 `json:"p50_us"`
	P99us   float64 `json:"p99_us"`
	MaxUs   float64 `json:"max_us"`
}

// LoadRow is the time to load a set of Size elements in one transaction,
// and to count them by listing the set (0: not counted, see CountUpTo).
type LoadRow struct {
	Kind    string  `json:"set"`
	Size    int     `json:"elements"`
	LoadMs  float64 `json:"load_ms"`
	CountMs float64 `json:"count_by_listing_ms,omitempty"`
	Counted int     `json:"counted,omitempty"` // elements the listing showed
}

// BulkRow is the insert rate into an empty set in transactions of Batch
// elements: Inserted elements (fewer than asked when the row ran out of
// time) at PerSec.
type BulkRow struct {
	Kind     string  `json:"set"`
	Batch    int     `json:"elements_per_transaction"`
	Inserted int     `json:"elements"`
	PerSec   float64 `json:"elements_per_sec"`
}

// ControlResult is what Control measured.
type ControlResult struct {
	Adds  []AddRow  `json:"single_adds"`
	Loads []LoadRow `json:"loads"`
	Bulk  []BulkRow `json:"bulk_inserts"`
}

const controlTable = "ipfence_bench"

// benchSet is the set of a kind, as the ban sets are declared (timeouts).
func benchSet(kind string) *nft.Set {
	if kind == "interval" {
		return &nft.Set{Name: "s", Family: nft.IPv4, Interval: true, Timeout: true}
	}
	return &nft.Set{Name: "s", Family: nft.IPv4, KeyBits: 32, Timeout: true}
}

// elems returns n elements from base up, as the kind holds them: single
// addresses, or disjoint /31 prefixes two addresses apart (intervals that
// neither touch nor merge).
func elems(kind string, base uint32, n int) []nft.Elem {
	out := make([]nft.Elem, n)
	for i := range out {
		var a [4]byte
		if kind == "interval" {
			binary.BigEndian.PutUint32(a[:], base+uint32(4*i))
			out[i].Key = netip.PrefixFrom(netip.AddrFrom4(a), 31)
		} else {
			binary.BigEndian.PutUint32(a[:], base+uint32(i))
			out[i].Key = netip.PrefixFrom(netip.AddrFrom4(a), 32)
		}
		out[i].Timeout = 6 * time.Hour
	}
	return out
}

// ControlSteps is the number of progress steps Control takes with o.
func ControlSteps(o ControlOptions) int {
	n := len(o.Batches)
	for _, size := range o.Sizes {
		n += 1 + len(o.Writers)
		if size <= o.CountUpTo {
			n++
		}
	}
	return n * len(SetKinds)
}

// Control runs the control scenario in lab's firewall namespace.
func Control(ctx context.Context, lab *netns.Lab, o ControlOptions, progress func(string)) (*ControlResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	res := &ControlResult{}
	for _, kind := range SetKinds {
		for _, size := range o.Sizes {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			progress(fmt.Sprintf("%s set: loading %d elements", kind, size))
			s := benchSet(kind)
			s.Elems = nft.ElemsOf(elems(kind, 10<<24, size)...) // 10.0.0.0 up
			t0 := time.Now()
			if _, err := nft.Apply(ctx, &nft.Program{Table: controlTable, Sets: []*nft.Set{s}}, nft.ApplyOptions{NetNS: lab.FW}); err != nil {
				return nil, fmt.Errorf("loading the %s set with %d elements: %w", kind, size, err)
			}
			lr := LoadRow{Kind: kind, Size: size, LoadMs: ms(time.Since(t0))}
			if size <= o.CountUpTo {
				progress(fmt.Sprintf("%s set: counting %d elements by listing", kind, size))
				t0 := time.Now()
				out, err := netns.Exec(lab.FW, "nft", "list", "set", "inet", controlTable, s.Name)
				if err != nil {
					return nil, fmt.Errorf("listing the %s set: %w: %s", kind, err, out)
				}
				lr.CountMs = ms(time.Since(t0))
				lr.Counted = countElements(string(out))
			}
			res.Loads = append(res.Loads, lr)
			s.Elems = nft.Elems{}
			next := uint32(11 << 24) // single adds: 11.0.0.0 up
			for _, w := range o.Writers {
				progress(fmt.Sprintf("%s set of %d: single adds, %d writers", kind, size, w))
				ds, err := singleAdds(ctx, lab.FW, s, kind, &next, w, o.Adds, time.Now().Add(o.RowTime))
				if err != nil {
					return nil, err
				}
				res.Adds = append(res.Adds, AddRow{Kind: kind, Size: size, Writers: w, Adds: len(ds),
					P50us: us(Percentile(ds, 50)), P99us: us(Percentile(ds, 99)), MaxUs: us(Percentile(ds, 100))})
			}
		}
		for _, b := range o.Batches {
			progress(fmt.Sprintf("%s set: %d elements in transactions of %d", kind, o.Bulk, b))
			n, rate, err := bulkInsert(ctx, lab.FW, kind, o.Bulk, b, time.Now().Add(o.RowTime))
			if err != nil {
				return nil, err
			}
			res.Bulk = append(res.Bulk, BulkRow{Kind: kind, Batch: b, Inserted: n, PerSec: rate})
		}
	}
	if _, err := netns.Exec(lab.FW, "nft", "delete", "table", "inet", controlTable); err != nil {
		return nil, fmt.Errorf("removing the bench table: %w", err)
	}
	return res, nil
}

// singleAdds adds n elements one per transaction from writers concurrent
// writers, stopping at end, and returns each transaction's duration.
func singleAdds(ctx context.Context, ns string, s *nft.Set, kind string, next *uint32, writers, n int, end time.Time) ([]time.Duration, error) {
	per := max(n/writers, 1)
	es := elems(kind, *next, per*writers)
	*next += uint32(4 * per * writers)
	var mu sync.Mutex
	var out []time.Duration
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			up, err := nft.NewUpdater(nft.ApplyOptions{NetNS: ns})
			if err != nil {
				errs[w] = err
				return
			}
			defer up.Close()
			for i := 0; i < per && time.Now().Before(end); i++ {
				e := es[w*per+i]
				t0 := time.Now()
				if _, err := up.Apply(ctx, &nft.Update{Table: controlTable, Sets: []nft.SetChange{{Set: s, Add: []nft.Elem{e}}}}); err != nil {
					errs[w] = fmt.Errorf("adding %v to the %s set: %w", e.Key, kind, err)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				out = append(out, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bulkInsert inserts n elements into a new, empty set of kind in
// transactions of batch elements, stopping at end, and returns how many
// it inserted and how many per second.
func bulkInsert(ctx context.Context, ns, kind string, n, batch int, end time.Time) (int, float64, error) {
	s := benchSet(kind)
	s.Name = "bulk"
	if _, err := nft.Apply(ctx, &nft.Program{Table: controlTable, Sets: []*nft.Set{benchSet(kind), s}}, nft.ApplyOptions{NetNS: ns}); err != nil {
		return 0, 0, err
	}
	up, err := nft.NewUpdater(nft.ApplyOptions{NetNS: ns})
	if err != nil {
		return 0, 0, err
	}
	defer up.Close()
	es := elems(kind, 12<<24, n) // 12.0.0.0 up
	done := 0
	t0 := time.Now()
	for chunk := range slices.Chunk(es, batch) {
		if time.Now().After(end) {
			break
		}
		if _, err := up.Apply(ctx, &nft.Update{Table: controlTable, Sets: []nft.SetChange{{Set: s, Add: chunk}}}); err != nil {
			return 0, 0, fmt.Errorf("bulk insert into the %s set: %w", kind, err)
		}
		done += len(chunk)
	}
	return done, float64(done) / time.Since(t0).Seconds(), nil
}

// countElements counts the elements of a set in nft's listing of it.
func countElements(listing string) int {
	_, rest, ok := strings.Cut(listing, "elements = {")
	if !ok {
		return 0
	}
	body, _, _ := strings.Cut(rest, "}")
	return strings.Count(body, ",") + 1
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Percentile is the p-th percentile of ds (nearest rank); 100 is the
// maximum, and 0 is returned for no durations.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// CSV renders the result as one table: scenario part, set kind, and the
// numbers of each row.
func (r *ControlResult) CSV() string {
	var b strings.Builder
	b.WriteString("part,set,elements,writers,elements_per_transaction,p50_us,p99_us,max_us,load_ms,count_ms,elements_per_sec\n")
	// elements: in the set before (single adds), loaded (load), inserted
	// (bulk_insert).
	for _, a := range r.Adds {
		fmt.Fprintf(&b, "single_add,%s,%d,%d,1,%.1f,%.1f,%.1f,,,\n", a.Kind, a.Size, a.Writers, a.P50us, a.P99us, a.MaxUs)
	}
	for _, l := range r.Loads {
		fmt.Fprintf(&b, "load,%s,%d,,%d,,,,%.1f,%.1f,\n", l.Kind, l.Size, l.Size, l.LoadMs, l.CountMs)
	}
	for _, k := range r.Bulk {
		fmt.Fprintf(&b, "bulk_insert,%s,%d,,%d,,,,,,%.0f\n", k.Kind, k.Inserted, k.Batch, k.PerSec)
	}
	return b.String()
}

// Markdown renders the result as a report.
func (r *ControlResult) Markdown() string {
	var b strings.Builder
	b.WriteString("## control: nft sets' control plane\n\n")
	b.WriteString("Single-element transactions (a ban) into a set already holding some elements:\n\n")
	b.WriteString("| set | elements | writers | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n")
	for _, a := range r.Adds {
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f µs | %.0f µs | %.0f µs |\n", a.Kind, a.Size, a.Writers, a.P50us, a.P99us, a.MaxUs)
	}
	b.WriteString("\nLoading the set whole (one transaction), and counting its elements by listing it (`nft list set`):\n\n")
	b.WriteString("| set | elements | load | count by listing |\n|---|---:|---:|---:|\n")
	for _, l := range r.Loads {
		count := "not measured (quadratic)"
		if l.CountMs > 0 {
			count = fmt.Sprintf("%.1f ms", l.CountMs)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f ms | %s |\n", l.Kind, l.Size, l.LoadMs, count)
	}
	b.WriteString("\nBulk inserts into an empty set, by elements per transaction:\n\n")
	b.WriteString("| set | per transaction | elements inserted | elements/s |\n|---|---:|---:|---:|\n")
	for _, k := range r.Bulk {
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f |\n", k.Kind, k.Batch, k.Inserted, k.PerSec)
	}
	return b.String()
}

// Figures draws single-add latency against set size (p50 and p99, one
// line per set kind and writer count) and bulk insert rates by
// transaction size. Rows are single runs: no error bars.
func (r *ControlResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	for _, q := range []struct {
		name string
		v    func(AddRow) float64
	}{{"p50", func(a AddRow) float64 { return a.P50us }}, {"p99", func(a AddRow) float64 { return a.P99us }}} {
		fig := &plot.Figure{Title: "control: one ban, " + q.name, XLabel: "elements in the set", YLabel: "µs per single-element transaction", LogY: true}
		for _, key := range ordered(r.Adds, func(a AddRow) string { return fmt.Sprintf("%s, %d writers", a.Kind, a.Writers) }) {
			s := plot.Series{Name: key}
			for _, a := range r.Adds {
				if fmt.Sprintf("%s, %d writers", a.Kind, a.Writers) == key {
					v := q.v(a)
					s.Points = append(s.Points, plot.Point{X: float64(a.Size), Min: v, Median: v, Max: v})
				}
			}
			fig.Series = append(fig.Series, s)
		}
		figs["control-add-"+q.name] = fig
	}
	batches := ordered(r.Bulk, func(k BulkRow) string { return fmt.Sprint(k.Batch) })
	fig := &plot.Figure{Title: "control: bulk inserts", XLabel: "elements per transaction", YLabel: "elements per second", LogY: true, Categories: batches}
	for _, kind := range ordered(r.Bulk, func(k BulkRow) string { return k.Kind }) {
		s := plot.Series{Name: kind}
		for _, k := range r.Bulk {
			if k.Kind == kind {
				s.Points = append(s.Points, plot.Point{X: float64(slices.Index(batches, fmt.Sprint(k.Batch))), Min: k.PerSec, Median: k.PerSec, Max: k.PerSec})
			}
		}
		fig.Series = append(fig.Series, s)
	}
	figs["control-bulk"] = fig
	return figs
}
