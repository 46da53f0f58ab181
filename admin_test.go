package gendurable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("listed")
	m := probeMachine(nil)
	b := setup(t, nil, job, m)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := 0; i < 25; i++ {
		ps = append(ps, job.New(orderArgs{I: i}).With(gendurable.InsertOpts{Queue: "a", PartitionKey: fmt.Sprintf("pk-%d", i)}))
	}
	for i := 0; i < 5; i++ {
		ps = append(ps, m.New(probeState{Do: "done"}).With(gendurable.InsertOpts{Queue: "b", UniqueKey: fmt.Sprintf("uk-%d", i)}))
	}
	res, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)

	page, err := b.eng.List(ctx, gendurable.ListFilter{Queue: "a", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Instances, 10)
	require.Equal(t, res[24].ID, page.Instances[0].ID, "newest first")
	seen := map[int64]bool{}
	for before := int64(0); ; {
		p, err := b.eng.List(ctx, gendurable.ListFilter{Queue: "a", Limit: 10, Before: before})
		require.NoError(t, err)
		for _, in := range p.Instances {
			require.False(t, seen[in.ID])
			seen[in.ID] = true
			require.Equal(t, "a", in.Queue)
		}
		if p.NextBefore == 0 {
			break
		}
		before = p.NextBefore
	}
	require.Len(t, seen, 25, "paging visits every row once")

	for _, f := range []struct {
		f    gendurable.ListFilter
		want int
	}{
		{gendurable.ListFilter{Machine: "probe"}, 5},
		{gendurable.ListFilter{Status: gendurable.StatusRunnable}, 30},
		{gendurable.ListFilter{Status: gendurable.StatusDone}, 0},
		{gendurable.ListFilter{Step: "a"}, 5},
		{gendurable.ListFilter{Search: "pk-3"}, 1},
		{gendurable.ListFilter{Search: "uk-2"}, 1},
		{gendurable.ListFilter{Search: fmt.Sprint(res[7].ID)}, 1},
		{gendurable.ListFilter{From: time.Now().Add(time.Hour)}, 0},
		{gendurable.ListFilter{To: time.Now().Add(time.Hour), Limit: 100}, 30},
	} {
		p, err := b.eng.List(ctx, f.f)
		require.NoError(t, err)
		require.Len(t, p.Instances, f.want, "%+v", f.f)
	}
	_, err = b.eng.List(ctx, gendurable.ListFilter{Status: "bogus"})
	require.Error(t, err)
	p, err := b.eng.List(ctx, gendurable.ListFilter{Limit: 100000})
	require.NoError(t, err)
	require.Len(t, p.Instances, 30, "the limit is capped, not rejected")
}

// TestASearchIsAnIDOnlyWrittenAsOne: a search of "0009" or "+9" is a key,
// not also the instance whose id is 9 — a bulk cancel of the instances of
// account "0009" (zero-padded keys are common) had cancelled instance 9 too.
func TestASearchIsAnIDOnlyWrittenAsOne(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("padded")
	b := setup(t, nil, job)
	ctx := context.Background()
	other, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "idle"}))
	require.NoError(t, err)
	padded := fmt.Sprintf("%05d", other.ID)
	signed := fmt.Sprintf("+%d", other.ID)
	keyed, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "idle", PartitionKey: padded}),
		job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "idle", UniqueKey: signed}),
	})
	require.NoError(t, err)
	for search, want := range map[string]int64{padded: keyed[0].ID, signed: keyed[1].ID, fmt.Sprint(other.ID): other.ID} {
		page, err := b.eng.List(ctx, gendurable.ListFilter{Search: search})
		require.NoError(t, err)
		require.Len(t, page.Instances, 1, "search %q", search)
		require.Equal(t, want, page.Instances[0].ID, "search %q", search)
	}
	res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{Search: padded}, "account closed")
	require.NoError(t, err)
	require.Equal(t, []int64{keyed[0].ID}, res.ChangedIDs)
	in, err := b.eng.Instance(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusRunnable, in.Status, "the instance whose id the key spells is not the key's")
}

// TestListLooksAtABoundedWindow: a filter that matches only old rows gets
// short, partial pages that say where they stopped, and paging on finds
// every match once; a search by key finds its rows in any status.
func TestListLooksAtABoundedWindow(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("windowed")
	b := setup(t, nil, job)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := range 3 {
		ps = append(ps, job.New(orderArgs{I: i}).With(gendurable.InsertOpts{Queue: "old", PartitionKey: "pk"}))
	}
	for i := range 25 {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	res, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Cancel(ctx, res[1].ID, "finished rows are found too"))

	var found []int64
	partial := 0
	f := gendurable.ListFilter{Queue: "old", MaxScan: 10, Limit: 2}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err)
		require.LessOrEqual(t, page.Scanned, 10)
		for _, in := range page.Instances {
			found = append(found, in.ID)
		}
		if page.Partial {
			partial++
			require.Less(t, len(page.Instances), 2, "a partial page did not fill up")
			require.Equal(t, 10, page.Scanned)
			require.NotZero(t, page.NextBefore)
		}
		if page.NextBefore == 0 {
			break
		}
		f.Before = page.NextBefore
	}
	require.Equal(t, []int64{res[2].ID, res[1].ID, res[0].ID}, found)
	require.Equal(t, 2, partial, "28 rows in windows of 10: two windows held no match")

	page, err := b.eng.List(ctx, gendurable.ListFilter{Search: "pk"})
	require.NoError(t, err)
	require.Len(t, page.Instances, 3)
	require.Equal(t, gendurable.StatusFailed, page.Instances[1].Status)
	require.False(t, page.Partial)
	require.Zero(t, page.Scanned, "Scanned is reported for partial pages")
}

// TestListByStateContent: ListFilter.State keeps the instances whose state
// contains a JSON document, within the window a page looks at, combined
// with the other filters and a key search; a document that is not a JSON
// object or array, or too long, is ErrInvalidInput.
func TestListByStateContent(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("stateful")
	b := setup(t, nil, job)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := range 30 {
		ps = append(ps, job.New(orderArgs{I: i % 10}).With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("pk-%d", i)}))
	}
	res, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)

	page, err := b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"i": 7}`)})
	require.NoError(t, err)
	require.Equal(t, []int64{res[27].ID, res[17].ID, res[7].ID}, ids(page))
	page, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"i": 7}`), Search: "pk-17"})
	require.NoError(t, err)
	require.Equal(t, []int64{res[17].ID}, ids(page), "with a key search")
	page, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{}`), Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Instances, 30, "{} is contained in every object")
	page, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"i": 70}`)})
	require.NoError(t, err)
	require.Empty(t, page.Instances)

	// Bounded like the other filters: a window of 12 sees the newest 12.
	page, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"i": 3}`), MaxScan: 12})
	require.NoError(t, err)
	require.Equal(t, []int64{res[23].ID}, ids(page))
	require.True(t, page.Partial)
	var rest []int64
	for page.NextBefore != 0 {
		page, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"i": 3}`), MaxScan: 12, Before: page.NextBefore})
		require.NoError(t, err)
		rest = append(rest, ids(page)...)
	}
	require.Equal(t, []int64{res[13].ID, res[3].ID}, rest, "paging on finds the older matches")

	for _, bad := range []string{`7`, `"x"`, `{"i":`, `null`, `{"k": "\u0000"}`, `{"k": "` + strings.Repeat("x", 1000) + `"}`} {
		_, err := b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(bad)})
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, bad)
	}
}

