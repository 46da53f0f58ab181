package gendurable_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

type tick struct {
	Slot time.Time `json:"slot"`
}

// TestPeriodicInsertsEachSlotOnceAcrossProcesses runs two engines with the
// same one-second schedule: every slot becomes exactly one instance.
func TestPeriodicInsertsEachSlotOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "tick", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	periodic := []gendurable.Periodic{{
		Name: "every-second", Schedule: "@every 1s",
		New: func(slot time.Time) gendurable.InsertParams { return job.New(tick{Slot: slot}) },
	}}
	cfg := fastConfig("", job)
	cfg.Periodic = periodic
	b := setup(t, cfg)
	other := fastConfig(b.schema, job)
	other.Periodic = periodic
	eng2, err := gendurable.New(b.pool, other)
	require.NoError(t, err)
	start := time.Now()
	b.start()
	require.NoError(t, eng2.Start(context.Background()))
	time.Sleep(3500 * time.Millisecond)
	// Stop hands back claims still in a prefetch buffer with eligible_at =
	// now() (the pick's floor must see them): such rows are due from the
	// stop on, not at their slot. The database clock at the stop tells them
	// apart from a slot inserted due at the wrong time.
	var stopping time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&stopping))
	require.NoError(t, eng2.Stop(context.Background()))
	require.NoError(t, b.eng.Stop(context.Background()))
	// Slots come once a second on the clock: the missed one at start, then
	// at most one per second the engines ran (a loaded machine oversleeps).
	ran := time.Since(start)
	rows := b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`)
	slots := b.count(`SELECT count(DISTINCT state->>'slot') FROM {{s}}.gendurable_instances`)
	t.Logf("two engines, %s of @every 1s: %d rows for %d slots", ran.Round(time.Millisecond), rows, slots)
	require.Equal(t, slots, rows, "one instance per slot")
	require.GreaterOrEqual(t, rows, 4, "the missed slot at start plus about three more")
	require.LessOrEqual(t, rows, 2+int(ran/time.Second), "more slots than seconds run")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE eligible_at <> (state->>'slot')::timestamptz AND eligible_at < $1`, stopping), "each instance is due at its slot (or, handed back at the stop, from then)")
}

// TestPeriodicRunsInAnEngineWithoutQueues: an engine that only inserts (no
// Queues) still inserts its schedules' slots, as the Periodic godoc says.
func TestPeriodicRunsInAnEngineWithoutQueues(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "tick", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	cfg := fastConfig("", job)
	cfg.Queues = nil
	cfg.Periodic = []gendurable.Periodic{{
		Name: "insert-only", Schedule: "@every 1s",
		New: func(slot time.Time) gendurable.InsertParams { return job.New(tick{Slot: slot}) },
	}}
	b := setup(t, cfg)
	b.start()
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) >= 2
	}, "an engine without queues inserted no slot")
}

func TestPeriodicMissedSlotPolicy(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "hourly", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	mk := func(skip bool) []gendurable.Periodic {
		return []gendurable.Periodic{{
			Name: "hourly", Schedule: "@hourly", SkipMissed: skip,
			New: func(slot time.Time) gendurable.InsertParams { return job.New(tick{Slot: slot}) },
		}}
	}
	cfg := fastConfig("", job)
	cfg.Periodic = mk(false)
	b := setup(t, cfg)
	// Three restarts within the hour: the slot that passed is inserted once.
	for i := 0; i < 3; i++ {
		require.NoError(t, b.eng.Start(context.Background()))
		eventually(t, 5*time.Second, func() bool {
			return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 1
		}, "missed slot not inserted")
		require.NoError(t, b.eng.Stop(context.Background()))
	}
	var slot time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), replaceSchema(`SELECT (state->>'slot')::timestamptz FROM {{s}}.gendurable_instances`, b.schema)).Scan(&slot))
	require.Equal(t, time.Now().UTC().Truncate(time.Hour), slot.UTC(), "the most recent slot, late")

	skip := fastConfig(b.schema, job)
	skip.Periodic = mk(true)
	skip.Periodic[0].Name = "hourly-skip"
	eng, err := gendurable.New(b.pool, skip)
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, eng.Stop(context.Background()))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "SkipMissed inserts nothing before the next slot")
}

