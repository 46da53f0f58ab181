package dashboard

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
)

// The instance timeline (detail page): what the database records of an
// instance, on one time axis. It records no history of steps that
// succeeded: a step shows up where an attempt of it failed (the error
// history, the last 20 entries), and the current step as of the last
// update. Signals (the newest 100) are sent and, later, consumed; children
// (the first 500) are scheduled and finish.

// timeline geometry
const (
	tlLabelW = 90  // lane labels on the left
	tlPlotW  = 860 // the time axis
	tlRight  = 20
	tlLaneH  = 30
	tlTop    = 8
	tlAxisH  = 28
)

// timelineEvent is one thing that happened, for the table below the drawing.
type timelineEvent struct {
	At    time.Time
	Lane  string // instance, errors, signals, children
	Kind  string // a CSS class: inserted, error, panic, stop, signal, consumed, child, done, failed, ...
	Text  string
	Link  int64 // an instance to link to (a child), or 0
	order int
}

// svgTimeline is the drawing: lanes, marks and spans on a shared axis.
type svgTimeline struct {
	Width, Height int
	PlotX, PlotW  int
	Lanes         []tlLane
	Marks         []tlMark
	Spans         []tlSpan
	Ticks         []chartTick
	AxisY         int
	NowX          int // 0: no "now" line (a finished instance)
}

type tlLane struct {
	Y     int // its middle
	Label string
}

type tlMark struct {
	X, Y  int
	Kind  string
	Title string
}

type tlSpan struct {
	X1, X2, Y int
	Kind      string
	Title     string
}

