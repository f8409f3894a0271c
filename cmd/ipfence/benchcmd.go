package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/bench"
	"github.com/ipfence/ipfence/internal/netns"
)

// benchScenario is one scenario of `ipfence bench`: how many progress
// steps it takes and how to run it.
type benchScenario struct {
	name, about string
	steps       func(quick bool) int
	run         func(ctx context.Context, lab *netns.Lab, quick bool, p *bench.Progress) (bench.Report, error)
}

var benchScenarios = []benchScenario{
	{"scale", "the Red Hat nftables benchmark: SCALE 0..100, 10 non-matching entries per step, as iptables rules, nft rules, nft sets, ipset (addresses, ports, address.port pairs, chain jumps vs verdict maps); DDoS drops at each hook, tc and XDP",
		func(q bool) int { return bench.ScaleSteps(pick(q, bench.QuickScale, bench.FullScale)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.Scale(ctx, lab, pick(q, bench.QuickScale, bench.FullScale), p)
		}},
	{"geo", "real country data (50k-160k IPv4 prefixes) as an nft interval set, ipset hash:net, iptables chains split by /8 (legacy and nft), iptables linear, ipfence's layout, ipfence's XDP tables and an XDP LPM trie: per-packet cost for legitimate and blocked traffic, UDP and TCP latency, load time",
		func(q bool) int { return bench.GeoSteps(geoOptions(q)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.Geo(ctx, lab, geoOptions(q), p)
		}},
	{"http", "HTTP GETs of 10 KiB from a host outside a block list growing to 50k prefixes (iptables linear, ipset, nft set, ipfence), split into connect / send / first byte / complete; 400 clients x 4 ports as 1,600 accept rules vs a set and 4 rules at 750 requests/s",
		func(q bool) int { return bench.HTTPSteps(pick(q, bench.QuickHTTP, bench.FullHTTP)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.HTTP(ctx, lab, pick(q, bench.QuickHTTP, bench.FullHTTP), p)
		}},
	{"server", "a real server behind \"allow only Europe\" (examples/europe.yaml) in namespaces: its DNS round trip and HTTP fetch to a blocked country, an interactive round trip from an allowed one, through no firewall, a plain nft interval set and ipfence; per packet with conntrack: established, new allowed and blocked new connections",
		func(q bool) int { return bench.ServerSteps(pick(q, bench.QuickServer, bench.FullServer)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.Server(ctx, lab, pick(q, bench.QuickServer, bench.FullServer), p)
		}},
	{"control", "nft sets' control plane: a ban into hash and interval sets of 0 to 1M elements with 1 and 8 writers; loading a set; counting by listing; bulk inserts by transaction size",
		func(q bool) int { return bench.ControlSteps(pick(q, bench.QuickControl, bench.FullControl)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.Control(ctx, lab, pick(q, bench.QuickControl, bench.FullControl), p.Step)
		}},
	{"footprint", "memory and CPU of ipfence compile, apply, daemon load, a 1% feed refresh and bans (each step a process of its own: peak and idle RSS, CPU seconds) for a synthetic threat feed of 10k to 1M lines, beside nft -f and ipset restore of the same feed",
		func(q bool) int { return bench.FootprintSteps(footprintOptions(q)) },
		func(ctx context.Context, lab *netns.Lab, q bool, p *bench.Progress) (bench.Report, error) {
			return bench.Footprint(ctx, lab, footprintOptions(q), p)
		}},
}

// footprintBinary is the ipfence that bench footprint measures ("": this
// one); tests set the binary they built.
var footprintBinary string

// footprintLines, footprintBans and footprintRounds, when set, narrow
// the footprint scenario.
var (
	footprintLines, footprintBans []int
	footprintRounds               int
	footprintPolicies             []string
	footprintPolicyData           []bench.FootprintPolicy // read by readFootprintPolicies
)

// readFootprintPolicies reads the files of --footprint-policy, before any
// scenario runs.
func readFootprintPolicies() error {
	footprintPolicyData = nil
	for _, path := range footprintPolicies {
		abs, err := filepath.Abs(path)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err != nil {
			return usageError{fmt.Errorf("--footprint-policy: %w", err)}
		}
		footprintPolicyData = append(footprintPolicyData, bench.FootprintPolicy{Name: filepath.Base(path), Path: abs})
	}
	return nil
}

func footprintOptions(quick bool) bench.FootprintOptions {
	o := pick(quick, bench.QuickFootprint, bench.FullFootprint)
	o.Binary = footprintBinary
	if footprintLines != nil {
		o.Lines = footprintLines
	}
	if footprintBans != nil {
		o.Bans = footprintBans
	}
	if footprintRounds > 0 {
		o.Rounds = footprintRounds
	}
	if footprintPolicies != nil {
		o.Policies = footprintPolicyData
	}
	return o
}

// geoConfigs and geoSets, when set (--geo-configs, --geo-sets), narrow
// the geo scenario.
var geoConfigs, geoSets []string

// checkGeoFlags says which of --geo-configs and --geo-sets name nothing
// the geo scenario has, before any scenario runs.
func checkGeoFlags(quick bool) error {
	for _, c := range geoConfigs {
		if !slices.Contains(bench.GeoConfigs, c) {
			return usageError{fmt.Errorf("--geo-configs: unknown config %q (have: %s)", c, strings.Join(bench.GeoConfigs, ", "))}
		}
	}
	sets := pick(quick, bench.QuickGeo, bench.FullGeo).Sets
	for _, name := range geoSets {
		if !slices.ContainsFunc(sets, func(s bench.GeoSet) bool { return s.Name == name }) {
			var have []string
			for _, s := range sets {
				have = append(have, strconv.Quote(s.Name))
			}
			return usageError{fmt.Errorf("--geo-sets: no country set %q in this run (have: %s; give the flag once per set)", name, strings.Join(have, ", "))}
		}
	}
	return nil
}

// geoOptions are the geo scenario's options, narrowed by the flags.
func geoOptions(quick bool) bench.GeoOptions {
	o := pick(quick, bench.QuickGeo, bench.FullGeo)
	if geoConfigs != nil {
		o.Configs = geoConfigs
	}
	if geoSets != nil {
		var sets []bench.GeoSet
		for _, s := range o.Sets {
			if slices.Contains(geoSets, s.Name) {
				sets = append(sets, s)
			}
		}
		o.Sets = sets
	}
	return o
}

func pick[T any](quick bool, q, full T) T {
	if quick {
		return q
	}
	return full
}

func findScenario(name string) (benchScenario, bool) {
	i := slices.IndexFunc(benchScenarios, func(s benchScenario) bool { return s.name == name })
	if i < 0 {
		return benchScenario{}, false
	}
	return benchScenarios[i], true
}

func newBenchCmd(g *globals) *cobra.Command {
	var quick bool
	var out string
	var names []string
	var about strings.Builder
	for _, s := range benchScenarios {
		names = append(names, s.name)
		fmt.Fprintf(&about, "  %-8s %s\n", s.name, s.about)
	}
	c := &cobra.Command{
		Use:   "bench SCENARIO... [--quick] [--out DIR]",
		Short: "Reproduce firewall benchmarks on this kernel, in network namespaces of its own",
		Long: `Bench runs benchmark scenarios in network namespaces it creates and removes
(also on Ctrl-C), with traffic it generates itself; the host's own firewall and
addresses are never touched. Each scenario writes results.json, results.csv,
report.md and its plots (SVG and PNG, median with min-max error bars) into
DIR/SCENARIO; "all" runs every scenario. A progress line per step shows what
runs, how much is done and an estimate of the time left.

Scenarios:
` + about.String() + `
--quick is a smoke run of the same code paths (seconds to a minute per
scenario); full runs take tens of minutes and are for humans.`,
		Example: "  sudo ipfence bench scale geo --out ./bench\n  sudo ipfence bench all --quick",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkGeoFlags(quick); err != nil {
				return err
			}
			if err := readFootprintPolicies(); err != nil {
				return err
			}
			var run []benchScenario
			for _, a := range args {
				if a == "all" {
					run = benchScenarios
					break
				}
				s, ok := findScenario(a)
				if !ok {
					return usageError{fmt.Errorf("unknown scenario %q (have: %s, all)", a, strings.Join(names, ", "))}
				}
				run = append(run, s)
			}
			total := 0
			for _, s := range run {
				total += s.steps(quick)
			}
			p := bench.NewProgress(cmd.ErrOrStderr(), total)
			results := map[string]any{}
			for _, s := range run {
				rep, err := runScenario(cmd.Context(), s, quick, p)
				if err != nil {
					return fmt.Errorf("bench %s: %w", s.name, err)
				}
				dir := filepath.Join(out, s.name)
				files, err := writeBenchOut(dir, rep)
				if err != nil {
					return fmt.Errorf("writing the results of %s: %w", s.name, err)
				}
				results[s.name] = rep
				if !g.json {
					fmt.Fprint(cmd.OutOrStdout(), rep.Markdown())
					fmt.Fprintf(cmd.OutOrStdout(), "\n(%s: %s)\n\n", dir, strings.Join(files, ", "))
				}
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), results)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&quick, "quick", false, "small sizes and few rounds: a smoke run")
	c.Flags().StringVar(&out, "out", "ipfence-bench", "folder for each scenario's results, report and plots")
	c.Flags().IntSliceVar(&footprintLines, "footprint-lines", nil, "footprint: only these feed sizes, in lines (e.g. 400000)")
	c.Flags().IntSliceVar(&footprintBans, "footprint-bans", nil, "footprint: these ban counts (0 first: the daemon without bans; 0 alone: no ban step)")
	c.Flags().IntVar(&footprintRounds, "footprint-rounds", 0, "footprint: runs of each row (medians are reported)")
	c.Flags().StringArrayVar(&footprintPolicies, "footprint-policy", nil, "footprint: measure the daemon's load of this policy file instead of examples/europe.yaml (repeatable)")
	c.Flags().StringSliceVar(&geoConfigs, "geo-configs", nil, "geo: only these configs (e.g. ipfence,ipfence-ipset,ipset-hash-net)")
	c.Flags().StringArrayVar(&geoSets, "geo-sets", nil, "geo: only this country set, by name; repeat for more (e.g. --geo-sets \"8 in Europe\" --geo-sets \"6 countries, IPv6\")")
	return c
}

// runScenario runs s in a lab of its own, removed afterwards.
func runScenario(ctx context.Context, s benchScenario, quick bool, p *bench.Progress) (rep bench.Report, err error) {
	if _, err := netns.Sweep(); err != nil {
		return nil, err
	}
	lab, err := netns.NewLab(fmt.Sprintf("bench%d", os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := lab.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	return s.run(ctx, lab, quick, p)
}

// writeBenchOut writes a scenario's report into dir and returns the names
// of the files written.
func writeBenchOut(dir string, rep bench.Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	files := []string{"results.json", "results.csv", "report.md"}
	for i, data := range [][]byte{append(js, '\n'), []byte(rep.CSV()), []byte(rep.Markdown())} {
		if err := os.WriteFile(filepath.Join(dir, files[i]), data, 0o644); err != nil {
			return nil, err
		}
	}
	figs := rep.Figures()
	for _, name := range slices.Sorted(maps.Keys(figs)) {
		paths, err := figs[name].Write(dir, name)
		if err != nil {
			return nil, fmt.Errorf("plotting %s: %w", name, err)
		}
		for _, p := range paths {
			files = append(files, filepath.Base(p))
		}
	}
	return files, nil
}
