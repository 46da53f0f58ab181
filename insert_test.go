package gendurable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestInsertManyAndTx(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("many")
	b := setup(t, nil, job)
	ctx := context.Background()

	params := make([]gendurable.InsertParams, 100)
	for i := range params {
		params[i] = job.New(orderArgs{I: i})
	}
	res, err := b.eng.InsertMany(ctx, params)
	require.NoError(t, err)
	require.Len(t, res, 100)
	for i := 1; i < len(res); i++ {
		require.Greater(t, res[i].ID, res[i-1].ID, "ids come back in insert order")
	}
	require.Equal(t, res[42].ID, gendurabletest.RequireInserted(ctx, t, b.eng, job, &gendurabletest.InsertedOpts[orderArgs]{
		State: func(a orderArgs) bool { return a.I == 42 },
	}).ID)

	// Rolled back with the caller's transaction.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.eng.InsertManyTx(ctx, tx, []gendurable.InsertParams{job.New(orderArgs{I: 500}), job.New(orderArgs{I: 501})})
	require.NoError(t, err)
	gendurabletest.RequireInsertedTx(ctx, t, b.eng, tx, job, &gendurabletest.InsertedOpts[orderArgs]{
		State: func(a orderArgs) bool { return a.I == 501 },
	})
	require.NoError(t, tx.Rollback(ctx))
	gendurabletest.RequireNotInserted(ctx, t, b.eng, job, &gendurabletest.InsertedOpts[orderArgs]{
		State: func(a orderArgs) bool { return a.I >= 500 },
	})
	require.Equal(t, 100, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))

	// Committed with it.
	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	one, err := b.eng.InsertTx(ctx, tx, job.New(orderArgs{I: 1000}))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, one.ID, gendurabletest.RequireInserted(ctx, t, b.eng, job, &gendurabletest.InsertedOpts[orderArgs]{
		State: func(a orderArgs) bool { return a.I == 1000 },
	}).ID)

	ids := []int64{one.ID}
	for _, r := range res {
		ids = append(ids, r.ID)
	}
	for _, in := range gendurabletest.WorkUntilFinished(ctx, t, b.eng, ids...) {
		require.Equal(t, gendurable.StatusDone, in.Status, "every inserted job ran")
	}
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
		// A panic of the state's MarshalJSON reached the caller (a hostile probe).
		{"state whose MarshalJSON panics", job.New(weirdState{Any: map[string]any{"p": panicMarshaler{}}}), gendurable.ErrStateEncode},
		// And an insert's own error, as every other bad input is (an API
		// probe: ErrStateEncode alone, which code branching on
		// ErrInvalidInsert took for a database failure).
		{"unencodable state is an invalid insert", job.New(weirdState{Any: map[string]any{"f": func() {}}}), gendurable.ErrInvalidInsert},
		{"NaN state is an invalid insert", job.New(weirdState{Any: map[string]any{"n": math.NaN()}}), gendurable.ErrInvalidInsert},
		{"panicking MarshalJSON is an invalid insert", job.New(weirdState{Any: map[string]any{"p": panicMarshaler{}}}), gendurable.ErrInvalidInsert},
		{"NUL in state", job.New(weirdState{Name: "a\x00b"}), gendurable.ErrInvalidInsert},
		{"oversized partition key", job.New(weirdState{}).With(gendurable.InsertOpts{PartitionKey: strings.Repeat("k", 5000)}), gendurable.ErrInvalidInsert},
		// A key "order-7 " looked like "order-7" everywhere while being
		// another unique key; the dashboard's search (trimmed) missed it.
		{"partition key starting with a space", job.New(weirdState{}).With(gendurable.InsertOpts{PartitionKey: " tenant-1"}), gendurable.ErrInvalidInsert},
		{"unique key ending with a space", job.New(weirdState{}).With(gendurable.InsertOpts{UniqueKey: "order-7 "}), gendurable.ErrInvalidInsert},
		{"unique key ending with a no-break space", job.New(weirdState{}).With(gendurable.InsertOpts{UniqueKey: "order-7\u00a0"}), gendurable.ErrInvalidInsert},
		// "q\u200b" looks like "q" on every page (a probe).
		{"queue name with a zero-width space", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "q\u200b"}), gendurable.ErrInvalidInsert},
		{"queue name with a byte order mark", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "\ufeffq"}), gendurable.ErrInvalidInsert},
		// Passed the first list (a hostile-operator probe): other format
		// characters, a Hangul filler, a variation selector, a blank.
		{"queue name with an inhibit-digit-shapes control", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "pay\u206f"}), gendurable.ErrInvalidInsert},
		{"queue name with a Hangul filler", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "default\u3164"}), gendurable.ErrInvalidInsert},
		{"queue name with a variation selector", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "default\ufe0f"}), gendurable.ErrInvalidInsert},
		{"queue name with a musical format control", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "default\U0001d173"}), gendurable.ErrInvalidInsert},
		{"queue name with a braille blank", job.New(weirdState{}).With(gendurable.InsertOpts{Queue: "default\u2800"}), gendurable.ErrInvalidInsert},
		{"nil job", (*gendurable.Job[weirdState])(nil).New(weirdState{}), gendurable.ErrInvalidConfig},
		{"nil machine", (*gendurable.Machine[weirdState])(nil).New(weirdState{}), gendurable.ErrInvalidConfig},
		// And an insert's own error (a misuse probe: ErrInvalidConfig alone).
		{"nil job is an invalid insert", (*gendurable.Job[weirdState])(nil).New(weirdState{}), gendurable.ErrInvalidInsert},
		{"nil machine is an invalid insert", (*gendurable.Machine[weirdState])(nil).New(weirdState{}), gendurable.ErrInvalidInsert},
		{"job without Perform", (&gendurable.Job[weirdState]{Name: "noperform"}).New(weirdState{}), gendurable.ErrInvalidInsert},
		{"machine without Steps", (&gendurable.Machine[weirdState]{Name: "nosteps", Start: "a"}).New(weirdState{}), gendurable.ErrInvalidInsert},
	}
	// A second value of the registered name and version is not the
	// registered one; the error says so rather than "add it to Config.Machines".
	twin := &gendurable.Job[weirdState]{Name: "w", Perform: job.Perform}
	_, err = eng.Insert(ctx, twin.New(weirdState{}))
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
	require.ErrorContains(t, err, "another *Machine (or *Job) value")
	for _, tc := range cases {
		_, err := eng.Insert(ctx, tc.p)
		require.ErrorIs(t, err, tc.is, tc.name)
		// In a batch, one bad row rejects the whole statement.
		_, err = eng.InsertMany(ctx, []gendurable.InsertParams{job.New(weirdState{Name: "fine"}), tc.p})
		require.ErrorIs(t, err, tc.is, tc.name)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing was written")
	_, err = eng.InsertTx(ctx, nil, job.New(weirdState{}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "a nil transaction")
	_, err = eng.InsertManyTx(ctx, nil, []gendurable.InsertParams{job.New(weirdState{})})
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "a nil transaction")

	// Invalid UTF-8 is replaced by encoding/json, not rejected: it round-trips as U+FFFD.
	res, err := eng.Insert(ctx, job.New(weirdState{Name: "bad\xffutf8"}))
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"bad\ufffdutf8"}`, string(b.row(res.ID).State))
}

func TestRunAtAndRunInEligibility(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("later")
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	res, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		// Long enough that the third row's run is over well before it, even
		// on a loaded machine.
		job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{RunIn: 2 * time.Second}),
		job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{RunAt: time.Now().Add(time.Hour)}),
		job.New(orderArgs{I: 3}),
	})
	require.NoError(t, err)
	b.waitStatus(res[2].ID, "done", 5*time.Second)
	r := b.row(res[0].ID)
	require.True(t, r.Status == "runnable" || !r.Now.Before(r.EligibleAt), "RunIn not yet due: %s", r.Status)
	b.waitStatus(res[0].ID, "done", 5*time.Second)
	r = b.row(res[1].ID)
	require.Equal(t, "runnable", r.Status)
	near(t, r.Now.Add(time.Hour), r.EligibleAt, time.Minute)
}

func TestLocalInsertWakesIdleScheduler(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("wake")
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		// Polls so rarely that only the local wake-up can explain a quick pickup.
		Queues: map[string]gendurable.QueueConfig{"default": {PollInterval: time.Minute, MaxPollInterval: time.Minute}},
	}
	b := setup(t, cfg)
	b.start()
	time.Sleep(50 * time.Millisecond) // the first, empty pick has happened
	id := b.insert(job.New(orderArgs{I: 1}))
	b.waitStatus(id, "done", 5*time.Second)
}

func TestUniqueKeyDedupsAgainstLiveRowsAndWithinABatch(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("uniq")
	b := setup(t, nil, job)
	ctx := context.Background()
	opts := gendurable.InsertOpts{UniqueKey: "order-42"}

	first, err := b.eng.Insert(ctx, job.New(orderArgs{I: 1}).With(opts))
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	dup, err := b.eng.Insert(ctx, job.New(orderArgs{I: 2}).With(opts))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, first.ID, dup.ID, "a duplicate returns the live instance's id")

	res, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{UniqueKey: "a"}),
		job.New(orderArgs{I: 4}),
		job.New(orderArgs{I: 5}).With(gendurable.InsertOpts{UniqueKey: "a"}), // same batch
		job.New(orderArgs{I: 6}).With(opts),                                  // existing row
		job.New(orderArgs{I: 7}).With(gendurable.InsertOpts{UniqueKey: "b"}),
	})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.Equal(t, res[0].ID, res[2].ID)
	require.True(t, res[3].Duplicate)
	require.Equal(t, first.ID, res[3].ID)
	require.False(t, res[4].Duplicate)
	require.Equal(t, 4, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))

	// Leaving the scope (done) frees the key.
	b.start()
	b.waitStatus(first.ID, "done", 10*time.Second)
	again, err := b.eng.Insert(ctx, job.New(orderArgs{I: 8}).With(opts))
	require.NoError(t, err)
	require.False(t, again.Duplicate)
	require.NotEqual(t, first.ID, again.ID)
}

// TestUniqueByArgsAndPeriod: UniqueByArgs makes a second insert of the same
// job with the same arguments a duplicate (the key derived from the
// machine's name and the stored state), of other arguments or another job
// not; UniquePeriod holds a key within one period of the instance's run
// time — given keys, derived ones, and the machine's name alone; bad
// combinations are refused before SQL, nothing written.
func TestUniqueByArgsAndPeriod(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job, other := rec.job("by_args"), rec.job("by_args_other")
	b := setup(t, nil, job, other)
	ctx := context.Background()
	byArgs := gendurable.InsertOpts{UniqueByArgs: true}

	res, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 1}).With(byArgs),
		job.New(orderArgs{I: 1}).With(byArgs),   // same job, same arguments
		job.New(orderArgs{I: 2}).With(byArgs),   // other arguments
		other.New(orderArgs{I: 1}).With(byArgs), // another job
		job.New(orderArgs{I: 1}),                // no uniqueness asked
	})
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false, false, false},
		[]bool{res[0].Duplicate, res[1].Duplicate, res[2].Duplicate, res[3].Duplicate, res[4].Duplicate})
	require.Equal(t, res[0].ID, res[1].ID)
	in, err := b.eng.Instance(ctx, res[0].ID)
	require.NoError(t, err)
	require.Regexp(t, `^args:by_args:[0-9a-f]{64}$`, in.UniqueKey)

	// A period: one per hour of the run time, whatever the key.
	hour := time.Date(2031, 5, 6, 7, 0, 0, 0, time.UTC)
	at := func(d time.Duration, o gendurable.InsertOpts) gendurable.InsertOpts {
		o.RunAt, o.UniquePeriod = hour.Add(d), time.Hour
		return o
	}
	res, err = b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 3}).With(at(5*time.Minute, gendurable.InsertOpts{})),
		job.New(orderArgs{I: 4}).With(at(50*time.Minute, gendurable.InsertOpts{})), // same hour: the machine's one
		job.New(orderArgs{I: 5}).With(at(65*time.Minute, gendurable.InsertOpts{})), // the next hour
		job.New(orderArgs{I: 6}).With(at(10*time.Minute, gendurable.InsertOpts{UniqueKey: "k"})),
		job.New(orderArgs{I: 7}).With(at(20*time.Minute, gendurable.InsertOpts{UniqueKey: "k"})), // same key, same hour
		job.New(orderArgs{I: 8}).With(at(10*time.Minute, byArgs)),
		job.New(orderArgs{I: 8}).With(at(70*time.Minute, byArgs)), // same arguments, next hour
	})
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false, false, true, false, false},
		[]bool{res[0].Duplicate, res[1].Duplicate, res[2].Duplicate, res[3].Duplicate, res[4].Duplicate, res[5].Duplicate, res[6].Duplicate})
	in, err = b.eng.Instance(ctx, res[3].ID)
	require.NoError(t, err)
	require.Equal(t, "k@2031-05-06T07:00:00Z/1h0m0s", in.UniqueKey)
	in, err = b.eng.Instance(ctx, res[0].ID)
	require.NoError(t, err)
	require.Equal(t, "period:by_args@2031-05-06T07:00:00Z/1h0m0s", in.UniqueKey)
	// A day's period of the same start is another key; a finished instance
	// holds its period (the scope defaults to UniqueForever).
	day, err := b.eng.Insert(ctx, job.New(orderArgs{I: 10}).With(gendurable.InsertOpts{RunAt: hour, UniquePeriod: 24 * time.Hour}))
	require.NoError(t, err)
	require.False(t, day.Duplicate, "a day's period is not an hour's")
	_, err = b.pool.Exec(ctx, replaceSchema(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1`, b.schema), res[0].ID)
	require.NoError(t, err)
	again, err := b.eng.Insert(ctx, job.New(orderArgs{I: 11}).With(at(30*time.Minute, gendurable.InsertOpts{})))
	require.NoError(t, err)
	require.True(t, again.Duplicate, "the hour's finished instance still holds it")
	require.Equal(t, res[0].ID, again.ID)

	before := b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`)
	for _, o := range []gendurable.InsertOpts{
		{UniqueByArgs: true, UniqueKey: "k"},
		{UniquePeriod: time.Millisecond},
		{UniquePeriod: -time.Hour},
	} {
		_, err := b.eng.Insert(ctx, job.New(orderArgs{I: 9}).With(o))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "%+v", o)
	}
	require.Equal(t, before, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing written")
}

func TestUniqueForeverKeepsTheKeyAfterDone(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("once")
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	opts := gendurable.InsertOpts{UniqueKey: "report-2026-11", UniqueScope: gendurable.UniqueForever}
	first, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(opts))
	require.NoError(t, err)
	b.waitStatus(first.ID, "done", 10*time.Second)
	again, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(opts))
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.ID, again.ID)

	_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueKey: "x", UniqueScope: []gendurable.Status{gendurable.StatusDone}}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "a scope must hold every live status")
	_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueScope: gendurable.UniqueLive}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "a scope without a key")
}

// TestConcurrentUniqueInsertsYieldOneRow: many connections insert the same
// key at once; exactly one row exists and every caller learns its id.
func TestConcurrentUniqueInsertsYieldOneRow(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("race")
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 16})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)
	ctx := context.Background()
	const keys, callers = 20, 16
	ids := make([][]int64, keys)
	for k := range ids {
		ids[k] = make([]int64, callers)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for k := 0; k < keys; k++ {
				p := job.New(orderArgs{I: c}).With(gendurable.InsertOpts{UniqueKey: "key-" + string(rune('a'+k))})
				var res gendurable.InsertResult
				var err error
				if c%2 == 0 {
					res, err = eng.Insert(ctx, p)
				} else {
					var rs []gendurable.InsertResult
					rs, err = eng.InsertMany(ctx, []gendurable.InsertParams{p})
					if err == nil {
						res = rs[0]
					}
				}
				require.NoError(t, err)
				ids[k][c] = res.ID
			}
		}()
	}
	close(start)
	wg.Wait()
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.gendurable_instances`).Scan(&rows))
	require.Equal(t, keys, rows, "one row per key")
	for k := range ids {
		for c := range ids[k] {
			require.Equal(t, ids[k][0], ids[k][c], "every caller got the one row's id")
		}
	}
	t.Logf("%d callers × %d keys: %d rows", callers, keys, rows)
}

