package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerConfig configures the embedded NATS server.
type ServerConfig struct {
	// DataDir holds JetStream's data: the bundles, pointers, statuses and
	// bans survive a restart.
	DataDir string
	// Listen is the client address, host:port.
	Listen string
	// ConfigFile is a nats-server configuration file (TLS, accounts,
	// clustering, limits); Listen and DataDir override what it says.
	ConfigFile string
	// Creds are the credentials of the server's own connection, which
	// creates the buckets: needed when the configuration has NATS JWT
	// users (`ipfence server init` writes server.creds).
	Creds  string
	Logger *slog.Logger
	// Ready is called with the client URL once the server takes clients
	// and the buckets exist.
	Ready func(url string)
}

// Serve runs an embedded NATS server with JetStream until ctx is done,
// and creates the fleet's buckets and stream in it.
func Serve(ctx context.Context, cfg ServerConfig) error {
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		o, err := server.ProcessConfigFile(cfg.ConfigFile)
		if err != nil {
			return fmt.Errorf("reading the NATS configuration: %w", err)
		}
		opts = o
	}
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w (want host:port, e.g. 0.0.0.0:4222)", cfg.Listen, err)
	}
	if opts.Port, err = strconv.Atoi(port); err != nil {
		return fmt.Errorf("--listen %q: the port is not a number", cfg.Listen)
	}
	if err := checkExposure(host, opts); err != nil {
		return err
	}
	if len(opts.TrustedOperators) > 0 && cfg.Creds == "" {
		return fmt.Errorf("%w: the configuration has NATS JWT users: give --creds (the server.creds `ipfence server init` wrote)", ErrNATS)
	}
	opts.Host, opts.JetStream, opts.StoreDir, opts.NoSigs = host, true, cfg.DataDir, true
	if opts.ServerName == "" {
		opts.ServerName = "ipfence"
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("starting NATS: %w", err)
	}
	if cfg.Logger != nil {
		s.SetLoggerV2(slogAdapter{cfg.Logger}, false, false, false)
	}
	go s.Start()
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
	}()
	if !s.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("starting NATS on %s: not ready after 30s", cfg.Listen)
	}
	h, err := Connect(Options{Name: "ipfence server", Creds: cfg.Creds}, false, nats.InProcessServer(s))
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.Setup(ctx, 1); err != nil {
		return err
	}
	if err := h.NoAllows(); err != nil && cfg.Logger != nil {
		cfg.Logger.Warn("the fleet runs without fleet-wide allow entries: the stream "+AllowStream+" could not be made (the fleet account's storage, server init --max-disk, may be too small)", "err", err)
	}
	// Agents and ban writers read through the relay, on this connection.
	relayed := make(chan error, 1)
	go func() { relayed <- h.Relay(ctx, cfg.Logger) }()
	if cfg.Ready != nil {
		cfg.Ready(s.ClientURL())
	}
	<-ctx.Done()
	return <-relayed
}

// slogAdapter sends the server's log to slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Noticef(f string, v ...any) { a.l.Info(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Warnf(f string, v ...any)   { a.l.Warn(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Fatalf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Errorf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Debugf(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...), "component", "nats") }
func (a slogAdapter) Tracef(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...), "component", "nats") }

// ErrExposed is returned by Serve for a server that would take clients
// beyond loopback without TLS and authentication: whoever reaches it
// could read every bundle and write statuses, bans and objects.
var ErrExposed = errors.New("NATS would listen beyond loopback without TLS and authentication")

// checkExposure refuses to serve on host (beyond loopback) unless the
// nats-server options have TLS and client authentication, and no user
// that clients without credentials become (no_auth_user).
func checkExposure(host string, o *server.Options) error {
	if host == "localhost" {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() {
		return nil
	}
	auth := o.Username != "" || o.Authorization != "" || len(o.Users) > 0 || len(o.Nkeys) > 0 ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.AuthCallout != nil || o.CustomClientAuthentication != nil
	var missing []string
	if o.TLSConfig == nil {
		missing = append(missing, "TLS (a tls { cert_file, key_file } block)")
	}
	if !auth {
		missing = append(missing, "authentication (an authorization { users = [...] } block, nkeys or accounts)")
	}
	if o.NoAuthUser != "" {
		missing = append(missing, "no no_auth_user (it lets clients in without credentials)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %q needs %s in the --config file: `ipfence server init` writes one (docs/fleet.md), or listen on 127.0.0.1",
		ErrExposed, host, strings.Join(missing, " and "))
}
