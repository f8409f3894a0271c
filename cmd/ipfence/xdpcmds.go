package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/backend/xdp"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/statedir"
)

// xdpFlags are the flags of commands that touch the XDP backend.
type xdpFlags struct {
	pinDir  string
	generic bool
}

func (f *xdpFlags) register(c *cobra.Command, attach bool) {
	c.Flags().StringVar(&f.pinDir, "pin-dir", xdp.DefaultPinDir, "bpffs folder where the XDP program, its counters and links are pinned")
	if attach {
		c.Flags().BoolVar(&f.generic, "xdp-generic", false, "attach XDP in generic mode even where the driver has native XDP")
	}
}

func (f *xdpFlags) options(netns string, ifs []string) xdp.Options {
	return xdp.Options{NetNS: netns, Interfaces: ifs, PinDir: f.pinDir, Generic: f.generic}
}

// applyWithXDP applies c: the XDP rules through xdp.Apply, the others
// through nftApply.
func applyWithXDP(c *compiled, netns string, prev *statedir.Applied, xf *xdpFlags, nftApply func() error) (*xdp.Report, error) {
	var before []string
	if prev != nil {
		for _, r := range prev.Rules {
			if r.Backend == plan.XDP {
				before = append(before, r.Name)
			}
		}
	}
	return xdp.Apply(c.plan, xf.options(netns, c.plan.Interfaces), before, nftApply)
}

func printXDPApply(w io.Writer, rep *xdp.Report) {
	if rep == nil {
		return
	}
	if rep.Detached {
		fmt.Fprintln(w, "XDP: no XDP rules any more; the program was detached")
		return
	}
	var ifs []string
	for _, i := range rep.Interfaces {
		ifs = append(ifs, fmt.Sprintf("%s (%s)", i.Name, i.Mode))
	}
	fmt.Fprintf(w, "XDP: %d rules on %s, %.1f MiB of tables (compile %d ms, load %d ms, attach %d ms)\n",
		rep.Rules, strings.Join(ifs, ", "), float64(rep.MemoryBytes)/(1<<20), rep.BuildMillis, rep.LoadMillis, rep.AttachMillis)
}

// xdpStatus is the XDP part of `ipfence status`: nil when no program is
// pinned.
type xdpStatus struct {
	xdp.Status
	Rules []xdpRuleStatus `json:"rules"`
}

type xdpRuleStatus struct {
	Name    string         `json:"name"` // "" for class 0: passed
	Total   xdp.Counters   `json:"total"`
	PerCPU  []xdp.Counters `json:"per_cpu"`
	Dropped bool           `json:"dropped"`
}

func readXDPStatus(netns string, xf *xdpFlags, a *statedir.Applied) (*xdpStatus, error) {
	var names []string
	if a != nil {
		for _, r := range a.Rules {
			if r.Backend == plan.XDP {
				names = append(names, r.Name)
			}
		}
	}
	st, err := xdp.ReadStatus(xf.options(netns, nil), len(names))
	if errors.Is(err, xdp.ErrNotLoaded) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the XDP status: %w", err)
	}
	out := &xdpStatus{Status: st}
	for c, per := range st.Counters {
		rs := xdpRuleStatus{Total: xdp.Sum(per), PerCPU: per, Dropped: c > 0}
		if c > 0 {
			rs.Name = names[c-1]
		}
		out.Rules = append(out.Rules, rs)
	}
	return out, nil
}

func printXDPStatus(w io.Writer, s *xdpStatus) {
	if s == nil {
		return
	}
	var ifs []string
	for _, i := range s.Interfaces {
		mode := string(i.Mode)
		if i.Program != s.Program {
			mode = "not attached"
		}
		ifs = append(ifs, fmt.Sprintf("%s (%s)", i.Name, mode))
	}
	fmt.Fprintf(w, "XDP program %d (%s) on %s, pinned in %s\n", s.Program, s.Name, strings.Join(ifs, ", "), s.PinDir)
	for _, r := range s.Rules {
		what := "passed on to nftables"
		if r.Dropped {
			what = "rule " + r.Name + " dropped"
		}
		var cpus []string
		for i, c := range r.PerCPU {
			cpus = append(cpus, fmt.Sprintf("cpu%d %d", i, c.Packets))
		}
		fmt.Fprintf(w, "  %-32s %12d packets %14d bytes  (%s)\n", what, r.Total.Packets, r.Total.Bytes, strings.Join(cpus, ", "))
	}
}
