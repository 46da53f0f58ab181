package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestOutcomeNextCommitsStateBeforeNextStep(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "next"}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"do":"next","n":1}`, string(r.Result), "step b saw the state step a committed")
	require.Equal(t, "b", r.Step)
	require.Equal(t, 0, r.Attempt)
	require.Nil(t, r.LeaseExp)
	require.Nil(t, r.Token)
	require.NotNil(t, r.FinishedAt)
	require.Empty(t, r.Errors)
}

// TestOutcomeNextIsCommittedWhenTheNextStepStarts: the state step a
// returned is in the database, not only in the worker's memory, by the time
// step b starts (a Next chains to the same worker, which hands b the state
// itself: the row is what a crash would leave).
func TestOutcomeNextIsCommittedWhenTheNextStepStarts(t *testing.T) {
	t.Parallel()
	db := gendurabletest.NewDB(t, nil)
	type seen struct {
		step, status string
		state        []byte
	}
	got := make(chan seen, 1)
	m := &gendurable.Machine[probeState]{
		Name: "committed", Start: "a",
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(_ context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return r.Next("b", probeState{Do: "next", N: r.State.N + 1}), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				var s seen
				err := db.Pool.QueryRow(ctx, "SELECT step, status, state::text FROM "+
					pgx.Identifier{db.Schema, "gendurable_instances"}.Sanitize()+" WHERE id = $1", r.ID).Scan(&s.step, &s.status, &s.state)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				select {
				case got <- s:
				default:
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	b := bundleOn(t, db.Pool, db.Schema, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "next"}))
	b.waitStatus(id, "done", 10*time.Second)
	s := <-got
	require.Equal(t, "b", s.step, "the row's step when b started")
	require.Equal(t, "executing", s.status)
	require.JSONEq(t, `{"do":"next","n":1}`, string(s.state), "the row's state when b started")
}

func TestOutcomeNextAfterIsDurableSleep(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "next_delay"}))
	eventually(t, 10*time.Second, func() bool { return b.row(id).Step == "b" }, "step a never ran")
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, 0, r.Attempt)
	require.JSONEq(t, `{"do":"next_delay","n":1}`, string(r.State))
	near(t, r.Now.Add(time.Hour), r.EligibleAt, time.Minute)
	require.Nil(t, r.LeaseExp)
	require.Nil(t, r.Token)
}

func TestOutcomeReplay(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "replay"}))
	eventually(t, 10*time.Second, func() bool { return b.row(id).Attempt == 1 }, "replay never committed")
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, "a", r.Step)
	require.JSONEq(t, `{"do":"replay","n":1}`, string(r.State))
	near(t, r.Now.Add(time.Hour), r.EligibleAt, time.Minute)
	require.Nil(t, r.LeaseExp)
	require.Nil(t, r.Token)
	require.Empty(t, r.Errors, "a replay chosen by the step is not an error")
}

func TestOutcomeDone(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "done"}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"n":1}`, string(r.Result))
	require.Equal(t, "a", r.Step, "Done keeps the step")
	require.JSONEq(t, `{"do":"done","n":0}`, string(r.State), "Done keeps the state")
	require.Nil(t, r.LeaseExp)
	require.Nil(t, r.Token)
	require.NotNil(t, r.FinishedAt)
}

func TestOutcomeStop(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	m := probeMachine(&handled)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "stop"}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "a", r.Step)
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "stop", r.Errors[0]["kind"])
	require.Equal(t, "told to stop", r.Errors[0]["error"])
	require.NotNil(t, r.FinishedAt)
	require.Zero(t, handled.Load(), "Stop is an outcome, not an error: Handle is not called")
}

func TestInvalidOutcomesAreHandledErrors(t *testing.T) {
	t.Parallel()
	for _, do := range []string{"invalid_step", "zero", "bad_result"} {
		t.Run(do, func(t *testing.T) {
			t.Parallel()
			var handled atomic.Int32
			m := probeMachine(&handled)
			b := setup(t, nil, m)
			b.start()
			id := b.insert(m.New(probeState{Do: do}))
			r := b.waitStatus(id, "failed", 10*time.Second)
			require.Equal(t, int32(3), handled.Load(), "each invalid outcome went to Handle")
			require.Contains(t, r.Errors[0]["error"], "invalid outcome")
		})
	}
}

