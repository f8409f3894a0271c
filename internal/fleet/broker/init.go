package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Files Init writes into its folder.
const (
	ConfFile       = "nats.conf"       // the server's configuration
	CAFile         = "ca.pem"          // give it to every client (--nats-ca)
	caKeyFile      = "ca-key.pem"      // signs server certificates
	ServerCertFile = "server-cert.pem" // the server's TLS certificate
	serverKeyFile  = "server-key.pem"
	OperatorFile   = "operator.nk" // signs the accounts
	AccountFile    = "account.nk"  // signs the publishers (Issue)
	agentsFile     = "agents.nk"   // signs the agents
	bansFile       = "bans.nk"     // signs the ban writers
	ServerCreds    = "server.creds"
	PublisherCreds = "publisher.creds"
)

// InitConfig says what Init writes.
type InitConfig struct {
	Dir string // the folder, made mode 0700
	// Hosts are the server's DNS names and addresses, as clients dial it:
	// they go into its certificate (localhost and 127.0.0.1 always do).
	Hosts []string
	// RunDir is where the server reads the files at run time, written
	// into nats.conf (the systemd unit's credentials folder); "" is Dir.
	RunDir string
	// MaxDisk bounds what the fleet's account stores in JetStream.
	MaxDisk int64
	Now     time.Time
}

// DefaultMaxDisk is the JetStream storage a fleet's account may use.
const DefaultMaxDisk = 8 << 30

// ErrInitDone is returned by Init for a folder that has an
// initialisation already.
var ErrInitDone = errors.New("the folder holds a fleet's NATS configuration already")

// Init writes what an authenticated, encrypted fleet server needs into
// cfg.Dir: a CA and the server's certificate, an operator and the
// fleet's account (NATS JWTs), nats.conf, and the credentials of the
// server's own setup connection and of a first publisher. Agents' and
// ban writers' credentials are made with Issue (`ipfence server creds`).
// It never overwrites: a fleet's clients trust the CA and keys it made.
func Init(cfg InitConfig) error {
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return fmt.Errorf("--dir %s: %w", cfg.Dir, err)
	}
	cfg.Dir = dir
	if cfg.RunDir == "" {
		cfg.RunDir = cfg.Dir
	}
	if cfg.MaxDisk <= 0 {
		cfg.MaxDisk = DefaultMaxDisk
	}
	if _, err := os.Lstat(filepath.Join(cfg.Dir, ConfFile)); err == nil {
		return fmt.Errorf("%w: %s (issue more credentials with `ipfence server creds`, or move it away)", ErrInitDone, cfg.Dir)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", cfg.Dir, err)
	}
	files, err := initFiles(cfg)
	if err != nil {
		return err
	}
	for i, f := range files {
		if err := writeNew(filepath.Join(cfg.Dir, f.name), f.data, f.mode); err != nil {
			// Nothing half made: a later init starts afresh.
			for _, w := range files[:i] {
				os.Remove(filepath.Join(cfg.Dir, w.name))
			}
			return err
		}
	}
	return nil
}

type initFile struct {
	name string
	data []byte
	mode os.FileMode
}

// initFiles makes the contents of Init's files.
func initFiles(cfg InitConfig) ([]initFile, error) {
	caPEM, caKeyPEM, certPEM, keyPEM, err := certificates(cfg.Hosts, cfg.Now)
	if err != nil {
		return nil, err
	}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, fmt.Errorf("making the operator key: %w", err)
	}
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "ipfence"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return nil, fmt.Errorf("signing the operator: %w", err)
	}
	account := func(name string, js bool, ex jwt.Exports, im jwt.Imports) (nkeys.KeyPair, string, string, error) {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, "", "", fmt.Errorf("making account %s: %w", name, err)
		}
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{DiskStorage: cfg.MaxDisk, MemoryStorage: 64 << 20, Streams: 16, Consumer: 100000}
		}
		ac.Exports, ac.Imports = ex, im
		ajwt, err := ac.Encode(okp)
		if err != nil {
			return nil, "", "", fmt.Errorf("signing account %s: %w", name, err)
		}
		return akp, apub, ajwt, nil
	}
	_, syspub, sysjwt, err := account("SYS", false, nil, nil)
	if err != nil {
		return nil, err
	}
	akp, apub, ajwt, err := account("IPFENCE", true, exports(), nil)
	if err != nil {
		return nil, err
	}
	agkp, agpub, agjwt, err := account("IPFENCE_AGENTS", false, nil, imports(Agent, apub))
	if err != nil {
		return nil, err
	}
	bkp, bpub, bjwt, err := account("IPFENCE_BANS", false, nil, imports(Bans, apub))
	if err != nil {
		return nil, err
	}
	server, err := Issue(akp, Publisher, "ipfence-server", 0, cfg.Now)
	if err != nil {
		return nil, err
	}
	publisher, err := Issue(akp, Publisher, "publisher", 0, cfg.Now)
	if err != nil {
		return nil, err
	}
	seed := func(kp nkeys.KeyPair) []byte {
		sd, _ := kp.Seed()
		return append(sd, '\n')
	}
	conf := fmt.Sprintf(`# Written by ipfence server init on %s: the fleet's NATS with TLS and
# NATS JWT users. The users and their permissions are in their JWTs, signed
# by their role's account key (%s and the others; ipfence server creds
# issues more); this file only names the operator and the accounts: the
# fleet's, which holds the streams, and the agents' and ban writers', which
# import only what they may use. Regenerate rather than edit.

operator: %q
system_account: %s
resolver: MEMORY
resolver_preload: {
  %s: %q
  %s: %q
  %s: %q
  %s: %q
}

tls {
  cert_file: %q
  key_file: %q
  timeout: 5
}

max_payload: 1MB
max_connections: 65536
`, cfg.Now.UTC().Format(time.RFC3339), AccountFile, ojwt, syspub, syspub, sysjwt, apub, ajwt, agpub, agjwt, bpub, bjwt,
		filepath.Join(cfg.RunDir, ServerCertFile), filepath.Join(cfg.RunDir, serverKeyFile))
	return []initFile{
		{CAFile, caPEM, 0o644},
		{caKeyFile, caKeyPEM, 0o600},
		{ServerCertFile, certPEM, 0o644},
		{serverKeyFile, keyPEM, 0o600},
		{OperatorFile, seed(okp), 0o600},
		{AccountFile, seed(akp), 0o600},
		{agentsFile, seed(agkp), 0o600},
		{bansFile, seed(bkp), 0o600},
		{ServerCreds, server, 0o600},
		{PublisherCreds, publisher, 0o600},
		{ConfFile, []byte(conf), 0o600}, // last: its presence says the folder is complete
	}, nil
}

