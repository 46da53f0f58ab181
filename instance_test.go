package gendurable_test

import (
	"context"
	"errors"
	"fmt"
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

func TestInstanceSnapshot(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	res, err := b.eng.Insert(ctx, m.New(probeState{Do: "error"}).With(gendurable.InsertOpts{PartitionKey: "k1", Priority: 2}))
	require.NoError(t, err)
	b.waitStatus(res.ID, "failed", 10*time.Second)
	in, err := b.eng.Instance(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusFailed, in.Status)
	require.True(t, in.Status.Terminal())
	require.Equal(t, "probe", in.Machine)
	require.Equal(t, 1, in.Version)
	require.Equal(t, "k1", in.PartitionKey)
	require.Equal(t, 2, in.Priority)
	require.Len(t, in.Errors, 3)
	require.Equal(t, "boom", in.Errors[0].Error)
	require.Equal(t, "error", in.Errors[0].Kind)
	require.False(t, in.Errors[0].At.IsZero())
	require.NotNil(t, in.FinishedAt)

	_, err = b.eng.Instance(ctx, 987654321)
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
	// The error names the holder and the key as text (it named the retried
	// instance and the key's bytes in hex: "Key (unique_guard)=(\x696e…)").
	require.ErrorContains(t, err, fmt.Sprintf(`unique key "invoice-9" is held by instance %d`, holder))
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

// TestRetriedCancelledStepRunsWhenItsLeaseEnds: a step retried while the
// lease of its cancelled run lives is eligible when that lease ends; the
// engine that retried it must pick it then, not after its feeder's idle
// backoff (up to MaxPollInterval) has found it.
func TestRetriedCancelledStepRunsWhenItsLeaseEnds(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Retry", "RetryMany"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			starts := make(chan time.Time, 4)
			var mu sync.Mutex
			runs := 0
			job := &gendurable.Job[spanArgs]{Name: "rprompt", Perform: func(ctx context.Context, r *gendurable.Run[spanArgs]) error {
				mu.Lock()
				runs++
				first := runs == 1
				mu.Unlock()
				starts <- time.Now()
				if first {
					<-ctx.Done() // cancelled
					return ctx.Err()
				}
				return nil
			}}
			cfg := fastConfig("", job) // lease 3s, heartbeat 1s
			// The default poll intervals: an idle queue backs off to 5 s.
			cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4}}
			b := setup(t, cfg)
			b.start()
			ctx := context.Background()
			id := b.insert(job.New(spanArgs{}))
			<-starts
			require.NoError(t, b.eng.Cancel(ctx, id, "operator"))
			if how == "Retry" {
				require.NoError(t, b.eng.Retry(ctx, id))
			} else {
				res, err := b.eng.RetryMany(ctx, []int64{id})
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Changed)
			}
			r := b.row(id)
			require.NotNil(t, r.LeaseExp)
			lease := *r.LeaseExp
			select {
			case at := <-starts:
				late := at.Sub(lease)
				t.Logf("ran %v after the lease ended", late)
				require.GreaterOrEqual(t, late, time.Duration(0))
				require.Less(t, late, 750*time.Millisecond, "the retried step waited for the feeder's backoff")
			case <-time.After(15 * time.Second):
				t.Fatal("the retried step never ran")
			}
		})
	}
}

