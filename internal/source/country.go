package source

import (
	"fmt"
	"strings"

	"github.com/ipfence/ipfence/internal/prefix"
)

// A country code is stored as its index in the 26×26 table of two-letter
// codes: (first-'A')*26 + (second-'A').
const (
	numCodes  = 26 * 26
	noCountry = 0xFFFF // entries of list sources
)

// iso3166 holds the officially assigned ISO 3166-1 alpha-2 codes (249), plus
// XK (Kosovo), which ISO leaves user-assigned but registries, the EU and the
// bundled data use.
var iso3166 = func() (t [numCodes]bool) {
	for _, c := range strings.Fields(`
		AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ
		BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ
		CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ
		DE DJ DK DM DO DZ
		EC EE EG EH ER ES ET
		FI FJ FK FM FO FR
		GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY
		HK HM HN HR HT HU
		ID IE IL IM IN IO IQ IR IS IT
		JE JM JO JP
		KE KG KH KI KM KN KP KR KW KY KZ
		LA LB LC LI LK LR LS LT LU LV LY
		MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ
		NA NC NE NF NG NI NL NO NP NR NU NZ
		OM
		PA PE PF PG PH PK PL PM PN PR PS PT PW PY
		QA
		RE RO RS RU RW
		SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ
		TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ
		UA UG UM US UY UZ
		VA VC VE VG VI VN VU
		WF WS
		XK
		YE YT
		ZA ZM ZW`) {
		i, _ := codeIndex(c)
		t[i] = true
	}
	return t
}()

// misnomers are codes people type that ISO 3166-1 assigns to no country, with
// the code they most likely meant.
var misnomers = map[string]string{
	"UK": "GB", // exceptionally reserved; the United Kingdom is GB
	"EL": "GR", // the EU's code for Greece
}

// IsCountryCode reports whether code (either case) is an officially
// assigned ISO 3166-1 alpha-2 code or XK (Kosovo).
func IsCountryCode(code string) bool {
	i, ok := codeIndex(code)
	return ok && iso3166[i]
}

// codeIndex returns the table index of a two-letter code, in either case.
func codeIndex(code string) (uint16, bool) {
	if len(code) != 2 {
		return 0, false
	}
	a, b := code[0]|0x20, code[1]|0x20 // lower case, if a letter
	if a < 'a' || a > 'z' || b < 'a' || b > 'z' {
		return 0, false
	}
	return uint16(a-'a')*26 + uint16(b-'a'), true
}

// codeString is the upper-case code of a table index.
func codeString(i uint16) string {
	if i >= numCodes {
		return ""
	}
	return string([]byte{'A' + byte(i/26), 'A' + byte(i%26)})
}

// UnknownCountryError reports a country code that is not two letters or, in
// a query, neither an ISO 3166-1 alpha-2 code nor a code present in the data.
type UnknownCountryError struct {
	Code string // as written
	// Malformed is true when Code is not two letters A–Z at all.
	Malformed bool
}

func (e *UnknownCountryError) Error() string {
	if e.Malformed {
		return fmt.Sprintf("unknown country code %q: a country code is two letters A-Z, ISO 3166-1 alpha-2 (e.g. IT, DE)", prefix.Clip(e.Code))
	}
	msg := fmt.Sprintf("unknown country code %q: not an ISO 3166-1 alpha-2 code, and not in this source's data", prefix.Clip(e.Code))
	if m, ok := misnomers[strings.ToUpper(e.Code)]; ok {
		msg += fmt.Sprintf("; did you mean %s?", m)
	}
	return msg
}
