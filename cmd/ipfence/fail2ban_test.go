package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/daemon/api"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
)

// eventually calls check every 100 ms until it returns nil, and fails the
// test with its last error when that takes longer than within.
func eventually(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFail2ban runs Debian's fail2ban with a jail on a generated auth log
// and the shipped action (dist/fail2ban/ipfence.conf) against an ipfence
// daemon: the offending addresses (IPv4 and IPv6) are banned (their
// packets dropped in the lab), an unban lifts the jail's ban but not an
// operator's longer one, bans outlive a fail2ban restart with neither a
// duplicate nor a loss, and they end when the jail's ban time is up.
func TestFail2ban(t *testing.T) {
	t.Parallel()
	lab := netnstest.New(t, "nft", "fail2ban-server", "fail2ban-client")
	exe := buildIpfence(t)
	dir := t.TempDir()
	write(t, dir, "p.yaml", "protect: [198.18.0.0/15, 2001:2::/48]\nrules:\n  - {name: docs, action: drop, match: {prefixes: [192.0.2.0/24]}}\n")
	socket := filepath.Join(dir, "api.sock")
	d := startDaemon(t, exe, socket, "--policy", filepath.Join(dir, "p.yaml"), "--netns", lab.FW,
		"--state", filepath.Join(dir, "state"), "--metrics", "", "--tick", "1s")
	t.Cleanup(func() { _ = d.Process.Signal(syscall.SIGTERM); _ = d.Wait() })
	cl := api.NewClient(socket)
	defer cl.Close()

	// fail2ban's configuration: Debian's filters, the shipped action, and
	// a jail of our own on our log (no other jail: jail.d is left out).
	conf := filepath.Join(dir, "f2b")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	cp := []string{"-r"}
	for _, f := range []string{"filter.d", "action.d", "fail2ban.conf", "jail.conf", "paths-common.conf", "paths-debian.conf"} {
		cp = append(cp, "/etc/fail2ban/"+f)
	}
	if out, err := exec.Command("cp", append(cp, conf+"/")...).CombinedOutput(); err != nil {
		t.Fatalf("copying fail2ban's configuration: %v\n%s", err, out)
	}
	action, err := os.ReadFile("../../dist/fail2ban/ipfence.conf")
	if err != nil {
		t.Fatal(err)
	}
	write(t, conf, "action.d/ipfence.conf", string(action))
	write(t, conf, "fail2ban.local", fmt.Sprintf("[Definition]\nloglevel = INFO\nlogtarget = %s/fail2ban.log\n"+
		"socket = %s/f2b.sock\npidfile = %s/f2b.pid\ndbfile = %s/f2b.sqlite3\n", dir, dir, dir, dir))
	const jail, bantime = "ipf-ssh", 40 * time.Second
	authLog := filepath.Join(dir, "auth.log")
	write(t, dir, "auth.log", "")
	write(t, conf, "jail.local", fmt.Sprintf("[DEFAULT]\nbackend = polling\n\n[%s]\nenabled = true\nfilter = sshd\n"+
		"logpath = %s\nmaxretry = 3\nfindtime = 10m\nbantime = %d\n"+
		"action = ipfence[ipfence=\"%s\", socket=\"%s\", ipfence_opts=\"--netns %s --state %s\"]\n", jail, authLog, int(bantime.Seconds()), exe, socket,
		lab.FW, filepath.Join(dir, "state")))

	var server *exec.Cmd
	startF2B := func() {
		t.Helper()
		server = exec.Command("fail2ban-server", "-f", "-x", "-c", conf)
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "fail2ban answers", func() error {
			out, err := exec.Command("fail2ban-client", "-c", conf, "status", jail).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	stopF2B := func() {
		t.Helper()
		if out, err := exec.Command("fail2ban-client", "-c", conf, "stop").CombinedOutput(); err != nil {
			t.Fatalf("fail2ban-client stop: %v\n%s", err, out)
		}
		_ = server.Wait()
		server = nil
	}
	t.Cleanup(func() {
		if server != nil {
			_ = server.Process.Kill()
			_ = server.Wait()
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "fail2ban.log")); err == nil {
				t.Logf("fail2ban.log:\n%s", b)
			}
		}
	})
	startF2B()

	attacker4 := netip.MustParseAddr("198.51.100.7")
	attacker6 := netip.MustParseAddr("2001:db8:ff::7")
	operators := netip.MustParseAddr("198.51.100.8") // also banned by an operator, for longer
	bystander := netip.MustParseAddr("198.51.100.9")
	srcs := []netip.Addr{attacker4, attacker6, operators, bystander}
	expect := func(when string, pass ...bool) {
		t.Helper()
		pktgentest.Expect(t, lab, srcs, 22, pass, when)
	}
	bans := func() map[netip.Addr]ban.Ban { // all of them single addresses
		t.Helper()
		m := map[netip.Addr]ban.Ban{}
		for p, b := range listBans(t, cl) {
			m[p.Addr()] = b
		}
		return m
	}
	expect("before", true, true, true, true)
	if _, err := cl.Ban(context.Background(), api.BanRequest{Prefix: operators.String(), TTL: "1h", Origin: "cli", Reason: "operator"}); err != nil {
		t.Fatal(err)
	}

	// sshd's failures, as syslog writes them, three per attacker.
	f, err := os.OpenFile(authLog, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range []netip.Addr{attacker4, attacker6, operators, attacker4, attacker6, operators, attacker4, attacker6, operators, bystander} {
		fmt.Fprintf(f, "%s fw sshd[%d]: Failed password for invalid user admin%d from %s port %d ssh2\n",
			time.Now().Format(time.Stamp), 4000+i, i, a, 50000+i)
	}
	f.Close()
	t0 := time.Now()
	origin := "fail2ban/" + jail
	eventually(t, 15*time.Second, "fail2ban's bans reach ipfence", func() error {
		m := bans()
		for _, a := range []netip.Addr{attacker4, attacker6} {
			if b, ok := m[a]; !ok || b.Origin != origin || b.Reason != jail {
				return fmt.Errorf("%v: %+v", a, b)
			}
		}
		return nil
	})
	t.Logf("failures in the log → fail2ban's bans in force: %v (polling backend)", time.Since(t0).Round(time.Millisecond))
	m := bans()
	if b := m[operators]; b.Origin != "cli" {
		t.Errorf("the jail's ban replaced the operator's longer one: %+v", b)
	}
	if _, ok := m[bystander]; ok {
		t.Errorf("%v failed once and is banned", bystander)
	}
	if b := m[attacker4]; b.Expires.Sub(t0) > bantime+time.Second || b.Expires.Sub(t0) < bantime-5*time.Second {
		t.Errorf("%v expires %v after the log lines, want about the jail's ban time %v", attacker4, b.Expires.Sub(t0), bantime)
	}
	expect("banned", false, false, false, true)

	// The jail's unban of the operator's address leaves the operator's ban.
	if out, err := exec.Command("fail2ban-client", "-c", conf, "set", jail, "unbanip", operators.String()).CombinedOutput(); err != nil {
		t.Fatalf("unbanip: %v\n%s", err, out)
	}
	eventually(t, 10*time.Second, "fail2ban unbans "+operators.String(), func() error {
		if !strings.Contains(readFile(t, filepath.Join(dir, "fail2ban.log")), "Unban "+operators.String()) {
			return errors.New("not in fail2ban's log")
		}
		return nil
	})
	time.Sleep(time.Second) // fail2ban logs the unban before it runs the action
	if b, ok := bans()[operators]; !ok || b.Origin != "cli" {
		t.Errorf("fail2ban's unban lifted the operator's ban: %+v", b)
	}

	// Restart: the bans stay in force while fail2ban is down, and come
	// back from its database once, at the same expiry.
	before := bans()
	stopF2B()
	expect("fail2ban stopped", false, false, false, true)
	startF2B()
	eventually(t, 15*time.Second, "fail2ban restores its bans", func() error {
		out, err := exec.Command("fail2ban-client", "-c", conf, "get", jail, "banned").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, a := range []netip.Addr{attacker4, attacker6} {
			if !strings.Contains(string(out), "'"+a.String()+"'") {
				return fmt.Errorf("%v not in %s", a, out)
			}
		}
		return nil
	})
	after := bans()
	if len(after) != len(before) {
		t.Errorf("%d bans after the restart, %d before", len(after), len(before))
	}
	for _, a := range []netip.Addr{attacker4, attacker6} {
		if d := after[a].Expires.Sub(before[a].Expires); d < -time.Second || d > time.Second {
			t.Errorf("%v: the restart moved the expiry by %v", a, d)
		}
	}
	if n := strings.Count(netnstest.Ruleset(t, lab.FW), attacker4.String()); n != 1 {
		t.Errorf("%v appears %d times in the ruleset, want once", attacker4, n)
	}
	expect("fail2ban restarted", false, false, false, true)

	// The jail's ban time ends: fail2ban unbans, and the packets pass.
	eventually(t, bantime+15*time.Second, "the jail's bans end", func() error {
		m := bans()
		for _, a := range []netip.Addr{attacker4, attacker6} {
			if _, ok := m[a]; ok {
				return fmt.Errorf("%v still banned", a)
			}
		}
		return nil
	})
	if took := time.Since(t0); took < bantime-5*time.Second {
		t.Errorf("the bans ended after %v, before the jail's ban time %v", took, bantime)
	}
	expect("after the ban time", true, true, false, true)
	// The kernel's timeout and fail2ban's unban end the ban at about the
	// same time: fail2ban's must come too.
	eventually(t, 10*time.Second, "the restarted fail2ban unbans", func() error {
		log := readFile(t, filepath.Join(dir, "fail2ban.log"))
		if _, after, _ := strings.Cut(log, "Restore Ban"); !strings.Contains(after, "Unban "+attacker4.String()) {
			return fmt.Errorf("no Unban %v after the restart in fail2ban's log", attacker4)
		}
		return nil
	})
}

// listBans is every ban in force, by prefix, from the daemon's API.
func listBans(t *testing.T, cl *api.Client) map[netip.Prefix]ban.Ban {
	t.Helper()
	l, err := cl.List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[netip.Prefix]ban.Ban{}
	for _, b := range l.Bans {
		m[b.Prefix] = b
	}
	return m
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFail2banActionBanTimes runs the shipped action's actionban, as
// fail2ban would with the tags filled in, for the ban times fail2ban can
// give: negative (for good), fractional (bantime.factor) and longer than
// ipfence's longest (recidive, bantime.increment), which is clamped to
// 366 days with a warning instead of refused.
func TestFail2banActionBanTimes(t *testing.T) {
	lab := netnstest.New(t, "nft", "sh")
	exe := buildIpfence(t)
	state := t.TempDir()
	conf := readFile(t, "../../dist/fail2ban/ipfence.conf")
	_, rest, _ := strings.Cut(conf, "\nactionban = ")
	script, _, _ := strings.Cut(rest, "\n\n")
	now := time.Now().Unix()
	for _, tc := range []struct {
		bantime, ip, want, warn string
	}{
		{"-1", "198.51.100.1", "for good", ""},
		{"604800.5", "198.51.100.2", "for (168h0m|167h59m)", ""}, // less a second or two since <time>
		{"63072000", "198.51.100.3", "for (8784h0m|8783h59m)", "longer than ipfence's longest"},
	} {
		s := strings.NewReplacer("<bantime>", tc.bantime, "<ip>", tc.ip, "<time>", fmt.Sprint(now), "<name>", "recidive",
			"<ipfence>", exe, "<socket>", "", "<ipfence_opts>", "--netns "+lab.FW+" --state "+state).Replace(script)
		var stderr bytes.Buffer
		cmd := exec.Command("sh", "-c", s)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || !regexp.MustCompile("banned "+regexp.QuoteMeta(tc.ip)+"/32 "+tc.want).Match(out) || !strings.Contains(stderr.String(), tc.warn) {
			t.Errorf("bantime %s: %v\n%s%s", tc.bantime, err, out, stderr.String())
		}
	}
}