// TestBatchesOfOverlappingUniqueKeysInAnyOrderDoNotDeadlock: InsertMany
// calls at once whose unique keys overlap, each in its own order, all
// succeed, one row per key, every caller told the one row's id (with
// Duplicate for the keys another call inserted) and mixed unkeyed rows
// inserted and answered in their places. A probe: two such calls in
// opposite orders failed with a deadlock in 19 of 20 rounds (each waited
// for a key the other had inserted first).
func TestBatchesOfOverlappingUniqueKeysInAnyOrderDoNotDeadlock(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("crossing")
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 6})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)
	ctx := context.Background()
	const keys, callers, rounds = 200, 4, 5
	for r := range rounds {
		results := make([][]gendurable.InsertResult, callers)
		batches := make([][]gendurable.InsertParams, callers)
		keyOf := make([][]string, callers)
		for c := range callers {
			order := rand.Perm(keys)
			if c == 0 {
				slices.Sort(order)
			} else if c == 1 {
				slices.Sort(order)
				slices.Reverse(order)
			}
			for i, k := range order {
				key := fmt.Sprintf("r%d-k%03d", r, k)
				batches[c] = append(batches[c], job.New(orderArgs{I: k}).With(gendurable.InsertOpts{UniqueKey: key}))
				keyOf[c] = append(keyOf[c], key)
				if i%10 == 0 { // unkeyed rows between them
					batches[c] = append(batches[c], job.New(orderArgs{I: -1}))
					keyOf[c] = append(keyOf[c], "")
				}
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, callers)
		for c := range callers {
			wg.Go(func() { results[c], errs[c] = eng.InsertMany(ctx, batches[c]) })
		}
		wg.Wait()
		winner := map[string]int64{}
		inserted := map[string]bool{}
		for c := range callers {
			require.NoError(t, errs[c], "round %d caller %d", r, c)
			for i, res := range results[c] {
				key := keyOf[c][i]
				require.NotZero(t, res.ID)
				if key == "" {
					require.False(t, res.Duplicate)
					continue
				}
				if !res.Duplicate {
					require.False(t, inserted[key], "key %s inserted twice", key)
					inserted[key] = true
				}
				if id, ok := winner[key]; ok {
					require.Equal(t, id, res.ID, "key %s", key)
				} else {
					winner[key] = res.ID
				}
			}
		}
		var rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE unique_key IS NOT NULL AND encode(unique_key, 'escape') LIKE $1`,
			fmt.Sprintf("%%r%d-k%%", r)).Scan(&rows))
		require.Equal(t, keys, rows, "one row per key")
		require.Len(t, inserted, keys, "each key inserted by one caller")
	}
	// Each unkeyed row's id is its own row's: its state says so.
	res, err := eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 1}), job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{UniqueKey: "zz"}),
		job.New(orderArgs{I: 3}), job.New(orderArgs{I: 4}).With(gendurable.InsertOpts{UniqueKey: "aa"}), job.New(orderArgs{I: 5}),
	})
	require.NoError(t, err)
	for i, r := range res {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT (state->>'i')::int FROM "`+schema+`".gendurable_instances WHERE id = $1`, r.ID).Scan(&n))
		require.Equal(t, i+1, n, "row %d's id", i)
	}
}

