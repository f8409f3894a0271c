package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/apply"
	"github.com/ipfence/ipfence/internal/backend/xdp"
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

// options are the XDP options of the flags (the namespace and interfaces
// are the apply target's and the policy's).
func (f *xdpFlags) options() xdp.Options {
	return xdp.Options{PinDir: f.pinDir, Generic: f.generic}
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

func printXDPStatus(w io.Writer, s *apply.XDPStatus) {
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
	if s.Conn != nil {
		c := xdp.Sum(s.Conn)
		fmt.Fprintf(w, "  %-32s %12d packets %14d bytes\n", "passed: known connections", c.Packets, c.Bytes)
	}
}
