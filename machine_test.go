package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestStepErrorRetriesUntilMaxAttemptsWithHistory(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	m := probeMachine(&handled)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "error"}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, int32(3), handled.Load())
	require.Equal(t, 2, r.Attempt, "attempts 0, 1, 2 ran; the third failure stopped it")
	require.Len(t, r.Errors, 3)
	for i, e := range r.Errors {
		require.Equal(t, "error", e["kind"])
		require.Equal(t, float64(i), e["attempt"])
		require.Equal(t, "a", e["step"])
		require.NotEmpty(t, e["at"])
	}
	require.Equal(t, "boom; stopped: gave up", r.Errors[2]["error"])
}

func TestDefaultHandleBacksOffThenStops(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{
		Name: "flaky", Start: "a", MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, errors.New("flaky")
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{}))
	eventually(t, 10*time.Second, func() bool { return b.row(id).Attempt == 1 }, "no retry")
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	// DefaultBackoff(0) is between 0.5s and 1s.
	delay := r.EligibleAt.Sub(r.Now)
	require.True(t, delay > 0 && delay <= time.Second, "retry delay %s", delay)
	r = b.waitStatus(id, "failed", 10*time.Second)
	require.Len(t, r.Errors, 2)
	require.Contains(t, r.Errors[1]["error"], "attempts exhausted (2 of 2)")
}

func TestPanicIsHandledAndRecorded(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	m := probeMachine(&handled)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{Do: "panic"}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, int32(3), handled.Load())
	require.Equal(t, "panic", r.Errors[0]["kind"])
	require.Equal(t, "panic: kaboom", r.Errors[0]["error"])

	// Each entry keeps the panic's stack, from the panicking frame (the
	// probe step in helper_test.go) down, without the recovery's frames.
	in, err := b.eng.Instance(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, in.Errors, 3)
	for _, e := range in.Errors {
		require.True(t, strings.HasPrefix(e.Stack, "goroutine "), e.Stack)
		lines := strings.Split(e.Stack, "\n")
		require.Contains(t, lines[1], "probeMachine", "the first frame is the one that panicked:\n%s", e.Stack)
		require.Contains(t, lines[2], "helper_test.go:")
		require.NotContains(t, e.Stack, "runtime/debug.Stack")
		require.NotContains(t, e.Stack, "panic(")
		require.LessOrEqual(t, len(e.Stack), 8<<10)
	}
}

// TestAStepThatCallsGoexitFailsLikeAPanic: runtime.Goexit in a step, in
// Handle or in a WithTx callback — what t.FailNow, t.Fatal and testify's
// require do in a test that runs a real engine — is a panic of the step. It
// ended the worker's goroutine: the row stayed executing, its lease
// heartbeated, and the queue's only place was gone, so the next instance
// never ran (a probe). One place here, so the instance after each must run.
func TestAStepThatCallsGoexitFailsLikeAPanic(t *testing.T) {
	t.Parallel()
	step := func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
		switch r.State.Do {
		case "step":
			runtime.Goexit()
		case "tx":
			return gendurable.Done(nil).WithTx(func(context.Context, pgx.Tx) error {
				runtime.Goexit()
				return nil
			}), nil
		case "handle":
			return gendurable.Outcome{}, errors.New("step failed")
		}
		return gendurable.Done(nil), nil
	}
	m := &gendurable.Machine[probeState]{Name: "goexit", Start: "a", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Steps:   map[string]gendurable.StepFunc[probeState]{"a": step}}
	h := &gendurable.Machine[probeState]{Name: "goexit-handle", Start: "a",
		Steps: map[string]gendurable.StepFunc[probeState]{"a": step},
		Handle: func(ctx context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			runtime.Goexit()
			return gendurable.Outcome{}, err
		}}
	cfg := fastConfig("", m, h)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	for _, c := range []struct {
		def  *gendurable.Machine[probeState]
		do   string
		runs int
	}{{m, "step", 2}, {m, "tx", 2}, {h, "handle", 1}} {
		bad := b.insert(c.def.New(probeState{Do: c.do}))
		good := b.insert(m.New(probeState{}))
		r := b.waitStatus(bad, "failed", 10*time.Second)
		require.Len(t, r.Errors, c.runs, c.do)
		require.Contains(t, r.Errors[len(r.Errors)-1]["error"], "runtime.Goexit called", c.do)
		b.waitStatus(good, "done", 10*time.Second)
	}
}

// nilReadingErr is an error type whose Error method reads its receiver: a
// nil *nilReadingErr returned as an error (the typed-nil mistake) panics
// when formatted.
type nilReadingErr struct{ code int }

