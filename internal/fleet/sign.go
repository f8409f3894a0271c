package fleet

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Key file names in the folder GenerateKey writes.
const (
	PrivateKeyFile = "ipfence.key"
	PublicKeyFile  = "ipfence.pub"
)

// GenerateKey writes a new ed25519 key pair into dir: the private key
// (PKCS #8 PEM, mode 0600) and the public key (PKIX PEM). It refuses to
// overwrite a key: a fleet whose agents trust the old public key would
// stop following.
func GenerateKey(dir string) (pubPath, keyPath string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generating a key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", "", fmt.Errorf("encoding the private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", "", fmt.Errorf("encoding the public key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("making the key folder: %w", err)
	}
	keyPath, pubPath = filepath.Join(dir, PrivateKeyFile), filepath.Join(dir, PublicKeyFile)
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return "", "", fmt.Errorf("%s exists: move the old key pair away first", p)
		}
	}
	for _, f := range []struct {
		path string
		mode os.FileMode
		blk  *pem.Block
	}{{keyPath, 0o600, &pem.Block{Type: "PRIVATE KEY", Bytes: der}}, {pubPath, 0o644, &pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}}} {
		w, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return "", "", fmt.Errorf("writing the key: %w (move the old key pair away first)", err)
		}
		if err := errors.Join(pem.Encode(w, f.blk), w.Close()); err != nil {
			return "", "", fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	return pubPath, keyPath, nil
}

// ErrKey is returned for a key file that holds no ed25519 key.
var ErrKey = errors.New("not an ed25519 key")

// LoadPrivateKey reads a private key GenerateKey wrote.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	return loadKey[ed25519.PrivateKey](path, "PRIVATE KEY", x509.ParsePKCS8PrivateKey, "make one with `ipfence keygen`")
}

// LoadPublicKey reads a public key GenerateKey wrote.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	return loadKey[ed25519.PublicKey](path, "PUBLIC KEY", x509.ParsePKIXPublicKey, "use the ipfence.pub `ipfence keygen` wrote")
}

// loadKey reads the key of PEM block typ in path.
func loadKey[K ed25519.PrivateKey | ed25519.PublicKey](path, typ string, parse func([]byte) (any, error), hint string) (K, error) {
	der, err := readPEM(path, typ)
	if err != nil {
		return nil, err
	}
	k, err := parse(der)
	if key, ok := k.(K); err == nil && ok {
		return key, nil
	}
	return nil, fmt.Errorf("%s: %w (%s)", path, ErrKey, hint)
}

func readPEM(path, typ string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the key: %w", err)
	}
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != typ {
		return nil, fmt.Errorf("%s: %w: no PEM block %q", path, ErrKey, typ)
	}
	return blk.Bytes, nil
}

// KeyID names a public key in messages and pointers: the first 8 bytes
// of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Pointer says which bundle a group of hosts runs. Seq grows with every
// publish and rollback of the group: an agent never goes back to a lower
// one, so an old signed pointer replayed does not roll a host back.
type Pointer struct {
	Group   string    `json:"group"`
	Seq     uint64    `json:"seq"`
	Digest  string    `json:"digest"` // the bundle's Digest: its name in the store
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// Canary, from 1 to 99, sends only that percentage of the group's
	// hosts (chosen by their names) to Digest; the others stay on Stable.
	// 0 is every host.
	Canary int     `json:"canary,omitempty"`
	Stable *Target `json:"stable,omitempty"`
	// Deltas are difference bundles (Delta) that make Digest's bundle
	// of the bundles hosts ran before it: a host that runs one's Base
	// may fetch it instead of the whole bundle. Older agents ignore
	// them.
	Deltas []DeltaRef `json:"deltas,omitempty"`
}

// DeltaRef names a stored Delta: the bundle it applies to, and its own
// digest and size.
type DeltaRef struct {
	Base   string `json:"base"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// DeltaFrom is the pointer's delta that turns base into target's bundle
// (nil: none). Deltas make the pointer's Digest only.
func (p *Pointer) DeltaFrom(base string, target Target) *DeltaRef {
	if target.Digest != p.Digest {
		return nil
	}
	for i := range p.Deltas {
		if p.Deltas[i].Base == base {
			return &p.Deltas[i]
		}
	}
	return nil
}

// Target is a bundle a pointer leads to.
type Target struct {
	Seq    uint64 `json:"seq"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Signed is a signed message as stored: a Pointer's or a Ban's JSON,
// what it is, and who signed it. The signature covers the kind, so that
// a message of one kind is never taken for the other.
type Signed struct {
	Kind    string `json:"kind"`
	Payload []byte `json:"payload"`
	KeyID   string `json:"key_id"`
	Sig     []byte `json:"sig"`
}

// The kinds of signed messages.
const (
	kindPointer = "pointer"
	kindBan     = "ban"
	kindAllow   = "allow"
)

// signed is what a signature of kind over payload covers.
func signed(kind string, payload []byte) []byte {
	return append([]byte("ipfence "+kind+"\n"), payload...)
}

// sign signs v, a message of kind, with priv.
func sign(kind string, v any, priv ed25519.PrivateKey) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s: %w", kind, err)
	}
	return json.Marshal(&Signed{Kind: kind, Payload: payload, KeyID: KeyID(priv.Public().(ed25519.PublicKey)), Sig: ed25519.Sign(priv, signed(kind, payload))})
}

