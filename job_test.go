package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
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
	b.start()
	ids := map[int]int64{}
	for i := 1; i <= 5; i++ {
		ids[i] = b.insert(job.New(orderArgs{I: i}))
	}
	r := b.waitStatus(ids[1], "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, "perform", r.Step)

	r = b.waitStatus(ids[2], "done", 10*time.Second)
	require.Equal(t, 1, r.Attempt)
	require.Len(t, r.Errors, 1)

	r = b.waitStatus(ids[3], "failed", 10*time.Second)
	require.Equal(t, 2, r.Attempt)
	require.Len(t, r.Errors, 3)

	r = b.waitStatus(ids[4], "failed", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "a cancelled job is not retried")
	require.Len(t, r.Errors, 1)
	require.Contains(t, r.Errors[0]["error"], "job cancelled")

	r = b.waitStatus(ids[5], "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "a snooze does not count an attempt")
	require.Empty(t, r.Errors)
}
