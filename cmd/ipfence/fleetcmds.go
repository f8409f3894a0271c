package main

import (
	"cmp"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/agent"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/plan"
)

func newKeygenCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "keygen --out DIR",
		Short: "Make the ed25519 key pair that signs a fleet's policies",
		Long: `Keygen writes DIR/ipfence.key (the private key, mode 0600: it stays with
whoever publishes policies) and DIR/ipfence.pub (the public key every agent is
given with --pubkey). It never overwrites a key: agents that trust the old
public key would stop following the fleet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pubPath, keyPath, err := fleet.GenerateKey(out)
			if err != nil {
				return err
			}
			pub, err := fleet.LoadPublicKey(pubPath)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"private_key": keyPath, "public_key": pubPath, "key_id": fleet.KeyID(pub)})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (private: keep it with the publisher) and %s (public: give it to every agent); key id %s\n", keyPath, pubPath, fleet.KeyID(pub))
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "folder to write ipfence.key and ipfence.pub into")
	_ = c.MarkFlagRequired("out")
	return c
}

// natsFlags say how a command reaches NATS.
type natsFlags struct{ o broker.Options }

func (f *natsFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.o.URL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated (`ipfence server`, or your cluster)")
	c.Flags().StringVar(&f.o.Creds, "nats-creds", "", "NATS credentials file (.creds)")
	c.Flags().StringVar(&f.o.CA, "nats-ca", "", "CA certificate (PEM) that signed the NATS servers' TLS certificates")
	c.Flags().StringVar(&f.o.Cert, "nats-cert", "", "client TLS certificate (PEM)")
	c.Flags().StringVar(&f.o.Key, "nats-key", "", "client TLS key (PEM)")
}

func (f *natsFlags) connect() (*broker.Hub, error) { return broker.Connect(f.o, false) }

// connectSigning reads the private key at keyPath, then connects.
func (f *natsFlags) connectSigning(keyPath string) (*broker.Hub, ed25519.PrivateKey, error) {
	priv, err := fleet.LoadPrivateKey(keyPath)
	if err != nil {
		return nil, nil, err
	}
	h, err := f.connect()
	return h, priv, err
}

func newServerCmd(g *globals) *cobra.Command {
	var cfg broker.ServerConfig
	c := &cobra.Command{
		Use:   "server --data DIR [--listen ADDR] [--config FILE]",
		Short: "Run the fleet's NATS server (embedded, with JetStream)",
		Long: `Server runs a NATS server with JetStream inside ipfence, the single-binary way
to run a fleet: publishers and agents connect to it with --nats. Its data
(bundles, revision pointers with their history, agent statuses, fleet bans)
lives in --data and survives restarts. --config takes a nats-server
configuration file for TLS, accounts and clustering; or run any NATS cluster
with JetStream instead and point every command's --nats at it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cfg.Logger = g.logger
			cfg.Ready = func(url string) {
				g.logger.Info("NATS with JetStream ready", "url", url, "data", cfg.DataDir)
			}
			return broker.Serve(ctx, cfg)
		},
	}
	c.Flags().StringVar(&cfg.DataDir, "data", "", "JetStream data folder")
	c.Flags().StringVar(&cfg.Listen, "listen", "127.0.0.1:4222", "client address (0.0.0.0:4222 to serve a fleet)")
	c.Flags().StringVar(&cfg.ConfigFile, "config", "", "nats-server configuration file (`server init` writes one: TLS and per-role users)")
	c.Flags().StringVar(&cfg.Creds, "creds", "", "credentials of the server's own setup connection (the server.creds `server init` wrote)")
	_ = c.MarkFlagRequired("data")
	c.AddCommand(newServerInitCmd(g), newServerCredsCmd(g), newServerRevokeCmd(g))
	return c
}

