package trial

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/plan"
	"github.com/ipfence/ipfence/internal/prefix"
	"github.com/ipfence/ipfence/internal/statedir"
)

func TestCheckWindow(t *testing.T) {
	for d, ok := range map[time.Duration]bool{0: false, time.Second: false, MinWindow: true, 2 * time.Minute: true, MaxWindow: true, MaxWindow + 1: false, -time.Minute: false} {
		if err := CheckWindow(d); (err == nil) != ok {
			t.Errorf("CheckWindow(%v) = %v", d, err)
		}
	}
}

// TestStore: a candidate becomes the revision in force; set aside, it is
// checked against its digest; a refused policy file stands in the
// confirmed revision while its text stays the same.
func TestStore(t *testing.T) {
	dir := t.TempDir()
	s := Store{Dir: statedir.Dir{Path: dir}, NetNS: "lab"}
	if rev, err := s.Revision(); rev != nil || err != nil {
		t.Fatalf("empty store: %v, %v", rev, err)
	}
	set, err := prefix.ReadSet(strings.NewReader("192.0.2.0/24\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	in := &plan.Input{Table: "ipfence", Rules: []plan.RuleInput{{Name: "r", Action: plan.Drop, IPv4: true, IPv6: true, Set: set}}}
	data, err := fleet.NewBundle(in, 0, "p.yaml", "rules: []\n", time.Now()).EncodeLocal()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s.WriteCandidate(func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil || d != Digest(data) {
		t.Fatalf("WriteCandidate: digest %s, want %s (%v)", d, Digest(data), err)
	}
	rev := Revision{Applied: time.Unix(100, 0).UTC(), Digest: Digest(data), Policy: "/etc/p.yaml", Backend: plan.NFTables}
	if err := s.CommitRevision(rev); err != nil {
		t.Fatal(err)
	}
	got, err := s.Revision()
	if err != nil || got == nil || *got != rev {
		t.Fatalf("Revision() = %+v, %v", got, err)
	}
	if err := s.SetAside(got); err != nil {
		t.Fatal(err)
	}
	bad := *got
	bad.Digest = Digest([]byte("other"))
	if err := s.SetAside(&bad); !errors.Is(err, ErrNoRevision) {
		t.Errorf("SetAside of a changed copy: %v", err)
	}
	p := &Pending{ID: NewID(), Back: got}
	if b, err := s.backBundle(p); err != nil || Digest(b) != got.Digest {
		t.Errorf("backBundle: %v", err)
	}

	// A refused policy file, while unchanged, gives the confirmed input.
	pol := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pol, []byte("refused\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if in, _, _, err := s.StandIn(pol); in != nil || err != nil {
		t.Fatalf("StandIn with nothing refused: %v, %v", in, err)
	}
	if err := s.Refuse(Refused{Policy: pol, PolicyDigest: Digest([]byte("refused\n")), Table: "ipfence", Why: "test"}); err != nil {
		t.Fatal(err)
	}
	sin, srev, ref, err := s.StandIn(pol)
	if err != nil || sin == nil || srev.Digest != rev.Digest || ref.Why != "test" || len(sin.Rules) != 1 || sin.Rules[0].Name != "r" {
		t.Fatalf("StandIn of the refused file: %+v, %+v, %v", sin, srev, err)
	}
	if err := os.WriteFile(pol, []byte("fixed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if in, _, _, err := s.StandIn(pol); in != nil || err != nil {
		t.Errorf("StandIn of a changed file: %v, %v", in, err)
	}
	if ref, _ := s.Refused(); ref != nil {
		t.Error("a refusal of another text outlived a look at the changed file")
	}
	// An unreadable confirmed copy is an error, not the refused file.
	if err := os.WriteFile(pol, []byte("refused\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Refuse(Refused{Policy: pol, PolicyDigest: Digest([]byte("refused\n")), Table: "ipfence", Why: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.revisionPath(".bundle"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if in, _, _, err := s.StandIn(pol); in != nil || !errors.Is(err, ErrNoRevision) {
		t.Errorf("StandIn with a damaged copy: %v, %v", in, err)
	}
	// Nothing confirmed (a rollback to nothing): an input without rules.
	if err := s.confirmNothing(); err != nil {
		t.Fatal(err)
	}
	if in, rev, _, err := s.StandIn(pol); err != nil || in == nil || len(in.Rules) != 0 || in.Table != "ipfence" || !rev.Nothing {
		t.Errorf("StandIn with nothing confirmed: %+v, %+v, %v", in, rev, err)
	}
	if err := errors.Join(s.ClearRefused(), s.ClearPending(), s.ForgetRevision()); err != nil {
		t.Fatal(err)
	}
	if rev, _ := s.Revision(); rev != nil {
		t.Error("the revision outlived ForgetRevision")
	}
}
