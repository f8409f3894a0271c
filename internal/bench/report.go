package bench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ipfence/ipfence/internal/bench/plot"
)

// A Report is a scenario's result as ipfence bench writes it: the result
// itself (results.json), one CSV table (results.csv), a Markdown report
// (report.md) and its figures (NAME.svg and NAME.png).
type Report interface {
	CSV() string
	Markdown() string
	Figures() map[string]*plot.Figure
}

var (
	_ Report = (*ControlResult)(nil)
	_ Report = (*ScaleResult)(nil)
	_ Report = (*GeoResult)(nil)
	_ Report = (*HTTPResult)(nil)
	_ Report = (*ServerResult)(nil)
	_ Report = (*FootprintResult)(nil)
)

// spreadCell formats a median with its min–max spread.
func spreadCell(med, lo, hi float64) string {
	return fmt.Sprintf("%.0f (%.0f–%.0f)", med, lo, hi)
}

// ordered returns the distinct values key gives over xs, in first-seen
// order.
func ordered[T any](xs []T, key func(T) string) []string {
	var out []string
	for _, x := range xs {
		if k := key(x); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// table renders a Markdown table.
func table(b *strings.Builder, header []string, rows [][]string) {
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|")
	for i := range header {
		if i == 0 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
}

// CSV renders the scale rows and the DDoS rows.
func (r *ScaleResult) CSV() string {
	var b strings.Builder
	b.WriteString("part,family,config,scale,entries,overhead_ns,overhead_min_ns,overhead_max_ns,ns_per_packet,ns_per_packet_min,ns_per_packet_max,load_ms,packets\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "scale,%s,%s,%d,%d,%.1f,%.1f,%.1f,%.1f,,,%.2f,%d\n", x.Family, x.Config, x.Scale, x.Entries,
			x.OverheadNs, x.OverheadMin, x.OverheadMax, x.NsPerPacket, x.LoadMs, x.Packets)
	}
	for _, x := range r.DDoS {
		fmt.Fprintf(&b, "ddos,,%s,,,,,,%.1f,%.1f,%.1f,,\n", csvQuote(x.Hook), x.NsPerPacket, x.Min, x.Max)
	}
	return b.String()
}

func csvQuote(s string) string {
	if strings.ContainsAny(s, ",\"") {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	return s
}

// Markdown renders a table per family (overhead per packet by SCALE and
// config) and the DDoS table.
func (r *ScaleResult) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## scale: the Red Hat nftables benchmark\n\nNanoseconds of CPU a packet costs over an empty firewall: median of %d interleaved rounds (min–max). At SCALE s each ruleset holds 10·s entries the traffic does not match.\n", r.Rounds)
	for _, f := range ordered(r.Rows, func(x ScaleRow) string { return x.Family }) {
		rows := filter(r.Rows, func(x ScaleRow) bool { return x.Family == f })
		cfgs := ordered(rows, func(x ScaleRow) string { return x.Config })
		fmt.Fprintf(&b, "\n### %s\n\n", f)
		var out [][]string
		for _, s := range ordered(rows, func(x ScaleRow) string { return fmt.Sprint(x.Scale) }) {
			line := []string{s}
			for _, c := range cfgs {
				for _, x := range rows {
					if x.Config == c && fmt.Sprint(x.Scale) == s {
						line = append(line, spreadCell(x.OverheadNs, x.OverheadMin, x.OverheadMax))
					}
				}
			}
			out = append(out, line)
		}
		table(&b, append([]string{"SCALE"}, cfgs...), out)
	}
	if len(r.DDoS) > 0 {
		b.WriteString("\n### ddos: where matching traffic is dropped\n\nCPU per packet in all, sent to the firewall's own address (the baseline delivers to UDP, which has no socket). XDP on a veth pays for handing the packet to XDP and back, which a real NIC's driver does not:\n\n")
		var out [][]string
		for _, x := range r.DDoS {
			out = append(out, []string{x.Hook, spreadCell(x.NsPerPacket, x.Min, x.Max)})
		}
		table(&b, []string{"dropped at", "ns per packet"}, out)
	}
	for _, n := range r.Notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}

// Figures draws one line plot per family and a bar chart of the DDoS part.
func (r *ScaleResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	for _, f := range ordered(r.Rows, func(x ScaleRow) string { return x.Family }) {
		fig := &plot.Figure{Title: "scale: " + f, XLabel: "SCALE (10 entries each)", YLabel: "ns per packet over empty firewall"}
		rows := filter(r.Rows, func(x ScaleRow) bool { return x.Family == f })
		for _, c := range ordered(rows, func(x ScaleRow) string { return x.Config }) {
			s := plot.Series{Name: c}
			for _, x := range rows {
				if x.Config == c {
					s.Points = append(s.Points, plot.Point{X: float64(x.Scale), Min: x.OverheadMin, Median: x.OverheadNs, Max: x.OverheadMax})
				}
			}
			fig.Series = append(fig.Series, s)
		}
		figs["scale-"+f] = fig
	}
	if len(r.DDoS) > 0 {
		fig := &plot.Figure{Title: "ddos: drop point", YLabel: "ns per packet", Series: []plot.Series{{Name: "CPU per packet"}}}
		for i, x := range r.DDoS {
			fig.Categories = append(fig.Categories, x.Hook)
			fig.Series[0].Points = append(fig.Series[0].Points, plot.Point{X: float64(i), Min: x.Min, Median: x.NsPerPacket, Max: x.Max})
		}
		figs["scale-ddos"] = fig
	}
	return figs
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// CSV renders per-packet, load and latency rows.
func (r *GeoResult) CSV() string {
	var b strings.Builder
	b.WriteString("part,set,prefixes,config,traffic_or_probe,overhead_ns,overhead_min_ns,overhead_max_ns,ns_per_packet,ns_per_packet_min,ns_per_packet_max,packets_or_samples,load_ms,p50_us,p99_us,max_us,lost\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "per_packet,%s,%d,%s,%s,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%d,,,,,\n", csvQuote(x.Set), x.Prefixes, x.Config, x.Traffic,
			x.OverheadNs, x.OverheadMin, x.OverheadMax, x.NsPerPacket, x.NsMin, x.NsMax, x.Packets)
	}
	for _, x := range r.Loads {
		fmt.Fprintf(&b, "load,%s,%d,%s,,,,,,,,,%.1f,,,,\n", csvQuote(x.Set), x.Prefixes, x.Config, x.LoadMs)
	}
	for _, x := range r.Latency {
		fmt.Fprintf(&b, "latency,%s,%d,%s,%s,,,,,,,%d,,%.1f,%.1f,%.1f,%d\n", csvQuote(x.Set), x.Prefixes, x.Config, x.Probe, x.Samples, x.P50us, x.P99us, x.MaxUs, x.Lost)
	}
	for _, x := range r.XDPRun {
		fmt.Fprintf(&b, "xdp_prog_run,%s,%d,%s,%s,,,,%.1f,,,,,,,,\n", csvQuote(x.Set), x.Prefixes, x.Config, x.Traffic, x.NsPerRun)
	}
	return b.String()
}

// Markdown renders one table per country set.
func (r *GeoResult) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## geo: blocking real country data\n\nPer packet: ns of CPU over an empty firewall, median of %d interleaved rounds (min–max); legit traffic comes from other countries, blocked from the set (uniformly, or Zipf-distributed over %d attackers). Latency from a legitimate IPv4 host through the loaded ruleset: UDP request/response and TCP connect, p50 / p99 over all rounds.\n", r.Rounds, geoAttackers)
	for _, s := range r.Sets {
		fmt.Fprintf(&b, "\n### %s: %s (%d %s prefixes)\n\n", s.Name, strings.Join(s.Countries, ","), s.Prefixes, s.family())
		var out [][]string
		for _, c := range ordered(r.Rows, func(x GeoRow) string { return x.Config }) {
			line := []string{c}
			for _, tr := range GeoTraffic {
				for _, x := range r.Rows {
					if x.Set == s.Name && x.Config == c && x.Traffic == tr {
						line = append(line, geoCell(x))
					}
				}
			}
			load := "–"
			for _, x := range r.Loads {
				if x.Set == s.Name && x.Config == c {
					load = fmt.Sprintf("%.0f ms", x.LoadMs)
				}
			}
			line = append(line, load)
			for _, p := range probeNames {
				cell := "–"
				for _, x := range r.Latency {
					if x.Set == s.Name && x.Config == c && x.Probe == p {
						cell = latencyCell(x)
					}
				}
				line = append(line, cell)
			}
			out = append(out, line)
		}
		table(&b, []string{"config", "legit: ns over none", "blocked: ns in all", "blocked, Zipf: ns in all", "load", "UDP RTT p50 / p99", "TCP connect p50 / p99"}, out)
		for _, c := range ordered(r.XDPRun, func(x XDPRunRow) string { return x.Config }) {
			var runs []string
			for _, x := range r.XDPRun {
				if x.Set == s.Name && x.Config == c {
					runs = append(runs, fmt.Sprintf("%s %.0f ns", x.Traffic, x.NsPerRun))
				}
			}
			if len(runs) > 0 {
				fmt.Fprintf(&b, "\nThe %s program alone (BPF_PROG_TEST_RUN, no device): %s per run.\n", c, strings.Join(runs, ", "))
			}
		}
	}
	b.WriteString("\nBlocked packets skip the routing step the baseline pays, so their cost is given in all, not over the baseline. XDP on a veth pays for handing the packet to XDP and back, which a real NIC's driver does not: the program's own run time is given apart.\n")
	return b.String()
}

// geoCell is a per-packet cell: legit traffic's overhead over the
// baseline, blocked traffic's cost in all.
func geoCell(x GeoRow) string {
	if x.Traffic != "legit" {
		return spreadCell(x.NsPerPacket, x.NsMin, x.NsMax)
	}
	return spreadCell(x.OverheadNs, x.OverheadMin, x.OverheadMax)
}

// geoPoint is geoCell as a plot point.
func geoPoint(i int, x GeoRow) plot.Point {
	if x.Traffic != "legit" {
		return plot.Point{X: float64(i), Min: x.NsMin, Median: x.NsPerPacket, Max: x.NsMax}
	}
	return plot.Point{X: float64(i), Min: x.OverheadMin, Median: x.OverheadNs, Max: x.OverheadMax}
}

func latencyCell(x LatencyRow) string {
	s := fmt.Sprintf("%.0f / %.0f µs", x.P50us, x.P99us)
	if x.Lost > 0 {
		s += fmt.Sprintf(" (%d lost)", x.Lost)
	}
	return s
}

// Figures draws, per traffic, a bar chart of the per-packet overhead by
// config and country set (log scale: linear rules cost thousands of times
// more than a lookup; a bar whose median is not above 0 is left out), and
// one of load times.
func (r *GeoResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	cfgs := slices.DeleteFunc(ordered(r.Rows, func(x GeoRow) string { return x.Config }), func(c string) bool { return c == "none" })
	for _, tr := range GeoTraffic {
		ylabel := "ns per packet over empty firewall"
		if tr != "legit" {
			ylabel = "ns per dropped packet"
		}
		fig := &plot.Figure{Title: "geo: " + tr + " traffic", YLabel: ylabel, LogY: true, Categories: cfgs}
		for _, s := range r.Sets {
			ser := plot.Series{Name: fmt.Sprintf("%s (%dk)", s.Name, (s.Prefixes+500)/1000)}
			for i, c := range cfgs {
				for _, x := range r.Rows {
					if x.Set == s.Name && x.Config == c && x.Traffic == tr {
						ser.Points = append(ser.Points, geoPoint(i, x))
					}
				}
			}
			fig.Series = append(fig.Series, ser)
		}
		figs["geo-"+tr] = fig
	}
	fig := &plot.Figure{Title: "geo: load time", YLabel: "ms", LogY: true, Categories: cfgs}
	for _, s := range r.Sets {
		ser := plot.Series{Name: s.Name}
		for i, c := range cfgs {
			for _, x := range r.Loads {
				if x.Set == s.Name && x.Config == c {
					ser.Points = append(ser.Points, plot.Point{X: float64(i), Min: x.LoadMs, Median: x.LoadMs, Max: x.LoadMs})
				}
			}
		}
		fig.Series = append(fig.Series, ser)
	}
	figs["geo-load"] = fig
	return figs
}

// CSV renders the growth rows and the per-port rows.
func (r *HTTPResult) CSV() string {
	var b strings.Builder
	b.WriteString("part,rules,config,phase,requests,errors,p50_us,p95_us,p99_us,max_us,round_median_min_us,round_median_max_us\n")
	for _, x := range r.Growth {
		fmt.Fprintf(&b, "growth,%d,%s,%s,%d,%d,%.1f,,%.1f,%.1f,%.1f,%.1f\n", x.Rules, x.Config, x.Phase, x.Requests, x.Failed, x.P50us, x.P99us, x.MaxUs, x.MedianMin, x.MedianMax)
	}
	for _, x := range r.PerPort {
		fmt.Fprintf(&b, "per_port,,%s,complete,%d,%d,%.1f,%.1f,%.1f,%.1f,,\n", csvQuote(x.Config), x.Requests, x.Errors, x.P50us, x.P95us, x.P99us, x.MaxUs)
	}
	return b.String()
}

// Markdown renders the growth table (complete and connect, p50 and p99,
// by block list size) and the per-port table.
func (r *HTTPResult) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## http: what web clients see\n\nSequential GETs of 10 KiB, each on a new connection, from a host the block list does not match, while the list grows (real country prefixes); µs from the start of the request, p50 / p99 over %d interleaved rounds:\n\n", r.Rounds)
	cfgs := ordered(r.Growth, func(x HTTPGrowthRow) string { return x.Config })
	var out [][]string
	for _, n := range ordered(r.Growth, func(x HTTPGrowthRow) string { return fmt.Sprint(x.Rules) }) {
		line := []string{n}
		for _, c := range cfgs {
			cell := map[string]HTTPGrowthRow{}
			for _, x := range r.Growth {
				if fmt.Sprint(x.Rules) == n && x.Config == c {
					cell[x.Phase] = x
				}
			}
			s := fmt.Sprintf("%.0f / %.0f (connect %.0f)", cell["complete"].P50us, cell["complete"].P99us, cell["connect"].P50us)
			if f := cell["complete"].Failed; f > 0 {
				s += fmt.Sprintf(", %d failed", f)
			}
			line = append(line, s)
		}
		out = append(out, line)
	}
	table(&b, append([]string{"rules"}, cfgs...), out)
	fmt.Fprintf(&b, "\nPer port: %d client addresses allowed on %d ports (%v), all else to those ports dropped; requests at %.0f/s for %v per round from all clients, latency from the scheduled send to the last byte:\n\n",
		r.Clients, len(r.Ports), r.Ports, r.Rate, r.Duration)
	out = nil
	for _, x := range r.PerPort {
		out = append(out, []string{x.Config, fmt.Sprint(x.Requests), fmt.Sprint(x.Errors),
			fmt.Sprintf("%.0f µs", x.P50us), fmt.Sprintf("%.0f µs", x.P95us), fmt.Sprintf("%.0f µs", x.P99us), fmt.Sprintf("%.0f µs", x.MaxUs)})
	}
	table(&b, []string{"config", "requests", "errors", "p50", "p95", "p99", "max"}, out)
	return b.String()
}