// TestRetryOfAParentRacingItsLastChildsFinish: a parent cancelled while it
// awaits its children leaves them running; retried while the last of them
// finishes, it must end up waiting for nothing — runnable, its join run —
// whichever statement takes the parent's row first. The retry counts the
// live children on its snapshot; when the child's outcome held the
// parent's row lock while the retry waited for it, that snapshot still saw
// the child running, and the retry put the parent back to awaiting one
// child that had already counted itself down: awaiting_children for ever.
// A transaction holding the parent's row lines the two up: the child's
// outcome waits first, the retry (its snapshot taken) second.
func TestRetryOfAParentRacingItsLastChildsFinish(t *testing.T) {
	t.Parallel()
	entered, release := make(chan int64, 1), make(chan struct{}, 1)
	leaf := &gendurable.Job[leafArgs]{Name: "rlast", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		entered <- j.ID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	m := statusParent("rlastparent", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{leaf.New(leafArgs{N: 1})}
	})
	b := setup(t, fastConfig("", m, leaf))
	b.start()
	ctx := context.Background()
	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Retry", true: "RetryMany"}[many], func(t *testing.T) {
			parent := b.insert(m.New(fanState{}))
			child := <-entered
			b.waitStatus(parent, "awaiting_children", 10*time.Second)
			require.NoError(t, b.eng.Cancel(ctx, parent, "operator"))

			tx, holder := b.lockRows(parent)
			waiting := func(n int) func() bool {
				return func() bool {
					// Blocked by the holder, or by a session the holder blocks (the
					// second waiter for a row waits on the first).
					return b.count(`WITH a AS (SELECT pid, pg_blocking_pids(pid) AS by FROM pg_stat_activity)
						SELECT count(*) FROM a WHERE $1 = ANY (a.by)
						   OR EXISTS (SELECT 1 FROM a AS f WHERE $1 = ANY (f.by) AND f.pid = ANY (a.by))`, holder) >= n
				}
			}
			release <- struct{}{} // the child's Done outcome counts itself down on the parent's row: it waits
			eventually(t, 10*time.Second, waiting(1), "the child's outcome does not wait for the parent's row")
			retried := make(chan error, 1)
			go func() {
				if many {
					_, err := b.eng.RetryMany(ctx, []int64{parent})
					retried <- err
					return
				}
				retried <- b.eng.Retry(ctx, parent)
			}()
			eventually(t, 10*time.Second, waiting(2), "the retry does not wait for the parent's row")
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-retried)
			b.waitStatus(child, "done", 10*time.Second)
			r := b.waitStatus(parent, "done", 10*time.Second)
			require.JSONEq(t, `["done"]`, string(r.Result))
		})
	}
}

// TestRetryManyOfAParentWhoseRetriedChildFinishedMeanwhile: a RetryMany
// that waits for the lock of an earlier row of its batch takes a failed
// parent's row later than its snapshot; if meanwhile a child of the parent
// that the snapshot saw failed was retried on its own and finished, that
// child counted itself down on the parent's row (a failed parent counts its
// children down too). The retry must still put the parent back to await
// its other, live child. It took the fall of children_pending since its
// snapshot as the finishes of children its snapshot counted live, so the
// retried child's finish took one off a count that never held it: the
// parent went runnable, and its join ran while its other child still ran.
func TestRetryManyOfAParentWhoseRetriedChildFinishedMeanwhile(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[int64]int{}
	entered, release := make(chan int64, 4), make(chan struct{}, 1)
	leaf := &gendurable.Job[leafArgs]{Name: "rmfin", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		mu.Lock()
		runs[j.ID]++
		n := runs[j.ID]
		mu.Unlock()
		switch {
		case j.State.Fail && n == 1: // the first child fails at once, the first time
			return gendurable.JobCancel(errors.New("first run fails"))
		case j.State.Fail:
			return nil
		}
		entered <- j.ID // the second child runs until released
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	other := &gendurable.Job[leafArgs]{Name: "rmfinx", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		return gendurable.JobCancel(errors.New("fails"))
	}}
	m := statusParent("rmfinparent", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{leaf.New(leafArgs{N: 1, Fail: true}), leaf.New(leafArgs{N: 2})}
	})
	b := setup(t, fastConfig("", m, leaf, other))
	b.start()
	ctx := context.Background()

	x := b.insert(other.New(leafArgs{})) // the batch's earlier row, whose lock the retry waits for
	b.waitStatus(x, "failed", 10*time.Second)
	parent := b.insert(m.New(fanState{}))
	live := <-entered
	b.waitStatus(parent, "awaiting_children", 10*time.Second)
	var failedKid int64
	eventually(t, 10*time.Second, func() bool {
		failedKid = int64(b.count(`SELECT coalesce(max(id), 0)::int FROM {{s}}.gendurable_instances
			WHERE parent_id = $1 AND status = 'failed'`, parent))
		return failedKid != 0
	}, "the first child does not fail")
	require.NoError(t, b.eng.Cancel(ctx, parent, "operator"))

	tx, holder := b.lockRows(x)
	retried := make(chan error, 1)
	var res gendurable.BulkResult
	go func() {
		var err error
		res, err = b.eng.RetryMany(ctx, []int64{x, parent})
		retried <- err
	}()
	eventually(t, 10*time.Second, func() bool { return b.blockedBy(holder, "") > 0 }, "the retry does not wait for the earlier row")
	// Meanwhile the failed child is retried on its own and finishes.
	require.NoError(t, b.eng.Retry(ctx, failedKid))
	b.waitStatus(failedKid, "done", 10*time.Second)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-retried)
	require.EqualValues(t, 2, res.Changed)
	require.Equal(t, "awaiting_children", b.row(parent).Status, "the retried parent does not wait for its live child")
	release <- struct{}{}
	b.waitStatus(live, "done", 10*time.Second)
	r := b.waitStatus(parent, "done", 10*time.Second)
	require.JSONEq(t, `["done","done"]`, string(r.Result), "the parent's join ran before its live child finished")
}

