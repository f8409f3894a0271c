package hostaddr_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipfence/ipfence/internal/hostaddr"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// TestListNamespace lists the addresses of a lab's fw namespace: its own,
// and none of gen's.
func TestListNamespace(t *testing.T) {
	lab := netnstest.New(t)
	got, err := hostaddr.List(lab.FW)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []netip.Addr{lab.FWAddr4.Addr(), lab.FWAddr6.Addr()} {
		if !slices.Contains(got, want) {
			t.Errorf("List(%s) = %v, missing %v", lab.FW, got, want)
		}
	}
	if slices.Contains(got, lab.GenAddr4.Addr()) {
		t.Errorf("List(%s) = %v, holds gen's address %v", lab.FW, got, lab.GenAddr4.Addr())
	}
	if _, err := hostaddr.List("ipf-does-not-exist-42"); !errors.Is(err, netns.ErrNotFound) {
		t.Errorf("List of a missing namespace: %v, want ErrNotFound", err)
	}
}
