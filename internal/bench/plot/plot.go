// Package plot renders benchmark figures to SVG and PNG: one line per
// configuration with its median marked and a min..max error bar, or grouped
// bars per category. It draws with gonum.org/v1/plot and its embedded
// Liberation fonts, so it needs neither network nor system fonts.
//
// Values that cannot be drawn (NaN, ±Inf, and on a log axis medians ≤ 0)
// are skipped; bad input is reported as an error wrapping ErrInvalid.
package plot

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Point is one measured x with the spread over repeated rounds.
type Point struct {
	X                float64
	Min, Median, Max float64 // Median is drawn; Min..Max is the error bar
}

// Series is one line (one configuration).
type Series struct {
	Name   string
	Points []Point
}

// Figure is one chart.
type Figure struct {
	Title, XLabel, YLabel string
	// LogY makes the y axis logarithmic. Points whose median is ≤ 0 are
	// skipped, and a lower bound ≤ 0 is drawn down to the smallest positive
	// value in the figure.
	LogY   bool
	Series []Series
	// Categories, when set, makes a grouped bar chart instead of lines: the
	// X of each point is an index into Categories (0..len-1), each series
	// is one bar colour within the group, and the error bar spans Min..Max.
	Categories []string
}

// ErrInvalid is wrapped by the errors Write returns for bad input: a name
// that is not a plain file name, or an X that is not a category index.
var ErrInvalid = errors.New("invalid figure")

// dpi is the PNG resolution; the canvas is 900x540 pixels at this density.
const dpi = 96

const (
	width  = 900 * vg.Inch / dpi
	height = 540 * vg.Inch / dpi
)

// palette is the Okabe-Ito colour-blind safe set, with grey for its yellow,
// which is unreadable on white.
var palette = []color.Color{
	color.RGBA{0x00, 0x72, 0xb2, 0xff}, // blue
	color.RGBA{0xd5, 0x5e, 0x00, 0xff}, // vermillion
	color.RGBA{0x00, 0x9e, 0x73, 0xff}, // bluish green
	color.RGBA{0xcc, 0x79, 0xa7, 0xff}, // reddish purple
	color.RGBA{0xe6, 0x9f, 0x00, 0xff}, // orange
	color.RGBA{0x56, 0xb4, 0xe9, 0xff}, // sky blue
	color.RGBA{0x00, 0x00, 0x00, 0xff}, // black
	color.RGBA{0x99, 0x99, 0x99, 0xff}, // grey
}