func TestFanOutFanIn(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	cfg := fastConfig("", parent, leaf)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 8, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	id := b.insert(parent.New(fanState{Width: 5, Fail: true}))
	// While children run, the parent says what it waits for.
	eventually(t, 10*time.Second, func() bool { return b.row(id).Status == "awaiting_children" || b.row(id).Status == "done" }, "never parked")
	if b.row(id).Status == "awaiting_children" {
		w, err := b.eng.WaitReason(ctx, id)
		require.NoError(t, err)
		if w.Status == gendurable.StatusAwaitingChildren { // it may have finished in between
			require.Equal(t, 5, w.ChildrenTotal)
		}
	}
	r := b.waitStatus(id, "done", 20*time.Second)
	var s fanState
	require.NoError(t, jsonUnmarshal(r.Result, &s))
	require.Equal(t, 1, s.Resumes, "the parent resumed exactly once, after its last child")
	require.Len(t, s.Seen, 5)
	require.Equal(t, "leaf:failed", s.Seen[0], "a failed child still counts towards the fan-in")
	for _, seen := range s.Seen[1:] {
		require.Equal(t, "leaf:done", seen)
	}
	require.Equal(t, 5, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id = $1`, id))
	require.Equal(t, 0, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, id))
}

func TestNestedFanOut(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	cfg := fastConfig("", parent, leaf)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 10, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	id := b.insert(parent.New(fanState{Width: 3, Depth: 2})) // 3 + 9 sub-parents' … 27 leaves
	s, err := gendurable.WaitResult[fanState](t.Context(), b.eng, id)
	require.NoError(t, err)
	require.Equal(t, 3+9+27, s.ChildSum, "every descendant finished before its ancestor resumed")
	require.Equal(t, 1+3+9+27, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`))
}

func TestZeroChildrenRunsOnAtOnce(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	b := setup(t, nil, parent, leaf)
	b.start()
	id := b.insert(parent.New(fanState{Width: 0}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"width":0,"depth":0,"resumes":1}`, string(r.Result))
}

func TestInvalidChildIsAnInvalidOutcome(t *testing.T) {
	t.Parallel()
	ghost := &gendurable.Job[leafArgs]{Name: "ghost", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	m := &gendurable.Machine[fanState]{
		Name: "badkids", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[fanState]{
			"a": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("a", r.State, ghost.New(leafArgs{})), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(fanState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Contains(t, r.Errors[0]["error"], "machine not registered")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id IS NOT NULL`))
}