// TestRetryOfAChildRacingTheRetryOfItsParent: a parent cancelled while it
// awaited its fan-out, with one child failed and one still live, is retried
// at the same moment as its failed child, by two operators. Whichever
// commits first, the parent must end up awaiting both children. Each retry
// used to lock its own row only: the parent's counted the failed child as
// finished (its snapshot saw it failed), and the child's found the parent
// failed (its snapshot saw it so) and counted itself on no one, so the
// parent awaited one child while two were live — the other child's finish
// woke it, and its join ran beside the retried child. The tracer holds the
// first retry between its statement and its COMMIT while the second runs.
func TestRetryOfAChildRacingTheRetryOfItsParent(t *testing.T) {
	t.Parallel()
	tr := &pauseTracer{}
	b := setupTraced(t, tr, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		many        bool
		parentFirst bool
	}{{"Retry/parent held", false, true}, {"Retry/child held", false, false},
		{"RetryMany/parent held", true, true}, {"RetryMany/child held", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			parent := b.seedRow(`status, finished_at, fanout, children_total, children_pending`, `'failed', now(), 1, 2, 1`)
			failed := b.seedRow(`status, finished_at, parent_id, parent_fanout`, `'failed', now(), $1, 1`, parent)
			live := b.seedRow(`status, eligible_at, parent_id, parent_fanout`, `'runnable', now() + interval '1 hour', $1, 1`, parent)
			retry := func(id int64) error {
				if tc.many {
					res, err := b.eng.RetryMany(ctx, []int64{id})
					if err == nil && res.Changed != 1 {
						err = errors.New("retry many changed nothing")
					}
					return err
				}
				return b.eng.Retry(ctx, id)
			}
			first, second := parent, failed
			if !tc.parentFirst {
				first, second = failed, parent
			}
			held, release := tr.pauseAt(t, "THEN p.children_pending +", first)
			firstDone := make(chan error, 1)
			go func() { firstDone <- retry(first) }()
			pid := <-held // the first retry's statement ran; its COMMIT waits
			secondDone := make(chan error, 1)
			go func() { secondDone <- retry(second) }()
			eventually(t, 10*time.Second, func() bool { return len(secondDone) > 0 || b.blockedBy(pid, "") > 0 },
				"the second retry neither finishes nor waits for the first")
			release()
			require.NoError(t, <-firstDone)
			require.NoError(t, <-secondDone)

			var status string
			var pending, liveKids int
			require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT p.status::text, p.children_pending,
				(SELECT count(*) FROM {{s}}.gendurable_instances AS c
				 WHERE c.parent_id = p.id AND c.parent_fanout = p.fanout AND c.status NOT IN ('done', 'failed'))::int
				FROM {{s}}.gendurable_instances AS p WHERE p.id = $1`, b.schema), parent).Scan(&status, &pending, &liveKids))
			require.Equal(t, 2, liveKids)
			require.Equal(t, "awaiting_children", status)
			require.Equal(t, 2, pending, "the parent counts %d pending children while %d are live", pending, liveKids)

			// The live child's finish must not wake the parent while the
			// retried one is live.
			_, err := b.eng.CancelMany(ctx, []int64{live}, "finish")
			require.NoError(t, err)
			require.Equal(t, "awaiting_children", b.row(parent).Status, "the parent woke while its retried child %d is %s", failed, b.row(failed).Status)
		})
	}
}

// TestRetryAndRunNowThatWaitedForTheRowRunAtOnce: a Retry (or RunNow) that
// waits for the row's lock — a caller's transaction holds it, for 1.6 s —
// while the queue is busy makes the row eligible, and wakes its feeder, as
// it returns: the row must run at once. Both made it eligible from their
// transaction's start, before the wait: more than a second before, which
// is below the floor of a busy queue's picks (the last short pick's now()
// less a second, docs/design.md §4), so the kicked pick passed it over and
// it ran only when a floor check found it. Five times each, the median
// judged, as TestRowsVisibleBelowThePickFloorRun does.
func TestRetryAndRunNowThatWaitedForTheRowRunAtOnce(t *testing.T) {
	t.Parallel()
	var started, failed sync.Map // id → time.Time of its step's last start; ids that failed once
	job := &gendurable.Job[orderArgs]{Name: "waited", MaxAttempts: 1, Perform: func(_ context.Context, j *gendurable.Run[orderArgs]) error {
		if j.State.I == 0 {
			return nil // the load
		}
		started.Store(j.ID, time.Now())
		if _, again := failed.LoadOrStore(j.ID, true); j.State.I == 1 && !again {
			return gendurable.JobCancel(errors.New("fails once"))
		}
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4,
		BusyPollInterval: 25 * time.Millisecond, PollInterval: time.Second, MaxPollInterval: 5 * time.Second}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	defer keepBusy(b, job)()

	measure := func(what string, prepare func() int64, call func(id int64) error) {
		var took []time.Duration
		for range 5 {
			id := prepare()
			started.Delete(id)
			tx, holder := b.lockRows(id)
			done := make(chan error, 1)
			go func() { done <- call(id) }()
			eventually(t, 10*time.Second, func() bool { return b.blockedBy(holder, "") > 0 }, "%s does not wait for the row", what)
			time.Sleep(1600 * time.Millisecond)
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-done)
			returned := time.Now()
			b.waitStatus(id, "done", 10*time.Second)
			at, ok := started.Load(id)
			require.True(t, ok)
			took = append(took, at.(time.Time).Sub(returned))
		}
		slices.Sort(took)
		t.Logf("%s after a 1.6 s wait for the row: step started %v after the call returned", what, took)
		require.Less(t, took[len(took)/2], 150*time.Millisecond, "%s: median of %v", what, took)
	}
	measure("Retry", func() int64 {
		id := b.insert(job.New(orderArgs{I: 1}))
		b.waitStatus(id, "failed", 10*time.Second)
		return id
	}, func(id int64) error { return b.eng.Retry(ctx, id) })
	measure("RunNow", func() int64 {
		return b.insert(job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	}, func(id int64) error { return b.eng.RunNow(ctx, id) })
}

// leafCancelledOnce is a leaf job whose first run of child N 2 sends its
// id on started and waits for its cancel; every other run succeeds.
func leafCancelledOnce(name string) (*gendurable.Job[leafArgs], chan int64) {
	var runs atomic.Int32
	started := make(chan int64, 4)
	return &gendurable.Job[leafArgs]{Name: name, Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		if j.State.N == 2 && runs.Add(1) == 1 {
			started <- j.ID
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}, started
}

// leafFailsOnceThenWaits is a leaf job whose first run fails for good
// (MaxAttempts 1) and whose later runs send their id on rerun and wait for
// release (or their context).
func leafFailsOnceThenWaits(name string) (*gendurable.Job[leafArgs], chan int64, chan struct{}) {
	var runs atomic.Int32
	rerun, release := make(chan int64, 1), make(chan struct{})
	return &gendurable.Job[leafArgs]{Name: name, MaxAttempts: 1,
		Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
			if runs.Add(1) == 1 {
				return gendurable.JobCancel(errors.New("the child fails once"))
			}
			rerun <- j.ID
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}, rerun, release
}

// TestRetryOfTheLastChildPutsAWokenParentBackToAwaitingIt: the cancel of a
// parent's last live child wakes the parent (runnable at its join step); a
// retry of that child before the join step has run must make the parent
// await it again, by Retry and by RetryMany. Before, only a parent still
// awaiting its children counted a retried child: this one ran its join
// beside the retried child, which Run.Children showed runnable, and
// finished before it (a fault probe found it). The queue is paused to
// hold the woken parent between its wake and its join.
func TestRetryOfTheLastChildPutsAWokenParentBackToAwaitingIt(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Retry", "RetryMany"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			leaf, started := leafCancelledOnce("wleaf")
			m := statusParent("wparent", func() []gendurable.InsertParams {
				return []gendurable.InsertParams{leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})}
			})
			b := setup(t, nil, m, leaf)
			b.start()
			ctx := context.Background()
			parent := b.insert(m.New(fanState{}))
			child := <-started
			eventually(t, 10*time.Second, func() bool {
				return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id = $1 AND status = 'done'`, parent) == 1
			}, "child 1 not done")
			require.NoError(t, b.eng.Pause(ctx, "default"))
			require.NoError(t, b.eng.Cancel(ctx, child, "operator"))
			require.Equal(t, "runnable", b.row(parent).Status, "the cancel of its last live child woke the parent")
			if how == "Retry" {
				require.NoError(t, b.eng.Retry(ctx, child))
			} else {
				res, err := b.eng.RetryMany(ctx, []int64{child})
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Changed)
			}
			require.Equal(t, "awaiting_children", b.row(parent).Status, "the woken parent awaits its retried child again")
			require.NoError(t, b.eng.Resume(ctx, "default"))
			r := b.waitStatus(parent, "done", 15*time.Second)
			require.JSONEq(t, `["done", "done"]`, string(r.Result), "the join ran after its retried child finished")
			require.Equal(t, "done", b.row(child).Status)
		})
	}
}

