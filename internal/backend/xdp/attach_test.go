package xdp

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// attachedProgram returns the ID and mode of the XDP program on the lab's
// firewall interface (0 if none).
func attachedProgram(t *testing.T, do func(func() error) error, ifname string) (uint32, Mode) {
	t.Helper()
	var id uint32
	var mode Mode
	if err := do(func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		mode, id, err = attached(l.Attrs().Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id, mode
}

// swapIn prepares, attaches and commits l.
func swapIn(t *testing.T, l *Layout, opt Options) []Interface {
	t.Helper()
	s, err := Prepare(l, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Attach(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	return s.Interfaces()
}

// TestSwapModesAndRejection attaches in generic mode when asked, swaps to
// native, reads the status, and checks that a program the verifier
// refuses leaves the attached one in place.
func TestSwapModesAndRejection(t *testing.T) {
	lab := netnstest.New(t)
	opt := Options{NetNS: lab.FW, Interfaces: []string{lab.FWIf}, PinDir: netnstest.BPFFS(t), Generic: true}
	rules := []Rule{{Name: "x", Drop: setOf(t, "198.51.100.0/24", "2001:db8::/32")}}
	l, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	if ifs := swapIn(t, l, opt); len(ifs) != 1 || ifs[0].Mode != Generic {
		t.Errorf("attached %+v, want generic mode", ifs)
	}
	// An interface moves from generic to native only through a new link:
	// ipfence keeps the link (and mode) it has, so flush first.
	if _, err := Flush(opt); err != nil {
		t.Fatal(err)
	}
	opt.Generic = false
	ifs := swapIn(t, l, opt)
	id, mode := attachedProgram(t, lab.DoFW, lab.FWIf)
	if len(ifs) != 1 || ifs[0].Mode != Native || mode != Native || id != ifs[0].Program {
		t.Errorf("attached %+v; the kernel reports program %d in %s mode", ifs, id, mode)
	}
	st, err := ReadStatus(opt, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.Program != id || len(st.Counters) != 2 || len(st.Interfaces) != 1 || st.Interfaces[0].Program != id {
		t.Errorf("status %+v, want program %d on one interface with counters for 2 classes", st, id)
	}

	// A layout whose probe loop is too long to verify (Build keeps loops
	// below 64): the kernel refuses the program, and the one attached
	// stays.
	bad, err := BuildLayout(rules)
	if err != nil {
		t.Fatal(err)
	}
	bad.V6.Levels[0].Probes = 1 << 16
	if _, err = Prepare(bad, opt); !errors.Is(err, ErrRejected) {
		t.Fatalf("Prepare of an unverifiable program: %v, want ErrRejected", err)
	}
	if now, _ := attachedProgram(t, lab.DoFW, lab.FWIf); now != id {
		t.Errorf("program %d attached after the refused one, want %d", now, id)
	}

	if removed, err := Flush(opt); err != nil || !removed {
		t.Fatalf("Flush = %v, %v", removed, err)
	}
	if now, _ := attachedProgram(t, lab.DoFW, lab.FWIf); now != 0 {
		t.Errorf("program %d still attached after Flush", now)
	}
	if _, err := ReadStatus(opt, 1); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("ReadStatus after Flush: %v, want ErrNotLoaded", err)
	}
}