func TestUniqueChildrenDedup(t *testing.T) {
	t.Parallel()
	leaf := &gendurable.Job[leafArgs]{Name: "uleaf", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	m := &gendurable.Machine[fanState]{
		Name: "ufan", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				k := gendurable.InsertOpts{UniqueKey: "shared-child", UniqueScope: gendurable.UniqueForever}
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{}).With(k), leaf.New(leafArgs{}).With(k), leaf.New(leafArgs{N: 1})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Children)), nil
			},
		},
	}
	b := setup(t, nil, m, leaf)
	b.start()
	id := b.insert(m.New(fanState{}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `2`, string(r.Result), "the duplicate child was not inserted, and the parent waited only for the two real ones")
}

// TestUniqueKeyIsValidatedLikeAPartitionKey: a unique key with a control
// character or invalid UTF-8 is ErrInvalidInsert before any SQL, as a
// partition key is: the list's search (CLI, dashboard, ListFilter.Search)
// refuses both, so such a key could never be searched for.
func TestUniqueKeyIsValidatedLikeAPartitionKey(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("uniq")
	b := setup(t, nil, job)
	ctx := context.Background()
	for _, k := range []string{"k\x00", "k\x01", "\x1b[31m", "tab\t", "del\x7f", "c1\u0085", "k\xff", "\xc3", strings.Repeat("k", 1001)} {
		_, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueKey: k}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "%q", k)
		_, err = b.eng.InsertMany(ctx, []gendurable.InsertParams{job.New(orderArgs{}), job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueKey: k})})
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "InsertMany %q", k)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing was inserted")
	for _, k := range []string{"order:7 ✓", strings.Repeat("k", 1000)} {
		r, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{UniqueKey: k}))
		require.NoError(t, err, "%q", k)
		page, err := b.eng.List(ctx, gendurable.ListFilter{Search: k})
		require.NoError(t, err)
		require.Len(t, page.Instances, 1, "the key is found by a search")
		require.Equal(t, r.ID, page.Instances[0].ID)
	}
}