func newServerInitCmd(g *globals) *cobra.Command {
	cfg := broker.InitConfig{MaxDisk: broker.DefaultMaxDisk}
	c := &cobra.Command{
		Use:   "init --dir DIR --host NAME [--host NAME...]",
		Short: "Write the fleet server's TLS certificate, users and configuration",
		Long: `Init writes what ` + "`ipfence server`" + ` needs to serve a fleet beyond loopback,
authenticated and encrypted, into DIR (mode 0700): a CA (ca.pem: give it to
every client with --nats-ca) and the server's certificate for each --host,
an operator and the fleet's account as NATS JWTs (account.nk signs users:
keep DIR private), nats.conf, and two sets of credentials: server.creds
(the server's own setup connection) and publisher.creds (publish, rollback,
fleet status). Make agents' and ban writers' credentials with
` + "`ipfence server creds`" + `: an agent may only read policies, bundles and bans
and write its own status; a ban writer may only publish bans. Init never
overwrites: clients trust the CA and the keys it made.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Now = time.Now()
			if err := broker.Init(cfg); err != nil {
				return err
			}
			runDir := cmp.Or(cfg.RunDir, cfg.Dir)
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"dir": cfg.Dir, "config": filepath.Join(cfg.Dir, broker.ConfFile),
					"ca": filepath.Join(cfg.Dir, broker.CAFile), "server_creds": filepath.Join(cfg.Dir, broker.ServerCreds),
					"publisher_creds": filepath.Join(cfg.Dir, broker.PublisherCreds)})
			}
			fmt.Fprintf(cmd.OutOrStdout(), `wrote %[1]s: run the server with
  ipfence server --data /var/lib/ipfence-server --listen 0.0.0.0:4222 --config %[2]s --creds %[3]s
publish with --nats-creds %[4]s --nats-ca %[5]s; make each agent's credentials with
  ipfence server creds --dir %[1]s --role agent --name HOST --out HOST.creds
`, cfg.Dir, filepath.Join(runDir, broker.ConfFile), filepath.Join(runDir, broker.ServerCreds),
				filepath.Join(cfg.Dir, broker.PublisherCreds), filepath.Join(cfg.Dir, broker.CAFile))
			return nil
		},
	}
	c.Flags().StringVar(&cfg.Dir, "dir", "", "folder to write into (made mode 0700; it must not hold an init already)")
	c.Flags().StringArrayVar(&cfg.Hosts, "host", nil, "the server's DNS name or address as clients dial it (repeat; localhost is always in)")
	c.Flags().StringVar(&cfg.RunDir, "run-dir", "", "where the server reads the files at run time, as written into nats.conf (the systemd unit's /run/credentials/ipfence-server.service; default --dir)")
	c.Flags().Int64Var(&cfg.MaxDisk, "max-disk", broker.DefaultMaxDisk, "bytes of JetStream storage the fleet may use")
	_ = c.MarkFlagRequired("dir")
	return c
}

func newServerCredsCmd(g *globals) *cobra.Command {
	var dir, role, name, out, expires string
	c := &cobra.Command{
		Use:   "creds --dir DIR --role agent|bans|publisher --name NAME --out FILE",
		Short: "Make credentials for an agent, a ban writer or a publisher",
		Long: `Creds signs a NATS user with the account key ` + "`server init`" + ` wrote into DIR and
writes its credentials to FILE (mode 0600): give it to the client with
--nats-creds, along with --nats-ca DIR/ca.pem. The server needs no restart.
An agent's --name is its host name (its --name): it may write that host's
status only. --expires bounds the credentials' life (e.g. 365d).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := broker.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			var life time.Duration
			if expires != "" {
				if life, err = ban.ParseTTL(expires); err != nil {
					return usageError{fmt.Errorf("--expires: %w", err)}
				}
			}
			if out == "" {
				out = name + ".creds"
			}
			if err := broker.IssueFile(dir, r, name, out, life, time.Now()); err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"creds": out, "role": string(r), "name": name})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s (give it with --nats-creds, and --nats-ca %s)\n", out, r, name, filepath.Join(dir, broker.CAFile))
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "the folder `server init` wrote")
	c.Flags().StringVar(&role, "role", "", "agent, bans or publisher")
	c.Flags().StringVar(&name, "name", "", "the user's name: an agent's host name")
	c.Flags().StringVar(&out, "out", "", "file to write (default NAME.creds; never overwritten)")
	c.Flags().StringVar(&expires, "expires", "", "how long the credentials are valid (e.g. 90d; default for good)")
	for _, f := range []string{"dir", "role", "name"} {
		_ = c.MarkFlagRequired(f)
	}
	return c
}

