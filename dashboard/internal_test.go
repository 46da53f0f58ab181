package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestLayoutGraph(t *testing.T) {
	t.Parallel()
	d := &dashboard{}
	g := &gendurable.MachineGraph{
		Machine: "m", Start: "a", Steps: []string{"a", "b", "c", "done", "lonely"},
		Counts: map[string]map[gendurable.Status]int64{
			"a": {gendurable.StatusRunnable: 2},
			"c": {gendurable.StatusFailed: 1, gendurable.StatusDone: 4},
		},
		Parked: map[string]gendurable.Parked{"a": {BackingOff: 1, Delayed: 1}},
		Declared: []gendurable.DeclaredTransition{
			{From: "a", To: "b", Kinds: []string{"next"}},
			{From: "b", To: "lonely", Kinds: []string{"next"}}, // declared, never taken
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
	layers := map[string]int{}
	for _, n := range svg.Nodes {
		layers[n.Terminal+":"+n.Name] = n.layer
		require.Positive(t, n.W)
		require.Positive(t, n.H)
		require.LessOrEqual(t, n.X+n.W, svg.Width)
		require.LessOrEqual(t, n.Y+n.H, svg.Height)
	}
	require.Equal(t, 0, layers[":a"])
	require.Equal(t, 1, layers[":b"])
	require.Equal(t, 2, layers[":c"])
	require.Equal(t, 2, layers[":done"]) // the step, not the terminal
	require.Equal(t, 2, layers[":lonely"], "reached by a declared edge")
	require.Equal(t, 3, layers["done:done"])
	require.Equal(t, 3, layers["failed:failed"])
	require.Len(t, svg.Edges, 7) // the replay is a loop note, not an edge
	var back, declaredOnly int
	for _, e := range svg.Edges {
		if e.Back {
			back++
		}
		if e.Declared && !e.Taken {
			declaredOnly++
			require.Empty(t, e.Label)
		}
	}
	require.Equal(t, 1, back)
	require.Equal(t, 1, declaredOnly)
	require.Equal(t, []string{"a", "b", "c", "done", "lonely"}, svg.stepOrder(), "declared order")
	for _, n := range svg.Nodes {
		switch {
		case n.Name == "c" && n.Terminal == "":
			require.Equal(t, "↻ replayed 5", n.Loop)
		case n.Name == "a":
			require.Equal(t, []string{"runnable 2", "↳ backing off 1", "↳ delayed 1"}, lineTexts(n))
		case n.Terminal == "done":
			require.Equal(t, "4 instances", n.Lines[0].Text)
		case n.Terminal == "failed":
			require.Equal(t, "1 instance", n.Lines[0].Text)
		}
	}

	// No transitions at all: the start, then every step in declaration
	// order, one layer each, then the terminals.
	svg = d.layoutGraph(&gendurable.MachineGraph{Machine: "m", Start: "x", Steps: []string{"x", "w", "a"}})
	require.Equal(t, "x", svg.Nodes[0].Name)
	require.True(t, svg.Nodes[0].Start)
	require.Equal(t, []int{0, 1, 2, 3, 3}, nodeLayers(svg))
}

// TestLayoutGraphFitsTheWindow: a 12-step chain (and wider machines) wrap
// into bands no wider than the page at a 1400 px window, without boxes
// overlapping; edges to the next band run from bottom to top.
func TestLayoutGraphFitsTheWindow(t *testing.T) {
	t.Parallel()
	d := &dashboard{}
	require.LessOrEqual(t, maxGraphWidth, 1400-2*24-2*18)
	for _, n := range []int{1, 5, 12, 40} {
		g := &gendurable.MachineGraph{Machine: "chain", Start: "s00"}
		for i := range n {
			g.Steps = append(g.Steps, fmt.Sprintf("s%02d", i))
			to := "done"
			if i < n-1 {
				to = fmt.Sprintf("s%02d", i+1)
			}
			g.Declared = append(g.Declared, gendurable.DeclaredTransition{From: g.Steps[i], To: to, Kinds: []string{"next"}})
		}
		svg := d.layoutGraph(g)
		require.LessOrEqual(t, svg.Width, maxGraphWidth, "%d steps", n)
		require.Equal(t, (n+1+graphCols-1)/graphCols, svg.Bands, "%d steps: a layer each, and the terminals", n)
		for i, a := range svg.Nodes {
			require.LessOrEqual(t, a.X+a.W, svg.Width)
			require.LessOrEqual(t, a.Y+a.H, svg.Height)
			for _, b := range svg.Nodes[i+1:] {
				overlap := a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
				require.False(t, overlap, "%d steps: %s and %s overlap", n, a.Name, b.Name)
			}
		}
		for i := range n {
			node := svg.Nodes[i]
			require.Equal(t, i, node.layer, "declaration order along the chain")
			require.Equal(t, i/graphCols, node.band)
			require.Equal(t, margin+(i%graphCols)*(boxW+colGap), node.X)
		}
	}
	require.Equal(t, 5, graphCols)
	// 12 steps: 13 layers in 3 bands; the edge s04 → s05 goes down.
	g := &gendurable.MachineGraph{Machine: "chain", Start: "s00"}
	for i := range 12 {
		g.Steps = append(g.Steps, fmt.Sprintf("s%02d", i))
		if i > 0 {
			g.Transitions = append(g.Transitions, gendurable.Transition{From: g.Steps[i-1], To: g.Steps[i], Outcome: "next", Count: 1})
		}
	}
	svg := d.layoutGraph(g)
	require.Equal(t, 3, svg.Bands)
	require.Equal(t, 2*margin+5*boxW+4*colGap, svg.Width)
	require.True(t, strings.HasPrefix(svg.Edges[4].Path, fmt.Sprintf("M%d,", margin+4*(boxW+colGap)+boxW/2)), svg.Edges[4].Path)
}

func TestEdgeLabel(t *testing.T) {
	t.Parallel()
	require.Equal(t, "", edgeLabel(nil))
	require.Equal(t, "3", edgeLabel(map[string]int64{"next": 2, "done": 1}))
	require.Equal(t, "await 2", edgeLabel(map[string]int64{"await": 2}))
	require.Equal(t, "2 · await 1 · children 4", edgeLabel(map[string]int64{"next": 2, "await": 1, "children": 4}))
}

func lineTexts(n *svgNode) []string {
	var out []string
	for _, l := range n.Lines {
		out = append(out, l.Text)
	}
	return out
}

func nodeLayers(g *svgGraph) []int {
	var out []int
	for _, n := range g.Nodes {
		out = append(out, n.layer)
	}
	return out
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
		gendurable.ErrInstanceFinished, gendurable.ErrUniqueConflict, gendurable.ErrInvalidSignal, gendurable.ErrInvalidConfig,
		gendurable.ErrNotMigrated} {
		code, msg, _ := friendly(err)
		require.NotEqual(t, 500, code, err)
		require.NotContains(t, msg, "gendurable:", err)
	}
	code, msg, _ := friendly(fmt.Errorf("list: %w", gendurable.ErrNotMigrated))
	require.Equal(t, 503, code)
	require.Contains(t, msg, "run gendurable migrate up")
	code, msg, _ = friendly(fmt.Errorf("list: %w", gendurable.ErrSchemaVersion))
	require.Equal(t, 503, code)
	require.Contains(t, msg, "another gendurable version")
	require.Contains(t, msg, "run gendurable migrate up")
	// A pooler the database URL does not suit: its advice, not a bare 500
	// (a PgBouncer probe).
	code, msg, _ = friendly(fmt.Errorf("list: %w", &pgconn.PgError{Code: "26000", Message: `prepared statement "stmtcache_1" does not exist`}))
	require.Equal(t, 503, code)
	require.Contains(t, msg, "default_query_exec_mode=cache_describe")
	code, msg, _ = friendly(errors.New(`relation "x" does not exist`))
	require.Equal(t, 500, code)
	require.Empty(t, msg)
	require.Equal(t, "ab…", truncate(3, "ab€"))
	require.Equal(t, "short", truncate(10, "short"))
}

// TestLogLimiter: a few lines per client per window; a window that left
// lines out is reported once, by its timer or by the client's next line,
// whichever comes first; a bounded number of clients tracked.
func TestLogLimiter(t *testing.T) {
	t.Parallel()
	type report struct {
		client  string
		dropped int
		since   time.Time
	}
	var reports []report
	var timers []func()
	l := newLogLimiter(func(c string, n int, since time.Time) { reports = append(reports, report{c, n, since}) })
	l.after = func(_ time.Duration, f func()) { timers = append(timers, f) }
	t0 := time.Unix(1_000_000, 0)
	for i := range failureLogBurst {
		require.True(t, l.allow("a", t0.Add(time.Duration(i)*time.Second)))
	}
	for range 7 {
		require.False(t, l.allow("a", t0.Add(10*time.Second)))
	}
	require.Len(t, timers, 1, "one timer for the window's lines left out")
	require.True(t, l.allow("b", t0.Add(10*time.Second)), "another client has its own allowance")
	require.Empty(t, reports)
	// The window ends with nothing more from a: its timer reports the count.
	timers[0]()
	require.Equal(t, []report{{"a", 7, t0}}, reports)
	timers[0]() // once
	require.Len(t, reports, 1)

	// The client's next line, after the window, reports first when it
	// comes before the timer; the timer then reports nothing.
	t1 := t0.Add(failureLogWindow)
	for i := range failureLogBurst + 3 {
		l.allow("a", t1.Add(time.Duration(i)*time.Millisecond))
	}
	require.Len(t, timers, 2)
	t2 := t1.Add(failureLogWindow)
	require.True(t, l.allow("a", t2))
	require.Equal(t, report{"a", 3, t1}, reports[1])
	l.allow("a", t2) // drops into the new window must not be taken by the old timer
	for range failureLogBurst {
		l.allow("a", t2)
	}
	timers[1]()
	require.Len(t, reports, 2, "the old window's timer reported nothing")
	require.Len(t, timers, 3)
	timers[2]()
	require.Equal(t, report{"a", 2, t2}, reports[2]) // 7 lines in the window, 5 allowed

	// Past failureLogIPs clients, new ones share one allowance.
	l.allow("b", t2) // b's window starts again: not stale
	for i := 0; len(l.m) < failureLogIPs; i++ {
		l.allow(fmt.Sprint("ip", i), t2)
	}
	require.LessOrEqual(t, len(l.m), failureLogIPs+1)
	n := 0
	for i := range 20 {
		if l.allow(fmt.Sprint("new", i), t2) {
			n++
		}
	}
	require.Equal(t, failureLogBurst, n)
	require.LessOrEqual(t, len(l.m), failureLogIPs+1)
	timers[len(timers)-1]()
	require.Equal(t, report{otherClients, 20 - failureLogBurst, t2}, reports[len(reports)-1])
	// Once the window has passed, stale clients make room again.
	require.True(t, l.allow("late", t2.Add(3*failureLogWindow)))
	require.Less(t, len(l.m), 10)
}

// TestClientOf: an IPv6 client is its /64; IPv4 (and IPv4 in IPv6) its
// address.
func TestClientOf(t *testing.T) {
	t.Parallel()
	for remote, want := range map[string]string{
		"192.0.2.7:5000":             "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1":   "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":          "fe80::/64",
		"[::ffff:192.0.2.7]:80":      "::ffff:192.0.2.7",
		"not an address":             "not an address",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		require.Equal(t, want, clientOf(r), remote)
	}
}

// TestFlashSignature: a bulk flash's signature holds for its own page,
// values and time only: not on another page, not with a value changed, not
// once flashTTL has passed (or from the future).
func TestFlashSignature(t *testing.T) {
	t.Parallel()
	d := &dashboard{}
	d.flashKey[0] = 7
	v := d.signFlash("/instances/5", url.Values{"flash": {"tree-cancelled"}, "changed": {"2"}, "partial": {"1"}})
	require.True(t, d.flashSigned("/instances/5", v))
	require.False(t, d.flashSigned("/instances/6", v))
	w := url.Values{}
	for k, vs := range v {
		w[k] = vs
	}
	w.Set("partial", "0")
	require.False(t, d.flashSigned("/instances/5", w))
	for _, at := range []time.Time{time.Now().Add(-flashTTL - time.Second), time.Now().Add(2 * time.Minute)} {
		w.Set("partial", "1")
		w.Set("at", strconv.FormatInt(at.Unix(), 10))
		w.Set("sig", d.flashMAC(flashPage("/instances/5", w), w))
		require.False(t, d.flashSigned("/instances/5", w), at)
	}
	other := &dashboard{}
	require.False(t, other.flashSigned("/instances/5", v), "another dashboard's key")

	// A list's filter is part of the page: counts signed for one filter
	// are not shown under another, nor with no filter; the flash
	// parameters themselves and their order are not part of it.
	v = d.signFlash("/instances?queue=slow&status=failed", url.Values{"flash": {"bulk-retried"}, "changed": {"0"}})
	page := func(filter string) url.Values {
		q, err := url.ParseQuery(filter)
		require.NoError(t, err)
		for k, vs := range v {
			q[k] = vs
		}
		return q
	}
	require.True(t, d.flashSigned("/instances", page("status=failed&queue=slow")))
	require.False(t, d.flashSigned("/instances", page("queue=default&status=failed")))
	require.False(t, d.flashSigned("/instances", page("")))
	require.False(t, d.flashSigned("/instances", page("queue=slow&status=failed&step=x")))
}

// TestTheTimelineOfAFarFutureInstance: an instance due in 9999 (RunAt
// allows it) spans about 8,000 years: its ticks lie left to right across
// the plot, each with its year. The span was a time.Duration, which holds
// 292 years: the ticks' offsets overflowed and ran backwards (a hostile
// probe).
func TestTheTimelineOfAFarFutureInstance(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, due := range []time.Time{
		time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 30, 0, 0, 0, 0, time.UTC),
	} {
		det := &gendurable.InstanceDetail{Instance: gendurable.Instance{ID: 1, Status: gendurable.StatusRunnable,
			Step: "a", MaxAttempts: 3, InsertedAt: now.Add(-time.Minute), UpdatedAt: now.Add(-time.Minute), EligibleAt: due}}
		tl, _ := buildTimeline(det, now)
		require.Len(t, tl.Ticks, 5)
		for i, tk := range tl.Ticks {
			require.GreaterOrEqual(t, tk.Pos, tl.PlotX, "%v: tick %d", due, i)
			require.LessOrEqual(t, tk.Pos, tl.PlotX+tl.PlotW, "%v: tick %d", due, i)
			if i > 0 {
				require.Greater(t, tk.Pos, tl.Ticks[i-1].Pos, "%v: tick %d", due, i)
				require.Greater(t, tk.Label, tl.Ticks[i-1].Label, "%v: the labels go forward (years)", due)
			}
		}
		require.Equal(t, "2026-11-30", tl.Ticks[0].Label)
		require.Equal(t, due.Format("2006-01-02"), tl.Ticks[4].Label)
	}
}

