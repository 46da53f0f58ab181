package gendurable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
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