func newPublishCmd(g *globals) *cobra.Command {
	var pf policyFlags
	var nf natsFlags
	var keyPath, group, canary string
	layouts := true
	c := &cobra.Command{
		Use:   "publish --policy FILE --key FILE [--group NAME] [--canary N%] [--nats URL]",
		Short: "Compile a policy and roll it out to a host group",
		Long: `Publish reads and compiles the policy here (its URLs downloaded here, once for
the fleet), bundles the policy (its text without credentials: api_key values,
URL passwords and query values) with what its sources resolved to, stores the
bundle in the fleet's object store under its SHA-256 and moves the group's
revision pointer to it, signed with --key. Every agent of the group applies it
within seconds. --canary 10% sends only a tenth of the group's hosts (chosen
by name, differently for each revision) while the others stay where they are;
publish again without --canary to send everyone.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pct, err := parseCanary(canary)
			if err != nil {
				return usageError{err}
			}
			h, priv, err := nf.connectSigning(keyPath)
			if err != nil {
				return err
			}
			defer h.Close()
			pf.record = layouts // the bundle carries the layouts chosen here
			pf.keepInput = true // and the rules' sets
			pf.parallel = true  // every agent waits for this compile
			c, err := pf.compile(cmd.Context(), g)
			if err != nil {
				return err
			}
			pol := c.res.Policy
			b := fleet.NewBundle(c.res.Input, pol.RejectMark, filepath.Base(pol.File), pol.Text, time.Now())
			if layouts {
				if err := b.AddLayouts(c.Plan); err != nil {
					return err
				}
			}
			// The bundle is encoded while the differences are made:
			// both only read it.
			var data []byte
			var encErr error
			encoded := make(chan struct{}) // closed once data, encErr are set
			go func() {
				data, encErr = b.Encode()
				close(encoded)
			}()
			if err := h.Setup(cmd.Context(), 1); err != nil {
				return err
			}
			// Hosts on the revisions in force fetch only the difference.
			deltas, errs := h.Deltas(cmd.Context(), group, priv.Public().(ed25519.PublicKey), b, c.Plan.Sets(), func() int { <-encoded; return len(data) })
			<-encoded
			if encErr != nil {
				return encErr
			}
			for _, err := range errs {
				g.logger.Info("no difference bundle: the hosts on that revision fetch the whole bundle", "err", err)
			}
			m, err := h.Publish(cmd.Context(), group, data, priv, pct, time.Now(), deltas...)
			if err != nil {
				return err
			}
			warnReplaced(g, m)
			return printPointer(cmd.OutOrStdout(), g, "published", m.Pointer, c.Plan)
		},
	}
	pf.register(c)
	nf.register(c)
	c.Flags().StringVar(&keyPath, "key", "", "private key (ipfence keygen's ipfence.key)")
	c.Flags().StringVar(&group, "group", "default", "host group to publish to")
	c.Flags().StringVar(&canary, "canary", "", "send only this share of the group's hosts, e.g. 10%")
	c.Flags().BoolVar(&layouts, "layouts", true, "carry the layouts chosen here, which agents replay (bundle format 3); --layouts=false for agents older than this build")
	_ = c.MarkFlagRequired("key")
	return c
}

// parseCanary reads "10%" (or "10"): 0 for "".
func parseCanary(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	if err != nil || n < 1 || n > 99 {
		return 0, fmt.Errorf("--canary %q: want a share of hosts from 1%% to 99%%", s)
	}
	return n, nil
}

// warnReplaced tells the operator (on stderr) when the group's pointer
// was not the last revision signed with their key: someone wrote it
// without the key, copied another group's or replayed an old one, or
// another key publishes this group.
func warnReplaced(g *globals, m *broker.Moved) {
	if m.Replaced != "" {
		g.logger.Warn("the group's pointer was not its latest revision signed with this key: replaced", "group", m.Group, "seq", m.Seq, "was", m.Replaced)
	}
}

// printPointer says where a group's pointer went (p: nil for rollback's
// plan).
func printPointer(w io.Writer, g *globals, verb string, p *fleet.Pointer, pl *plan.Plan) error {
	if g.json {
		return writeJSON(w, p)
	}
	fmt.Fprintf(w, "%s revision %d of group %s: bundle %s (%d bytes)", verb, p.Seq, p.Group, p.Digest, p.Size)
	if pl != nil {
		v4, v6 := 0, 0
		for _, r := range pl.Rules {
			v4 += r.V4.Prefixes
			v6 += r.V6.Prefixes
		}
		fmt.Fprintf(w, ", %d rules, %d IPv4 + %d IPv6 prefixes", len(pl.Rules), v4, v6)
	}
	fmt.Fprintln(w)
	if p.Canary > 0 {
		fmt.Fprintf(w, "canary: %d%% of the group's hosts; the others stay on revision %d (%s)\n", p.Canary, p.Stable.Seq, p.Stable.Digest)
	}
	return nil
}

func newRollbackCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var keyPath, group string
	var to uint64
	c := &cobra.Command{
		Use:   "rollback --key FILE [--group NAME] [--to SEQ] [--nats URL]",
		Short: "Send a host group back to an earlier revision",
		Long: `Rollback moves the group's pointer back to the bundle of an earlier revision
(--to SEQ; by default the last one, not a canary, whose bundle differs from the
current one), for every host of the group. It is itself a new revision with a
higher sequence number: agents never accept a lower one, so an old pointer
replayed cannot roll a host back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, priv, err := nf.connectSigning(keyPath)
			if err != nil {
				return err
			}
			defer h.Close()
			m, err := h.Rollback(cmd.Context(), group, to, priv, time.Now())
			if err != nil {
				return err
			}
			warnReplaced(g, m)
			return printPointer(cmd.OutOrStdout(), g, "rolled back: new", m.Pointer, nil)
		},
	}
	nf.register(c)
	c.Flags().StringVar(&keyPath, "key", "", "private key (ipfence keygen's ipfence.key)")
	c.Flags().StringVar(&group, "group", "default", "host group")
	c.Flags().Uint64Var(&to, "to", 0, "revision whose bundle to go back to (default: the previous bundle)")
	_ = c.MarkFlagRequired("key")
	return c
}