func (e *nilReadingErr) Error() string { return fmt.Sprintf("code %d", e.code) }

func noErr() *nilReadingErr { return nil }

// TestAStepErrorWhoseErrorMethodPanicsFailsTheStep: a step, a WithTx
// callback, a Job's Perform or a Handle that returns a typed nil pointer as
// its error (its Error method panics) fails like any error, saying so. The
// engine formatted it outside any recover: the worker's process died, and
// the next process's after the reaper handed the row on (a library-misuse
// probe).
func TestAStepErrorWhoseErrorMethodPanicsFailsTheStep(t *testing.T) {
	t.Parallel()
	step := func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
		var err error = noErr()
		switch r.State.Do {
		case "step":
			return gendurable.Outcome{}, err
		case "tx":
			return gendurable.Done(nil).WithTx(func(context.Context, pgx.Tx) error { return err }), nil
		case "handle":
			return gendurable.Outcome{}, errors.New("step failed")
		}
		return gendurable.Done(nil), nil
	}
	m := &gendurable.Machine[probeState]{Name: "typed-nil", Start: "a", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Steps:   map[string]gendurable.StepFunc[probeState]{"a": step}}
	h := &gendurable.Machine[probeState]{Name: "typed-nil-handle", Start: "a",
		Steps: map[string]gendurable.StepFunc[probeState]{"a": step},
		Handle: func(ctx context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			var herr error = noErr()
			return gendurable.Outcome{}, herr
		}}
	job := &gendurable.Job[probeState]{Name: "typed-nil-job", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Perform: func(context.Context, *gendurable.Run[probeState]) error {
			var err error = noErr()
			return err
		}}
	b := setup(t, fastConfig("", m, h, job))
	b.start()
	for _, c := range []struct {
		p    gendurable.InsertParams
		runs int
	}{{m.New(probeState{Do: "step"}), 2}, {m.New(probeState{Do: "tx"}), 2}, {h.New(probeState{Do: "handle"}), 1}, {job.New(probeState{}), 2}} {
		bad := b.insert(c.p)
		good := b.insert(m.New(probeState{}))
		r := b.waitStatus(bad, "failed", 10*time.Second)
		require.Len(t, r.Errors, c.runs, "%d", bad)
		require.Contains(t, r.Errors[len(r.Errors)-1]["error"], "*gendurable_test.nilReadingErr whose Error method panicked", "%d", bad)
		b.waitStatus(good, "done", 10*time.Second)
	}
}

func TestPanicInHandleStops(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{
		Name: "badhandle", Start: "a",
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, errors.New("step failed")
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			panic("handle exploded")
		},
	}
	logs := &syncbuf.Buffer{}
	cfg := fastConfig("", m)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(probeState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "step failed; Handle failed: panic: handle exploded", r.Errors[0]["error"])
	// The log says why the instance stopped, as the row does (it said only
	// "step failed" before).
	eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "Handle failed: panic: handle exploded") },
		"the log line of the stop: %s", logs.String())
	in, err := b.eng.Instance(context.Background(), id)
	require.NoError(t, err)
	require.Contains(t, in.Errors[0].Stack, "TestPanicInHandleStops", "the stack of Handle's own panic")
}

func TestUndecodableStateStopsWithoutRetry(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	m := probeMachine(&handled)
	b := setup(t, nil, m)
	id := b.insert(m.New(probeState{Do: "done"}))
	// Another deploy wrote a state that does not fit the struct.
	b.exec(`UPDATE {{s}}.gendurable_instances SET state = '{"n": "not a number"}' WHERE id = $1`, id)
	b.start()
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Zero(t, handled.Load())
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, "state_decode", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "state does not decode")
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

// slowNextPick holds up the next pick statement sent once armed.
type slowNextPick struct {
	armed   atomic.Bool
	delayed atomic.Int32
}

func (s *slowNextPick) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "gendurable_pick(") && s.armed.CompareAndSwap(true, false) {
		s.delayed.Add(1)
		time.Sleep(1500 * time.Millisecond)
	}
	return ctx
}

