package longhorizon

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A small line chart drawn with the standard library's image packages and
// x/image's fixed 7×13 font: time (minutes since the run's start) on x,
// phases shaded and named, one line per series, NaN breaks a line.

var palette = []color.RGBA{
	{31, 119, 180, 255}, // blue
	{255, 127, 14, 255}, // orange
	{44, 160, 44, 255},  // green
	{148, 103, 189, 255},
}

type series struct {
	name   string
	col    color.RGBA
	xs, ys []float64
	dashed bool
}

type chart struct {
	title  string
	series []series
	bands  []Span
	marks  []float64 // vertical red lines, seconds
}

const (
	plotW, plotH                     = 1200, 520
	padL, padR, padT, padB           = 80, 20, 50, 45
	innerW, innerH                   = plotW - padL - padR, plotH - padT - padB
	bandShade, bandClear, gridShade  = 236, 250, 225
	textBlack, axisGray, labelShadow = 20, 110, 90
)

func writePlots(dir string, rep *Report) error {
	if len(rep.Runs) == 0 {
		return nil
	}
	first := rep.Runs[0]
	mk := func(title, col string, div float64, offered bool) chart {
		c := chart{title: title, bands: first.Spans}
		drainEnd := 0.0
		for _, r := range rep.Runs {
			drainEnd = max(drainEnd, r.DrainEndS)
		}
		if n := len(first.Spans); n > 0 && drainEnd > first.Spans[n-1].EndS {
			c.bands = append(c.bands[:n:n], Span{Name: "drain", StartS: first.Spans[n-1].EndS, EndS: drainEnd})
		}
		if first.KillS > 0 {
			c.marks = []float64{first.KillS}
		}
		for i, r := range rep.Runs {
			s := series{name: r.System, col: palette[i%len(palette)]}
			o := series{name: r.System + " offered", col: palette[i%len(palette)], dashed: true}
			for _, x := range r.Samples {
				s.xs = append(s.xs, x.Elapsed)
				s.ys = append(s.ys, x.V[col]/div)
				o.xs = append(o.xs, x.Elapsed)
				o.ys = append(o.ys, x.V["offered"])
			}
			c.series = append(c.series, s)
			if offered {
				c.series = append(c.series, o)
			}
		}
		return c
	}
	charts := map[string]chart{
		"latency_p95.png": mk("claim p95, ms (max over replicas)", "claim_p95_ms", 1, false),
		"completion.png":  mk("completion vs offered, jobs/s (sum over replicas; dashed: offered)", "completion_rate", 1, true),
		"dead_tuples.png": mk("dead tuples in the event tables (pg_stat_user_tables.n_dead_tup)", "dead_tuples", 1, false),
		"table_size.png":  mk("event tables + indexes, MB (pg_total_relation_size)", "total_bytes", mb, false),
	}
	for name, c := range charts {
		if err := savePNG(filepath.Join(dir, name), c.render()); err != nil {
			return err
		}
	}
	return nil
}

func savePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func gray(v uint8) color.RGBA { return color.RGBA{v, v, v, 255} }

func (c chart) render() *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)

	xmax, ymax := 1.0, 0.0
	for _, b := range c.bands {
		xmax = max(xmax, b.EndS)
	}
	for _, s := range c.series {
		for i, x := range s.xs {
			if !math.IsNaN(s.ys[i]) && !math.IsInf(s.ys[i], 0) {
				xmax = max(xmax, x)
				ymax = max(ymax, s.ys[i])
			}
		}
	}
	xmax /= 60 // minutes
	xstep := niceStep(xmax)
	ystep := niceStep(ymax)
	if ymax == 0 {
		ystep = 1
	}
	ymax = math.Ceil(ymax/ystep) * ystep
	if ymax == 0 {
		ymax = ystep
	}
	px := func(sec float64) int { return padL + int(sec/60/xmax*innerW) }
	py := func(v float64) int { return padT + innerH - int(v/ymax*innerH) }

	// phases
	for i, b := range c.bands {
		shade := gray(bandClear)
		if i%2 == 0 {
			shade = gray(bandShade)
		}
		x0, x1 := px(b.StartS), px(b.EndS)
		draw.Draw(img, image.Rect(x0, padT, x1, padT+innerH), image.NewUniform(shade), image.Point{}, draw.Src)
		label := b.Name
		for len(label) > 1 && len(label)*7 > x1-x0-4 {
			label = label[:len(label)-1]
		}
		if len(label)*7 <= x1-x0-4 {
			text(img, x0+3, padT+12, label, gray(labelShadow))
		}
	}
	// grid and ticks
	for v := 0.0; v <= ymax+ystep/2; v += ystep {
		y := py(v)
		hline(img, padL, padL+innerW, y, gray(gridShade))
		s := tickLabel(v, ystep)
		text(img, padL-6-7*len(s), y+4, s, gray(textBlack))
	}
	for v := 0.0; v <= xmax+xstep/2; v += xstep {
		x := px(v * 60)
		vline(img, x, padT+innerH, padT+innerH+5, gray(axisGray))
		s := tickLabel(v, xstep)
		text(img, x-7*len(s)/2, padT+innerH+18, s, gray(textBlack))
	}
	text(img, padL+innerW/2-7*len("minutes")/2, plotH-8, "minutes", gray(textBlack))
	hline(img, padL, padL+innerW, padT+innerH, gray(axisGray))
	vline(img, padL, padT, padT+innerH, gray(axisGray))
	for _, m := range c.marks {
		x := px(m)
		for d := 0; d < 2; d++ {
			vline(img, x+d, padT, padT+innerH, color.RGBA{214, 39, 40, 255})
		}
		text(img, x+4, padT+26, "SIGKILL", color.RGBA{214, 39, 40, 255})
	}
	// series
	for _, s := range c.series {
		var dash *int
		if s.dashed {
			dash = new(int)
		}
		havePrev := false
		var x0, y0 int
		for i := range s.xs {
			v := s.ys[i]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				havePrev = false
				continue
			}
			x, y := px(s.xs[i]), py(v)
			if havePrev {
				line(img, x0, y0, x, y, s.col, dash)
			}
			x0, y0, havePrev = x, y, true
		}
	}
	text(img, padL, 20, c.title, gray(textBlack))
	// legend, top right
	lx := padL + innerW - 10
	for i := len(c.series) - 1; i >= 0; i-- {
		s := c.series[i]
		lx -= 7*len(s.name) + 30
		var dash *int
		if s.dashed {
			dash = new(int)
		}
		line(img, lx, 36, lx+18, 36, s.col, dash)
		text(img, lx+22, 40, s.name, gray(textBlack))
	}
	return img
}

// niceStep is a 1, 2 or 5 × 10^k step giving about 5–10 ticks up to v.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	raw := v / 6
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(v, step float64) string {
	prec := 0
	if step < 1 {
		prec = int(math.Ceil(-math.Log10(step)))
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func text(img *image.RGBA, x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func hline(img *image.RGBA, x0, x1, y int, col color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, col)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, col color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, col)
	}
}

// line draws a 2-pixel line from (x0,y0) to (x1,y1); with dash non-nil,
// every other 6 pixels are left out, *dash carrying the count across the
// segments of one series.
func line(img *image.RGBA, x0, y0, x1, y1 int, col color.RGBA, dash *int) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		if dash != nil {
			*dash++
			if (*dash/6)%2 == 1 {
				continue
			}
		}
		x := x0 + (x1-x0)*i/n
		y := y0 + (y1-y0)*i/n
		img.SetRGBA(x, y, col)
		img.SetRGBA(x+1, y, col)
		img.SetRGBA(x, y+1, col)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
