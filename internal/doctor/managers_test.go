package doctor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestManagers: each manager is named from what it leaves in a ruleset,
// the conflicting ones (which delete ipfence's table or ban besides it)
// as warnings and first; a ruleset of ipfence alone names none.
func TestManagers(t *testing.T) {
	r := &Ruleset{
		Tables: []string{"inet ipfence", "inet firewalld", "ip kube-proxy", "inet f2b-table", "ip filter", "ip nat"},
		Chains: []string{
			"inet ipfence prerouting hook prerouting priority -300",
			"inet firewalld raw_PREROUTING hook prerouting priority -290",
			"inet firewalld filter_INPUT hook input priority 10",
			"ip filter DOCKER-USER", "ip nat DOCKER",
			"netdev early ingress hook ingress priority -500",
			"ip mangle early hook prerouting priority -400",
		},
		Legacy:       []string{"filter ufw-before-input", "filter CROWDSEC_CHAIN"},
		FlushRuleset: "/etc/nftables.conf",
	}
	got := Managers(r, -300)
	var names, warned []string
	for _, m := range got {
		names = append(names, m.Name)
		if m.Warn {
			warned = append(warned, m.Name)
		}
		if m.Evidence == "" || m.Advice == "" {
			t.Errorf("%+v: no evidence or advice", m)
		}
	}
	want := []string{"nftables.service", "fail2ban", "crowdsec-firewall-bouncer", "firewalld", "docker", "kube-proxy", "ufw", "table ip mangle"}
	if !slices.Equal(names, want) {
		t.Errorf("managers %q, want %q", names, want)
	}
	if !slices.Equal(warned, want[:3]) {
		t.Errorf("warnings for %q, want %q", warned, want[:3])
	}
	alone := &Ruleset{Tables: []string{"inet ipfence"}, Chains: []string{"inet ipfence prerouting hook prerouting priority -300", "inet ipfence bans_hit"}}
	if m := Managers(alone, -300); len(m) != 0 {
		t.Errorf("ipfence alone: %+v", m)
	}
}

// TestFlushingService: /etc/nftables.conf with flush ruleset matters only
// while nftables.service is enabled.
func TestFlushingService(t *testing.T) {
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "nftables.conf"), []byte("#!/usr/sbin/nft -f\n\nflush ruleset\n\ntable inet filter {}\n"), 0o644)
	if got := flushingService(etc); got != "" {
		t.Errorf("service not enabled: %q", got)
	}
	wants := filepath.Join(etc, "systemd", "system", "sysinit.target.wants")
	os.MkdirAll(wants, 0o755)
	os.Symlink("/lib/systemd/system/nftables.service", filepath.Join(wants, "nftables.service"))
	if got := flushingService(etc); got != filepath.Join(etc, "nftables.conf") {
		t.Errorf("enabled: %q", got)
	}
	os.WriteFile(filepath.Join(etc, "nftables.conf"), []byte("# flush ruleset would delete everyone's tables\ndestroy table inet filter\n"), 0o644)
	if got := flushingService(etc); got != "" {
		t.Errorf("no flush: %q", got)
	}
}

func TestLegacyChains(t *testing.T) {
	save := "# Generated\n*filter\n:INPUT ACCEPT [0:0]\n:ufw-before-input - [0:0]\n-A INPUT -j ufw-before-input\nCOMMIT\n*nat\n:DOCKER - [0:0]\nCOMMIT\n"
	if got := legacyChains([]byte(save)); !slices.Equal(got, []string{"filter INPUT", "filter ufw-before-input", "nat DOCKER"}) {
		t.Errorf("%q", got)
	}
}
