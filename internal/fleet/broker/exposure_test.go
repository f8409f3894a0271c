package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// selfSigned writes a certificate and key for 127.0.0.1 into dir.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ipfence test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestExposure: beyond loopback the server needs TLS and authentication
// from its configuration file, and no no_auth_user; on loopback nothing.
func TestExposure(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	tls := "tls { cert_file: \"" + cert + "\", key_file: \"" + key + "\" }\n"
	users := "authorization { users = [ {user: agent, password: \"x\"} ] }\n"
	for _, tc := range []struct {
		name, host, conf string
		ok               bool
	}{
		{"loopback, nothing", "127.0.0.1", "", true},
		{"localhost, nothing", "localhost", "", true},
		{"IPv6 loopback", "::1", "", true},
		{"everywhere, nothing", "0.0.0.0", "", false},
		{"all IPv6, nothing", "::", "", false},
		{"an address, TLS only", "192.0.2.1", tls, false},
		{"an address, users only", "192.0.2.1", users, false},
		{"everywhere, TLS and users", "0.0.0.0", tls + users, true},
		{"everywhere, TLS, users and no_auth_user", "0.0.0.0", tls + users + "no_auth_user: agent\n", false},
		{"everywhere, TLS and a token", "0.0.0.0", tls + "authorization { token: \"s3cret\" }\n", true},
	} {
		o := &server.Options{}
		if tc.conf != "" {
			path := filepath.Join(dir, "nats.conf")
			if err := os.WriteFile(path, []byte(tc.conf), 0o600); err != nil {
				t.Fatal(err)
			}
			var err error
			if o, err = server.ProcessConfigFile(path); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		err := checkExposure(tc.host, o)
		if (err == nil) != tc.ok || err != nil && (!errors.Is(err, ErrExposed) || !strings.Contains(err.Error(), "ipfence server init")) {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestShippedConfig: what `server init` writes for the systemd unit is
// a configuration the server takes beyond loopback, and the unit hands
// the server every file it names; Serve refuses 0.0.0.0 without one,
// before it listens.
func TestShippedConfig(t *testing.T) {
	dir, run := t.TempDir(), "/run/credentials/ipfence-server.service"
	if err := Init(InitConfig{Dir: dir, RunDir: run, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile("../../../dist/systemd/ipfence-server.service")
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^LoadCredential=([^:]+):/etc/ipfence/nats/(.+)$`).FindAllStringSubmatch(string(unit), -1) {
		if m[1] != m[2] {
			t.Errorf("LoadCredential %s from %s: the names differ", m[1], m[2])
		}
		if _, err := os.Stat(filepath.Join(dir, m[2])); err != nil {
			t.Errorf("the unit loads %s, init did not write it: %v", m[2], err)
		}
		loaded[m[1]] = true
	}
	conf, err := os.ReadFile(filepath.Join(dir, ConfFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(regexp.QuoteMeta(run)+`/([^"]+)`).FindAllStringSubmatch(string(conf), -1) {
		if !loaded[m[1]] {
			t.Errorf("nats.conf reads %s, the unit does not load it", m[0])
		}
	}
	for _, f := range []string{ConfFile, ServerCreds} {
		if !loaded[f] || !strings.Contains(string(unit), "${CREDENTIALS_DIRECTORY}/"+f) {
			t.Errorf("the unit does not run the server with %s", f)
		}
	}
	// The same folder with its paths: the server takes it beyond loopback.
	local := t.TempDir()
	if err := Init(InitConfig{Dir: local, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(filepath.Join(local, ConfFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkExposure("0.0.0.0", o); err != nil {
		t.Errorf("the configuration init wrote: %v", err)
	}
	err = Serve(context.Background(), ServerConfig{DataDir: t.TempDir(), Listen: "0.0.0.0:-1"})
	if !errors.Is(err, ErrExposed) {
		t.Errorf("Serve on 0.0.0.0 without a configuration: %v, want ErrExposed", err)
	}
	err = Serve(context.Background(), ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", ConfigFile: filepath.Join(local, ConfFile)})
	if !errors.Is(err, ErrNATS) {
		t.Errorf("Serve with JWT users and no --creds: %v, want ErrNATS", err)
	}
}

// TestNamesAndDeletes: names are dot-separated tokens (a NATS subject's
// tokens may not be empty); a status is deleted only by the KV's own
// header, not by those words anywhere in the headers.
func TestNamesAndDeletes(t *testing.T) {
	for name, ok := range map[string]bool{"web1": true, "web1.example.com": true, "a-b_c": true,
		"web2.": false, ".web": false, "a..b": false, "a b": false, "": false, strings.Repeat("a", 129): false} {
		if err := CheckName("host", name); (err == nil) != ok {
			t.Errorf("CheckName(%q): %v, want ok %v", name, err, ok)
		}
	}
	for hdrs, want := range map[string]bool{
		"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n":         true,
		"NATS/1.0\r\nKV-Operation: PURGE\r\n\r\n":       true,
		"NATS/1.0\r\nX-Note: KV-Operation: DEL\r\n\r\n": false,
		"NATS/1.0\r\nKV-Operation: none\r\n\r\n":        false,
		"":                                              false,
	} {
		if got := kvDeleted([]byte(hdrs)); got != want {
			t.Errorf("kvDeleted(%q) = %v", hdrs, got)
		}
	}
}

// TestPerUser: one reader holds at most maxPerUser of the relay's
// places; others keep theirs, and a place is given back when done.
func TestPerUser(t *testing.T) {
	var p perUser
	for i := range maxPerUser {
		if !p.add("a") {
			t.Fatalf("read %d of a refused", i)
		}
	}
	if p.add("a") {
		t.Fatal("a holds more than maxPerUser places")
	}
	if !p.add("b") {
		t.Fatal("b refused while a is full")
	}
	p.done("a")
	if !p.add("a") {
		t.Fatal("a's place was not given back")
	}
	m := nats.NewMsg("ipfence.read.agent")
	m.Header.Add("Nats-Request-Info", `{"acc":"FORGED","user":"x"}`)
	m.Header.Add("Nats-Request-Info", `{"acc":"AGENTS","user":"UABC","server":"s","id":7}`)
	if got := requester(m); got != "AGENTS/UABC/s/7" {
		t.Errorf("requester %q, want the server's (last) request info", got)
	}
}
