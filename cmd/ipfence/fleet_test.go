package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
)

// fleetFeed is revision k's feed: random /24s and addresses of
// 198.18.0.0/15 and /64s of 2001:2::/48, a third of each, never the lab's
// own subnets. Each revision replaces a twentieth of the lines of the one
// before.
func fleetFeed(k int) string {
	base := rand.New(rand.NewPCG(0, 7))
	lines := make([]string, 900)
	pick := func(r *rand.Rand, i int) string {
		switch i % 3 {
		case 0:
			return fmt.Sprintf("198.%d.%d.0/24", 18+r.IntN(2), 1+r.IntN(255))
		case 1:
			return fmt.Sprintf("198.%d.%d.%d", 18+r.IntN(2), 1+r.IntN(255), 1+r.IntN(254))
		}
		return fmt.Sprintf("2001:2:0:%x::/64", 1+r.IntN(255))
	}
	for i := range lines {
		lines[i] = pick(base, i)
	}
	for rev := 1; rev <= k; rev++ {
		r := rand.New(rand.NewPCG(uint64(rev), 7))
		for range len(lines) / 20 {
			i := r.IntN(len(lines))
			lines[i] = pick(r, i)
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// fleetSources are sources in the feeds' ranges.
func fleetSources() []netip.Addr {
	r := rand.New(rand.NewPCG(3, 3))
	var out []netip.Addr
	for range 250 {
		out = append(out, netip.AddrFrom4([4]byte{198, byte(18 + r.IntN(2)), byte(1 + r.IntN(255)), byte(1 + r.IntN(254))}),
			netip.AddrFrom16([16]byte{0x20, 0x01, 0, 2, 0, 0, 0, byte(1 + r.IntN(255)), 15: byte(1 + r.IntN(254))}))
	}
	return out
}

// fleetRig is a server, a key pair and agents, each in its own lab.
type fleetRig struct {
	t       testing.TB
	exe     string
	dir     string
	url     string
	listen  string
	server  *exec.Cmd
	labs    []*netns.Lab
	agents  []*exec.Cmd
	policy  string
	srcs    []netip.Addr
	feed    func(k int) string // revision k's feed
	jitter  string             // the agents' --jitter
	keyPath string
	auth    string // the folder `server init` wrote
	// agentArgs are more flags for agent i.
	agentArgs map[int][]string
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs exe with args, its output in dir/name.log, killed at the
// end of the test.
func (r *fleetRig) start(name string, args ...string) *exec.Cmd {
	r.t.Helper()
	logf, err := os.OpenFile(filepath.Join(r.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(r.exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if r.t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			r.t.Logf("%s's log:\n%s", name, out)
		}
	})
	return cmd
}

func (r *fleetRig) startServer() {
	r.server = r.start("server", "server", "--data", filepath.Join(r.dir, "js"), "--listen", r.listen,
		"--config", filepath.Join(r.auth, broker.ConfFile), "--creds", filepath.Join(r.auth, broker.ServerCreds))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", r.listen); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatal("ipfence server does not listen")
}

func (r *fleetRig) startAgent(i int) {
	args := append([]string{"agent", "--pubkey", filepath.Join(r.dir, "keys", "ipfence.pub"),
		"--group", "web", "--name", fmt.Sprint("host", i), "--netns", r.labs[i].FW, "--state", filepath.Join(r.dir, fmt.Sprint("state", i)),
		"--socket", r.socket(i), "--metrics", "", "--heartbeat", "1s", "--poll", "2s", "--jitter", r.jitter}, r.nats(fmt.Sprint("host", i))...)
	r.agents[i] = r.start(fmt.Sprint("agent", i), append(args, r.agentArgs[i]...)...)
}

// nats are the flags that reach the server as user (publisher, bans,
// or an agent's host name), with its credentials.
func (r *fleetRig) nats(user string) []string {
	return []string{"--nats", r.url, "--nats-ca", filepath.Join(r.auth, broker.CAFile), "--nats-creds", filepath.Join(r.auth, user+".creds")}
}

// rawNATS is a plain connection as the publisher's NATS user: someone
// who may write anything to NATS but has no signing key.
func (r *fleetRig) rawNATS() *nats.Conn {
	r.t.Helper()
	creds := filepath.Join(r.auth, broker.PublisherCreds)
	upub, err := broker.CredsUser(creds)
	if err != nil {
		r.t.Fatal(err)
	}
	nc, err := nats.Connect(r.url, nats.UserCredentials(creds), nats.RootCAs(filepath.Join(r.auth, broker.CAFile)), nats.CustomInboxPrefix(broker.Inbox(upub)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

func (r *fleetRig) socket(i int) string { return filepath.Join(r.dir, fmt.Sprint("agent", i, ".sock")) }

func (r *fleetRig) kill(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_, _ = cmd.Process.Wait()
}

// publish writes revision k's feed and publishes the policy (extra:
// more flags).
func (r *fleetRig) publish(k int, extra ...string) *fleet.Pointer {
	r.t.Helper()
	write(r.t, r.dir, "feed.txt", r.feed(k))
	args := append([]string{"--json", "publish", "--key", r.keyPath, "--policy", r.policy, "--group", "web", "--state", filepath.Join(r.dir, "pubstate")}, r.nats("publisher")...)
	out, err := run(r.t, append(args, extra...)...)
	if err != nil {
		r.t.Fatalf("publish %d: %v", k, err)
	}
	var p fleet.Pointer
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		r.t.Fatal(err)
	}
	return &p
}

// published publishes revision k and returns the plan the agents
// should enforce.
func (r *fleetRig) published(k int, extra ...string) (*fleet.Pointer, *plan.Plan) {
	p := r.publish(k, extra...)
	return p, compileFor(r.t, r.policy, filepath.Join(r.dir, "pubstate")).Plan
}

// report is `ipfence fleet status --json`: the drift report. A read
// can time out while twenty agents load their first revision on two
// vCPUs.
func (r *fleetRig) report() (fleet.Report, error) {
	out, err := run(r.t, append([]string{"--json", "fleet", "status", "--silent-after", "4s"}, r.nats("publisher")...)...)
	var rep fleet.Report
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		return rep, fmt.Errorf("fleet status: %v, %v\n%s", err, jerr, out)
	}
	return rep, nil
}

// waitFor polls the drift report until ok says yes (at most 60s; a
// status that cannot be read is asked again meanwhile).
func (r *fleetRig) waitFor(what string, ok func(fleet.Report) bool) fleet.Report {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rep, err := r.report()
		if err == nil && ok(rep) {
			return rep
		}
		if time.Now().After(deadline) {
			js, _ := json.MarshalIndent(rep, "", "  ")
			r.t.Fatalf("waiting for %s: %v %s", what, err, js)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLatest waits until every agent runs what pointer seq gives it.
func (r *fleetRig) waitLatest(seq uint64) fleet.Report {
	r.t.Helper()
	return r.waitFor(fmt.Sprintf("every host at revision %d", seq), func(rep fleet.Report) bool {
		p := rep.Pointers["web"]
		return p != nil && p.Seq == seq && rep.Counts[fleet.Latest] == len(r.labs) && len(rep.Hosts) == len(r.labs)
	})
}

// mismatches counts the sources whose verdict in lab differs from p's.
func (r *fleetRig) mismatches(lab *netns.Lab, p *plan.Plan) int {
	r.t.Helper()
	passed := pktgentest.Send(r.t, lab, r.srcs, 9999)
	return len(pktgentest.Differ(passed, pktgentest.Passes(pktgentest.Model(p, r.srcs, 9999))))
}

// dropped reports whether a packet from a is dropped in lab.
func dropped(t testing.TB, lab *netns.Lab, a netip.Addr) bool {
	t.Helper()
	return !pktgentest.Send(t, lab, []netip.Addr{a}, 9999)[0]
}

// waitDropped waits until a packet from a is dropped in every lab and
// returns how long that took from t0.
func (r *fleetRig) waitDropped(a netip.Addr, t0 time.Time, labs ...*netns.Lab) time.Duration {
	r.t.Helper()
	var took time.Duration
	for _, lab := range labs {
		for !dropped(r.t, lab, a) {
			if time.Since(t0) > 20*time.Second {
				r.t.Fatalf("%s still passes %s 20s after the fleet ban", lab.FW, a)
			}
			time.Sleep(20 * time.Millisecond)
		}
		took = max(took, time.Since(t0))
	}
	return took
}

// refused waits until every host reports a failure that mentions
// reason, and checks that every lab still holds p.
func (r *fleetRig) refused(what, reason string, p *plan.Plan) {
	r.t.Helper()
	rep := r.waitFor("every host refusing "+what, func(rep fleet.Report) bool {
		for _, h := range rep.Hosts {
			if h.State != fleet.Failing || !strings.Contains(h.LastError, reason) {
				return false
			}
		}
		return len(rep.Hosts) == len(r.labs)
	})
	r.t.Logf("%s: %s", what, rep.Hosts[0].LastError)
	for _, lab := range r.labs {
		if n := r.mismatches(lab, p); n > 0 {
			r.t.Fatalf("%s: %d verdicts differ from the revision in force after %s", lab.FW, n, what)
		}
	}
}

// rawKV writes a group's pointer as it is, as someone with write access
// to NATS but not the key could.
func (r *fleetRig) rawKV() (jetstream.KeyValue, jetstream.ObjectStore) {
	t := r.t
	t.Helper()
	js, _ := jetstream.New(r.rawNATS())
	kv, err := js.KeyValue(context.Background(), broker.PolicyBucket)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(context.Background(), broker.BundleStore)
	if err != nil {
		t.Fatal(err)
	}
	return kv, obs
}

// newFleetRig makes n labs, a key pair, a policy of one drop rule on
// feed.txt and starts the server; no agent yet.
func newFleetRig(t testing.TB, n int, feed func(int) string, jitter string) *fleetRig {
	netnstest.Kernel(t, "ip", "nft")
	r := &fleetRig{t: t, exe: buildIpfence(t), dir: t.TempDir(), feed: feed, jitter: jitter}
	r.listen = freeAddr(t)
	r.url = "tls://" + r.listen
	for range n {
		r.labs = append(r.labs, netnstest.New(t))
	}
	r.agents = make([]*exec.Cmd, n)
	if _, err := run(t, "keygen", "--out", filepath.Join(r.dir, "keys")); err != nil {
		t.Fatal(err)
	}
	r.keyPath = filepath.Join(r.dir, "keys", "ipfence.key")
	// The server as a fleet runs it: TLS, and a user per role.
	r.auth = filepath.Join(r.dir, "nats")
	if _, err := run(t, "server", "init", "--dir", r.auth, "--host", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := run(t, "server", "creds", "--dir", r.auth, "--role", "agent", "--name", fmt.Sprint("host", i), "--out", filepath.Join(r.auth, fmt.Sprint("host", i, ".creds"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := run(t, "server", "creds", "--dir", r.auth, "--role", "bans", "--name", "bans", "--out", filepath.Join(r.auth, "bans.creds")); err != nil {
		t.Fatal(err)
	}
	write(t, r.dir, "policy.yaml", "sources:\n  feed: {format: list, paths: [feed.txt]}\nrules:\n  - {name: feed, action: drop, match: {source: feed}}\n")
	r.policy = filepath.Join(r.dir, "policy.yaml")
	r.startServer()
	return r
}

// TestFleet runs `ipfence server` and four `ipfence agent`s, each
// enforcing in its own lab (three with nftables, the fourth with ipset
// and legacy iptables), and checks with real packets in every lab:
// revisions roll out; a fleet ban drops in every lab within a second or
// so; an agent killed meanwhile catches up with the revision and the
// ban's remaining time; a tampered bundle and a forged pointer are
// refused with the error in the drift report and nothing applied; the
// server stopped mid-rollout leaves every lab on a complete revision;
// rollback and canary go where the pointer says.
func TestFleet(t *testing.T) {
	r := newFleetRig(t, 4, fleetFeed, "300ms")
	r.srcs = fleetSources()
	r.agentArgs = map[int][]string{3: {"--backend", "ipset", "--iptables", "legacy"}}

	// Revision 1 reaches agents started after it; revision 2 reaches them
	// running.
	p1 := r.publish(1)
	for i := range r.labs {
		r.startAgent(i)
	}
	for _, h := range r.waitLatest(p1.Seq).Hosts {
		if want := map[bool]string{true: "ipset", false: "nftables"}[h.Host == "host3"]; h.Backend != want {
			t.Errorf("%s reports backend %q, want %s", h.Host, h.Backend, want)
		}
		// The nftables hosts run the layouts the publisher chose; the
		// ipset host has no use for them, and says so.
		if want := map[bool]string{true: "not replayed: the rule runs in ipset here, which builds its own tables", false: "replayed"}[h.Host == "host3"]; h.Layout != want {
			t.Errorf("%s reports layout %q, want %q", h.Host, h.Layout, want)
		}
	}
	t0 := time.Now()
	p2, plan2 := r.published(2)
	rep := r.waitLatest(p2.Seq)
	// Every host ran revision 1: each fetched only the difference.
	if len(p2.Deltas) != 1 || p2.Deltas[0].Base != p1.Digest {
		t.Fatalf("revision 2's deltas: %+v, want one from revision 1", p2.Deltas)
	}
	for _, h := range rep.Hosts {
		if h.Via != "delta" || h.Fetched != p2.Deltas[0].Size {
			t.Errorf("%s fetched revision 2 as %q, %d bytes; want the %d-byte delta (the bundle is %d)", h.Host, h.Via, h.Fetched, p2.Deltas[0].Size, p2.Size)
		}
	}
	t.Logf("revision 2: publish to all %d agents applied in %v (jitter up to 300ms)", len(r.labs), time.Since(t0).Round(time.Millisecond))
	for _, lab := range r.labs {
		if n := r.mismatches(lab, plan2); n > 0 {
			t.Fatalf("%s: %d verdicts differ from revision 2", lab.FW, n)
		}
	}

	// A fleet ban drops everywhere.
	banned := netip.MustParseAddr("198.18.0.99")
	if dropped(t, r.labs[0], banned) {
		t.Fatal("the address to ban is dropped already")
	}
	t0 = time.Now()
	if _, err := run(t, append([]string{"ban", "--fleet", banned.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("bans")...)...); err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet ban: dropped in all %d labs %v after `ipfence ban --fleet`", len(r.labs), r.waitDropped(banned, t0, r.labs...).Round(time.Millisecond))

	// Host 0 bans the same address itself, for longer (the fleet ban does
	// not shorten it); a fleet unban lifts the fleet's bans only, so host
	// 0 keeps dropping it and host 1 passes it again.
	if _, err := run(t, "ban", banned.String(), "--ttl", "2h", "--origin", "cli", "--socket", r.socket(0), "--netns", r.labs[0].FW,
		"--state", filepath.Join(r.dir, "state0")); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, append([]string{"ban", "--fleet", banned.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("bans")...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, append([]string{"unban", "--fleet", banned.String(), "--key", r.keyPath}, r.nats("bans")...)...); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); dropped(t, r.labs[1], banned); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s drops %s 20s after the fleet unban", r.labs[1].FW, banned)
		}
	}
	time.Sleep(time.Second) // host 0 has had the unban too
	out, err := run(t, "--json", "bans", "--socket", r.socket(0), "--netns", r.labs[0].FW, "--state", filepath.Join(r.dir, "state0"))
	if err != nil {
		t.Fatal(err)
	}
	var own struct{ Bans []ban.Ban }
	if err := json.Unmarshal([]byte(out), &own); err != nil {
		t.Fatalf("bans --json: %v\n%s", err, out)
	}
	if !dropped(t, r.labs[0], banned) || len(own.Bans) != 1 || own.Bans[0].Origin != "cli" {
		t.Errorf("the fleet unban lifted host 0's own ban, or the fleet ban replaced it: %s", out)
	}

	// A fleet allow entry beats host 0's own ban, until it is removed;
	// ban writers may not publish one (an allow opens what every rule
	// and ban closes: publishers only, signed with the policy key).
	if out, err := run(t, append([]string{"allow", "--fleet", banned.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("bans")...)...); err == nil || !strings.Contains(strings.ToLower(out+err.Error()), "permission") {
		t.Errorf("a ban writer's fleet allow entry: %v, want a permissions violation:\n%s", err, out)
	}
	t0 = time.Now()
	if _, err := run(t, append([]string{"allow", "--fleet", banned.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("publisher")...)...); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); dropped(t, r.labs[0], banned); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s drops %s 20s after the fleet allow", r.labs[0].FW, banned)
		}
	}
	t.Logf("fleet allow: passes on host 0, banned there, %v after `ipfence allow --fleet`", time.Since(t0).Round(time.Millisecond))
	// Host 0 allows it itself, for good; the fleet's removal leaves that.
	host0 := []string{"--socket", r.socket(0), "--netns", r.labs[0].FW, "--state", filepath.Join(r.dir, "state0")}
	if _, err := run(t, append([]string{"allow", banned.String()}, host0...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, append([]string{"unallow", "--fleet", banned.String(), "--key", r.keyPath}, r.nats("publisher")...)...); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // host 0 has had the removal
	out, err = run(t, append([]string{"--json", "allows"}, host0...)...)
	if err != nil {
		t.Fatal(err)
	}
	var allows struct{ Allows []ban.Ban }
	if err := json.Unmarshal([]byte(out), &allows); err != nil {
		t.Fatalf("allows --json: %v\n%s", err, out)
	}
	if dropped(t, r.labs[0], banned) || len(allows.Allows) != 1 || allows.Allows[0].Origin != "cli" {
		t.Errorf("the fleet's removal lifted host 0's own allow entry: %s", out)
	}
	if _, err := run(t, append([]string{"unallow", banned.String()}, host0...)...); err != nil {
		t.Fatal(err)
	}
	if !dropped(t, r.labs[0], banned) {
		t.Errorf("%s passes %s with no allow entry left", r.labs[0].FW, banned)
	}

	// Agent 2 is killed; revision 3 and a ban go out while it is away.
	// So does the first fleet ban of banned, lifted since, replayed on its
	// subject (as a holder of ban credentials could): the agent
	// remembers the unban across its restart and ignores it.
	unbannedAt := time.Now()
	time.Sleep(time.Second) // host 2 has had the unban
	r.kill(r.agents[2])
	priv, err := fleet.LoadPrivateKey(r.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := fleet.SignBan(&fleet.Ban{Prefix: netip.PrefixFrom(banned, 32), Created: unbannedAt.Add(-time.Minute), Expires: time.Now().Add(time.Hour)}, priv)
	js, err := jetstream.New(r.rawNATS())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(context.Background(), broker.BanSubject(netip.PrefixFrom(banned, 32)), old); err != nil {
		t.Fatal(err)
	}
	p3, plan3 := r.published(3)
	away := netip.MustParseAddr("2001:2::99")
	banAt := time.Now()
	if _, err := run(t, append([]string{"ban", "--fleet", away.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("bans")...)...); err != nil {
		t.Fatal(err)
	}
	r.waitFor("hosts 0 and 1 at revision 3, host 2 not", func(rep fleet.Report) bool {
		ok := rep.Pointers["web"].Seq == p3.Seq
		for _, h := range rep.Hosts {
			ok = ok && (h.State == fleet.Latest) == (h.Host != "host2")
		}
		return ok
	})
	r.waitDropped(away, banAt, r.labs[0], r.labs[1], r.labs[3])
	if n := r.mismatches(r.labs[2], plan2); n > 0 {
		t.Fatalf("the killed agent's lab: %d verdicts differ from revision 2, which it ran", n)
	}
	time.Sleep(2 * time.Second)
	r.startAgent(2)
	// It ran revision 2 (a difference applied) from its own copy on
	// disk and fetched only the difference to revision 3.
	for _, h := range r.waitLatest(p3.Seq).Hosts {
		if h.Host == "host2" && h.Via != "delta" {
			t.Errorf("host2 fetched revision 3 as %q after its restart: its copy of revision 2 was not read back", h.Via)
		}
	}
	r.waitDropped(away, banAt, r.labs[2])
	if dropped(t, r.labs[2], banned) {
		t.Errorf("%s: the replayed ban of %s, lifted before the agent's restart, was applied", r.labs[2].FW, banned)
	}
	for _, lab := range r.labs {
		if n := r.mismatches(lab, plan3); n > 0 {
			t.Fatalf("%s: %d verdicts differ from revision 3", lab.FW, n)
		}
	}
	// Agent 2's bans: from its daemon, or (were it between restarts)
	// from its own state folder, never the host's.
	out, err = run(t, "--json", "bans", "--socket", r.socket(2), "--netns", r.labs[2].FW, "--state", filepath.Join(r.dir, "state2"))
	if err != nil {
		t.Fatal(err)
	}
	var bans struct{ Bans []ban.Ban }
	if err := json.Unmarshal([]byte(out), &bans); err != nil {
		t.Fatalf("bans --json: %v\n%s", err, out)
	}
	for _, b := range bans.Bans {
		if b.Prefix.Addr() == away {
			if d := b.Expires.Sub(banAt.Add(time.Hour)); d < -2*time.Second || d > 2*time.Second {
				t.Errorf("caught-up ban expires %v, the fleet ban at %v (off by %v): the TTL must be what was left", b.Expires, banAt.Add(time.Hour), d)
			}
			away = netip.Addr{}
		}
	}
	if away.IsValid() {
		t.Errorf("the restarted agent does not list the fleet ban made while it was away: %s", out)
	}

	// A tampered bundle (right pointer, bytes changed in the store) and
	// a forged pointer (another key) are refused; nothing changes.
	kv, obs := r.rawKV()
	ctx := context.Background()
	write(t, r.dir, "feed.txt", fleetFeed(9))
	c9 := compileFor(t, r.policy, filepath.Join(r.dir, "pubstate"))
	good, _ := fleet.NewBundle(c9.res.Input, 0, "policy.yaml", "", time.Now()).Encode()
	write(t, r.dir, "feed.txt", fleetFeed(10))
	c10 := compileFor(t, r.policy, filepath.Join(r.dir, "pubstate"))
	evil, _ := fleet.NewBundle(c10.res.Input, 0, "policy.yaml", "", time.Now()).Encode()
	if _, err := obs.PutBytes(ctx, fleet.Digest(good), evil); err != nil {
		t.Fatal(err)
	}
	tampered, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: p3.Seq + 1, Digest: fleet.Digest(good), Size: int64(len(good)), Created: time.Now()}, priv)
	if _, err := kv.Put(ctx, "group.web", tampered); err != nil {
		t.Fatal(err)
	}
	r.refused("the tampered bundle", "digest", plan3)
	_, other, _ := ed25519.GenerateKey(nil)
	forged, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: p3.Seq + 100, Digest: fleet.Digest(evil), Size: int64(len(evil)), Created: time.Now()}, other)
	if _, err := obs.PutBytes(ctx, fleet.Digest(evil), evil); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "group.web", forged); err != nil {
		t.Fatal(err)
	}
	r.refused("the forged pointer", "signature", plan3)

	// Junk on the bans stream, with headers meant to end or skip the
	// agents' reading, keeps no later ban from any lab.
	junk := nats.NewMsg("ipfence.bans.junk")
	junk.Header.Set("Status", "404")
	junk.Header.Set("Nats-Sequence", "1000000000")
	junk.Data = []byte("junk")
	if _, err := r.rawNATS().RequestMsg(junk, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	later := netip.MustParseAddr("198.18.0.98")
	t0 = time.Now()
	if _, err := run(t, append([]string{"ban", "--fleet", later.String(), "--ttl", "1h", "--key", r.keyPath}, r.nats("bans")...)...); err != nil {
		t.Fatal(err)
	}
	r.waitDropped(later, t0, r.labs...)

	// The publisher goes over the forgery; the server stops right after
	// the next publish: every lab holds revision 4 or 5 whole, and all
	// reach 5 once it is back.
	p4, plan4 := r.published(4)
	if p4.Seq != p3.Seq+2 {
		t.Errorf("revision after the forgery: seq %d, want %d (after the tampered one)", p4.Seq, p3.Seq+2)
	}
	r.waitLatest(p4.Seq)
	p5, plan5 := r.published(5)
	time.Sleep(250 * time.Millisecond) // within the agents' jitter
	r.kill(r.server)
	time.Sleep(time.Second)
	on5 := 0
	for _, lab := range r.labs {
		m4, m5 := r.mismatches(lab, plan4), r.mismatches(lab, plan5)
		if m4 > 0 && m5 > 0 {
			t.Fatalf("%s holds neither revision 4 (%d verdicts differ) nor 5 (%d)", lab.FW, m4, m5)
		}
		if m5 == 0 {
			on5++
		}
	}
	t.Logf("server killed 250ms after publishing: %d of %d labs on the new revision, the others on the previous one", on5, len(r.labs))
	r.startServer()
	r.waitLatest(p5.Seq)

	// Rollback sends everyone back to revision 4's bundle.
	out, err = run(t, append([]string{"--json", "rollback", "--key", r.keyPath, "--group", "web"}, r.nats("publisher")...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rb fleet.Pointer
	_ = json.Unmarshal([]byte(out), &rb)
	if rb.Digest != p4.Digest {
		t.Fatalf("rollback to %s, want revision 4's %s", rb.Digest, p4.Digest)
	}
	r.waitLatest(rb.Seq)
	for _, lab := range r.labs {
		if n := r.mismatches(lab, plan4); n > 0 {
			t.Fatalf("%s: %d verdicts differ from revision 4 after rollback", lab.FW, n)
		}
	}

	// A canary: the hosts the pointer picks run revision 6, the others
	// stay on 4's bundle.
	p6, plan6 := r.published(6, "--canary", "50%")
	r.waitLatest(p6.Seq)
	for i, lab := range r.labs {
		want := plan4
		if p6.For(fmt.Sprint("host", i)).Digest == p6.Digest {
			want = plan6
		}
		if n := r.mismatches(lab, want); n > 0 {
			t.Fatalf("host%d in a 50%% canary: %d verdicts differ", i, n)
		}
	}

	// The ipset host moves to nftables: its agent restarted with the
	// other backend loads the table, then removes the chains and sets.
	r.kill(r.agents[3])
	r.agentArgs[3] = []string{"--backend", "nftables"}
	r.startAgent(3)
	r.waitFor("host3 on nftables", func(rep fleet.Report) bool {
		for _, h := range rep.Hosts {
			if h.Host == "host3" {
				return h.State == fleet.Latest && h.Backend == "nftables" && h.Heartbeat.After(h.Started)
			}
		}
		return false
	})
	for _, argv := range [][]string{{"iptables-legacy-save", "-t", "raw"}, {"ipset", "list", "-n"}} {
		if out, err := netns.Exec(r.labs[3].FW, argv...); err != nil || strings.Contains(string(out), "ipfence") {
			t.Errorf("host3 after moving to nftables: %v: %s %v", argv, out, err)
		}
	}
	want := plan4
	if p6.For("host3").Digest == p6.Digest {
		want = plan6
	}
	if n := r.mismatches(r.labs[3], want); n > 0 {
		t.Fatalf("host3 on nftables: %d verdicts differ", n)
	}
}

// bigFeed is revision k of a 200k-prefix feed (IPv4 /20 to /32 below
// 127.0.0.0, away from the labs' own addresses, and IPv6 /40 to /64): each revision replaces
// 1% of the previous one's prefixes, as a threat feed's hourly update.
func bigFeed(k int) string {
	const n, churn = 200_000, 2_000
	r := rand.New(rand.NewPCG(11, 11))
	pick := func() string {
		if r.IntN(10) == 0 {
			a := [16]byte{0x2a, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}
			return netip.PrefixFrom(netip.AddrFrom16(a), 40+r.IntN(25)).Masked().String()
		}
		a := [4]byte{byte(1 + r.IntN(126)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))} // below loopback
		return netip.PrefixFrom(netip.AddrFrom4(a), 20+r.IntN(13)).Masked().String()
	}
	lines := make([]string, n)
	for i := range lines {
		lines[i] = pick()
	}
	for range k * churn {
		lines[r.IntN(n)] = pick()
	}
	return strings.Join(lines, "\n") + "\n"
}

// BenchmarkFleetRollout measures the time from `ipfence publish` of a
// 200k-prefix policy to every agent having it in its kernel, with
// IPFENCE_FLEET_AGENTS agents (default 20) in their own labs, each with
// the default 2s jitter: the first revision (a full load everywhere)
// and then revisions that change 1% of the prefixes (a difference each).
// Times come from the agents' own apply stamps. Run as root:
//
//	go test ./cmd/ipfence -run '^$' -bench FleetRollout -benchtime 1x
func BenchmarkFleetRollout(b *testing.B) {
	n := 20
	if s := os.Getenv("IPFENCE_FLEET_AGENTS"); s != "" {
		fmt.Sscan(s, &n)
	}
	r := newFleetRig(b, n, bigFeed, "2s")
	// rollout publishes revision k and returns how long the publish took,
	// when the last agent had applied it (from the publish's start), the
	// median agent's own apply time (from seeing the pointer to the
	// kernel's commit, its jitter included) and how the agents loaded it.
	// cpu is the CPU time the agents' processes have used.
	cpu := func() time.Duration {
		var sum time.Duration
		for _, a := range r.agents {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.Process.Pid))
			if err != nil {
				b.Fatal(err)
			}
			f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
			var ut, st int64
			fmt.Sscan(f[11], &ut)
			fmt.Sscan(f[12], &st)
			sum += time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ is 100
		}
		return sum
	}
	var agentCPU []time.Duration
	rollout := func(k int) (publish, all, agent time.Duration, bytes, fetched int64, mode string) {
		c0 := cpu()
		defer func() { agentCPU = append(agentCPU, (cpu()-c0)/time.Duration(n)) }()
		t0 := time.Now()
		p := r.publish(k)
		publish = time.Since(t0)
		rep := r.waitLatest(p.Seq)
		modes := map[string]int{}
		var own, got []int64
		for _, h := range rep.Hosts {
			all = max(all, h.Applied.Sub(t0))
			modes[h.Mode+"/"+h.Via+"/"+h.Layout]++
			own = append(own, h.ApplyMillis)
			got = append(got, h.Fetched)
		}
		slices.Sort(own)
		slices.Sort(got)
		return publish, all, time.Duration(own[len(own)/2]) * time.Millisecond, p.Size, got[len(got)/2], fmt.Sprint(modes)
	}
	p1 := r.publish(0)
	for i := range r.labs {
		r.startAgent(i)
	}
	t0 := time.Now()
	rep := r.waitLatest(p1.Seq)
	var first time.Duration
	for _, h := range rep.Hosts {
		first = max(first, h.Applied.Sub(t0))
	}
	b.Logf("first revision, %d agents starting: all applied %v after start; bundle %d bytes", n, first.Round(time.Millisecond), p1.Size)
	var alls []time.Duration
	var fetches []int64
	for k := 1; k <= 5; k++ {
		pub, all, own, size, fetched, modes := rollout(k)
		alls, fetches = append(alls, all), append(fetches, fetched)
		b.Logf("revision %d (1%% changed): publish %v, all %d applied %v after publish started (median agent %v from pointer to kernel, %v of CPU per agent); bundle %d bytes, median agent fetched %d (1/%.0f); mode/fetch/layout %s",
			k+1, pub.Round(time.Millisecond), n, all.Round(time.Millisecond), own, agentCPU[len(agentCPU)-1], size, fetched, float64(size)/float64(max(fetched, 1)), modes)
	}
	slices.Sort(alls)
	slices.Sort(fetches)
	b.ReportMetric(float64(alls[len(alls)/2].Milliseconds()), "ms-publish-to-all")
	b.ReportMetric(float64(fetches[len(fetches)/2]), "fetched-bytes/agent")
	b.ReportMetric(float64(p1.Size), "bundle-bytes")
	b.ReportMetric(float64(first.Milliseconds()), "ms-first-all")
}
