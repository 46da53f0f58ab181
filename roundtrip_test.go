package gendurable_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

type counterState struct {
	N int `json:"n"`
}

// fsm3 is a three-step machine: a → b → c → done.
func fsm3() *gendurable.Machine[counterState] {
	next := func(step string) gendurable.StepFunc[counterState] {
		return func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
			return r.Next(step, counterState{N: r.State.N + 1}), nil
		}
	}
	return &gendurable.Machine[counterState]{
		Name: "fsm3", Start: "a",
		Steps: map[string]gendurable.StepFunc[counterState]{
			"a": next("b"),
			"b": next("c"),
			"c": func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
				return gendurable.Done(counterState{N: r.State.N + 1}), nil
			},
		},
	}
}

// TestStatementsPerStep counts the database statements the engine issues per
// step (pgx tracer) while working a backlog of three-step machines at
// concurrency 50: outcomes of concurrent steps share a statement (group
// commit), a Next continues without a pick, and a pick claims a batch.
func TestStatementsPerStep(t *testing.T) {
	t.Parallel()
	counter := &dbtest.Counter{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: counter, MaxConns: 20})
	m := fsm3()
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: schema, Machines: []gendurable.Definition{m}, Logger: testLogger(t),
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 50, PollInterval: 50 * time.Millisecond}},
	})
	require.NoError(t, err)
	ctx := context.Background()
	const instances = 1000
	ps := make([]gendurable.InsertParams, instances)
	for i := range ps {
		ps[i] = m.New(counterState{})
	}
	counter.Reset()
	_, err = eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.Count(), "insert-many is one statement")

	var doneCount int
	counter.Reset()
	require.NoError(t, eng.Start(ctx))
	start := time.Now()
	for {
		require.NoError(t, pool.QueryRow(ctx, "-- untraced\nSELECT count(*) FROM "+schema+
			".gendurable_instances WHERE status = 'done'").Scan(&doneCount))
		if doneCount == instances {
			break
		}
		require.Less(t, time.Since(start), 60*time.Second, "instances did not finish")
		time.Sleep(20 * time.Millisecond)
	}
	statements := counter.Count() - 1 // the schema version check at Start
	require.NoError(t, eng.Stop(ctx))
	steps := 3 * instances
	perStep := float64(statements) / float64(steps)
	t.Logf("%d statements for %d steps: %.2f statements per step", statements, steps, perStep)
	// Group commit shares one outcome statement among concurrent steps, and a
	// Next continues in the same worker without a pick.
	require.LessOrEqual(t, perStep, 0.5, "round trips per step at concurrency 50")
}

// claimCounter sums the rows claimed by picks.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) OnEvent(_ context.Context, ev gendurable.Event) {
	if p, ok := ev.(*gendurable.PickEvent); ok {
		c.n.Add(int64(p.Count))
	}
}

// TestNextChainsWithoutRepickingUpToChainSteps: a five-step machine with
// ChainSteps 2 runs three steps per claim, so it is claimed twice.
func TestNextChainsWithoutRepickingUpToChainSteps(t *testing.T) {
	t.Parallel()
	step := func(next string) gendurable.StepFunc[counterState] {
		return func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
			if next == "" {
				return gendurable.Done(r.State), nil
			}
			return r.Next(next, counterState{N: r.State.N + 1}), nil
		}
	}
	m := &gendurable.Machine[counterState]{Name: "five", Start: "s1", Steps: map[string]gendurable.StepFunc[counterState]{
		"s1": step("s2"), "s2": step("s3"), "s3": step("s4"), "s4": step("s5"), "s5": step(""),
	}}
	claims := &claimCounter{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{claims}
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {ChainSteps: 2, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(counterState{}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"n":4}`, string(r.Result))
	require.Equal(t, int64(2), claims.n.Load(), "claimed twice: steps 1-3, then 4-5")
}

// sqlRecorder is a pgx tracer that keeps the text of every statement.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sql = append(r.sql, strings.TrimSpace(d.SQL))
	r.mu.Unlock()
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestClaimBringsInboxAndChildren: a step after an await, a step of a
// machine that reads its inbox (chained after a Next that consumed a
// signal), and a step after a fan-out get their signals and children from
// the statement that claimed them: the engine runs no statement but picks,
// outcomes, heartbeats, signals and inserts (docs/design.md §4).
func TestClaimBringsInboxAndChildren(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	type st struct {
		Seen []string `json:"seen"`
	}
	names := func(sigs []gendurable.Signal) []string {
		out := []string{}
		for _, s := range sigs {
			out = append(out, s.Name+"="+string(s.Payload))
		}
		return out
	}
	waiter := &gendurable.Machine[st]{
		Name: "waiter", Start: "a", Inbox: true,
		Steps: map[string]gendurable.StepFunc[st]{
			"a": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "go"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				s := st{Seen: append(names(r.Awaited), "|")}
				s.Seen = append(s.Seen, names(r.Inbox)...)
				return r.Next("c", s), nil // consumes the awaited "go"; chained to c
			},
			"c": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return gendurable.Done(st{Seen: append(append(r.State.Seen, "|"), names(r.Inbox)...)}), nil
			},
		},
	}
	rec := &sqlRecorder{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: rec})
	cfg := fastConfig(schema, parent, leaf, waiter)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: pool, schema: schema, eng: eng}
	rec.mu.Lock()
	rec.sql = nil // the schema's migration
	rec.mu.Unlock()
	b.start()
	ctx := context.Background()

	w := b.insert(waiter.New(st{}))
	b.waitStatus(w, "awaiting_signal", 5*time.Second)
	_, err = eng.Signal(ctx, w, "note", map[string]int{"n": 1}, nil)
	require.NoError(t, err)
	_, err = eng.Signal(ctx, w, "go", map[string]int{"n": 2}, nil)
	require.NoError(t, err)
	r := b.waitStatus(w, "done", 10*time.Second)
	require.JSONEq(t, `{"seen":["go={\"n\": 2}","|","note={\"n\": 1}","go={\"n\": 2}","|","note={\"n\": 1}"]}`, string(r.Result),
		"b saw go awaited and both in its inbox; c, chained after consuming go, saw only note")

	p := b.insert(parent.New(fanState{Width: 3}))
	r = b.waitStatus(p, "done", 10*time.Second)
	require.JSONEq(t, `{"width":3,"depth":0,"seen":["leaf:done","leaf:done","leaf:done"],"resumes":1,"child_sum":3}`, string(r.Result))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, sql := range rec.sql {
		known := false
		for _, prefix := range []string{"WITH locked AS", "WITH o AS", "WITH h AS", "WITH target AS", "INSERT INTO",
			"WITH expired AS", "WITH due AS", "SELECT obj_description", "SELECT set_config", "begin", "commit",
			"SELECT id, fsm, fsm_version"} {
			known = known || strings.HasPrefix(sql, prefix)
		}
		require.True(t, known, "a statement beyond the hot path: %.80q", sql)
	}
}
