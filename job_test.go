package gendurable_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/stretchr/testify/require"
)

func TestJobOutcomes(t *testing.T) {
	t.Parallel()
	var snoozed, failedOnce atomic.Bool
	job := &gendurable.Job[orderArgs]{
		Name: "jobs", MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 },
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			switch j.State.I {
			case 1: // succeeds
				return nil
			case 2: // fails once, then succeeds
				if failedOnce.CompareAndSwap(false, true) {
					return context.DeadlineExceeded
				}
				return nil
			case 3: // always fails
				return context.Canceled
			case 4: // cancelled: fails at once
				return gendurable.JobCancel(context.Canceled)
			case 5: // snoozes once without counting an attempt
				if snoozed.CompareAndSwap(false, true) {
					return gendurable.JobSnooze(10 * time.Millisecond)
				}
				return nil
			}
			return nil
		},
	}
	b := setup(t, nil, job)
	var ids []int64
	for i := 1; i <= 5; i++ {
		ids = append(ids, b.insert(job.New(orderArgs{I: i})))
	}
	ins := gendurabletest.WorkUntilFinished(t.Context(), t, b.eng, ids...)
	for _, in := range ins {
		require.Equal(t, gendurable.JobStep, in.Step)
	}
	succeeded, failedOnceThenDone, alwaysFailing, cancelled, snoozedOnce := ins[0], ins[1], ins[2], ins[3], ins[4]
	require.Equal(t, gendurable.StatusDone, succeeded.Status)
	require.Equal(t, 0, succeeded.Attempt)

	require.Equal(t, gendurable.StatusDone, failedOnceThenDone.Status)
	require.Equal(t, 1, failedOnceThenDone.Attempt)
	require.Len(t, failedOnceThenDone.Errors, 1)

	require.Equal(t, gendurable.StatusFailed, alwaysFailing.Status)
	require.Equal(t, 2, alwaysFailing.Attempt)
	require.Len(t, alwaysFailing.Errors, 3)

	require.Equal(t, gendurable.StatusFailed, cancelled.Status)
	require.Equal(t, 0, cancelled.Attempt, "a cancelled job is not retried")
	require.Len(t, cancelled.Errors, 1)
	require.Contains(t, cancelled.Errors[0].Error, "JobCancel: ")
	require.Contains(t, cancelled.Errors[0].Error, "; stopped: not retried")

	require.Equal(t, gendurable.StatusDone, snoozedOnce.Status)
	require.Equal(t, 0, snoozedOnce.Attempt, "a snooze does not count an attempt")
	require.Empty(t, snoozedOnce.Errors)
}

// TestJobWhoseArgsTypeChangedFailsAtOnceAndRetries pins a deploy that
// changes a job's args type without a new Version: a stored row whose args
// no longer decode fails at once (attempt 0, kind "state_decode", Perform
// not called, WaitResult's *FailedError says so), and a Retry after
// redeploying a type that fits runs it.
func TestJobWhoseArgsTypeChangedFailsAtOnceAndRetries(t *testing.T) {
	t.Parallel()
	type argsV1 struct {
		Order string `json:"order"`
	}
	type argsV2 struct {
		Order int `json:"order"` // the next deploy made it a number
	}
	var performed atomic.Int32
	v1 := &gendurable.Job[argsV1]{Name: "charge", Perform: func(ctx context.Context, j *gendurable.Run[argsV1]) error { return nil }}
	v2 := &gendurable.Job[argsV2]{Name: "charge", Perform: func(ctx context.Context, j *gendurable.Run[argsV2]) error {
		performed.Add(1)
		return nil
	}}
	b := setup(t, nil, v2)
	producer, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{v1}})
	require.NoError(t, err)
	res, err := producer.Insert(context.Background(), v1.New(argsV1{Order: "A-17"}))
	require.NoError(t, err)
	b.start()
	_, err = gendurable.WaitResult[any](context.Background(), b.eng, res.ID)
	var f *gendurable.FailedError
	require.ErrorAs(t, err, &f)
	require.Equal(t, "state_decode", f.Kind)
	require.Contains(t, f.Reason, "state does not decode")
	r := b.row(res.ID)
	require.Equal(t, 0, r.Attempt, "no retry")
	require.Len(t, r.Errors, 1)
	require.Zero(t, performed.Load())

	require.NoError(t, b.eng.Stop(context.Background()))
	fixed, _ := startEngine(t, b, v1)
	require.NoError(t, fixed.Retry(context.Background(), res.ID))
	b.waitStatus(res.ID, "done", 10*time.Second)
}