func newAgentCmd(g *globals) *cobra.Command {
	var cfg agent.Config
	var nf natsFlags
	var xf xdpFlags
	var pubPath, banPubPath string
	c := &cobra.Command{
		Use:   "agent --pubkey FILE [--nats URL] [--group NAME] [--name HOST] [--netns NAME]",
		Short: "Follow a host group's policy and the fleet's bans",
		Long: `Agent runs the daemon (local API socket, metrics, ban expiry, drift repair,
XDP) with its group's revision as the policy. It watches the group's pointer,
checks its signature against --pubkey, fetches the bundle after a random delay
(--jitter), checks its digest and loads the difference in one transaction;
anything refused leaves the last good revision in force. That revision is kept
in the state folder: with NATS unreachable the agent enforces it and retries.
Fleet bans (ipfence ban --fleet) apply within a second, and after an outage
with the time they have left. The status (revision, apply time, counts, last
error, backend, kernel) goes to the fleet every --heartbeat and at each change:
'ipfence fleet status' reads it.

On hosts without nftables (--backend auto finds out; or --backend ipset or
iptables-split) the agent loads each revision whole with ipset restore (sets
swapped in) and iptables-restore (one commit per table), and fleet bans go into
ipset ban sets with their time left (ipset backend; iptables-split has no sets
and reports them refused). The local ban API and metrics need nftables.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			var err error
			if cfg.PubKey, err = fleet.LoadPublicKey(pubPath); err != nil {
				return err
			}
			if banPubPath != "" {
				if cfg.BanKey, err = fleet.LoadPublicKey(banPubPath); err != nil {
					return err
				}
			}
			cfg.NATS = nf.o
			cfg.Daemon.Logger = g.logger
			cfg.Daemon.XDP = xf.options()
			a, err := agent.New(cfg)
			if err != nil {
				return err
			}
			return a.Run(ctx)
		},
	}
	nf.register(c)
	xf.register(c, true)
	c.Flags().StringVar(&pubPath, "pubkey", "", "public key the group's revisions are signed with (ipfence keygen's ipfence.pub)")
	c.Flags().StringVar(&banPubPath, "ban-pubkey", "", "public key fleet bans are signed with (default: --pubkey)")
	c.Flags().StringVar(&cfg.Group, "group", "default", "host group to follow")
	c.Flags().StringVar(&cfg.Name, "name", "", "this host's name in the fleet (default: the host name)")
	c.Flags().Var((*backendFlag)(&cfg.Backend), "backend", "where this host runs the revisions: nftables (with the policy's XDP rules), ipset, iptables-split, or auto (what the host supports)")
	c.Flags().StringVar(&cfg.IPTables, "iptables", "", "iptables flavour of the ipset and iptables-split backends: legacy or nft (default: the one `iptables` is)")
	registerDaemonFlags(c, &cfg.Daemon)
	c.Flags().DurationVar(&cfg.Jitter, "jitter", 2*time.Second, "longest random delay before fetching a new revision (spreads a fleet's fetches)")
	c.Flags().DurationVar(&cfg.Heartbeat, "heartbeat", 15*time.Second, "how often the status is written without a change")
	c.Flags().DurationVar(&cfg.Poll, "poll", 30*time.Second, "how often the pointer is read besides watching it")
	c.Flags().DurationVar(&cfg.Watch, "watch", time.Second, "how often the pointer and new fleet bans are read (the watch)")
	_ = c.MarkFlagRequired("pubkey")
	return c
}

func newFleetCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "fleet", Short: "Look at the fleet: which host runs what"}
	c.AddCommand(newFleetStatusCmd(g))
	return c
}

func newFleetStatusCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var pubPath string
	var silentAfter time.Duration
	c := &cobra.Command{
		Use:   "status [--nats URL] [--pubkey FILE] [--silent-after 1m]",
		Short: "Drift report: hosts at the latest revision, behind, failing, silent",
		Long: `Fleet status reads every group's pointer and every agent's last status and says
for each host whether it runs the revision it should (latest; during a canary
the hosts outside it should run the stable one), runs an older one (behind),
tried and failed (failing, with the error), or has not reported for
--silent-after (silent). With --pubkey the pointers' signatures are checked.
It exits with status 1 when a host is not at the latest revision.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pub ed25519.PublicKey
			if pubPath != "" {
				var err error
				if pub, err = fleet.LoadPublicKey(pubPath); err != nil {
					return err
				}
			}
			h, err := nf.connect()
			if err != nil {
				return err
			}
			defer h.Close()
			ps, err := h.Pointers(cmd.Context(), pub)
			if err != nil {
				return err
			}
			st, err := h.Statuses(cmd.Context())
			if err != nil {
				return err
			}
			r := fleet.Drift(ps, st, time.Now(), silentAfter)
			if g.json {
				err = writeJSON(cmd.OutOrStdout(), r)
			} else {
				printDrift(cmd.OutOrStdout(), r)
			}
			if err == nil && r.Counts[fleet.Latest] < len(r.Hosts) {
				return errDrift
			}
			return err
		},
	}
	nf.register(c)
	c.Flags().StringVar(&pubPath, "pubkey", "", "check the pointers' signatures with this public key")
	c.Flags().DurationVar(&silentAfter, "silent-after", time.Minute, "a host without a heartbeat for this long is silent (agents beat every 15s)")
	return c
}

