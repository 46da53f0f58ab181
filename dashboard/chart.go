package dashboard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
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

// throughputCache holds the newest read and when it was made. The mutex
// guards the fields only, never a read: while one request reads, the
// others are served the previous value, or, before the first read
// completes, wait for it (each as long as its own context allows).
type throughputCache struct {
	mu     sync.Mutex
	at     time.Time
	val    *gendurable.Throughput
	flight *throughputRead // the read under way, nil when none
}

// throughputRead is one read of the throughput, shared by the requests
// that wait for it; done is closed when val and err are set.
type throughputRead struct {
	done chan struct{}
	val  *gendurable.Throughput
	err  error
}

// throughput returns the engine's throughput, at most throughputTTL old, or
// older while another request refreshes it: one slow read holds up only
// the request that makes it (and, before any value exists, those waiting
// for the first).
func (d *dashboard) throughput(ctx context.Context) (*gendurable.Throughput, error) {
	c := &d.tp
	for {
		c.mu.Lock()
		if c.val != nil && (c.flight != nil || time.Since(c.at) < throughputTTL) {
			v := c.val
			c.mu.Unlock()
			return v, nil
		}
		f := c.flight
		if f == nil {
			f = &throughputRead{done: make(chan struct{})}
			c.flight = f
			c.mu.Unlock()
			d.readThroughput(ctx, f)
			return f.val, f.err
		}
		c.mu.Unlock()
		select {
		case <-f.done:
			if f.err == nil {
				return f.val, nil
			}
			// It failed, perhaps because its request ended: read with ours.
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readThroughput makes the read f stands for and publishes its result.
func (d *dashboard) readThroughput(ctx context.Context, f *throughputRead) {
	c := &d.tp
	defer func() {
		c.mu.Lock()
		if f.err == nil && f.val != nil {
			c.val, c.at = f.val, time.Now()
		} else if f.err == nil {
			f.err = errors.New("dashboard: the throughput read did not finish") // it panicked
		}
		c.flight = nil
		c.mu.Unlock()
		close(f.done)
	}()
	f.val, f.err = d.eng.Throughput(ctx)
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
		bar := chartBar{X: x + 1, W: chartBarW - 2,
			Title: fmt.Sprintf("%s–%s UTC: %d done, %d failed", b.Start.UTC().Format("15:04"),
				b.Start.Add(time.Minute).UTC().Format("15:04"), b.Done, b.Failed)}
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