// Write renders f into dir as name+".svg" and name+".png" (900x540 pixels)
// and returns the two paths. It fails if name is not a plain file name, if
// a category index is out of range, or if a file cannot be written; dir
// must exist.
func (f *Figure) Write(dir, name string) ([]string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
		return nil, fmt.Errorf("%w: name %q must be a plain file name without directories", ErrInvalid, name)
	}
	p, legend, err := f.build()
	if err != nil {
		return nil, fmt.Errorf("plotting %s: %w", name, err)
	}
	outs := []struct {
		ext string
		c   vg.CanvasWriterTo
	}{
		{".svg", vgsvg.New(width, height)},
		{".png", vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi))}},
	}
	var paths []string
	for _, o := range outs {
		path := filepath.Join(dir, name+o.ext)
		if err := render(p, legend, o.c, path); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// build turns f into a gonum plot and a legend to draw beside it.
func (f *Figure) build() (*gplot.Plot, gplot.Legend, error) {
	p := gplot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = f.Title, f.XLabel, f.YLabel
	p.Title.TextStyle.Font = sans(14)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*gplot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = sans(12)
		a.Tick.Label.Font = sans(10)
		a.Tick.Marker = plainTicks{}
	}
	legend := gplot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.TextStyle.Font = sans(11)
	legend.Padding = vg.Points(3)

	grid := plotter.NewGrid()
	if f.barChart() {
		grid.Vertical.Color = nil
	}
	p.Add(grid)

	floor, ceil := f.yBounds()
	var over []gplot.Plotter // error bars go on top of every bar
	for i, s := range f.Series {
		c := palette[i%len(palette)]
		pts, err := f.clean(s, floor)
		if err != nil {
			return nil, legend, err
		}
		xys, yerrs := make(plotter.XYs, len(pts)), make(plotter.YErrors, len(pts))
		for j, pt := range pts {
			xys[j] = plotter.XY{X: pt.X, Y: pt.Median}
			yerrs[j].Low, yerrs[j].High = pt.Median-pt.Min, pt.Max-pt.Median
		}
		bw := 0.8 / float64(len(f.Series)) // a group fills 80% of its category
		if f.barChart() {
			for j := range xys {
				xys[j].X += (float64(i) - float64(len(f.Series)-1)/2) * bw
			}
		}
		eb, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{xys, yerrs})
		if err != nil {
			return nil, legend, fmt.Errorf("plotting series %q: %w", s.Name, err)
		}
		eb.LineStyle.Width = vg.Points(1)
		eb.LineStyle.Color = c

		if f.barChart() {
			b := &bars{XYs: xys, width: bw, color: c}
			eb.LineStyle.Color = color.Black
			eb.CapWidth = vg.Points(4)
			p.Add(b)
			over = append(over, eb)
			legend.Add(s.Name, b)
			continue
		}
		line, marks, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, legend, fmt.Errorf("plotting series %q: %w", s.Name, err)
		}
		line.LineStyle = draw.LineStyle{Color: c, Width: vg.Points(1.5), Dashes: plotutil.Dashes(i)}
		marks.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(3), Shape: plotutil.Shape(i)}
		if len(xys) > 0 {
			p.Add(eb, line, marks)
		}
		legend.Add(s.Name, line, marks)
	}
	p.Add(over...)

	if f.barChart() {
		p.NominalX(f.Categories...)
		p.X.Min, p.X.Max = -0.5, float64(len(f.Categories))-0.5
	}
	if f.LogY {
		// Whole decades at both ends, so the axis always has two labels.
		p.Y.Scale, p.Y.Tick.Marker = gplot.LogScale{}, logTicks{}
		p.Y.Min, p.Y.Max = 1, 10
		if floor > 0 {
			lo, hi := decade(floor), decade(ceil)
			if math.Pow10(hi) < ceil || hi == lo {
				hi++
			}
			p.Y.Min, p.Y.Max = math.Pow10(lo), math.Pow10(hi)
		}
	}
	return p, legend, nil
}

// barChart reports whether f is a grouped bar chart.
func (f *Figure) barChart() bool { return len(f.Categories) > 0 }

// yBounds returns the smallest and largest positive finite values in f, or
// zeros if it has none.
func (f *Figure) yBounds() (lo, hi float64) {
	lo = math.Inf(1)
	for _, s := range f.Series {
		for _, pt := range s.Points {
			for _, v := range []float64{pt.Min, pt.Median, pt.Max} {
				if v > 0 && !math.IsInf(v, 1) {
					lo, hi = min(lo, v), max(hi, v)
				}
			}
		}
	}
	if hi == 0 {
		return 0, 0
	}
	return lo, hi
}

// clean returns the drawable points of s sorted by X. It drops points with
// a non-finite X or Median, or on a log axis a Median ≤ 0; a non-finite or
// inverted bound collapses to the median, and on a log axis a bound ≤ 0
// becomes floor. In bar mode it checks that each X is a category index.
func (f *Figure) clean(s Series, floor float64) ([]Point, error) {
	var out []Point
	for i, pt := range s.Points {
		if !finite(pt.X) || !finite(pt.Median) || (f.LogY && pt.Median <= 0) {
			continue
		}
		if f.barChart() && (pt.X != math.Trunc(pt.X) || pt.X < 0 || int(pt.X) >= len(f.Categories)) {
			return nil, fmt.Errorf("%w: series %q point %d: X %v is not a category index in 0..%d",
				ErrInvalid, s.Name, i, pt.X, len(f.Categories)-1)
		}
		if !finite(pt.Min) || pt.Min > pt.Median {
			pt.Min = pt.Median
		}
		if !finite(pt.Max) || pt.Max < pt.Median {
			pt.Max = pt.Median
		}
		if f.LogY && pt.Min <= 0 {
			pt.Min = floor
		}
		out = append(out, pt)
	}
	slices.SortStableFunc(out, func(a, b Point) int { return cmp.Compare(a.X, b.X) })
	return out, nil
}