// errDrift is fleet status's exit for a fleet not all at the latest.
var errDrift = errors.New("not every host runs its latest revision")

func printDrift(w io.Writer, r fleet.Report) {
	for _, name := range slices.Sorted(maps.Keys(r.Pointers)) {
		p := r.Pointers[name]
		fmt.Fprintf(w, "group %s: revision %d, bundle %s", name, p.Seq, p.Digest)
		if p.Canary > 0 {
			fmt.Fprintf(w, " (canary %d%%; others on %d)", p.Canary, p.Stable.Seq)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d hosts: %d latest, %d behind, %d failing, %d silent\n", len(r.Hosts),
		r.Counts[fleet.Latest], r.Counts[fleet.Behind], r.Counts[fleet.Failing], r.Counts[fleet.Silent])
	for _, h := range r.Hosts {
		fmt.Fprintf(w, "  %-20s %-8s %-9s revision %d applied %s (%d ms, %s), %d elements, %d bans, %s, kernel %s, heartbeat %s ago\n",
			h.Host, h.Group, h.State, h.Seq, h.Applied.Format(time.RFC3339), h.ApplyMillis, h.Mode, h.Elements, h.Bans,
			h.Backend, h.Kernel, h.Silence.Round(time.Second))
		if h.LastError != "" {
			fmt.Fprintf(w, "      last error (revision %d): %s\n", h.FailedSeq, h.LastError)
		}
		if strings.HasPrefix(h.Layout, "not replayed") {
			fmt.Fprintf(w, "      layout %s\n", h.Layout)
		}
	}
}

// fleetBanFlags are ban's and unban's flags for fleet-wide bans, and
// allow's and unallow's for fleet-wide allow entries (allow).
type fleetBanFlags struct {
	on      bool
	nf      natsFlags
	keyPath string
	allow   bool
}

func (f *fleetBanFlags) register(c *cobra.Command) {
	if f.allow {
		c.Flags().BoolVar(&f.on, "fleet", false, "for every agent of the fleet: publish on the fleet's allows stream (publisher credentials), signed with --key")
		c.Flags().StringVar(&f.keyPath, "key", "", "with --fleet: the policy key, the private key the agents' --pubkey trusts (not the ban key)")
	} else {
		c.Flags().BoolVar(&f.on, "fleet", false, "for every agent of the fleet: publish on the fleet's bans stream, signed with --key")
		c.Flags().StringVar(&f.keyPath, "key", "", "with --fleet: private key the agents' --ban-pubkey (or --pubkey) trusts")
	}
	f.nf.register(c)
}

// publish publishes the bans or unbans (allow entries or their removals)
// of ps, each made by mk.
func (f *fleetBanFlags) publish(cmd *cobra.Command, ps []netip.Prefix, mk func(netip.Prefix, time.Time) *fleet.Ban) error {
	if f.keyPath == "" {
		return usageError{errors.New("--fleet needs --key (the private key the agents trust for bans, or for allow entries the policy key)")}
	}
	h, priv, err := f.nf.connectSigning(f.keyPath)
	if err != nil {
		return err
	}
	defer h.Close()
	pub := h.PublishBan
	if f.allow {
		pub = h.PublishAllow
	}
	for _, p := range ps {
		if err := pub(cmd.Context(), mk(p, time.Now()), priv); err != nil {
			return err
		}
	}
	return nil
}

func printFleetBans(w io.Writer, g *globals, verb string, ps []netip.Prefix, ttl time.Duration) error {
	if g.json {
		return writeJSON(w, map[string]any{"fleet": true, verb: ps, "ttl_seconds": int64(ttl.Seconds())})
	}
	for _, p := range ps {
		fmt.Fprintf(w, "%s %s on every agent of the fleet", verb, p)
		if ttl > 0 {
			fmt.Fprintf(w, " for %s", ttl)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// backendFlag is the agent's --backend.
type backendFlag plan.Backend

func (f *backendFlag) String() string {
	if *f == "" {
		return string(plan.Auto)
	}
	return string(*f)
}

func (f *backendFlag) Set(s string) error {
	b, err := plan.ParseBackend(s)
	if err != nil {
		return err
	}
	*f = backendFlag(b)
	return nil
}

func (f *backendFlag) Type() string { return "backend" }

func newServerRevokeCmd(g *globals) *cobra.Command {
	var dir, creds string
	c := &cobra.Command{
		Use:   "revoke --dir DIR --creds FILE",
		Short: "Revoke a user's credentials (a host lost or compromised)",
		Long: `Revoke signs the account of the user whose credentials are in FILE again, in
DIR/nats.conf, with the user revoked from now on (the operator key ` + "`server init`" + `
kept in DIR signs it). Restart the server to apply it (systemctl restart
ipfence-server): the user can no longer connect, and its open connections
close with the restart. Give the host new credentials with ` + "`server creds`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			upub, r, err := broker.Revoke(dir, creds, time.Now())
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"user": upub, "role": string(r), "config": filepath.Join(dir, broker.ConfFile)})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s user %s in %s: restart the server to apply it\n", r, upub, filepath.Join(dir, broker.ConfFile))
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "the folder `server init` wrote")
	c.Flags().StringVar(&creds, "creds", "", "the credentials file to revoke")
	for _, f := range []string{"dir", "creds"} {
		_ = c.MarkFlagRequired(f)
	}
	return c
}
