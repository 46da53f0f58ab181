package gendurabletest_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/stretchr/testify/require"
)

func workEngine(t *testing.T) *gendurable.Engine {
	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 4})
	return db.NewEngine(t, &gendurable.Config{
		Machines: []gendurable.Definition{orderMachine, shipJob},
		Queues: map[string]gendurable.QueueConfig{
			"default":  {Concurrency: 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond},
			"shipping": {Concurrency: 1, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond},
		},
		ReaperInterval: -1, PruneInterval: -1,
	})
}

func TestWorkUntilFinished(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	eng := workEngine(t)
	paid, err := eng.Insert(ctx, orderMachine.New(order{Item: "book"}))
	require.NoError(t, err)
	failing, err := eng.Insert(ctx, orderMachine.New(order{Item: "lamp", Do: "stop"}))
	require.NoError(t, err)
	// Not started: WorkUntilFinished starts the engine and stops it again.
	// The first instance parks for its payment, sent here meanwhile.
	go func() {
		for {
			if _, err := eng.Signal(context.WithoutCancel(ctx), paid.ID, "payment", payment{Cents: 700}, nil); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	ins := gendurabletest.WorkUntilFinished(ctx, t, eng, paid.ID, failing.ID)
	require.Len(t, ins, 2)
	require.Equal(t, gendurable.StatusDone, ins[0].Status)
	require.JSONEq(t, `{"paid": 700, "shipped": 1}`, string(ins[0].Result))
	require.Equal(t, gendurable.StatusFailed, ins[1].Status)
	require.Equal(t, "out of stock", ins[1].Errors[len(ins[1].Errors)-1].Error)

	// The engine was stopped again: a new instance stays runnable.
	id, err := eng.Insert(ctx, orderMachine.New(order{Item: "pen", Do: "stop"}))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	in, err := eng.Instance(ctx, id.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusRunnable, in.Status)

	// A running engine keeps running.
	require.NoError(t, eng.Start(ctx))
	gendurabletest.WorkUntilFinished(ctx, t, eng, id.ID)
	require.ErrorIs(t, eng.Start(ctx), gendurable.ErrAlreadyStarted)
}

// An instance that does not finish in time fails the test with what it
// waits for.
func TestWorkUntilFinishedTimeout(t *testing.T) {
	t.Parallel()
	eng := workEngine(t)
	parked, err := eng.Insert(t.Context(), orderMachine.New(order{Item: "book"}))
	require.NoError(t, err)
	elsewhere, err := eng.Insert(t.Context(), shipJob.New(shipment{Item: "x"}).With(gendurable.InsertOpts{Queue: "nowhere"}))
	require.NoError(t, err)
	// Long enough for the order to park on a loaded machine (500 ms ran
	// out before it had, once in four runs at a load average of 17: a
	// newcomer's probe).
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) { gendurabletest.WorkUntilFinished(ctx, tb, eng, parked.ID, elsewhere.ID) }))
	msg := f.message()
	require.Contains(t, msg, "WorkUntilFinished: 2 of 2 instances did not finish (context deadline exceeded)")
	require.Contains(t, msg, "id "+itoa(parked.ID)+` (order): awaiting_signal at step "ship", attempt 1 of 3; awaiting signal payment or cancel`)
	require.Contains(t, msg, "id "+itoa(elsewhere.ID)+` (ship): runnable at step "perform"`)
	require.Contains(t, msg, `runnable, waiting for a worker of queue "nowhere" (not a queue this engine works)`)
	require.NotContains(t, msg, `queue "nowhere" is not one this engine works`, "said once")

	f = newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) { gendurabletest.WorkUntilFinished(t.Context(), tb, eng, 1<<40) }))
	require.Contains(t, f.message(), "instance not found")
}

// TestWorkUntilFinishedWithAnAbandonedStep (an API probe): a job whose step
// ignores its context past its Timeout finishes as documented (the engine
// writes its outcome and abandons the goroutine), but Stop then says such
// a step still runs, and WorkUntilFinished failed the test with it. It
// logs that now; the instances are returned as they finished.
func TestWorkUntilFinishedWithAnAbandonedStep(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stuck := &gendurable.Job[order]{Name: "stuck", Timeout: 300 * time.Millisecond, MaxAttempts: 1,
		Perform: func(ctx context.Context, r *gendurable.Run[order]) error {
			<-release // ignores ctx
			return nil
		}}
	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 4})
	eng := db.NewEngine(t, &gendurable.Config{
		Machines:       []gendurable.Definition{stuck},
		Queues:         map[string]gendurable.QueueConfig{"default": {Concurrency: 2, PollInterval: 20 * time.Millisecond}},
		ReaperInterval: -1, PruneInterval: -1,
	})
	res, err := eng.Insert(t.Context(), stuck.New(order{}))
	require.NoError(t, err)
	f := newFakeTB(t)
	var ins []*gendurable.Instance
	failed := f.run(func(tb testing.TB) {
		ins = gendurabletest.WorkUntilFinished(t.Context(), tb, eng, res.ID)
	})
	require.False(t, failed, "WorkUntilFinished failed the test: %s", f.message())
	require.Len(t, ins, 1)
	require.Equal(t, gendurable.StatusFailed, ins[0].Status)
	require.Equal(t, "timeout", ins[0].Errors[len(ins[0].Errors)-1].Kind)
}

// TestANilContextFailsTheTestNotThePackage: the helpers that take a
// context fail the test with a message on a nil one, rather than panic
// inside (a review: RunStep with a StepTimeout would have).
func TestANilContextFailsTheTestNotThePackage(t *testing.T) {
	t.Parallel()
	eng := workEngine(t)
	var nilCtx context.Context
	for name, fn := range map[string]func(tb testing.TB){
		"WorkUntilFinished":  func(tb testing.TB) { gendurabletest.WorkUntilFinished(nilCtx, tb, eng, 1) },
		"RequireInserted":    func(tb testing.TB) { gendurabletest.RequireInserted(nilCtx, tb, eng, shipJob, nil) },
		"RequireNotInserted": func(tb testing.TB) { gendurabletest.RequireNotInserted(nilCtx, tb, eng, shipJob, nil) },
		"RunStep": func(tb testing.TB) {
			gendurabletest.RunStep(nilCtx, tb, shipJob, gendurable.JobStep, shipment{Item: "x"}, nil)
		},
	} {
		f := newFakeTB(t)
		require.True(t, f.run(fn), name)
		require.Contains(t, f.message(), name+": nil context", name)
	}
}