// TestListStateFilterEdgeInput: what jsonb refuses is bad input, not a
// database failure, and an escaped backslash before "u0000" is no NUL.
func TestListStateFilterEdgeInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	id := b.seedRow(`status, state`, `'runnable', $1::jsonb`, `{"p": "C:\\u0000"}`)
	for _, bad := range []string{"{\"k\": \"\xff\"}", `{"k": "\ud800"}`, `{"k": 1e1000000}`} {
		_, err := b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(bad)})
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, bad)
	}
	page, err := b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"p": "C:\\u0000"}`)})
	require.NoError(t, err)
	require.Equal(t, []int64{id}, ids(page))
}

func ids(p *gendurable.ListPage) []int64 {
	var out []int64
	for _, in := range p.Instances {
		out = append(out, in.ID)
	}
	return out
}

// TestAdminInputIsValidated: NUL, invalid UTF-8, control characters and
// oversized text in list filters, queue and machine names are
// ErrInvalidInput before any SQL runs (the database would answer 22021),
// and a refused pause writes no queue row.
func TestAdminInputIsValidated(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("validated")
	b := setup(t, nil, job)
	ctx := context.Background()
	id := b.insert(job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{Queue: "café", PartitionKey: "ключ"}))

	bad := map[string]string{
		"nul":       "a\x00b",
		"invalid":   "\xff\xfe",
		"control":   "\x1b[2J",
		"c1":        "a\u0085b",
		"del":       "a\x7fb",
		"too long":  strings.Repeat("q", 1001),
		"truncated": "caf\xc3",
	}
	for name, v := range bad {
		for _, f := range []gendurable.ListFilter{{Queue: v}, {Machine: v}, {Step: v}, {Search: v}} {
			_, err := b.eng.List(ctx, f)
			require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%s: %+v", name, f)
		}
		require.ErrorIs(t, b.eng.Pause(ctx, v), gendurable.ErrInvalidInput, name)
		require.ErrorIs(t, b.eng.Resume(ctx, v), gendurable.ErrInvalidInput, name)
		_, err := b.eng.Graph(ctx, v)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, name)
	}
	for _, v := range []string{"", strings.Repeat("q", 201)} {
		require.ErrorIs(t, b.eng.Pause(ctx, v), gendurable.ErrInvalidInput, "%q", v)
	}
	_, err := b.eng.List(ctx, gendurable.ListFilter{Status: "nope"})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	var queues int
	require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.gendurable_queues`, b.schema)).Scan(&queues))
	require.Zero(t, queues, "no refused pause wrote a row")

	// Valid non-ASCII text still filters and searches.
	for _, f := range []gendurable.ListFilter{{Queue: "café"}, {Search: "ключ"}, {Search: fmt.Sprint(id)}} {
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err, "%+v", f)
		require.Len(t, page.Instances, 1, "%+v", f)
		require.Equal(t, id, page.Instances[0].ID)
	}
	require.NoError(t, b.eng.Pause(ctx, "café"))
}

func TestDescribeAndGraph(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	b := setup(t, nil, parent, leaf)
	b.start()
	ctx := context.Background()
	id := b.insert(parent.New(fanState{Width: 2}))
	b.waitStatus(id, "done", 10*time.Second)
	_, err := b.eng.Signal(ctx, id, "late", nil, nil)
	require.ErrorIs(t, err, gendurable.ErrInstanceFinished)

	d, err := b.eng.Describe(ctx, id)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, d.Status)
	require.Len(t, d.Children, 2)
	require.Equal(t, "finished (done)", d.Wait.Summary)
	cd, err := b.eng.Describe(ctx, d.Children[0].ID)
	require.NoError(t, err)
	require.NotNil(t, cd.Parent)
	require.Equal(t, id, cd.Parent.ID)

	g, err := b.eng.Graph(ctx, "fan")
	require.NoError(t, err)
	require.Equal(t, []string{"spawn", "join"}, g.Steps, "Start first, then the rest by name")
	require.Equal(t, "spawn", g.Start)
	require.Equal(t, int64(1), g.Counts["join"][gendurable.StatusDone])
	require.Contains(t, g.Transitions, gendurable.Transition{From: "spawn", To: "join", Outcome: "children", Count: 1})
	require.Contains(t, g.Transitions, gendurable.Transition{From: "join", To: "done", Outcome: "done", Count: 1})
	_, err = b.eng.Graph(ctx, "nope")
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

