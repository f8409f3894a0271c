package prefix

import (
	"reflect"
	"unsafe"

	"go4.org/netipx"
)

// This file is the only code that knows how a netipx.IPSet is laid out.
//
// netipx offers one way to make an IPSet: IPSetBuilder, which re-sorts the
// ranges and copies them five times, with pointer write barriers. A Set's
// ranges are sorted and merged already, and for 690k ranges going through
// IPSetBuilder took 20 times as long (500 ms against 23 ms) and 8 times
// the memory (271 MB against 33 MB) as handing them over directly
// (BenchmarkNewIPSet). Reading a set's ranges without the copy
// IPSet.Ranges makes saves as much again when writing a big set.
//
// Both are done only when IPSet is, as in the netipx version go.mod
// pins, a struct holding just its []IPRange; otherwise (a netipx upgrade
// changed it) they fall back to IPSetBuilder and IPSet.Ranges, and
// TestIPSetLayout fails to say so.

// ipsetLayout mirrors netipx.IPSet.
type ipsetLayout struct {
	rr []netipx.IPRange // sorted, IPv4 first, no two overlapping or touching
}

// ipsetDirect reports whether netipx.IPSet is laid out as ipsetLayout.
var ipsetDirect = func() bool {
	t := reflect.TypeFor[netipx.IPSet]()
	return t.NumField() == 1 && t.Field(0).Name == "rr" &&
		t.Field(0).Type == reflect.TypeFor[[]netipx.IPRange]() &&
		t.Size() == unsafe.Sizeof(ipsetLayout{})
}()

// newIPSet returns the set of rr, which must hold valid ranges, sorted,
// IPv4 first, no two overlapping or touching: netipx's own invariant,
// which Builder's merge establishes. The set takes rr over.
func newIPSet(rr []netipx.IPRange) *netipx.IPSet {
	if ipsetDirect {
		return (*netipx.IPSet)(unsafe.Pointer(&ipsetLayout{rr}))
	}
	var b netipx.IPSetBuilder
	for _, r := range rr {
		b.AddRange(r)
	}
	s, _ := b.IPSet() // cannot fail: every range is valid
	return s
}

// rangesOf returns the ranges of s, nil for a nil set, without copying
// them when it can: the caller must not modify them.
func rangesOf(s *netipx.IPSet) []netipx.IPRange {
	switch {
	case s == nil:
		return nil
	case ipsetDirect:
		return (*ipsetLayout)(unsafe.Pointer(s)).rr
	}
	return s.Ranges()
}
