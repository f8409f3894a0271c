package apply

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/backend/ipt"
	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
	"github.com/ipfence/ipfence/internal/netns/netnstest"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/statedir"
)

// TestUnmarkedTable is the migration rule for tables without ipfence's
// mark (statedir.Applied.Vouches), in a lab namespace: a table an older
// ipfence loaded (its record written before the mark) is replaced and
// marked by the next apply, and can be flushed; the record vouches only
// for that table, and only until the next apply; a table no record
// vouches for is refused by apply and flush and left as it was.
func TestUnmarkedTable(t *testing.T) {
	lab := netnstest.New(t, "nft")
	ctx := context.Background()
	tg := &Target{NetNS: lab.FW, State: statedir.Dir{Path: t.TempDir()}}
	c := compileDrop(t, "ipfence")
	mustApply(t, tg, c)

	// An upgrade: the table and record an older ipfence left.
	unmark(t, lab.FW, "ipfence")
	oldRecord(t, tg)
	if st := status(t, tg, "ipfence"); !st.Exists || st.Marked {
		t.Fatalf("the older ipfence's table: exists %v, marked %v", st.Exists, st.Marked)
	}
	mustApply(t, tg, c)
	if st := status(t, tg, "ipfence"); !st.Marked {
		t.Error("the table is not marked after the apply that took it over")
	}
	if !tg.Previous().Marked {
		t.Error("the record of the apply that took the table over is not Marked")
	}

	// The record vouched once: an unmarked table of the name now is
	// someone else's.
	unmark(t, lab.FW, "ipfence")
	before := netnstest.Ruleset(t, lab.FW)
	if _, err := applyTo(tg, c); !errors.Is(err, nft.ErrNotOwned) {
		t.Errorf("apply over an unmarked table after the upgrade: %v, want ErrNotOwned", err)
	}
	if _, err := tg.Flush(ctx, "ipfence"); !errors.Is(err, nft.ErrNotOwned) {
		t.Errorf("flush of an unmarked table after the upgrade: %v, want ErrNotOwned", err)
	}
	if after := netnstest.Ruleset(t, lab.FW); after != before {
		t.Errorf("the unmarked table changed:\n%s", after)
	}

	// A flush after an upgrade removes the older ipfence's table.
	oldRecord(t, tg)
	if r, err := tg.Flush(ctx, "ipfence"); err != nil || !r.Table {
		t.Errorf("flush of the older ipfence's table: %+v, %v", r, err)
	}

	// A record of another table vouches for nothing here.
	netnstest.Exec(t, lab.FW, "nft", "add table inet mytable; add chain inet mytable input { type filter hook input priority 0; policy accept; }; add rule inet mytable input tcp dport 22 accept")
	mustApply(t, tg, c)
	oldRecord(t, tg)
	before = netnstest.Ruleset(t, lab.FW)
	if _, err := applyTo(tg, compileDrop(t, "mytable")); !errors.Is(err, nft.ErrNotOwned) {
		t.Errorf("apply over a foreign table: %v, want ErrNotOwned", err)
	}
	if _, err := tg.Flush(ctx, "mytable"); !errors.Is(err, nft.ErrNotOwned) {
		t.Errorf("flush of a foreign table: %v, want ErrNotOwned", err)
	}
	if after := netnstest.Ruleset(t, lab.FW); after != before {
		t.Errorf("the foreign table changed:\n%s", after)
	}
}

// TestUnmarkedChains is TestUnmarkedTable for the iptables backends:
// chains an older ipfence loaded (no mark) are taken over and marked
// when its record vouches, once; after that, and for a record of
// another table, unmarked chains of the name are refused.
func TestUnmarkedChains(t *testing.T) {
	lab := netnstest.New(t, "ipset", "iptables-nft-restore", "ip6tables-nft-restore")
	ctx := context.Background()
	tg := &Target{NetNS: lab.FW, State: statedir.Dir{Path: t.TempDir()}}
	c := compileDrop(t, "ipfence", plan.IPSet)
	mustApply(t, tg, c)
	save := func() string { return netnstest.Saved(t, lab.FW, "iptables-nft-save", "-t", "mangle") }
	if !strings.Contains(save(), ipt.Mark) {
		t.Fatalf("ipfence's chains are not marked:\n%s", save())
	}

	unmarkChains(t, lab.FW)
	oldRecord(t, tg)
	mustApply(t, tg, c)
	if !strings.Contains(save(), ipt.Mark) || !tg.Previous().Marked {
		t.Fatalf("the chains an older ipfence loaded are not marked after the apply that took them over:\n%s", save())
	}

	unmarkChains(t, lab.FW)
	before := save()
	if _, err := applyTo(tg, c); !errors.Is(err, ipt.ErrNotOwned) {
		t.Errorf("apply over unmarked chains after the upgrade: %v, want ErrNotOwned", err)
	}
	if _, err := tg.Flush(ctx, "ipfence"); !errors.Is(err, ipt.ErrNotOwned) {
		t.Errorf("flush of unmarked chains after the upgrade: %v, want ErrNotOwned", err)
	}
	if after := save(); after != before {
		t.Errorf("the unmarked chains changed:\n%s", after)
	}
	oldRecord(t, tg)
	if r, err := tg.Flush(ctx, "ipfence"); err != nil || !r.IPTables {
		t.Errorf("flush of the older ipfence's chains: %+v, %v", r, err)
	}
}

