package source

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipfence/ipfence/internal/prefix"
	"go4.org/netipx"
)

// modelRow is a row of the synthetic data, as the model knows it.
type modelRow struct {
	file, line int
	lo, hi     netip.Addr
	cc         string
	asn        uint32 // asn-csv
	org        string // asn-csv: the name the row gives ("": none)
}

// covered says whether the source drops r: a row of its file and country
// that sorts before it (first address, widest first, line) contains it.
func covered(model []modelRow, r modelRow) bool {
	for _, q := range model {
		if q == r || q.file != r.file || !strings.EqualFold(q.cc, r.cc) || q.asn != r.asn || r.lo.Less(q.lo) || q.hi.Less(r.hi) {
			continue
		}
		if q.lo.Less(r.lo) || r.hi.Less(q.hi) || q.line < r.line {
			return true
		}
	}
	return false
}

// universe is a block of 256 addresses the model enumerates. Blocks at
// both ends of each family exercise the arithmetic at the edges.
var universes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/24"),
	netip.MustParsePrefix("10.0.0.0/24"),
	netip.MustParsePrefix("255.255.255.0/24"),
	netip.MustParsePrefix("::/120"),
	netip.MustParsePrefix("2001:db8::/120"),
	netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"),
}

// modelASNs are the autonomous systems of the synthetic asn-csv data
// (64503 is never used), and modelOrgs the names rows give them.
var (
	modelASNs = []uint32{64500, 64501, 4200000000, 64503}
	modelOrgs = []string{"Example, Inc.", `The "Quoted" Org`, "Plain"}
)

// modelCodes are the codes the synthetic data uses: countries, a
// placeholder, a withdrawn code. JP and US are valid codes it never uses.
var modelCodes = []string{"IT", "DE", "FR", "ZZ", "AN", "JP", "US"}