func TestCancelFencesARunningStepAndJoinsTheParent(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var token atomic.Int64
	leaf := &gendurable.Job[leafArgs]{Name: "cleaf", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		token.Store(j.Token)
		close(started)
		<-release
		return nil
	}}
	m := &gendurable.Machine[fanState]{Name: "cparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return gendurable.Done(string(r.Children[0].Status)), nil
			},
		}}
	log := &eventLog{}
	cfg := fastConfig("", m, leaf)
	cfg.Hooks = []gendurable.Hook{log}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	<-started
	var child int64
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1`, b.schema), parent).Scan(&child))
	require.NoError(t, b.eng.Cancel(ctx, child, "customer withdrew"))
	close(release)
	r := b.waitStatus(parent, "done", 10*time.Second)
	require.JSONEq(t, `"failed"`, string(r.Result), "the parent resumed: its cancelled child counts as finished")
	c := b.row(child)
	require.Equal(t, "failed", c.Status)
	require.Equal(t, "cancelled", c.Errors[len(c.Errors)-1]["kind"])
	require.Equal(t, "customer withdrew", c.Errors[len(c.Errors)-1]["error"])
	require.EqualValues(t, token.Load(), c.Errors[len(c.Errors)-1]["token"], "the entry names the claim it fenced out")
	eventually(t, 5*time.Second, func() bool {
		ev, ok := findEvent(log, func(e *gendurable.StepEvent) bool { return e.InstanceID == child })
		return ok && ev.Fenced
	}, "the running step's late outcome was not fenced out")

	require.ErrorIs(t, b.eng.Cancel(ctx, child, ""), gendurable.ErrNotCancellable)
	require.ErrorIs(t, b.eng.Cancel(ctx, 99999, ""), gendurable.ErrNotFound)
}

// TestACancelThroughThisEngineEndsItsRunningStepAtOnce: a cancel through
// the engine that runs the step cancels the step's context as it commits,
// with cause ErrInstanceCancelled, and drops a claim of a cancelled
// instance waiting in the buffer (its step never runs). Before, the step
// ran on until the next heartbeat found its lease gone (a River user's
// probe: 20 s at the defaults, with cause ErrLeaseLost), and a buffered
// claim ran its step, to be fenced out.
func TestACancelThroughThisEngineEndsItsRunningStepAtOnce(t *testing.T) {
	t.Parallel()
	type ended struct {
		n     int
		cause error
	}
	ends := make(chan ended, 4)
	var runs [4]atomic.Int32
	job := &gendurable.Job[leafArgs]{Name: "ccancel", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		runs[j.State.N].Add(1)
		<-ctx.Done()
		ends <- ended{j.State.N, context.Cause(ctx)}
		return ctx.Err()
	}}
	cfg := fastConfig("", job)
	// Heartbeats far apart: only the cancel can end the steps in time.
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2, Prefetch: 2, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	var ids [4]int64
	for n := range ids {
		ids[n] = b.insert(job.New(leafArgs{N: n}))
	}
	// Two run, two wait in the buffer.
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 4
	},
		"four claimed")
	eventually(t, 10*time.Second, func() bool { return runs[0].Load()+runs[1].Load()+runs[2].Load()+runs[3].Load() == 2 }, "two running")
	var running, buffered []int64
	for n, id := range ids {
		if runs[n].Load() == 1 {
			running = append(running, id)
		} else {
			buffered = append(buffered, id)
		}
	}
	// The buffered ones first: their steps must never start.
	res, err := b.eng.CancelMany(ctx, buffered, "")
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Changed)
	require.NoError(t, b.eng.Cancel(ctx, running[0], "one"))
	_, err = b.eng.CancelMany(ctx, running[1:], "many")
	require.NoError(t, err)
	for range 2 {
		select {
		case e := <-ends:
			require.ErrorIs(t, e.cause, gendurable.ErrInstanceCancelled, "step %d", e.n)
			require.ErrorIs(t, e.cause, gendurable.ErrLeaseLost, "step %d: handled as a lost claim", e.n)
		case <-time.After(10 * time.Second):
			t.Fatal("a cancelled step is still running 10 s after its cancel")
		}
	}
	time.Sleep(300 * time.Millisecond) // slots free: a buffered claim would start now
	for n, id := range ids {
		if slices.Contains(buffered, id) {
			require.Zero(t, runs[n].Load(), "instance %d, cancelled while its claim waited in the buffer, ran its step", id)
		}
		require.Equal(t, "failed", b.row(id).Status)
	}
}

// TestACancelWhileThePicksAnswerIsInFlightKeepsTheStepFromStarting: the
// cancel commits after a pick claimed the row and before the feeder took
// the pick's answer in, so it finds no claim to cancel; the claim, when it
// arrives, is handed back (fenced: the row stays failed), and the step
// never starts. A review held the answer so and saw the step start and run
// until the next heartbeat, 20 s later.
func TestACancelWhileThePicksAnswerIsInFlightKeepsTheStepFromStarting(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	job := &gendurable.Job[leafArgs]{Name: "ccancelpick", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		runs.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}}
	tr := &holdPickAnswer{held: make(chan struct{}), release: make(chan struct{})}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	b := setupTraced(t, tr, cfg, job)
	b.start()
	ctx := context.Background()
	tr.armed.Store(true)
	id := b.insert(job.New(leafArgs{}))
	select {
	case <-tr.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no pick claimed the row")
	}
	require.NoError(t, b.eng.Cancel(ctx, id, "while the pick's answer was on its way"))
	close(tr.release)
	time.Sleep(time.Second)
	require.Zero(t, runs.Load(), "the cancelled instance's step started")
	require.Equal(t, "failed", b.row(id).Status)
}

// holdPickAnswer, once armed, holds the first pick that claimed rows after
// its answer arrived, before the feeder takes it in, until release.
type holdPickAnswer struct {
	armed         atomic.Bool
	held, release chan struct{}
}

func (h *holdPickAnswer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, holdPickKey{}, strings.Contains(d.SQL, "gendurable_pick("))
}

func (h *holdPickAnswer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if pick, _ := ctx.Value(holdPickKey{}).(bool); pick && d.Err == nil && d.CommandTag.RowsAffected() > 0 && h.armed.CompareAndSwap(true, false) {
		close(h.held)
		<-h.release
	}
}

type holdPickKey struct{}

// TestPausedQueueIsNotPickedByAnyProcess: no engine picks a paused queue,
// Queues and WaitReason say it is paused, and Resume lets it run.
func TestPausedQueueIsNotPickedByAnyProcess(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("paused")
	b := setup(t, nil, job)
	ctx := context.Background()
	require.NoError(t, b.eng.Pause(ctx, "default"))
	other, err := gendurable.New(b.pool, fastConfig(b.schema, job))
	require.NoError(t, err)
	require.NoError(t, other.Start(ctx))
	defer func() { _ = other.Stop(ctx) }()
	b.start()
	id := b.insert(job.New(orderArgs{}))
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, "runnable", b.row(id).Status)
	qs, err := b.eng.Queues(ctx)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	require.True(t, qs[0].Paused)
	require.Equal(t, int64(1), qs[0].ByStatus[gendurable.StatusRunnable])
	w, err := b.eng.WaitReason(ctx, id)
	require.NoError(t, err)
	require.True(t, w.QueuePaused)
	require.Equal(t, `runnable, waiting for a worker of queue "default"; its queue is paused: no process picks it until the queue is resumed`, w.Summary)
	require.NoError(t, b.eng.Resume(ctx, "default"))
	b.waitStatus(id, "done", 10*time.Second)
	qs, err = b.eng.Queues(ctx)
	require.NoError(t, err)
	require.False(t, qs[0].Paused)
	require.Equal(t, int64(1), qs[0].ByStatus[gendurable.StatusDone])
	require.Equal(t, int64(1), qs[0].Total)
}

// TestPauseRefusesUnknownQueues: pausing or resuming a name with no row and
// no instance (a typo, "\t") writes nothing and returns ErrUnknownQueue, so
// no phantom queue appears in Queues; Create, an instance, or the engine's
// own configured queue make a queue known.
func TestPauseRefusesUnknownQueues(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("queues")
	var logs bytes.Buffer
	cfg := fastConfig("", job)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, cfg)
	// An admin engine, as the CLI makes: no queues of its own.
	admin, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema})
	require.NoError(t, err)
	ctx := context.Background()

	require.ErrorIs(t, admin.Pause(ctx, "nosuchqueue"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, admin.Resume(ctx, "nosuchqueue"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, admin.SetPaused(ctx, "nosuchqueue", true, &gendurable.QueueOpts{}), gendurable.ErrUnknownQueue)
	// A name no queue can have is invalid input, refused before any SQL.
	require.ErrorIs(t, admin.Pause(ctx, "\t"), gendurable.ErrInvalidInput)
	require.ErrorIs(t, admin.SetPaused(ctx, "\t", true, &gendurable.QueueOpts{Create: true}), gendurable.ErrInvalidInput)
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues`))
	qs, err := admin.Queues(ctx)
	require.NoError(t, err)
	require.Empty(t, qs, "no phantom queue")

	// The working engine's configured queue is known before any instance.
	require.NoError(t, b.eng.Pause(ctx, "default"))
	require.Contains(t, logs.String(), "gendurable: queue paused")
	// Known from then on, through its row, to every engine.
	require.NoError(t, admin.Resume(ctx, "default"))
	// A queue with an instance is known.
	b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "emails"}))
	require.NoError(t, admin.Pause(ctx, "emails"))
	// Create makes a new one on purpose.
	require.NoError(t, admin.SetPaused(ctx, "later", true, &gendurable.QueueOpts{Create: true}))
	qs, err = admin.Queues(ctx)
	require.NoError(t, err)
	paused := map[string]bool{}
	for _, q := range qs {
		paused[q.Queue] = q.Paused
	}
	require.Equal(t, map[string]bool{"default": false, "emails": true, "later": true}, paused)
}

// TestRemoveQueue: an operator removes the row of a queue without
// instances; a queue with instances (finished ones too) is refused with
// ErrQueueNotEmpty and keeps its row; a name without a row is ErrUnknownQueue.
func TestRemoveQueue(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("remove")
	var logs bytes.Buffer
	cfg := fastConfig("", job)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, cfg)
	ctx := context.Background()

	require.NoError(t, b.eng.SetPaused(ctx, "typo", true, &gendurable.QueueOpts{Create: true}))
	id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "busy"}))
	require.NoError(t, b.eng.Pause(ctx, "busy"))

	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "busy"), gendurable.ErrQueueNotEmpty)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1`, id)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "busy"), gendurable.ErrQueueNotEmpty, "finished instances count until pruned")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues WHERE name = 'busy' AND paused`))

	require.NoError(t, b.eng.RemoveQueue(ctx, "typo"))
	require.Contains(t, logs.String(), "gendurable: queue removed")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues WHERE name = 'typo'`))
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "typo"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "never"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, ""), gendurable.ErrInvalidInput)
}

func TestPruneDeletesOldFinishedRowsInBatches(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("pruned")
	m := awaiter(0)
	b := setup(t, nil, job, m)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := 0; i < 2500; i++ {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	live := b.insert(m.New(waitState{}))
	_, err = b.eng.Signal(ctx, live, "note", nil, nil)
	require.NoError(t, err)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() - interval '10 days' WHERE fsm = 'pruned' AND id % 2 = 0`)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'failed', finished_at = now() - interval '1 hour' WHERE fsm = 'pruned' AND id % 2 = 1`)
	n, err := b.eng.Prune(ctx, -time.Hour, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidInput, "a negative retention")
	require.Zero(t, n)
	var calls int
	n, err = b.eng.Prune(ctx, 24*time.Hour, func(int64) { calls++ })
	require.NoError(t, err)
	require.Equal(t, int64(1250), n)
	require.Equal(t, 2, calls, "1000 + 250")
	require.Equal(t, 1251, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "recent and live rows stay")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`))
}

