package nft

// Kernel tests: each creates its own network namespaces (ipf-nft-*) and
// removes them, also on failure. netnstest.Kernel gates them: they skip
// under -short or when not root, and fail instead when CI=true.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/backend/nft/nfttest"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
)

// newNetns creates a network namespace for t and removes it when t ends.
// Its loopback is up.
func newNetns(t testing.TB) string {
	t.Helper()
	netnstest.Kernel(t, "ip", "nft")
	name := fmt.Sprintf("ipf-nft-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	// An open descriptor marks the namespace as in use, so that a sweep of
	// stale ipf-* namespaces (internal/netns) running in parallel keeps it.
	hold, err := os.Open("/run/netns/" + name)
	t.Cleanup(func() {
		if hold != nil {
			hold.Close()
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	if err != nil {
		t.Fatalf("holding namespace %s: %v", name, err)
	}
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nft runs nft in namespace ns with stdin and returns its standard output.
func nft(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nft %s in %s: %v\n%s", strings.Join(args, " "), ns, err, stderr.String())
	}
	return stdout.String()
}

func loadScript(t testing.TB, ns, script string) {
	t.Helper()
	nft(t, ns, script, "-f", "-")
}

func mustApply(t testing.TB, p *Program, ns string) ApplyResult {
	t.Helper()
	res, err := Apply(context.Background(), p, ApplyOptions{NetNS: ns})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

// normalizedJSON is `nft -j list ruleset` of ns, normalized
// (nfttest.Ruleset): equal for equal rulesets. Keys named in drop are
// removed from every object.
func normalizedJSON(t testing.TB, ns string, drop ...string) string {
	t.Helper()
	return nfttest.Text(nfttest.Ruleset(t, ns, drop...))
}

// kernelObjects is what the kernel holds of table ipfence, decoded by
// google/nftables: chains, rules as expressions, sets with their flags and
// (sorted) elements.
//
// Anonymous sets (a rule's "{ 22, 80-90 }") are renamed anon0, anon1, ...
// in the order rules use them, and listed after the named sets in that
// order: the kernel names them __set%d and lists them as they were
// created, which differs once some rules were replaced.
type kernelObjects struct {
	Table  string // the table's userdata, quoted (its comment)
	Chains []string
	Rules  map[string][]string
	Sets   []string
	Elems  map[string][]string
}

func readKernel(t testing.TB, ns, table string) kernelObjects {
	t.Helper()
	c, closeConn, _, err := dial(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
	tb, err := c.ListTableOfFamily(table, nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	ko := kernelObjects{Table: fmt.Sprintf("%q", tb.UserData), Rules: map[string][]string{}, Elems: map[string][]string{}}
	sets, err := c.GetSets(tb)
	if err != nil {
		t.Fatal(err)
	}
	anon := map[string]string{} // kernel name -> anonN
	for _, s := range sets {
		if s.Anonymous {
			anon[s.Name] = ""
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		ko.Chains = append(ko.Chains, fmt.Sprintf("%s type=%q hook=%v prio=%v policy=%v",
			ch.Name, ch.Type, deref(ch.Hooknum), deref(ch.Priority), deref(ch.Policy)))
		rules, err := c.GetRules(tb, ch)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			var parts []string
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok {
					cp := *l
					cp.SetID = 0 // allocated per transaction, not part of the result
					if name, ok := anon[cp.SetName]; ok {
						if name == "" {
							name = fmt.Sprintf("anon%d", len(ko.Sets))
							anon[cp.SetName] = name
							ko.Sets = append(ko.Sets, name) // the order of use, for now
						}
						cp.SetName = name
					}
					e = &cp
				}
				parts = append(parts, fmt.Sprintf("%T%+v", e, e))
			}
			ko.Rules[ch.Name] = append(ko.Rules[ch.Name], fmt.Sprintf("%s udata=%q", strings.Join(parts, " "), r.UserData))
		}
	}
	used := ko.Sets
	ko.Sets = nil
	anonSets := make([]string, len(used))
	for _, s := range sets {
		name := s.Name
		if s.Anonymous {
			if name = anon[s.Name]; name == "" {
				name = "unused " + s.Name
			}
		}
		desc := fmt.Sprintf("%s anon=%v const=%v interval=%v map=%v timeout=%v key=%s/%d data=%s/%d size=%d comment=%q merge=%v",
			name, s.Anonymous, s.Constant, s.Interval, s.IsMap, s.HasTimeout, s.KeyType.Name, s.KeyType.Bytes,
			s.DataType.Name, s.DataType.Bytes, s.Size, s.Comment, s.AutoMerge)
		if i := slices.Index(used, name); i >= 0 {
			anonSets[i] = desc
		} else {
			ko.Sets = append(ko.Sets, desc)
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		var es []string
		for _, e := range elems {
			es = append(es, fmt.Sprintf("%x end=%v open=%v val=%x verdict=%+v timeout=%v", e.Key, e.IntervalEnd, e.IntervalOpen, e.Val, e.VerdictData, e.Timeout))
		}
		slices.Sort(es)
		ko.Elems[name] = es
	}
	ko.Sets = append(ko.Sets, anonSets...)
	return ko
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// compareNamespaces checks that namespaces a and b hold the same ruleset:
// the same `nft -t list ruleset` text, the same JSON listing (elements
// sorted), and the same objects and expressions read over netlink.
// Keys named in drop are left out of the JSON comparison ("handle": rules
// replaced by an Update get new ones).
func compareNamespaces(t *testing.T, a, b string, drop ...string) {
	t.Helper()
	ta, tb := nft(t, a, "", "-t", "list", "ruleset"), nft(t, b, "", "-t", "list", "ruleset")
	if ta != tb {
		t.Errorf("nft -t list ruleset differs (netlink vs nft -f):\n%s", lineDiff(tb, ta))
	}
	if ja, jb := normalizedJSON(t, a, drop...), normalizedJSON(t, b, drop...); ja != jb {
		t.Errorf("nft -j list ruleset differs (netlink vs nft -f):\n%s", lineDiff(jb, ja))
	}
	ka, kb := readKernel(t, a, "ipfence"), readKernel(t, b, "ipfence")
	if ka.Table != kb.Table {
		t.Errorf("table userdata differs:\nnetlink %s\nnft -f  %s", ka.Table, kb.Table)
	}
	if !reflect.DeepEqual(ka.Chains, kb.Chains) {
		t.Errorf("chains differ:\nnetlink %q\nnft -f  %q", ka.Chains, kb.Chains)
	}
	for ch, rs := range kb.Rules {
		if got := ka.Rules[ch]; !reflect.DeepEqual(got, rs) {
			t.Errorf("rules of chain %s differ:\nnetlink %s\nnft -f  %s", ch, strings.Join(got, "\n        "), strings.Join(rs, "\n        "))
		}
	}
	if len(ka.Rules) != len(kb.Rules) {
		t.Errorf("%d chains with rules over netlink, %d with nft -f", len(ka.Rules), len(kb.Rules))
	}
	if !reflect.DeepEqual(ka.Sets, kb.Sets) {
		t.Errorf("sets differ:\nnetlink %s\nnft -f  %s", strings.Join(ka.Sets, "\n        "), strings.Join(kb.Sets, "\n        "))
	}
	for s, es := range kb.Elems {
		if got := ka.Elems[s]; !reflect.DeepEqual(got, es) {
			t.Errorf("elements of set %s differ:\nnetlink %s\nnft -f  %s", s, strings.Join(got, "\n        "), strings.Join(es, "\n        "))
		}
	}
}

// TestDifferential loads each Program over netlink in one namespace and
// with `nft -f` of Render in another, and compares what the kernel holds.
func TestDifferential(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft")
	iif := minimalProgram()
	iif.Chains[0].Rules = append([]Rule{{Iif: "ipfdummy0", Verdict: Verdict{Kind: Drop}, Comment: "second interface"}}, iif.Chains[0].Rules...)
	for _, tc := range []struct {
		name  string
		p     *Program
		setup func(t *testing.T, ns string)
	}{
		{name: "shapes", p: shapesProgram()},
		{name: "minimal", p: minimalProgram()},
		{name: "empty", p: &Program{Table: "ipfence"}},
		{name: "generated", p: generatedProgram(7, 300, 12, 8)},
		{name: "iif", p: iif, setup: func(t *testing.T, ns string) {
			run(t, "ip", "-n", ns, "link", "add", "ipfdummy0", "type", "veth", "peer", "name", "ipfdummy1")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newNetns(t), newNetns(t)
			if tc.setup != nil {
				tc.setup(t, a)
				tc.setup(t, b)
			}
			res := mustApply(t, tc.p, a)
			loadScript(t, b, Render(tc.p))
			compareNamespaces(t, a, b)
			if res.Elements != programElements(tc.p) || res.Sets != len(tc.p.Sets) || res.Chains != len(tc.p.Chains) {
				t.Errorf("ApplyResult counts %+v, program has %d sets, %d elements, %d chains",
					res, len(tc.p.Sets), programElements(tc.p), len(tc.p.Chains))
			}

			// What nft lists after Apply loads back as the same ruleset
			// (an operator's "nft list ruleset > saved" works). Handles
			// differ, and nft adds a family check it had left implicit
			// in the listing (icmpv6 type), so only the listings compare.
			c := newNetns(t)
			if tc.setup != nil {
				tc.setup(t, c)
			}
			loadScript(t, c, nft(t, a, "", "list", "table", "inet", "ipfence"))
			if la, lc := normalizedJSON(t, a, "handle"), normalizedJSON(t, c, "handle"); la != lc {
				t.Errorf("nft -j list ruleset differs after loading it back:\n%s", lineDiff(la, lc))
			}

			// Loading again over an existing table replaces it, both ways.
			mustApply(t, tc.p, a)
			loadScript(t, b, Render(tc.p))
			compareNamespaces(t, a, b)
		})
	}
}

// TestListing checks what `nft list` shows after Apply: the terse listing
// against a golden file, and every set's elements against the Program.
func TestListing(t *testing.T) {
	ns := newNetns(t)
	p := shapesProgram()
	mustApply(t, p, ns)
	golden(t, "shapes.list", nft(t, ns, "", "-t", "list", "ruleset"))

	for _, s := range p.Sets {
		kind := "set"
		if s.IsMap {
			kind = "map"
		}
		got := nfttest.Elements(t, ns, kind, "inet", "ipfence", s.Name)
		var want []string
		for _, e := range s.Elems.All() {
			k := e.Key.Masked()
			w := k.Addr().String()
			switch {
			case s.Key == KeyWords:
				w = string(appendWords(nil, k))
			case s.Key == KeyHalf:
				w = string(appendHalf(nil, k))
			case s.Interval && k.Bits() != k.Addr().BitLen():
				w = k.String()
			}
			if e.Timeout > 0 {
				w += fmt.Sprintf(" timeout %vs", e.Timeout.Seconds())
			}
			if s.IsMap {
				w += " : " + string(appendVerdict(nil, e.Verdict))
			}
			want = append(want, w)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s %s: nft lists %q, program has %q", kind, s.Name, got, want)
		}
	}
}

func TestApplyTwiceReplacesAndFlushRemoves(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	first := mustApply(t, shapesProgram(), ns)
	once := nft(t, ns, "", "-t", "list", "ruleset")
	second := mustApply(t, shapesProgram(), ns)
	if twice := nft(t, ns, "", "-t", "list", "ruleset"); twice != once {
		t.Errorf("second Apply changed the ruleset:\n%s", lineDiff(once, twice))
	}
	if first.Rules != second.Rules || first.Chains != second.Chains {
		t.Errorf("ApplyResult differs between runs: %+v vs %+v", first, second)
	}
	// A different program replaces the table entirely.
	mustApply(t, minimalProgram(), ns)
	loaded := nft(t, ns, "", "-t", "list", "ruleset")
	other := newNetns(t)
	loadScript(t, other, Render(minimalProgram()))
	if want := nft(t, other, "", "-t", "list", "ruleset"); loaded != want {
		t.Errorf("Apply of a smaller program left extra objects:\n%s", lineDiff(want, loaded))
	}

	existed, err := Flush(ctx, "ipfence", ApplyOptions{NetNS: ns})
	if err != nil || !existed {
		t.Fatalf("Flush = %v, %v; want true, nil", existed, err)
	}
	if out := nft(t, ns, "", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("ruleset after Flush:\n%s", out)
	}
	existed, err = Flush(ctx, "ipfence", ApplyOptions{NetNS: ns})
	if err != nil || existed {
		t.Errorf("second Flush = %v, %v; want false, nil", existed, err)
	}
}

func TestFlushLeavesOtherTables(t *testing.T) {
	ns := newNetns(t)
	others := `table inet other {
	chain c {
		type filter hook input priority 0; policy accept;
		counter
	}
}
table ip ipfence {
	chain c {
		counter
	}
}
`
	loadScript(t, ns, others)
	before := nft(t, ns, "", "list", "ruleset")
	mustApply(t, shapesProgram(), ns)
	existed, err := Flush(context.Background(), "ipfence", ApplyOptions{NetNS: ns})
	if err != nil || !existed {
		t.Fatalf("Flush = %v, %v; want true, nil", existed, err)
	}
	if after := nft(t, ns, "", "list", "ruleset"); after != before {
		t.Errorf("Flush touched other tables:\n%s", lineDiff(before, after))
	}
}

// TestRejectedApplyChangesNothing hands the kernel programs it must
// refuse and checks that the table loaded before is untouched.
func TestRejectedApplyChangesNothing(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	mustApply(t, shapesProgram(), ns)
	before := normalizedJSON(t, ns)

	// A jump loop reachable from the base chain passes Validate; the
	// kernel finds it when it validates the table at commit.
	loop := shapesProgram()
	loop.Chains = append([]*Chain{
		{Name: "loop_a", Rules: []Rule{{Verdict: Verdict{Kind: Jump, Chain: "loop_b"}}}},
		{Name: "loop_b", Rules: []Rule{{Counter: true, Verdict: Verdict{Kind: Jump, Chain: "loop_a"}}}},
	}, loop.Chains...)
	pre := loop.Chains[len(loop.Chains)-1]
	pre.Rules = append(pre.Rules, Rule{Family: IPv4, Verdict: Verdict{Kind: Jump, Chain: "loop_a"}})
	// A set defined twice with different key types (the kernel takes a
	// second identical definition as a no-op "add").
	dupSet := shapesProgram()
	dupSet.Sets = append(dupSet.Sets, &Set{Name: "host4", Family: IPv6, KeyBits: 128})
	missingSet := shapesProgram()
	missingSet.Chains[4].Rules[6].Lookup.Set = "nope"

	for _, tc := range []struct {
		name     string
		p        *Program
		validate bool
		want     string
	}{
		{"jump loop", loop, true, "kernel rejected the transaction"},
		{"duplicate set", dupSet, false, "kernel rejected the transaction"},
		{"missing set", missingSet, false, "kernel rejected the transaction"},
		{"duplicate set (validated)", dupSet, true, "set host4: defined twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := apply(ctx, tc.p, ApplyOptions{NetNS: ns}, tc.validate)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply error = %v, want one containing %q", err, tc.want)
			}
			t.Logf("error: %v", err)
			if after := normalizedJSON(t, ns); after != before {
				t.Errorf("rejected Apply changed the ruleset:\n%s", lineDiff(before, after))
			}
		})
	}
}

func TestConcurrentChange(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	mustApply(t, minimalProgram(), ns)
	before := nft(t, ns, "", "-t", "list", "table", "inet", "ipfence")

	testHookBeforeFlush = func() { loadScript(t, ns, "table inet intruder {}\n") }
	t.Cleanup(func() { testHookBeforeFlush = nil })
	_, err := Apply(ctx, shapesProgram(), ApplyOptions{NetNS: ns})
	var ce *ConcurrentChangeError
	if !errors.As(err, &ce) {
		t.Fatalf("Apply with a concurrent edit = %v, want *ConcurrentChangeError", err)
	}
	t.Logf("error: %v", err)
	if ce.Now <= ce.GenID {
		t.Errorf("ConcurrentChangeError generations %d -> %d, want an increase", ce.GenID, ce.Now)
	}
	if after := nft(t, ns, "", "-t", "list", "table", "inet", "ipfence"); after != before {
		t.Errorf("table changed despite the conflict:\n%s", lineDiff(before, after))
	}
	testHookBeforeFlush = nil
	mustApply(t, shapesProgram(), ns)
	if out := nft(t, ns, "", "list", "tables"); !strings.Contains(out, "intruder") {
		t.Errorf("the concurrent edit is gone:\n%s", out)
	}
}

func TestMissingInterface(t *testing.T) {
	ns := newNetns(t)
	p := minimalProgram()
	p.Chains[0].Rules[0].Iif = "ipfnothere0"
	_, err := Apply(context.Background(), p, ApplyOptions{NetNS: ns})
	if err == nil || !strings.Contains(err.Error(), `interface "ipfnothere0" (iif) does not exist in network namespace `+ns) {
		t.Fatalf("Apply = %v, want a missing-interface error", err)
	}
}

func TestMissingNamespace(t *testing.T) {
	netnstest.Kernel(t, "ip", "nft")
	_, err := Apply(context.Background(), minimalProgram(), ApplyOptions{NetNS: "ipf-nft-does-not-exist"})
	if !errors.Is(err, netns.ErrNotFound) || !strings.Contains(err.Error(), "ipf-nft-does-not-exist") {
		t.Fatalf("Apply = %v, want a missing-namespace error", err)
	}
}

// inNetns runs fn on an OS thread switched into namespace ns. The thread
// is never unlocked, so it exits with the goroutine instead of returning
// to the pool in the wrong namespace.
func inNetns(t testing.TB, ns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestStatus(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	st, err := Status(ctx, "ipfence", ns)
	if err != nil || st.Exists {
		t.Fatalf("Status of a missing table = %+v, %v; want Exists false, no error", st, err)
	}

	p := shapesProgram()
	mustApply(t, p, ns)
	st, err = Status(ctx, "ipfence", ns)
	if err != nil || !st.Exists {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	var chains []string
	for _, c := range st.Chains {
		chains = append(chains, c.Name)
	}
	if want := []string{"v4_10_2", "v6_2001_db9", "blocked", "services", "pre", "w6_2001_db8", "w6_deep"}; !slices.Equal(chains, want) {
		t.Errorf("chains %q, want %q", chains, want)
	}
	pre := st.Chains[4]
	if pre.Hook != "prerouting" || pre.Priority != -300 || len(pre.Rules) != len(p.Chains[4].Rules) {
		t.Errorf("chain pre: %+v", pre)
	}
	for i, r := range pre.Rules {
		want := p.Chains[4].Rules[i]
		if r.Comment != want.Comment || r.HasCounter != want.Counter || r.Packets != 0 || r.Handle == 0 {
			t.Errorf("pre rule %d: %+v, want comment %q counter %v and no packets", i, r, want.Comment, want.Counter)
		}
	}
	var sets []string
	for _, s := range st.Sets {
		sets = append(sets, fmt.Sprintf("%s %s map=%v %v size=%d %q", s.Name, s.Family, s.IsMap, s.Flags, s.Size, s.Comment))
	}
	want := []string{
		`v4_16 ipv4 map=true [] size=16 "blocklist v4 by /16"`,
		`v4_10_2_24 ipv4 map=true [] size=16 ""`,
		`v6_32 ipv6 map=true [] size=16 ""`,
		`v6_2001_db9_48 ipv6 map=true [] size=16 ""`,
		`host4 ipv4 map=false [] size=16 ""`,
		`allow4 ipv4 map=false [interval] size=0 "allowlist"`,
		`allow6 ipv6 map=false [interval] size=0 ""`,
		`empty6 ipv6 map=false [interval] size=0 ""`,
		`w6_24 ipv6 map=true [] size=16 "one word"`,
		`w6_2001_db8_40 ipv6 map=true [] size=16 ""`,
		`w6_72 ipv6 map=true [] size=16 ""`,
		`w6_128 ipv6 map=false [] size=16 ""`,
		`ban4 ipv4 map=false [timeout] size=0 "bans"`,
		`bannet6 ipv6 map=false [interval timeout] size=0 ""`,
		`bannet4_empty ipv4 map=false [interval timeout] size=0 ""`,
		`half4 ipv4 map=false [] size=16 "bitmap"`,
	}
	if !slices.Equal(sets, want) {
		t.Errorf("sets:\n%s\nwant:\n%s", strings.Join(sets, "\n"), strings.Join(want, "\n"))
	}

	// Counters: three datagrams over loopback pass the base chain once each.
	mustApply(t, minimalProgram(), ns)
	inNetns(t, ns, func() error {
		l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return err
		}
		defer l.Close()
		c, err := net.DialUDP("udp4", nil, l.LocalAddr().(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer c.Close()
		for range 3 {
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
		}
		return nil
	})
	st, err = Status(ctx, "ipfence", ns)
	if err != nil {
		t.Fatal(err)
	}
	r := st.Chains[0].Rules[0]
	if !r.HasCounter || r.Packets != 3 || r.Bytes != 3*(20+8+5) || r.Comment != "all" {
		t.Errorf("counter rule after 3 datagrams: %+v, want 3 packets, %d bytes", r, 3*(20+8+5))
	}
}

// largeProgram is the size the backend is built for: about 200k elements
// across maps and a few thousand chains.
func largeProgram() *Program { return generatedProgram(11, 2000, 100, 100) }

// TestApplyLarge loads a 200k-element program and checks that it is all
// there; it logs the timings (the target lives in BenchmarkApply).
func TestApplyLarge(t *testing.T) {
	ns := newNetns(t)
	p := largeProgram()
	res := mustApply(t, p, ns)
	t.Logf("applied %d elements in %d sets, %d chains, %d rules: build %v, flush %v",
		res.Elements, res.Sets, res.Chains, res.Rules, res.Build, res.Flush)
	res = mustApply(t, p, ns)
	t.Logf("replaced: build %v, flush %v", res.Build, res.Flush)

	start := time.Now()
	st, err := Status(context.Background(), "ipfence", ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Status read %d chains and %d sets in %v", len(st.Chains), len(st.Sets), time.Since(start))
	if len(st.Chains) != len(p.Chains) || len(st.Sets) != len(p.Sets) {
		t.Errorf("Status: %d chains, %d sets; want %d, %d", len(st.Chains), len(st.Sets), len(p.Chains), len(p.Sets))
	}
	// Spot-check one map's elements in the kernel.
	s := p.Sets[len(p.Sets)/2]
	if n := len(nfttest.Elements(t, ns, "map", "inet", "ipfence", s.Name)); n != s.Elems.Len() {
		t.Errorf("map %s: %d elements in the kernel, want %d", s.Name, n, s.Elems.Len())
	}
}

// BenchmarkApply measures one Apply (replace) of programs of the target
// size: go test -run XXX -bench Apply ./internal/backend/nft (as root).
func BenchmarkApply(b *testing.B) {
	for _, bc := range []struct {
		name string
		p    *Program
	}{
		{"200k_elements_2000_chains", largeProgram()},
		{"200k_elements_200_chains", generatedProgram(12, 200, 1200, 1200)},
		{"1M_elements_2000_chains", generatedProgram(13, 2000, 500, 500)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ns := newNetns(b)
			var build, flush time.Duration
			b.ReportAllocs()
			for b.Loop() {
				res, err := Apply(context.Background(), bc.p, ApplyOptions{NetNS: ns})
				if err != nil {
					b.Fatal(err)
				}
				build += res.Build
				flush += res.Flush
			}
			b.ReportMetric(float64(programElements(bc.p)), "elements")
			b.ReportMetric(float64(build.Milliseconds())/float64(b.N), "build-ms/op")
			b.ReportMetric(float64(flush.Milliseconds())/float64(b.N), "flush-ms/op")
		})
	}
}

// TestApplyUpdateMatchesApply: an Update of a loaded table leaves the
// kernel holding what Apply of the updated Program loads.
func TestApplyUpdateMatchesApply(t *testing.T) {
	a, b := newNetns(t), newNetns(t)
	mustApply(t, shapesProgram(), a)
	setOf := func(p *Program, name string) *Set {
		for _, s := range p.Sets {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no set %s", name)
		return nil
	}
	cur := shapesProgram()
	u := &Update{Table: "ipfence", Sets: []SetChange{
		{Set: setOf(cur, "ban4"),
			Add: []Elem{{Key: pfx("198.51.100.30/32"), Timeout: time.Minute}, {Key: pfx("198.51.100.20/32"), Timeout: 5 * time.Hour}},
			Del: []Elem{{Key: pfx("198.51.100.20/32")}, {Key: pfx("198.51.100.22/32")}, {Key: pfx("198.51.100.99/32")}}},
		{Set: setOf(cur, "bannet4_empty"),
			Add: []Elem{{Key: pfx("192.0.2.0/25"), Timeout: time.Hour}, {Key: pfx("192.0.2.128/25")}}},
		{Set: setOf(cur, "bannet6"),
			Add: []Elem{{Key: pfx("2001:db8:aa::/48"), Timeout: 7 * time.Hour}},
			Del: []Elem{{Key: pfx("2001:db8:aa::/48")}, {Key: pfx("2001:db8:b0::/44")}}},
		{Set: setOf(cur, "allow4")}, {Set: setOf(cur, "allow6")}, {Set: setOf(cur, "host4")},
		{Set: setOf(cur, "v4_16")}, {Set: setOf(cur, "v6_32")}, {Set: setOf(cur, "w6_24")}, {Set: setOf(cur, "empty6")},
		{Set: setOf(cur, "half4")},
	}}
	want := shapesProgram()
	ban4 := setOf(want, "ban4")
	ban4.Elems = ElemsOf(Elem{Key: pfx("198.51.100.20/32"), Timeout: 5 * time.Hour}, Elem{Key: pfx("198.51.100.21/32")}, Elem{Key: pfx("198.51.100.30/32"), Timeout: time.Minute})
	setOf(want, "bannet4_empty").Elems = ElemsOf(Elem{Key: pfx("192.0.2.0/25"), Timeout: time.Hour}, Elem{Key: pfx("192.0.2.128/25")})
	setOf(want, "bannet6").Elems = ElemsOf(Elem{Key: pfx("2001:db8:aa::/48"), Timeout: 7 * time.Hour}, Elem{Key: pfx("2001:db8:ab::/48"), Timeout: 3*24*time.Hour + 90*time.Second})
	// The base chain loses its port rules and the NDP rule.
	for _, c := range want.Chains {
		if c.Name == "pre" {
			c.Rules = slices.DeleteFunc(c.Rules, func(r Rule) bool { return len(r.Ports) > 0 || r.NDP })
			u.Chains = append(u.Chains, c)
		}
	}
	res, err := ApplyUpdate(context.Background(), u, ApplyOptions{NetNS: a})
	if err != nil {
		t.Fatal(err)
	}
	if res.Added != 5 || res.Deleted != 5 {
		t.Errorf("UpdateResult %+v, want 5 added, 5 deleted", res)
	}
	mustApply(t, want, b)
	compareNamespaces(t, a, b, "handle")

	// A missing set fails the whole update, which changes nothing.
	before := normalizedJSON(t, a)
	bad := &Update{Table: "ipfence", Sets: []SetChange{
		{Set: ban4, Add: []Elem{{Key: pfx("198.51.100.40/32")}}},
		{Set: &Set{Name: "nope", Family: IPv4, KeyBits: 32, Timeout: true}, Add: []Elem{{Key: pfx("198.51.100.41/32")}}},
	}}
	if _, err := ApplyUpdate(context.Background(), bad, ApplyOptions{NetNS: a}); !errors.Is(err, unix.ENOENT) {
		t.Errorf("update of a missing set: %v, want ENOENT", err)
	}
	if after := normalizedJSON(t, a); after != before {
		t.Errorf("a rejected update changed the kernel:\n%s", lineDiff(before, after))
	}
}