// LoadAccount reads the key of role r's account from the folder Init
// wrote.
func LoadAccount(dir string, r Role) (nkeys.KeyPair, error) {
	file := map[Role]string{Publisher: AccountFile, Agent: agentsFile, Bans: bansFile}[r]
	if file == "" {
		return nil, fmt.Errorf("%w %q", ErrRole, r)
	}
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the %s account key: %w (run `ipfence server init` first)", r, err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("%s: not an account key: %w", path, err)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("%s: not an account key", path)
	}
	return kp, nil
}

// IssueFile writes to out (mode 0600, never over a file) the
// credentials of a user of role r named name, signed with the account
// key Init wrote into dir.
func IssueFile(dir string, r Role, name, out string, expires time.Duration, now time.Time) error {
	akp, err := LoadAccount(dir, r)
	if err != nil {
		return err
	}
	creds, err := Issue(akp, r, name, expires, now)
	if err != nil {
		return err
	}
	return writeNew(out, creds, 0o600)
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := errors.Join(writeAll(f, data), f.Close()); err != nil {
		os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func writeAll(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}

// certificates makes a CA and a server certificate it signs for hosts
// (and localhost), ECDSA P-256, the CA for ten years, the server for
// two (TLS clients refuse longer).
func certificates(hosts []string, now time.Time) (caPEM, caKeyPEM, certPEM, keyPEM []byte, err error) {
	newKey := func() (*ecdsa.PrivateKey, []byte, error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("making a TLS key: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding a TLS key: %w", err)
		}
		return k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	serial := func() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) }
	caKey, caKeyPEM, err := newKey()
	if err != nil {
		return
	}
	sn, err := serial()
	if err != nil {
		return
	}
	ca := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: "ipfence fleet CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("signing the CA: %w", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("reading the CA back: %w", err)
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return
	}
	if sn, err = serial(); err != nil {
		return
	}
	leaf := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: "ipfence fleet server"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(2, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else if h != "" {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("signing the server certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), caKeyPEM,
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// preloadLine matches an account's line in nats.conf's resolver_preload:
// its public key and its JWT.
var preloadLine = regexp.MustCompile(`(?m)^  (A[A-Z2-7]{55}): "([A-Za-z0-9_.-]+)"$`)

// Revoke revokes the user of the credentials file creds, issued from
// dir, from now on: its account's JWT in dir's nats.conf is signed
// again with the revocation (by the operator key Init kept). The server
// takes it when it starts again (`systemctl restart ipfence-server`);
// connections already open stay until then.
func Revoke(dir, creds string, now time.Time) (upub string, r Role, err error) {
	uc, err := credsClaims(creds)
	if err != nil {
		return "", "", err
	}
	r = userRole(uc)
	akp, err := LoadAccount(dir, r)
	if err != nil {
		return "", "", err
	}
	apub, _ := akp.PublicKey()
	if uc.Issuer != apub {
		return "", "", fmt.Errorf("%s: issued by account %s, not by this fleet's %s account", creds, uc.Issuer, r)
	}
	b, err := os.ReadFile(filepath.Join(dir, OperatorFile))
	if err != nil {
		return "", "", fmt.Errorf("reading the operator key: %w", err)
	}
	okp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return "", "", fmt.Errorf("%s: not an operator key: %w", filepath.Join(dir, OperatorFile), err)
	}
	confPath := filepath.Join(dir, ConfFile)
	conf, err := os.ReadFile(confPath)
	if err != nil {
		return "", "", fmt.Errorf("reading %s: %w", confPath, err)
	}
	found := false
	var failed error
	out := preloadLine.ReplaceAllStringFunc(string(conf), func(line string) string {
		m := preloadLine.FindStringSubmatch(line)
		if m[1] != apub {
			return line
		}
		found = true
		ac, err := jwt.DecodeAccountClaims(m[2])
		if err != nil {
			failed = err
			return line
		}
		ac.RevokeAt(uc.Subject, now)
		signed, err := ac.Encode(okp)
		if err != nil {
			failed = err
			return line
		}
		return fmt.Sprintf("  %s: %q", apub, signed)
	})
	switch {
	case failed != nil:
		return "", "", fmt.Errorf("revoking in %s: %w", confPath, failed)
	case !found:
		return "", "", fmt.Errorf("%s names no %s account %s", confPath, r, apub)
	}
	tmp := confPath + ".new"
	if err := os.WriteFile(tmp, []byte(out), 0o600); err != nil {
		return "", "", fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, confPath); err != nil {
		return "", "", fmt.Errorf("writing %s: %w", confPath, err)
	}
	return uc.Subject, r, nil
}