// TestAJoinWhoseChildWasRetriedUnderItsClaimAwaitsTheChild (a probe): a
// child retried while its parent's join is claimed is left to run on its
// own (the claim read the children), but when that claim ends without the
// join's outcome — here the join fails and backs off — the next claim reads
// the retried child live. Its join must not run then: the parent awaits
// the child again and joins once it has finished. Before, the second run
// of the join saw the child executing and the parent ended done while the
// child still ran (also after a Stop released a prefetched parent, a reap,
// a Replay or an abandoned join).
func TestAJoinWhoseChildWasRetriedUnderItsClaimAwaitsTheChild(t *testing.T) {
	t.Parallel()
	leaf, rerun, release := leafFailsOnceThenWaits("rrleaf")
	var b *testBundle
	var joins atomic.Int32
	m := &gendurable.Machine[fanState]{Name: "rrparent", Start: "spawn", MaxAttempts: 5,
		Backoff: func(int) time.Duration { return 200 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				var st []string
				for _, c := range r.Children {
					st = append(st, string(c.Status))
				}
				if joins.Add(1) == 1 {
					// The child failed and woke the parent; an operator
					// retries it while this join runs, and the join fails.
					if err := b.eng.Retry(ctx, r.Children[0].ID); err != nil {
						return gendurable.Outcome{}, fmt.Errorf("retry: %w", err)
					}
					return gendurable.Outcome{}, errors.New("the join fails once")
				}
				return gendurable.Done(st), nil
			},
		}}
	b = setup(t, nil, m, leaf)
	b.start()
	parent := b.insert(m.New(fanState{}))
	var child int64
	select {
	case child = <-rerun:
	case <-time.After(15 * time.Second):
		t.Fatal("the retried child did not run again")
	}
	for deadline := time.Now().Add(10 * time.Second); b.row(parent).Status != "awaiting_children"; {
		if time.Now().After(deadline) {
			t.Fatalf("the parent, its join failed, does not await its retried child: status %s, %d joins, result %s",
				b.row(parent).Status, joins.Load(), b.row(parent).Result)
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, int32(1), joins.Load(), "the join ran again while the child ran")
	close(release)
	r := b.waitStatus(parent, "done", 15*time.Second)
	require.JSONEq(t, `["done"]`, string(r.Result), "the join ran after its retried child finished")
	require.Equal(t, int32(2), joins.Load())
	require.Equal(t, "done", b.row(child).Status)
}

