package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/examples"
	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/bench/plot"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/policy"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/source"
)

// The server scenario reproduces what "allow only Europe" does to a real
// server, with the built-in examples/europe.yaml and the bundled country
// data, in a netns.Server whose Internet hosts have real country
// addresses (inside the lab only): a host in Italy (allowed) and one in
// the United States (blocked). Through no firewall, a plain nft interval
// set of the policy's prefixes (one per family, stateless, before
// conntrack: what users run today) and ipfence (connection-aware, the
// default), it times
//
//   - dns: the server's own DNS round trip, a UDP query from a new socket
//     to a resolver in the blocked country and its answer;
//   - http-fetch: an HTTP fetch from the server from a host in the
//     blocked country: TCP connect, request, a 10 KiB response;
//   - interactive: a small request and its echo, from the allowed host
//     into the server, on a connection opened beforehand.
//
// A measurement the firewall breaks shows as failures (timeouts), not as
// numbers. Its per-packet part runs in the bench lab with conntrack
// loaded in the firewall namespace for every config (the baseline is
// conntrack alone): packets of established connections (replies to
// conntrack entries inserted beforehand), new connections from allowed
// sources, and blocked new connections (attack traffic), through
// ipfence, ipfence with stateless rules, and the plain interval set
// before and after conntrack.

// ServerOptions configure Server.
type ServerOptions struct {
	// Rounds of the three measurements, interleaved by config (one
	// warm-up round first), and Samples of each per config and round.
	Rounds, Samples int
	// Timeout is how long a sample may take before it counts as failed;
	// after serverGiveUp failures in a row a measurement stops for the
	// round, the rest counted failed too.
	Timeout time.Duration
	// PerPacket shapes the per-packet part (Rounds 0: none).
	PerPacket PerPacketOptions
}

// QuickServer is a smoke run; FullServer the published one.
var (
	QuickServer = ServerOptions{Rounds: 1, Samples: 20, Timeout: 300 * time.Millisecond,
		PerPacket: PerPacketOptions{Rounds: 1, Packets: 2000, Budget: 20 * time.Millisecond}}
	FullServer = ServerOptions{Rounds: 5, Samples: 200, Timeout: time.Second,
		PerPacket: PerPacketOptions{Rounds: 15, Packets: 50000, Budget: 250 * time.Millisecond}}
)

// ServerMeasures are the server scenario's measurements, ServerConfigs
// its firewalls.
var (
	ServerMeasures = []string{"dns", "http-fetch", "interactive"}
	ServerConfigs  = []string{"none", "nft-interval-set", "ipfence"}
	// ServerPacketConfigs are the per-packet part's firewalls after its
	// baseline ("conntrack": conntrack loaded, no ruleset on the path),
	// ServerTraffic its traffic.
	ServerPacketConfigs = []string{"ipfence", "ipfence-stateless", "nft-interval-set", "nft-interval-set-after-ct"}
	ServerTraffic       = []string{"established", "new-allowed", "new-blocked"}
)

// serverGiveUp is the failures in a row after which a measurement stops
// for the round.
const serverGiveUp = 3

// serverBody is the size of the HTTP response.
const serverBody = 10 << 10

// Ports of the server scenario's services.
const (
	serverDNSPort  = 53
	serverHTTPPort = 80
	serverEchoPort = 7
)

// Real addresses of the hosts in Net, inside the lab only: the allowed
// host in Italy, the blocked one in the United States (checked against
// the policy's set when the scenario starts).
var (
	serverAllowed = [2]netip.Addr{netip.MustParseAddr("151.1.1.1"), netip.MustParseAddr("2a01:4f8::1")}
	serverBlocked = [2]netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2001:4860:4860::8888")}
)

// ServerRow is one measurement through one config: percentiles over the
// samples of all rounds that succeeded, and how many failed.
type ServerRow struct {
	Config  string  `json:"config"`
	Measure string  `json:"measure"`
	Samples int     `json:"samples"` // succeeded
	Failed  int     `json:"failed"`
	Error   string  `json:"error,omitempty"` // the first failure
	P50us   float64 `json:"p50_us"`
	P95us   float64 `json:"p95_us"`
	P99us   float64 `json:"p99_us"`
	MaxUs   float64 `json:"max_us"`
	// MedianMin and MedianMax spread the rounds' medians.
	MedianMin float64 `json:"round_median_min_us"`
	MedianMax float64 `json:"round_median_max_us"`
}

