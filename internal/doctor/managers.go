package doctor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/netns"
)

// Manager is another firewall manager whose rules are in the namespace,
// and how it gets along with ipfence.
type Manager struct {
	Name     string `json:"name"`     // firewalld, docker, kube-proxy, fail2ban, ...
	Evidence string `json:"evidence"` // what was found
	// Warn marks a conflict: something that undoes or duplicates what
	// ipfence does. Advice says what to do; for the others, how they
	// coexist.
	Warn   bool   `json:"warn"`
	Advice string `json:"advice"`
}

// Ruleset is what Managers looks at: the nftables tables and chains
// (iptables-nft's included), the iptables-legacy chains, and whether
// nftables.service flushes the whole ruleset.
type Ruleset struct {
	Tables []string // "FAMILY NAME"
	// Chains are "FAMILY TABLE CHAIN", base chains with " hook H priority P".
	Chains []string
	// Legacy are the chains iptables-legacy-save and
	// ip6tables-legacy-save list ("TABLE CHAIN").
	Legacy []string
	// FlushRuleset names the file nftables.service loads when it flushes
	// the whole ruleset and the service is enabled ("" otherwise).
	FlushRuleset string
}

// ReadRuleset reads the ruleset of the namespace ns ("" the current one)
// over netlink and with iptables-legacy-save; it changes nothing.
func ReadRuleset(ns string) (*Ruleset, error) {
	opts := []nftables.ConnOption{}
	if ns != "" {
		f, err := netns.Open(ns)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	r := &Ruleset{}
	for _, t := range tables {
		r.Tables = append(r.Tables, family(t.Family)+" "+t.Name)
	}
	chains, err := conn.ListChains()
	if err != nil {
		return nil, fmt.Errorf("listing nftables chains: %w", err)
	}
	for _, c := range chains {
		s := family(c.Table.Family) + " " + c.Table.Name + " " + c.Name
		if c.Hooknum != nil && c.Priority != nil {
			hook := nft.HookName(*c.Hooknum)
			if c.Table.Family == nftables.TableFamilyNetdev {
				hook = "ingress"
			}
			s += fmt.Sprintf(" hook %s priority %d", hook, *c.Priority)
		}
		r.Chains = append(r.Chains, s)
	}
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		cmd, err := netns.Command(context.Background(), ns, save)
		if err != nil {
			return nil, err
		}
		out, err := cmd.Output()
		if err != nil {
			continue // no legacy tables here (module not loaded)
		}
		r.Legacy = append(r.Legacy, legacyChains(out)...)
	}
	if ns == "" {
		r.FlushRuleset = flushingService("/etc")
	}
	return r, nil
}

// legacyChains returns "TABLE CHAIN" for each chain of an iptables-save
// listing.
func legacyChains(save []byte) []string {
	var out []string
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(save))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			out = append(out, table+" "+name)
		}
	}
	return out
}

var flushRE = regexp.MustCompile(`(?m)^\s*flush\s+ruleset\b`)

// flushingService returns /etc/nftables.conf when it flushes the whole
// ruleset and nftables.service is enabled under etc.
func flushingService(etc string) string {
	conf := filepath.Join(etc, "nftables.conf")
	b, err := os.ReadFile(conf)
	if err != nil || !flushRE.Match(b) {
		return ""
	}
	links, _ := filepath.Glob(filepath.Join(etc, "systemd", "system", "*.wants", "nftables.service"))
	if len(links) == 0 {
		return ""
	}
	return conf
}