func TestPeriodicValidation(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "v", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	newFn := func(time.Time) gendurable.InsertParams { return job.New(tick{}) }
	b := setup(t, nil, job)
	for _, p := range []gendurable.Periodic{
		{Name: "", Schedule: "@hourly", New: newFn},
		{Name: "x", Schedule: "61 * * * *", New: newFn},
		{Name: "x", Schedule: "@every 10ms", New: newFn},
		{Name: "x", Schedule: "@hourly"},
		// The name is in the slots' unique key: what a key cannot hold, a
		// name cannot either (else every slot's insert was refused).
		{Name: "tab\there", Schedule: "@hourly", New: newFn},
		{Name: "bad\xff", Schedule: "@hourly", New: newFn},
		{Name: "nul\x00", Schedule: "@hourly", New: newFn},
		{Name: strings.Repeat("n", 201), Schedule: "@hourly", New: newFn},
		// Accepted by the parser, but no slot within five years: a 29
		// February that is a Sunday (day of month AND day of week, as
		// "*/7" counts as "*"). It used to start and never insert anything,
		// saying nothing.
		{Name: "x", Schedule: "0 0 29 2 */7", New: newFn},
	} {
		cfg := fastConfig(b.schema, job)
		cfg.Periodic = []gendurable.Periodic{p}
		_, err := gendurable.New(b.pool, cfg)
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "%+v", p.Schedule)
	}
}

// TestPeriodicSlotWhoseInsertIsInvalidIsGivenUpAtOnce: a schedule whose New
// builds an instance the engine refuses (ErrInvalidInsert: here a priority
// out of range) cannot be mended by trying again. Its slot is given up at
// its first attempt, with one error logged, and the engine goes on with the
// schedule's next slot. It used to be retried until then — for an hourly
// schedule, every 10 s for up to an hour, a warning each time.
func TestPeriodicSlotWhoseInsertIsInvalidIsGivenUpAtOnce(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "invalid", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	var calls atomic.Int32
	cfg := fastConfig("", job)
	cfg.Periodic = []gendurable.Periodic{{
		Name: "invalid", Schedule: "@daily",
		New: func(slot time.Time) gendurable.InsertParams {
			calls.Add(1)
			return job.New(tick{Slot: slot}).With(gendurable.InsertOpts{Priority: 1 << 20})
		},
	}}
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := setup(t, cfg)
	require.NoError(t, b.eng.Start(context.Background()))
	time.Sleep(1500 * time.Millisecond) // retries would come at about 0.2, 0.6 and 1.4 s
	require.NoError(t, b.eng.Stop(context.Background()))
	require.EqualValues(t, 1, calls.Load(), "the invalid slot's insert was tried again")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "level=ERROR"), "want one error for the slot given up; logs:\n%s", out)
	require.Contains(t, out, "Priority", "the error says why; logs:\n%s", out)
	require.NotContains(t, out, "tried again", "logs:\n%s", out)
}

// panickyTick's encoding panics, as a user's MarshalJSON may.
type panickyTick struct{}

func (panickyTick) MarshalJSON() ([]byte, error) { panic("no encoding today") }

// TestPeriodicNewThatPanicsGivesItsSlotUp: a schedule's New, or the
// encoding of the state it builds, is the user's code running on the
// engine's periodic goroutine. A panic there killed the whole process (a
// step's, a hook's, a Backoff's or a MarshalJSON's in an outcome are caught);
// now the slot is given up as an instance the engine refuses is, with one
// error logged that carries the panic, and the engine runs on.
func TestPeriodicNewThatPanicsGivesItsSlotUp(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "fine", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	bad := &gendurable.Job[panickyTick]{Name: "bad", Perform: func(context.Context, *gendurable.Run[panickyTick]) error { return nil }}
	var calls atomic.Int32
	cfg := fastConfig("", job, bad)
	cfg.Periodic = []gendurable.Periodic{{
		Name: "panics", Schedule: "@daily",
		New: func(time.Time) gendurable.InsertParams {
			calls.Add(1)
			panic("New is broken")
		},
	}, {
		Name: "encoding panics", Schedule: "@daily",
		New: func(time.Time) gendurable.InsertParams { calls.Add(1); return bad.New(panickyTick{}) },
	}}
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := setup(t, cfg)
	require.NoError(t, b.eng.Start(context.Background()))
	time.Sleep(1500 * time.Millisecond) // retries would come at about 0.2, 0.6 and 1.4 s
	id := b.insert(job.New(tick{}))
	b.waitStatus(id, "done", 10*time.Second)
	require.NoError(t, b.eng.Stop(context.Background()))
	require.EqualValues(t, 2, calls.Load(), "a slot whose New panicked was tried again")
	out := logs.String()
	require.Equal(t, 2, strings.Count(out, "level=ERROR"), "want one error per slot given up; logs:\n%s", out)
	require.Contains(t, out, "New is broken", "logs:\n%s", out)
	require.Contains(t, out, "no encoding today", "logs:\n%s", out)
}