// TestInsertTxRefusesWhatPostgreSQLWouldBeforeSQL: a state PostgreSQL's
// jsonb cannot hold (a NUL in a string, which encoding/json writes as
// \u0000, a lone surrogate escape, or invalid UTF-8 in a json.RawMessage,
// which encoding/json passes through) and a RunAt outside its timestamps
// are ErrInvalidInsert before any SQL runs. Before, the database refused
// them, which aborted the InsertTx caller's transaction: its own writes
// were rolled back at commit.
func TestInsertTxRefusesWhatPostgreSQLWouldBeforeSQL(t *testing.T) {
	t.Parallel()
	type raw struct {
		S string          `json:"s,omitempty"`
		R json.RawMessage `json:"r,omitempty"`
	}
	job := &gendurable.Job[raw]{Name: "raw", Perform: func(context.Context, *gendurable.Run[raw]) error { return nil }}
	b := setup(t, nil, job)
	ctx := context.Background()
	b.exec(`CREATE TABLE {{s}}.callers (n int)`)
	for name, p := range map[string]gendurable.InsertParams{
		"NUL in a string":         job.New(raw{S: "a\x00b"}),
		"escaped NUL":             job.New(raw{R: json.RawMessage(`{"k\u0000": 1}`)}),
		"lone high surrogate":     job.New(raw{R: json.RawMessage(`"\ud800"`)}),
		"lone low surrogate":      job.New(raw{R: json.RawMessage(`["\udc00"]`)}),
		"invalid UTF-8, raw":      job.New(raw{R: json.RawMessage("{\"k\":\"\xc3\x28\"}")}),
		"RunAt past PostgreSQL":   job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}),
		"RunAt before PostgreSQL": job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}),
		// PostgreSQL holds these, RFC 3339 does not: one such row made every
		// list --json page holding it fail.
		// (a review: 9999-12-31 23:59 UTC is the year 10000 in Berlin).
		"RunAt past year 9999": job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(9999, 12, 31, 0, 0, 1, 0, time.UTC)}),
		"RunAt before year 1":  job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(1, 1, 1, 23, 59, 59, 0, time.UTC)}),
	} {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }() // on a failure: the schema's drop would wait for it
		_, err = tx.Exec(ctx, replaceSchema(`INSERT INTO {{s}}.callers VALUES (1)`, b.schema))
		require.NoError(t, err)
		_, err = b.eng.InsertTx(ctx, tx, p)
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, name)
		require.NotContains(t, err.Error(), "SQLSTATE", "%s: refused before any SQL", name)
		_, err = tx.Exec(ctx, replaceSchema(`INSERT INTO {{s}}.callers VALUES (2)`, b.schema))
		require.NoError(t, err, "%s: the caller's transaction goes on", name)
		require.NoError(t, tx.Commit(ctx), name)
	}
	require.Equal(t, 18, b.count(`SELECT count(*) FROM {{s}}.callers`), "every caller's writes committed")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))

	// What PostgreSQL does hold goes in: a surrogate pair, an escaped
	// backslash before "u0000", control characters, RunAt at the bounds.
	for _, p := range []gendurable.InsertParams{
		job.New(raw{R: json.RawMessage(`["\ud83d\ude00", "\\u0000", "\u0001"]`)}),
		job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}),
		job.New(raw{}).With(gendurable.InsertOpts{RunAt: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)}),
	} {
		_, err := b.eng.Insert(ctx, p)
		require.NoError(t, err)
	}
	page, err := b.eng.List(ctx, gendurable.ListFilter{})
	require.NoError(t, err)
	require.Len(t, page.Instances, 3)
	_, err = json.Marshal(page)
	require.NoError(t, err, "the rows' times are written out as JSON")
	for _, zone := range []string{"Pacific/Kiritimati", "Etc/GMT+12"} { // UTC+14, UTC-12
		loc, err := time.LoadLocation(zone)
		require.NoError(t, err)
		for _, in := range page.Instances {
			_, err = json.Marshal(in.EligibleAt.In(loc))
			require.NoError(t, err, "%s in %s", in.EligibleAt, zone)
		}
	}
}