func (s *slowNextPick) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAbandonedSlotsHoldNoClaims: a process whose every slot is held by an
// abandoned step claims nothing more and hands back what it had claimed
// ahead: no slot of its may free (the step ignores its context), while
// another process can run the abandoned step's own retry at once. Before,
// the stuck process claimed that retry into its prefetch buffer and kept it
// there, heartbeated, for as long as the step stayed stuck. "pick in
// flight": a pick sent before the last slot was abandoned adds its rows to
// the buffer after the buffer was handed back; they are handed back too (a
// review found them left there).
func TestAbandonedSlotsHoldNoClaims(t *testing.T) {
	t.Parallel()
	for _, inFlight := range []bool{false, true} {
		t.Run(map[bool]string{false: "claimed ahead", true: "pick in flight"}[inFlight], func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			defer close(release)
			tr := &slowNextPick{}
			var stuckOn atomic.Value // the process the first run stuck on
			machine := func(who string) *gendurable.Machine[weirdState] {
				return &gendurable.Machine[weirdState]{
					Name: "held-hostage", Start: "a", StepTimeout: 200 * time.Millisecond, MaxAttempts: 3,
					Backoff: func(int) time.Duration { return 0 },
					Steps: map[string]gendurable.StepFunc[weirdState]{
						"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
							if stuckOn.CompareAndSwap(nil, who) {
								// The next pick (a poll's) is under way as
								// the step is abandoned.
								tr.armed.Store(inFlight)
								<-release // the first run ignores its ctx
							}
							return gendurable.Done(who), nil
						},
					},
				}
			}
			mA := machine("A")
			cfgA := fastConfig("", mA)
			cfgA.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 4, PollInterval: 20 * time.Millisecond}}
			a := setupTraced(t, tr, cfgA)
			ids := []int64{a.insert(mA.New(weirdState{}))}
			if !inFlight {
				// Two at once: A runs one (it sticks) and claims the
				// other ahead of its slot.
				ids = append(ids, a.insert(mA.New(weirdState{})))
			}
			a.start()
			eventually(t, 10*time.Second, func() bool {
				return a.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE attempt >= 1`) == 1
			}, "the stuck step was abandoned and its retry written")
			if inFlight {
				ids = append(ids, a.insert(mA.New(weirdState{})))
				eventually(t, 10*time.Second, func() bool { return tr.delayed.Load() == 1 }, "a pick was held up")
				time.Sleep(2 * time.Second) // the held-up pick lands
			}
			cfgB := fastConfig("", machine("B"))
			cfgB.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2, PollInterval: 20 * time.Millisecond}}
			b := bundleOn(t, a.pool, a.schema, cfgB)
			b.start()
			for _, i := range ids {
				r := b.waitStatus(i, "done", 10*time.Second)
				require.JSONEq(t, `"B"`, string(r.Result), "instance %d ran on the process with a free slot", i)
			}
			require.Equal(t, "A", stuckOn.Load(), "the first run stuck on A")
		})
	}
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
	// The hook hears of an abandonment after its outcome is written: the
	// row can read failed before the second event is delivered.
	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(abandoned) >= 2
	}, "both abandonments reported")
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

// nestedPanic's String panics with a nestedPanic: fmt recovers the first
// panic, then panics again printing its value.
type nestedPanic struct{}

func (nestedPanic) String() string { panic(nestedPanic{}) }

// TestPanicValueWhoseStringPanics: a step panicking with a value fmt cannot
// print fails its instance like any panic; the worker process survives
// (it died with "panic while printing panic value" before).
func TestPanicValueWhoseStringPanics(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "evil", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				panic(nestedPanic{})
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "panic", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "panic: a gendurable_test.nestedPanic value (formatting it panicked)")
}

// TestHookPanicValueFmtCannotPrint: a hook panicking with a value fmt cannot
// print is logged by its type; the engine lives on (logging the value
// itself panicked again inside slog's recovery and killed the process).
func TestHookPanicValueFmtCannotPrint(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "hooked", Start: "a",
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(context.Context, gendurable.Event) { panic(nestedPanic{}) })}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(weirdState{}))
	b.waitStatus(id, "done", 10*time.Second)
}

// deployState is the state of deployMachine.
type deployState struct {
	Paid bool `json:"paid"`
}

// deployMachine parks at "settle" until "pay"; withSettle false is the
// next deploy, where the step "settle" is gone.
func deployMachine(withSettle bool, handle gendurable.HandleFunc[deployState]) *gendurable.Machine[deployState] {
	steps := map[string]gendurable.StepFunc[deployState]{
		"await": func(ctx context.Context, r *gendurable.Run[deployState]) (gendurable.Outcome, error) {
			return r.Await("settle", r.State, "pay"), nil
		},
		"refund": func(ctx context.Context, r *gendurable.Run[deployState]) (gendurable.Outcome, error) {
			return gendurable.Done("refunded"), nil
		},
	}
	if withSettle {
		steps["settle"] = func(ctx context.Context, r *gendurable.Run[deployState]) (gendurable.Outcome, error) {
			if len(r.Awaited) == 0 {
				return gendurable.Done("settled without a payment"), nil
			}
			return gendurable.Done("settled"), nil
		}
	}
	return &gendurable.Machine[deployState]{Name: "deploy", Start: "await", MaxAttempts: 3,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }, Handle: handle, Steps: steps}
}

// startEngine starts another engine on b's schema with machines, stopped
// when the test ends (or by the returned func).
func startEngine(t *testing.T, b *testBundle, machines ...gendurable.Definition) (*gendurable.Engine, func()) {
	t.Helper()
	cfg := fastConfig(b.schema, machines...)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	stop := sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	})
	t.Cleanup(stop)
	return eng, stop
}

// TestDeployThatRemovesAStep pins what happens to an instance parked at a
// step that the next deploy's machine (same name and version) no longer
// declares: woken, its step is an ErrInvalidOutcome handed to Handle — which
// sees Run.Step, the old name, and may move it on (a migration) — and by
// default retried with backoff until its attempts are spent, then failed
// with the reason in its history. A Retry after redeploying the step runs it
// again, but the failure consumed the signal that woke it: the step sees an
// empty Awaited, as after a timeout.
func TestDeployThatRemovesAStep(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, deployMachine(true, nil))
	ctx := context.Background()
	first := deployMachine(true, nil)
	old, stopOld := startEngine(t, b, first)
	parked, err := old.Insert(ctx, first.New(deployState{}))
	require.NoError(t, err)
	migrated, err := old.Insert(ctx, first.New(deployState{}))
	require.NoError(t, err)
	b.waitStatus(parked.ID, "awaiting_signal", 10*time.Second)
	b.waitStatus(migrated.ID, "awaiting_signal", 10*time.Second)
	stopOld()

	// The new deploy: "settle" is gone.
	next, stopNext := startEngine(t, b, deployMachine(false, nil))
	_, err = next.Signal(ctx, parked.ID, "pay", nil, nil)
	require.NoError(t, err)
	r := b.waitStatus(parked.ID, "failed", 10*time.Second)
	require.Equal(t, "settle", r.Step)
	require.Len(t, r.Errors, 3, "retried until its attempts were spent")
	for _, e := range r.Errors {
		require.Equal(t, "error", e["kind"])
		require.Contains(t, e["error"], `step "settle" is not declared by machine "deploy" version 1`)
	}
	require.Contains(t, r.Errors[2]["error"], "attempts exhausted (3 of 3)")
	stopNext()

	// A Handle can migrate such instances to a step that exists.
	var sawStep string
	migrate := func(ctx context.Context, r *gendurable.Run[deployState], err error) (gendurable.Outcome, error) {
		if errors.Is(err, gendurable.ErrInvalidOutcome) && r.Step == "settle" {
			sawStep = r.Step
			return r.Next("refund", r.State), nil
		}
		return r.Replay(r.State, time.Second), nil
	}
	mig, stopMig := startEngine(t, b, deployMachine(false, migrate))
	_, err = mig.Signal(ctx, migrated.ID, "pay", nil, nil)
	require.NoError(t, err)
	r = b.waitStatus(migrated.ID, "done", 10*time.Second)
	require.JSONEq(t, `"refunded"`, string(r.Result))
	require.Equal(t, "settle", sawStep)
	stopMig()

	// Redeployed with the step back, a Retry runs it — without the signal.
	fixed, _ := startEngine(t, b, deployMachine(true, nil))
	require.NoError(t, fixed.Retry(ctx, parked.ID))
	r = b.waitStatus(parked.ID, "done", 10*time.Second)
	require.JSONEq(t, `"settled without a payment"`, string(r.Result), "the failure consumed the signal that woke it")
}

// TestStepReplaysAreNotBoundedByMaxAttempts pins that MaxAttempts bounds
// what the default Handle and the reaper do, not a Replay the step returns
// itself: such a step replays past the budget (Run.Attempt 5 of 3), and its
// next failure then fails the instance at once, without a retry.
func TestStepReplaysAreNotBoundedByMaxAttempts(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{Name: "poller", Start: "poll", MaxAttempts: 3,
		Steps: map[string]gendurable.StepFunc[probeState]{
			"poll": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				if r.Attempt < 5 {
					return r.Replay(r.State, time.Millisecond), nil // not ready yet: poll again
				}
				return gendurable.Outcome{}, errors.New("transient")
			},
		}}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, 5, r.Attempt)
	require.Len(t, r.Errors, 1, "the first failure past the budget was the last")
	require.Contains(t, r.Errors[0]["error"], "transient; stopped: attempts exhausted (6 of 3)")
}

// TestTheDefaultRetryKeepsTheStoredState: the default Handle's retry leaves
// the state as stored, so a worker whose S lacks fields a newer deploy
// added (failing, say, at a step only the newer one declares) does not
// strip them. Before, it stored r.State re-encoded: {"n":1} for
// {"n":1,"tracking":"T1"}.
func TestTheDefaultRetryKeepsTheStoredState(t *testing.T) {
	t.Parallel()
	type older struct {
		N int `json:"n"`
	}
	m := &gendurable.Machine[older]{Name: "keeper", Start: "a", MaxAttempts: 5,
		Backoff: func(int) time.Duration { return time.Hour },
		Steps: map[string]gendurable.StepFunc[older]{
			"a": func(context.Context, *gendurable.Run[older]) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, errors.New("not today")
			},
		},
	}
	b := setup(t, nil, m)
	id := b.insert(m.New(older{N: 1}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET state = '{"n": 1, "tracking": "T1"}' WHERE id = $1`, id)
	b.start()
	eventually(t, 10*time.Second, func() bool { return b.row(id).Attempt == 1 }, "the failure was never retried")
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	require.JSONEq(t, `{"n": 1, "tracking": "T1"}`, string(r.State))
}

