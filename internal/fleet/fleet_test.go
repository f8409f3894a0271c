package fleet_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
)

func randomSet(t *testing.T, r *rand.Rand, n int) *netipx.IPSet {
	t.Helper()
	var b netipx.IPSetBuilder
	for range n {
		if r.IntN(3) == 0 {
			a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(256)), byte(r.IntN(256))})
			b.AddPrefix(netip.PrefixFrom(a, 32+r.IntN(17)).Masked())
			continue
		}
		a := netip.AddrFrom4([4]byte{byte(1 + r.IntN(200)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		b.AddPrefix(netip.PrefixFrom(a, 16+r.IntN(17)).Masked())
	}
	s, err := b.IPSet()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testInput(t *testing.T) *plan.Input {
	r := rand.New(rand.NewPCG(1, 2))
	return &plan.Input{Table: "ipfence", Priority: -300, Backend: plan.NFTables, Protect: randomSet(t, r, 3),
		Rules: []plan.RuleInput{
			{Name: "feeds", Action: plan.Drop, IPv4: true, IPv6: true, Set: randomSet(t, r, 20000), Where: "p.yaml:3"},
			{Name: "web", Action: plan.AllowOnly, Otherwise: plan.Reject, IPv4: true, Ports: []plan.Port{{Proto: "tcp", First: 443, Last: 443}}, Set: randomSet(t, r, 50)},
		}}
}

// TestBundleRoundTrip: what an agent reads back from a bundle compiles
// to the same plan as the publisher's input, and a bundle says which
// format version it is.
func TestBundleRoundTrip(t *testing.T) {
	in := testInput(t)
	b := fleet.NewBundle(in, 0x100000, "p.yaml", "rules: []\n", time.Now())
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := fleet.DecodeBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := back.Input()
	if err != nil {
		t.Fatal(err)
	}
	var plans [2][]byte
	for i, x := range []*plan.Input{in, got} {
		p, err := plan.Compile(x, plan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		plans[i], _ = json.Marshal(p)
	}
	if !bytes.Equal(plans[0], plans[1]) {
		t.Errorf("the bundle's plan differs from the publisher's")
	}
	for i, r := range in.Rules {
		if !got.Rules[i].Set.Equal(r.Set) {
			t.Errorf("rule %s: set differs", r.Name)
		}
	}
	t.Logf("%d prefixes in %d bytes", len(in.Rules[0].Set.Prefixes()), len(data))
	b.Version = 99
	if _, err := b.Input(); !errors.Is(err, fleet.ErrBundle) {
		t.Errorf("format 99: %v", err)
	}
}

// TestSignVerify: a pointer verifies with the publisher's public key
// only; a changed pointer, another key's signature and a bundle whose
// bytes changed are all refused, each with its own error.
func TestSignVerify(t *testing.T) {
	dir := t.TempDir()
	pubPath, keyPath, err := fleet.GenerateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key mode: %v %v", fi.Mode(), err)
	}
	if _, _, err := fleet.GenerateKey(dir); err == nil {
		t.Error("keygen overwrote a key")
	}
	priv, err := fleet.LoadPrivateKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := fleet.LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.LoadPublicKey(keyPath); !errors.Is(err, fleet.ErrKey) {
		t.Errorf("private key read as public: %v", err)
	}
	_, otherKey, _ := fleet.GenerateKey(filepath.Join(dir, "other"))
	other, _ := fleet.LoadPrivateKey(otherKey)

	data, _ := fleet.NewBundle(testInput(t), 0, "p.yaml", "", time.Now()).Encode()
	p := &fleet.Pointer{Group: "web", Seq: 7, Digest: fleet.Digest(data), Size: int64(len(data)), Created: time.Now()}
	signed, err := fleet.Sign(p, priv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fleet.Verify(signed, pub)
	if err != nil || got.Seq != 7 || got.Digest != p.Digest {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if _, err := got.For("host1").Check(data); err != nil {
		t.Errorf("check: %v", err)
	}

	forged, _ := fleet.Sign(p, other)
	var s fleet.Signed
	_ = json.Unmarshal(signed, &s)
	s.Payload = bytes.Replace(s.Payload, []byte(`"seq":7`), []byte(`"seq":8`), 1)
	tampered, _ := json.Marshal(&s)
	for name, d := range map[string][]byte{"another key": forged, "changed seq": tampered, "garbage": []byte("{")} {
		if _, err := fleet.Verify(d, pub); !errors.Is(err, fleet.ErrSignature) {
			t.Errorf("%s: %v", name, err)
		}
	}
	changed := bytes.Clone(data)
	changed[len(changed)/2] ^= 1
	if _, err := got.For("host1").Check(changed); !errors.Is(err, fleet.ErrDigest) {
		t.Errorf("changed bundle: %v", err)
	}
}

// TestCanary: a 10% canary sends about a tenth of the hosts to the new
// bundle and the rest to the stable one, the same hosts every time.
func TestCanary(t *testing.T) {
	p := &fleet.Pointer{Seq: 5, Digest: "new", Canary: 10, Stable: &fleet.Target{Seq: 4, Digest: "old"}}
	n := 0
	for i := range 1000 {
		host := fmt.Sprint("web", i)
		got := p.For(host)
		if got.Digest == "new" {
			n++
		} else if got.Digest != "old" {
			t.Fatal(got)
		}
		if again := p.For(host); again != got {
			t.Fatal("not stable")
		}
	}
	if n < 70 || n > 130 {
		t.Errorf("%d of 1000 hosts in a 10%% canary", n)
	}
	p.Canary = 0
	if p.For("web1").Digest != "new" {
		t.Error("no canary: every host runs the new bundle")
	}
}