// TestPruneLeavesATableThatInheritsTheInstancesAlone: a table of another
// schema declared INHERITS gendurable_instances (an application's archive)
// holds rows that are not gendurable's; a scan or DELETE of the parent takes
// them in, and a prune deleted them (a probe: `gendurable prune` deleted two
// archived rows finished 30 days before, "deleted 2 instances"). The prune
// reads and deletes the instances table ONLY; gendurable's own old rows go.
func TestPruneLeavesATableThatInheritsTheInstancesAlone(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("pruned")
	b := setup(t, nil, job)
	ctx := context.Background()
	own := b.insert(job.New(orderArgs{I: 1}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() - interval '30 days' WHERE id = $1`, own)
	b.exec(`CREATE SCHEMA {{s}}_archive;
		CREATE TABLE {{s}}_archive.old_instances (archived_by text) INHERITS ({{s}}.gendurable_instances);
		INSERT INTO {{s}}_archive.old_instances (id, fsm, step, status, finished_at, archived_by)
		VALUES (900001, 'billing', 'done', 'done', now() - interval '30 days', 'ops'),
		       (900002, 'billing', 'done', 'failed', now() - interval '30 days', 'ops')`)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), replaceSchema(`DROP SCHEMA {{s}}_archive CASCADE`, b.schema))
	})

	n, err := b.eng.Prune(ctx, 24*time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "gendurable's own old row only")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM ONLY {{s}}.gendurable_instances WHERE id = $1`, own))
	require.Equal(t, 2, b.count(`SELECT count(*) FROM {{s}}_archive.old_instances`), "the archive's rows are not gendurable's to delete")
}

// TestPruneKeepsACancelledKeyedStepsSlot: a keyed step cancelled mid-step
// keeps its key's slot until its lease ends (it runs until its worker's next
// heartbeat), and a prune with a retention shorter than that lease does not
// delete the slot: the cancelled row is kept until its lease has ended, so
// the key's next row does not start beside the step that was cancelled.
func TestPruneKeepsACancelledKeyedStepsSlot(t *testing.T) {
	t.Parallel()
	g := newKeyGauge()
	started := make(chan string, 4)
	job := gaugedJob("pk", g, started, 4*time.Second)
	b := setup(t, nil, job) // lease 3s, heartbeat 1s
	ctx := context.Background()
	a := b.insert(job.New(spanArgs{Key: "A"}).With(gendurable.InsertOpts{PartitionKey: "k"}))
	b.start()
	require.Equal(t, "A", <-started)
	b.insert(job.New(spanArgs{Key: "B"}).With(gendurable.InsertOpts{PartitionKey: "k"}))
	require.NoError(t, b.eng.Cancel(ctx, a, "operator"))
	n, err := b.eng.Prune(ctx, 0, nil)
	require.NoError(t, err)
	require.Zero(t, n, "a cancelled row whose lease is live is not pruned")
	select {
	case key := <-started:
		require.Equal(t, "B", key)
	case <-time.After(10 * time.Second):
		t.Fatal("B did not run")
	}
	require.Equal(t, 1, g.max("k"), "key k (limit 1): most steps at once")
	eventually(t, 10*time.Second, func() bool {
		n, err := b.eng.Prune(ctx, 0, nil)
		require.NoError(t, err)
		return n == 1
	}, "the cancelled row is pruned once its lease has ended")
}

// TestNamesAndKeysShareOneRule: what an insert or a config may hold, an
// operator can filter, pause and remove, and the reverse: a queue name or
// partition key with a control character is refused at insert
// (ErrInvalidInsert) and in config (ErrInvalidConfig), as the admin API
// refuses it (ErrInvalidInput) — RemoveQueue included.
func TestNamesAndKeysShareOneRule(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("onerule")
	b := setup(t, nil, job)
	ctx := context.Background()
	for _, v := range []string{"tab\tqueue", "esc\x1b[2J", "a\x00b", "\xff", "a\u0085b"} {
		_, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "queue %q", v)
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{PartitionKey: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "partition key %q", v)
		require.ErrorIs(t, b.eng.RemoveQueue(ctx, v), gendurable.ErrInvalidInput, "remove %q", v)
		_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Queues: map[string]gendurable.QueueConfig{v: {}}})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "config queue %q", v)
		bad := &gendurable.Job[orderArgs]{Name: v, Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
		_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{bad}})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "machine name %q", v)
	}
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, ""), gendurable.ErrInvalidInput)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.gendurable_instances`, b.schema)).Scan(&n))
	require.Zero(t, n, "no refused insert wrote a row")

	// Printable non-ASCII names and keys work everywhere.
	id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "naïve queue", PartitionKey: "clé 1"}))
	for _, f := range []gendurable.ListFilter{{Queue: "naïve queue"}, {Search: "clé 1"}} {
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err)
		require.Len(t, page.Instances, 1)
		require.Equal(t, id, page.Instances[0].ID)
	}
	require.NoError(t, b.eng.Pause(ctx, "naïve queue"))
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "naïve queue"), gendurable.ErrQueueNotEmpty)
}

// TestPruneKeepsTheChildrenOfALiveParent: a child that finished long ago
// while its parent still waits for a slower sibling is part of what the
// parent's next step reads (Run.Children, with results). Prune — the
// operator's and the engine's own — must leave it until the parent has
// finished, whatever its age; then it goes like any finished row.
func TestPruneKeepsTheChildrenOfALiveParent(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	leaf := &gendurable.Job[leafArgs]{Name: "pleaf", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		if j.State.N == 2 {
			<-gate // the slow sibling
		}
		return nil
	}}
	m := &gendurable.Machine[fanState]{Name: "pparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Children)), nil
			},
		}}
	b := setup(t, fastConfig("", m, leaf))
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	var fast int64
	eventually(t, 10*time.Second, func() bool {
		return b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances
			WHERE parent_id = $1 AND status = 'done'`, b.schema), parent).Scan(&fast) == nil
	}, "the fast child did not finish")
	b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days' WHERE id = $1`, fast)
	n, err := b.eng.Prune(ctx, 24*time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), n, "a finished child of a parent that still waits was pruned")
	close(gate)
	r := b.waitStatus(parent, "done", 10*time.Second)
	require.JSONEq(t, `2`, string(r.Result), "the parent's join step saw both children")
	b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days'`)
	n, err = b.eng.Prune(ctx, 24*time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "once the parent finished, it and its children go")
}

// TestPruneKeepsTheChildrenOfAFailedParent: a parent whose join step failed
// can be retried, and its join then reads its children again. Its children
// are kept while it is failed, whatever their age, and go once it is pruned
// itself.
func TestPruneKeepsTheChildrenOfAFailedParent(t *testing.T) {
	t.Parallel()
	leaf := &gendurable.Job[leafArgs]{Name: "fleaf", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	var joins atomic.Int32
	m := &gendurable.Machine[fanState]{Name: "fparent", Start: "spawn", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				if joins.Add(1) == 1 {
					return gendurable.Outcome{}, errors.New("the first join fails")
				}
				return gendurable.Done(len(r.Children)), nil
			},
		}}
	b := setup(t, fastConfig("", m, leaf))
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	b.waitStatus(parent, "failed", 10*time.Second)
	b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days' WHERE parent_id = $1`, parent)
	n, err := b.eng.Prune(ctx, 24*time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), n, "a finished child of a failed parent was pruned")
	err = b.eng.Retry(ctx, parent)
	require.NoError(t, err)
	r := b.waitStatus(parent, "done", 10*time.Second)
	require.JSONEq(t, `2`, string(r.Result), "the retried join saw both children")

	// A failed parent past the retention goes, and its children after it.
	joins.Store(0)
	other := b.insert(m.New(fanState{}))
	b.waitStatus(other, "failed", 10*time.Second)
	b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days' WHERE id = $1 OR parent_id = $1`, other)
	total := int64(0)
	for range 3 {
		n, err = b.eng.Prune(ctx, 24*time.Hour, nil)
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 OR parent_id = $1`, other))
	require.Equal(t, int64(5), total, "the first parent's two old children, once it was done; the failed parent, then its two children")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1`, parent), "the done parent is not past the retention")
}