// TestABackoffThatPanicsOrGoesNegativeRetriesByTheDefault: a user Backoff
// that returns a negative delay, or panics, does not fail the job at its
// first error (Replay refused the negative delay, and the panic failed
// Handle): the retry waits DefaultBackoff's delay instead.
func TestABackoffThatPanicsOrGoesNegativeRetriesByTheDefault(t *testing.T) {
	t.Parallel()
	for name, backoff := range map[string]func(int) time.Duration{
		"negative": func(int) time.Duration { return -time.Second },
		"panics":   func(int) time.Duration { panic("oops") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := &gendurable.Job[orderArgs]{Name: "bad_backoff_" + name, MaxAttempts: 3, Backoff: backoff,
				Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return context.DeadlineExceeded }}
			b := setup(t, nil, job)
			id := b.insert(job.New(orderArgs{I: 1}))
			b.start()
			eventually(t, 10*time.Second, func() bool {
				return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = `+strconv.FormatInt(id, 10)+
					` AND attempt = 1 AND status = 'runnable'`) == 1
			}, "the job was not set to retry")
			in := b.row(id)
			require.Equal(t, "runnable", in.Status, "failed at its first error")
			require.Greater(t, in.EligibleAt.Sub(in.Now), 100*time.Millisecond, "DefaultBackoff's delay (at least 1 s, jittered)")
		})
	}
}

// TestAJobRefusedForItsMissingPerformRunsThePerformSetAfter: a Job without
// Perform is refused, and the Perform set afterwards is the one its
// instances run. The job's machine was built, without Perform, at the
// refusal: every run then failed "job has no Perform func" (a
// library-misuse probe).
func TestAJobRefusedForItsMissingPerformRunsThePerformSetAfter(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "late"}
	db := gendurabletest.NewDB(t, nil)
	_, err := gendurable.New(db.Pool, &gendurable.Config{Schema: db.Schema, Machines: []gendurable.Definition{job}})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	var ran atomic.Int32
	job.Perform = func(context.Context, *gendurable.Run[orderArgs]) error { ran.Add(1); return nil }
	b := bundleOn(t, db.Pool, db.Schema, nil, job)
	b.start()
	b.waitStatus(b.insert(job.New(orderArgs{})), "done", 10*time.Second)
	require.EqualValues(t, 1, ran.Load())
}

// TestJobPerformResult: a job's PerformResult stores what it returns as the
// instance's result, as a machine's Done does (WaitResult reads it); a
// snooze and a retry store nothing until the run that succeeds; a job with
// both Perform and PerformResult, or neither, is refused.
func TestJobPerformResult(t *testing.T) {
	t.Parallel()
	type receipt struct {
		ID    string `json:"id"`
		Tries int    `json:"tries"`
	}
	var tries atomic.Int32
	job := &gendurable.Job[orderArgs]{
		Name: "with_result", MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 },
		PerformResult: func(ctx context.Context, j *gendurable.Run[orderArgs]) (any, error) {
			switch n := tries.Add(1); n {
			case 1:
				return receipt{ID: "snoozed"}, gendurable.JobSnooze(10 * time.Millisecond)
			case 2:
				return receipt{ID: "failed"}, context.DeadlineExceeded
			default:
				return receipt{ID: "r-" + strconv.Itoa(j.State.I), Tries: int(n)}, nil
			}
		},
	}
	b := setup(t, nil, job)
	id := b.insert(job.New(orderArgs{I: 7}))
	b.start()
	got, err := gendurable.WaitResult[receipt](t.Context(), b.eng, id)
	require.NoError(t, err)
	require.Equal(t, receipt{ID: "r-7", Tries: 3}, got)
	in, err := b.eng.Instance(t.Context(), id)
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"r-7","tries":3}`, string(in.Result))
	require.Equal(t, 1, in.Attempt, "the snooze counted no attempt, the failure one")

	// A result that cannot be stored fails the job at once: another
	// attempt would only run its work again (a review: it ran 3 times; a
	// probe: 3 times too for a result over the engine's limits).
	var runs [4]atomic.Int32
	results := [4]any{
		func() {},                  // encoding/json refuses it
		strings.Repeat("x", 2<<10), // over MaxStateBytes (1 KiB below)
		json.RawMessage(strings.Repeat("[", 40) + strings.Repeat("]", 40)), // deeper than MaxJSONDepth (32)
		json.Number("1e200000"), // beyond numeric
	}
	bad := &gendurable.Job[int]{Name: "bad_result", MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 },
		PerformResult: func(_ context.Context, r *gendurable.Run[int]) (any, error) {
			runs[r.State].Add(1)
			return results[r.State], nil
		}}
	db2 := gendurabletest.NewDB(t, nil)
	cfg2 := fastConfig(db2.Schema, bad)
	cfg2.MaxStateBytes, cfg2.MaxJSONDepth = 1<<10, 32
	b2 := bundleOn(t, db2.Pool, db2.Schema, cfg2, bad)
	var badIDs [4]int64
	for i := range badIDs {
		badIDs[i] = b2.insert(bad.New(i))
	}
	b2.start()
	for i, badID := range badIDs {
		_, err = gendurable.WaitResult[any](t.Context(), b2.eng, badID)
		var failed *gendurable.FailedError
		require.ErrorAs(t, err, &failed, i)
		require.Equal(t, "stop", failed.Kind, i)
		require.Contains(t, failed.Reason, "PerformResult's result cannot be stored", i)
		require.Equal(t, int32(1), runs[i].Load(), "the work ran once: %d", i)
	}

	both := &gendurable.Job[orderArgs]{Name: "both",
		Perform:       func(context.Context, *gendurable.Run[orderArgs]) error { return nil },
		PerformResult: func(context.Context, *gendurable.Run[orderArgs]) (any, error) { return nil, nil }}
	_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{both}})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "both Perform and PerformResult")
	neither := &gendurable.Job[orderArgs]{Name: "neither"}
	_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{neither}})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
}

