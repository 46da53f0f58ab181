package gendurable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

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

func TestWaitShowsThePartitionHolder(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan int64, 2)
	job := &gendurable.Job[spanArgs]{Name: "holder", Perform: func(ctx context.Context, j *gendurable.Run[spanArgs]) error {
		started <- j.ID
		<-release
		return nil
	}}
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	opts := gendurable.InsertOpts{PartitionKey: "acct-1"}
	first := b.insert(job.New(spanArgs{}).With(opts))
	require.Equal(t, first, <-started)
	second := b.insert(job.New(spanArgs{}).With(opts))
	w, err := b.eng.Wait(ctx, second)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusRunnable, w.Status)
	require.Equal(t, first, w.PartitionHeldBy)
	require.Contains(t, w.Summary, `partition key "acct-1" held by instance`)
	select {
	case id := <-started:
		t.Fatalf("instance %d started while its key was held", id)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	b.waitStatus(second, "done", 10*time.Second)

	w, err = b.eng.Wait(ctx, second)
	require.NoError(t, err)
	require.Equal(t, "finished (done)", w.Summary)
	_, err = b.eng.Wait(ctx, 424242)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

func TestRetryFailedInstanceAndUniqueCollision(t *testing.T) {
	t.Parallel()
	var fail = true
	var mu sync.Mutex
	job := &gendurable.Job[orderArgs]{Name: "retryable", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return context.DeadlineExceeded
		}
		return nil
	}}
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	opts := gendurable.InsertOpts{UniqueKey: "invoice-9"}
	first := b.insert(job.New(orderArgs{}).With(opts))
	b.waitStatus(first, "failed", 10*time.Second)

	// The key was freed by the failure; a new, still-waiting instance takes it.
	holder := b.insert(job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{UniqueKey: "invoice-9", RunIn: time.Hour}))
	err := b.eng.Retry(ctx, first)
	require.ErrorIs(t, err, gendurable.ErrUniqueConflict, "retrying would put two live instances on one key")
	require.Equal(t, "failed", b.row(first).Status, "unchanged")
	require.ErrorIs(t, b.eng.Retry(ctx, holder), gendurable.ErrNotRetryable)
	require.ErrorIs(t, b.eng.Retry(ctx, 987654), gendurable.ErrNotFound)

	mu.Lock()
	fail = true
	mu.Unlock()
	plain := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	b.waitStatus(plain, "failed", 10*time.Second)
	mu.Lock()
	fail = false
	mu.Unlock()
	require.NoError(t, b.eng.Retry(ctx, plain))
	r := b.waitStatus(plain, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 1, "the history is kept")
}
