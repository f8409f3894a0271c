package daemon

import (
	"context"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/plan"
)

// metrics are the daemon's Prometheus metrics, on a registry of its own.
type metrics struct {
	reg          *prometheus.Registry
	banSeconds   prometheus.Histogram
	banBatch     prometheus.Histogram
	applySeconds *prometheus.HistogramVec
	feedErrors   *prometheus.CounterVec
	drift        prometheus.Counter
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.banSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ipfence_ban_request_seconds", Help: "Time from a ban request's arrival to the kernel holding it (API).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	})
	m.banBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ipfence_ban_batch_size", Help: "Bans and unbans per kernel transaction.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 9),
	})
	m.applySeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ipfence_apply_seconds", Help: "Kernel transactions by kind: full (whole table), update (feed refresh diff), ban.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
	}, []string{"kind"})
	m.feedErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ipfence_feed_errors_total", Help: "Failed loads of a source (the last good copy stays in force).",
	}, []string{"source"})
	m.drift = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ipfence_drift_repairs_total", Help: "Times the kernel's table differed from what was loaded and was loaded again.",
	})
	m.reg.MustRegister(m.banSeconds, m.banBatch, m.applySeconds, m.feedErrors, m.drift,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{d: d})
	return m
}

func (m *metrics) handler(profile bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	if profile {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// stateCollector reads the daemon's state (from memory) and the rules'
// counters (one rule dump per hit chain; no set is listed) at scrape time.
type stateCollector struct{ d *Daemon }

var (
	descBans     = prometheus.NewDesc("ipfence_bans", "Bans in force, by kind.", []string{"kind"}, nil)
	descOrigin   = prometheus.NewDesc("ipfence_bans_by_origin", "Bans in force, by origin.", []string{"origin"}, nil)
	descElements = prometheus.NewDesc("ipfence_rule_prefixes", "Prefixes of a rule as loaded, by family.", []string{"rule", "family"}, nil)
	descNftElems = prometheus.NewDesc("ipfence_nft_elements", "Elements of the compiled layout's sets and maps.", nil, nil)
	descFeedAge  = prometheus.NewDesc("ipfence_source_age_seconds", "Time since the source's data in force was loaded.", []string{"source"}, nil)
	descFeedErr  = prometheus.NewDesc("ipfence_source_last_load_failed", "1 when the last attempt to load the source failed.", []string{"source"}, nil)
	descStale    = prometheus.NewDesc("ipfence_source_stale", "1 when the source is served from a cached copy.", []string{"source"}, nil)
	descPackets  = prometheus.NewDesc("ipfence_rule_packets_total", "Packets a rule (or the bans) acted on.", []string{"rule"}, nil)
	descBytes    = prometheus.NewDesc("ipfence_rule_bytes_total", "Bytes a rule (or the bans) acted on.", []string{"rule"}, nil)
	descApplied  = prometheus.NewDesc("ipfence_applied_timestamp_seconds", "When the ruleset in force was loaded.", nil, nil)
	descMonitor  = prometheus.NewDesc("ipfence_rule_monitor", "1 when the rule is in monitor mode: its packets counts are what it would have dropped or rejected.", []string{"rule"}, nil)
	descXDPPass  = prometheus.NewDesc("ipfence_xdp_passed_packets_total", "Packets the XDP program passed on to nftables (since its last swap).", nil, nil)
	descCTCount  = prometheus.NewDesc("ipfence_conntrack_entries", "Connections the namespace's conntrack table holds (connection-aware rules let their packets pass).", nil, nil)
	descStrikes  = prometheus.NewDesc("ipfence_ban_strikes", "Prefixes whose last temporary ban ended within the recidive window (bans: recidive): a new ban of one is escalated.", nil, nil)
	descCTMax    = prometheus.NewDesc("ipfence_conntrack_max", "The size of the namespace's conntrack table (nf_conntrack_max): once full, new connections are dropped.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBans, descOrigin, descStrikes, descElements, descNftElems, descFeedAge, descFeedErr, descStale, descPackets, descBytes, descApplied, descXDPPass, descMonitor, descCTCount, descCTMax} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	if d.ctl == nil {
		return
	}
	var counts ban.Counts
	strikes := 0
	d.ctl.View(func(s *ban.Set) { counts, strikes = s.Tally(), s.Strikes() })
	ch <- prometheus.MustNewConstMetric(descStrikes, prometheus.GaugeValue, float64(strikes))
	for kind, n := range map[string]int{"address_ipv4": counts.Addr4, "address_ipv6": counts.Addr6, "prefix_ipv4": counts.Net4, "prefix_ipv6": counts.Net6} {
		ch <- prometheus.MustNewConstMetric(descBans, prometheus.GaugeValue, float64(n), kind)
	}
	for o, n := range counts.ByOrigin {
		ch <- prometheus.MustNewConstMetric(descOrigin, prometheus.GaugeValue, float64(n), o)
	}

	d.mu.Lock()
	table, netns := d.plan.Table, d.cfg.NetNS
	xdpRules, xdpOpt := xdpNames(d.plan), d.cfg.XDP
	xdpOpt.NetNS = d.cfg.NetNS
	hit := map[string]string{nft.BanChain: "ban"}
	for _, r := range d.plan.Rules {
		ch <- prometheus.MustNewConstMetric(descElements, prometheus.GaugeValue, float64(r.V4.Prefixes), r.Name, "ipv4")
		ch <- prometheus.MustNewConstMetric(descElements, prometheus.GaugeValue, float64(r.V6.Prefixes), r.Name, "ipv6")
		ch <- prometheus.MustNewConstMetric(descMonitor, prometheus.GaugeValue, b2f(r.Monitor), r.Name)
	}
	for i, r := range d.plan.Rules {
		if r.Backend != plan.XDP { // counted by the XDP program
			hit[nft.HitChain(i, r.Name)] = r.Name
		}
	}
	ch <- prometheus.MustNewConstMetric(descNftElems, prometheus.GaugeValue, float64(d.elements))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(d.applied.Unix()))
	now := time.Now()
	for name, ss := range d.sources {
		age := now.Sub(ss.loaded).Seconds()
		if ss.loaded.IsZero() {
			age = now.Sub(d.started).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descFeedAge, prometheus.GaugeValue, age, name)
		ch <- prometheus.MustNewConstMetric(descFeedErr, prometheus.GaugeValue, b2f(ss.lastErr != ""), name)
		ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, b2f(ss.stale), name)
	}
	d.mu.Unlock()

	if ct := apply.ReadConntrack(netns); ct != nil {
		ch <- prometheus.MustNewConstMetric(descCTCount, prometheus.GaugeValue, float64(ct.Entries))
		ch <- prometheus.MustNewConstMetric(descCTMax, prometheus.GaugeValue, float64(ct.Max))
	}

	// XDP rules count in the program's per-CPU counters (class k is the
	// k-th rule), which restart at each swap.
	if len(xdpRules) > 0 {
		if st, err := xdp.ReadStatus(xdpOpt, len(xdpRules)); err == nil {
			for c, per := range st.Counters {
				sum := xdp.Sum(per)
				if c == 0 {
					ch <- prometheus.MustNewConstMetric(descXDPPass, prometheus.CounterValue, float64(sum.Packets))
					continue
				}
				ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(sum.Packets), xdpRules[c-1])
				ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(sum.Bytes), xdpRules[c-1])
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts, err := nft.StatusChains(ctx, table, netns, func(chain string) bool { _, ok := hit[chain]; return ok })
	if err != nil {
		return
	}
	for _, chn := range ts.Chains {
		rule, ok := hit[chn.Name]
		if !ok {
			continue
		}
		var pk, by uint64
		for _, r := range chn.Rules {
			if r.HasCounter {
				pk, by = pk+r.Packets, by+r.Bytes
			}
		}
		ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(pk), rule)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(by), rule)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
