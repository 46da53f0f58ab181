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
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
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

// TestEventRelationsResolve: the descriptor's table and index names are
// what a harness passes to to_regclass; for a schema that is not a plain
// lower-case identifier (upper case) they must still resolve to
// the schema's relations, and a plain one is left unquoted.
func TestEventRelationsResolve(t *testing.T) {
	t.Parallel()
	pool, plain := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	mixed := "LH_Mixed_" + plain
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{mixed}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{mixed}.Sanitize()+` CASCADE`)
	})
	_, err = migrate.Up(ctx, pool, mixed)
	require.NoError(t, err)
	names := []string{"gendurable_instances", "gendurable_instances_pkey", "gendurable_instances_pick_plain",
		"gendurable_instances_pick_keyed", "gendurable_instances_lease", "gendurable_instances_finished"}
	require.Equal(t, plain+".gendurable_instances", eventRelations(plain, names[0])[0])
	for _, schema := range []string{plain, mixed} {
		for _, rel := range eventRelations(schema, names...) {
			var ns string
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce((SELECT n.nspname FROM pg_class c
				JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)), '')`, rel).Scan(&ns))
			require.Equal(t, schema, ns, "to_regclass(%q)", rel)
		}
	}
}
