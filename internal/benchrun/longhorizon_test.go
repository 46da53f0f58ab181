package benchrun

import (
	"context"
	"io"
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

// TestLongHorizonRetentionFromEnv: GENDURABLE_RETENTION unset keeps
// everything; a duration of at least a second is the retention; anything
// else is an environment error (exit 2), before any connection.
func TestLongHorizonRetentionFromEnv(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]time.Duration{"": 0, " ": 0, "90s": 90 * time.Second, "10m": 10 * time.Minute, "1s": time.Second} {
		got, err := retentionFromEnv(func(string) string { return raw })
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for _, raw := range []string{"0", "0s", "-1m", "999ms", "1 minute", "10", "1h\x00"} {
		_, err := retentionFromEnv(func(string) string { return raw })
		require.ErrorIs(t, err, longhorizon.ErrInvalidEnv, raw)
		require.ErrorContains(t, err, RetentionEnv)
	}
	// Bad retention stops the adapter before it connects (the URL is unreachable).
	env := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "PRODUCER_RATE": "1",
		"WORKER_COUNT": "1", RetentionEnv: "soon"}
	err := longHorizon(context.Background(), func(k string) string { return env[k] }, io.Discard, io.Discard)
	require.ErrorIs(t, err, longhorizon.ErrInvalidEnv)
	require.Equal(t, time.Second, pruneIntervalFor(time.Second))
	require.Equal(t, 15*time.Second, pruneIntervalFor(time.Minute))
	require.Equal(t, gendurable.DefaultPruneInterval, pruneIntervalFor(30*24*time.Hour))
}