// TestARetryOfAnUndeclaredStepIsNotWokenLocally: the process that failed a
// row at a step it does not declare does not wake itself for the retry —
// in a rolling deploy the process that declares the step should have an
// even chance at it, by the poll. Before, the retry's wake made the failing
// process the first to claim it again (a probe: 392 of 433 retries taken
// by the old worker). Here the retry (backoff 500 ms) waits for the 3 s
// poll. (The pick a feeder makes as it goes idle, right after the failure,
// comes before the backoff ends, even on a loaded machine; with a 50 ms
// backoff it sometimes did not.)
func TestARetryOfAnUndeclaredStepIsNotWokenLocally(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{Name: "undeclared", Start: "a", MaxAttempts: 3,
		Backoff: func(int) time.Duration { return 500 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(_ context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return r.Next("b", r.State), nil
			},
			"b": func(context.Context, *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	b, id := startedAtAnUndeclaredStep(t, m, 3*time.Second)
	eventually(t, 20*time.Second, func() bool { return len(b.row(id).Errors) >= 2 }, "the undeclared step was not retried")
	errs := b.row(id).Errors
	var at [2]time.Time
	for i := range at {
		var err error
		at[i], err = time.Parse(time.RFC3339Nano, errs[i]["at"].(string))
		require.NoError(t, err)
		require.Contains(t, errs[i]["error"], `step "gone" is not declared`)
	}
	require.Greater(t, at[1].Sub(at[0]), 1500*time.Millisecond, "the retry was claimed %v after the failure, before the poll", at[1].Sub(at[0]))
}

// TestAHandleMovingAnUndeclaredStepOnIsWokenLocally: the undeclared step's
// retry is left to the poll, but a Handle that moves the row on to a step
// this process declares (design §9's migration) is woken as any Next: a
// review found the first version of that rule making a Next(After 50 ms)
// wait for the 2 s poll.
func TestAHandleMovingAnUndeclaredStepOnIsWokenLocally(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[probeState]{Name: "migrating", Start: "a",
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(context.Context, *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
		Handle: func(_ context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			if errors.Is(err, gendurable.ErrInvalidOutcome) && r.Step == "gone" {
				return r.Next("a", r.State).After(50 * time.Millisecond), nil
			}
			return gendurable.Stop(err.Error()), nil
		},
	}
	b, id := startedAtAnUndeclaredStep(t, m, 2*time.Second)
	b.waitStatus(id, "done", 15*time.Second)
	took := b.count(`SELECT (extract(epoch FROM finished_at - (errors->0->>'at')::timestamptz) * 1000)::int
		FROM {{s}}.gendurable_instances WHERE id = $1`, id)
	require.Less(t, took, 1000, "ms from the Handle's Next(After 50 ms) to the step")
}

// TestASnoozeKeepsTheStoredArgs: a job's snooze keeps its args as stored,
// as the default retry does (a newer deploy's fields this T lacks
// included); it re-encoded them through T.
func TestASnoozeKeepsTheStoredArgs(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "snoozer", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		return gendurable.JobSnooze(time.Hour)
	}}
	b := setup(t, nil, job)
	id := b.insert(job.New(orderArgs{I: 1}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET state = state || '{"tracking": "T1"}' WHERE id = $1`, id)
	b.start()
	eventually(t, 10*time.Second, func() bool {
		r := b.row(id)
		return r.Status == "runnable" && r.EligibleAt.After(r.Now.Add(time.Minute))
	}, "the job never snoozed")
	var got map[string]any
	require.NoError(t, json.Unmarshal(b.row(id).State, &got))
	require.Equal(t, "T1", got["tracking"])
}

// startedAtAnUndeclaredStep starts an engine of m whose polls are every
// poll, busy or idle, on one row of m at a step m does not declare ("gone").
func startedAtAnUndeclaredStep(t *testing.T, m *gendurable.Machine[probeState], poll time.Duration) (*testBundle, int64) {
	t.Helper()
	db := gendurabletest.NewDB(t, nil)
	cfg := fastConfig(db.Schema, m)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2,
		PollInterval: poll, BusyPollInterval: poll, MaxPollInterval: poll}}
	b := bundleOn(t, db.Pool, db.Schema, cfg, m)
	id := b.insert(m.New(probeState{}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET step = 'gone' WHERE id = $1`, id)
	b.start()
	return b, id
}

// TestStepEventNamesEveryOutcome: a StepEvent's Outcome is one of the
// values its godoc lists, "await" and "children" among them (the godoc
// listed four; a hook switching on them missed every Await and fan-out).
func TestStepEventNamesEveryOutcome(t *testing.T) {
	t.Parallel()
	leaf := &gendurable.Job[leafArgs]{Name: "evleaf", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	m := &gendurable.Machine[probeState]{Name: "evout", Start: "fan", Steps: map[string]gendurable.StepFunc[probeState]{
		"fan": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return r.ScheduleChildren("wait", r.State, leaf.New(leafArgs{})), nil
		},
		"wait": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return r.Await("end", r.State, "go").Timeout(10 * time.Millisecond), nil
		},
		"end": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		},
	}}
	events := &eventLog{}
	cfg := fastConfig("", m, leaf)
	cfg.Hooks = []gendurable.Hook{events}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(probeState{}))
	b.waitStatus(id, "done", 20*time.Second)
	for step, want := range map[string]string{"fan": "children", "wait": "await", "end": "done"} {
		// A step's event follows its outcome's commit: the row can read
		// done before the hook hears of its last step (a CI run under load).
		var ev *gendurable.StepEvent
		eventually(t, 10*time.Second, func() bool {
			var ok bool
			ev, ok = findEvent(events, func(e *gendurable.StepEvent) bool { return e.InstanceID == id && e.Step == step })
			return ok
		}, step)
		require.Equal(t, want, ev.Outcome, step)
	}
}

