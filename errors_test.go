package gendurable_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestCallsOnAnOlderSchemaAreErrSchemaVersion: an engine that was never
// started (an insert-only process, or the CLI) used on a schema migrated to
// an older version than the library's gets ErrSchemaVersion naming both
// versions and the command to run — not the database's bare "column
// key_limit of relation gendurable_instances does not exist", nor
// ErrNotMigrated's "has no gendurable tables" for a schema that has some.
func TestCallsOnAnOlderSchemaAreErrSchemaVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	job := &gendurable.Job[orderArgs]{Name: "j", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)
	calls := map[string]func() error{
		"insert": func() error { _, err := eng.Insert(ctx, job.New(orderArgs{})); return err },
		"signal": func() error { _, err := eng.Signal(ctx, 1, "go", nil, nil); return err },
		"queues": func() error { _, err := eng.Queues(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, gendurable.ErrSchemaVersion, name)
		require.NotErrorIs(t, err, gendurable.ErrNotMigrated, name)
		require.ErrorContains(t, err, "is at version 1, this library needs "+strconv.Itoa(migrate.Latest()), name)
		require.ErrorContains(t, err, "gendurable migrate up --schema "+schema, name)
	}
	// Start checks the version itself, and says it in the same words.
	err = eng.Start(ctx)
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
	require.EqualError(t, err, fmt.Sprintf("%v: start: schema %q is at version 1, this library needs %d; run `gendurable migrate up --schema %s` (or migrate.Up)",
		gendurable.ErrSchemaVersion, schema, migrate.Latest(), schema))
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	for name, call := range calls {
		if err := call(); err != nil {
			require.NotErrorIs(t, err, gendurable.ErrSchemaVersion, name)
		}
	}
}

// TestSchemaVersionReadEndsWithTheCaller: after a statement met a missing
// column, the read of the schema version that names the fix runs under the
// caller's context. It read under a context of its own, for 5 s: a caller of
// InsertTx holding its pool's only connection, with a 300 ms deadline, waited
// those 5 s for a connection it held itself.
func TestSchemaVersionReadEndsWithTheCaller(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	job := &gendurable.Job[orderArgs]{Name: "j", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	callCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = eng.InsertTx(callCtx, tx, job.New(orderArgs{}))
	took := time.Since(start)
	require.NoError(t, tx.Rollback(ctx))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the database's error, wrapped")
	require.NotErrorIs(t, err, gendurable.ErrSchemaVersion, "the version was not read")
	require.Less(t, took, 2*time.Second, "the caller's deadline ended the version read")

	// With the connection free, the same call names the versions.
	_, err = eng.Insert(ctx, job.New(orderArgs{}))
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
}