// Managers names the other firewall managers in r, conflicts first.
// priority is ipfence's (the policy's; -300 by default).
func Managers(r *Ruleset, priority int32) []Manager {
	var out []Manager
	has := func(pred func(string) bool) string {
		for _, list := range [][]string{r.Tables, r.Chains, r.Legacy} {
			if i := slices.IndexFunc(list, pred); i >= 0 {
				return list[i]
			}
		}
		return ""
	}
	word := func(i int, match func(string) bool) func(string) bool {
		return func(s string) bool {
			f := strings.Fields(s)
			return len(f) > i && match(f[i])
		}
	}
	eq := func(names ...string) func(string) bool {
		return func(s string) bool { return slices.Contains(names, s) }
	}
	prefix := func(p string) func(string) bool {
		return func(s string) bool { return strings.HasPrefix(s, p) }
	}
	nftTable := func(match func(string) bool) func(string) bool { return word(1, match) }
	chain := func(match func(string) bool) func(string) bool {
		return func(s string) bool {
			f := strings.Fields(s)
			return (len(f) == 2 && match(f[1])) || (len(f) >= 3 && match(f[2]))
		}
	}
	or := func(preds ...func(string) bool) func(string) bool {
		return func(s string) bool { return slices.ContainsFunc(preds, func(p func(string) bool) bool { return p(s) }) }
	}
	before := fmt.Sprintf("ipfence's prerouting chain (priority %d) runs first", priority)
	if r.FlushRuleset != "" {
		out = append(out, Manager{Name: "nftables.service", Evidence: r.FlushRuleset + ": flush ruleset", Warn: true,
			Advice: "a start or reload of nftables.service deletes every table, ipfence's too (the daemon puts it back at its next drift check, within a minute; without the daemon it stays gone): flush or destroy only the tables you name there, e.g. `destroy table inet filter`"})
	}
	if e := has(or(nftTable(eq("f2b-table")), chain(prefix("f2b-")))); e != "" {
		out = append(out, Manager{Name: "fail2ban", Evidence: e, Warn: true,
			Advice: "fail2ban bans with firewall rules of its own besides ipfence's: set banaction = ipfence (dist/fail2ban/ipfence.conf) so its bans go into ipfence's ban sets"})
	}
	if e := has(or(nftTable(eq("crowdsec", "crowdsec6")), chain(eq("CROWDSEC_CHAIN")))); e != "" {
		out = append(out, Manager{Name: "crowdsec-firewall-bouncer", Evidence: e, Warn: true,
			Advice: "a CrowdSec firewall bouncer enforces the decisions too: with a crowdsec source in ipfence's policy it is redundant (and ipfence also blocks ranges); remove one of them"})
	}
	if e := has(nftTable(eq("firewalld"))); e != "" {
		out = append(out, Manager{Name: "firewalld", Evidence: e,
			Advice: before + ", before firewalld's (raw+10 = -290 and later): what ipfence drops never reaches firewalld's zones; firewall-cmd --reload replaces firewalld's tables only, and ipfence's apply and flush never touch them"})
	}
	if e := has(chain(eq("DOCKER", "DOCKER-USER"))); e != "" {
		out = append(out, Manager{Name: "docker", Evidence: e,
			Advice: before + ", before Docker's NAT (dstnat, -100): rules and bans see the original destination and also cover published container ports; Docker's chains are never touched"})
	}
	if e := has(or(nftTable(eq("kube-proxy")), chain(prefix("KUBE-")))); e != "" {
		out = append(out, Manager{Name: "kube-proxy", Evidence: e,
			Advice: before + ", before kube-proxy's service NAT: rules and bans see the original destination; kube-proxy's tables and chains are never touched"})
	}
	if e := has(chain(prefix("ufw"))); e != "" {
		out = append(out, Manager{Name: "ufw", Evidence: e,
			Advice: before + ", before ufw's filter chains; ufw's chains are never touched (ipfence's iptables backends use chains of their own in raw and mangle, and in filter only a reject chain)"})
	}
	for _, c := range r.Chains {
		f := strings.Fields(c)
		var prio int32
		if len(f) == 7 && f[3] == "hook" && f[4] == "prerouting" && f[1] != "ipfence" {
			if _, err := fmt.Sscan(f[6], &prio); err == nil && prio < priority {
				out = append(out, Manager{Name: "table " + f[0] + " " + f[1], Evidence: c,
					Advice: fmt.Sprintf("hooks prerouting at priority %d, before ipfence (%d): it sees packets ipfence drops, and what it drops never reaches ipfence's counters", prio, priority)})
			}
		}
	}
	return out
}

func family(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprint(uint8(f))
}