// TestPruneIsLoggedEvenWhenCutShort: Prune is an operator's mutation and
// leaves one audit line on the engine's Logger, with what it deleted — also
// when it stops part way (Ctrl-C in `gendurable prune`, a lost connection):
// the batches before committed and are gone.
func TestPruneIsLoggedEvenWhenCutShort(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("cutshort")
	var logs bytes.Buffer
	cfg := fastConfig("", job)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, cfg)
	ps := make([]gendurable.InsertParams, 2500)
	for i := range ps {
		ps[i] = job.New(orderArgs{I: i})
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() - interval '10 days'`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := b.eng.Prune(ctx, 24*time.Hour, func(int64) { cancel() }) // stop after the first batch
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(gendurable.PruneBatch), n)
	require.Equal(t, 1500, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
	require.Contains(t, logs.String(), "gendurable: pruned")
	require.Contains(t, logs.String(), fmt.Sprintf("deleted=%d", gendurable.PruneBatch))

	logs.Reset()
	n, err = b.eng.Prune(context.Background(), 24*time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1500), n)
	require.Contains(t, logs.String(), "deleted=1500")
}

// TestRetryOfAParentCancelledMidFanOutWaitsForItsChildren: a parent
// cancelled while it awaits its children leaves them running; retried
// while some still run, it must wait for them again, not run its join step
// at once with live children in Run.Children.
func TestRetryOfAParentCancelledMidFanOutWaitsForItsChildren(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	leaf := &gendurable.Job[leafArgs]{Name: "rleaf", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	m := statusParent("rparent", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})}
	})
	b := setup(t, fastConfig("", m, leaf))
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	b.waitStatus(parent, "awaiting_children", 10*time.Second)
	require.NoError(t, b.eng.Cancel(ctx, parent, "operator"))
	require.NoError(t, b.eng.Retry(ctx, parent))
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "awaiting_children", b.row(parent).Status, "the retried parent ran its join beside its live children")
	close(gate)
	r := b.waitStatus(parent, "done", 10*time.Second)
	require.JSONEq(t, `["done", "done"]`, string(r.Result))

	// Cancelled in one statement with its children (a cancel by queue), the
	// parent's count of pending children is not counted down (the statement
	// changes its row once); retried, it must not wait for children that
	// have all finished, but run its join.
	block := make(chan struct{})
	defer close(block)
	gate2 := &gendurable.Job[leafArgs]{Name: "rleaf2", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	m2 := statusParent("rparent2", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{gate2.New(leafArgs{N: 1}).With(gendurable.InsertOpts{Queue: "q2"}), gate2.New(leafArgs{N: 2}).With(gendurable.InsertOpts{Queue: "q2"})}
	})
	cfg2 := fastConfig("", m2, gate2)
	cfg2.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4}, "q2": {Concurrency: 4}}
	b2 := setup(t, cfg2)
	b2.start()
	p2 := b2.insert(m2.New(fanState{}).With(gendurable.InsertOpts{Queue: "q2"}))
	b2.waitStatus(p2, "awaiting_children", 10*time.Second)
	res, err := b2.eng.CancelMatching(ctx, gendurable.ListFilter{Queue: "q2"}, "drain q2")
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Changed, "the parent and its two children, in one batch")
	require.NoError(t, b2.eng.Retry(ctx, p2))
	r = b2.waitStatus(p2, "done", 10*time.Second)
	require.JSONEq(t, `["failed", "failed"]`, string(r.Result))
}

// TestPruneKeepsAFinishedParentWithLiveChildren: a parent cancelled alone
// (Cancel leaves its children running), at the root or under a parent that
// then finished, is the way to its live children: CancelTree walks down
// from it. Prune keeps it, whatever its age, while a child of it is live, so
// that a later CancelTree of it still stops them (a finished ancestor above
// it is not kept); once they have finished it goes, and they after it.
func TestPruneKeepsAFinishedParentWithLiveChildren(t *testing.T) {
	t.Parallel()
	var joins atomic.Int32
	nest := nestMachine(&joins)
	b := setup(t, nil, nest)
	b.start()
	ctx := context.Background()
	live := func() int {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`)
	}
	age := func() {
		b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days' WHERE finished_at IS NOT NULL`)
	}
	// prune prunes until nothing is left to prune: the children of a
	// parent pruned in one call go in the next.
	prune := func() int64 {
		total := int64(0)
		for {
			n, err := b.eng.Prune(ctx, 24*time.Hour, nil)
			require.NoError(t, err)
			if n == 0 {
				return total
			}
			total += n
		}
	}

	// A root cancelled alone, over two parked leaves.
	root := b.insert(nest.New(nestState{Max: 1, Width: 2}))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_signal'`) == 2
	}, "the leaves did not park")
	require.NoError(t, b.eng.Cancel(ctx, root, "alone"))
	age()
	require.Zero(t, prune(), "a cancelled root with live children was pruned")
	res, err := b.eng.CancelTree(ctx, root, "later")
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Changed, "%+v", res)
	require.Zero(t, live())

	// A middle member cancelled alone: its parent joins and is done, the
	// member failed, its leaf parked.
	top := b.insert(nest.New(nestState{Max: 2, Width: 1}))
	var mid int64
	eventually(t, 10*time.Second, func() bool {
		return b.pool.QueryRow(ctx, replaceSchema(`SELECT parent_id FROM {{s}}.gendurable_instances
			WHERE status = 'awaiting_signal'`, b.schema)).Scan(&mid) == nil
	}, "the leaf did not park")
	require.NoError(t, b.eng.Cancel(ctx, mid, "alone"))
	b.waitStatus(top, "done", 10*time.Second)
	age()
	require.Equal(t, int64(4), prune(), "the first tree, finished, and the done top; not the cancelled member over a live leaf")
	_, err = b.eng.CancelTree(ctx, top, "later")
	require.ErrorIs(t, err, gendurable.ErrNotFound, "a finished ancestor of the member cancelled alone may go")
	res, err = b.eng.CancelTree(ctx, mid, "later")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 2, Changed: 1, Skipped: 1, ChangedIDs: res.ChangedIDs}, res)
	require.Zero(t, live())

	age()
	require.Equal(t, int64(2), prune(), "finished, the rest goes, parents first")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
}

// TestPauseLetsAChainEndAtChainSteps: a pause stops picks, not a chain — an
// instance whose steps go on to their next with a Next without delay runs
// at most QueueConfig.ChainSteps more steps in the worker that holds it,
// then goes back to the queue, where it waits while the queue is paused.
func TestPauseLetsAChainEndAtChainSteps(t *testing.T) {
	t.Parallel()
	const chain = 3
	var mu sync.Mutex
	var starts []time.Time
	m := &gendurable.Machine[orderArgs]{Name: "pausechain", Start: "s", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"s": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			time.Sleep(30 * time.Millisecond)
			if r.State.I >= 50 {
				return gendurable.Done(nil), nil
			}
			s := r.State
			s.I++
			return r.Next("s", s), nil
		}}}
	cfg := fastConfig("", m)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, ChainSteps: chain, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(orderArgs{}))
	eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(starts) >= 2 }, "the chain never ran")
	require.NoError(t, b.eng.Pause(context.Background(), "default"))
	paused := time.Now()
	time.Sleep(time.Second)
	mu.Lock()
	after := 0
	for _, s := range starts {
		if s.After(paused) {
			after++
		}
	}
	mu.Unlock()
	t.Logf("%d steps started after the pause", after)
	require.LessOrEqual(t, after, chain, "more steps started after the pause than one chain's")
	require.Equal(t, "runnable", b.row(id).Status, "the instance went back to the paused queue")
}