// Broken reports whether the config broke the measurement: no sample
// succeeded.
func (r ServerRow) Broken() bool { return r.Samples == 0 }

// ServerPacketRow is the per-packet cost of one config for one traffic.
type ServerPacketRow struct {
	Config      string  `json:"config"`
	Traffic     string  `json:"traffic"`
	NsPerPacket float64 `json:"ns_per_packet"`
	NsMin       float64 `json:"ns_per_packet_min"`
	NsMax       float64 `json:"ns_per_packet_max"`
	OverheadNs  float64 `json:"overhead_ns"` // over conntrack alone
	OverheadMin float64 `json:"overhead_min_ns"`
	OverheadMax float64 `json:"overhead_max_ns"`
	Packets     int     `json:"packets"`
}

// ServerResult is what Server measured.
type ServerResult struct {
	Rounds   int           `json:"rounds"`
	Samples  int           `json:"samples_per_round"`
	Timeout  time.Duration `json:"timeout_ns"`
	Allowed  netip.Addr    `json:"allowed_host"`
	Blocked  netip.Addr    `json:"blocked_host"`
	Prefixes [2]int        `json:"policy_prefixes"` // IPv4, IPv6
	Rows     []ServerRow   `json:"measurements"`
	// PacketRounds and Packets are the per-packet part.
	PacketRounds int               `json:"per_packet_rounds"`
	Packets      []ServerPacketRow `json:"per_packet"`
}

// ServerSteps is the number of progress steps Server takes with o.
func ServerSteps(o ServerOptions) int {
	n := len(ServerConfigs) * (o.Rounds + 1)
	if o.PerPacket.Rounds > 0 {
		// and one step per config loaded into its lab (PerPacketLabs)
		n += (len(ServerPacketConfigs)+1)*(o.PerPacket.Rounds+1) + len(ServerPacketConfigs)
	}
	return n
}

// serverPolicy is examples/europe.yaml resolved, with its allow set.
type serverPolicy struct {
	input *plan.Input
	// allow is what the policy lets in: the rule's set and protect.
	allow  *netipx.IPSet
	others *netipx.IPSet // the other countries' addresses
}

func loadServerPolicy(ctx context.Context) (*serverPolicy, error) {
	pol, err := policy.Parse(examples.Europe, "examples/europe.yaml")
	if err != nil {
		return nil, err
	}
	res, err := pol.Resolve(ctx, &source.Loader{})
	if err != nil {
		return nil, fmt.Errorf("resolving examples/europe.yaml: %w", err)
	}
	if len(res.Input.Rules) != 1 || res.Input.Rules[0].Action != plan.AllowOnly {
		return nil, errors.New("examples/europe.yaml: want one allow-only rule")
	}
	allow := prefix.Union(res.Input.Rules[0].Set, res.Input.Protect)
	src := res.Sources[pol.Rules[0].Sources[0]]
	others, err := src.Countries(pol.Rules[0].Countries, true)
	if err != nil {
		return nil, err
	}
	return &serverPolicy{input: res.Input, allow: allow.IPSet(), others: prefix.Subtract(others, allow).IPSet()}, nil
}

