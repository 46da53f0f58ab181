package gendurable_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

type probeState struct {
	Do   string `json:"do"`
	N    int    `json:"n"`
	Seen []int  `json:"seen,omitempty"`
}

// probeMachine's step "a" does what the state says; "b" records what it saw.
func probeMachine(handleCalls *atomic.Int32) *gendurable.Machine[probeState] {
	return &gendurable.Machine[probeState]{
		Name:        "probe",
		Start:       "a",
		MaxAttempts: 3,
		Backoff:     func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				s := r.State
				s.N++
				switch s.Do {
				case "next":
					return r.Next("b", s), nil
				case "next_delay":
					return r.Next("b", s).After(time.Hour), nil
				case "replay":
					return r.Replay(s, time.Hour), nil
				case "done":
					return gendurable.Done(map[string]int{"n": s.N}), nil
				case "stop":
					return gendurable.Stop("told to stop"), nil
				case "error":
					return gendurable.Outcome{}, errors.New("boom")
				case "panic":
					panic("kaboom")
				case "invalid_step":
					return r.Next("nope", s), nil
				case "zero":
					return gendurable.Outcome{}, nil
				case "bad_result":
					return gendurable.Done(func() {}), nil
				}
				return gendurable.Stop("unknown action " + s.Do), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(r.State), nil
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			if handleCalls != nil {
				handleCalls.Add(1)
			}
			if r.Attempt+1 >= r.MaxAttempts {
				return gendurable.Stop("gave up"), nil
			}
			return r.Replay(r.State, 0), nil
		},
	}
}

func near(t *testing.T, want, got time.Time, tol time.Duration) {
	t.Helper()
	require.WithinDuration(t, want, got, tol)
}

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
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(probeState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "step failed; Handle failed: panic: handle exploded", r.Errors[0]["error"])
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