// TestCallsOnOneInstanceRefuseNonPositiveIDs: an id no instance can have
// (ids are positive) is ErrInvalidInput before any SQL runs — as RetryMany,
// CancelMany and CancelTree already did — and still ErrNotFound for callers
// that test for that. Before, Instance, Describe, WaitReason, WaitResult,
// Retry, Cancel, RunNow and Signal sent it to the database (ErrNotFound
// after a round trip). The pool here has nothing listening: a call that
// reached for a connection would fail with a connection error.
func TestCallsOnOneInstanceRefuseNonPositiveIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, err := gendurable.New(unreachablePool(t), &gendurable.Config{})
	require.NoError(t, err)
	for _, id := range []int64{0, -1, math.MinInt64} {
		for name, call := range map[string]func() error{
			"Instance":   func() error { _, err := eng.Instance(ctx, id); return err },
			"Describe":   func() error { _, err := eng.Describe(ctx, id); return err },
			"WaitReason": func() error { _, err := eng.WaitReason(ctx, id); return err },
			"WaitResult": func() error { _, err := gendurable.WaitResult[int](ctx, eng, id); return err },
			"Retry":      func() error { return eng.Retry(ctx, id) },
			"Cancel":     func() error { return eng.Cancel(ctx, id, "") },
			"RunNow":     func() error { return eng.RunNow(ctx, id) },
			"Signal":     func() error { _, err := eng.Signal(ctx, id, "go", nil, nil); return err },
			"SignalDedup": func() error {
				_, err := eng.Signal(ctx, id, "go", 1, &gendurable.SignalOpts{DedupKey: "k"})
				return err
			},
		} {
			err := call()
			require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%s(%d)", name, id)
			require.ErrorIs(t, err, gendurable.ErrNotFound, "%s(%d)", name, id)
			require.ErrorContains(t, err, fmt.Sprintf("id %d is not an instance id", id), name)
		}
	}
}

// TestListRefusesANegativeCursor: a negative Before (a cursor no page
// returns), Limit or MaxScan is ErrInvalidInput before any SQL runs, from
// List and from the bulk calls that walk its pages. Before, each was taken
// as unset: a corrupted cursor restarted the walk at the newest instance,
// and CancelMatching with one acted from the top. (The pool has nothing
// listening, as in TestCallsOnOneInstanceRefuseNonPositiveIDs.)
func TestListRefusesANegativeCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, err := gendurable.New(unreachablePool(t), &gendurable.Config{})
	require.NoError(t, err)
	for _, f := range []gendurable.ListFilter{
		{Before: -1}, {Before: math.MinInt64}, {Limit: -1}, {MaxScan: -5}, {Queue: "q", Before: -7},
	} {
		_, err := eng.List(ctx, f)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
		if f.Limit != 0 {
			continue // the bulk calls set their own page size
		}
		f.Queue = "q"
		_, err = eng.CancelMatching(ctx, f, "")
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
		_, err = eng.RetryMatching(ctx, f)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
	}
}

// TestListTimesOutsidePostgreSQLAreInvalidInput: a ListFilter From or To
// whose year PostgreSQL's timestamps cannot hold is ErrInvalidInput, for
// List and the bulk calls that walk it, before any SQL; before, From in
// year 300000 came back as the database's untyped "timestamp out of range"
// (22008), and To in year -300000 listed nothing without a word.
func TestListTimesOutsidePostgreSQLAreInvalidInput(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("timed")
	b := setup(t, nil, job)
	ctx := context.Background()
	b.insert(job.New(orderArgs{I: 1}))
	for _, f := range []gendurable.ListFilter{
		{From: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{To: time.Date(-300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{From: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := b.eng.List(ctx, f)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
		require.NotContains(t, err.Error(), "SQLSTATE")
		_, err = b.eng.RetryMatching(ctx, f)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
		_, err = b.eng.CancelMatching(ctx, f, "")
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%+v", f)
	}
	// A state filter with a lone surrogate escape: refused before SQL too.
	_, err := b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`["\ud800"]`)})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	require.ErrorContains(t, err, "surrogate")
	// And one with a number numeric cannot hold (a hostile probe: the
	// database refused it once the statement ran).
	_, err = b.eng.List(ctx, gendurable.ListFilter{State: json.RawMessage(`{"a": 1e999999}`)})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	require.ErrorContains(t, err, "a number PostgreSQL cannot store (1e999999", "refused before SQL")
	// The widest years PostgreSQL holds still list.
	page, err := b.eng.List(ctx, gendurable.ListFilter{From: time.Date(-4712, 1, 1, 0, 0, 0, 0, time.UTC), To: time.Date(294275, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	require.Len(t, page.Instances, 1)
}

// TestPruneRacingTheRetryOfAChild: a parent that failed long ago, with its
// only child failed too, is old enough to prune; an operator retries the
// child while the prune runs. Whichever goes first, the parent must not be
// deleted while the child is live again (CancelTree of it reaches the child
// through it, and its next step, once retried, reads it). The prune looked
// at the children on its statement's snapshot and took the parent's lock
// later in the same statement: a retry that committed in between was not
// seen, and the prune deleted the parent of a live child. 400,000 kept rows
// before the parent in the prune's order (finished children of a live
// parent) leave the retry time to commit while the prune walks past them
// (with 100,000 and the prune without JIT, a loaded CI machine's retry
// once came after the walk);
// the second case holds the retry between its statement and its COMMIT
// while the prune runs.
func TestPruneRacingTheRetryOfAChild(t *testing.T) {
	t.Parallel()
	tr := &pauseTracer{}
	b := setupTraced(t, tr, nil)
	ctx := context.Background()
	keeper := b.seedRow(`status, eligible_at, fanout`, `'runnable', now() + interval '1 hour', 1`)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at, parent_id, parent_fanout)
		SELECT 'm', 'a', 'done', now() - interval '20 days', $1, 1 FROM generate_series(1, 400000)`, keeper)
	b.exec(`ANALYZE {{s}}.gendurable_instances`)
	pruneActive := func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE state = 'active'
			AND strpos(query, 'SELECT i.id, i.finished_at FROM') > 0 AND strpos(query, $1) > 0`, b.schema) > 0
		// (pg_stat_activity keeps the first track_activity_query_size
		// bytes of a statement, 1 kB by default: look for its start.)
	}
	for _, held := range []bool{false, true} {
		t.Run(map[bool]string{false: "retry during the prune's walk", true: "retry held before its commit"}[held], func(t *testing.T) {
			parent := b.seedRow(`status, finished_at, fanout, children_total`, `'failed', now() - interval '10 days', 1, 1`)
			child := b.seedRow(`status, finished_at, parent_id, parent_fanout`, `'failed', now() - interval '10 days', $1, 1`, parent)
			pruned := make(chan error, 1)
			prune := func() {
				go func() {
					_, err := b.eng.Prune(ctx, 24*time.Hour, nil)
					pruned <- err
				}()
			}
			if held {
				heldc, release := tr.pauseAt(t, "THEN p.children_pending +", child)
				retried := make(chan error, 1)
				go func() { retried <- b.eng.Retry(ctx, child) }()
				<-heldc
				prune()
				require.NoError(t, <-pruned)
				release()
				require.NoError(t, <-retried)
			} else {
				prune()
				eventually(t, 10*time.Second, pruneActive, "the prune does not run")
				require.NoError(t, b.eng.Retry(ctx, child))
				require.True(t, pruneActive(), "the prune's walk ended before the retry committed: the race was not run")
				require.NoError(t, <-pruned)
			}
			require.Equal(t, "runnable", b.row(child).Status)
			require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1`, parent),
				"the prune deleted the parent of live child %d", child)
			// Finished again, the child and then its parent go.
			_, err := b.eng.CancelMany(ctx, []int64{child}, "finish")
			require.NoError(t, err)
			b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '10 days' WHERE id = ANY ($1)`, []int64{parent, child})
			for range 2 { // the parent, then its child (a prune takes a child once its parent is gone)
				_, err = b.eng.Prune(ctx, 24*time.Hour, nil)
				require.NoError(t, err)
			}
			require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = ANY ($1)`, []int64{parent, child}))
		})
	}
}

// TestCancelDeadlockedWithARetryManyIsRetried: a Cancel of a live child
// locks the child, then its parent (to count itself down); a RetryMany that
// retries the parent and a failed grandchild locks its rows and their
// parents in id order — the parent, then the child (the grandchild's
// parent). Met half way, the two wait for each other, and PostgreSQL ends
// one of them with a deadlock (SQLSTATE 40P01): the one that began to wait
// first, here the Cancel. A bulk call ran its statement again after a
// deadlock; a Cancel returned the error to the operator. A transaction
// holding a row that the RetryMany locks between the parent and the child
// lines them up: the RetryMany holds the parent and waits, the Cancel takes
// the child and waits for the parent, and the holder lets go.
func TestCancelDeadlockedWithARetryManyIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	parent := b.seedRow(`status, finished_at, fanout, children_total, children_pending`, `'failed', now(), 1, 1, 1`)
	between := b.seedRow(`status, finished_at`, `'failed', now()`)
	child := b.seedRow(`status, fanout, children_total, children_pending, parent_id, parent_fanout`,
		`'awaiting_children', 1, 1, 0, $1, 1`, parent)
	grandchild := b.seedRow(`status, finished_at, parent_id, parent_fanout`, `'failed', now(), $1, 1`, child)

	tx, holder := b.lockRows(between)
	retried := make(chan error, 1)
	var res gendurable.BulkResult
	go func() {
		var err error
		res, err = b.eng.RetryMany(ctx, []int64{parent, between, grandchild})
		retried <- err
	}()
	eventually(t, 10*time.Second, func() bool { return b.blockedBy(holder, "") > 0 }, "the retry does not wait for the row between")
	cancelled := make(chan error, 1)
	go func() { cancelled <- b.eng.Cancel(ctx, child, "operator") }()
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND strpos(query, 'cancelled') > 0 AND strpos(query, $1) > 0`, b.schema) > 0
	}, "the cancel does not wait for the parent")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-retried)
	require.NoError(t, <-cancelled, "the cancel of %d, deadlocked with the retry, failed", child)
	require.EqualValues(t, 3, res.Changed)
	require.Equal(t, "failed", b.row(child).Status)
}