// ipfence returns the policy compiled by ipfence, connection-aware or
// with every rule stateless.
func (sp *serverPolicy) ipfence(name string, stateless bool) (Config, error) {
	in := *sp.input
	in.Rules = slices.Clone(in.Rules)
	for i := range in.Rules {
		in.Rules[i].Stateless = stateless
	}
	c, err := apply.Compile(&in, apply.CompileOptions{Backend: plan.NFTables, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return Config{}, fmt.Errorf("compiling examples/europe.yaml: %w", err)
	}
	return Config{Name: name, Program: c.NFT}, nil
}

// plainSet returns the policy as users write it by hand: one interval set
// per family of what it lets in (loopback and link-local added, so that
// the host and IPv6 neighbour discovery keep working), and a rule per
// family dropping the rest; in the raw prerouting chain, before conntrack
// (afterCT false), or at ipfence's position after conntrack behind a
// rule accepting known connections.
func (sp *serverPolicy) plainSet(name string, afterCT bool) Config {
	var b netipx.IPSetBuilder
	b.AddSet(sp.allow)
	for _, p := range []string{"127.0.0.0/8", "::1/128", "fe80::/10"} {
		b.AddPrefix(netip.MustParsePrefix(p))
	}
	set, _ := b.IPSet()
	var v4, v6 []string
	for _, p := range set.Prefixes() {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	prio, head := "raw", ""
	if afterCT {
		prio, head = "-150", "ct state established,related accept\n"
	}
	script := "table inet ipfbench_set {\n" + nftDecl("set", "allow4", "ipv4_addr\nflags interval", v4) +
		nftDecl("set", "allow6", "ipv6_addr\nflags interval", v6) +
		"chain pre {\ntype filter hook prerouting priority " + prio + "; policy accept;\n" + head +
		"ip saddr != @allow4 drop\nip6 saddr != @allow6 drop\n}\n}\n"
	return Config{Name: name, Load: func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		if err := runWithFile(lab.FW, script, "nft", "-f"); err != nil {
			return nil, err
		}
		return func() error { return run(lab.FW, "nft", "delete", "table", "inet", "ipfbench_set") }, nil
	}}
}

// Server runs the server scenario: its measurements in a netns.Server of
// its own, its per-packet part in labs of its own, one per config (the
// lab the other scenarios share is not used).
func Server(ctx context.Context, _ *netns.Lab, o ServerOptions, p *Progress) (*ServerResult, error) {
	sp, err := loadServerPolicy(ctx)
	if err != nil {
		return nil, err
	}
	for i := range 2 {
		if !sp.allow.Contains(serverAllowed[i]) || sp.allow.Contains(serverBlocked[i]) {
			return nil, fmt.Errorf("the country data moved: %s is to be in Europe, %s not", serverAllowed[i], serverBlocked[i])
		}
	}
	res := &ServerResult{Rounds: o.Rounds, Samples: o.Samples, Timeout: o.Timeout, Allowed: serverAllowed[0], Blocked: serverBlocked[0]}
	for _, pr := range sp.allow.Prefixes() {
		res.Prefixes[map[bool]int{true: 0, false: 1}[pr.Addr().Is4()]]++
	}
	if err := serverMeasures(ctx, sp, o, p, res); err != nil {
		return nil, err
	}
	if o.PerPacket.Rounds > 0 {
		if err := serverPackets(ctx, sp, o.PerPacket, p, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// serverMeasures runs the three measurements through each config.
func serverMeasures(ctx context.Context, sp *serverPolicy, o ServerOptions, p *Progress, res *ServerResult) (err error) {
	s, err := netns.NewServer(fmt.Sprintf("srv%d", os.Getpid()), serverAllowed, serverBlocked)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	stop, err := serverServices(s)
	if err != nil {
		return fmt.Errorf("starting the services: %w", err)
	}
	defer stop()
	plain := sp.plainSet("nft-interval-set", false)
	ipf, err := sp.ipfence("ipfence", false)
	if err != nil {
		return err
	}
	cfgs := []Config{{Name: "none"}, plain, ipf}
	type key struct{ config, measure string }
	samples := map[key][]time.Duration{}
	medians := map[key][]float64{}
	failed := map[key]int{}
	firstErr := map[key]string{}
	po := PerPacketOptions{Rounds: o.Rounds, Progress: p.Prefixed("server: "),
		WhileLoaded: func(ctx context.Context, config string, round int) error {
			for _, m := range ServerMeasures {
				ds, bad, ferr, err := serverMeasure(ctx, s, m, o)
				if err != nil {
					return err
				}
				k := key{config, m}
				samples[k] = append(samples[k], ds...)
				if len(ds) > 0 {
					medians[k] = append(medians[k], us(Percentile(ds, 50)))
				}
				failed[k] += bad
				if ferr != nil && firstErr[k] == "" {
					firstErr[k] = failure(ferr)
				}
			}
			return nil
		}}
	// Loaders and PerPacket without traffic use only the namespace the
	// rules go into: the server's.
	target := &netns.Lab{Name: "server", FW: s.Srv}
	if _, err := PerPacket(ctx, target, cfgs, nil, po); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	for _, c := range ServerConfigs {
		for _, m := range ServerMeasures {
			k := key{c, m}
			ds := samples[k]
			lo, _, hi := Spread(medians[k])
			res.Rows = append(res.Rows, ServerRow{Config: c, Measure: m, Samples: len(ds), Failed: failed[k], Error: firstErr[k],
				P50us: us(Percentile(ds, 50)), P95us: us(Percentile(ds, 95)), P99us: us(Percentile(ds, 99)), MaxUs: us(Percentile(ds, 100)),
				MedianMin: lo, MedianMax: hi})
		}
	}
	return nil
}

// failure names what went wrong in a few words.
func failure(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

// serverServices starts, until stop: a resolver (UDP echo) and an HTTP
// server (10 KiB for any request, then close) on the blocked host in
// Net, and a TCP echo service on the server.
func serverServices(s *netns.Server) (stop func(), err error) {
	var closers []io.Closer
	stop = func() {
		for _, c := range closers {
			c.Close()
		}
	}
	var dns net.PacketConn
	var web, echo net.Listener
	err = netns.Do(s.Net, func() (err error) {
		if dns, err = net.ListenPacket("udp", netip.AddrPortFrom(s.Blocked[0], serverDNSPort).String()); err != nil {
			return err
		}
		closers = append(closers, dns)
		web, err = net.Listen("tcp", netip.AddrPortFrom(s.Blocked[0], serverHTTPPort).String())
		if err == nil {
			closers = append(closers, web)
		}
		return err
	})
	if err == nil {
		err = netns.Do(s.Srv, func() (err error) {
			echo, err = net.Listen("tcp", netip.AddrPortFrom(s.SrvAddr[0], serverEchoPort).String())
			if err == nil {
				closers = append(closers, echo)
			}
			return err
		})
	}
	if err != nil {
		stop()
		return nil, err
	}
	go netns.ServeUDPEcho(dns)
	page := []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", serverBody, strings.Repeat("x", serverBody)))
	serve := func(ln net.Listener, fn func(net.Conn)) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); fn(c) }()
		}
	}
	go serve(web, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		_, _ = c.Write(page)
	})
	go serve(echo, func(c net.Conn) { _, _ = io.Copy(c, c) })
	return stop, nil
}

