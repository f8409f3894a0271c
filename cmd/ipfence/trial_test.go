package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/pktgen/pktgentest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
	"github.com/ipfence/ipfence/internal/trial"
)

// trialPolicy drops the sources of its list: policy A drops 5.5.0.0/16
// and 2001:db8:5::/48, policy B 6.6.0.0/16 and 2001:db8:6::/48 (a stand-in for a rule that locks the operator
// out).
const trialPolicy = `
sources: {s: {format: list, paths: [%s]}}
protect: [198.18.0.0/15, 2001:2::/48]
rules: [{name: %s, action: drop, match: {source: s}}]
`

// trialLab is a lab namespace, a state folder, policies A and B and
// the sources that tell them apart.
type trialLab struct {
	t        *testing.T
	lab      *netns.Lab
	exe, dir string
	a, b     string
	pa, pb   *plan.Plan
	srcs     []netip.Addr
}

func newTrialLab(t *testing.T) *trialLab {
	l := &trialLab{t: t, lab: netnstest.New(t), exe: buildIpfence(t), dir: t.TempDir()}
	write(t, l.dir, "a.txt", "5.5.0.0/16\n2001:db8:5::/48\n")
	write(t, l.dir, "b.txt", "6.6.0.0/16\n2001:db8:6::/48\n")
	write(t, l.dir, "a.yaml", strings.Replace(strings.Replace(trialPolicy, "%s", "a.txt", 1), "%s", "ruleA", 1))
	write(t, l.dir, "b.yaml", strings.Replace(strings.Replace(trialPolicy, "%s", "b.txt", 1), "%s", "ruleB", 1))
	l.a, l.b = filepath.Join(l.dir, "a.yaml"), filepath.Join(l.dir, "b.yaml")
	l.pa, l.pb = compileFor(t, l.a, t.TempDir()).Plan, compileFor(t, l.b, t.TempDir()).Plan
	for _, s := range []string{"5.5.1.1", "5.5.200.9", "6.6.1.1", "6.6.77.3", "7.7.7.7", "203.0.113.5", "2001:db8:5::1", "2001:db8:6::9", "2001:db8:7::1"} {
		l.srcs = append(l.srcs, netip.MustParseAddr(s))
	}
	t.Cleanup(l.stopWatchers)
	return l
}

// ipfence runs the ipfence binary in the lab's namespace and state.
func (l *trialLab) ipfence(args ...string) (string, error) {
	l.t.Helper()
	cmd := exec.Command(l.exe, append(args, "--netns", l.lab.FW, "--state", l.dir)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		err = errors.New(strings.TrimSpace(errb.String()))
	}
	return out.String(), err
}

// inForce checks the kernel's verdicts against p's.
func (l *trialLab) inForce(p *plan.Plan) {
	l.t.Helper()
	pktgentest.ExpectModel(l.t, l.lab, p, l.srcs, 22)
}

// pending is the trial in the state folder (nil: none).
func (l *trialLab) pending() *trial.Pending {
	l.t.Helper()
	p, err := trial.Store{Dir: statedir.Dir{Path: l.dir}, NetNS: l.lab.FW}.Pending()
	if err != nil {
		l.t.Fatal(err)
	}
	return p
}

var armedPID = regexp.MustCompile(`^process (\d+)`)

