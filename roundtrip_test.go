package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
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
