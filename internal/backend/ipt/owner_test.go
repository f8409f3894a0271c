package ipt_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
)

// TestOwnership: chains of ipfence's name that another program made (no
// mark) are neither replaced nor removed, in either flavour: Apply and
// Flush refuse with ErrNotOwned and leave them as they were; with Adopt
// (a record of an older ipfence vouching) they are taken over and
// marked. ipfence's own chains keep their mark when another program
// flushes one of them or the hook, and Flush removes them then.
func TestOwnership(t *testing.T) {
	for _, fl := range []string{ipt.NFT, ipt.Legacy} {
		t.Run(fl, func(t *testing.T) {
			lab := netnstest.New(t, "ipset", "iptables-"+fl+"-restore", "ip6tables-"+fl+"-restore")
			ctx := context.Background()
			o := ipt.Options{NetNS: lab.FW, Flavour: fl}
			in := testInput(t, plan.IPSet)
			in.Table = "mytable"
			_, prog := compile(t, in)
			for _, argv := range [][]string{
				{"iptables-" + fl, "-w", "-t", "raw", "-N", "mytable"},
				{"iptables-" + fl, "-w", "-t", "raw", "-N", "mytable-h0"},
				{"iptables-" + fl, "-w", "-t", "raw", "-A", "mytable", "-s", "192.0.2.9", "-j", "mytable-h0"},
				{"iptables-" + fl, "-w", "-t", "raw", "-A", "mytable-h0", "-j", "DROP"},
				{"iptables-" + fl, "-w", "-t", "raw", "-A", "PREROUTING", "-j", "mytable"},
			} {
				netnstest.Exec(t, lab.FW, argv...)
			}
			save := func() string {
				var all string
				for _, table := range []string{"raw", "mangle"} {
					out, err := netns.Exec(lab.FW, "iptables-"+fl+"-save", "-t", table)
					if err != nil {
						t.Fatal(err)
					}
					all += withoutEmptyTables(string(out))
				}
				return all
			}
			foreign := save()
			if _, err := ipt.Apply(ctx, prog, o); !errors.Is(err, ipt.ErrNotOwned) {
				t.Fatalf("apply over foreign chains: %v, want ErrNotOwned", err)
			}
			if _, err := ipt.Flush(ctx, "mytable", ipt.Options{NetNS: lab.FW}); !errors.Is(err, ipt.ErrNotOwned) {
				t.Fatalf("flush of foreign chains: %v, want ErrNotOwned", err)
			}
			if now := save(); now != foreign {
				t.Fatalf("the foreign chains changed:\nbefore:\n%s\nafter:\n%s", foreign, now)
			}
			if sets, _ := netns.Exec(lab.FW, "ipset", "list", "-n"); len(sets) != 0 {
				t.Errorf("ipsets made before the refusal: %s", sets)
			}
			// An older ipfence's chains (what the record vouches for)
			// are taken over and marked.
			adopt := o
			adopt.Adopt = true
			if _, err := ipt.Apply(ctx, prog, adopt); err != nil {
				t.Fatal(err)
			}
			if _, err := ipt.Apply(ctx, prog, o); err != nil {
				t.Fatalf("apply over its own marked chains: %v", err)
			}
			// Another program flushes the entry chain, then the hook:
			// either mark is enough.
			netnstest.Exec(t, lab.FW, "iptables-"+fl, "-w", "-t", "mangle", "-F", prog.InChain())
			if _, err := ipt.Apply(ctx, prog, o); err != nil {
				t.Fatalf("apply after the entry chain was flushed: %v", err)
			}
			netnstest.Exec(t, lab.FW, "iptables-"+fl, "-w", "-t", "mangle", "-F", "PREROUTING")
			if found, err := ipt.Flush(ctx, "mytable", ipt.Options{NetNS: lab.FW}); err != nil || !found {
				t.Fatalf("flush after the hook was flushed: %v, %v", found, err)
			}
			if now := save(); strings.TrimSpace(now) != "" {
				t.Errorf("after flush:\n%s", now)
			}
		})
	}
}