// cancelAfterInsert cancels a context as soon as an insert statement into
// the instances table has returned, while armed.
type cancelAfterInsert struct {
	armed  atomic.Bool
	cancel atomic.Pointer[context.CancelFunc]
}

type insertSQLKey struct{}

func (c *cancelAfterInsert) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, insertSQLKey{}, strings.Contains(d.SQL, "INSERT INTO") && strings.Contains(d.SQL, "gendurable_instances"))
}

func (c *cancelAfterInsert) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if isInsert, _ := ctx.Value(insertSQLKey{}).(bool); isInsert && c.armed.Load() {
		if f := c.cancel.Load(); f != nil {
			(*f)()
		}
	}
}

// TestAnInsertWhoseContextEndsAfterItCommittedSucceeds: the context of an
// InsertMany ending after its insert statement returned — its rows
// committed — does not turn the call into a failure: the read of the
// duplicates' holders is not cancelled with it. Before, the call returned
// only the cancellation, and a caller that retried inserted the new rows
// again (a probe: 24 of 147 calls whose rows had committed failed so).
func TestAnInsertWhoseContextEndsAfterItCommittedSucceeds(t *testing.T) {
	t.Parallel()
	tracer := &cancelAfterInsert{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: tracer})
	rec := &recorder{}
	job := rec.job("uniq")
	b := bundleOn(t, pool, schema, nil, job)
	held, err := b.eng.Insert(context.Background(), job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{UniqueKey: "held"}))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tracer.cancel.Store(&cancel)
	tracer.armed.Store(true)
	res, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{UniqueKey: "new"}),
		job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{UniqueKey: "held"}),
	})
	tracer.armed.Store(false)
	require.Error(t, ctx.Err(), "the context ended after the insert")
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.NotZero(t, res[0].ID)
	require.True(t, res[1].Duplicate)
	require.Equal(t, held.ID, res[1].ID)
	require.Equal(t, 2, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
}