// buildTimeline collects the events of det and lays them out. now is the
// page's clock (for a live instance, the axis runs to now).
func buildTimeline(det *gendurable.InstanceDetail, now time.Time) (*svgTimeline, []timelineEvent) {
	var evs []timelineEvent
	add := func(at time.Time, lane, kind, text string, link int64) {
		evs = append(evs, timelineEvent{At: at, Lane: lane, Kind: kind, Text: text, Link: link, order: len(evs)})
	}
	add(det.InsertedAt, "instance", "inserted", "inserted", 0)
	for _, e := range det.Errors {
		add(e.At, "errors", e.Kind, fmt.Sprintf("step %s, attempt %d (%s): %s", e.Step, display.Attempt(e.Attempt), e.Kind, truncate(200, e.Error)), 0)
	}
	for _, s := range det.Signals {
		add(s.SentAt, "signals", "signal", fmt.Sprintf("signal %q sent (#%d)", s.Name, s.ID), 0)
		if s.ConsumedAt != nil {
			add(*s.ConsumedAt, "signals", "consumed", fmt.Sprintf("signal %q consumed (#%d)", s.Name, s.ID), 0)
		}
	}
	for _, c := range det.Children {
		if !c.InsertedAt.IsZero() {
			add(c.InsertedAt, "children", "child", fmt.Sprintf("child #%d (%s) scheduled", c.ID, c.Machine), c.ID)
		}
		if c.FinishedAt != nil {
			add(*c.FinishedAt, "children", string(c.Status), fmt.Sprintf("child #%d (%s) %s", c.ID, c.Machine, c.Status), c.ID)
		}
	}
	if det.FinishedAt != nil {
		add(*det.FinishedAt, "instance", string(det.Status), fmt.Sprintf("%s at step %s", det.Status, det.Step), 0)
	} else {
		add(det.UpdatedAt, "instance", "updated", fmt.Sprintf("last update: %s at step %s, attempt %d of %d", det.Status, det.Step, display.Run(det.Attempt, det.MaxAttempts, det.Status), det.MaxAttempts), 0)
		// Not for the instants a fresh keyed row's eligible time lies past
		// its update (its insert statement's clock, a microsecond apart
		// per row of a key in one insert: docs/design.md §6): a second
		// or more is a backoff or a delay.
		if det.EligibleAt.Sub(det.UpdatedAt) >= time.Second && det.Status == gendurable.StatusRunnable {
			add(det.EligibleAt, "instance", "eligible", "eligible to run again (backoff or delay)", 0)
		}
		if w := det.Wait; w != nil && w.Deadline != nil {
			add(*w.Deadline, "instance", "deadline", "await deadline for "+strings.Join(w.Signals, ", "), 0)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if !evs[i].At.Equal(evs[j].At) {
			return evs[i].At.Before(evs[j].At)
		}
		return evs[i].order < evs[j].order
	})

	// The axis: from the first event to the last, or to now while live.
	start, end := evs[0].At, evs[len(evs)-1].At
	live := det.FinishedAt == nil
	if live && now.After(end) {
		end = now
	}
	// In seconds as floats: a time.Duration holds 292 years, and an
	// instance due in 9999 (RunAt allows it) spans more — its ticks
	// overflowed and ran backwards (a hostile probe).
	span := secondsBetween(start, end)
	if span <= 0 {
		span = 1
	}
	x := func(t time.Time) int {
		return tlLabelW + int(secondsBetween(start, t)/span*float64(tlPlotW)+0.5)
	}

	lanes := []string{"instance"}
	for _, l := range []string{"errors", "signals", "children"} {
		for _, e := range evs {
			if e.Lane == l {
				lanes = append(lanes, l)
				break
			}
		}
	}
	tl := &svgTimeline{PlotX: tlLabelW, PlotW: tlPlotW, Width: tlLabelW + tlPlotW + tlRight}
	laneY := map[string]int{}
	for i, l := range lanes {
		y := tlTop + i*tlLaneH + tlLaneH/2
		laneY[l] = y
		tl.Lanes = append(tl.Lanes, tlLane{Y: y, Label: l})
	}
	tl.AxisY = tlTop + len(lanes)*tlLaneH
	tl.Height = tl.AxisY + tlAxisH
	if live {
		tl.NowX = x(now)
	}

	// Spans: the instance's life, each signal's wait in the inbox, each
	// child's run.
	lifeEnd := end
	if det.FinishedAt != nil {
		lifeEnd = *det.FinishedAt
	}
	tl.Spans = append(tl.Spans, tlSpan{X1: x(det.InsertedAt), X2: x(lifeEnd), Y: laneY["instance"], Kind: "life",
		Title: fmt.Sprintf("%s → %s", fmtTime(det.InsertedAt), fmtTime(lifeEnd))})
	for _, s := range det.Signals {
		if s.ConsumedAt != nil {
			tl.Spans = append(tl.Spans, tlSpan{X1: x(s.SentAt), X2: x(*s.ConsumedAt), Y: laneY["signals"], Kind: "inbox",
				Title: fmt.Sprintf("signal %q in the inbox %s", s.Name, s.ConsumedAt.Sub(s.SentAt).Round(time.Millisecond))})
		}
	}
	for _, c := range det.Children {
		if c.InsertedAt.IsZero() {
			continue
		}
		to := end
		if c.FinishedAt != nil {
			to = *c.FinishedAt
		}
		tl.Spans = append(tl.Spans, tlSpan{X1: x(c.InsertedAt), X2: x(to), Y: laneY["children"], Kind: "child-run",
			Title: fmt.Sprintf("child #%d %s", c.ID, c.Status)})
	}
	for _, e := range evs {
		tl.Marks = append(tl.Marks, tlMark{X: x(e.At), Y: laneY[e.Lane], Kind: e.Kind, Title: fmtTime(e.At) + " " + e.Text})
	}
	for i := 0; i <= 4; i++ {
		off := span * float64(i) / 4
		sec := math.Floor(off)
		t := time.Unix(start.Unix()+int64(sec), int64(start.Nanosecond())+int64((off-sec)*1e9))
		tl.Ticks = append(tl.Ticks, chartTick{Pos: x(t), Label: tickLabel(t, off, span)})
	}
	return tl, evs
}

// secondsBetween is b − a in seconds, as a float: whole seconds and
// nanoseconds subtracted apart, so a span of microseconds keeps its
// precision and one of millennia does not overflow.
func secondsBetween(a, b time.Time) float64 {
	return float64(b.Unix()-a.Unix()) + float64(b.Nanosecond()-a.Nanosecond())/1e9
}

// tickLabel names an axis tick off seconds after the axis's start: the
// clock time, with seconds (or milliseconds) when the axis is short, the
// date when it is long, the year when it spans years.
func tickLabel(t time.Time, off, span float64) string {
	t = t.UTC()
	switch {
	case span < 10:
		return "+" + strconv.FormatFloat(off, 'f', 2, 64) + "s"
	case span < 10*60:
		return t.Format("15:04:05")
	case span < 48*3600:
		return t.Format("15:04")
	case span < 300*24*3600:
		return t.Format("01-02 15:04")
	}
	return t.Format("2006-01-02")
}
