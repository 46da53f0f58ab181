package dashboard

import (
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

func stats(done, failed int64) []gendurable.QueueStats {
	return []gendurable.QueueStats{{Queue: "q", ByStatus: map[gendurable.Status]int64{
		gendurable.StatusDone: done, gendurable.StatusFailed: failed}}}
}

func TestSamplerRate(t *testing.T) {
	t.Parallel()
	s := newSampler()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	require.False(t, s.observe(t0, stats(0, 0))["q"].Known, "first sample: no rate")
	require.False(t, s.observe(t0.Add(2*time.Second), stats(5, 0))["q"].Known, "too close to the first")
	r := s.observe(t0.Add(30*time.Second), stats(60, 3))["q"]
	require.True(t, r.Known)
	require.InDelta(t, 120, r.DonePerMin, 0.01) // 60 over 30s
	require.InDelta(t, 6, r.FailPerMin, 0.01)
	require.Equal(t, 30*time.Second, r.Over)

	// Past a minute, the reference is the newest sample at least a minute old.
	r = s.observe(t0.Add(90*time.Second), stats(120, 3))["q"]
	require.Equal(t, 60*time.Second, r.Over) // against the 30s sample
	require.InDelta(t, 60, r.DonePerMin, 0.01)
	require.InDelta(t, 0, r.FailPerMin, 0.01)

	// Pruning lowers the counts: clamped at zero.
	r = s.observe(t0.Add(200*time.Second), stats(10, 0))["q"]
	require.True(t, r.Known)
	require.Zero(t, r.DonePerMin)

	// Old samples are forgotten, and the sample list stays bounded.
	r = s.observe(t0.Add(time.Hour), stats(10, 0))["q"]
	require.False(t, r.Known)
	for i := range 2 * maxSamples {
		s.observe(t0.Add(time.Hour+time.Duration(i)*sampleEvery), stats(int64(i), 0))
	}
	require.LessOrEqual(t, len(s.samples), maxSamples)
}

func TestLayoutGraph(t *testing.T) {
	t.Parallel()
	d := &dashboard{}
	g := &gendurable.MachineGraph{
		Machine: "m", Start: "a", Steps: []string{"a", "b", "c", "done", "lonely"},
		Counts: map[string]map[gendurable.Status]int64{
			"a": {gendurable.StatusRunnable: 2},
			"c": {gendurable.StatusFailed: 1, gendurable.StatusDone: 4},
		},
		Transitions: []gendurable.Transition{
			{From: "a", To: "b", Outcome: "next", Count: 3},
			{From: "b", To: "c", Outcome: "await", Count: 2},
			{From: "c", To: "a", Outcome: "next", Count: 1}, // backward
			{From: "c", To: "c", Outcome: "replay", Count: 5},
			{From: "c", To: "done", Outcome: "done", Count: 4},
			{From: "b", To: "done", Outcome: "next", Count: 1}, // a step named "done"
			{From: "c", To: "failed", Outcome: "stop", Count: 1},
		},
	}
	svg := d.layoutGraph(g)
	cols := map[string]int{}
	for _, n := range svg.Nodes {
		cols[n.Terminal+":"+n.Name] = n.col
		require.Positive(t, n.W)
		require.Positive(t, n.H)
		require.LessOrEqual(t, n.X+n.W, svg.Width)
		require.LessOrEqual(t, n.Y+n.H, svg.Height)
	}
	require.Equal(t, 0, cols[":a"])
	require.Equal(t, 1, cols[":b"])
	require.Equal(t, 2, cols[":c"])
	require.Equal(t, 2, cols[":done"]) // the step, not the terminal
	require.Equal(t, 3, cols[":lonely"])
	require.Equal(t, 4, cols["done:done"])
	require.Equal(t, 4, cols["failed:failed"])
	require.Len(t, svg.Edges, 6) // the replay is a loop note, not an edge
	back := 0
	for _, e := range svg.Edges {
		if e.Back {
			back++
		}
	}
	require.Equal(t, 1, back)
	require.Equal(t, []string{"a", "b", "c", "done", "lonely"}, svg.stepOrder())
	for _, n := range svg.Nodes {
		if n.Name == "c" && n.Terminal == "" {
			require.Equal(t, "↻ replayed 5", n.Loop)
		}
		if n.Terminal == "done" {
			require.Equal(t, "4 instances", n.Lines[0].Text)
		}
		if n.Terminal == "failed" {
			require.Equal(t, "1 instance", n.Lines[0].Text)
		}
	}

	// No transitions observed: the start, then everything else, then terminals.
	svg = d.layoutGraph(&gendurable.MachineGraph{Machine: "m", Start: "x", Steps: []string{"w", "x"}})
	require.Equal(t, "x", svg.Nodes[0].Name)
	require.True(t, svg.Nodes[0].Start)
}

func TestStripBaseAndLinks(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/admin":                    "/",
		"/admin/":                   "/",
		"/admin/instances":          "/instances",
		"/instances":                "/instances",
		"/administrator/x":          "/administrator/x",
		"/admin/queues/a%2Fb/pause": "/queues/a%2Fb/pause",
	} {
		u, err := url.Parse(in)
		require.NoError(t, err)
		require.Equal(t, want, stripBase(u, "/admin").EscapedPath(), in)
	}
	d := &dashboard{base: "/admin"}
	require.Equal(t, "/admin/", d.link("/"))
	require.Equal(t, "/admin/instances?q=a+b&status=failed", d.listURL("status", "failed", "q", "a b", "queue", ""))
}