// TestCancelAndRunNowRacingAFinishReportWhatTheyFound: a Cancel (or a
// RunNow) that waits for the row while another transaction finishes it — the
// step's own Done outcome, another operator's cancel — changes nothing, and
// must say what the row became. Both statements read the status they report
// on their snapshot, taken before the wait: the Cancel answered
// ErrNotCancellable "instance N is executing" for an instance that was done,
// and the RunNow answered nil — as for an instance already eligible — for
// one that had just been cancelled. A transaction holding the row lines the
// two up.
func TestCancelAndRunNowRacingAFinishReportWhatTheyFound(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	running := b.seedRow(`status, lease_expires_at, claim_token`, `'executing', now() + interval '1 minute', 7`)
	tx, holder := b.lockRows(running)
	cancelled := make(chan error, 1)
	go func() { cancelled <- b.eng.Cancel(ctx, running, "operator") }()
	eventually(t, 10*time.Second, func() bool { return b.blockedBy(holder, "") > 0 }, "the cancel does not wait for the row")
	_, err := tx.Exec(ctx, replaceSchema(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now(),
		lease_expires_at = NULL, claim_token = NULL WHERE id = $1`, b.schema), running)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	err = <-cancelled
	require.ErrorIs(t, err, gendurable.ErrNotCancellable)
	require.ErrorContains(t, err, "is done")

	delayed := b.seedRow(`status, eligible_at`, `'runnable', now() + interval '1 hour'`)
	tx, holder = b.lockRows(delayed)
	ran := make(chan error, 1)
	go func() { ran <- b.eng.RunNow(ctx, delayed) }()
	eventually(t, 10*time.Second, func() bool { return b.blockedBy(holder, "") > 0 }, "the run-now does not wait for the row")
	_, err = tx.Exec(ctx, replaceSchema(`UPDATE {{s}}.gendurable_instances SET status = 'failed', finished_at = now()
		WHERE id = $1`, b.schema), delayed)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	err = <-ran
	require.ErrorIs(t, err, gendurable.ErrNotDelayed, "the run-now of a cancelled instance reported success")
	require.ErrorContains(t, err, "is failed")
}

// TestOperatorCallsRoundTrips counts the statements an operator's call
// sends. Cancel and CancelMany sweep a second time only when their
// statement reports a signal it missed (none here), and Cancel and RunNow
// report the status their locking statement found, with no read of their
// own after it. Before, Cancel of a live instance sent 2 statements (its
// second sweep), of a finished one 2 (a status read) and so did RunNow of
// an instance that was not delayed; CancelMany sent 3 (the ids' existence,
// the cancel, the second sweep).
func TestOperatorCallsRoundTrips(t *testing.T) {
	t.Parallel()
	rec := &sqlRecorder{}
	b := setupTraced(t, rec, nil) // not started: only the calls' statements
	ctx := context.Background()
	count := func(call func()) int {
		t.Helper()
		rec.mu.Lock()
		n := len(rec.sql)
		rec.mu.Unlock()
		call()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.sql) - n
	}

	live := b.seedRow(`status, lease_expires_at, claim_token`, `'executing', now() + interval '1 minute', 7`)
	require.Equal(t, 1, count(func() { require.NoError(t, b.eng.Cancel(ctx, live, "operator")) }), "Cancel of a live instance")
	require.Equal(t, 1, count(func() {
		require.ErrorIs(t, b.eng.Cancel(ctx, live, "operator"), gendurable.ErrNotCancellable)
	}), "Cancel of a finished instance")
	require.Equal(t, 1, count(func() {
		require.ErrorIs(t, b.eng.Cancel(ctx, live+1000, "operator"), gendurable.ErrNotFound)
	}), "Cancel of no instance")

	signalled := b.seedRow(`status`, `'runnable'`)
	_, err := b.eng.Signal(ctx, signalled, "note", nil, nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(func() { require.NoError(t, b.eng.Cancel(ctx, signalled, "operator")) }),
		"Cancel of an instance with a signal in its snapshot")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, signalled))

	var ids []int64
	for range 3 {
		id := b.seedRow(`status`, `'runnable'`)
		_, err := b.eng.Signal(ctx, id, "note", nil, nil)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.Equal(t, 2, count(func() {
		res, err := b.eng.CancelMany(ctx, ids, "operator")
		require.NoError(t, err)
		require.EqualValues(t, 3, res.Changed)
	}), "CancelMany: the ids' existence and the cancel")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = ANY ($1) AND consumed_at IS NULL`, ids))

	delayed := b.seedRow(`status, eligible_at`, `'runnable', now() + interval '1 hour'`)
	require.Equal(t, 1, count(func() { require.NoError(t, b.eng.RunNow(ctx, delayed)) }), "RunNow of a delayed instance")
	running := b.seedRow(`status, lease_expires_at, claim_token`, `'executing', now() + interval '1 minute', 8`)
	require.Equal(t, 1, count(func() {
		require.ErrorIs(t, b.eng.RunNow(ctx, running), gendurable.ErrNotDelayed)
	}), "RunNow of an executing instance")
	require.Equal(t, 1, count(func() { require.NoError(t, b.eng.RunNow(ctx, delayed)) }), "RunNow of an eligible instance")
}

// TestDescribeSaysItsListsWereCut: Describe lists the first 500 children
// and the newest 100 signals, and says when the instance has more; show
// prints that it has (it printed 500 child lines of 600 with no word).
func TestDescribeSaysItsListsWereCut(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "cut", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, nil, job)
	ctx := context.Background()
	parent := b.insert(job.New(orderArgs{}))
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, parent_id, parent_fanout) SELECT 'cut', 'perform', $1, 0 FROM generate_series(1, 501)`, parent)
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) SELECT $1, 'n' FROM generate_series(1, 101)`, parent)
	d, err := b.eng.Describe(ctx, parent)
	require.NoError(t, err)
	require.Len(t, d.Children, 500)
	require.Len(t, d.Signals, 100)
	require.True(t, d.MoreChildren)
	require.True(t, d.MoreSignals)

	other := b.insert(job.New(orderArgs{I: 1}))
	d, err = b.eng.Describe(ctx, other)
	require.NoError(t, err)
	require.False(t, d.MoreChildren)
	require.False(t, d.MoreSignals)
}

