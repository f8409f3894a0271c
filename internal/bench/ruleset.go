package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/pktgen"
)

// A Loader installs a ruleset into lab's firewall namespace and returns
// how to remove it again. Scenarios load one ruleset at a time into an
// otherwise empty namespace, so a Loader's unload may clear everything of
// its kind there (all nft tables, all ipsets).
type Loader func(ctx context.Context, lab *netns.Lab) (unload func() error, err error)

// NFTProgram loads an ipfence program the way ipfence does (nft.Apply: one
// netlink transaction).
func NFTProgram(p *nft.Program) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		if _, err := nft.Apply(ctx, p, nft.ApplyOptions{NetNS: lab.FW}); err != nil {
			return nil, err
		}
		return func() error {
			_, err := nft.Flush(context.WithoutCancel(ctx), p.Table, nft.ApplyOptions{NetNS: lab.FW})
			return err
		}, nil
	}
}

// IPTBackend loads a program of ipfence's ipset or iptables-split
// backend as ipfence does (ipt.Apply), with the iptables flavour given.
func IPTBackend(p *ipt.Program, flavour string) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		o := ipt.Options{NetNS: lab.FW, Flavour: flavour}
		if _, err := ipt.Apply(ctx, p, o); err != nil {
			return nil, err
		}
		return func() error {
			_, err := ipt.Flush(context.WithoutCancel(ctx), p.Prefix, o)
			return err
		}, nil
	}
}

// NFTScript loads an nft script with `nft -f`; unloading flushes the whole
// ruleset of the namespace.
func NFTScript(script string) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		if err := runWithFile(lab.FW, script, "nft", "-f"); err != nil {
			return nil, err
		}
		return func() error { return run(lab.FW, "nft", "flush", "ruleset") }, nil
	}
}

// IPTables loads an iptables-restore text with the "legacy" or the "nft"
// variant of iptables (iptables-legacy-restore, iptables-nft-restore);
// unloading restores every table the text names empty. Legacy tables stay
// registered in the namespace once loaded (see registerLegacy).
func IPTables(variant, text string) Loader { return xtables("iptables", variant, text) }

// IP6Tables is IPTables for IPv6 (ip6tables-legacy-restore,
// ip6tables-nft-restore).
func IP6Tables(variant, text string) Loader { return xtables("ip6tables", variant, text) }

func xtables(family, variant, text string) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		bin := family + "-" + variant + "-restore"
		if err := runWithFile(lab.FW, text, bin, "-w", "10"); err != nil {
			return nil, err
		}
		var empty strings.Builder
		for _, t := range tablesOf(text) {
			fmt.Fprintf(&empty, "*%s\nCOMMIT\n", t)
		}
		return func() error { return runWithFile(lab.FW, empty.String(), bin, "-w", "10") }, nil
	}
}

// tablesOf returns the tables ("*raw") an iptables-restore text names.
func tablesOf(text string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if t, ok := strings.CutPrefix(sc.Text(), "*"); ok && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// IPSet loads an `ipset restore` text; unloading destroys all sets (so
// unload the iptables rules that use them first: see All).
func IPSet(text string) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		if err := runWithFile(lab.FW, text, "ipset", "restore", "-file"); err != nil {
			return nil, err
		}
		return func() error { return run(lab.FW, "ipset", "destroy") }, nil
	}
}

// TC adds a clsact qdisc to the firewall's veth and runs each filter
// command (arguments to `tc filter add dev VETH ingress`); unloading
// deletes the qdisc.
func TC(filters ...[]string) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		unload := func() error { return run(lab.FW, "tc", "qdisc", "del", "dev", lab.FWIf, "clsact") }
		if err := run(lab.FW, "tc", "qdisc", "add", "dev", lab.FWIf, "clsact"); err != nil {
			return nil, err
		}
		for _, f := range filters {
			argv := append([]string{"tc", "filter", "add", "dev", lab.FWIf, "ingress"}, f...)
			if err := run(lab.FW, argv...); err != nil {
				return nil, errors.Join(err, unload())
			}
		}
		return unload, nil
	}
}

// All loads each loader in turn and unloads them in reverse order.
func All(loaders ...Loader) Loader {
	return func(ctx context.Context, lab *netns.Lab) (func() error, error) {
		var undo []func() error
		unload := func() error {
			var errs []error
			for _, u := range slices.Backward(undo) {
				errs = append(errs, u())
			}
			return errors.Join(errs...)
		}
		for _, l := range loaders {
			u, err := l(ctx, lab)
			if err != nil {
				return nil, errors.Join(err, unload())
			}
			undo = append(undo, u)
		}
		return unload, nil
	}
}

// run runs argv in namespace ns.
func run(ns string, argv ...string) error {
	_, err := netns.Exec(ns, argv...)
	return err
}

// runWithFile writes text to a temporary file and runs argv with the
// file's name appended, in namespace ns.
func runWithFile(ns, text string, argv ...string) error {
	f, err := os.CreateTemp("", "ipfence-bench-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the input of %s: %w", argv[0], err)
	}
	return run(ns, append(argv, f.Name())...)
}

// registerLegacy loads the legacy iptables and ip6tables tables named,
// empty, and leaves them: a legacy table stays registered in a namespace
// once loaded, so
// scenarios that use one register it before their warm-up round, and all
// rounds of all configs pass it alike.
func registerLegacy(ctx context.Context, lab *netns.Lab, tables ...string) error {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "*%s\nCOMMIT\n", t)
	}
	for _, load := range []Loader{IPTables("legacy", b.String()), IP6Tables("legacy", b.String())} {
		if _, err := load(ctx, lab); err != nil {
			return fmt.Errorf("registering the legacy tables %v: %w", tables, err)
		}
	}
	return nil
}

// legacyTableCost measures what an empty legacy raw table adds to each
// packet through prerouting: rounds of srcs' packets before registering
// it, then as many after (the overheads of legacy iptables configs exclude
// it, as their baseline passes the table too). It must run before any
// legacy table is loaded into lab.
func legacyTableCost(ctx context.Context, lab *netns.Lab, srcs []netip.Addr, rounds, n int) (float64, error) {
	var before, after []float64
	for _, to := range []*[]float64{&before, &after} {
		if to == &after {
			if err := registerLegacy(ctx, lab, "raw"); err != nil {
				return 0, err
			}
		}
		for range rounds + 1 {
			v, err := measure(lab, srcs, n, pktgen.MeasureOptions{Expect: pktgen.ExpectPass})
			if err != nil {
				return 0, fmt.Errorf("measuring the empty legacy table's cost: %w", err)
			}
			*to = append(*to, v)
		}
		*to = (*to)[1:] // warm-up
	}
	return Median(after) - Median(before), nil
}