func TestAgoOfFarTimes(t *testing.T) {
	t.Parallel()
	now := time.Now()
	require.Equal(t, "3d ago", ago(now.Add(-73*time.Hour)))
	require.Equal(t, "500d from now", ago(now.Add(500*24*time.Hour+time.Hour)))
	require.Equal(t, strconv.Itoa(9999-now.Year())+"y from now", ago(time.Date(9999, 12, 30, 0, 0, 0, 0, time.UTC)))
	require.Equal(t, strconv.Itoa(now.Year()-2)+"y ago", ago(time.Date(1, 12, 31, 23, 59, 0, 0, time.UTC)), "whole years")
	require.Equal(t, "2y ago", ago(now.AddDate(-2, 0, -1)))
	require.True(t, strings.HasSuffix(ago(now.AddDate(-1, -11, 0)), "d ago"), "a year and eleven months: days, not 2 years")
}

// TestABulkRunCutShortByItsTimeoutIsAuditedAsPartial: a bulk action that
// the request's timeout stopped after changing some redirects (303, the
// page says partial=1); its audit line said outcome=ok, so a search of the
// trail for outcome=partial missed every such run (a hostile probe).
func TestABulkRunCutShortByItsTimeoutIsAuditedAsPartial(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	d := &dashboard{auditor: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: LevelAudit}))}
	r := httptest.NewRequest("POST", "/bulk/cancel", nil)
	for _, c := range []struct {
		code    int
		partial bool
		want    string
	}{{303, true, "outcome=partial"}, {303, false, "outcome=ok"}, {0, true, "outcome=partial"}, {500, false, "outcome=failed"}} {
		buf.Reset()
		rec := &auditRecord{attrs: []any{"changed", 3}}
		if c.partial {
			rec.attrs = append(rec.attrs, "partial", true)
		}
		d.logAudit(r, "bulk-cancel", rec, c.code)
		require.Contains(t, buf.String(), " "+c.want+" ", "%+v", c)
	}
}
