package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

type receipt struct {
	Total int `json:"total"`
}

// TestWaitResultReturnsTheDecodedResultOrTheFailure: WaitResult blocks
// until the instance finishes and returns its Done result decoded, or a
// *FailedError for a failed one; ErrStateDecode for a result that does not
// decode into T; ErrNotFound for an unknown id; the context's error when it
// ends first. An engine that works no queue waits for instances finished
// elsewhere (by polling).
func TestWaitResultReturnsTheDecodedResultOrTheFailure(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	m := &gendurable.Machine[receipt]{Name: "result", Start: "a", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[receipt]{
		"a": func(ctx context.Context, r *gendurable.Run[receipt]) (gendurable.Outcome, error) {
			<-release
			if r.State.Total < 0 {
				return gendurable.Stop("negative total"), nil
			}
			return gendurable.Done(receipt{Total: r.State.Total * 2}), nil
		},
	}}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	ok := b.insert(m.New(receipt{Total: 21}))
	bad := b.insert(m.New(receipt{Total: -1}))

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := gendurable.WaitResult[receipt](short, b.eng, ok)
	require.ErrorIs(t, err, context.DeadlineExceeded, "still running")

	// Another engine on the same schema that works no queue: it polls.
	other, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{m}})
	require.NoError(t, err)
	got := make(chan receipt, 1)
	go func() {
		r, err := gendurable.WaitResult[receipt](ctx, other, ok)
		if err == nil {
			got <- r
		}
		close(got)
	}()
	close(release)
	r, err := gendurable.WaitResult[receipt](ctx, b.eng, ok)
	require.NoError(t, err)
	require.Equal(t, receipt{Total: 42}, r)
	// A result that does not decode into T is a typed error, not a zero T.
	_, err = gendurable.WaitResult[[]string](ctx, b.eng, ok)
	require.ErrorIs(t, err, gendurable.ErrStateDecode)
	require.NotErrorIs(t, err, gendurable.ErrInstanceFailed)
	// Its words name the result, not the state (a newcomer's probe).
	require.ErrorContains(t, err, fmt.Sprintf("gendurable: result does not decode: the Done result of instance %d into []string: json: cannot unmarshal", ok))
	var typeErr *json.UnmarshalTypeError
	require.ErrorAs(t, err, &typeErr, "the decoder's error is wrapped")
	// So is one whose UnmarshalJSON panics: the caller gets the error, not
	// the panic.
	_, err = gendurable.WaitResult[panickyResult](ctx, b.eng, ok)
	require.ErrorIs(t, err, gendurable.ErrStateDecode)
	require.ErrorContains(t, err, "its UnmarshalJSON panicked: result unmarshal panic")
	select {
	case r := <-got:
		require.Equal(t, receipt{Total: 42}, r, "the other engine got the result too")
	case <-time.After(10 * time.Second):
		t.Fatal("the polling waiter never returned")
	}

	_, err = gendurable.WaitResult[receipt](ctx, b.eng, bad)
	var f *gendurable.FailedError
	require.True(t, errors.As(err, &f), "%v", err)
	require.ErrorIs(t, err, gendurable.ErrInstanceFailed)
	require.Equal(t, bad, f.ID)
	require.Equal(t, "a", f.Step)
	require.Equal(t, "stop", f.Kind)
	require.Contains(t, f.Reason, "negative total")

	_, err = gendurable.WaitResult[receipt](ctx, b.eng, 987654321)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

// TestWaitResultEndsOnAReadThatFailsForGood: only a lost connection (or a
// server restarting) is polled through; any other failed read ends the
// wait at once with its error — here a schema never migrated.
func TestWaitResultEndsOnAReadThatFailsForGood(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = gendurable.WaitResult[any](ctx, eng, 1)
	require.ErrorIs(t, err, gendurable.ErrNotMigrated)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 10*time.Second, "the wait went on after a read that cannot succeed")
}

// TestWaitResultWakesAtOnceForLocalFinishes: a waiter on the engine whose
// step finishes the instance is woken by that step, not by its poll (which
// has backed off to a second by then): three times in a row within 150 ms
// of a release placed between two of its polls.
func TestWaitResultWakesAtOnceForLocalFinishes(t *testing.T) {
	t.Parallel()
	releases := make(chan chan struct{}, 1)
	job := &gendurable.Job[orderArgs]{Name: "result-wake", Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
		<-<-releases
		return nil
	}}
	b := setup(t, nil, job)
	b.start()
	for round := range 3 {
		release := make(chan struct{})
		releases <- release
		id := b.insert(job.New(orderArgs{I: round}))
		done := make(chan time.Time, 1)
		go func() {
			_, err := gendurable.WaitResult[struct{}](context.Background(), b.eng, id)
			if err == nil {
				done <- time.Now()
			}
			close(done)
		}()
		// The waiter polls at 10, 30, 70, … 1270, 2270, 3270 ms: release it
		// between two polls, far from both.
		time.Sleep(2700 * time.Millisecond)
		released := time.Now()
		close(release)
		select {
		case at, ok := <-done:
			require.True(t, ok, "WaitResult failed")
			// The next poll is 570 ms after the release: well under that,
			// the step's finish woke it (150 ms failed on a loaded machine).
			require.Less(t, at.Sub(released), 400*time.Millisecond, "round %d: woken by the poll, not by the step", round)
		case <-time.After(10 * time.Second):
			t.Fatal("WaitResult never returned")
		}
	}
}