func TestFriendlyNeverEchoesEngineText(t *testing.T) {
	t.Parallel()
	for _, err := range []error{gendurable.ErrNotFound, gendurable.ErrNotRetryable, gendurable.ErrNotCancellable,
		gendurable.ErrInstanceFinished, gendurable.ErrUniqueConflict, gendurable.ErrInvalidSignal, gendurable.ErrInvalidConfig} {
		code, msg, _ := friendly(err)
		require.NotEqual(t, 500, code, err)
		require.NotContains(t, msg, "gendurable:", err)
	}
	code, msg, _ := friendly(errors.New(`relation "x" does not exist`))
	require.Equal(t, 500, code)
	require.Empty(t, msg)
	require.Equal(t, "ab…", truncate(3, "ab€"))
	require.Equal(t, "short", truncate(10, "short"))
}

// TestLogLimiter: a few lines per IP per window, the count of the ones
// left out reported with the next line, and a bounded number of addresses
// tracked.
func TestLogLimiter(t *testing.T) {
	t.Parallel()
	l := newLogLimiter()
	t0 := time.Unix(1_000_000, 0)
	for i := range failureLogBurst {
		ok, dropped := l.allow("a", t0.Add(time.Duration(i)*time.Second))
		require.True(t, ok)
		require.Zero(t, dropped)
	}
	for range 7 {
		ok, _ := l.allow("a", t0.Add(10*time.Second))
		require.False(t, ok)
	}
	ok, _ := l.allow("b", t0.Add(10*time.Second))
	require.True(t, ok, "another address has its own allowance")
	ok, dropped := l.allow("a", t0.Add(failureLogWindow))
	require.True(t, ok)
	require.Equal(t, 7, dropped, "the next line says how many were left out")

	// Past failureLogIPs addresses, new ones share one allowance.
	for i := range failureLogIPs - 2 { // with a and b: full

		l.allow(fmt.Sprint("ip", i), t0.Add(failureLogWindow))
	}
	require.LessOrEqual(t, len(l.m), failureLogIPs+1)
	n := 0
	for i := range 20 {
		if ok, _ := l.allow(fmt.Sprint("new", i), t0.Add(failureLogWindow)); ok {
			n++
		}
	}
	require.Equal(t, failureLogBurst, n)
	require.LessOrEqual(t, len(l.m), failureLogIPs+1)
	// Once the window has passed, stale addresses make room again.
	ok, _ = l.allow("late", t0.Add(3*failureLogWindow))
	require.True(t, ok)
	require.Less(t, len(l.m), 10)
}