// TestPeriodicSlotKeysAreReserved: an instance inserted with a UniqueKey
// in the slots' namespace is refused (ErrInvalidInsert, nothing written):
// held by another instance, such a key made a schedule take its slot for
// run and insert nothing.
func TestPeriodicSlotKeysAreReserved(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "squat", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	b := setup(t, nil, job)
	_, err := b.eng.Insert(context.Background(), job.New(tick{}).With(gendurable.InsertOpts{
		UniqueKey: "gendurable:periodic:billing:2026-11-29T01:00:00Z", UniqueScope: gendurable.UniqueForever}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert)
	require.Contains(t, err.Error(), "reserved for Periodic slots")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
}

// TestPeriodicNewThatBlocksHoldsUpNeitherStopNorOtherSchedules: a New that
// does not return (a lookup without a deadline) held the periodic loop:
// the other schedules inserted nothing and Stop waited for it past its
// deadline (35 s for a 2 s one), then returned nil.
func TestPeriodicNewThatBlocksHoldsUpNeitherStopNorOtherSchedules(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "blocked_new", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	release := make(chan struct{})
	defer close(release)
	var hung atomic.Int32
	cfg := fastConfig("", job)
	cfg.MaintenanceTimeout = time.Second
	cfg.Periodic = []gendurable.Periodic{{
		Name: "hangs", Schedule: "@every 1s", SkipMissed: true,
		New: func(time.Time) gendurable.InsertParams { hung.Add(1); <-release; return job.New(tick{}) },
	}, {
		Name: "ok", Schedule: "@every 1s", SkipMissed: true,
		New: func(time.Time) gendurable.InsertParams { return job.New(tick{}) },
	}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	b := setup(t, cfg)
	require.NoError(t, b.eng.Start(context.Background()))
	time.Sleep(4500 * time.Millisecond)
	ok := b.count(`SELECT count(*) FROM {{s}}.gendurable_instances `) // only "ok" inserts: "hangs" never returns
	require.GreaterOrEqual(t, ok, 2, "the other schedule's slots were held up by the blocked New")
	require.EqualValues(t, 1, hung.Load(), "New called again while its first call had not returned")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_ = b.eng.Stop(ctx)
	require.Less(t, time.Since(start), 3*time.Second, "Stop waited for the blocked New past its deadline")
}

// TestAPruneKeepsEachSchedulesNewestSlot (a probe): a prune deletes a
// schedule's finished slots but its newest, whatever the retention it runs
// with. An engine started again runs the most recent slot that passed
// unless its row is there; an operator's prune with a retention shorter
// than the engine's deleted that row, and the slot ran a second time.
func TestAPruneKeepsEachSchedulesNewestSlot(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[tick]{Name: "slotted", Perform: func(context.Context, *gendurable.Run[tick]) error { return nil }}
	cfg := fastConfig("", job)
	cfg.Periodic = []gendurable.Periodic{
		{Name: "hourly", Schedule: "@hourly",
			New: func(slot time.Time) gendurable.InsertParams { return job.New(tick{Slot: slot}) }},
		{Name: "every", Schedule: "@every 1s",
			New: func(slot time.Time) gendurable.InsertParams { return job.New(tick{Slot: slot}) }},
	}
	b := setup(t, cfg)
	ctx := context.Background()
	keys := func(name string) []string {
		rows, err := b.pool.Query(ctx, replaceSchema(`SELECT convert_from(unique_key, 'UTF8') FROM {{s}}.gendurable_instances
			WHERE unique_key >= convert_to($1, 'UTF8') AND unique_key < convert_to($1 || '~', 'UTF8') ORDER BY 1`, b.schema),
			"gendurable:periodic:"+name+":")
		require.NoError(t, err)
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ks
	}
	require.NoError(t, b.eng.Start(ctx))
	eventually(t, 10*time.Second, func() bool {
		return len(keys("every")) >= 3 && len(keys("hourly")) == 1 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status <> 'done'`) == 0
	}, "the slots did not run")
	require.NoError(t, b.eng.Stop(ctx))
	hourly, every := keys("hourly"), keys("every")

	_, err := b.eng.Prune(ctx, 0, nil)
	require.NoError(t, err)
	require.Equal(t, hourly, keys("hourly"), "the hourly schedule's one slot is its newest: kept")
	require.Equal(t, every[len(every)-1:], keys("every"), "only the newest slot of the other is kept")

	// Started again within the hour: the slot that passed is not run again.
	require.NoError(t, b.eng.Start(ctx))
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, b.eng.Stop(ctx))
	require.Equal(t, hourly, keys("hourly"))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE unique_key = convert_to($1, 'UTF8')`, hourly[0]),
		"the hourly slot ran once")
}
