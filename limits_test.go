package gendurable_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

func TestOversizedOutcomeStateIsAnInvalidOutcome(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "big", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return r.Next("a", weirdState{Name: strings.Repeat("x", 5000)}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.MaxStateBytes = 1000
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Contains(t, r.Errors[0]["error"], "over Config.MaxStateBytes 1000")
}

// deepState holds any value; with fzNested it nests as deep as asked.
type deepState struct {
	V any `json:"v"`
}

func TestDeeplyNestedJSONIsATypedErrorBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[deepState]{Name: "deep", Perform: func(context.Context, *gendurable.Run[deepState]) error { return nil }}
	m := &gendurable.Machine[deepState]{
		Name: "deepen", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[deepState]{
			"a": func(ctx context.Context, r *gendurable.Run[deepState]) (gendurable.Outcome, error) {
				return r.Next("a", deepState{V: fzNested(5000)}), nil
			},
		},
	}
	b := setup(t, nil, job, m)
	ctx := context.Background()

	// The default limit (1000 levels; the state wrapper is one of them).
	_, err := b.eng.Insert(ctx, job.New(deepState{V: fzNested(999)}))
	require.NoError(t, err, "999 nested arrays inside the state object: 1000 levels")
	_, err = b.eng.Insert(ctx, job.New(deepState{V: fzNested(1000)}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert)
	require.ErrorContains(t, err, "deeper than Config.MaxJSONDepth 1000")
	live := b.insert(job.New(deepState{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	_, err = b.eng.Signal(ctx, live, "s", fzNested(1001), nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	require.ErrorContains(t, err, "MaxJSONDepth")

	// With the check off, PostgreSQL's own limit ("stack depth limit
	// exceeded", class 54) still comes back as the typed error.
	cfg := b.eng.Config()
	cfg.MaxJSONDepth = -1
	unchecked, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	_, err = unchecked.Insert(ctx, job.New(deepState{V: fzNested(30000)}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert)
	require.ErrorContains(t, err, "stack depth")
	_, err = unchecked.Signal(ctx, live, "s", fzNested(30000), nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	require.Equal(t, 2, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "rejected inserts wrote nothing")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "rejected signals wrote nothing")

	// An outcome nesting too deep is an invalid outcome, seen by Handle.
	b.start()
	id := b.insert(m.New(deepState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Contains(t, r.Errors[0]["error"], "deeper than Config.MaxJSONDepth 1000")
}

// TestNumberBombsAreRefusedBeforeSQL: jsonb stores numbers as numeric and
// writes them out in full when read, so a state of 72 bytes holding eight
// numbers 1e131071 reads back as 1 MiB, and one of 90 KB as 1.3 GB — past
// PostgreSQL's 1 GB limit: every read of it failed with "out of memory",
// the pick of its queue included, and no other instance of the queue ran
// again. Such a state, result or payload is now measured as stored against
// MaxStateBytes / MaxSignalBytes, and a number numeric cannot hold at all
// (1e131072) is refused, before any SQL: for an insert ErrInvalidInsert,
// a signal ErrInvalidSignal, and a step's outcome ErrInvalidOutcome (the
// instance fails; its queue goes on).
func TestNumberBombsAreRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	type bombState struct {
		N    json.RawMessage `json:"n,omitempty"`
		Bomb bool            `json:"bomb,omitempty"`
	}
	bomb := json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("1e131071,", 8), ",") + "]")
	job := &gendurable.Job[bombState]{Name: "bombs", MaxAttempts: 1, Perform: func(context.Context, *gendurable.Run[bombState]) error { return nil }}
	m := &gendurable.Machine[bombState]{
		Name: "bomber", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[bombState]{
			"a": func(ctx context.Context, r *gendurable.Run[bombState]) (gendurable.Outcome, error) {
				if r.State.Bomb {
					return r.Next("b", bombState{N: bomb}), nil
				}
				return r.Next("b", r.State), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[bombState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, job, m)
	ctx := context.Background()
	for name, n := range map[string]json.RawMessage{
		"1 MiB as stored": bomb,
		"not storable":    json.RawMessage(`[1e131072]`),
		"too small":       json.RawMessage(`{"x": 1e-16384}`),
	} {
		_, err := b.eng.Insert(ctx, job.New(bombState{N: n}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, name)
		require.NotContains(t, err.Error(), "SQLSTATE", name)
	}
	live := b.insert(job.New(bombState{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	for _, n := range []json.RawMessage{json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("1e131071,", 2), ",") + "]"), json.RawMessage(`1e131072`)} {
		_, err := b.eng.Signal(ctx, live, "s", n, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "%s", n)
		require.NotContains(t, err.Error(), "SQLSTATE")
	}
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "no bomb was inserted")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`))

	// Large numbers that are storable and small as stored still go in.
	_, err := b.eng.Insert(ctx, job.New(bombState{N: json.RawMessage(`[1e300, 1.7976931348623157e308, 5e-324, 1e1000]`)}))
	require.NoError(t, err)

	// A step returning a bomb state: an invalid outcome; the queue works on.
	b.start()
	bad := b.insert(m.New(bombState{Bomb: true}))
	good := b.insert(m.New(bombState{}))
	r := b.waitStatus(bad, "failed", 10*time.Second)
	require.Contains(t, r.Errors[0]["error"], "invalid outcome")
	require.Contains(t, r.Errors[0]["error"], "as PostgreSQL stores")
	b.waitStatus(good, "done", 10*time.Second)
}