// render draws p with the legend to the right of its data area, or below
// it if the legend is too wide, and writes the result to path.
func render(p *gplot.Plot, legend gplot.Legend, c vg.CanvasWriterTo, path string) (err error) {
	defer func() {
		// gonum/plot panics on some inputs, e.g. values ≤ 0 on a log
		// axis. build filters those; this keeps a missed case from
		// crashing a long bench run.
		if r := recover(); r != nil {
			err = fmt.Errorf("rendering %s: %v", path, r)
		}
	}()
	const margin, gap = vg.Length(6), vg.Length(10)
	dc := draw.Crop(draw.New(c), margin, -margin, margin, -margin)
	size := legend.Rectangle(dc).Size()
	switch {
	case size.X == 0: // no series
		p.Draw(dc)
	case size.X < dc.Size().X/3:
		area := draw.Crop(dc, 0, -size.X-gap, 0, 0)
		p.Draw(area)
		data := p.DataCanvas(area)
		legend.Draw(draw.Crop(dc, area.Size().X+gap, 0, data.Min.Y-dc.Min.Y, data.Max.Y-dc.Max.Y))
	default:
		area := draw.Crop(dc, 0, 0, size.Y+gap, 0)
		p.Draw(area)
		legend.Draw(draw.Crop(dc, p.DataCanvas(area).Min.X-dc.Min.X, 0, 0, size.Y-dc.Size().Y))
	}
	if err := writeFile(path, c); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func writeFile(path string, w io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// bars draws one series of a grouped bar chart: a bar width data units wide
// centred on each X, from zero (or the bottom of a log axis) up to Y.
type bars struct {
	plotter.XYs
	width float64
	color color.Color
}

// Plot implements gplot.Plotter.
func (b *bars) Plot(c draw.Canvas, p *gplot.Plot) {
	trX, trY := p.Transforms(&c)
	base := trY(max(0, p.Y.Min))
	for _, xy := range b.XYs {
		x0, x1, y := trX(xy.X-b.width/2), trX(xy.X+b.width/2), trY(xy.Y)
		c.FillPolygon(b.color, c.ClipPolygonXY([]vg.Point{{X: x0, Y: base}, {X: x0, Y: y}, {X: x1, Y: y}, {X: x1, Y: base}}))
	}
}

// DataRange implements gplot.DataRanger; the range includes zero.
func (b *bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = plotter.XYRange(b)
	return xmin - b.width/2, xmax + b.width/2, min(ymin, 0), max(ymax, 0)
}

// Thumbnail implements gplot.Thumbnailer for the legend.
func (b *bars) Thumbnail(c *draw.Canvas) {
	c.SetColor(b.color)
	c.Fill(c.Rectangle.Path())
}

// plainTicks are gonum's default ticks labelled with as few digits as
// their values need ("25000", not "25000.00").
type plainTicks struct{}

// Ticks implements gplot.Ticker.
func (plainTicks) Ticks(lo, hi float64) []gplot.Tick {
	ts := gplot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if !ts[i].IsMinor() {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'g', 10, 64)
		}
	}
	return ts
}

// logTicks labels each power of ten and marks the multiples in between.
// Unlike gplot.LogTicks it also labels ranges below 1.
type logTicks struct{}

// Ticks implements gplot.Ticker; lo and hi must be positive.
func (logTicks) Ticks(lo, hi float64) []gplot.Tick {
	var ts []gplot.Tick
	for e := decade(lo); e <= decade(hi); e++ {
		d := math.Pow10(e)
		label := strconv.FormatFloat(d, 'f', -1, 64)
		if e < -3 || e > 5 {
			label = "1e" + strconv.Itoa(e)
		}
		ts = append(ts, gplot.Tick{Value: d, Label: label})
		for k := 2.0; k < 10; k++ {
			ts = append(ts, gplot.Tick{Value: k * d})
		}
	}
	return ts
}

// decade returns floor(log10(v)) for v > 0, exact at powers of ten.
func decade(v float64) int {
	e := int(math.Floor(math.Log10(v)))
	if math.Pow10(e+1) <= v {
		e++
	}
	return e
}

func sans(size vg.Length) font.Font {
	return font.Font{Typeface: "Liberation", Variant: "Sans", Size: size}
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
