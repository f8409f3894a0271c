package fleet

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"net/netip"
	"testing"
	"time"
)

// fuzzKey is a fixed key, so that fuzzing can find signed messages from
// the seeds.
var fuzzKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))

// FuzzVerifyBan: whatever arrives on the bans stream, VerifyBan returns
// either a ban with a valid prefix that the trusted key signed, or an
// ErrSignature; it never panics.
func FuzzVerifyBan(f *testing.F) {
	signed, err := SignBan(&Ban{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Created: time.Unix(1, 0), Reason: "r", Origin: "o"}, fuzzKey)
	if err != nil {
		f.Fatal(err)
	}
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	forged, _ := SignBan(&Ban{Prefix: netip.MustParsePrefix("0.0.0.0/0")}, other)
	ptr, _ := Sign(&Pointer{Group: "g", Seq: 1}, fuzzKey)
	for _, s := range [][]byte{signed, forged, ptr, nil, []byte("{}"), []byte(`{"kind":"ban","payload":{}}`), signed[:len(signed)/2]} {
		f.Add(s)
	}
	pub := fuzzKey.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := VerifyBan(data, pub)
		switch {
		case err != nil && !errors.Is(err, ErrSignature):
			t.Fatalf("error %v is not an ErrSignature", err)
		case err == nil && !b.Prefix.IsValid():
			t.Fatalf("verified a ban without a prefix: %+v", b)
		}
	})
}

// FuzzVerifyPointer: Verify returns a pointer only for the trusted key's
// signature and the group it was read as, never panics, and Peek agrees
// with it on what it decodes.
func FuzzVerifyPointer(f *testing.F) {
	p := &Pointer{Group: "web", Seq: 4, Digest: "sha256-00", Size: 10, Canary: 10, Stable: &Target{Seq: 3, Digest: "sha256-01", Size: 9}}
	signed, err := Sign(p, fuzzKey)
	if err != nil {
		f.Fatal(err)
	}
	ban, _ := SignBan(&Ban{Prefix: netip.MustParsePrefix("203.0.113.0/24")}, fuzzKey)
	lab, _ := Sign(&Pointer{Group: "lab", Seq: 9}, fuzzKey)
	for _, s := range [][]byte{signed, ban, lab, nil, []byte("[]"), []byte(`{"kind":"pointer","payload":null}`)} {
		f.Add(s)
	}
	pub := fuzzKey.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Verify(data, "web", pub)
		if err != nil {
			if !errors.Is(err, ErrSignature) {
				t.Fatalf("error %v is not an ErrSignature", err)
			}
			return
		}
		peek, err := Peek(data, "web")
		if err != nil || peek.Seq != got.Seq || peek.Digest != got.Digest || got.Group != "web" {
			t.Fatalf("Verify %+v, Peek %+v, %v", got, peek, err)
		}
		_ = got.For("host") // any canary split, without panicking
	})
}

// FuzzDecodeBundle: DecodeBundle and DecodeLocal read any bytes into a
// bundle or an ErrBundle, within MaxBundle, without panicking.
func FuzzDecodeBundle(f *testing.F) {
	good, err := (&Bundle{Version: 1, PolicyFile: "p.yaml", Policy: "rules: []\n", Table: "ipfence", Priority: -300}).Encode()
	if err != nil {
		f.Fatal(err)
	}
	local, err := (&Bundle{Version: 1, PolicyFile: "p.yaml", Table: "ipfence"}).EncodeLocal()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range [][]byte{good, good[:len(good)/2], local, local[:len(local)/2], nil, []byte("\x1f\x8b"), []byte("{}")} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := DecodeBundle(data); err != nil && !errors.Is(err, ErrBundle) {
			t.Fatalf("error %v is not an ErrBundle", err)
		}
		if _, err := DecodeLocal(data); err != nil && !errors.Is(err, ErrBundle) {
			t.Fatalf("local: error %v is not an ErrBundle", err)
		}
	})
}