// TestTransactionalOutcome: the step's own writes commit with its outcome,
// exactly once even when the step runs twice, and roll back when the
// callback fails.
func TestTransactionalOutcome(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var mu sync.Mutex
	m := &gendurable.Machine[leafArgs]{
		Name: "ledger", Start: "post", MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[leafArgs]{
			"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
				calls.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					mu.Lock()
					defer mu.Unlock()
					if _, err := tx.Exec(ctx, `INSERT INTO ledger_`+r.Queue+` (instance, amount) VALUES ($1, $2)`, r.ID, r.State.N); err != nil {
						return err
					}
					if r.State.Fail && r.Attempt == 0 {
						return errors.New("ledger rejected the first try")
					}
					return nil
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.Queues = map[string]gendurable.QueueConfig{"tx": {PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.exec(`CREATE TABLE ledger_tx (instance bigint, amount int)`)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP TABLE IF EXISTS ledger_tx`) })
	b.start()
	ctx := context.Background()
	ok, err := b.eng.Insert(ctx, m.New(leafArgs{N: 10}).With(gendurable.InsertOpts{Queue: "tx"}))
	require.NoError(t, err)
	flaky, err := b.eng.Insert(ctx, m.New(leafArgs{N: 20, Fail: true}).With(gendurable.InsertOpts{Queue: "tx"}))
	require.NoError(t, err)
	b.waitStatus(ok.ID, "done", 10*time.Second)
	r := b.waitStatus(flaky.ID, "done", 10*time.Second)
	require.Equal(t, 1, r.Attempt, "the failed callback went to Handle, which replayed")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM ledger_tx WHERE instance = $1`, ok.ID))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM ledger_tx WHERE instance = $1`, flaky.ID), "the failed try's write was rolled back")
}

// TestAWithTxCallbackThatEndsItsTransactionFailsTheStep: a callback that
// sends ROLLBACK (or COMMIT) as a statement ends the engine's transaction
// itself: the step fails, saying so, and the outcome is not written apart
// from the step's writes. Before, after a ROLLBACK the instance was done
// with the step's writes gone (a library-misuse probe).
func TestAWithTxCallbackThatEndsItsTransactionFailsTheStep(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{
		Name: "ender", Start: "post", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[probeState]{
			"post": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO ledger_end (instance) VALUES ($1)`, r.ID); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, r.State.Do)
					return err
				}), nil
			},
		},
	}
	b := setup(t, fastConfig("", m))
	b.exec(`CREATE TABLE ledger_end (instance bigint)`)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP TABLE IF EXISTS ledger_end`) })
	b.start()
	for _, end := range []string{"ROLLBACK", "COMMIT"} {
		id := b.insert(m.New(probeState{Do: end}))
		r := b.waitStatus(id, "failed", 10*time.Second)
		require.Contains(t, r.Errors[len(r.Errors)-1]["error"], "ended the step's transaction itself", end)
		want := map[string]int{"ROLLBACK": 0, "COMMIT": 1}[end]
		require.Equal(t, want, b.count(`SELECT count(*) FROM ledger_end WHERE instance = $1`, id), end)
	}
}

// TestFencedTransactionalOutcomeRollsBack: a zombie's WithTx writes vanish
// with its fenced-out outcome.
func TestFencedTransactionalOutcomeRollsBack(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	m := &gendurable.Machine[leafArgs]{
		Name: "zledger", Start: "post",
		Steps: map[string]gendurable.StepFunc[leafArgs]{
			"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
				close(started)
				<-release
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO zledger (instance) VALUES ($1)`, r.ID)
					return err
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.ReaperInterval = -1
	b := setup(t, cfg)
	b.exec(`CREATE TABLE zledger (instance bigint)`)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP TABLE IF EXISTS zledger`) })
	b.start()
	id := b.insert(m.New(leafArgs{}))
	<-started
	// The lease is taken away (reaped, then claimed by someone else).
	b.exec(`UPDATE {{s}}.gendurable_instances SET claim_token = -1 WHERE id = $1`, id)
	close(release)
	time.Sleep(300 * time.Millisecond)
	require.Zero(t, b.count(`SELECT count(*) FROM zledger`), "the zombie's own writes rolled back with its outcome")
	require.Equal(t, "executing", b.row(id).Status)
}

// README: ScheduleChildren's children are inserted in the same statement
// that parks the parent — the statement fenced by the claim token — so a
// fan-out whose claim is gone inserts no child (design §1: a fenced outcome
// changes nothing at all), and the parent keeps its step.
func TestFencedFanOutInsertsNoChildren(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	leaf := &gendurable.Job[leafArgs]{Name: "zfleaf", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	m := &gendurable.Machine[fanState]{
		Name: "zfan", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				close(started)
				<-release
				return r.ScheduleChildren("join", r.State, leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	cfg := fastConfig("", m, leaf)
	cfg.ReaperInterval = -1
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(fanState{}))
	<-started
	// The lease is taken away (reaped, then claimed by someone else).
	b.exec(`UPDATE {{s}}.gendurable_instances SET claim_token = -1 WHERE id = $1`, id)
	close(release)
	time.Sleep(300 * time.Millisecond)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id <> $1`, id), "the zombie's fan-out inserted children")
	r := b.row(id)
	require.Equal(t, "executing", r.Status)
	require.Equal(t, "spawn", r.Step)
}