// serverMeasure takes o.Samples samples of measure m: the durations of
// those that succeeded, how many failed, the first failure, and an error
// for what is no measurement (a context ended).
func serverMeasure(ctx context.Context, s *netns.Server, m string, o ServerOptions) (ds []time.Duration, failed int, first, err error) {
	var sample func() error
	switch m {
	case "dns":
		to := netip.AddrPortFrom(s.Blocked[0], serverDNSPort)
		query := make([]byte, 40)
		sample = func() error {
			c, err := dialIn(s.Srv, "udp", netip.Addr{}, to, o.Timeout)
			if err != nil {
				return err
			}
			defer c.Close()
			return echoOnce(c, query, o.Timeout)
		}
	case "http-fetch":
		to := netip.AddrPortFrom(s.Blocked[0], serverHTTPPort)
		req := []byte("GET / HTTP/1.1\r\nHost: " + to.Addr().String() + "\r\nConnection: close\r\n\r\n")
		sample = func() error {
			deadline := time.Now().Add(o.Timeout)
			c, err := dialIn(s.Srv, "tcp", netip.Addr{}, to, o.Timeout)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(deadline)
			if _, err := c.Write(req); err != nil {
				return err
			}
			n, err := io.Copy(io.Discard, c)
			if err != nil {
				return err
			}
			if n < serverBody {
				return fmt.Errorf("short response: %d bytes", n)
			}
			return nil
		}
	case "interactive":
		c, err := dialIn(s.Net, "tcp", s.Allowed[0], netip.AddrPortFrom(s.SrvAddr[0], serverEchoPort), o.Timeout)
		if err != nil {
			return nil, o.Samples, err, nil
		}
		defer c.Close()
		msg := []byte("ipfence interactive\n")
		sample = func() error { return echoOnce(c, msg, o.Timeout) }
	default:
		return nil, 0, nil, fmt.Errorf("unknown measure %q", m)
	}
	inRow := 0
	for i := range o.Samples {
		if err := ctx.Err(); err != nil {
			return nil, 0, nil, err
		}
		t0 := time.Now()
		serr := sample()
		if serr == nil {
			ds = append(ds, time.Since(t0))
			inRow = 0
			continue
		}
		if first == nil {
			first = serr
		}
		failed++
		if inRow++; inRow == serverGiveUp {
			failed += o.Samples - i - 1
			break
		}
	}
	return ds, failed, first, nil
}

