package dashboard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gendurable/gendurable"
)

// Throughput (the queues page): finishes per minute of the last hour, read
// from the database by Engine.Throughput (from finished_at), so every
// dashboard process shows the same figures from the first load on. The
// read is bounded (gendurable.MaxThroughputRows) and cached for
// throughputTTL, so pages that refresh themselves every few seconds share
// one read.

const (
	throughputTTL = 5 * time.Second
	rateMinutes   = 5 // the per-queue rates average the newest five minutes
)

// throughput returns the engine's throughput, at most throughputTTL old, or
// older while another request refreshes it (see shared): one slow read
// holds up only the request that makes it (and, before any value exists,
// those waiting for the first).
func (d *dashboard) throughput(ctx context.Context) (*gendurable.Throughput, error) {
	return d.tp.get(ctx, throughputTTL, d.eng.Throughput)
}

// rate is a queue's finishing rate over the newest rateMinutes minutes.
type rate struct {
	DonePerMin float64
	FailPerMin float64
}

func rateOf(buckets []gendurable.ThroughputBucket) rate {
	n := min(rateMinutes, len(buckets))
	var r rate
	for _, b := range buckets[len(buckets)-n:] {
		r.DonePerMin += float64(b.Done)
		r.FailPerMin += float64(b.Failed)
	}
	if n > 0 {
		r.DonePerMin /= float64(n)
		r.FailPerMin /= float64(n)
	}
	return r
}

// Chart geometry: one bar per minute.
const (
	chartBarW   = 12
	chartLeft   = 44
	chartRight  = 12
	chartTop    = 12
	chartPlotH  = 120
	chartBottom = 26
)

// svgChart is the throughput chart, laid out for the template: stacked
// bars (done below, failed above), a y axis with a few round ticks, and
// minute labels on the x axis.
type svgChart struct {
	Width, Height  int
	PlotX, PlotY   int // the plot area's top-left corner
	PlotW, PlotH   int
	Bars           []chartBar
	YTicks, XTicks []chartTick
	Done, Failed   int64 // totals over the chart
	Max            int64 // the y axis's top
}

type chartBar struct {
	X, W         int
	DoneY, DoneH int
	FailY, FailH int
	Title        string // the tooltip
}

type chartTick struct {
	Pos   int // y for YTicks, x for XTicks
	Label string
}

// layoutChart lays out buckets (oldest first, one per minute) as bars.
func layoutChart(buckets []gendurable.ThroughputBucket) *svgChart {
	c := &svgChart{PlotX: chartLeft, PlotY: chartTop, PlotW: len(buckets) * chartBarW, PlotH: chartPlotH}
	c.Width, c.Height = chartLeft+c.PlotW+chartRight, chartTop+chartPlotH+chartBottom
	var most int64
	for _, b := range buckets {
		most = max(most, b.Done+b.Failed)
		c.Done += b.Done
		c.Failed += b.Failed
	}
	c.Max = niceCeil(most)
	scale := func(n int64) int { return int(float64(n)*float64(chartPlotH)/float64(c.Max) + 0.5) }
	base := chartTop + chartPlotH
	for i, b := range buckets {
		x := chartLeft + i*chartBarW
		// To the second: a bar is the minute up to the page's "now", not a
		// clock minute (cut to whole minutes, a finish at 08:14:31 read as
		// "08:13–08:14" when now was 08:14:51: a newcomer's probe).
		bar := chartBar{X: x + 1, W: chartBarW - 2,
			Title: fmt.Sprintf("%s–%s UTC: %d done, %d failed", b.Start.UTC().Format("15:04:05"),
				b.Start.Add(time.Minute).UTC().Format("15:04:05"), b.Done, b.Failed)}
		bar.DoneH = scale(b.Done)
		bar.DoneY = base - bar.DoneH
		bar.FailH = scale(b.Failed)
		bar.FailY = bar.DoneY - bar.FailH
		c.Bars = append(c.Bars, bar)
	}
	for _, v := range []int64{0, c.Max / 2, c.Max} {
		c.YTicks = append(c.YTicks, chartTick{Pos: base - scale(v), Label: strconv.FormatInt(v, 10)})
	}
	n := len(buckets)
	for ago := n; ago >= 0; ago -= 15 {
		label := "now"
		if ago > 0 {
			label = "−" + strconv.Itoa(ago) + "m"
		}
		c.XTicks = append(c.XTicks, chartTick{Pos: chartLeft + (n-ago)*chartBarW, Label: label})
	}
	return c
}

// niceCeil is the smallest of 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, …
// that is ≥ n: even, so the axis's middle tick is a whole number.
func niceCeil(n int64) int64 {
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 4, 6, 8} {
			if v := m * p; v >= n && v >= 4 {
				return v
			}
		}
	}
}
