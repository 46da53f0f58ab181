package gendurable_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
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
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	for name, call := range calls {
		if err := call(); err != nil {
			require.NotErrorIs(t, err, gendurable.ErrSchemaVersion, name)
		}
	}
}
