package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
)

// lapi is a CrowdSec Local API of a test's own (Debian's crowdsec, agent
// off, no Central API): its own configuration, database and port.
type lapi struct {
	t      *testing.T
	dir    string
	config string
	url    string
	cmd    *exec.Cmd
}

func newLAPI(t *testing.T) *lapi {
	t.Helper()
	netnstest.Kernel(t, "crowdsec", "cscli")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	l := &lapi{t: t, dir: t.TempDir(), url: "http://" + addr + "/"}
	l.config = filepath.Join(l.dir, "config.yaml")
	write(t, l.dir, "config.yaml", fmt.Sprintf(`common:
  daemonize: false
  log_media: file
  log_dir: %[1]s
  log_level: info
  working_dir: .
config_paths:
  config_dir: %[1]s/
  data_dir: %[1]s/
  simulation_path: /etc/crowdsec/simulation.yaml
  hub_dir: /var/lib/crowdsec/hub/
  index_path: /var/lib/crowdsec/hub/.index.json
  notification_dir: %[1]s/notifications/
  plugin_dir: /usr/lib/crowdsec/plugins/
db_config:
  type: sqlite
  db_path: %[1]s/crowdsec.db
  use_wal: true
api:
  client:
    credentials_path: %[1]s/local_api_credentials.yaml
  server:
    listen_uri: %[2]s
    profiles_path: /etc/crowdsec/profiles.yaml
    trusted_ips: [127.0.0.1]
prometheus:
  enabled: false
`, l.dir, addr))
	l.cscli("machines", "add", "ipfence-test", "--auto", "--force", "-f", filepath.Join(l.dir, "local_api_credentials.yaml"))
	t.Cleanup(l.stop)
	return l
}

// cscli runs cscli on the test's Local API.
func (l *lapi) cscli(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("cscli", append([]string{"-c", l.config, "--error"}, args...)...).CombinedOutput(); err != nil {
		l.t.Fatalf("cscli %v: %v\n%s", args, err, out)
	}
}

func (l *lapi) start() {
	l.t.Helper()
	l.cmd = exec.Command("crowdsec", "-c", l.config, "-no-cs", "-no-capi")
	if err := l.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	eventually(l.t, 20*time.Second, "the Local API listens", func() error {
		c, err := net.Dial("tcp", l.url[len("http://"):len(l.url)-1])
		if err == nil {
			c.Close()
		}
		return err
	})
}

func (l *lapi) stop() {
	if l.cmd != nil {
		_ = l.cmd.Process.Signal(syscall.SIGTERM)
		_ = l.cmd.Wait()
		l.cmd = nil
	}
}