// ErrSignature is returned for a message that the trusted key did not
// sign.
var ErrSignature = errors.New("signature does not verify")

// open decodes data, a message of kind, into v if pub signed it; Peek
// alone passes check false, to decode without checking the signature.
func open(kind string, data []byte, pub ed25519.PublicKey, check bool, v any) error {
	var s Signed
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("%w: not a signed %s: %v", ErrSignature, kind, err)
	}
	if s.Kind != kind {
		return fmt.Errorf("%w: a signed %q where a %s belongs", ErrSignature, s.Kind, kind)
	}
	if check && !ed25519.Verify(pub, signed(kind, s.Payload), s.Sig) {
		return fmt.Errorf("%w: signed by key %q, this host trusts key %s (check --pubkey)", ErrSignature, s.KeyID, KeyID(pub))
	}
	if err := json.Unmarshal(s.Payload, v); err != nil {
		return fmt.Errorf("%w: signed, but not a %s: %v", ErrSignature, kind, err)
	}
	return nil
}

// Sign signs p with priv.
func Sign(p *Pointer, priv ed25519.PrivateKey) ([]byte, error) { return sign(kindPointer, p, priv) }

// ErrGroup is returned for a pointer read at another group's key than
// the one it names: a pointer counts only for its own group (a keyless
// client could copy one group's signed pointer to another's key).
var ErrGroup = fmt.Errorf("%w: a pointer of another group", ErrSignature)

// Verify returns the pointer in data, read at group's key, if pub signed
// it for group.
func Verify(data []byte, group string, pub ed25519.PublicKey) (*Pointer, error) {
	return openPointer(data, group, pub, true)
}

// Peek returns the pointer in data, read at group's key, if it names
// group, without checking who signed it: for reports only, never to
// decide what a host runs.
func Peek(data []byte, group string) (*Pointer, error) {
	return openPointer(data, group, nil, false)
}

// openPointer is Verify (check true) and Peek.
func openPointer(data []byte, group string, pub ed25519.PublicKey, check bool) (*Pointer, error) {
	var p Pointer
	if err := open(kindPointer, data, pub, check, &p); err != nil {
		return nil, err
	}
	if p.Group != group {
		return nil, fmt.Errorf("%w: it names group %q, it was read as group %s's", ErrGroup, p.Group, group)
	}
	return &p, nil
}

// ErrDigest is returned for a bundle whose bytes are not the ones its
// pointer names.
var ErrDigest = errors.New("bundle does not match its signed digest")

// For returns the bundle host should run: Digest, or during a canary
// Stable for hosts outside it. Which hosts are in a canary depends on the
// host's name and the pointer's Seq only, so it is stable across restarts
// and different for each rollout.
func (p *Pointer) For(host string) Target {
	cur := Target{Seq: p.Seq, Digest: p.Digest, Size: p.Size}
	if p.Canary <= 0 || p.Canary >= 100 || p.Stable == nil {
		return cur
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", host, p.Seq))
	if int(sum[0])<<8|int(sum[1]) < p.Canary*65536/100 {
		return cur
	}
	return *p.Stable
}

// CheckDelta returns the delta data holds if it is r's.
func (r *DeltaRef) CheckDelta(data []byte) (*Delta, error) {
	if d := Digest(data); d != r.Digest || int64(len(data)) != r.Size {
		return nil, fmt.Errorf("%w: got %s (%d bytes), the pointer names %s (%d bytes)", ErrDigest, d, len(data), r.Digest, r.Size)
	}
	return DecodeDelta(data)
}

// Check returns the bundle data holds if it is t's.
func (t Target) Check(data []byte) (*Bundle, error) {
	if d := Digest(data); d != t.Digest || int64(len(data)) != t.Size {
		return nil, fmt.Errorf("%w: got %s (%d bytes), the pointer names %s (%d bytes)", ErrDigest, d, len(data), t.Digest, t.Size)
	}
	return DecodeBundle(data)
}