// Figures draws request completion (p50, error bars: the spread of the
// rounds' medians) against the block list size, and the per-port
// percentiles.
func (r *HTTPResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	for _, ph := range []string{"connect", "complete"} {
		fig := &plot.Figure{Title: "http: " + ph + " (p50)", XLabel: "prefixes in the block list", YLabel: "µs"}
		for _, c := range ordered(r.Growth, func(x HTTPGrowthRow) string { return x.Config }) {
			s := plot.Series{Name: c}
			for _, x := range r.Growth {
				if x.Config == c && x.Phase == ph {
					s.Points = append(s.Points, plot.Point{X: float64(x.Rules), Min: x.MedianMin, Median: x.P50us, Max: x.MedianMax})
				}
			}
			fig.Series = append(fig.Series, s)
		}
		figs["http-growth-"+ph] = fig
	}
	fig := &plot.Figure{Title: "http: per-port rules at a fixed rate", YLabel: "µs", LogY: true, Categories: []string{"p50", "p95", "p99", "max"}}
	for _, x := range r.PerPort {
		s := plot.Series{Name: x.Config}
		for i, v := range []float64{x.P50us, x.P95us, x.P99us, x.MaxUs} {
			s.Points = append(s.Points, plot.Point{X: float64(i), Min: v, Median: v, Max: v})
		}
		fig.Series = append(fig.Series, s)
	}
	figs["http-per-port"] = fig
	return figs
}