// TestAMachineStepsJobCancelAndJobSnoozeMeanWhatTheyDoForAJob: under the
// default Handle, a machine's step returning an error wrapped with
// JobCancel fails at once, and one returning JobSnooze runs again after the
// delay without counting an attempt. Before, both were retried as plain
// errors, each counting an attempt (a River user's probe: three runs and
// "job cancelled: permanent" in the history).
func TestAMachineStepsJobCancelAndJobSnoozeMeanWhatTheyDoForAJob(t *testing.T) {
	t.Parallel()
	var cancelRuns, snoozeRuns atomic.Int32
	m := &gendurable.Machine[orderArgs]{Name: "jobish", Start: "a", MaxAttempts: 3, Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			if r.State.I == 0 {
				cancelRuns.Add(1)
				return gendurable.Outcome{}, gendurable.JobCancel(errors.New("permanent"))
			}
			if snoozeRuns.Add(1) <= 4 { // more snoozes than MaxAttempts
				return gendurable.Outcome{}, gendurable.JobSnooze(20 * time.Millisecond)
			}
			return gendurable.Done(nil), nil
		},
	}}
	b := setup(t, nil, m)
	b.start()
	cancelled := b.insert(m.New(orderArgs{I: 0}))
	snoozed := b.insert(m.New(orderArgs{I: 1}))
	r := b.waitStatus(cancelled, "failed", 10*time.Second)
	require.Equal(t, int32(1), cancelRuns.Load(), "a JobCancel is not retried")
	// Its words are not an operator's cancel's (a newcomer's probe).
	require.Equal(t, "JobCancel: permanent; stopped: not retried", r.Errors[len(r.Errors)-1]["error"])
	r = b.waitStatus(snoozed, "done", 10*time.Second)
	require.Equal(t, int32(5), snoozeRuns.Load())
	require.Equal(t, 0, r.Attempt, "a snooze counts no attempt")
}