// A retried child of an earlier fan-out does not count against the
// parent's current fan-out.
func TestRetriedChildOfAnEarlierFanOutDoesNotWakeTheParent(t *testing.T) {
	t.Parallel()
	releaseC := make(chan struct{})
	var secondJoinSaw atomic.Value
	leaf := &gendurable.Job[leafArgs]{Name: "gleaf", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		switch j.State.N {
		case 1:
			if j.Attempt == 0 && j.MaxAttempts == 1 && !j.State.Fail {
				return gendurable.JobCancel(context.Canceled)
			}
		case 3:
			<-releaseC
		}
		return nil
	}}
	m := &gendurable.Machine[fanState]{
		Name: "gens", Start: "one",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"one": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("two", r.State, leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})), nil
			},
			"two": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("three", r.State, leaf.New(leafArgs{N: 3})), nil
			},
			"three": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				secondJoinSaw.Store(len(r.Children))
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, m, leaf)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(fanState{}))
	b.waitStatus(id, "awaiting_children", 10*time.Second)
	eventually(t, 10*time.Second, func() bool { return b.row(id).Step == "three" }, "second fan-out not reached")
	var failedChild int64
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1 AND status = 'failed'`, b.schema), id).Scan(&failedChild))
	// Make the retry succeed, then retry the first fan-out's failed child.
	b.exec(`UPDATE {{s}}.gendurable_instances SET state = '{"n":1,"fail":true}' WHERE id = $1`, failedChild)
	require.NoError(t, b.eng.Retry(ctx, failedChild))
	b.waitStatus(failedChild, "done", 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, "awaiting_children", b.row(id).Status, "the parent still waits for its current child")
	close(releaseC)
	b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 1, secondJoinSaw.Load(), "the join sees only its own fan-out's children")
}

// TestWokenParentWaitsForTheLeaseOfItsCancelledStep: a parent whose step was
// cancelled while a child of its current fan-out was live (the child had
// been cancelled, which woke the parent, and retried) keeps that step's
// lease; retried, it awaits the child again and is eligible when the lease
// ends. The child finishing before then must not make it eligible at once:
// its next step would run beside the cancelled one, which runs until its
// worker's next heartbeat (docs/design.md §6).
func TestWokenParentWaitsForTheLeaseOfItsCancelledStep(t *testing.T) {
	t.Parallel()
	var leafRuns atomic.Int32
	leafStarted := make(chan int32, 4)
	finish := make(chan struct{})
	leaf := &gendurable.Job[leafArgs]{Name: "wleaf", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		n := leafRuns.Add(1)
		leafStarted <- n
		if n == 1 {
			<-ctx.Done() // cancelled
			return ctx.Err()
		}
		select {
		case <-finish:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	var mu sync.Mutex
	running, most := 0, 0
	var starts []time.Time
	workStarted := make(chan struct{}, 4)
	m := &gendurable.Machine[fanState]{Name: "wparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("work", r.State, leaf.New(leafArgs{})), nil
			},
			"work": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				mu.Lock()
				running++
				most = max(most, running)
				starts = append(starts, time.Now())
				first := len(starts) == 1
				mu.Unlock()
				defer func() { mu.Lock(); running--; mu.Unlock() }()
				workStarted <- struct{}{}
				if first {
					<-ctx.Done() // cancelled: runs until its worker's next heartbeat
					return gendurable.Outcome{}, ctx.Err()
				}
				return gendurable.Done("ok"), nil
			},
		}}
	b := setup(t, fastConfig("", m, leaf)) // lease 3s, heartbeat 1s
	b.start()
	ctx := context.Background()
	parent := b.insert(m.New(fanState{}))
	require.Equal(t, int32(1), <-leafStarted)
	var child int64
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1`, b.schema), parent).Scan(&child))
	require.NoError(t, b.eng.Cancel(ctx, child, "operator")) // the parent counts it finished and runs "work"
	<-workStarted
	require.NoError(t, b.eng.Retry(ctx, child)) // live again, of the parent's current fan-out
	select {
	case n := <-leafStarted:
		require.Equal(t, int32(2), n)
	case <-time.After(10 * time.Second):
		t.Fatal("the retried child did not run")
	}
	require.NoError(t, b.eng.Cancel(ctx, parent, "operator")) // "work" is running: the lease stays
	require.NoError(t, b.eng.Retry(ctx, parent))
	p := b.row(parent)
	require.Equal(t, "awaiting_children", p.Status, "a child of its fan-out is live")
	require.NotNil(t, p.LeaseExp, "the cancelled step's lease is kept")
	lease := *p.LeaseExp
	close(finish) // the child finishes: the parent wakes, but its cancelled step's lease is live
	b.waitStatus(parent, "done", 15*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, 2)
	require.Equal(t, 1, most, "the woken parent's next step ran beside its cancelled step")
	require.False(t, starts[1].Before(lease), "the woken parent ran at %v, before its cancelled step's lease ended at %v", starts[1], lease)
}

