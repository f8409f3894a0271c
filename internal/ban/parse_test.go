package ban

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in   string
		want string // masked prefix; "" when an error is expected
		err  error
	}{
		{in: "203.0.113.5", want: "203.0.113.5/32"},
		{in: " 203.0.113.5\n", want: "203.0.113.5/32"},
		{in: "2001:db8::1", want: "2001:db8::1/128"},
		{in: "203.0.113.0/24", want: "203.0.113.0/24"},
		{in: "203.0.113.77/24", want: "203.0.113.0/24"}, // host bits masked
		{in: "2001:db8::1/32", want: "2001:db8::/32"},
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "2001::/16", want: "2001::/16"},
		{in: "203.0.113.5/32", want: "203.0.113.5/32"},
		{in: "::ffff:203.0.113.5", want: "203.0.113.5/32"}, // unmapped
		{in: "::ffff:203.0.113.5/120", want: "203.0.113.0/24"},
		{in: "::ffff:203.0.113.5/128", want: "203.0.113.5/32"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},

		{in: "", err: ErrInvalid},
		{in: "   ", err: ErrInvalid},
		{in: "example.com", err: ErrInvalid},
		{in: "203.0.113", err: ErrInvalid},
		{in: "203.0.113.256", err: ErrInvalid},
		{in: "010.0.0.1", err: ErrInvalid}, // octal or decimal? refused
		{in: "203.0.113.0/33", err: ErrInvalid},
		{in: "203.0.113.0/", err: ErrInvalid},
		{in: "203.0.113.0/-1", err: ErrInvalid},
		{in: "2001:db8::/129", err: ErrInvalid},
		{in: "fe80::1%eth0", err: ErrInvalid},
		{in: "fe80::1%eth0/64", err: ErrInvalid},
		{in: "203.0.113.0/255.255.255.0", err: ErrInvalid},
		{in: "203.0.113.1-203.0.113.9", err: ErrInvalid},
		{in: "::ffff:0.0.0.0/95", err: ErrInvalid}, // mapped, but not an IPv4 prefix

		{in: "0.0.0.0/0", err: ErrTooBroad},
		{in: "::/0", err: ErrTooBroad},
		{in: "10.0.0.0/7", err: ErrTooBroad},
		{in: "2001::/15", err: ErrTooBroad},
		{in: "::ffff:10.0.0.0/100", err: ErrTooBroad}, // 10.0.0.0/4
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePrefix(tt.in)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParsePrefix(%q) = %v, %v; want error %v", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePrefix(%q): %v", tt.in, err)
			}
			if got.String() != tt.want {
				t.Errorf("ParsePrefix(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestParsePrefixErrorText checks that errors quote the input and say what
// to do, and stay short for huge input.
func TestParsePrefixErrorText(t *testing.T) {
	_, err := ParsePrefix("10.0.0.0/4")
	if msg := err.Error(); !strings.Contains(msg, `"10.0.0.0/4"`) || !strings.Contains(msg, "narrower") {
		t.Errorf("error %q does not quote the input or say what to do", msg)
	}
	_, err = ParsePrefix(strings.Repeat("x", 10000))
	if n := len(err.Error()); n > 400 {
		t.Errorf("error for a 10k input is %d bytes long", n)
	}
}

func TestParseTTL(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool // wraps ErrTTL
	}{
		{in: "", want: 0},
		{in: "0", want: 0},
		{in: " 0 ", want: 0},
		{in: "1s", want: time.Second},
		{in: "90s", want: 90 * time.Second},
		{in: "15m", want: 15 * time.Minute},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "1.5h", want: 90 * time.Minute},
		{in: "1500ms", want: 1500 * time.Millisecond},
		{in: "7d", want: 7 * 24 * time.Hour},
		{in: "2w", want: 14 * 24 * time.Hour},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "1w2d3h4m5s", want: 9*24*time.Hour + 3*time.Hour + 4*time.Minute + 5*time.Second},
		{in: "0.5d", want: 12 * time.Hour},
		{in: "366d", want: MaxTTL},
		{in: "52w2d", want: MaxTTL},
		{in: "8784h", want: MaxTTL},

		{in: "0s", err: true}, // "0" is permanent, "0s" a mistake
		{in: "0d", err: true},
		{in: "999ms", err: true},
		{in: "1ns", err: true},
		{in: "367d", err: true},
		{in: "366d1s", err: true},
		{in: "53w", err: true},
		{in: "99999999999999999999h", err: true}, // would overflow
		{in: "1e300d", err: true},
		{in: "-1h", err: true},
		{in: "+1h", err: true},
		{in: "1", err: true}, // no unit
		{in: "1h30", err: true},
		{in: "1y", err: true},
		{in: "1 h", err: true},
		{in: "h", err: true},
		{in: ".h", err: true},
		{in: "1..5h", err: true},
		{in: "forever", err: true},
		{in: "1D", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTTL(tt.in)
			if tt.err {
				if !errors.Is(err, ErrTTL) {
					t.Fatalf("ParseTTL(%q) = %v, %v; want an error wrapping ErrTTL", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTTL(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParseTTL(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzParsePrefix(f *testing.F) {
	for _, s := range []string{
		"203.0.113.5", "2001:db8::1", "203.0.113.0/24", "203.0.113.77/24",
		"::ffff:203.0.113.5/120", "fe80::1%eth0", "0.0.0.0/0", "10.0.0.0/8",
		"2001::/16", "::ffff:0.0.0.0/95", "1.2.3.4/033", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePrefix(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooBroad) {
				t.Fatalf("ParsePrefix(%q): error %v wraps neither ErrInvalid nor ErrTooBroad", s, err)
			}
			return
		}
		if !p.IsValid() || p != p.Masked() {
			t.Fatalf("ParsePrefix(%q) = %v, not valid and masked", s, p)
		}
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			t.Fatalf("ParsePrefix(%q) = %v, mapped or zoned", s, p)
		}
		if p.Bits() < MinBits(p.Addr()) {
			t.Fatalf("ParsePrefix(%q) = %v, too broad", s, p)
		}
		again, err := ParsePrefix(p.String())
		if err != nil || again != p {
			t.Fatalf("ParsePrefix(%q) = %v, but ParsePrefix(%q) = %v, %v", s, p, p.String(), again, err)
		}
	})
}

func FuzzParseTTL(f *testing.F) {
	for _, s := range []string{"", "0", "90s", "1h30m", "7d", "2w", "1.5d", "367d", "-1h", "1e9h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseTTL(s)
		if err != nil {
			if !errors.Is(err, ErrTTL) {
				t.Fatalf("ParseTTL(%q): error %v does not wrap ErrTTL", s, err)
			}
			return
		}
		if d != 0 && (d < MinTTL || d > MaxTTL) {
			t.Fatalf("ParseTTL(%q) = %v, out of range", s, d)
		}
	})
}

func TestBanTimes(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name      string
		expires   time.Time
		live      bool
		remaining time.Duration
	}{
		{"permanent", time.Time{}, true, 0},
		{"live", now.Add(time.Hour), true, time.Hour},
		{"live 1ns", now.Add(1), true, 1},
		{"expiring now", now, false, 0},
		{"expired", now.Add(-time.Minute), false, -time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Ban{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Expires: tt.expires}
			if got := b.Live(now); got != tt.live {
				t.Errorf("Live = %v, want %v", got, tt.live)
			}
			if got := b.Remaining(now); got != tt.remaining {
				t.Errorf("Remaining = %v, want %v", got, tt.remaining)
			}
		})
	}
}

func TestIsAddr(t *testing.T) {
	for s, want := range map[string]bool{
		"192.0.2.1/32": true, "2001:db8::1/128": true,
		"192.0.2.0/31": false, "2001:db8::/127": false, "10.0.0.0/8": false,
	} {
		if got := (Ban{Prefix: netip.MustParsePrefix(s)}).IsAddr(); got != want {
			t.Errorf("IsAddr(%s) = %v, want %v", s, got, want)
		}
	}
	if (Ban{}).IsAddr() {
		t.Error("IsAddr of the zero Ban is true")
	}
}

func TestClampTTL(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		clamped bool
		err     bool
	}{
		{"", 0, false, false},
		{"0", 0, false, false},
		{"3600s", time.Hour, false, false},
		{"604800.5s", 604800*time.Second + 500*time.Millisecond, false, false},
		{"366d", MaxTTL, false, false},
		{"31622401s", MaxTTL, true, false},
		{"1000000000000s", MaxTTL, true, false},
		{"52w2d", MaxTTL, false, false},
		{"52w3d", MaxTTL, true, false},
		{"-5s", 0, false, true},
		{"0s", 0, false, true},
		{"soon", 0, false, true},
	} {
		d, clamped, err := ClampTTL(tc.in)
		if d != tc.want || clamped != tc.clamped || (err != nil) != tc.err {
			t.Errorf("ClampTTL(%q) = %v, %v, %v; want %v, %v, error %v", tc.in, d, clamped, err, tc.want, tc.clamped, tc.err)
		}
	}
}