// lookupFailTx is a caller's transaction whose connection is terminated by
// the server as the duplicate-holder lookup is sent.
type lookupFailTx struct {
	pgx.Tx
	kill func(pid uint32)
}

func (t lookupFailTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "unique_guard = ANY") {
		t.kill(t.Tx.Conn().PgConn().PID())
	}
	return t.Tx.Query(ctx, sql, args...)
}

// TestAnInsertTxWhoseLookupFailsReportsIt: in the caller's transaction a
// failed read of the duplicates' holders dooms the transaction, so
// InsertManyTx returns the failure (unlike InsertMany, whose rows have
// committed by then): a review found the first version of that rule
// reporting a new ID for a row that never existed.
func TestAnInsertTxWhoseLookupFailsReportsIt(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("uniq")
	b := setup(t, nil, job)
	ctx := context.Background()
	_, err := b.eng.Insert(ctx, job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{UniqueKey: "held"}))
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ftx := lookupFailTx{Tx: tx, kill: func(pid uint32) {
		_, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
	}}
	_, err = b.eng.InsertManyTx(ctx, ftx, []gendurable.InsertParams{
		job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{UniqueKey: "new"}),
		job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{UniqueKey: "held"}),
	})
	require.Error(t, err)
	require.Error(t, tx.Commit(ctx))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
}

