package nft

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// Mark is the comment of every table ipfence creates (`nft list` shows
// `comment "ipfence"`): its proof of ownership. Apply, Flush and the
// Updates that change objects (see Update.changesObjects) first read the
// table, and replace, delete or change an existing one only when it has
// the mark, or when ApplyOptions.Adopt vouches for it. The kernel keeps a
// table's comment from its creation on (Linux 5.13 and later): a table
// gets the mark when Apply creates it again.
const Mark = "ipfence"

// ErrNotOwned is wrapped by the error of Apply, Flush and ApplyUpdate when
// the table exists without ipfence's mark: another program (or the
// operator) made it, and nothing was changed.
var ErrNotOwned = errors.New("exists and was not made by ipfence")

// markUserdata is the table userdata that carries Mark, as nft writes a
// table comment (NFTNL_UDATA_TABLE_COMMENT: TLV type 0, the string with
// its NUL).
func markUserdata() []byte { return userdata.AppendString(nil, userdata.TypeComment, Mark) }

// marked reports whether table userdata ud carries Mark.
func marked(ud []byte) bool {
	s, ok := userdata.GetString(ud, userdata.TypeComment)
	return ok && s == Mark
}

// checkOwner reads the inet table named table on c, a connection to the
// namespace opts.NetNS: exists is false when there is none. An existing
// table without the mark is refused (ErrNotOwned) unless opts.Adopt.
func checkOwner(c *nftables.Conn, table string, opts ApplyOptions) (exists bool, err error) {
	t, err := c.ListTableOfFamily(table, nftables.TableFamilyINet)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading table %s: %w", table, err)
	case marked(t.UserData) || opts.Adopt:
		return true, nil
	}
	ns := opts.NetNS
	del := "nft delete table inet " + table
	switch {
	case strings.HasPrefix(ns, "/"):
		del = "nsenter --net=" + ns + " " + del
	case ns != "":
		del = "ip netns exec " + ns + " " + del
	}
	return true, fmt.Errorf("table inet %s in %s %w (it has no comment %q): ipfence replaces and deletes only its own tables; "+
		"choose another name (table: in the policy, or --table), or, if an older ipfence loaded it, delete it yourself (%s)",
		table, netns.Describe(ns), ErrNotOwned, Mark, del)
}