// TestDescribeWithLeavesOutLongValues: DescribeWith's ValueBytes leaves
// out each signal payload and child result longer than it (not read: nil,
// with its length) and keeps shorter ones; Describe reads them whole. A
// hostile probe's signals of 256 KB and children's 1 MB results made the
// dashboard's page of one instance as large as all of them together, built
// in memory per request.
func TestDescribeWithLeavesOutLongValues(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "long", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, nil, job)
	ctx := context.Background()
	parent := b.insert(job.New(orderArgs{}))
	long := `{"x": "` + strings.Repeat("a", 10000) + `"}`
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, parent_id, parent_fanout, result)
		VALUES ('long', 'perform', $1, 0, $2::jsonb), ('long', 'perform', $1, 0, '{"short": 1}')`, parent, long)
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name, payload) VALUES ($1, 'big', $2::jsonb), ($1, 'small', '[1]'), ($1, 'none', NULL)`, parent, long)

	d, err := b.eng.DescribeWith(ctx, parent, gendurable.DescribeOptions{ValueBytes: 4096})
	require.NoError(t, err)
	require.Len(t, d.Signals, 3)
	for _, s := range d.Signals {
		switch s.Name {
		case "big":
			require.Nil(t, s.Payload)
			require.Equal(t, len(`{"x": "`)+10000+len(`"}`), s.PayloadLeftOut)
		case "small":
			require.JSONEq(t, `[1]`, string(s.Payload))
			require.Zero(t, s.PayloadLeftOut)
		case "none":
			require.Nil(t, s.Payload)
			require.Zero(t, s.PayloadLeftOut)
		}
	}
	require.Len(t, d.Children, 2)
	require.Nil(t, d.Children[0].Result)
	require.Greater(t, d.Children[0].ResultLeftOut, 10000)
	require.JSONEq(t, `{"short": 1}`, string(d.Children[1].Result))
	require.Zero(t, d.Children[1].ResultLeftOut)

	whole, err := b.eng.Describe(ctx, parent)
	require.NoError(t, err)
	require.Greater(t, len(whole.Children[0].Result), 10000)
	for _, s := range whole.Signals {
		require.Zero(t, s.PayloadLeftOut)
		if s.Name == "big" {
			require.Greater(t, len(s.Payload), 10000)
		}
	}
	_, err = b.eng.DescribeWith(ctx, parent, gendurable.DescribeOptions{ValueBytes: -1})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
}

// afterStatement runs then, once, after the first statement whose SQL
// holds marker ends: a change committed between two statements of a call.
type afterStatement struct {
	marker string
	then   func()
	armed  atomic.Bool
}

func (a *afterStatement) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, a.marker) {
		return context.WithValue(ctx, a, true)
	}
	return ctx
}

func (a *afterStatement) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(a) != nil && a.armed.CompareAndSwap(true, false) {
		a.then()
	}
}

// TestDescribeReadsOneMoment: an instance that finishes between Describe's
// statements (here, right after its row was read) is described as it was
// when the row was read — its wait agrees with its status. Describe read
// each part on its own statement: a newcomer's `show` printed "status
// executing at step ship" with "waiting: awaiting children: 0 of 1 done".
func TestDescribeReadsOneMoment(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "describemoment", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	id := b.insert(job.New(orderArgs{}))
	tracer := &afterStatement{marker: "unique_guard IS NOT NULL", then: func() {
		_, err := b.pool.Exec(context.Background(), replaceSchema(`UPDATE {{s}}.gendurable_instances
			SET status = 'failed', finished_at = now() WHERE id = $1`, b.schema), id)
		require.NoError(t, err)
	}}
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{job}, Logger: testLogger(t)})
	require.NoError(t, err)
	tracer.armed.Store(true)
	d, err := eng.Describe(context.Background(), id)
	require.NoError(t, err)
	require.False(t, tracer.armed.Load(), "the change ran between the statements")
	require.Equal(t, gendurable.StatusRunnable, d.Status)
	require.Equal(t, gendurable.StatusRunnable, d.Wait.Status, "the wait as of the same moment: %+v", d.Wait)
	d, err = eng.Describe(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusFailed, d.Status, "the change is seen by the next call")
}

// TestPruneDeletesFullRateBuckets: the pruner deletes a rated key's token
// bucket once it has been full for a minute, or for the engine's lease if
// longer (the pick reads a missing bucket as a full one, as of its
// statement's start), keeps one still refilling and those no rated policy
// of the engine covers — through Engine.Prune and through the pruner's
// loop.
func TestPruneDeletesFullRateBuckets(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[spanArgs]{Name: "rated-pruned", Perform: func(context.Context, *gendurable.Run[spanArgs]) error { return nil }}
	cfg := fastConfig("", job)
	cfg.KeyPolicies = []gendurable.KeyPolicy{{Prefix: "paced:", Limit: 1, Rate: 1, Per: 3 * time.Second, Burst: 1},
		{Prefix: "plain:", Limit: 2}}
	cfg.Retention, cfg.PruneInterval = time.Hour, 100*time.Millisecond
	b := setup(t, cfg)
	ctx := context.Background()
	b.exec(`INSERT INTO {{s}}.gendurable_key_buckets (key, tokens, refilled_at) VALUES
		('paced:full', 1, now() - interval '3 minutes'), ('paced:ninety', 1, now() - interval '90 seconds'),
		('paced:spent', 0, now()), ('plain:a', 0, now() - interval '1 day'), ('other', 0, now() - interval '1 day')`)
	left := func() []string {
		rows, err := b.pool.Query(ctx, strings.ReplaceAll(`SELECT key FROM {{s}}.gendurable_key_buckets ORDER BY key`, "{{s}}", `"`+b.schema+`"`))
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	// An engine whose picks may run two minutes (its lease) keeps a bucket
	// full for only 90 s: a pick begun before it was full may still read it.
	long := fastConfig("", job)
	long.KeyPolicies, long.LeaseDuration = cfg.KeyPolicies, 2*time.Minute
	_, err := bundleOn(t, b.pool, b.schema, long).eng.Prune(ctx, time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"other", "paced:ninety", "paced:spent", "plain:a"}, left())
	_, err = b.eng.Prune(ctx, time.Hour, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"other", "paced:spent", "plain:a"}, left())

	// The loop: a step of a rated key spends its bucket's token; the bucket
	// stays while it refills, and goes once it has been full for a minute
	// (its time set back here rather than waited for).
	b.start()
	id := b.insert(job.New(spanArgs{}).With(gendurable.InsertOpts{PartitionKey: "paced:b"}))
	b.waitStatus(id, "done", 10*time.Second)
	time.Sleep(500 * time.Millisecond) // a few sweeps
	require.Equal(t, []string{"other", "paced:b", "paced:spent", "plain:a"}, left(), "refilling buckets stay")
	b.exec(`UPDATE {{s}}.gendurable_key_buckets SET refilled_at = refilled_at - interval '64 seconds' WHERE key LIKE 'paced:%'`)
	require.Eventually(t, func() bool { return slices.Equal(left(), []string{"other", "plain:a"}) },
		15*time.Second, 50*time.Millisecond, "full buckets are pruned by the loop")
}

// TestANameStoredBeforeTheInvisibleRuleCanStillBeManaged: a queue whose
// name holds a character names have refused since (U+3164, a Hangul
// filler), stored by an older version, can still be listed by, paused,
// resumed and (once empty) removed by an operator — what exists stays
// manageable (a review). A pause that would create such a queue is refused.
func TestANameStoredBeforeTheInvisibleRuleCanStillBeManaged(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	old := "default\u3164"
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step) VALUES ('legacy', $1, 'start')`, old)
	page, err := b.eng.List(t.Context(), gendurable.ListFilter{Queue: old})
	require.NoError(t, err)
	require.Len(t, page.Instances, 1)
	require.NoError(t, b.eng.Pause(t.Context(), old))
	require.NoError(t, b.eng.Resume(t.Context(), old))
	b.exec(`DELETE FROM {{s}}.gendurable_instances`)
	require.NoError(t, b.eng.RemoveQueue(t.Context(), old))

	err = b.eng.SetPaused(t.Context(), "pay\u3164", true, &gendurable.QueueOpts{Create: true})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	require.ErrorContains(t, err, "invisible character U+3164")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues WHERE name = $1`, "pay\u3164"))
}
