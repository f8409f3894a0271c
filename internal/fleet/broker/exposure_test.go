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
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
		if (err == nil) != tc.ok || err != nil && (!errors.Is(err, ErrExposed) || !strings.Contains(err.Error(), "dist/ipfence/nats.conf")) {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestShippedConfig: dist/ipfence/nats.conf, with its credentials in
// place, is a configuration the server takes beyond loopback; and Serve
// refuses 0.0.0.0 without one, before it listens.
func TestShippedConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	b, err := os.ReadFile("../../../dist/ipfence/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer("/run/credentials/ipfence-server.service/nats-cert.pem", cert,
		"/run/credentials/ipfence-server.service/nats-key.pem", key).Replace(string(b))
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkExposure("0.0.0.0", o); err != nil {
		t.Errorf("the shipped configuration: %v", err)
	}
	err = Serve(context.Background(), ServerConfig{DataDir: t.TempDir(), Listen: "0.0.0.0:-1"})
	if !errors.Is(err, ErrExposed) {
		t.Errorf("Serve on 0.0.0.0 without a configuration: %v, want ErrExposed", err)
	}
}
