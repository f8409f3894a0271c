package plot

import (
	"encoding/xml"
	"errors"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var nan, inf = math.NaN(), math.Inf(1)

func lineFigure() *Figure {
	return &Figure{
		Title:  "Lookup latency",
		XLabel: "prefixes",
		YLabel: "ns/op",
		Series: []Series{
			{Name: "nft interval set", Points: []Point{
				{X: 1000, Min: 90, Median: 100, Max: 120},
				{X: 10000, Min: 110, Median: 130, Max: 150},
				{X: 100000, Min: 150, Median: 170, Max: 220},
			}},
			{Name: "xdp <lpm> & trie", Points: []Point{
				{X: 100000, Min: 40, Median: 45, Max: 60}, // unsorted on purpose
				{X: 1000, Min: 30, Median: 32, Max: 35},
				{X: 10000, Min: 35, Median: 38, Max: 41},
			}},
			{Name: "ipset hash:net", Points: []Point{
				{X: 1000, Min: 60, Median: 70, Max: 75},
				{X: 10000, Min: 140, Median: 160, Max: 190},
			}},
		},
	}
}

func barFigure() *Figure {
	return &Figure{
		Title:      "Ban throughput",
		YLabel:     "bans/s",
		Categories: []string{"nft", "xdp", "ipset"},
		Series: []Series{
			{Name: "1 core", Points: []Point{{X: 0, Min: 9e4, Median: 1e5, Max: 1.1e5}, {X: 1, Min: 3e5, Median: 3.2e5, Max: 3.3e5}, {X: 2, Min: 5e4, Median: 6e4, Max: 6.5e4}}},
			{Name: "4 cores", Points: []Point{{X: 0, Min: 2e5, Median: 2.5e5, Max: 2.6e5}, {X: 2, Min: 1e5, Median: 1.2e5, Max: 1.5e5}}},
		},
	}
}

func TestWriteLine(t *testing.T) {
	f := lineFigure()
	img := checkWrite(t, f, "latency")
	for i := range f.Series {
		if !hasColour(img, dataArea, palette[i]) {
			t.Errorf("PNG has no pixel of series %d's colour %v left of the legend", i, palette[i])
		}
	}
}

func TestWriteBars(t *testing.T) {
	f := barFigure()
	img := checkWrite(t, f, "bans", f.Categories...)
	for i := range f.Series {
		if !hasColour(img, dataArea, palette[i]) {
			t.Errorf("PNG has no bar of series %d's colour %v left of the legend", i, palette[i])
		}
	}
}

// TestWriteRobust checks that awkward input still renders valid files.
func TestWriteRobust(t *testing.T) {
	withLog := func(f *Figure) *Figure { f.LogY = true; return f }
	tests := map[string]*Figure{
		"empty":        {},
		"empty series": {Title: "t", Series: []Series{{Name: "none"}}},
		"single point": {Series: []Series{{Name: "one", Points: []Point{{X: 1, Min: 2, Median: 2, Max: 2}}}}},
		"non-finite": {Series: []Series{{Name: "nan", Points: []Point{
			{X: nan, Median: 1}, {X: 1, Median: nan}, {X: inf, Median: 1},
			{X: 2, Min: -inf, Median: 3, Max: nan}, {X: 3, Min: 5, Median: 4, Max: 1},
		}}}},
		"log zeros": withLog(&Figure{Series: []Series{{Name: "zero", Points: []Point{
			{X: 1, Min: 0, Median: 0, Max: 0}, {X: 2, Min: 0, Median: 0.05, Max: 0.2},
			{X: 3, Min: -1, Median: 10, Max: 30}, {X: 4, Min: 1000, Median: 1000, Max: 1000},
		}}}}),
		"log all zero": withLog(&Figure{Series: []Series{{Name: "zero", Points: []Point{{X: 1}}}}}),
		"log empty":    withLog(&Figure{}),
		"log bars":     withLog(barFigure()),
		"log bars zero": withLog(&Figure{Categories: []string{"a", "b"}, Series: []Series{
			{Name: "s", Points: []Point{{X: 0, Median: 0}, {X: 1, Min: 0, Median: 5, Max: 7}}},
		}}),
		"empty bars":  {Categories: []string{"a"}, Series: []Series{{Name: "s"}}},
		"many series": manySeries(11),
	}
	for name, f := range tests {
		t.Run(name, func(t *testing.T) {
			var names []string
			for _, s := range f.Series {
				names = append(names, s.Name)
			}
			checkWrite(t, f, "fig", names...)
		})
	}
}

func manySeries(n int) *Figure {
	f := &Figure{Title: "many"}
	for i := range n {
		y := float64(i + 1)
		f.Series = append(f.Series, Series{Name: "s" + string(rune('a'+i)), Points: []Point{
			{X: 0, Min: y - 0.2, Median: y, Max: y + 0.3}, {X: 1, Min: y, Median: y + 0.5, Max: y + 0.6},
		}})
	}
	return f
}

func TestWriteInvalid(t *testing.T) {
	tests := []struct {
		desc, name string
		f          *Figure
	}{
		{"empty name", "", lineFigure()},
		{"dot", ".", lineFigure()},
		{"dot dot", "..", lineFigure()},
		{"subdirectory", "a/b", lineFigure()},
		{"escape", "../x", lineFigure()},
		{"absolute", "/tmp/x", lineFigure()},
		{"backslash", `a\b`, lineFigure()},
		{"category too big", "fig", &Figure{Categories: []string{"a"}, Series: []Series{{Name: "s", Points: []Point{{X: 1, Median: 1}}}}}},
		{"category negative", "fig", &Figure{Categories: []string{"a"}, Series: []Series{{Name: "s", Points: []Point{{X: -1, Median: 1}}}}}},
		{"category fraction", "fig", &Figure{Categories: []string{"a", "b"}, Series: []Series{{Name: "s", Points: []Point{{X: 0.5, Median: 1}}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			dir := t.TempDir()
			paths, err := tt.f.Write(dir, tt.name)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Write(%q) = %v, %v; want an error wrapping ErrInvalid", tt.name, paths, err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("Write left %d files in dir after an error", len(ents))
			}
		})
	}
}

func TestWriteMissingDir(t *testing.T) {
	_, err := lineFigure().Write(filepath.Join(t.TempDir(), "missing"), "fig")
	if err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("Write into a missing directory = %v; want an I/O error", err)
	}
}

func TestLogTicks(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want int
	}{{1, 0}, {9.99, 0}, {10, 1}, {1000, 3}, {999, 2}, {0.1, -1}, {0.05, -2}, {1e-3, -3}, {1e15, 15}} {
		if got := decade(tt.v); got != tt.want {
			t.Errorf("decade(%v) = %d, want %d", tt.v, got, tt.want)
		}
	}
	var labels []string
	for _, tk := range (logTicks{}).Ticks(1e-4, 1e7) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got, want := strings.Join(labels, " "), "1e-4 0.001 0.01 0.1 1 10 100 1000 10000 100000 1e6 1e7"; got != want {
		t.Errorf("labelled ticks for 1e-4..1e7 = %q, want %q", got, want)
	}
}

