package benchrun

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/longhorizon"
	"github.com/stretchr/testify/require"
)

// TestLongHorizonEngineKeepsOthersFinishedInstances: the long-horizon
// adapter runs in the environment's schema (public by default), beside
// whatever instances others keep there; its engine must not prune them. A
// finished instance of someone else's, ten days old, survives the
// adapter's engine (its prune loop made to run at once).
func TestLongHorizonEngineKeepsOthersFinishedInstances(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 8})
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, status, finished_at)
		VALUES ('theirs', 'a', 'done', now() - interval '10 days')`)
	require.NoError(t, err)
	job := &gendurable.Job[longhorizon.Job]{Name: "long_horizon_job", Perform: func(context.Context, *gendurable.Run[longhorizon.Job]) error { return nil }}
	cfg := longHorizonConfig(schema, job, 2, completions{&longhorizon.Telemetry{}}, slog.New(slog.DiscardHandler))
	cfg.PruneInterval = 20 * time.Millisecond // instead of an hour into the run
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, eng.Start(ctx))
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, eng.Stop(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE fsm = 'theirs'`).Scan(&n))
	require.Equal(t, 1, n, "the adapter's engine pruned an instance it did not create")
}
