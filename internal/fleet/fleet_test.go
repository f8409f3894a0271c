package fleet_test

import (
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
)

func randomSet(t *testing.T, r *rand.Rand, n int) *prefix.Set {
	t.Helper()
	var b prefix.Builder
	for range n {
		if r.IntN(3) == 0 {
			a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(256)), byte(r.IntN(256))})
			b.AddPrefix(netip.PrefixFrom(a, 32+r.IntN(17)).Masked())
			continue
		}
		a := netip.AddrFrom4([4]byte{byte(1 + r.IntN(200)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		b.AddPrefix(netip.PrefixFrom(a, 16+r.IntN(17)).Masked())
	}
	s, err := b.Build()
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
	t.Logf("%d prefixes in %d bytes", len(prefix.Prefixes(in.Rules[0].Set)), len(data))

	// With the layouts the publisher chose, the agent replays them: the
	// same plan again, without the search.
	pub, err := plan.Compile(in, plan.Options{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddLayouts(pub); err != nil || b.Version != 3 || b.Rules[0].Layout4 == "" {
		t.Fatalf("layouts: %v, version %d, %d and %d bytes", err, b.Version, len(b.Rules[0].Layout4), len(b.Rules[0].Layout6))
	}
	if data, err = b.Encode(); err != nil {
		t.Fatal(err)
	}
	if back, err = fleet.DecodeBundle(data); err != nil {
		t.Fatal(err)
	}
	if got, err = back.Input(); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Compile(got, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Rules[0].Replayed || p.Rules[0].ReplayNote != "" {
		t.Errorf("the agent did not replay the layouts: %q", p.Rules[0].ReplayNote)
	}
	pj, _ := json.Marshal(p)
	if !bytes.Equal(bytes.ReplaceAll(pj, []byte(`,"replayed":true`), nil), plans[0]) {
		t.Errorf("the replayed plan differs from the publisher's:\n%s\n%s", pj, plans[0])
	}
	t.Logf("with layouts: %d bytes", len(data))
	// A layout that does not read is searched here, and said so.
	back.Rules[0].Layout4 = "tree IPv4 root=99 in maps set=sha256-00\n"
	if got, err = back.Input(); err != nil || got.Rules[0].Chosen4 != nil {
		t.Fatalf("a malformed layout: %v", err)
	}
	if p, err = plan.Compile(got, plan.Options{}); err != nil || !strings.Contains(p.Rules[0].ReplayNote, "does not read") {
		t.Errorf("a malformed layout: %v, note %q", err, p.Rules[0].ReplayNote)
	}
	b.Version = 99
	if _, err := b.Input(); !errors.Is(err, fleet.ErrBundle) {
		t.Errorf("format 99: %v", err)
	}
}

// TestWriteLocal: the bundle WriteLocal streams reads back (DecodeLocal)
// as the one NewBundle makes, field for field and set for set, and a
// rule with no set has no prefixes.
func TestWriteLocal(t *testing.T) {
	in := testInput(t)
	in.Rules = append(in.Rules, plan.RuleInput{Name: "none", Action: plan.Drop, IPv4: true, Direction: plan.Outbound})
	now := time.Now()
	var buf bytes.Buffer
	if err := fleet.WriteLocal(&buf, in, 0x100000, "p.yaml", "rules: []\n", now); err != nil {
		t.Fatal(err)
	}
	back, err := fleet.DecodeLocal(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want, err := fleet.NewBundle(in, 0x100000, "p.yaml", "rules: []\n", now).EncodeLocal()
	if err != nil {
		t.Fatal(err)
	}
	wantB, err := fleet.DecodeLocal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(back)
	exp, _ := json.Marshal(wantB)
	if !bytes.Equal(got, exp) {
		t.Errorf("WriteLocal's bundle differs from NewBundle's:\n%s\n%s", got, exp)
	}
	gin, err := back.Input()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range in.Rules {
		if !gin.Rules[i].Set.Equal(r.Set) && !(r.Set == nil && gin.Rules[i].Set.Empty()) {
			t.Errorf("rule %s: set differs", r.Name)
		}
	}
}

// TestSignVerify: a pointer verifies with the publisher's public key
// only, as the pointer of the group it names only; a changed pointer,
// another key's signature, another group's pointer and a bundle whose
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
	got, err := fleet.Verify(signed, "web", pub)
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
		if _, err := fleet.Verify(d, "web", pub); !errors.Is(err, fleet.ErrSignature) || errors.Is(err, fleet.ErrGroup) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, read := range map[string]func() (*fleet.Pointer, error){
		"verify": func() (*fleet.Pointer, error) { return fleet.Verify(signed, "lab", pub) },
		"peek":   func() (*fleet.Pointer, error) { return fleet.Peek(signed, "lab") },
	} {
		if p, err := read(); !errors.Is(err, fleet.ErrGroup) || !errors.Is(err, fleet.ErrSignature) {
			t.Errorf("%s: web's pointer read as group lab's: %+v, %v", name, p, err)
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

// TestBanMessages: a fleet ban verifies with its key only, is never
// taken for a pointer or an allow entry (nor either for a ban), and its token is the
// same for every spelling of the prefix.
func TestBanMessages(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	pub := priv.Public().(ed25519.PublicKey)
	now := time.Now()
	b := &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.0.7/32"), Created: now, Expires: now.Add(time.Hour), Reason: "ssh", Origin: "web1"}
	data, err := fleet.SignBan(b, priv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fleet.VerifyBan(data, pub)
	if err != nil || got.Prefix != b.Prefix || !got.Expires.Equal(b.Expires) {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if left, live := got.Remaining(now.Add(20 * time.Minute)); !live || left != 40*time.Minute {
		t.Errorf("remaining after 20 min: %v %v", left, live)
	}
	if _, live := got.Remaining(now.Add(2 * time.Hour)); live {
		t.Error("an expired ban is in force")
	}
	forged, _ := fleet.SignBan(b, other)
	pointer, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: 1}, priv)
	for name, d := range map[string][]byte{"another key": forged, "a pointer": pointer} {
		if _, err := fleet.VerifyBan(d, pub); !errors.Is(err, fleet.ErrSignature) {
			t.Errorf("%s as a ban: %v", name, err)
		}
	}
	if _, err := fleet.Verify(data, "web", pub); !errors.Is(err, fleet.ErrSignature) {
		t.Errorf("a ban as a pointer: %v", err)
	}
	// An allow entry is never taken for a ban, nor a ban for one.
	allow, err := fleet.SignAllow(b, priv)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fleet.VerifyAllow(allow, pub); err != nil || got.Prefix != b.Prefix {
		t.Errorf("verify allow: %+v %v", got, err)
	}
	if _, err := fleet.VerifyAllow(data, pub); !errors.Is(err, fleet.ErrSignature) {
		t.Errorf("a ban as an allow entry: %v", err)
	}
	if _, err := fleet.VerifyBan(allow, pub); !errors.Is(err, fleet.ErrSignature) {
		t.Errorf("an allow entry as a ban: %v", err)
	}
	if forged, _ := fleet.SignAllow(b, other); forged != nil {
		if _, err := fleet.VerifyAllow(forged, pub); !errors.Is(err, fleet.ErrSignature) {
			t.Errorf("an allow entry of another key: %v", err)
		}
	}
	if a, b := fleet.BanToken(netip.MustParsePrefix("2001:2::1/64")), fleet.BanToken(netip.MustParsePrefix("2001:2::/64")); a != b {
		t.Errorf("tokens %s and %s for one prefix", a, b)
	}
	if a, b := fleet.BanToken(netip.MustParsePrefix("198.18.0.0/16")), fleet.BanToken(netip.MustParsePrefix("198.18.0.0/24")); a == b {
		t.Error("one token for two prefixes")
	}
}

// TestDrift classifies hosts against their groups' pointers: on the
// bundle they should run (a canary's own or its stable one), behind,
// failing with an error, silent without heartbeat, or in a group with
// no policy.
func TestDrift(t *testing.T) {
	now := time.Now()
	p := &fleet.Pointer{Group: "web", Seq: 5, Digest: "new", Canary: 50, Stable: &fleet.Target{Seq: 4, Digest: "old"}}
	var inCanary, outCanary string
	for i := 0; inCanary == "" || outCanary == ""; i++ {
		h := fmt.Sprint("web", i)
		if p.For(h).Digest == "new" {
			inCanary = h
		} else {
			outCanary = h
		}
	}
	fresh := now.Add(-time.Second)
	st := []fleet.Status{
		{Host: inCanary, Group: "web", Digest: "new", Heartbeat: fresh},
		{Host: outCanary, Group: "web", Digest: "old", Heartbeat: fresh},
		{Host: "b", Group: "web", Digest: "older", Heartbeat: fresh},
		{Host: "c", Group: "web", Digest: "older", LastError: "apply: boom", FailedSeq: 5, Heartbeat: fresh},
		{Host: "d", Group: "web", Digest: "new", Heartbeat: now.Add(-time.Hour)},
		{Host: "e", Group: "db", Heartbeat: fresh},
	}
	r := fleet.Drift(map[string]*fleet.Pointer{"web": p}, st, now, time.Minute)
	want := map[string]fleet.HostState{inCanary: fleet.Latest, outCanary: fleet.Latest, "b": fleet.Behind, "c": fleet.Failing, "d": fleet.Silent, "e": fleet.NoGroup}
	for _, h := range r.Hosts {
		if h.State != want[h.Host] {
			t.Errorf("host %s: %s, want %s", h.Host, h.State, want[h.Host])
		}
	}
	if r.Counts[fleet.Latest] != 2 || len(r.Hosts) != 6 {
		t.Errorf("counts %v", r.Counts)
	}
}

// TestBundleVersion writes version 2 only for a policy with outbound
// rules, which a version-1 reader would load as inbound ones, and 4 only
// for one with monitor rules, which an older reader would enforce; and
// reads the direction and mode back.
func TestBundleVersion(t *testing.T) {
	var b prefix.Builder
	b.AddPrefix(netip.MustParsePrefix("192.0.2.0/24"))
	set, _ := b.Build()
	in := &plan.Input{Rules: []plan.RuleInput{{Name: "feed", Action: plan.Drop, IPv4: true, Set: set}}}
	if v := fleet.NewBundle(in, 0, "p.yaml", "", time.Now()).Version; v != 1 {
		t.Errorf("inbound rules only: version %d, want 1", v)
	}
	in.Rules[0].Direction = plan.BothWays
	bd := fleet.NewBundle(in, 0, "p.yaml", "", time.Now())
	if bd.Version != 2 {
		t.Errorf("an outbound rule: version %d, want 2", bd.Version)
	}
	got, err := bd.Input()
	if err != nil || got.Rules[0].Direction != plan.BothWays {
		t.Errorf("read back: %v, direction %q; want both", err, got.Rules[0].Direction)
	}
	// A rule in monitor mode: version 4, which older agents refuse
	// rather than enforce the rule.
	in.Rules[0].Monitor = true
	bd = fleet.NewBundle(in, 0, "p.yaml", "", time.Now())
	if bd.Version != 4 {
		t.Errorf("a monitor rule: version %d, want 4", bd.Version)
	}
	got, err = bd.Input()
	if err != nil || !got.Rules[0].Monitor {
		t.Errorf("read back: %v, monitor %v; want true", err, got.Rules[0].Monitor)
	}
	// The policy's bans: version 5; and a bundle whose ban policy is out
	// of bounds does not read.
	in.Bans = ban.Policy{Aggregate6: 4}
	bd = fleet.NewBundle(in, 0, "p.yaml", "", time.Now())
	if bd.Version != 5 {
		t.Errorf("a ban policy: version %d, want 5", bd.Version)
	}
	if got, err = bd.Input(); err != nil || got.Bans != in.Bans {
		t.Errorf("read back: %v, bans %+v", err, got.Bans)
	}
	bd.Bans.Aggregate6 = 1
	if _, err := bd.Input(); !errors.Is(err, fleet.ErrBundle) {
		t.Errorf("aggregate_v6 1: %v", err)
	}
}

// TestBundleCarriesNoSecrets: the stored bundle records the policy
// without its api_key, URL password or query token, keeps the rest
// readable, and resolves to the same input; a text that cannot be
// redacted is not recorded at all.
func TestBundleCarriesNoSecrets(t *testing.T) {
	text := `# key: SECRET-COMMENT
sources:
  cs: {format: crowdsec, url: "http://127.0.0.1:8080/", api_key: SECRET-KEY}
  feeds: {format: list, url: "https://ops:SECRET-PASS@feeds.example/drop.txt?token=SECRET-TOKEN"}
rules:
  - {name: feeds, action: drop, match: {source: feeds}}
`
	in := testInput(t)
	data, err := fleet.NewBundle(in, 0, "p.yaml", text, time.Now()).Encode()
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"SECRET-COMMENT", "SECRET-KEY", "SECRET-PASS", "SECRET-TOKEN"} {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("the bundle holds %s", s)
		}
	}
	b, err := fleet.DecodeBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: feeds", "https://ops:xxxxx@feeds.example/drop.txt?token=xxxxx", "api_key: REDACTED"} {
		if !strings.Contains(b.Policy, want) {
			t.Errorf("the bundle's policy lacks %q:\n%s", want, b.Policy)
		}
	}
	got, err := b.Input()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range in.Rules {
		if got.Rules[i].Name != r.Name || !got.Rules[i].Set.Equal(r.Set) {
			t.Errorf("rule %d: %s differs from %s", i, got.Rules[i].Name, r.Name)
		}
	}
	if !got.Protect.Equal(in.Protect) {
		t.Errorf("protected prefixes differ")
	}
	if p := fleet.NewBundle(in, 0, "p.yaml", "api_key: [SECRET-KEY\n", time.Now()).Policy; p != "" {
		t.Errorf("an unredactable policy is recorded as %q", p)
	}
}
