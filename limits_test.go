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
		"zero, exponent":  json.RawMessage(`[0e1073741823]`), // numeric_in refuses the exponent (a probe)
	} {
		_, err := b.eng.Insert(ctx, job.New(bombState{N: n}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, name)
		require.NotContains(t, err.Error(), "SQLSTATE", name)
	}
	live := b.insert(job.New(bombState{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	for _, n := range []json.RawMessage{json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("1e131071,", 2), ",") + "]"), json.RawMessage(`1e131072`), json.RawMessage(`{"a": 0e-1073741823}`)} {
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
	require.Contains(t, r.Errors[0]["error"], "as PostgreSQL writes them back")
	b.waitStatus(good, "done", 10*time.Second)
}

// TestBidiControlsAndEdgeSpacesAreRefusedInNamesAndKeys: a bidirectional
// control character (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) makes a
// name or key display in another order than it is stored: a partition key
// "acct-1<U+202E>7-tnuocca" reads as "acct-1account-7" on the dashboard and
// in the CLI's tables. Like a control character, it is refused wherever a
// name or key comes in — insert (ErrInvalidInsert), Signal and Await
// (ErrInvalidSignal; an invalid outcome), config (ErrInvalidConfig) and the
// admin API (ErrInvalidInput) — before any SQL. So is a name that starts or
// ends with white space: " pay" shows as "pay" everywhere, and the
// dashboard used to trim what it was given while the API did not, so an
// instance awaiting "pay " could not be woken from the dashboard.
func TestBidiControlsAndEdgeSpacesAreRefusedInNamesAndKeys(t *testing.T) {
	t.Parallel()
	bidi := []string{"acct-1\u202e7-tnuocca", "a\u202ab", "a\u202bb", "a\u202cb", "a\u202db", "a\u2066b", "a\u2067b",
		"a\u2068b", "a\u2069b", "a\u200eb", "a\u200fb", "a\u061cb"}
	edges := []string{" pay", "pay ", "pay\u00a0", "\u3000pay", " "}
	m := &gendurable.Machine[waitState]{
		Name: "bidiawait", Start: "park", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[waitState]{
			"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("park", r.State, "ok", append(bidi, edges...)[r.State.Rounds]), nil
			},
		},
	}
	live := awaiter(0)
	job := (&recorder{}).job("bidijob")
	b := setup(t, nil, m, live, job)
	ctx := context.Background()
	id := b.insert(live.New(waitState{}))
	for _, v := range bidi {
		_, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{PartitionKey: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "partition key %q", v)
		require.ErrorContains(t, err, "bidirectional")
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueKey: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "unique key %q", v)
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "queue %q", v)
		_, err = b.eng.Signal(ctx, id, "pay", nil, &gendurable.SignalOpts{DedupKey: v})
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "dedup key %q", v)
		_, err = b.eng.List(ctx, gendurable.ListFilter{Search: v})
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "search %q", v)
	}
	for _, v := range append(bidi, edges...) {
		_, err := b.eng.Signal(ctx, id, v, nil, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "signal name %q", v)
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "queue %q", v)
		require.ErrorIs(t, b.eng.Pause(ctx, v), gendurable.ErrInvalidInput, "pause %q", v)
		_, err = b.eng.List(ctx, gendurable.ListFilter{Step: v})
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "step filter %q", v)
		bad := &gendurable.Job[orderArgs]{Name: v, Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
		_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{bad}})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "machine name %q", v)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "nothing was sent")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing was inserted")

	// Still accepted: spaces inside a name, right-to-left text without
	// controls, other non-ASCII text.
	for _, ok := range []string{"with space", "שלום", "مرحبا", "päy ✓"} {
		_, err := b.eng.Signal(ctx, id, ok, nil, nil)
		require.NoError(t, err, "name %q", ok)
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{PartitionKey: ok}))
		require.NoError(t, err, "key %q", ok)
	}

	// Awaiting such a name is an invalid outcome: the instance fails
	// instead of parking on a name no operator can type or see.
	b.start()
	for i, v := range append(bidi, edges...) {
		aid := b.insert(m.New(waitState{Rounds: i}))
		r := b.waitStatus(aid, "failed", 10*time.Second)
		require.Contains(t, r.Errors[0]["error"], "invalid outcome", "Await %q", v)
	}
}
