package gendurable_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ok := &gendurable.Job[orderArgs]{Name: "ok", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	okV1Again := &gendurable.Job[orderArgs]{Name: "ok", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	cases := []struct {
		name string
		cfg  gendurable.Config
		want string
	}{
		{"heartbeat too slow for lease", gendurable.Config{LeaseDuration: time.Second, HeartbeatInterval: time.Second}, "HeartbeatInterval × 3"},
		{"negative lease", gendurable.Config{LeaseDuration: -time.Second}, "negative"},
		{"bad schema", gendurable.Config{Schema: `x"; DROP TABLE y; --`}, "invalid schema name"},
		{"schema too long", gendurable.Config{Schema: strings.Repeat("s", 64)}, "invalid schema name"},
		{"nil machine", gendurable.Config{Machines: []gendurable.Definition{nil}}, "nil entry"},
		{"duplicate registration", gendurable.Config{Machines: []gendurable.Definition{ok, okV1Again}}, "registered twice"},
		{"no steps", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{Name: "m", Start: "a"}}}, "declares no Steps"},
		{"unnamed", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{Start: "a"}}}, `machine Name "" is empty`},
		{"start not a step", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{
			Name: "m", Start: "zzz",
			Steps: map[string]gendurable.StepFunc[orderArgs]{"a": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			}},
		}}}, `Start step "zzz" is not one of its Steps [a]`},
		{"job without perform", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j"}}}, "no Perform"},
		{"negative concurrency", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: -1}}}, "negative Concurrency"},
		{"min demand too big", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 2, Prefetch: -1, MinDemand: 3}}}, "MinDemand 3"},
		{"poll above max", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {PollInterval: time.Minute, MaxPollInterval: time.Second}}}, "PollInterval"},
		{"empty queue name", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"": {}}}, "queue name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			_, err := gendurable.New(pool, &cfg)
			require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := gendurable.New(nil, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	_, err = gendurable.New(pool, nil)
	require.NoError(t, err, "a nil config is an insert-only engine with defaults")
}

func TestStartRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	err = eng.Start(context.Background())
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
	require.ErrorContains(t, err, "run migrate.Up")
}

type weirdState struct {
	Name string         `json:"name"`
	Any  map[string]any `json:"any,omitempty"`
}

func TestInsertRejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[weirdState]{Name: "w", Perform: func(context.Context, *gendurable.Run[weirdState]) error { return nil }}
	unregistered := &gendurable.Job[weirdState]{Name: "ghost", Perform: func(context.Context, *gendurable.Run[weirdState]) error { return nil }}
	b := setup(t, nil, job)
	cfg := b.eng.Config()
	cfg.MaxStateBytes = 1000
	eng, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	ctx := context.Background()

	cases := []struct {
		name string
		p    gendurable.InsertParams
		is   error
	}{
		{"unregistered machine", unregistered.New(weirdState{}), gendurable.ErrUnknownMachine},
		{"zero params", gendurable.InsertParams{}, gendurable.ErrInvalidInsert},
		{"priority out of range", job.New(weirdState{}).With(gendurable.InsertOpts{Priority: 40000}), gendurable.ErrInvalidInsert},
		{"negative max attempts", job.New(weirdState{}).With(gendurable.InsertOpts{MaxAttempts: -1}), gendurable.ErrInvalidInsert},
		{"run at and run in", job.New(weirdState{}).With(gendurable.InsertOpts{RunAt: time.Now(), RunIn: time.Second}), gendurable.ErrInvalidInsert},
		{"negative run in", job.New(weirdState{}).With(gendurable.InsertOpts{RunIn: -time.Second}), gendurable.ErrInvalidInsert},
		{"oversized state", job.New(weirdState{Name: strings.Repeat("x", 2000)}), gendurable.ErrInvalidInsert},
		{"unencodable state", job.New(weirdState{Any: map[string]any{"f": func() {}}}), gendurable.ErrStateEncode},
		{"NUL in state", job.New(weirdState{Name: "a\x00b"}), gendurable.ErrInvalidInsert},
		{"oversized partition key", job.New(weirdState{}).With(gendurable.InsertOpts{PartitionKey: strings.Repeat("k", 5000)}), gendurable.ErrInvalidInsert},
	}
	for _, tc := range cases {
		_, err := eng.Insert(ctx, tc.p)
		require.ErrorIs(t, err, tc.is, tc.name)
		// In a batch, one bad row rejects the whole statement.
		_, err = eng.InsertMany(ctx, []gendurable.InsertParams{job.New(weirdState{Name: "fine"}), tc.p})
		require.ErrorIs(t, err, tc.is, tc.name)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing was written")

	// Invalid UTF-8 is replaced by encoding/json, not rejected: it round-trips as U+FFFD.
	res, err := eng.Insert(ctx, job.New(weirdState{Name: "bad\xffutf8"}))
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"bad\ufffdutf8"}`, string(b.row(res.ID).State))
}

func TestOutcomeTheDatabaseRejectsStopsTheInstance(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "nul", Start: "a",
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return r.Next("a", weirdState{Name: "has\x00nul"}), nil // jsonb cannot store \u0000
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "outcome_rejected", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "outcome rejected by the database")
}

func TestStepErrorTextIsSanitized(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "ugly", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, &uglyErr{}
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	msg := r.Errors[0]["error"].(string)
	require.NotContains(t, msg, "\x00")
	require.Less(t, len(msg), 5000, "bounded")
	require.True(t, strings.HasPrefix(msg, "nul\ufffd"), msg)
}

type uglyErr struct{}

func (*uglyErr) Error() string { return "nul\x00\xff" + strings.Repeat("é", 10000) }

// bombState panics when encoded with Boom set, like a buggy MarshalJSON.
type bombState struct{ Boom bool }

func (b bombState) MarshalJSON() ([]byte, error) {
	if b.Boom {
		panic("encoder bug")
	}
	return []byte(`{"Boom":false}`), nil
}

func TestPanicsInUserJSONAndHooksDoNotKillTheWorker(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[bombState]{
		Name: "bomb", Start: "a", MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[bombState]{
			"a": func(ctx context.Context, r *gendurable.Run[bombState]) (gendurable.Outcome, error) {
				return r.Next("a", bombState{Boom: true}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(context.Context, gendurable.Event) { panic("hook bug") })}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(bombState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Len(t, r.Errors, 2)
	require.Equal(t, "panic", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "panic: encoder bug")
}

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

// TestOutcomeOverTheDatabaseLimitStopsOnlyItself: with the depth check off,
// an outcome PostgreSQL cannot parse ("stack depth limit exceeded") must
// stop its own instance at once — not be retried until the lease runs out,
// taking the outcomes group-committed with it along.
func TestOutcomeOverTheDatabaseLimitStopsOnlyItself(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[int64]int{}
	bystander := &gendurable.Job[deepState]{Name: "bystander", Perform: func(ctx context.Context, r *gendurable.Run[deepState]) error {
		mu.Lock()
		runs[r.ID]++
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return nil
	}}
	deep := &gendurable.Machine[deepState]{
		Name: "deep_outcome", Start: "a",
		Steps: map[string]gendurable.StepFunc[deepState]{
			"a": func(ctx context.Context, r *gendurable.Run[deepState]) (gendurable.Outcome, error) {
				time.Sleep(5 * time.Millisecond)
				return r.Next("a", deepState{V: fzNested(30000)}), nil
			},
		},
	}
	cfg := fastConfig("", bystander, deep)
	cfg.MaxJSONDepth = -1
	cfg.CommitConcurrency = 1 // outcomes that finish meanwhile share the next statement
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 16, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	var ps []gendurable.InsertParams
	for i := range 200 {
		ps = append(ps, bystander.New(deepState{}))
		if i%50 == 25 {
			ps = append(ps, deep.New(deepState{}))
		}
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	b.start()
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`) == 0
	}, "every instance finished well within one lease")
	require.Equal(t, 200, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bystander' AND status = 'done'`))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'deep_outcome' AND status = 'failed'
		AND errors->0->>'kind' = 'outcome_rejected' AND errors->0->>'error' LIKE '%stack depth%'`))
	mu.Lock()
	defer mu.Unlock()
	for id, n := range runs {
		require.Equal(t, 1, n, "bystander %d ran %d times", id, n)
	}
}
