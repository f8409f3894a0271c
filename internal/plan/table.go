package plan

import (
	"errors"
	"fmt"
	"strings"
)

// ErrTableName marks a table name ipfence may not use: it deletes and
// replaces its table (nftables) or the chains and sets named after it
// (iptables backends), so the name must be its own.
var ErrTableName = errors.New("not a name ipfence may use for its table")

// foreignTables are names, and name prefixes (ending in "*"), of tables,
// chains and sets that other firewall managers and distributions own,
// compared case-insensitively: the iptables backends name chains
// TABLE-..., so a table "DOCKER" would own DOCKER-USER.
var foreignTables = []string{
	// nftables' and iptables' own table names (Debian's nftables.conf has
	// table inet filter).
	"filter", "nat", "mangle", "raw", "security", "broute",
	"docker*", "ufw*", "f2b*", "fail2ban*", "firewalld*", "crowdsec*", "sshguard*",
	"kube*", "cali*", "cilium*", "flannel*", "weave*", "antrea*",
	"libvirt*", "lxd*", "incus*", "netavark*", "podman*", "cni*",
	"nixos*", "shorewall*", "ts-*", "tailscale*", "zerotier*", "wg-*",
	"csf*", "ferm*", "nomad*", "consul*", "ovn*", "openstack*", "neutron*",
}

// CheckTable reports whether name may be ipfence's table: 1 to 28
// letters, digits, '_' and '-', starting with a letter, and not a name of
// another manager's (foreignTables).
func CheckTable(name string) error {
	if name == "" || len(name) > 28 {
		return fmt.Errorf("table name %q: %w: use 1 to 28 characters", name, ErrTableName)
	}
	for i, c := range name {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !letter || !letter && !(c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("table name %q: %w: use letters, digits, _ and -, starting with a letter", name, ErrTableName)
		}
	}
	low := strings.ToLower(name)
	for _, f := range foreignTables {
		if p, ok := strings.CutSuffix(f, "*"); ok && strings.HasPrefix(low, p) || low == f {
			return fmt.Errorf("table name %q: %w: it is (or starts like) a name that another firewall manager or the distribution uses (%s), whose tables, chains and sets ipfence would replace or delete; choose another, e.g. ipfence", name, ErrTableName, f)
		}
	}
	return nil
}
