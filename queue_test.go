package gendurable_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestPauseRefusesUnknownQueues: pausing or resuming a name with no row and
// no instance (a typo, "\t") writes nothing and returns ErrUnknownQueue, so
// no phantom queue appears in Queues; Create, an instance, or the engine's
// own configured queue make a queue known.
func TestPauseRefusesUnknownQueues(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("queues")
	var logs bytes.Buffer
	cfg := fastConfig("", job)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, cfg)
	// An admin engine, as the CLI makes: no queues of its own.
	admin, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema})
	require.NoError(t, err)
	ctx := context.Background()

	require.ErrorIs(t, admin.Pause(ctx, "nosuchqueue"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, admin.Resume(ctx, "nosuchqueue"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, admin.SetPaused(ctx, "nosuchqueue", true, &gendurable.QueueOpts{}), gendurable.ErrUnknownQueue)
	// A name no queue can have is invalid input, refused before any SQL.
	require.ErrorIs(t, admin.Pause(ctx, "\t"), gendurable.ErrInvalidInput)
	require.ErrorIs(t, admin.SetPaused(ctx, "\t", true, &gendurable.QueueOpts{Create: true}), gendurable.ErrInvalidInput)
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues`))
	qs, err := admin.Queues(ctx)
	require.NoError(t, err)
	require.Empty(t, qs, "no phantom queue")

	// The working engine's configured queue is known before any instance.
	require.NoError(t, b.eng.Pause(ctx, "default"))
	require.Contains(t, logs.String(), "gendurable: queue paused")
	// Known from then on, through its row, to every engine.
	require.NoError(t, admin.Resume(ctx, "default"))
	// A queue with an instance is known.
	b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "emails"}))
	require.NoError(t, admin.Pause(ctx, "emails"))
	// Create makes a new one on purpose.
	require.NoError(t, admin.SetPaused(ctx, "later", true, &gendurable.QueueOpts{Create: true}))
	qs, err = admin.Queues(ctx)
	require.NoError(t, err)
	paused := map[string]bool{}
	for _, q := range qs {
		paused[q.Queue] = q.Paused
	}
	require.Equal(t, map[string]bool{"default": false, "emails": true, "later": true}, paused)
}

// TestRemoveQueue: an operator removes the row of a queue without
// instances; a queue with instances (finished ones too) is refused with
// ErrQueueNotEmpty and keeps its row; a name without a row is ErrUnknownQueue.
func TestRemoveQueue(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("remove")
	var logs bytes.Buffer
	cfg := fastConfig("", job)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := setup(t, cfg)
	ctx := context.Background()

	require.NoError(t, b.eng.SetPaused(ctx, "typo", true, &gendurable.QueueOpts{Create: true}))
	id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "busy"}))
	require.NoError(t, b.eng.Pause(ctx, "busy"))

	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "busy"), gendurable.ErrQueueNotEmpty)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1`, id)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "busy"), gendurable.ErrQueueNotEmpty, "finished instances count until pruned")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues WHERE name = 'busy' AND paused`))

	require.NoError(t, b.eng.RemoveQueue(ctx, "typo"))
	require.Contains(t, logs.String(), "gendurable: queue removed")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_queues WHERE name = 'typo'`))
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "typo"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "never"), gendurable.ErrUnknownQueue)
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, ""), gendurable.ErrInvalidInput)
}