// TestWaitResultRidesThroughLostConnections: the waiter's connections are
// terminated under it, three times, while it polls for an instance that
// another engine finishes afterwards: it still returns the result. Its
// first poll on a terminated connection used to end the wait with the
// error (57P01); a database restart did the same. A waiter whose context
// ends while its polls fail says what failed.
func TestWaitResultRidesThroughLostConnections(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	m := &gendurable.Machine[receipt]{Name: "result-lost", Start: "a", Steps: map[string]gendurable.StepFunc[receipt]{
		"a": func(ctx context.Context, r *gendurable.Run[receipt]) (gendurable.Outcome, error) {
			<-release
			return gendurable.Done(receipt{Total: 7}), nil
		},
	}}
	b := setup(t, nil, m)
	id := b.insert(m.New(receipt{}))
	b.start()
	finish := sync.OnceFunc(func() { close(release) })
	t.Cleanup(finish) // before the engine's Stop, if the test fails early

	ctx := context.Background()
	app := "waiter-" + b.schema
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	waiter, err := gendurable.New(pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{m}})
	require.NoError(t, err)

	type answer struct {
		r   receipt
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := gendurable.WaitResult[receipt](ctx, waiter, id)
		got <- answer{r, err}
	}()
	terminated := 0
	for range 3 {
		time.Sleep(60 * time.Millisecond) // a few polls on the pool's connections
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		terminated += n
		select {
		case a := <-got:
			t.Fatalf("WaitResult returned (%v, %v) after a connection was terminated", a.r, a.err)
		default:
		}
	}
	require.Positive(t, terminated, "no waiter connection was terminated")
	time.Sleep(100 * time.Millisecond)
	finish()
	select {
	case a := <-got:
		require.NoError(t, a.err)
		require.Equal(t, receipt{Total: 7}, a.r)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitResult did not return once the instance finished")
	}

	// Polls that keep failing until ctx ends: ctx's error, naming the failure.
	lost, err := gendurable.New(unreachablePool(t), &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{m}})
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = gendurable.WaitResult[receipt](short, lost, id)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "the last poll before it failed")
}

// TestWaitResultOnAConnectionCutOff: WaitResult's polls go out on a
// connection that is then cut off for good (dbtest.CutProxy.Strand: nothing
// crosses it, nothing is closed; new connections go through), and the
// instance is finished meanwhile by another engine. With a 15 s context and
// a MaintenanceTimeout of 1 s, the poll stuck on the dead connection is
// abandoned after 1 s and the next one, on a fresh connection, sees the
// instance done: WaitResult returns its result a few seconds after the
// strand. It used to wait on the dead connection until its context ended
// (15 s), then fail with "context deadline exceeded".
func TestWaitResultOnAConnectionCutOff(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "waitcut", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	pool, proxy := cutOffPool(t, 3)
	waiter, err := gendurable.New(pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{job},
		MaintenanceTimeout: time.Second, Logger: testLogger(t)})
	require.NoError(t, err)
	res, err := b.eng.Insert(context.Background(), job.New(orderArgs{}).With(gendurable.InsertOpts{RunIn: 1500 * time.Millisecond}))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, err := gendurable.WaitResult[any](ctx, waiter, res.ID)
		done <- err
	}()
	time.Sleep(700 * time.Millisecond) // WaitResult polls, on the pool's one connection
	proxy.Strand()
	stranded := time.Now()
	b.start()
	b.waitStatus(res.ID, "done", 10*time.Second)
	t.Logf("done %s after the strand", time.Since(stranded).Round(time.Millisecond))
	select {
	case err := <-done:
		took := time.Since(stranded)
		t.Logf("WaitResult returned %s after the strand: %v", took.Round(time.Millisecond), err)
		require.NoError(t, err)
		require.Less(t, took, 6*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("WaitResult did not return")
	}
}

// TestWaitResultOfACancelledInstance: a cancelled instance is a failed one
// for WaitResult: a *FailedError of kind "cancelled" with the reason given.
func TestWaitResultOfACancelledInstance(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	id := b.insert(m.New(waitState{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	require.NoError(t, b.eng.Cancel(context.Background(), id, "customer left"))
	_, err := gendurable.WaitResult[waitState](context.Background(), b.eng, id)
	var f *gendurable.FailedError
	require.ErrorAs(t, err, &f)
	require.ErrorIs(t, err, gendurable.ErrInstanceFailed)
	require.Equal(t, "cancelled", f.Kind)
	require.Equal(t, "customer left", f.Reason)
}

// panickyResult's UnmarshalJSON panics.
type panickyResult struct{}

func (*panickyResult) UnmarshalJSON([]byte) error { panic("result unmarshal panic") }

// TestWaitResultOutOfTimeSaysWhatItSaw: a wait that runs out of time says
// what the last poll read — the instance's status and step, and that no
// queue of this engine is its — not "context deadline exceeded" alone (a
// newcomer's probe: a job inserted into a queue no engine worked).
func TestWaitResultOutOfTimeSaysWhatItSaw(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	id := b.insert(m.New(waitState{}).With(gendurable.InsertOpts{Queue: "nobody"}))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := gendurable.WaitResult[waitState](ctx, b.eng, id)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, fmt.Sprintf(`instance %d was runnable at step "park" at the last poll, in queue "nobody", which this engine does not work`, id))
}
