package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A machine that reads its whole inbox still wakes at once on a signal
// that arrived before it awaited; after a wake on one name, a pre-arrived
// signal of another awaited name wakes it at once too.
func TestAwaitSeesPreArrivedSignalsItHasNotReceived(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	m := &gendurable.Machine[waitState]{
		Name: "prearrived", Start: "a", Inbox: true,
		Steps: map[string]gendurable.StepFunc[waitState]{
			"a": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "pay"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("c", r.State, "addr"), nil
			},
			"c": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				got.Store(len(r.Awaited))
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, m)
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	for _, name := range []string{"addr", "pay"} {
		_, err := b.eng.Signal(ctx, id, name, nil, nil)
		require.NoError(t, err)
	}
	b.start()
	b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 1, got.Load())
}

// A timeout after an earlier wake still shows an empty Awaited.
func TestTimeoutAfterAWakeShowsEmptyAwaited(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[waitState]{
		Name: "retimeout", Start: "a",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"a": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "pay"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				s := r.State
				s.Rounds++
				if s.Rounds == 1 {
					return r.Await("b", s, "pay").Timeout(200 * time.Millisecond), nil
				}
				s.TimedOut = len(r.Awaited) == 0
				s.Need = len(r.Inbox)
				return gendurable.Done(s), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(waitState{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	_, err := b.eng.Signal(context.Background(), id, "pay", nil, nil)
	require.NoError(t, err)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"timed_out":true,"rounds":2,"need":1}`, string(r.Result), "timed out; the earlier signal is still in the inbox")
}

// An open transaction holding one instance's row lock (a SignalTx) does not
// stall the heartbeat of the others in the queue. (Before, the batched
// heartbeat waited on that lock and every lease of the queue expired.)
func TestLockedRowDoesNotStallTheHeartbeat(t *testing.T) {
	t.Parallel()
	started := make(chan int64, 2)
	job := &gendurable.Job[orderArgs]{Name: "slowbeat", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		started <- j.ID
		select {
		case <-time.After(3 * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 1500*time.Millisecond, 300*time.Millisecond, 100*time.Millisecond
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	a := b.insert(job.New(orderArgs{I: 1}))
	other := b.insert(job.New(orderArgs{I: 2}))
	<-started
	<-started
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.eng.SignalTx(ctx, tx, a, "note", nil, nil) // holds a's row lock
	require.NoError(t, err)
	time.Sleep(2500 * time.Millisecond) // longer than the lease
	require.NoError(t, tx.Rollback(ctx))
	r := b.waitStatus(other, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "the other instance kept its lease")
	// The locked row itself could not be extended for longer than its lease,
	// so it may have been reaped once the lock went; it still finishes.
	b.waitStatus(a, "done", 10*time.Second)
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

// A WithTx outcome the database rejects stops the instance with the reason.
func TestRejectedTransactionalOutcomeStops(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "txnul", Start: "a", MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return r.Next("a", weirdState{Name: "nul\x00"}).WithTx(func(context.Context, pgx.Tx) error { return nil }), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "outcome_rejected", r.Errors[0]["kind"])
}

// When the partition lock's connection dies mid-step, the outcome is still
// written (through the pool) and the step does not run twice.
func TestOutcomeSurvivesADeadPartitionLockConnection(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	job := &gendurable.Job[spanArgs]{Name: "deadlock", Perform: func(ctx context.Context, j *gendurable.Run[spanArgs]) error {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return nil
	}}
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	id := b.insert(job.New(spanArgs{}).With(gendurable.InsertOpts{PartitionKey: "k-dead"}))
	<-started
	var pid int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()
		  AND l.classid::int = hashtext('gendurable:' || $1) LIMIT 1`, b.schema).Scan(&pid))
	_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	close(release)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, int32(1), runs.Load())
}
