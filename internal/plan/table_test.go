package plan

import (
	"errors"
	"testing"
)

func TestCheckTable(t *testing.T) {
	for name, ok := range map[string]bool{
		"ipfence": true, "ipf": true, "edge_2": true, "Fence-1": true,
		"": false, "-x": false, "1x": false, "a b": false, "a/b": false, "abcdefghijklmnopqrstuvwxyz123": false,
		"filter": false, "FILTER": false, "nat": false, "raw": false,
		"DOCKER": false, "docker-user": false, "ufw": false, "ufw-before-input": false, "f2b-sshd": false,
		"firewalld": false, "crowdsec": false, "crowdsec6": false, "KUBE-FIREWALL": false, "cali-x": false, "ts-input": false,
		"filtered": true, "natural": true, // only the exact names of iptables' tables
	} {
		if _, err := Compile(&Input{Table: name}, Options{}); name != "" && (err == nil) != ok {
			t.Errorf("Compile with table %q: %v, want ok %v", name, err, ok)
		}
		err := CheckTable(name)
		if (err == nil) != ok || err != nil && !errors.Is(err, ErrTableName) {
			t.Errorf("CheckTable(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