// dialIn dials from namespace ns (from the local address from, or the
// routed one when from is invalid).
func dialIn(ns, network string, from netip.Addr, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if from.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))
	}
	var c net.Conn
	err := netns.Do(ns, func() (err error) {
		c, err = d.Dial(network, to.String())
		return err
	})
	return c, err
}

// echoOnce writes msg on c and reads as many bytes back within timeout.
func echoOnce(c net.Conn, msg []byte, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, len(msg)))
	return err
}

// serverConntrack is the table that has conntrack run in the per-packet
// part's firewall namespace for every config, the baseline included: a
// ct rule in an output chain (which the measured packets never pass)
// registers conntrack's hooks for the whole namespace.
const serverConntrack = "table inet ipfbench_ct {\nchain out {\ntype filter hook output priority 0; policy accept;\nct state invalid counter\n}\n}\n"

// serverPackets runs the per-packet part.
func serverPackets(ctx context.Context, sp *serverPolicy, o PerPacketOptions, p *Progress, res *ServerResult) (err error) {
	v4 := func(s *netipx.IPSet) *netipx.IPSet {
		var b netipx.IPSetBuilder
		b.AddSet(s)
		b.RemovePrefix(netip.MustParsePrefix("::/0"))
		b.RemovePrefix(netip.MustParsePrefix("198.18.0.0/15")) // the lab's own
		out, _ := b.IPSet()
		return out
	}
	r := rand.New(rand.NewPCG(23, 5))
	allow, others := v4(sp.allow), v4(sp.others)
	established := dedupe(pktgen.RandomFromSet(r, allow, 4096))
	fresh := slices.DeleteFunc(dedupe(pktgen.RandomFromSet(r, allow, 4096)), func(a netip.Addr) bool { return slices.Contains(established, a) })
	blocked := pktgen.RandomFromSet(r, others, 4096)
	if len(established) == 0 || len(fresh) == 0 || len(blocked) == 0 {
		return errors.New("server: the policy leaves no IPv4 sources to draw")
	}
	// Each config in a lab of its own, loaded once, each lab with
	// conntrack and the same established connections.
	o.Prepare = func(lab *netns.Lab) error {
		if err := runWithFile(lab.FW, serverConntrack, "nft", "-f"); err != nil {
			return fmt.Errorf("loading conntrack: %w", err)
		}
		if err := lab.DoFW(func() error { return insertReplies(lab.Sink4, established) }); err != nil {
			return fmt.Errorf("inserting conntrack entries: %w", err)
		}
		return nil
	}
	cfgs := []Config{{Name: "conntrack"}}
	for _, name := range ServerPacketConfigs {
		var c Config
		switch name {
		case "ipfence", "ipfence-stateless":
			if c, err = sp.ipfence(name, name == "ipfence-stateless"); err != nil {
				return err
			}
		default:
			c = sp.plainSet(name, name == "nft-interval-set-after-ct")
		}
		cfgs = append(cfgs, c)
	}
	traffic := []Traffic{
		{Name: "established", Srcs: established, Expect: pktgen.ExpectPass},
		{Name: "new-allowed", Srcs: fresh, Expect: pktgen.ExpectPass},
		{Name: "new-blocked", Srcs: blocked, Expect: pktgen.ExpectDrop},
	}
	o.Progress = p.Prefixed("server per packet: ")
	pp, err := PerPacketLabs(ctx, fmt.Sprintf("srvpp%d-", os.Getpid()), cfgs, traffic, o)
	if err != nil {
		return fmt.Errorf("server per packet: %w", err)
	}
	res.PacketRounds = o.Rounds
	for _, c := range pp.Cells {
		res.Packets = append(res.Packets, ServerPacketRow{Config: c.Config, Traffic: c.Traffic, NsPerPacket: c.NsPerPacket, NsMin: c.NsMin, NsMax: c.NsMax,
			OverheadNs: c.OverheadNs, OverheadMin: c.OverheadMin, OverheadMax: c.OverheadMax, Packets: c.Packets})
	}
	return nil
}

