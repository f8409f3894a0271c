// ipfence patch: Table.UserData is sent as NFTA_TABLE_USERDATA and read
// back.

package nftables

import (
	"bytes"
	"testing"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
)

func TestTableUserData(t *testing.T) {
	ud := userdata.AppendString(nil, userdata.TypeComment, "ipfence")
	var tables []netlink.Message
	c, err := New(WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		for _, m := range req {
			if m.Header.Type == newTableHeaderType {
				tables = append(tables, m)
			}
		}
		return req, nil // acknowledged
	}))
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(&Table{Family: TableFamilyINet, Name: "plain"})
	c.AddTable(&Table{Family: TableFamilyINet, Name: "marked", UserData: ud})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 {
		t.Fatalf("%d NEWTABLE messages, want 2", len(tables))
	}
	for i, want := range [][]byte{nil, ud} {
		ad, err := netlink.NewAttributeDecoder(tables[i].Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		for ad.Next() {
			if ad.Type() == nftaTableUserData {
				got = ad.Bytes()
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("table %d: NFTA_TABLE_USERDATA %q, want %q", i, got, want)
		}
		// The kernel lists a table with the attributes it was added with.
		tb, err := tableFromMsg(tables[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tb.UserData, want) {
			t.Errorf("table %d read back with UserData %q, want %q", i, tb.UserData, want)
		}
	}
}