// TestANegativeJobSnoozeFromAMachineStepSaysWhy: a machine's step that
// returns JobSnooze with a negative delay is retried as an error, counting
// an attempt, as a job's is; its history says the snooze was invalid (it
// said "job snoozed for -1s", an attempt gone without a word: a probe).
func TestANegativeJobSnoozeFromAMachineStepSaysWhy(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[orderArgs]{Name: "badsnooze", Start: "a", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			return gendurable.Outcome{}, gendurable.JobSnooze(-time.Second)
		},
	}}
	b := setup(t, nil, m)
	b.start()
	r := b.waitStatus(b.insert(m.New(orderArgs{})), "failed", 10*time.Second)
	require.Contains(t, r.Errors[len(r.Errors)-1]["error"], "gendurable: invalid outcome: JobSnooze with a negative delay -1s")
}

// TestADefinitionRefusedHalfBuiltIsBuiltOnceComplete: a machine or a job
// met before its fields were all set (an insert or a ValidateOutcome
// before the init func that sets its Steps) is refused then, and used once
// complete. The first refusal was kept, and every later New, Insert and
// ValidateOutcome returned it ("declares no Steps") though the machine
// now had them (an API probe).
func TestADefinitionRefusedHalfBuiltIsBuiltOnceComplete(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[int]{Name: "late", Start: "a"}
	j := &gendurable.Job[int]{Perform: func(context.Context, *gendurable.Run[int]) error { return nil }}
	db := gendurabletest.NewDB(t, nil)
	insertOnly, err := gendurable.New(db.Pool, &gendurable.Config{Schema: db.Schema})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = insertOnly.Insert(ctx, m.New(1))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "no Steps yet")
	require.ErrorIs(t, m.ValidateOutcome("a", gendurable.Done(nil)), gendurable.ErrInvalidConfig)
	_, err = insertOnly.Insert(ctx, j.New(1))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "no Name yet")

	m.Steps = map[string]gendurable.StepFunc[int]{"a": func(context.Context, *gendurable.Run[int]) (gendurable.Outcome, error) {
		return gendurable.Done("m"), nil
	}}
	j.Name = "late-job"
	require.NoError(t, m.ValidateOutcome("a", gendurable.Done(nil)))
	b := bundleOn(t, db.Pool, db.Schema, nil, m, j)
	b.start()
	ids := []int64{b.insert(m.New(1)), b.insert(j.New(2))}
	for _, in := range gendurabletest.WorkUntilFinished(ctx, t, b.eng, ids...) {
		require.Equal(t, gendurable.StatusDone, in.Status)
	}
}