// watcher is the PID of the process that rolls p back.
func watcher(t testing.TB, p *trial.Pending) int {
	t.Helper()
	m := armedPID.FindStringSubmatch(p.Armed)
	if m == nil {
		t.Fatalf("the rollback is armed as %q, not as a process", p.Armed)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// stopWatchers kills the rollback processes a failed test left.
func (l *trialLab) stopWatchers() {
	out, _ := exec.Command("pgrep", "-f", "confirm --expire .* --state "+l.dir).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// waitEnded waits until no trial is pending, up to its deadline and
// 30 seconds more.
func (l *trialLab) waitEnded(p *trial.Pending) {
	l.t.Helper()
	for time.Now().Before(p.Deadline.Add(30 * time.Second)) {
		if l.pending() == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(l.dir, "trial", netns.Key(l.lab.FW)+".log"))
	l.t.Fatalf("the trial did not end by its deadline (%s); the rollback's log:\n%s", p.Deadline, log)
}

// TestConfirmRollback is commit-confirmed apply in a lab namespace. An
// apply on trial that nobody confirms is rolled back by its own process
// after the SSH-like session that ran it is killed; a confirmed one
// stays; a second apply is refused during a trial; `confirm --rollback`
// ends one at once; a reboot within the window (the rollback process
// gone) is rolled back by the boot-time restore, which then loads the
// last confirmed ruleset in place of the refused policy file; and a
// trial with nothing before it rolls back to nothing.
func TestConfirmRollback(t *testing.T) {
	l := newTrialLab(t)
	if _, err := l.ipfence("apply", "--policy", l.a); err != nil {
		t.Fatal(err)
	}
	l.inForce(l.pa)

	// The trial runs in a session of its own, as over SSH; once the
	// apply has printed, the session goes (every process in it is
	// killed, as when the connection drops).
	outFile := filepath.Join(t.TempDir(), "session.out")
	sh := exec.Command("sh", "-c", `"$0" apply --policy "$1" --netns "$2" --state "$3" --confirm 5s > "$4" 2>&1; sleep 60`, l.exe, l.b, l.lab.FW, l.dir, outFile)
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !bytes.Contains(out, []byte("rollback armed")); {
		time.Sleep(50 * time.Millisecond)
		out, _ = os.ReadFile(outFile)
	}
	if err := syscall.Kill(-sh.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = sh.Wait()
	if !bytes.Contains(out, []byte("rollback armed: process")) {
		t.Fatalf("apply --confirm says:\n%s", out)
	}
	p := l.pending()
	if p == nil || p.Back == nil || p.Trial.IsZero() {
		t.Fatalf("pending trial %+v", p)
	}
	if !alive(watcher(t, p)) {
		t.Fatal("the rollback process died with the session")
	}
	l.inForce(l.pb)
	status, err := l.ipfence("status")
	if err != nil || !strings.Contains(status, "ON TRIAL: "+l.b) {
		t.Errorf("status during the trial (%v):\n%s", err, status)
	}
	l.waitEnded(p)
	l.inForce(l.pa)
	if _, err := l.ipfence("confirm"); err == nil || !strings.Contains(err.Error(), "rolled back") {
		t.Errorf("confirm after the rollback: %v", err)
	}

	// Confirmed in time: the trial stays, and its process stands down.
	out2, err := l.ipfence("apply", "--policy", l.b, "--confirm", "5s")
	if err != nil {
		t.Fatal(err)
	}
	p = l.pending()
	if _, err := l.ipfence("confirm"); err != nil {
		t.Fatalf("confirm: %v (apply said %s)", err, out2)
	}
	time.Sleep(time.Until(p.Deadline) + 2*time.Second)
	if l.pending() != nil || alive(watcher(t, p)) {
		t.Error("the rollback process outlived the confirmation")
	}
	l.inForce(l.pb)
	// B was refused, tried again and kept: refused no more.
	if status, _ := l.ipfence("status"); strings.Contains(status, "rolled back at") {
		t.Errorf("status after B was confirmed:\n%s", status)
	}

	// An apply killed after its load but before it recorded it (the
	// applied record is the last one, the trial has no load time) is
	// rolled back all the same; and an address the host gained since in
	// what the old ruleset drops does not keep it from coming back.
	recordPath := filepath.Join(l.dir, "applied", netns.Key(l.lab.FW)+".json")
	record, err := os.ReadFile(recordPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.ipfence("apply", "--policy", l.a, "--confirm", "1m"); err != nil {
		t.Fatal(err)
	}
	netnstest.Exec(t, l.lab.FW, "ip", "addr", "add", "6.6.9.9/32", "dev", "lo")
	p = l.pending()
	p.Trial, p.Deadline = time.Time{}, time.Now().Add(2*time.Second)
	if err := errors.Join(os.WriteFile(recordPath, record, 0o600), trial.Store{Dir: statedir.Dir{Path: l.dir}, NetNS: l.lab.FW}.SavePending(p)); err != nil {
		t.Fatal(err)
	}
	l.waitEnded(p)
	netnstest.Exec(t, l.lab.FW, "ip", "addr", "del", "6.6.9.9/32", "dev", "lo")
	l.inForce(l.pb)

	// During a trial a plain apply is refused; --rollback ends it now.
	if _, err := l.ipfence("apply", "--policy", l.a, "--confirm", "1m"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ipfence("apply", "--policy", l.a); err == nil || !strings.Contains(err.Error(), "on trial") {
		t.Errorf("a plain apply during a trial: %v", err)
	}
	p = l.pending()
	if out, err := l.ipfence("confirm", "--rollback"); err != nil || !strings.Contains(out, "rolled back") {
		t.Fatalf("confirm --rollback: %v\n%s", err, out)
	}
	l.inForce(l.pb)
	l.waitGone(watcher(t, p))

	// A reboot within the window: the rollback process is gone, the
	// boot-time restore of the trial's policy file rolls it back, and
	// then restores the last confirmed ruleset in its place.
	if _, err := l.ipfence("apply", "--policy", l.a, "--confirm", "1m"); err != nil {
		t.Fatal(err)
	}
	l.inForce(l.pa)
	p = l.pending()
	_ = syscall.Kill(watcher(t, p), syscall.SIGKILL)
	l.waitGone(watcher(t, p))
	if out, err := l.ipfence("apply", "--offline", "--policy", l.a); err != nil || !strings.Contains(out, "rolled back the apply on trial") {
		t.Fatalf("boot-time restore with a trial pending: %v\n%s", err, out)
	}
	l.inForce(l.pb)
	if out, err := l.ipfence("apply", "--offline", "--policy", l.a); err != nil || !strings.Contains(out, "restored the last confirmed ruleset") {
		t.Fatalf("boot-time restore of the refused policy: %v\n%s", err, out)
	}
	l.inForce(l.pb)
	status, _ = l.ipfence("--json", "status")
	var st struct {
		RolledBack *trial.Refused `json:"rolled_back"`
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil || st.RolledBack == nil || st.RolledBack.PolicyDigest == "" {
		t.Errorf("status --json: %v\n%s", err, status)
	}
	// The operator's own apply of it lifts the refusal.
	if _, err := l.ipfence("apply", "--policy", l.a); err != nil {
		t.Fatal(err)
	}
	l.inForce(l.pa)

	// Nothing before the trial: rolling back removes ipfence's table.
	if _, err := l.ipfence("flush"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ipfence("apply", "--policy", l.b, "--confirm", "5s"); err != nil {
		t.Fatal(err)
	}
	p = l.pending()
	if p.Back != nil {
		t.Fatalf("a trial after a flush puts back %+v", p.Back)
	}
	l.waitEnded(p)
	if out, _ := l.ipfence("status"); !strings.Contains(out, "no ipfence table loaded") {
		t.Errorf("status after rolling back to nothing:\n%s", out)
	}
	// Nothing was confirmed: the boot-time restore of the refused file
	// restores nothing, and a daemon runs without rules (bans only).
	if out, err := l.ipfence("apply", "--offline", "--policy", l.b); err != nil || !strings.Contains(out, "restored nothing") {
		t.Fatalf("boot-time restore after a rollback to nothing: %v\n%s", err, out)
	}
	socket := filepath.Join(t.TempDir(), "api.sock")
	d := startDaemon(t, l.exe, socket, "--policy", l.b, "--netns", l.lab.FW, "--state", l.dir, "--metrics", "")
	if ruleset := netnstest.Ruleset(t, l.lab.FW); strings.Contains(ruleset, "ruleB") || !strings.Contains(ruleset, "bans_v4") {
		t.Errorf("the daemon's ruleset with nothing confirmed:\n%s", ruleset)
	}
	_ = d.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
}

// waitGone waits for process pid to exit (5 seconds at most).
func (l *trialLab) waitGone(pid int) {
	l.t.Helper()
	for range 100 {
		if !alive(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.t.Fatalf("rollback process %d still runs", pid)
}

// alive reports whether process pid runs (a zombie, which nothing
// reaped, does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, ok := bytes.Cut(stat, []byte(") "))
	return ok && len(after) > 0 && after[0] != 'Z'
}

// TestConfirmDaemon: a daemon that starts while an apply is on trial
// (the trial's rollback cannot run beside it: it holds the state folder)
// rolls the trial back, and loads the last confirmed ruleset in place of
// the refused policy file until the file changes. What a daemon loads
// has no copy to put back: a trial after it is refused.
func TestConfirmDaemon(t *testing.T) {
	l := newTrialLab(t)
	if _, err := l.ipfence("apply", "--policy", l.b); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ipfence("apply", "--policy", l.a, "--confirm", "1m"); err != nil {
		t.Fatal(err)
	}
	l.inForce(l.pa)
	p := l.pending()
	_ = syscall.Kill(watcher(t, p), syscall.SIGKILL)
	l.waitGone(watcher(t, p))

	socket := filepath.Join(t.TempDir(), "api.sock")
	d := startDaemon(t, l.exe, socket, "--policy", l.a, "--netns", l.lab.FW, "--state", l.dir, "--metrics", "")
	t.Cleanup(func() { _ = d.Process.Signal(syscall.SIGTERM); _ = d.Wait() })
	if l.pending() != nil {
		t.Fatal("the trial is still pending under the daemon")
	}
	l.inForce(l.pb)
	// A changed policy file is the operator's new word: loaded.
	write(t, l.dir, "a.yaml", strings.Replace(strings.Replace(trialPolicy, "%s", "a.txt", 1), "%s", "ruleA", 1)+"# fixed\n")
	if out, err := exec.Command(l.exe, "reload", "--socket", socket).CombinedOutput(); err != nil {
		t.Fatalf("reload: %v\n%s", err, out)
	}
	l.inForce(l.pa)
	_ = d.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
	if _, err := l.ipfence("apply", "--policy", l.b, "--confirm", "1m"); err == nil || !strings.Contains(err.Error(), "kept no copy") {
		t.Errorf("a trial after the daemon's load: %v", err)
	}
	if l.pending() != nil {
		t.Error("a refused trial is pending")
	}
}

// TestConfirmDaemonReload is a reload on trial through the daemon: the
// daemon rolls an unconfirmed one back to the policy it ran before, and
// keeps loading that policy in place of the refused file (a plain
// reload too) until the file changes; a confirmed one stays; a daemon
// killed during a trial takes it up when it starts again: watched within
// the window (and rolled back by confirm --rollback), rolled back at once
// after it.
func TestConfirmDaemonReload(t *testing.T) {
	l := newTrialLab(t)
	textA, _ := os.ReadFile(l.a)
	textB, _ := os.ReadFile(l.b)
	pol := filepath.Join(l.dir, "policy.yaml")
	write(t, l.dir, "policy.yaml", string(textA))
	socket := filepath.Join(t.TempDir(), "api.sock")
	start := func() *exec.Cmd {
		d := startDaemon(t, l.exe, socket, "--policy", pol, "--netns", l.lab.FW, "--state", l.dir, "--metrics", "")
		t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait() })
		return d
	}
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(l.exe, append(args, "--socket", socket)...).CombinedOutput()
		return string(out), err
	}
	d := start()
	l.inForce(l.pa)

	// Not confirmed: A again, and while the file is B, A in its place.
	write(t, l.dir, "policy.yaml", string(textB))
	if out, err := cli("reload", "--confirm", "5s"); err != nil || !strings.Contains(out, "ON TRIAL") {
		t.Fatalf("reload --confirm: %v\n%s", err, out)
	}
	l.inForce(l.pb)
	if out, err := cli("reload"); err == nil || !strings.Contains(out, "on trial") {
		t.Errorf("a plain reload during the trial: %v\n%s", err, out)
	}
	p := l.pending()
	if p == nil || !p.Daemon {
		t.Fatalf("pending %+v", p)
	}
	l.waitEnded(p)
	l.inForce(l.pa)
	if out, err := cli("reload"); err != nil {
		t.Fatalf("reload of the refused file: %v\n%s", err, out)
	}
	l.inForce(l.pa)

	// Tried again and confirmed: B stays.
	if out, err := cli("reload", "--confirm", "5s"); err != nil {
		t.Fatalf("reload --confirm: %v\n%s", err, out)
	}
	p = l.pending()
	if out, err := cli("confirm", "--state", l.dir); err != nil || !strings.Contains(out, "confirmed") {
		t.Fatalf("confirm: %v\n%s", err, out)
	}
	time.Sleep(time.Until(p.Deadline) + time.Second)
	l.inForce(l.pb)

	// Killed within the window: taken up again, then rolled back.
	write(t, l.dir, "policy.yaml", string(textA))
	if out, err := cli("reload", "--confirm", "1m"); err != nil {
		t.Fatalf("reload --confirm: %v\n%s", err, out)
	}
	l.inForce(l.pa)
	_ = d.Process.Kill()
	_ = d.Wait()
	d = start()
	l.inForce(l.pa)
	if p := l.pending(); p == nil || !p.Daemon {
		t.Fatalf("the trial after a restart: %+v", p)
	}
	if out, err := cli("confirm", "--rollback", "--state", l.dir); err != nil || !strings.Contains(out, "rolled back") {
		t.Fatalf("confirm --rollback: %v\n%s", err, out)
	}
	l.inForce(l.pb)

	// Killed, and the window ends while it is down: rolled back at start.
	write(t, l.dir, "policy.yaml", string(textA)+"# again\n")
	if out, err := cli("reload", "--confirm", "5s"); err != nil {
		t.Fatalf("reload --confirm: %v\n%s", err, out)
	}
	l.inForce(l.pa)
	p = l.pending()
	_ = d.Process.Kill()
	_ = d.Wait()
	time.Sleep(time.Until(p.Deadline) + time.Second)
	d = start()
	if l.pending() != nil {
		t.Error("the trial is still pending after a start past its window")
	}
	l.inForce(l.pb)
	// Another state folder is not the daemon's: confirm looks there.
	if out, err := exec.Command(l.exe, "confirm", "--state", t.TempDir(), "--netns", l.lab.FW, "--socket", socket).CombinedOutput(); err == nil || !strings.Contains(string(out), "nothing is on trial") {
		t.Errorf("confirm in another state folder: %v\n%s", err, out)
	}

	// The daemon down during its trial: the command line leaves the
	// trial to it (no rollback to nothing, no trial over it), and the
	// boot-time restore puts back the policy it ran before.
	write(t, l.dir, "policy.yaml", string(textA)+"# third\n")
	if out, err := cli("reload", "--confirm", "1m"); err != nil {
		t.Fatalf("reload --confirm: %v\n%s", err, out)
	}
	l.inForce(l.pa)
	_ = d.Process.Kill()
	_ = d.Wait()
	if _, err := l.ipfence("confirm", "--rollback"); err == nil || !strings.Contains(err.Error(), "daemon's") {
		t.Errorf("confirm --rollback of the daemon's trial, the daemon down: %v", err)
	}
	if _, err := l.ipfence("apply", "--policy", l.b, "--confirm", "1m"); err == nil || !strings.Contains(err.Error(), "daemon's reload") {
		t.Errorf("apply --confirm over the daemon's trial: %v", err)
	}
	l.inForce(l.pa)
	if out, err := l.ipfence("apply", "--offline", "--policy", pol); err != nil {
		t.Fatalf("boot-time restore with the daemon's trial pending: %v\n%s", err, out)
	}
	l.inForce(l.pb)
	if l.pending() != nil {
		t.Error("the daemon's trial outlived the boot-time restore")
	}
}