// TestAwaitTimeoutOfARemainingTime pins what Timeout does with the
// remaining time of a deadline computed with time.Until: 0 means no deadline
// (as a zero StepTimeout means none) and the instance awaits for good; a
// negative one is an invalid outcome, retried until the attempts are spent;
// max(d, time.Nanosecond), as the godoc says, times out at once.
func TestAwaitTimeoutOfARemainingTime(t *testing.T) {
	t.Parallel()
	remaining := map[string]time.Duration{"zero": 0, "negative": -time.Second, "clamped": max(-time.Second, time.Nanosecond)}
	m := &gendurable.Machine[probeState]{Name: "remaining", Start: "park", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return time.Millisecond },
		Steps: map[string]gendurable.StepFunc[probeState]{
			"park": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "pay").Timeout(remaining[r.State.Do]), nil
			},
			"woken": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Awaited)), nil
			},
		}}
	b := setup(t, nil, m)
	b.start()
	zero := b.insert(m.New(probeState{Do: "zero"}))
	negative := b.insert(m.New(probeState{Do: "negative"}))
	clamped := b.insert(m.New(probeState{Do: "clamped"}))

	r := b.waitStatus(clamped, "done", 10*time.Second)
	require.JSONEq(t, `0`, string(r.Result), "timed out at once")
	r = b.waitStatus(negative, "failed", 10*time.Second)
	require.Len(t, r.Errors, 2)
	require.Contains(t, r.Errors[1]["error"], "negative await timeout -1s")
	b.waitStatus(zero, "awaiting_signal", 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	w, err := b.eng.WaitReason(context.Background(), zero)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAwaitingSignal, w.Status)
	require.Nil(t, w.Deadline, "Timeout(0) is no deadline")
}

// TestAParentLockedByASignalTxHoldsUpOnlyItsChild: a caller's SignalTx
// left open on a parent holds the parent's row lock; its child's Done
// waits for it. Steps of other instances that finished at the same moment,
// whose outcomes were group-committed with the child's, are written at once
// (the batch is split when its statement runs out of the committer's lock
// wait), and the child's once the caller commits. Before, the whole batch
// waited on the lock; it outlasted the lease, and every step of the batch
// failed with MaxAttempts 1 though it had returned (a probe: 10 of 12).
func TestAParentLockedByASignalTxHoldsUpOnlyItsChild(t *testing.T) {
	t.Parallel()
	const others, lease, held = 11, 2 * time.Second, 4 * time.Second
	g := newLockedParentGate()
	kid := g.job("lockkid")
	other := g.job("lockother")
	parent := g.parent("lockparent", kid)
	cfg := fastConfig("", parent, kid, other)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 16, PollInterval: 10 * time.Millisecond}}
	cfg.LeaseDuration, cfg.HeartbeatInterval = lease, 500*time.Millisecond
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	pid := b.insert(parent.New(struct{}{}))
	eventually(t, 10*time.Second, func() bool { return g.inStep.Load() == 1 }, "the child never started")
	ids := make([]int64, others)
	for i := range ids {
		ids[i] = b.insert(other.New(leafArgs{}))
	}
	eventually(t, 10*time.Second, func() bool { return g.inStep.Load() == 1+others }, "the other jobs never started")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.eng.SignalTx(ctx, tx, pid, "note", nil, nil)
	require.NoError(t, err)
	close(g.barrier) // every step returns at once
	returned := time.Now()
	for _, id := range ids {
		for b.row(id).Status != "done" {
			// Before the parent's lock goes (their batch is split after a
			// few 250 ms lock waits), and in time: without, they failed at
			// the lease's end.
			require.Less(t, time.Since(returned), held-500*time.Millisecond, "job %d (%s) is held up by the child's parent", id, b.row(id).Status)
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(held - time.Since(returned))
	require.NoError(t, tx.Commit(ctx))
	r := b.waitStatus(pid, "done", 10*time.Second)
	require.Empty(t, r.Errors)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id = $1 AND status = 'done'`, pid),
		"the child's Done was written once the parent's lock went")
}

// TestStopIsNotHeldUpByAParkedOutcome: a child's Done parked on its parent,
// which a caller's open SignalTx holds, does not hold up a Stop without a
// deadline for longer than about a lease: once the steps are drained the
// committer gives it up (its row is reaped after its lease), and Stop's
// error says it did. Without that
// bound Stop waited for as long as the caller kept its lock.
func TestStopIsNotHeldUpByAParkedOutcome(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	g := newLockedParentGate()
	kid := g.job("stopkid")
	parent := g.parent("stopparent", kid)
	cfg := fastConfig("", parent, kid)
	cfg.LeaseDuration, cfg.HeartbeatInterval = lease, 500*time.Millisecond
	b := setup(t, cfg)
	require.NoError(t, b.eng.Start(context.Background()))
	ctx := context.Background()
	pid := b.insert(parent.New(struct{}{}))
	eventually(t, 10*time.Second, func() bool { return g.inStep.Load() == 1 }, "the child never started")
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.eng.SignalTx(ctx, tx, pid, "note", nil, nil)
	require.NoError(t, err)
	close(g.barrier)
	time.Sleep(time.Second) // the child's Done ran out of its lock wait and was parked
	start := time.Now()
	err = b.eng.Stop(context.Background())
	took := time.Since(start)
	t.Logf("Stop took %v with the parent held: %v", took.Round(time.Millisecond), err)
	require.ErrorContains(t, err, "1 outcomes were not written while the engine stopped", "Stop says it gave the outcome up")
	require.Less(t, took, 2*lease+time.Second, "Stop waited for the caller's lock")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id = $1 AND status = 'done'`, pid),
		"the parked Done was given up, not written")
}