// TestAStateTypeJSONStoresNothingOfIsRefused: a state struct whose fields
// encoding/json leaves out, every one (unexported, or tagged "-"), was
// accepted and stored as {}: the order's item was gone at the first step,
// without a word (a newcomer's probe). Such a machine or job is refused;
// a struct with an exported field, a promoted one, a marshaler of its own,
// or no field at all (or blank ones) is not.
func TestAStateTypeJSONStoresNothingOfIsRefused(t *testing.T) {
	t.Parallel()
	step := func(context.Context, *gendurable.Run[hiddenOrder]) (gendurable.Outcome, error) {
		return gendurable.Done(nil), nil
	}
	m := &gendurable.Machine[hiddenOrder]{Name: "hidden", Start: "a", Steps: map[string]gendurable.StepFunc[hiddenOrder]{"a": step}}
	err := m.ValidateOutcome("a", gendurable.Done(nil))
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "state type gendurable_test.hiddenOrder has no field JSON stores")
	j := &gendurable.Job[*taggedAway]{Name: "tagged", Perform: func(context.Context, *gendurable.Run[*taggedAway]) error { return nil }}
	db := gendurabletest.NewDB(t, nil)
	eng, err := gendurable.New(db.Pool, &gendurable.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = eng.Insert(context.Background(), j.New(&taggedAway{N: 1}))
	require.ErrorIs(t, err, gendurable.ErrInvalidInsert)
	require.ErrorContains(t, err, "state type *gendurable_test.taggedAway has no field JSON stores")

	require.NoError(t, validates[promoted]())
	require.NoError(t, validates[marshalsHidden]())
	require.NoError(t, validates[struct{}]())
	require.NoError(t, validates[struct{ _ [0]func() }]())
	require.NoError(t, validates[map[string]any]())
	require.NoError(t, validates[int]())
}

