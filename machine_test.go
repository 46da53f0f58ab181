package gendurable_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

func TestStepTimeoutCancelsTheStepAndHandleSeesIt(t *testing.T) {
	t.Parallel()
	var sawTimeout, sawCause atomic.Int32
	slow := &gendurable.Machine[weirdState]{
		Name: "slow", Start: "a", StepTimeout: 100 * time.Millisecond, MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				<-ctx.Done()
				if errors.Is(context.Cause(ctx), gendurable.ErrStepTimeout) {
					sawCause.Add(1)
				}
				return gendurable.Outcome{}, ctx.Err()
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[weirdState], err error) (gendurable.Outcome, error) {
			if errors.Is(err, gendurable.ErrStepTimeout) {
				sawTimeout.Add(1)
			}
			if r.Attempt+1 >= r.MaxAttempts {
				return gendurable.Stop("too slow"), nil
			}
			return r.Replay(r.State, 0), nil
		},
	}
	quick := &gendurable.Job[weirdState]{Name: "quick", Timeout: time.Second, Perform: func(context.Context, *gendurable.Run[weirdState]) error {
		time.Sleep(10 * time.Millisecond)
		return nil
	}}
	b := setup(t, nil, slow, quick)
	b.start()
	id := b.insert(slow.New(weirdState{}))
	ok := b.insert(quick.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Len(t, r.Errors, 2)
	require.Contains(t, r.Errors[0]["error"], "step timeout (100ms): context deadline exceeded")
	require.Contains(t, r.Errors[1]["error"], "too slow")
	require.EqualValues(t, 2, sawCause.Load(), "the step's context was cancelled with cause ErrStepTimeout")
	require.EqualValues(t, 2, sawTimeout.Load(), "Handle saw an error wrapping ErrStepTimeout")
	b.waitStatus(ok, "done", 10*time.Second)
}

// TestStepIgnoringItsContextIsAbandoned: a step that ignores its context
// past its StepTimeout gets its outcome written by the engine (retry, then
// failed with the reason), is reported, keeps its slot (the queue never
// runs more steps than its Concurrency) while the rest of the queue goes
// on, is not waited for by Stop, and whatever it returns later is dropped.
func TestStepIgnoringItsContextIsAbandoned(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var running, maxRunning atomic.Int32
	enter := func() {
		n := running.Add(1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				return
			}
		}
	}
	var stuckReturned sync.WaitGroup
	stubborn := &gendurable.Machine[weirdState]{
		Name: "stubborn", Start: "a", StepTimeout: 100 * time.Millisecond, MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				stuckReturned.Add(1)
				defer stuckReturned.Done()
				enter()
				defer running.Add(-1)
				<-release // ignores ctx
				return gendurable.Done("too late"), nil
			},
		},
	}
	fine := &gendurable.Job[weirdState]{Name: "fine", Perform: func(context.Context, *gendurable.Run[weirdState]) error {
		enter()
		defer running.Add(-1)
		time.Sleep(5 * time.Millisecond)
		return nil
	}}
	var mu sync.Mutex
	var abandoned []gendurable.StepAbandonedEvent
	cfg := fastConfig("", stubborn, fine)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 3, PollInterval: 20 * time.Millisecond}}
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		if e, ok := ev.(*gendurable.StepAbandonedEvent); ok {
			mu.Lock()
			abandoned = append(abandoned, *e)
			mu.Unlock()
		}
	})}
	b := setup(t, cfg)
	id := b.insert(stubborn.New(weirdState{}))
	var ps []gendurable.InsertParams
	for range 30 {
		ps = append(ps, fine.New(weirdState{}))
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Start(context.Background()))

	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Len(t, r.Errors, 2)
	require.Equal(t, "timeout", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], `step "a" ignored its context for`)
	require.Contains(t, r.Errors[1]["error"], "attempts exhausted (2 of 2)")
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'fine' AND status = 'done'`) == 30
	}, "the other steps finished on the slot left")
	require.LessOrEqual(t, maxRunning.Load(), int32(3), "never more steps running than the queue's Concurrency")
	require.EqualValues(t, 2, running.Load(), "both abandoned runs still hold their slots")
	mu.Lock()
	require.Len(t, abandoned, 2)
	require.Equal(t, []string{"replay", "stop"}, []string{abandoned[0].Outcome, abandoned[1].Outcome})
	require.Equal(t, []int{1, 2}, []int{abandoned[0].AbandonedSlots, abandoned[1].AbandonedSlots})
	mu.Unlock()

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = b.eng.Stop(ctx)
	require.ErrorIs(t, err, gendurable.ErrStepTimeout)
	require.ErrorContains(t, err, "2 steps abandoned")
	require.Less(t, time.Since(start), 3*time.Second, "Stop does not wait for abandoned steps")

	close(release) // the stuck runs return now: what they return must be dropped
	stuckReturned.Wait()
	time.Sleep(100 * time.Millisecond)
	after := b.row(id)
	require.Equal(t, "failed", after.Status)
	require.Len(t, after.Errors, 2)
	require.Nil(t, after.Result)
}