// checkWrite writes f, checks that both files are valid, that the PNG is
// 900x540 and not blank, and that the SVG's text holds the title and each
// of texts. It returns the decoded PNG.
func checkWrite(t *testing.T, f *Figure, name string, texts ...string) image.Image {
	t.Helper()
	dir := t.TempDir()
	paths, err := f.Write(dir, name)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	want := []string{filepath.Join(dir, name+".svg"), filepath.Join(dir, name+".png")}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("Write returned %q, want %q", paths, want)
	}

	text := svgText(t, paths[0])
	for _, s := range append(texts, f.Title) {
		if !strings.Contains(text, s) {
			t.Errorf("SVG text lacks %q", s)
		}
	}

	r, err := os.Open(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatalf("decoding PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 900 || b.Dy() != 540 {
		t.Errorf("PNG is %dx%d, want 900x540", b.Dx(), b.Dy())
	}
	if n := colours(img); n < 2 {
		t.Errorf("PNG has %d distinct colours; it is blank", n)
	}
	return img
}

// svgText decodes the SVG at path as XML and returns its character data.
func svgText(t *testing.T, path string) string {
	t.Helper()
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d := xml.NewDecoder(r)
	var text strings.Builder
	var root string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	if root != "svg" {
		t.Fatalf("SVG root element is %q, want svg", root)
	}
	return text.String()
}

func colours(img image.Image) int {
	seen := map[color.Color]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			seen[img.At(x, y)] = true
		}
	}
	return len(seen)
}

// dataArea is part of the test figures' PNGs left of their legends, which
// show every series' colour whether or not its data was drawn.
var dataArea = image.Rect(0, 0, 650, 540)

// hasColour reports whether some pixel of img within r is within a small
// distance of c (anti-aliasing shifts edges, not the cores of lines and
// bars).
func hasColour(img image.Image, r image.Rectangle, c color.Color) bool {
	near := func(a, b uint32) bool { return max(a, b)-min(a, b) <= 0x0800 }
	r0, g0, b0, _ := c.RGBA()
	b := img.Bounds().Intersect(r)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r, r0) && near(g, g0) && near(bl, b0) {
				return true
			}
		}
	}
	return false
}

func TestPlainTicks(t *testing.T) {
	for _, tt := range []struct {
		lo, hi float64
		want   []string
	}{
		{0, 50000, []string{"0", "25000", "50000"}},
		{0, 0.9, []string{"0", "0.4", "0.8"}},
		{0, 0.3, []string{"0", "0.15", "0.3"}}, // 0.15 and 0.3 are not exact in binary
	} {
		var got []string
		for _, tk := range (plainTicks{}).Ticks(tt.lo, tt.hi) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("Ticks(%v, %v) labels = %q, want %q", tt.lo, tt.hi, got, tt.want)
		}
	}
}
