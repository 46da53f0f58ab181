package gendurable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestReapedRowKeepsItsPlaceInTheBacklog: a reaped row goes back to
// runnable with its original eligible_at, so it runs before the rows that
// became eligible after it, not after the whole backlog.
func TestReapedRowKeepsItsPlaceInTheBacklog(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []int64
	job := &gendurable.Job[orderArgs]{
		Name: "backlog",
		Perform: func(_ context.Context, j *gendurable.Run[orderArgs]) error {
			mu.Lock()
			order = append(order, j.ID)
			mu.Unlock()
			return nil
		},
	}
	cfg := fastConfig("", job)
	cfg.ReaperInterval = -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	reaped := b.insert(job.New(orderArgs{}))
	var backlog []int64
	for range 5 {
		backlog = append(backlog, b.insert(job.New(orderArgs{})))
	}
	// The first row became eligible an hour ago and was claimed by a worker
	// that died; the backlog became eligible a minute ago.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() - interval '1 minute' WHERE id <> $1`, reaped)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', eligible_at = now() - interval '1 hour',
	          claim_token = nextval('{{s}}.gendurable_claim_token_seq'), lease_expires_at = now() - interval '1 second'
	        WHERE id = $1`, reaped)
	before := b.row(reaped).EligibleAt

	n, err := b.eng.Reap(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := b.row(reaped)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, 1, r.Attempt)
	require.WithinDuration(t, before, r.EligibleAt, time.Millisecond, "the reap moved the row's eligible_at")

	b.start()
	for _, id := range backlog {
		b.waitStatus(id, "done", 20*time.Second)
	}
	b.waitStatus(reaped, "done", 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, reaped, order[0], "the reaped row ran after the backlog: %v", order)
}