// TestCrowdSec runs a real CrowdSec Local API and an ipfence daemon with a
// crowdsec source on it: decisions on an address, a range and an IPv6
// address made with cscli reach the kernel (packets dropped in the lab)
// within a few pulls; a decision on a protected address is refused
// without holding back the others; a decision shorter than an operator's
// ban leaves that ban, and its deletion too; deletions lift the bans; with
// the Local API down the bans stay and the daemon retries, and picks up
// new decisions when it is back; and decisions deleted while the daemon
// was down are lifted when it starts.
func TestCrowdSec(t *testing.T) {
	t.Parallel()
	lab := netnstest.New(t)
	exe := buildIpfence(t)
	l := newLAPI(t)
	const key = "ipfence-test-key-0123456789abcdef"
	l.cscli("bouncers", "add", "ipfence", "-k", key)
	l.start()

	dir := t.TempDir()
	write(t, dir, "crowdsec.key", key+"\n")
	write(t, dir, "p.yaml", "protect: [198.18.0.0/15, 2001:2::/48, 198.51.100.200]\n"+
		"sources:\n  crowdsec: {format: crowdsec, url: \""+l.url+"\", api_key_file: crowdsec.key, refresh: 1s}\n"+
		"rules:\n  - {name: docs, action: drop, match: {prefixes: [192.0.2.0/24]}}\n")
	socket := filepath.Join(dir, "api.sock")
	var d *exec.Cmd
	startD := func() {
		d = startDaemon(t, exe, socket, "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW,
			"--state", filepath.Join(dir, "state"), "--metrics", "", "--tick", "1s")
	}
	stopD := func() {
		if d != nil {
			_ = d.Process.Signal(syscall.SIGTERM)
			_ = d.Wait()
			d = nil
		}
	}
	startD()
	t.Cleanup(stopD)
	cl := api.NewClient(socket)
	defer cl.Close()

	srcs := []netip.Addr{
		netip.MustParseAddr("198.51.100.7"),   // 0: decision on the address
		netip.MustParseAddr("203.0.113.9"),    // 1: inside a decided range
		netip.MustParseAddr("2001:db8:ff::7"), // 2: decision on an IPv6 address
		netip.MustParseAddr("198.51.100.8"),   // 3: an operator's ban, and a shorter decision
		netip.MustParseAddr("198.51.100.200"), // 4: protected, decided
		netip.MustParseAddr("198.51.100.9"),   // 5: decided while the Local API was down
	}
	expect := func(when string, pass ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 80, pass, when)
	}
	banned := func(origin string, ps ...string) func() error {
		return func() error {
			m := listBans(t, cl)
			for _, s := range ps {
				if b, ok := m[netip.MustParsePrefix(s)]; !ok || b.Origin != origin {
					return fmt.Errorf("%s: %+v", s, b)
				}
			}
			return nil
		}
	}
	lifted := func(ps ...string) func() error {
		return func() error {
			m := listBans(t, cl)
			for _, s := range ps {
				if b, ok := m[netip.MustParsePrefix(s)]; ok {
					return fmt.Errorf("%s is still banned: %+v", s, b)
				}
			}
			return nil
		}
	}
	expect("before", true, true, true, true, true, true)
	if _, err := cl.Ban(context.Background(), api.BanRequest{Prefix: "198.51.100.8", TTL: "1h", Reason: "operator", Origin: "cli"}); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	l.cscli("decisions", "add", "--ip", "198.51.100.7", "--duration", "1h", "--reason", "ssh-bf")
	eventually(t, 10*time.Second, "the first decision reaches the kernel", banned("crowdsec", "198.51.100.7/32"))
	t.Logf("cscli decisions add → ban in force: %v (pulls every 1s)", time.Since(t0).Round(time.Millisecond))
	// The decisions that must not ban come first: once the last ones are
	// in force, the pull that brought them had these too.
	l.cscli("decisions", "add", "--ip", "198.51.100.8", "--duration", "10m")
	l.cscli("decisions", "add", "--ip", "198.51.100.200", "--duration", "1h")
	l.cscli("decisions", "add", "--range", "203.0.113.0/24", "--duration", "2h")
	l.cscli("decisions", "add", "--ip", "2001:db8:ff::7", "--duration", "1h")
	eventually(t, 10*time.Second, "the decisions reach the kernel", banned("crowdsec", "203.0.113.0/24", "2001:db8:ff::7/128"))
	m := listBans(t, cl)
	if b := m[netip.MustParsePrefix("198.51.100.7/32")]; b.Reason == "" || b.Expires.Sub(t0) > time.Hour+5*time.Second || b.Expires.Sub(t0) < time.Hour-time.Minute {
		t.Errorf("198.51.100.7: %+v, want the decision's scenario and an expiry an hour from now", b)
	}
	if b := m[netip.MustParsePrefix("198.51.100.8/32")]; b.Origin != "cli" {
		t.Errorf("a shorter decision replaced the operator's ban: %+v", b)
	}
	if _, ok := m[netip.MustParsePrefix("198.51.100.200/32")]; ok {
		t.Error("a protected address is banned")
	}
	expect("decided", false, false, false, false, true, true)

	l.cscli("decisions", "delete", "--ip", "198.51.100.8")
	l.cscli("decisions", "delete", "--ip", "198.51.100.7")
	l.cscli("decisions", "delete", "--range", "203.0.113.0/24")
	eventually(t, 10*time.Second, "deletions lift the bans", lifted("198.51.100.7/32", "203.0.113.0/24"))
	if b, ok := listBans(t, cl)[netip.MustParsePrefix("198.51.100.8/32")]; !ok || b.Origin != "cli" {
		t.Errorf("deleting the decision lifted the operator's ban: %+v", b)
	}
	expect("deleted", true, true, false, false, true, true)

	// The Local API goes down: the bans stay, the daemon says so and
	// retries; when it is back, new decisions come through.
	l.stop()
	eventually(t, 10*time.Second, "the status shows the failing source", func() error {
		st, err := cl.Status(context.Background())
		if err != nil {
			return err
		}
		for _, s := range st.Sources {
			if s.Name == "crowdsec" && s.Kind == "crowdsec" && s.LastError != "" {
				if s.PrefixesV4 != 0 || s.PrefixesV6 != 1 { // 2001:db8:ff::7; the protected address was refused
					t.Errorf("the source holds %d+%d bans, want 0+1", s.PrefixesV4, s.PrefixesV6)
				}
				return nil
			}
		}
		return fmt.Errorf("sources %+v", st.Sources)
	})
	if out, err := exec.Command(exe, "status", "--netns", lab.FW, "--state", filepath.Join(dir, "state"), "--socket", socket).CombinedOutput(); err != nil {
		t.Errorf("ipfence status: %v\n%s", err, out)
	} else if testing.Verbose() {
		t.Logf("ipfence status:\n%s", out)
	}
	expect("Local API down", true, true, false, false, true, true)
	l.start()
	l.cscli("decisions", "add", "--ip", "198.51.100.9", "--duration", "1h")
	eventually(t, 15*time.Second, "a decision after the Local API is back", banned("crowdsec", "198.51.100.9/32"))

	// Decisions deleted while the daemon is down are lifted when it starts.
	stopD()
	l.cscli("decisions", "delete", "--ip", "2001:db8:ff::7")
	startD()
	eventually(t, 10*time.Second, "the restarted daemon lifts what was deleted meanwhile", lifted("2001:db8:ff::7/128"))
	if err := banned("crowdsec", "198.51.100.9/32")(); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	expect("restarted", true, true, true, false, true, false)
	if t.Failed() {
		if b, err := os.ReadFile(filepath.Join(l.dir, "crowdsec.log")); err == nil {
			t.Logf("crowdsec.log:\n%s", b)
		}
	}
}