// insertReplies inserts, in the current namespace, a UDP conntrack entry
// per source whose reply direction is pktgen's measured packet from that
// source to sink: such packets are then of an established connection
// (as if the host had sent to each source first).
func insertReplies(sink netip.Addr, srcs []netip.Addr) error {
	for _, src := range srcs {
		f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 3600,
			Forward: netlink.IPTuple{SrcIP: sink.AsSlice(), DstIP: src.AsSlice(), Protocol: unix.IPPROTO_UDP, SrcPort: pktgen.MeasureDstPort, DstPort: pktgen.CheckSrcPort},
			Reverse: netlink.IPTuple{SrcIP: src.AsSlice(), DstIP: sink.AsSlice(), Protocol: unix.IPPROTO_UDP, SrcPort: pktgen.CheckSrcPort, DstPort: pktgen.MeasureDstPort}}
		if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, f); err != nil {
			return fmt.Errorf("entry for %s: %w", src, err)
		}
	}
	return nil
}

func dedupe(as []netip.Addr) []netip.Addr {
	s := slices.Clone(as)
	slices.SortFunc(s, netip.Addr.Compare)
	return slices.Compact(s)
}

// CSV renders the measurements and the per-packet rows.
func (r *ServerResult) CSV() string {
	var b strings.Builder
	b.WriteString("part,config,measure_or_traffic,samples_or_packets,failed,error,p50_us,p95_us,p99_us,max_us,round_median_min_us,round_median_max_us,ns_per_packet,ns_per_packet_min,ns_per_packet_max,overhead_ns,overhead_min_ns,overhead_max_ns\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "measure,%s,%s,%d,%d,%s,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,,,,,,\n", x.Config, x.Measure, x.Samples, x.Failed, csvQuote(x.Error),
			x.P50us, x.P95us, x.P99us, x.MaxUs, x.MedianMin, x.MedianMax)
	}
	for _, x := range r.Packets {
		fmt.Fprintf(&b, "per_packet,%s,%s,%d,,,,,,,,,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f\n", x.Config, x.Traffic, x.Packets,
			x.NsPerPacket, x.NsMin, x.NsMax, x.OverheadNs, x.OverheadMin, x.OverheadMax)
	}
	return b.String()
}

// Row returns the measurement m through config c.
func (r *ServerResult) Row(c, m string) (ServerRow, bool) {
	for _, x := range r.Rows {
		if x.Config == c && x.Measure == m {
			return x, true
		}
	}
	return ServerRow{}, false
}

// Packet returns the per-packet row of config c and traffic tr.
func (r *ServerResult) Packet(c, tr string) (ServerPacketRow, bool) {
	for _, x := range r.Packets {
		if x.Config == c && x.Traffic == tr {
			return x, true
		}
	}
	return ServerPacketRow{}, false
}

// serverCell is a measurement's cell: its percentiles, or how it broke.
func serverCell(x ServerRow) string {
	if x.Broken() {
		return fmt.Sprintf("**fails**: %s (%d of %d)", x.Error, x.Failed, x.Failed)
	}
	s := fmt.Sprintf("%.0f / %.0f / %.0f", x.P50us, x.P95us, x.P99us)
	if x.Failed > 0 {
		s += fmt.Sprintf(", %d failed (%s)", x.Failed, x.Error)
	}
	return s
}

