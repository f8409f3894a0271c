package nft

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/ipfence/ipfence/internal/plan"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from golden file (go test -update rewrites it)\n%s", name, lineDiff(string(want), got))
	}
}

// lineDiff shows the first lines where want and got differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 10; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
			shown++
		}
	}
	return b.String()
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *Program
	}{
		{"shapes.nft", shapesProgram()},
		{"minimal.nft", minimalProgram()},
		{"generated.nft", generatedProgram(1, 8, 3, 2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			got := Render(tc.p)
			if again := Render(tc.p); again != got {
				t.Fatal("Render is not deterministic")
			}
			golden(t, tc.name, got)
		})
	}
}

// TestWrite: Write streams exactly what Render returns, across many
// buffers, and reports a failing writer.
func TestWrite(t *testing.T) {
	p := generatedProgram(2, 60, 400, 200)
	want := Render(p)
	if len(want) < 3*64<<10 {
		t.Fatalf("the program renders to %d bytes, too few to cross buffers", len(want))
	}
	var b bytes.Buffer
	if err := Write(&b, p); err != nil || b.String() != want {
		t.Errorf("Write = %d bytes, %v; want Render's %d", b.Len(), err, len(want))
	}
	broken := errors.New("disk full")
	if err := Write(failingWriter{broken}, p); !errors.Is(err, broken) {
		t.Errorf("Write to a failing writer = %v, want %v", err, broken)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestRenderEmptySet(t *testing.T) {
	p := &Program{Table: "t", Sets: []*Set{{Name: "s", Family: IPv4, KeyBits: 32}}}
	got := Render(p)
	if strings.Contains(got, "elements") {
		t.Errorf("an empty set must have no elements line (nft rejects \"elements = { }\"):\n%s", got)
	}
	if !strings.Contains(got, "\t\tsize 16\n") {
		t.Errorf("an empty hash set gets size %d:\n%s", minHashSize, got)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(p *Program)
		want   string // substring of the error
	}{
		{"duplicate set", func(p *Program) { p.Sets = append(p.Sets, &Set{Name: "host4", Family: IPv4, KeyBits: 32}) }, "set host4: defined twice"},
		{"duplicate chain", func(p *Program) { p.Chains = append(p.Chains, &Chain{Name: "blocked"}) }, "chain blocked: defined twice"},
		{"missing set", func(p *Program) { p.Chains[0].Rules[0].Lookup.Set = "nope" }, `undefined set "nope"`},
		{"missing chain", func(p *Program) { editElem(&p.Sets[0].Elems, 1, func(e *Elem) { e.Verdict.Chain = "nope" }) }, `jump to undefined chain "nope"`},
		{"jump to base chain", func(p *Program) { p.Chains[3].Rules[5].Verdict = Verdict{Kind: Jump, Chain: "pre"} }, `jump to base chain "pre"`},
		{"bad table name", func(p *Program) { p.Table = "ip fence" }, "name must match"},
		{"name starts with digit", func(p *Program) { p.Chains[2].Name = "1blocked" }, "name must match"},
		{"quote in comment", func(p *Program) { p.Chains[4].Rules[0].Comment = `say "hi"` }, "quote"},
		{"wrong key length", func(p *Program) { editElem(&p.Sets[0].Elems, 0, func(e *Elem) { e.Key = pfx("10.0.0.0/8") }) }, "is not a /16 prefix"},
		{"wrong key family", func(p *Program) { editElem(&p.Sets[0].Elems, 0, func(e *Elem) { e.Key = pfx("2001:db8::/16") }) }, "is not an ipv4 prefix"},
		{"verdict in set", func(p *Program) { editElem(&p.Sets[4].Elems, 0, func(e *Elem) { e.Verdict = Verdict{Kind: Drop} }) }, "not a map"},
		{"map element without verdict", func(p *Program) { editElem(&p.Sets[0].Elems, 0, func(e *Elem) { e.Verdict = Verdict{} }) }, "without a verdict"},
		{"overlapping intervals", func(p *Program) {
			p.Sets[5].Elems.Append(Elem{Key: pfx("203.0.113.64/26")})
		}, "overlap"},
		{"interval map", func(p *Program) { p.Sets[5].IsMap = true }, "interval maps are not supported"},
		{"mask mismatch", func(p *Program) { p.Chains[0].Rules[0].Lookup.MaskBits = 16 }, "masks to /16 but set v4_10_2_24 holds /24"},
		{"set used as map", func(p *Program) { p.Chains[4].Rules[6].Lookup.IsMap = true }, "vmap/set mismatch"},
		{"family mismatch", func(p *Program) { p.Chains[4].Rules[4].Lookup.Family = IPv6 }, "ipv6 lookup in ipv4 set"},
		{"verdict after vmap", func(p *Program) { p.Chains[4].Rules[7].Verdict = Verdict{Kind: Drop} }, "vmap lookup ends the rule"},
		{"half key on a map", func(p *Program) { p.Sets[len(p.Sets)-1].IsMap = true }, "keyed on the address's leading half"},
		{"half key of /24", func(p *Program) { p.Sets[len(p.Sets)-1].KeyBits = 24 }, "keyed on the address's leading half"},
		{"tcp reset without tcp", func(p *Program) { p.Chains[2].Rules[0].Proto = 0 }, "needs Proto tcp"},
		{"reject with verdict", func(p *Program) { p.Chains[2].Rules[1].Verdict = Verdict{Kind: Drop} }, "no Verdict"},
		{"ports without proto", func(p *Program) { p.Chains[4].Rules[2].Proto = 0 }, "ports without a protocol"},
		{"reversed ports", func(p *Program) { p.Chains[3].Rules[1].Ports = []PortRange{{20, 10}} }, "reversed"},
		{"empty rule", func(p *Program) { p.Chains[3].Rules = append(p.Chains[3].Rules, Rule{}) }, "empty rule"},
		{"bad iif", func(p *Program) { p.Chains[4].Rules[0].Iif = `lo"` }, "bad interface name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := shapesProgram()
			tc.modify(p)
			err := p.Validate()
			if !errors.Is(err, ErrInvalidProgram) {
				t.Fatalf("Validate = %v, want ErrInvalidProgram", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %q, want it to contain %q", err, tc.want)
			}
		})
	}
	for _, p := range []*Program{shapesProgram(), minimalProgram(), generatedProgram(2, 50, 20, 10)} {
		if err := p.Validate(); err != nil {
			t.Errorf("valid program: %v", err)
		}
	}
}

func TestCanonicalPorts(t *testing.T) {
	for _, tc := range []struct {
		in, want []PortRange
		text     string
	}{
		{[]PortRange{{53, 53}}, []PortRange{{53, 53}}, "53"},
		{[]PortRange{{80, 90}}, []PortRange{{80, 90}}, "80-90"},
		{[]PortRange{{23, 23}, {22, 22}}, []PortRange{{22, 23}}, "22-23"},
		{[]PortRange{{80, 90}, {22, 22}, {85, 100}, {101, 101}}, []PortRange{{22, 22}, {80, 101}}, "{ 22, 80-101 }"},
		{[]PortRange{{0, 65535}, {1, 2}}, []PortRange{{0, 65535}}, "0-65535"},
		{[]PortRange{{500, 500}, {4500, 4500}}, []PortRange{{500, 500}, {4500, 4500}}, "{ 500, 4500 }"},
	} {
		in := slices.Clone(tc.in)
		got := canonicalPorts(tc.in)
		if !slices.Equal(got, tc.want) {
			t.Errorf("canonicalPorts(%v) = %v, want %v", in, got, tc.want)
		}
		if !slices.Equal(tc.in, in) {
			t.Errorf("canonicalPorts modified its input")
		}
		if s := portsText(got); s != tc.text {
			t.Errorf("portsText(%v) = %q, want %q", got, s, tc.text)
		}
	}
}

// elemString writes interval elements as nft --debug=netlink shows them:
// key, then "e" for an interval end or "o" for an open start.
func elemString(es []nftables.SetElement) string {
	var parts []string
	for _, e := range es {
		s := ""
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			s = a.String()
		} else {
			s = strconv.Itoa(int(e.Key[0])<<8 | int(e.Key[1]))
		}
		switch {
		case e.IntervalEnd:
			s += "e"
		case e.IntervalOpen:
			s += "o"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// The encodings below are those nft 1.0.6 sends (nft --debug=netlink -f).
func TestIntervalElems(t *testing.T) {
	var elems []Elem
	for _, s := range []string{"10.128.0.0/9", "10.0.0.0/9", "192.168.1.1/32", "192.168.1.2/32", "255.255.255.0/24"} {
		elems = append(elems, Elem{Key: pfx(s)})
	}
	rs, err := intervalRanges(ElemsOf(elems...))
	if err != nil {
		t.Fatal(err)
	}
	got := elemString(addrIntervalElems(rs))
	want := "0.0.0.0e 10.0.0.0 10.128.0.0e 10.128.0.0 11.0.0.0e 192.168.1.1 192.168.1.2e 192.168.1.2 192.168.1.3e 255.255.255.0o"
	if got != want {
		t.Errorf("v4 interval elements\n got %s\nwant %s", got, want)
	}

	rs, _ = intervalRanges(ElemsOf(Elem{Key: pfx("0.0.0.0/8")}))
	if got, want := elemString(addrIntervalElems(rs)), "0.0.0.0 1.0.0.0e"; got != want {
		t.Errorf("range from zero: got %s, want %s", got, want)
	}
	rs, _ = intervalRanges(ElemsOf(Elem{Key: pfx("::/0")}))
	if got, want := elemString(addrIntervalElems(rs)), "::o"; got != want {
		t.Errorf("::/0: got %s, want %s", got, want)
	}
	if got, want := elemString(portIntervalElems([]PortRange{{22, 22}, {80, 65535}})), "0e 22 23e 80o"; got != want {
		t.Errorf("ports: got %s, want %s", got, want)
	}
	if got, want := elemString(portIntervalElems([]PortRange{{0, 21}, {23, 23}})), "0 22e 23 24e"; got != want {
		t.Errorf("ports from zero: got %s, want %s", got, want)
	}
}

func TestLookupMask(t *testing.T) {
	for _, tc := range []struct {
		l    Lookup
		want string
	}{
		{Lookup{Family: IPv4, MaskBits: 16}, "255.255.0.0"},
		{Lookup{Family: IPv4, MaskBits: 23}, "255.255.254.0"},
		{Lookup{Family: IPv6, MaskBits: 48}, "ffff:ffff:ffff::"},
		{Lookup{Family: IPv4, MaskBits: 32}, ""},
		{Lookup{Family: IPv6}, ""},
	} {
		m, ok := lookupMask(&tc.l)
		got := ""
		if ok {
			got = m.String()
		}
		if got != tc.want {
			t.Errorf("lookupMask(%+v) = %q, want %q", tc.l, got, tc.want)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	p := generatedProgram(3, 2000, 100, 100)
	b.ReportAllocs()
	b.ReportMetric(float64(programElements(p)), "elements")
	for b.Loop() {
		_ = Render(p)
	}
}

// TestWithDynamic: the copy holds the bans and allows and looks them
// up (the allows first, in every base chain); the Program it was made
// from keeps empty sets and its base chains.
func TestWithDynamic(t *testing.T) {
	pl := &plan.Plan{Table: "ipfence", Priority: -300, Rules: []*plan.Rule{{Name: "feed", Action: plan.Drop,
		V4: &plan.Layout{Is4: true, Kind: plan.KindPlain, Prefixes: 1, Plain: []netip.Prefix{pfx("198.18.0.0/16")}},
		V6: &plan.Layout{Kind: plan.KindEmpty}}}}
	p := FromPlan(pl, Dynamic{})
	before := Render(p)
	d := Dynamic{
		Bans:   Entries{Addrs4: ElemsOf(Elem{Key: pfx("192.0.2.7/32")}), Nets6: ElemsOf(Elem{Key: pfx("2001:db8::/48")})},
		Allows: Entries{Addrs6: ElemsOf(Elem{Key: pfx("2001:2::5/128")}), Nets4: ElemsOf(Elem{Key: pfx("198.18.5.0/24")})},
	}
	q := WithDynamic(p, Heads(pl), -300, d)
	if Render(p) != before {
		t.Error("WithDynamic changed the Program it copied")
	}
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	got := Render(q)
	for _, want := range []string{"192.0.2.7", "2001:db8::/48", "198.18.5.0/24", "2001:2::5",
		"ip saddr @" + BanAddrs4 + " goto " + BanChain, "ip6 saddr @" + BanNets6 + " goto " + BanChain} {
		if !strings.Contains(got, want) {
			t.Errorf("the copy lacks %q:\n%s", want, got)
		}
	}
	for _, c := range []string{BaseChainName, ConnChainName} {
		i := slices.IndexFunc(q.Chains, func(ch *Chain) bool { return ch.Name == c })
		if i < 0 {
			t.Fatalf("no chain %s", c)
		}
		var sets []string
		for _, r := range q.Chains[i].Rules {
			if r.Lookup != nil {
				sets = append(sets, r.Lookup.Set)
			}
		}
		if len(sets) < 2 || sets[0] != AllowNets4 && sets[0] != AllowAddrs6 || sets[1] != AllowNets4 && sets[1] != AllowAddrs6 {
			t.Errorf("chain %s does not look the allow sets up first: %v", c, sets)
		}
	}
	if strings.Contains(got, "@"+BanAddrs6) || strings.Contains(got, "@"+BanNets4) || strings.Contains(got, "@"+AllowAddrs4) || strings.Contains(got, "@"+AllowNets6) {
		t.Errorf("the copy looks up empty sets:\n%s", got)
	}
	// Emptied again: the chains are FromPlan's.
	if r := Render(WithDynamic(q, Heads(pl), -300, Dynamic{})); r != before {
		t.Errorf("emptied, the copy differs from FromPlan's:\n%s\nwant\n%s", r, before)
	}
}
