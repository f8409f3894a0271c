package netns_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestMain fails the run if any namespace this process created is left.
func TestMain(m *testing.M) {
	code := m.Run()
	entries, err := os.ReadDir(netns.RunDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "FAIL: listing the namespaces left behind: %v\n", err)
		code = 1
	}
	for _, e := range entries {
		pid := os.Getpid()
		if strings.HasPrefix(e.Name(), fmt.Sprintf("ipf-t%d-", pid)) || strings.HasPrefix(e.Name(), fmt.Sprintf("ipf-sweep%d-", pid)) {
			fmt.Fprintf(os.Stderr, "FAIL: namespace %s left behind\n", e.Name())
			code = 1
		}
	}
	os.Exit(code)
}

// selfNetNS is the namespace of the test's current thread, as "net:[ino]".
func selfNetNS(t *testing.T) string {
	t.Helper()
	s, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCheckLabName(t *testing.T) {
	for _, name := range []string{"", "a/b", "a b", strings.Repeat("x", 41), "ü"} {
		if _, err := netns.NewLab(name); err == nil {
			t.Errorf("NewLab(%q) succeeded, want error", name)
		}
	}
}

func TestOpenNotFound(t *testing.T) {
	_, err := netns.Open("ipf-does-not-exist-42")
	if !errors.Is(err, netns.ErrNotFound) {
		t.Fatalf("Open of a missing namespace: got %v, want ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "ip netns list") {
		t.Errorf("error %q does not say how to list namespaces", err)
	}
	if err := netns.Do("ipf-does-not-exist-42", func() error { return nil }); !errors.Is(err, netns.ErrNotFound) {
		t.Errorf("Do in a missing namespace: got %v, want ErrNotFound", err)
	}
	if _, err := netns.Open("/proc/self/ns/does-not-exist"); !errors.Is(err, netns.ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a missing path: got %v, want ErrNotFound and fs.ErrNotExist", err)
	}
	if _, err := netns.Open("/proc/self/status"); !errors.Is(err, netns.ErrNotFound) {
		t.Errorf("Open of a file that is no namespace: got %v, want ErrNotFound", err)
	}
}

// TestCurrent checks that "" is the current namespace throughout, and that
// a path opens as a name does.
func TestCurrent(t *testing.T) {
	ran := false
	if err := netns.Do("", func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf(`Do(""): ran %v, error %v`, ran, err)
	}
	want := errors.New("fn's error")
	if err := netns.Do("", func() error { return want }); err != want {
		t.Errorf(`Do("") returned %v, want fn's error`, err)
	}
	if out, err := netns.Exec("", "echo", "hi"); err != nil || string(out) != "hi\n" {
		t.Errorf(`Exec("", echo hi) = %q, %v`, out, err)
	}
	cmd, err := netns.Command(context.Background(), "ipf-x", "nft", "list", "ruleset")
	if err != nil || !slices.Equal(cmd.Args, []string{"ip", "netns", "exec", "ipf-x", "nft", "list", "ruleset"}) {
		t.Errorf("Command in ipf-x: %v, %v", cmd, err)
	}
	for _, bad := range [][]string{{"a/b", "true"}, {"ipf-x"}} {
		if _, err := netns.Command(context.Background(), bad[0], bad[1:]...); err == nil {
			t.Errorf("Command(%q) succeeded, want an error", bad)
		}
	}
	f, err := netns.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("Open of /proc/self/ns/net: %v", err)
	}
	f.Close()
}

func TestLabUpAndDown(t *testing.T) {
	before := selfNetNS(t)
	lab := netnstest.New(t)
	for _, ns := range []string{lab.FW, lab.Gen} {
		if _, err := os.Stat(netns.Path(ns)); err != nil {
			t.Errorf("namespace file: %v", err)
		}
		f, err := netns.Open(ns)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	out, err := nsExec(lab.FW, "ip", "-br", "addr", "show", "dev", lab.FWIf)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"198.18.0.1/24", "2001:2::1/64", "UP"} {
		if !strings.Contains(out, want) {
			t.Errorf("fw %s: %q lacks %q", lab.FWIf, out, want)
		}
	}
	if len(lab.FWMAC) != 6 || len(lab.GenMAC) != 6 || lab.FWIndex == 0 || lab.GenIndex == 0 {
		t.Errorf("lab link attributes not filled in: %+v", lab)
	}
	// The MAC and index seen inside fw match what the lab reports.
	err = lab.DoFW(func() error {
		ifi, err := net.InterfaceByName(lab.FWIf)
		if err != nil {
			return err
		}
		if ifi.Index != lab.FWIndex || ifi.HardwareAddr.String() != lab.FWMAC.String() {
			return fmt.Errorf("interface %v, lab says index %d mac %s", ifi, lab.FWIndex, lab.FWMAC)
		}
		for k, want := range map[string]string{
			"ipv4/conf/all/rp_filter":               "0",
			"ipv4/conf/" + lab.FWIf + "/rp_filter":  "0",
			"ipv4/ip_forward":                       "0",
			"ipv6/conf/all/forwarding":              "0",
			"ipv6/conf/" + lab.FWIf + "/accept_dad": "0",
		} {
			b, err := os.ReadFile("/proc/sys/net/" + k)
			if err != nil {
				return err
			}
			if got := strings.TrimSpace(string(b)); got != want {
				return fmt.Errorf("sysctl %s = %s, want %s", k, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Traffic flows both ways over v4 and v6 at once (no DAD wait).
	for _, dst := range []netip.Addr{lab.FWAddr4.Addr(), lab.FWAddr6.Addr()} {
		if err := udpRoundTrip(lab, dst); err != nil {
			t.Errorf("udp to %s: %v", dst, err)
		}
	}
	if after := selfNetNS(t); after != before {
		t.Fatalf("test thread namespace changed: %s -> %s", before, after)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lab.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := lab.DoFW(func() error { return nil }); !errors.Is(err, netns.ErrClosed) {
		t.Errorf("DoFW after Close: %v, want ErrClosed", err)
	}
	for _, ns := range []string{lab.FW, lab.Gen} {
		if _, err := os.Stat(netns.Path(ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there after Close: %v", ns, err)
		}
	}
	if list := ipNetnsList(t); slices.Contains(list, lab.FW) || slices.Contains(list, lab.Gen) {
		t.Errorf("ip netns list still shows the lab: %v", list)
	}
}

// udpRoundTrip sends a datagram from gen to fw and an answer back.
func udpRoundTrip(lab *netns.Lab, dst netip.Addr) error {
	var srv *net.UDPConn
	err := lab.DoFW(func() error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		return err
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	var cli *net.UDPConn
	err = lab.DoGen(func() error {
		var err error
		cli, err = net.DialUDP("udp", nil, srv.LocalAddr().(*net.UDPAddr))
		return err
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(2 * time.Second)
	srv.SetDeadline(deadline)
	cli.SetDeadline(deadline)
	if _, err := cli.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, from, err := srv.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "ping" {
		return fmt.Errorf("fw reading: %q, %v", buf[:n], err)
	}
	if _, err := srv.WriteToUDPAddrPort([]byte("pong"), from); err != nil {
		return err
	}
	n, err = cli.Read(buf)
	if err != nil || string(buf[:n]) != "pong" {
		return fmt.Errorf("gen reading: %q, %v", buf[:n], err)
	}
	return nil
}

func TestDoRestoresAndPropagates(t *testing.T) {
	lab := netnstest.New(t)
	before := selfNetNS(t)
	var inside string
	err := netns.Do(lab.Gen, func() error {
		var err error
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Fatalf("Do did not switch namespace (%s)", inside)
	}
	sentinel := errors.New("sentinel")
	if err := netns.Do(lab.Gen, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do lost fn's error: %v", err)
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want boom", p)
			}
		}()
		lab.DoFW(func() error { panic("boom") })
	}()
	if err := lab.DoFW(func() error { runtime.Goexit(); return nil }); err == nil {
		t.Error("Do of a function calling Goexit returned nil")
	}
	// Many Do calls; none may leak a switched thread into the pool.
	for range 50 {
		lab.DoGen(func() error { return nil })
		if got := selfNetNS(t); got != before {
			t.Fatalf("thread left in %s", got)
		}
	}
	out, err := netns.Exec(lab.Gen, "ip", "-o", "link", "show", lab.GenIf)
	if err != nil || !strings.Contains(string(out), lab.GenIf) {
		t.Errorf("Exec: %q, %v", out, err)
	}
	if _, err := netns.Exec(lab.Gen, "false"); err == nil {
		t.Error("Exec of false succeeded")
	}
}

func TestNewLabNameTaken(t *testing.T) {
	lab := netnstest.New(t)
	_, err := netns.NewLab(lab.Name)
	if !errors.Is(err, netns.ErrExist) {
		t.Fatalf("second NewLab(%q): %v, want ErrExist", lab.Name, err)
	}
	// The failed attempt must not have removed the first lab's namespaces.
	if err := udpRoundTrip(lab, lab.FWAddr4.Addr()); err != nil {
		t.Fatalf("first lab broken by second NewLab: %v", err)
	}
}

func TestSweep(t *testing.T) {
	live := netnstest.New(t)
	// A lab whose owner vanished: closing its files without removing the
	// mounts is what a crash leaves behind.
	name := fmt.Sprintf("sweep%d", os.Getpid())
	stale, err := netns.NewLab(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stale.Close() })
	netns.ForgetForTest(stale)
	removed, err := netns.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{stale.FW, stale.Gen}; !slices.Equal(removed, want) {
		t.Errorf("Sweep removed %v, want %v", removed, want)
	}
	list := ipNetnsList(t)
	if !slices.Contains(list, live.FW) || !slices.Contains(list, live.Gen) {
		t.Errorf("Sweep removed the live lab: %v", list)
	}
	if slices.Contains(list, stale.FW) {
		t.Errorf("stale lab still listed: %v", list)
	}
}

func ipNetnsList(t *testing.T) []string {
	t.Helper()
	out, err := execHost("ip", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

func nsExec(ns string, argv ...string) (string, error) {
	out, err := netns.Exec(ns, argv...)
	return string(out), err
}

func execHost(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// TestNSFSMounts reads the network namespaces of a mountinfo listing:
// nsfs mounts of net namespaces only, mount points unescaped.
func TestNSFSMounts(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
610 29 0:4 net:[4026532177] /run/netns/ipf-a rw shared:301 - nsfs nsfs rw
611 29 0:4 net:[4026532300] /run/netns/with\040space rw - nsfs nsfs rw
612 29 0:4 mnt:[4026532400] /run/mntns rw - nsfs nsfs rw
613 29 0:4 net:[4026532500] /tmp/x rw - tmpfs tmpfs rw
bad line
`
	got := netns.NSFSMounts(info)
	want := map[uint64]string{4026532177: "/run/netns/ipf-a", 4026532300: "/run/netns/with space"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("got %v, want %v", got, want)
		}
	}
}

// TestLiveAndCookie: Live lists this process's namespace and a lab's,
// each with a path that opens it; cookies tell namespaces apart and
// outlive no namespace, even when the kernel gives its inode to the next.
func TestLiveAndCookie(t *testing.T) {
	lab := netnstest.New(t)
	gone := netnstest.New(t)
	live, err := netns.Live()
	if err != nil {
		t.Fatal(err)
	}
	cookies := map[string]uint64{}
	for _, ns := range []string{"", lab.FW, gone.FW} {
		var st unix.Stat_t
		file := "/proc/self/ns/net"
		if ns != "" {
			file = netns.Path(ns)
		}
		if err := unix.Stat(file, &st); err != nil {
			t.Fatal(err)
		}
		path, ok := live[st.Ino]
		if !ok {
			t.Fatalf("Live lacks %s (inode %d)", netns.Describe(ns), st.Ino)
		}
		c, err := netns.Cookie(ns)
		if err != nil {
			t.Fatal(err)
		}
		if viaPath, err := netns.Cookie(path); err != nil || viaPath != c {
			t.Errorf("%s: cookie %d, through Live's path %s: %d, %v", netns.Describe(ns), c, path, viaPath, err)
		}
		for other, oc := range cookies {
			if oc == c {
				t.Errorf("%s and %s have the same cookie %d", netns.Describe(ns), netns.Describe(other), c)
			}
		}
		cookies[ns] = c
	}
	var st unix.Stat_t
	if err := unix.Stat(netns.Path(gone.FW), &st); err != nil {
		t.Fatal(err)
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if live, err = netns.Live(); err != nil {
		t.Fatal(err)
	}
	if path, ok := live[st.Ino]; ok {
		if c, err := netns.Cookie(path); err == nil && c == cookies[gone.FW] {
			t.Errorf("a removed namespace is still live at %s", path)
		}
	}
}

// TestKey: names and files under the run folder keep their name; other
// paths are told apart by their whole path.
func TestKey(t *testing.T) {
	for ns, want := range map[string]string{
		"":                    "_current",
		"lab":                 "lab",
		"/run/netns/lab":      "lab",
		"/var/run/netns/lab":  "lab",
		"/proc/42/ns/net":     "path_proc_42_ns_net",
		"/proc/43/ns/net":     "path_proc_43_ns_net",
		"/proc/42/task/7/net": "path_proc_42_task_7_net",
	} {
		if got := netns.Key(ns); got != want {
			t.Errorf("Key(%q) = %q, want %q", ns, got, want)
		}
	}
}