// lockedParentGate holds the steps of jobs until barrier is closed,
// counting those that started (the tests of a parent a caller holds
// locked while its child finishes).
type lockedParentGate struct {
	barrier chan struct{}
	inStep  atomic.Int32
}

func newLockedParentGate() *lockedParentGate {
	return &lockedParentGate{barrier: make(chan struct{})}
}

// job is a job with MaxAttempts 1 whose step waits for the barrier.
func (g *lockedParentGate) job(name string) *gendurable.Job[leafArgs] {
	return &gendurable.Job[leafArgs]{Name: name, MaxAttempts: 1, Perform: func(ctx context.Context, _ *gendurable.Run[leafArgs]) error {
		g.inStep.Add(1)
		select {
		case <-g.barrier:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

// parent is a machine that schedules one child of kid, then finishes.
func (g *lockedParentGate) parent(name string, kid *gendurable.Job[leafArgs]) *gendurable.Machine[struct{}] {
	return &gendurable.Machine[struct{}]{Name: name, Start: "fan", Steps: map[string]gendurable.StepFunc[struct{}]{
		"fan": func(ctx context.Context, r *gendurable.Run[struct{}]) (gendurable.Outcome, error) {
			return r.ScheduleChildren("join", r.State, kid.New(leafArgs{})), nil
		},
		"join": func(ctx context.Context, r *gendurable.Run[struct{}]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		},
	}}
}

// TestAChainedStepWhoseAnswerIsLostRunsUncharged (a crash probe): a
// chained Next whose statement committed while the worker's connection lost
// the answer. The committer's retry found the outcome fenced out by its own
// write; the next step, claimed by the lost attempt, sat executing with
// nobody running it until its lease ran out, and the reaper charged it an
// attempt it never had: with MaxAttempts 1 the instance failed at a step
// that never ran. The retry now recognises what the lost attempt wrote
// (schema version 19) and the worker runs the chained step, uncharged.
func TestAChainedStepWhoseAnswerIsLostRunsUncharged(t *testing.T) {
	t.Parallel()
	// A lease of 12 s: each outcome statement may wait 1 s for a row lock,
	// time to strand the connection while it waits; the retry follows the
	// stranded attempt's timeout (half the lease), and the look needs a
	// quarter of it left: 3 s to spare under a loaded suite.
	const lease = 12 * time.Second
	gate := make(chan struct{})
	var aRuns, bRuns atomic.Int64
	m := &gendurable.Machine[int]{Name: "lostchain", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(ctx context.Context, r *gendurable.Run[int]) (gendurable.Outcome, error) {
			aRuns.Add(1)
			select {
			case <-gate:
			case <-ctx.Done():
				return gendurable.Outcome{}, context.Cause(ctx)
			}
			return r.Next("b", r.State+1), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[int]) (gendurable.Outcome, error) {
			bRuns.Add(1)
			return gendurable.Done(r.State), nil
		},
	}}
	short := func(cfg *gendurable.Config) *gendurable.Config {
		cfg.LeaseDuration, cfg.HeartbeatInterval = lease, 2*time.Second
		return cfg
	}
	b := setup(t, short(fastConfig("", m)), m)
	ctx := context.Background()
	res, err := b.eng.Insert(ctx, m.New(0).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)
	id := res.ID

	// The worker reaches the server through a proxy that can strand its connections.
	_, proxy := b.proxiedEngine(short(fastConfig(b.schema, m)))
	b.waitStatus(id, "executing", 10*time.Second)

	// Step a's outcome waits on its row lock; the connections are stranded;
	// then the outcome commits, chaining b, and its answer is lost.
	tx, pid := b.lockRows(id)
	close(gate)
	eventually(t, 5*time.Second, func() bool { return b.blockedBy(pid, "cont_asked") > 0 },
		"step a's outcome does not wait on its row's lock")
	proxy.Strand()
	require.NoError(t, tx.Rollback(ctx))
	eventually(t, 5*time.Second, func() bool { return b.row(id).Step == "b" }, "step a's outcome did not commit")

	r := b.waitStatus(id, "done", 30*time.Second)
	require.Equal(t, int64(1), aRuns.Load())
	require.Equal(t, int64(1), bRuns.Load(), "step b ran more than once, or never")
	require.Equal(t, 0, r.Attempt, "step b was charged an attempt")
	require.Empty(t, r.Errors, "step b's claim was reaped")
	require.JSONEq(t, "1", string(r.Result))
}

// TestAwaitOfTooManyNamesIsInvalid: an Await may wait for at most
// MaxAwaitNames names. The names are stored with the row and shown whole:
// a hostile probe's Await of 100,000 valid names made the page grow with them.
func TestAwaitOfTooManyNamesIsInvalid(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[orderArgs]{Name: "aw", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		},
	}}
	names := make([]string, gendurable.MaxAwaitNames+1)
	for i := range names {
		names[i] = fmt.Sprintf("signal-%d", i)
	}
	r := &gendurable.Run[orderArgs]{}
	require.NoError(t, m.ValidateOutcome("a", r.Await("a", orderArgs{}, names[:gendurable.MaxAwaitNames]...)))
	err := m.ValidateOutcome("a", r.Await("a", orderArgs{}, names...))
	require.ErrorIs(t, err, gendurable.ErrInvalidOutcome)
	require.ErrorContains(t, err, "more than 100")
}

// TestAFanOutAndAnInsertManyOfOverlappingUniqueKeysDoNotDeadlock: a
// fan-out's children go in in the order of their unique keys, as an
// InsertMany's rows do, so the two never wait for each other in a cycle; their
// ids keep the order the step listed them in (Run.Children's). A fault
// probe: a fan-out listing keys in descending order and an InsertMany of
// the same keys, at the same moment, deadlocked (the InsertMany failed with
// SQLSTATE 40P01 in 6 of 20 rounds; two such fan-outs met lock timeouts and
// outlived their leases). Here the moment is built: a third transaction
// holds one key of the middle while the InsertMany waits on it and the
// fan-out comes to it, then rolls back; the InsertMany's session detects a
// deadlock after 20 ms.
func TestAFanOutAndAnInsertManyOfOverlappingUniqueKeysDoNotDeadlock(t *testing.T) {
	t.Parallel()
	const keys = 60
	key := func(k int) gendurable.InsertOpts {
		return gendurable.InsertOpts{UniqueKey: fmt.Sprintf("k%03d", k), UniqueScope: gendurable.UniqueForever}
	}
	leaf := &gendurable.Job[leafArgs]{Name: "dleaf", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	var spawns atomic.Int32
	joined := make(chan []gendurable.Child, 2)
	m := &gendurable.Machine[fanState]{
		Name: "dfan", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				spawns.Add(1)
				var kids []gendurable.InsertParams
				for k := keys - 1; k >= 0; k-- { // descending
					kids = append(kids, leaf.New(leafArgs{N: k + 1000*r.State.Width}).With(key(k+1000*r.State.Width)))
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				joined <- r.Children
				return gendurable.Done(len(r.Children)), nil
			},
		},
	}
	b := setup(t, nil, m, leaf)
	cfg := fastConfig(b.schema, m, leaf)
	// A long lease: the outcome's lock wait is its cap, a second, which the
	// wait observed below falls in.
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 5*time.Second
	b = bundleOn(t, b.pool, b.schema, cfg)
	ctx := context.Background()

	// The key in the middle, held uncommitted.
	hold, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(ctx) })
	_, err = b.eng.InsertTx(ctx, hold, leaf.New(leafArgs{N: -1}).With(key(keys/2)))
	require.NoError(t, err)
	holder := int(hold.Conn().PgConn().PID())

	// The InsertMany: every key, in its own transaction, detecting a
	// deadlock after 20 ms (the default second would let the fan-out's
	// own lock timeout end the cycle first).
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '20ms'`); err != nil {
		t.Skipf("deadlock_timeout needs a superuser: %v", err)
	}
	many := int(tx.Conn().PgConn().PID())
	var batch []gendurable.InsertParams
	for k := range keys {
		batch = append(batch, leaf.New(leafArgs{N: k}).With(key(k)))
	}
	manyErr := make(chan error, 1)
	go func() {
		_, err := b.eng.InsertManyTx(ctx, tx, batch)
		if err == nil {
			err = tx.Commit(ctx)
		}
		manyErr <- err
	}()
	require.Eventually(t, func() bool { return b.blockedBy(holder, "") == 1 }, 10*time.Second, 5*time.Millisecond,
		"the InsertMany waits for the held key")

	// The fan-out of the same keys, descending, until its insert waits too.
	b.start()
	id := b.insert(m.New(fanState{}))
	require.Eventually(t, func() bool {
		// Waiting for the held key (children in the step's order) or for
		// the InsertMany (in the keys' order, from the first).
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE pg_blocking_pids(pid) && $1::int[]
			AND strpos(query, 'WITH locked AS') > 0`, []int{holder, many}) == 1
	}, 20*time.Second, time.Millisecond, "the fan-out's insert waits")
	require.NoError(t, hold.Rollback(ctx))

	require.NoError(t, <-manyErr, "the InsertMany and the fan-out waited for each other")
	b.waitStatus(id, "done", 20*time.Second)
	require.Equal(t, int32(1), spawns.Load(), "the fan-out's outcome committed the first time")
	require.Equal(t, keys, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'dleaf'`), "one row per key")
	require.Empty(t, <-joined, "every key was the InsertMany's: the fan-out's children were duplicates")

	// Children of fresh keys: ids, and Run.Children, in the order the step
	// listed them (descending keys), not the order they went in.
	id = b.insert(m.New(fanState{Width: 1}))
	b.waitStatus(id, "done", 20*time.Second)
	children := <-joined
	require.Len(t, children, keys)
	type kid struct{ ID, N int64 }
	rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id, (state->>'n')::bigint FROM {{s}}.gendurable_instances WHERE parent_id = $1 ORDER BY id`, b.schema), id)
	require.NoError(t, err)
	kids, err := pgx.CollectRows(rows, pgx.RowToStructByPos[kid])
	require.NoError(t, err)
	require.Len(t, kids, keys)
	for i, k := range kids {
		require.EqualValues(t, 1000+keys-1-i, k.N, "child %d's id", i)
		require.Equal(t, children[i].ID, k.ID, "Run.Children in id order")
	}
}

