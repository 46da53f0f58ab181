package gendurable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
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
			require.Less(t, at.Sub(released), 150*time.Millisecond, "round %d: woken by the poll, not by the step", round)
		case <-time.After(10 * time.Second):
			t.Fatal("WaitResult never returned")
		}
	}
}