// panicMarshaler panics when encoded.
type panicMarshaler struct{}

func (panicMarshaler) MarshalJSON() ([]byte, error) { panic("marshal boom") }

// TestAnInsertTxIsPickedSoonAfterItsCommit: the engine cannot see the
// caller's commit, so an InsertTx (or InsertManyTx) sets the feeder's polls
// back to the busy interval, doubling from there while they find nothing;
// a transaction committed 300 ms after its insert has its row started
// within about 2 × 300 ms + 25 ms — a row due before the commit (RunIn
// 50 ms) too. Before, the pick the insert kicked ran before the commit,
// found nothing, and the row waited for the idle poll (a River user's
// probe: 0.4 to 4 s at the defaults; 20 s here). The hurry asks for no
// pick of its own: 200 InsertTx calls in one transaction send a handful
// of picks, not one each (a review counted 1,067 for 2,000).
func TestAnInsertTxIsPickedSoonAfterItsCommit(t *testing.T) {
	t.Parallel()
	started := make(chan time.Time, 512)
	job := &gendurable.Job[orderArgs]{Name: "txwake", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		started <- time.Now()
		return nil
	}}
	idle := gendurable.QueueConfig{Concurrency: 2, BusyPollInterval: 25 * time.Millisecond, PollInterval: 20 * time.Second, MaxPollInterval: 20 * time.Second}
	picks := &queuePicks{queue: "d"}
	b := setupTraced(t, picks, &gendurable.Config{Machines: []gendurable.Definition{job},
		Queues: map[string]gendurable.QueueConfig{"a": idle, "b": idle, "c": idle, "d": idle, "e": idle}})
	b.start()
	ctx := context.Background()
	time.Sleep(300 * time.Millisecond) // every queue's first pick found nothing: idle, next poll in 20 s

	for _, q := range []string{"a", "b", "c"} {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		p := job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: q})
		switch q {
		case "a":
			_, err = b.eng.InsertTx(ctx, tx, p)
		case "b":
			_, err = b.eng.InsertManyTx(ctx, tx, []gendurable.InsertParams{p, p})
		case "c": // due before the commit
			_, err = b.eng.InsertTx(ctx, tx, p.With(gendurable.InsertOpts{Queue: q, RunIn: 50 * time.Millisecond}))
		}
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, tx.Commit(ctx))
		committed := time.Now()
		select {
		case at := <-started:
			// About 625 ms; 5 s leaves room for a loaded machine, and
			// the idle poll is 20 s.
			require.Less(t, at.Sub(committed), 5*time.Second, "queue %s", q)
		case <-time.After(15 * time.Second):
			t.Fatalf("queue %s: the row committed 15 s ago has not started: it waits for the idle poll", q)
		}
		if q == "b" {
			<-started
		}
	}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	before := picks.n.Load()
	began := time.Now()
	for range 200 {
		_, err = b.eng.InsertTx(ctx, tx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "d"}))
		require.NoError(t, err)
	}
	took := time.Since(began)
	sent := picks.n.Load() - before
	require.NoError(t, tx.Commit(ctx))
	// A poll per 25 ms while the calls go on (and a wake that lands just
	// after a poll consumed the hurry: two), and a few more.
	require.LessOrEqual(t, sent, 2*int64(took/(25*time.Millisecond))+5, "picks of queue d during 200 InsertTx calls over %s", took)
	for range 200 {
		<-started
	}

	// A stream of committed InsertTx calls closer together than the busy
	// interval: the first row starts while the stream goes on. A review
	// found each hurry pushing the next poll off, so no row started
	// until the stream ended.
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		for range 100 {
			tx, err := b.pool.Begin(ctx)
			if err == nil {
				_, err = b.eng.InsertTx(ctx, tx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "e"}))
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(15 * time.Millisecond)
		}
	}()
	select {
	case <-started:
	case <-streamDone:
		t.Fatal("no row of the stream started before the stream ended")
	}
	<-streamDone
}

// queuePicks counts the picks of one queue.
type queuePicks struct {
	queue string
	n     atomic.Int64
}

func (q *queuePicks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "gendurable_pick(") && len(d.Args) > 0 && d.Args[0] == q.queue {
		q.n.Add(1)
	}
	return ctx
}

func (q *queuePicks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