// TestAWithTxCommitWhoseAnswerIsLostIsNotReportedFenced: a WithTx
// outcome's COMMIT reaches the server and commits, its answer is lost, and
// the lease is gone before the worker learns more: the step's event says
// the outcome is not confirmed (CommitErr: it may have been written), not
// Fenced ("nothing was written"). A cut-off probe: the committed WithTx
// writes, and the outcome, were reported as fenced out in 5 of 5 runs. The
// COMMIT is held on the server by a deferred trigger's sleep while the
// worker's connections are stranded.
func TestAWithTxCommitWhoseAnswerIsLostIsNotReportedFenced(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var schema string // the test's, once known
	m := &gendurable.Machine[int]{Name: "lostcommit", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(ctx context.Context, r *gendurable.Run[int]) (gendurable.Outcome, error) {
			runs.Add(1)
			return gendurable.Done(r.State).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, replaceSchema(`INSERT INTO {{s}}.side VALUES ($1)`, schema), r.ID)
				return err
			}), nil
		},
	}}
	b := setup(t, nil, m)
	schema = b.schema
	b.exec(`CREATE TABLE {{s}}.side (id bigint)`)
	b.exec(`CREATE FUNCTION {{s}}.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$`)
	b.exec(`CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON {{s}}.side DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{s}}.slow()`)
	log := &eventLog{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{log}
	_, proxy := b.proxiedEngine(cfg)
	id := b.insert(m.New(7))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query ILIKE 'commit%'`) > 0
	}, "the WithTx transaction's COMMIT does not run the deferred trigger")
	proxy.Strand()
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, "7", string(r.Result))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.side WHERE id = $1`, id), "the WithTx write committed once")
	var ev *gendurable.StepEvent
	eventually(t, 20*time.Second, func() bool {
		e, ok := findEvent(log, func(e *gendurable.StepEvent) bool { return e.InstanceID == id })
		ev = e
		return ok
	}, "no event for the step whose commit answer was lost")
	require.False(t, ev.Fenced, "reported fenced out (nothing written), yet its COMMIT committed")
	require.Error(t, ev.CommitErr)
	require.Contains(t, ev.CommitErr.Error(), "may have been written")
	require.Equal(t, int32(1), runs.Load())
}