// Markdown renders the measurements (config × measure) and the
// per-packet table with the targets.
func (r *ServerResult) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## server: allow only Europe on a real server\n\nexamples/europe.yaml (%d IPv4 and %d IPv6 prefixes with protect). The server's own DNS query to a resolver at %s (blocked country), its HTTP fetch of 10 KiB from there, and an interactive request/echo from %s (allowed country) on an open connection; µs p50 / p95 / p99 over %d interleaved rounds of %d samples (a sample failing after %v, a measurement given up for the round after %d failures in a row):\n\n",
		r.Prefixes[0], r.Prefixes[1], r.Blocked, r.Allowed, r.Rounds, r.Samples, r.Timeout, serverGiveUp)
	var out [][]string
	for _, c := range ordered(r.Rows, func(x ServerRow) string { return x.Config }) {
		line := []string{c}
		for _, m := range ServerMeasures {
			x, _ := r.Row(c, m)
			line = append(line, serverCell(x))
		}
		out = append(out, line)
	}
	table(&b, []string{"config", "DNS round trip (server → blocked)", "HTTP fetch 10 KiB (server → blocked)", "interactive round trip (allowed → server)"}, out)
	if len(r.Packets) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "\n### Per packet, with conntrack\n\nns of CPU per packet (IPv4), median of %d interleaved rounds (min–max). Conntrack runs in the firewall namespace for every config; the baseline is conntrack alone. established: replies of connections conntrack knows; new-allowed: new flows from sources the policy lets in; new-blocked: new flows from outside Europe, dropped (cost in all, not over the baseline).\n\n", r.PacketRounds)
	out = nil
	for _, c := range ordered(r.Packets, func(x ServerPacketRow) string { return x.Config }) {
		line := []string{c}
		for _, tr := range ServerTraffic {
			x, _ := r.Packet(c, tr)
			if tr == "new-blocked" {
				line = append(line, spreadCell(x.NsPerPacket, x.NsMin, x.NsMax))
			} else {
				line = append(line, spreadCell(x.OverheadNs, x.OverheadMin, x.OverheadMax))
			}
		}
		out = append(out, line)
	}
	table(&b, []string{"config", "established: ns over conntrack", "new-allowed: ns over conntrack", "new-blocked: ns in all"}, out)
	est, _ := r.Packet("ipfence", "established")
	ipf, _ := r.Packet("ipfence", "new-allowed")
	set, _ := r.Packet("nft-interval-set-after-ct", "new-allowed")
	fmt.Fprintf(&b, "\nTargets: established packets through ipfence %.0f ns over conntrack alone (target ≤ 100 ns: %s); new connections from allowed sources, ipfence over the plain set after conntrack: %.0f / %.0f ns = %.2f (target ≤ 0.5: %s).\n",
		est.OverheadNs, met(est.OverheadNs <= 100), ipf.OverheadNs, set.OverheadNs, ratio(ipf.OverheadNs, set.OverheadNs), met(set.OverheadNs > 0 && ratio(ipf.OverheadNs, set.OverheadNs) <= 0.5))
	return b.String()
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// Figures draws, per measurement, p50 / p95 / p99 by config (a config
// that broke the measurement has no bars), and the per-packet costs.
func (r *ServerResult) Figures() map[string]*plot.Figure {
	figs := map[string]*plot.Figure{}
	cfgs := ordered(r.Rows, func(x ServerRow) string { return x.Config })
	for _, m := range ServerMeasures {
		fig := &plot.Figure{Title: "server: " + m + " (no bar: it fails)", YLabel: "µs", LogY: true, Categories: cfgs}
		for _, pc := range []struct {
			name string
			v    func(ServerRow) float64
		}{{"p50", func(x ServerRow) float64 { return x.P50us }}, {"p95", func(x ServerRow) float64 { return x.P95us }}, {"p99", func(x ServerRow) float64 { return x.P99us }}} {
			s := plot.Series{Name: pc.name}
			for i, c := range cfgs {
				if x, ok := r.Row(c, m); ok && !x.Broken() {
					v := pc.v(x)
					s.Points = append(s.Points, plot.Point{X: float64(i), Min: v, Median: v, Max: v})
				}
			}
			fig.Series = append(fig.Series, s)
		}
		figs["server-"+m] = fig
	}
	if len(r.Packets) > 0 {
		pcfgs := slices.DeleteFunc(ordered(r.Packets, func(x ServerPacketRow) string { return x.Config }), func(c string) bool { return c == "conntrack" })
		fig := &plot.Figure{Title: "server: per packet with conntrack", YLabel: "ns (over conntrack; blocked: in all)", Categories: pcfgs}
		for _, tr := range ServerTraffic {
			s := plot.Series{Name: tr}
			for i, c := range pcfgs {
				x, _ := r.Packet(c, tr)
				pt := plot.Point{X: float64(i), Min: x.OverheadMin, Median: x.OverheadNs, Max: x.OverheadMax}
				if tr == "new-blocked" {
					pt = plot.Point{X: float64(i), Min: x.NsMin, Median: x.NsPerPacket, Max: x.NsMax}
				}
				s.Points = append(s.Points, pt)
			}
			fig.Series = append(fig.Series, s)
		}
		figs["server-per-packet"] = fig
	}
	return figs
}
