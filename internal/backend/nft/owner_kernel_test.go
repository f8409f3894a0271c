package nft

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// foreignTable is a table another program made: no mark, a base chain
// with rules, a set with an element.
const foreignTable = `table inet mytable {
	set keep {
		type ipv4_addr
		elements = { 192.0.2.1 }
	}

	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
		ip saddr @keep counter drop
	}
}
`

// TestForeignTableUntouched: a table ipfence did not make (loaded with
// nft, no mark) is refused by Apply, Flush and an Update that changes
// objects, and stays exactly as it was. Adopt (what the record of an
// older ipfence vouches for) lets Apply replace it, and marks it.
func TestForeignTableUntouched(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	loadScript(t, ns, foreignTable)
	before := nft(t, ns, "", "list", "ruleset")
	opts := ApplyOptions{NetNS: ns}

	p := minimalProgram()
	p.Table = "mytable"
	_, err := Apply(ctx, p, opts)
	if !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Apply: %v, want ErrNotOwned", err)
	}
	for _, s := range []string{"table inet mytable", "network namespace " + ns, "ip netns exec " + ns + " nft delete table inet mytable", "--table"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if existed, err := Flush(ctx, "mytable", opts); !errors.Is(err, ErrNotOwned) || existed {
		t.Errorf("Flush: %v, %v; want false, ErrNotOwned", existed, err)
	}
	for name, u := range map[string]*Update{
		"deleting a set":        {Table: "mytable", DelSets: []string{"keep"}},
		"making the base chain": {Table: "mytable", Ensure: []*Chain{BaseChain(nil, -300, Presence{Bans: [4]bool{true}})}, Sets: []SetChange{{Set: BanSets()[0]}}},
	} {
		if _, err := ApplyUpdate(ctx, u, opts); !errors.Is(err, ErrNotOwned) {
			t.Errorf("ApplyUpdate %s: %v, want ErrNotOwned", name, err)
		}
	}
	if after := nft(t, ns, "", "list", "ruleset"); after != before {
		t.Fatalf("the foreign table changed:\n%s", lineDiff(before, after))
	}
	st, err := Status(ctx, "mytable", ns)
	if err != nil || !st.Exists || st.Marked {
		t.Errorf("Status: exists %v, marked %v, %v; want exists, not marked", st.Exists, st.Marked, err)
	}

	opts.Adopt = true
	if _, err := Apply(ctx, p, opts); err != nil {
		t.Fatalf("Apply with Adopt: %v", err)
	}
	if st, err := Status(ctx, "mytable", ns); err != nil || !st.Marked || len(st.Chains) != 1 || st.Chains[0].Name != "pre" {
		t.Errorf("after Apply with Adopt: %+v, %v; want the program's table, marked", st, err)
	}
}

// TestOwnTableMarked: the table Apply creates carries the mark, as nft
// writes `comment "ipfence"` (read back over netlink and by nft); it is
// applied again, changed and deleted without Adopt; a flush of a missing
// table is a no-op.
func TestOwnTableMarked(t *testing.T) {
	ns := newNetns(t)
	ctx := context.Background()
	opts := ApplyOptions{NetNS: ns}
	if existed, err := Flush(ctx, "ipfence", opts); err != nil || existed {
		t.Fatalf("Flush of a missing table: %v, %v; want false, nil", existed, err)
	}
	p := minimalProgram()
	mustApply(t, p, ns)
	checkMarked(t, ns, "ipfence")
	mustApply(t, p, ns)
	checkMarked(t, ns, "ipfence")
	u := &Update{Table: "ipfence", NewSets: []*Set{{Name: "more", Family: IPv4, KeyBits: 32}}}
	if _, err := ApplyUpdate(ctx, u, opts); err != nil {
		t.Errorf("ApplyUpdate: %v", err)
	}
	if existed, err := Flush(ctx, "ipfence", opts); err != nil || !existed {
		t.Errorf("Flush: %v, %v; want true, nil", existed, err)
	}
	if out := nft(t, ns, "", "list", "tables"); strings.Contains(out, "ipfence") {
		t.Errorf("after Flush: %s", out)
	}
}

// checkMarked checks that inet table name in ns has ipfence's mark, as
// ListTables, Status and nft see it.
func checkMarked(t *testing.T, ns, name string) {
	t.Helper()
	c, closeConn, _, err := dial(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tb := range tables {
		if tb.Name == name {
			found = true
			if string(tb.UserData) != string(markUserdata()) {
				t.Errorf("table %s userdata %q, want %q", name, tb.UserData, markUserdata())
			}
		}
	}
	if !found {
		t.Errorf("no inet table %s listed", name)
	}
	if st, err := Status(context.Background(), name, ns); err != nil || !st.Marked {
		t.Errorf("Status: marked %v, %v", st.Marked, err)
	}
	if out := nft(t, ns, "", "list", "table", "inet", name); !strings.Contains(out, "\tcomment \"ipfence\"\n") {
		t.Errorf("nft lists no comment:\n%s", out)
	}
}