// TestModel compares Set, Countries and Explain with a brute-force model on
// random data: every address of two random universes, for random queries.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	trials := 400
	if testing.Short() {
		trials = 50
	}
	defer func(c int) { compactAt = c }(compactAt)
	for trial := range trials {
		format := []string{FormatCountryCSV, FormatRIRDelegated, FormatList, FormatASNCSV}[trial%4]
		u4 := universes[rng.IntN(3)]
		u6 := universes[3+rng.IntN(3)]
		files, model := modelData(rng, format, []netip.Prefix{u4, u6})
		// Half the trials drop redundant rows while reading too, every
		// few rows, as a file of millions of rows does.
		compactAt = []int{1 << 16, 1 + rng.IntN(8)}[trial%2]
		src, err := fromBytes(format, files...)
		if err != nil {
			t.Fatalf("trial %d (%s): %v\n%s", trial, format, err, files)
		}
		check := func(what string, got *prefix.Set, in func(r modelRow) bool) {
			t.Helper()
			var b netipx.IPSetBuilder
			for _, u := range []netip.Prefix{u4, u6} {
				for a := u.Addr(); u.Contains(a); a = a.Next() {
					for _, r := range model {
						if in(r) && !a.Less(r.lo) && !r.hi.Less(a) {
							b.Add(a)
							break
						}
					}
				}
			}
			want, _ := b.IPSet()
			if !got.IPSet().Equal(want) {
				t.Fatalf("trial %d (%s) %s:\ngot  %v\nwant %v\ndata:\n%s", trial, format, what, got.Ranges(), want.Ranges(), files)
			}
		}
		check("Set()", src.Set(), func(modelRow) bool { return true })
		if n4, n6 := src.Prefixes(); n4+n6 != len(prefix.Prefixes(src.Set())) {
			t.Fatalf("trial %d: Prefixes() = %d+%d, Set has %d", trial, n4, n6, len(prefix.Prefixes(src.Set())))
		}

		if format == FormatASNCSV {
			for range 4 {
				var asns []uint32
				for _, a := range modelASNs {
					if rng.IntN(3) == 0 {
						asns = append(asns, a)
					}
				}
				invert := rng.IntN(2) == 0
				got, err := src.ASNs(asns, invert)
				if err != nil {
					t.Fatalf("trial %d: ASNs(%v, %v): %v", trial, asns, invert, err)
				}
				check(fmt.Sprintf("ASNs(%v, %v)", asns, invert), got, func(r modelRow) bool { return slices.Contains(asns, r.asn) != invert })
			}
			if _, err := src.Countries([]string{"IT"}, false); !errors.Is(err, ErrNotCountry) {
				t.Fatalf("trial %d: Countries of an asn-csv source: %v", trial, err)
			}
		} else if format != FormatList {
			if _, err := src.ASNs([]uint32{64500}, false); !errors.Is(err, ErrNotASN) {
				t.Fatalf("trial %d: ASNs of a %s source: %v", trial, format, err)
			}
			for range 4 {
				var codes []string
				for _, c := range modelCodes {
					if rng.IntN(3) == 0 {
						if rng.IntN(2) == 0 {
							c = strings.ToLower(c)
						}
						codes = append(codes, c)
					}
				}
				invert := rng.IntN(2) == 0
				got, err := src.Countries(codes, invert)
				unknown := slices.ContainsFunc(codes, func(c string) bool {
					return !IsCountryCode(c) && !slices.ContainsFunc(model, func(r modelRow) bool { return strings.EqualFold(r.cc, c) })
				})
				var uc *UnknownCountryError
				if unknown {
					if !errors.As(err, &uc) {
						t.Fatalf("trial %d: Countries(%v, %v): error %v, want *UnknownCountryError", trial, codes, invert, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("trial %d: Countries(%v, %v): %v", trial, codes, invert, err)
				}
				check(fmt.Sprintf("Countries(%v, %v)", codes, invert), got, func(r modelRow) bool {
					return slices.ContainsFunc(codes, func(c string) bool { return strings.EqualFold(c, r.cc) }) != invert
				})
			}
		}

		for _, u := range []netip.Prefix{u4, u6} {
			for a := u.Addr(); u.Contains(a); a = a.Next() {
				var want []Match
				for _, r := range model { // in file order
					if !a.Less(r.lo) && !r.hi.Less(a) && !covered(model, r) {
						want = append(want, Match{
							Range:   netipx.IPRangeFrom(r.lo, r.hi),
							Origin:  fmt.Sprintf("f%d:%d", r.file, r.line),
							Country: r.cc,
							ASN:     r.asn,
							Org:     modelOrg(model, r.asn),
						})
					}
				}
				if got := src.Explain(a); !slices.Equal(got, want) {
					t.Fatalf("trial %d (%s): Explain(%v) =\n%v\nwant\n%v\ndata:\n%s", trial, format, a, got, want, files)
				}
			}
		}
	}
}

// modelData returns 1 to 3 random files of the format, with rows inside
// the universes, and the rows in file order.
func modelData(rng *rand.Rand, format string, us []netip.Prefix) ([][]byte, []modelRow) {
	var files [][]byte
	var model []modelRow
	for file := range 1 + rng.IntN(3) {
		var b strings.Builder
		line := 0
		emit := func(s string) { line++; b.WriteString(s); b.WriteByte('\n') }
		if format == FormatRIRDelegated {
			emit("2|test|20260101|10|19830705|20260101|+0000")
			emit("test|*|ipv4|*|10|summary")
		}
		for range rng.IntN(12) {
			if rng.IntN(8) == 0 {
				emit("# comment")
				continue
			}
			u := us[rng.IntN(len(us))]
			cc := modelCodes[rng.IntN(5)] // not JP and US
			var asn uint32
			org := ""
			if format == FormatASNCSV {
				asn, cc = modelASNs[rng.IntN(3)], ""
				cc = fmt.Sprint(asn)
				if rng.IntN(2) == 0 {
					cc = "AS" + cc
				}
				if i := rng.IntN(len(modelOrgs) + 1); i < len(modelOrgs) {
					org = modelOrgs[i]
					cc += "," + strings.NewReplacer(`"`, `""`).Replace(org)
					if strings.Contains(org, `"`) {
						cc = "AS" + fmt.Sprint(asn) + `,"` + strings.ReplaceAll(org, `"`, `""`) + `"`
					}
				}
			}
			lo, hi, text := modelRange(rng, u, format, cc)
			if text == "" {
				continue
			}
			emit(text)
			if format == FormatList || format == FormatASNCSV {
				cc = ""
			}
			model = append(model, modelRow{file: file, line: line, lo: lo, hi: hi, cc: cc, asn: asn, org: org})
		}
		files = append(files, []byte(b.String()))
	}
	return files, model
}

// modelRange returns a random range in u and a row of the format for it
// ("" if the format cannot express it).
func modelRange(rng *rand.Rand, u netip.Prefix, format, cc string) (lo, hi netip.Addr, text string) {
	is4 := u.Addr().Is4()
	if rng.IntN(2) == 0 || format == FormatRIRDelegated && !is4 {
		// An aligned prefix of 1 to 256 addresses.
		bits := rng.IntN(9)
		p, _ := u.Addr().Prefix(u.Addr().BitLen() - bits)
		first := p.Addr()
		for range rng.IntN(256 >> bits) {
			first = nextN(first, 1<<bits)
		}
		p = netip.PrefixFrom(first, u.Addr().BitLen()-bits)
		r := netipx.RangeOfPrefix(p)
		lo, hi = r.From(), r.To()
		switch format {
		case FormatCountryCSV, FormatASNCSV:
			return lo, hi, p.String() + "," + cc
		case FormatRIRDelegated:
			if is4 {
				return lo, hi, fmt.Sprintf("test|%s|ipv4|%s|%d|20260101|allocated", cc, lo, 1<<bits)
			}
			return lo, hi, fmt.Sprintf("test|%s|ipv6|%s|%d|20260101|assigned|x", cc, lo, p.Bits())
		default:
			return lo, hi, p.String()
		}
	}
	i, j := rng.IntN(256), rng.IntN(256)
	if i > j {
		i, j = j, i
	}
	lo, hi = nextN(u.Addr(), i), nextN(u.Addr(), j)
	switch format {
	case FormatCountryCSV, FormatASNCSV:
		return lo, hi, fmt.Sprintf("%s,%s,%s", lo, hi, cc)
	case FormatRIRDelegated:
		return lo, hi, fmt.Sprintf("test|%s|ipv4|%s|%d|20260101|allocated", cc, lo, j-i+1)
	default:
		return lo, hi, fmt.Sprintf("%s-%s", lo, hi)
	}
}

// modelOrg is the name of asn: the first row (in file order) that gives
// one.
func modelOrg(model []modelRow, asn uint32) string {
	for _, r := range model {
		if r.asn == asn && r.org != "" {
			return r.org
		}
	}
	return ""
}

func nextN(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}