// unmarkChains makes ipfence's chains in ns what an ipfence from before
// the mark loaded: the same rules without the marks.
func unmarkChains(t *testing.T, ns string) {
	t.Helper()
	dump := netnstest.Exec(t, ns, "iptables-nft-save")
	var keep []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "--comment \""+ipt.Mark+"\" -j RETURN") || strings.Contains(l, "--comment "+ipt.Mark+" -j RETURN") {
			continue
		}
		keep = append(keep, strings.Replace(l, " -m comment --comment "+ipt.Mark, "", 1))
	}
	cmd, err := netns.Command(context.Background(), ns, "iptables-nft-restore")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = strings.NewReader(strings.Join(keep, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft-restore: %v: %s", err, out)
	}
	if strings.Contains(netnstest.Exec(t, ns, "iptables-nft-save"), ipt.Mark) {
		t.Fatal("a mark is left")
	}
}

// compileDrop compiles a policy for table that drops 192.0.2.0/24
// (backend: "" the default).
func compileDrop(t *testing.T, table string, backend ...plan.Backend) *Compiled {
	t.Helper()
	var b prefix.Builder
	b.AddPrefix(netip.MustParsePrefix("192.0.2.0/24"))
	set, _ := b.Build()
	opt := CompileOptions{IPTables: "nft"}
	if len(backend) > 0 {
		opt.Backend = backend[0]
	}
	c, err := Compile(&plan.Input{Table: table, Priority: -300, Protect: plan.Builtin(),
		Rules: []plan.RuleInput{{Name: "block", Action: plan.Drop, IPv4: true, Set: set}}}, opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyTo applies c in tg with its bans, as `ipfence apply` does.
func applyTo(tg *Target, c *Compiled) (*Report, error) { return applyWith(tg, c, Options{}) }

func applyWith(tg *Target, c *Compiled, o Options) (*Report, error) {
	ctx := context.Background()
	bans, err := tg.OpenBans(ctx, c.Plan.Table, false)
	if err != nil {
		return nil, err
	}
	defer bans.Close()
	return tg.Apply(ctx, c, bans.Lists, o)
}

func mustApply(t *testing.T, tg *Target, c *Compiled) {
	t.Helper()
	if _, err := applyTo(tg, c); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func status(t *testing.T, tg *Target, table string) nft.TableStatus {
	t.Helper()
	st, err := nft.Status(context.Background(), table, tg.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var markLine = regexp.MustCompile(`(?m)^\tcomment "` + nft.Mark + `"\n`)

// unmark makes inet table name in ns what an ipfence from before the
// mark loaded: the same table, without the comment.
func unmark(t *testing.T, ns, name string) {
	t.Helper()
	listing := netnstest.Exec(t, ns, "nft", "list", "table", "inet", name)
	if !markLine.MatchString(listing) {
		t.Fatalf("table %s has no mark to remove:\n%s", name, listing)
	}
	netnstest.Exec(t, ns, "nft", "delete table inet "+name+"\n"+markLine.ReplaceAllString(listing, ""))
}

// oldRecord rewrites tg's record as an ipfence from before the mark
// wrote it.
func oldRecord(t *testing.T, tg *Target) {
	t.Helper()
	a := tg.Previous()
	if a == nil {
		t.Fatal("no record")
	}
	a.Marked = false
	if err := tg.State.SaveApplied(tg.NetNS, a); err != nil {
		t.Fatal(err)
	}
}