// TestRetryOfAParentPastItsJoinRerunsItsStep (a semantics probe): a parent
// that joined its children and then failed for good in a later step, while
// a child of that fan-out, retried by an operator after the join, still
// runs: a retry of the parent must rerun the step that failed — its join
// is behind it, and the live child runs on its own. Retry and RetryMany
// counted the fan-out's live children without asking whether the join had
// run (children_total, cleared by the join's outcome), and parked the
// parent awaiting that child ("-1 of 0 done" in show); its step ran only
// when the child finished.
func TestRetryOfAParentPastItsJoinRerunsItsStep(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Retry", "RetryMany"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			leaf, rerun, release := leafFailsOnceThenWaits("pjleaf")
			var laters atomic.Int32
			m := &gendurable.Machine[fanState]{Name: "pjparent", Start: "spawn", MaxAttempts: 1,
				Steps: map[string]gendurable.StepFunc[fanState]{
					"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
						return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1})), nil
					},
					"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
						return r.Next("later", r.State), nil
					},
					"later": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
						if laters.Add(1) == 1 {
							return gendurable.Outcome{}, errors.New("the step after the join fails once")
						}
						return gendurable.Done("again"), nil
					},
				}}
			b := setup(t, nil, m, leaf)
			b.start()
			ctx := context.Background()
			defer close(release)
			parent := b.insert(m.New(fanState{}))
			b.waitStatus(parent, "failed", 15*time.Second)
			var child int64
			require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1`,
				b.schema), parent).Scan(&child))
			require.NoError(t, b.eng.Retry(ctx, child))
			select {
			case <-rerun:
			case <-time.After(15 * time.Second):
				t.Fatal("the retried child did not run again")
			}
			if how == "Retry" {
				require.NoError(t, b.eng.Retry(ctx, parent))
			} else {
				res, err := b.eng.RetryMany(ctx, []int64{parent})
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Changed)
			}
			require.NotEqual(t, "awaiting_children", b.row(parent).Status,
				"the parent, past its join, awaits a child it has joined")
			r := b.waitStatus(parent, "done", 15*time.Second)
			require.JSONEq(t, `"again"`, string(r.Result))
			require.Equal(t, int32(2), laters.Load())
			require.Equal(t, "executing", b.row(child).Status, "the child still runs on its own")
		})
	}
}

// TestAJoinClaimedAheadSeesAChildRetriedBeforeItStarts (a fault probe): a
// parent woken by its child's failure is claimed ahead of a free slot (the
// prefetch buffer) while a long step holds the only one; an operator
// retries the child then, before the join starts. The retry leaves a
// parent whose join is claimed to that claim, which read the children as
// they were — the join ran beside the live child and the parent ended
// done with the child's "failed". A claim that waited in the buffer reads
// its children again as it starts, and awaits a live one.
func TestAJoinClaimedAheadSeesAChildRetriedBeforeItStarts(t *testing.T) {
	t.Parallel()
	failNow, rerun, finish := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	var leafRuns atomic.Int32
	leaf := &gendurable.Job[leafArgs]{Name: "bfleaf", MaxAttempts: 1, Queue: "kids",
		Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
			if leafRuns.Add(1) == 1 {
				<-failNow
				return gendurable.JobCancel(errors.New("the child fails once"))
			}
			rerun <- struct{}{}
			select {
			case <-finish:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
	var joins atomic.Int32
	m := &gendurable.Machine[fanState]{Name: "bfparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				joins.Add(1)
				var st []string
				for _, c := range r.Children {
					st = append(st, string(c.Status))
				}
				return gendurable.Done(st), nil
			},
		}}
	release := make(chan struct{})
	blocker := slotHog("bfhog", release)
	cfg := fastConfig("", m, leaf, blocker)
	cfg.Queues = map[string]gendurable.QueueConfig{
		"default": {Concurrency: 1, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond},
		"kids":    {Concurrency: 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond},
	}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	eventually(t, 10*time.Second, func() bool { return b.row(parent).Status == "awaiting_children" }, "the parent did not fan out")
	b.insert(blocker.New(leafArgs{}))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bfhog' AND status = 'executing'`) == 1
	}, "the blocker did not start")
	close(failNow)
	// The child's failure wakes the parent; the feeder claims its join
	// ahead of the busy slot.
	eventually(t, 10*time.Second, func() bool {
		r := b.row(parent)
		return r.Status == "executing" && r.Step == "join"
	}, "the woken parent was not claimed ahead")
	var child int64
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1`, b.schema), parent).Scan(&child))
	require.NoError(t, b.eng.Retry(ctx, child))
	select {
	case <-rerun:
	case <-time.After(15 * time.Second):
		t.Fatal("the retried child did not run again")
	}
	close(release)
	eventually(t, 10*time.Second, func() bool { return b.row(parent).Status == "awaiting_children" },
		"the parent, its join claimed before the retry, does not await its retried child")
	require.Zero(t, joins.Load(), "the join ran beside the live child")
	close(finish)
	r := b.waitStatus(parent, "done", 15*time.Second)
	require.JSONEq(t, `["done"]`, string(r.Result), "the join ran after its retried child finished")
	require.Equal(t, int32(1), joins.Load())
}

// retryAfterPick is a statement tracer that, when a pick of queue
// "default" ends having claimed the join of parent (executing at "join"),
// retries the parent's child through admin before the pick returns: the
// retry commits between the pick's snapshot and the join's start, whatever
// the claim's wait for a slot.
type retryAfterPick struct {
	parent atomic.Int64
	done   atomic.Bool
	admin  *gendurable.Engine
	pool   *pgxpool.Pool
	schema string
	err    atomic.Pointer[error]
}

type pickOfDefault struct{}

func (r *retryAfterPick) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.HasPrefix(strings.TrimSpace(d.SQL), "SELECT p.next_cursor") {
		return ctx
	}
	for _, a := range d.Args {
		if q, ok := a.(string); ok && q == "default" {
			return context.WithValue(ctx, pickOfDefault{}, true)
		}
	}
	return ctx
}

func (r *retryAfterPick) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	parent := r.parent.Load()
	if ctx.Value(pickOfDefault{}) == nil || parent == 0 || r.done.Load() {
		return
	}
	var claimed bool
	var child int64
	err := r.pool.QueryRow(context.Background(), replaceSchema(`SELECT p.status = 'executing' AND p.step = 'join', c.id
		FROM {{s}}.gendurable_instances p JOIN {{s}}.gendurable_instances c ON c.parent_id = p.id WHERE p.id = $1`, r.schema),
		parent).Scan(&claimed, &child)
	if errors.Is(err, pgx.ErrNoRows) {
		return // not fanned out yet
	}
	if err == nil && claimed {
		r.done.Store(true)
		err = r.admin.Retry(context.Background(), child)
	}
	if err != nil {
		r.err.Store(&err)
	}
}

// TestAJoinPickedForAFreeSlotSeesAChildRetriedBeforeItStarts (a CI
// failure): a join claimed by a pick while a slot is free starts at once,
// and an operator's retry of its child can commit between the pick's
// snapshot and that start. Only a claim that waited 5 ms or more for a
// slot read its children again, so a join started within 5 ms of its pick
// ran on the children the pick read — the child "failed" — beside the live
// child, and the parent ended done (the test above failed so under -race). A
// join claimed by a pick reads its children again as it starts, and awaits
// a live one. The retry is committed from a tracer at the end of the pick
// that claimed the join, before the pick returns.
func TestAJoinPickedForAFreeSlotSeesAChildRetriedBeforeItStarts(t *testing.T) {
	t.Parallel()
	leaf, rerun, release := leafFailsOnceThenWaits("pfleaf")
	var joins atomic.Int32
	m := statusParent("pfparent", func() []gendurable.InsertParams { return []gendurable.InsertParams{leaf.New(leafArgs{N: 1})} })
	join := m.Steps["join"]
	m.Steps["join"] = func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
		joins.Add(1)
		return join(ctx, r)
	}
	adminPool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3, Extra: 6})
	admin, err := gendurable.New(adminPool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{m, leaf}, Logger: testLogger(t)})
	require.NoError(t, err)
	tr := &retryAfterPick{admin: admin, pool: adminPool, schema: schema}
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 6
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := fastConfig(schema, m, leaf)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: adminPool, schema: schema, eng: eng}
	parent := b.insert(m.New(fanState{}))
	tr.parent.Store(parent)
	b.start()
	var child int64
	select {
	case child = <-rerun:
	case <-time.After(15 * time.Second):
		t.Fatal("the child, retried after the pick that claimed its parent's join, did not run again")
	}
	require.True(t, tr.done.Load())
	if p := tr.err.Load(); p != nil {
		t.Fatalf("the tracer's retry: %v", *p)
	}
	eventually(t, 10*time.Second, func() bool { return b.row(parent).Status == "awaiting_children" },
		"the parent, its join picked before the retry, does not await its retried child")
	require.Zero(t, joins.Load(), "the join ran beside the live child")
	close(release)
	r := b.waitStatus(parent, "done", 15*time.Second)
	require.JSONEq(t, `["done"]`, string(r.Result), "the join ran after its retried child finished")
	require.Equal(t, int32(1), joins.Load())
	require.Equal(t, "done", b.row(child).Status)
}

// TestAReArmedParentKeepsTheBackoffOfItsJoin (a review): a parent whose
// join step failed and waits out its backoff (a Replay) is put back to
// awaiting a child retried meanwhile; the child's finish must wake it at
// the end of that backoff, not at once. The join's wake set it eligible
// now, so the retry of a failed join ran as soon as the child finished.
func TestAReArmedParentKeepsTheBackoffOfItsJoin(t *testing.T) {
	t.Parallel()
	const backoff = 8 * time.Second
	var joins atomic.Int32
	var failedAt, rejoinedAt atomic.Int64
	leaf, started := leafCancelledOnce("bleaf")
	m := &gendurable.Machine[fanState]{Name: "bparent", Start: "spawn", MaxAttempts: 5,
		Backoff: func(int) time.Duration { return backoff },
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				if joins.Add(1) == 1 {
					failedAt.Store(time.Now().UnixNano())
					return gendurable.Outcome{}, errors.New("the join fails once")
				}
				rejoinedAt.Store(time.Now().UnixNano())
				return gendurable.Done(nil), nil
			},
		}}
	b := setup(t, nil, m, leaf)
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	child := <-started
	require.NoError(t, b.eng.Cancel(ctx, child, "operator")) // wakes the parent: its join fails
	eventually(t, 10*time.Second, func() bool { return failedAt.Load() != 0 && b.row(parent).Status == "runnable" },
		"the join did not fail and back off")
	require.NoError(t, b.eng.Retry(ctx, child))
	require.Equal(t, "awaiting_children", b.row(parent).Status, "re-armed")
	b.waitStatus(parent, "done", 30*time.Second)
	require.Equal(t, "done", b.row(child).Status)
	waited := time.Duration(rejoinedAt.Load() - failedAt.Load())
	require.GreaterOrEqual(t, waited, backoff-500*time.Millisecond, "the join ran again %s after it failed", waited)
}

// TestARetriedWaitKeepsItsTime: an instance cancelled while it waited — a
// RunIn, a durable sleep (Next(…).After) — waits out the rest of that wait
// when retried (a probe: a reminder due in an hour, cancelled by mistake
// and retried, ran at once), by Retry and RetryMany; RunNow then runs it.
func TestARetriedWaitKeepsItsTime(t *testing.T) {
	t.Parallel()
	ran := make(chan int64, 8)
	job := &gendurable.Job[orderArgs]{Name: "later", Perform: func(_ context.Context, r *gendurable.Run[orderArgs]) error {
		ran <- r.ID
		return nil
	}}
	sleeper := &gendurable.Machine[orderArgs]{Name: "sleeper", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(_ context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			return r.Next("b", r.State).After(time.Hour), nil
		},
		"b": func(_ context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			ran <- r.ID
			return gendurable.Done(nil), nil
		},
	}}
	b := setup(t, nil, job, sleeper)
	b.start()
	ctx := context.Background()
	scheduled := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	asleep := b.insert(sleeper.New(orderArgs{}))
	require.Eventually(t, func() bool {
		r := b.row(asleep)
		return r.Step == "b" && r.Status == "runnable"
	}, 10*time.Second, 10*time.Millisecond)
	due := map[int64]time.Time{scheduled: b.row(scheduled).EligibleAt, asleep: b.row(asleep).EligibleAt}
	for id := range due {
		require.NoError(t, b.eng.Cancel(ctx, id, "by mistake"))
	}
	require.NoError(t, b.eng.Retry(ctx, scheduled))
	res, err := b.eng.RetryMany(ctx, []int64{asleep})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Changed, "%+v", res)
	for id, at := range due {
		r := b.row(id)
		require.Equal(t, "runnable", r.Status, "instance %d", id)
		require.WithinDuration(t, at, r.EligibleAt, time.Millisecond, "instance %d: its wait is kept", id)
		require.Greater(t, r.EligibleAt.Sub(r.Now), 50*time.Minute, "instance %d", id)
	}
	select {
	case id := <-ran:
		t.Fatalf("instance %d ran at once after its retry", id)
	case <-time.After(300 * time.Millisecond):
	}
	for id := range due {
		require.NoError(t, b.eng.RunNow(ctx, id))
	}
	got := map[int64]bool{}
	for range due {
		select {
		case id := <-ran:
			got[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("ran %v after RunNow, want both", got)
		}
	}
}