// TestAJobsSnoozeIsASnoozedStepEvent: StepEvent.Snoozed says "the step
// returned a JobSnooze that was honoured (a machine's default Handle, a
// Job)", with Err the *SnoozeError. A job's snooze reached the hooks as a
// plain replay with no error and Snoozed false (a River user's probe: an
// alerting hook could not tell a job's snooze from anything else), while a
// machine step's snooze was reported as documented.
func TestAJobsSnoozeIsASnoozedStepEvent(t *testing.T) {
	t.Parallel()
	var jobSnoozed, stepSnoozed atomic.Bool
	job := &gendurable.Job[orderArgs]{
		Name: "snooze_event_job",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			if jobSnoozed.CompareAndSwap(false, true) {
				return gendurable.JobSnooze(10 * time.Millisecond)
			}
			return nil
		},
	}
	m := &gendurable.Machine[orderArgs]{
		Name: "snooze_event_machine", Start: "poll",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"poll": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				if stepSnoozed.CompareAndSwap(false, true) {
					return gendurable.Outcome{}, gendurable.JobSnooze(10 * time.Millisecond)
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	var mu sync.Mutex
	var replays []gendurable.StepEvent
	cfg := fastConfig("", job, m)
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(ctx context.Context, ev gendurable.Event) {
		if e, ok := ev.(*gendurable.StepEvent); ok && e.Outcome == "replay" {
			mu.Lock()
			replays = append(replays, *e)
			mu.Unlock()
		}
	})}
	b := setup(t, cfg)
	ids := []int64{b.insert(job.New(orderArgs{I: 1})), b.insert(m.New(orderArgs{I: 2}))}
	for _, in := range gendurabletest.WorkUntilFinished(t.Context(), t, b.eng, ids...) {
		require.Equal(t, gendurable.StatusDone, in.Status)
		require.Equal(t, 0, in.Attempt, "a snooze counts no attempt")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, replays, 2)
	for _, e := range replays {
		var snooze *gendurable.SnoozeError
		require.True(t, e.Snoozed, "%s: a honoured snooze is Snoozed", e.Machine)
		require.ErrorAs(t, e.Err, &snooze, "%s: Err is the *SnoozeError", e.Machine)
		require.Equal(t, 10*time.Millisecond, snooze.Delay)
		require.False(t, e.Interrupted, e.Machine)
	}
}