// validates is the definition check of a one-step machine of state S.
func validates[S any]() error {
	m := &gendurable.Machine[S]{Name: "v", Start: "a", Steps: map[string]gendurable.StepFunc[S]{
		"a": func(context.Context, *gendurable.Run[S]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		}}}
	return m.ValidateOutcome("a", gendurable.Done(nil))
}

// States for TestAStateTypeJSONStoresNothingOfIsRefused.
type (
	//lint:ignore U1000 a field JSON leaves out is the point
	hiddenOrder struct{ item string }
	taggedAway  struct {
		N int `json:"-"`
		//lint:ignore U1000 a field JSON leaves out is the point
		note string
	}
	inner          struct{ Item string }
	promoted       struct{ inner }
	marshalsHidden struct{ item string }
)

func (m marshalsHidden) MarshalJSON() ([]byte, error) { return json.Marshal(m.item) }

// TestAStateTypeWhoseMarshalerJSONDoesNotCallIsRefused: encoding/json
// calls a MarshalJSON on *T only for an addressable T, and a state is
// encoded as the S value: a Machine[T] whose marshaler is on *T stores {}
// (json.Marshal of a big.Int value is {}), as does one whose marshalers
// come from two embedded structs (ambiguous, promoted to neither: the
// fields are walked). Both were accepted; a Machine[*T] is not refused.
func TestAStateTypeWhoseMarshalerJSONDoesNotCallIsRefused(t *testing.T) {
	t.Parallel()
	for _, b := range [][]byte{mustJSON(t, ptrMarshaled{item: "x"}), mustJSON(t, embedsPtrMarshaled{}), mustJSON(t, twoMarshalers{})} {
		require.Equal(t, "{}", string(b), "the premise: encoding/json stores nothing of these")
	}
	require.ErrorIs(t, validates[ptrMarshaled](), gendurable.ErrInvalidConfig)
	require.ErrorIs(t, validates[embedsPtrMarshaled](), gendurable.ErrInvalidConfig)
	require.ErrorIs(t, validates[twoMarshalers](), gendurable.ErrInvalidConfig)
	require.NoError(t, validates[*ptrMarshaled]())
	require.NoError(t, validates[*embedsPtrMarshaled]())
	require.NoError(t, validates[namedMarshaled]())
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

type (
	//lint:ignore U1000 a field JSON leaves out is the point
	ptrMarshaled       struct{ item string }
	embedsPtrMarshaled struct{ ptrMarshaled }
	//lint:ignore U1000 a field JSON leaves out is the point
	marshalerA struct{ a int }
	//lint:ignore U1000 a field JSON leaves out is the point
	marshalerB    struct{ b int }
	twoMarshalers struct {
		//lint:ignore U1000 the ambiguous embedding is the point
		marshalerA
		//lint:ignore U1000 the ambiguous embedding is the point
		marshalerB
	}
	namedMarshaled struct {
		marshalerA `json:"a"`
	}
)

func (p *ptrMarshaled) MarshalJSON() ([]byte, error) { return json.Marshal(p.item) }
func (marshalerA) MarshalJSON() ([]byte, error)      { return []byte(`"a"`), nil }
func (marshalerB) MarshalJSON() ([]byte, error)      { return []byte(`"b"`), nil }

// TestAStateTypeEmbeddingAPointerToAnUnexportedStructIsRefused: encoding/json
// writes the fields of an embedded *inner (inner unexported) and cannot
// decode them back ("cannot set embedded pointer to unexported struct"):
// every step of a row that had it set failed to decode, and one without it
// was stored as {} (a review); given a JSON name, its decode panics.
// Refused; embedded by value, or a pointer to an exported type, it is not.
func TestAStateTypeEmbeddingAPointerToAnUnexportedStructIsRefused(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(embedsPtrToUnexported{&inner{Item: "a"}})
	require.NoError(t, err)
	require.Error(t, json.Unmarshal(b, new(embedsPtrToUnexported)), "the premise: it does not decode")
	err = validates[embedsPtrToUnexported]()
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "embeds *gendurable_test.inner, a pointer to an unexported struct")
	require.ErrorIs(t, validates[*struct{ embedsPtrToUnexported }](), gendurable.ErrInvalidConfig, "embedded deeper")
	require.NoError(t, validates[promoted]())
	require.NoError(t, validates[struct{ *Inner }]())
	require.ErrorIs(t, validates[struct {
		*inner `json:"in"`
	}](), gendurable.ErrInvalidConfig, "named, its decode panics")
}

// States for TestAStateTypeEmbeddingAPointerToAnUnexportedStructIsRefused.
type (
	embedsPtrToUnexported struct{ *inner }
	Inner                 struct{ Item string }
)
