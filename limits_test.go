package gendurable_test

import (
	"context"
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
