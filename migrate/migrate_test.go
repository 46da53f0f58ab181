package migrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/stretchr/testify/require"
)

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()

	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Zero(t, v)

	res, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{From: 0, To: migrate.Latest(), Applied: allVersions()}, res)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)

	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "up is idempotent")

	res, err = migrate.Down(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()), res.Applied)
	var tables int
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "down leaves nothing behind")

	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
}

func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 8})
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]migrate.Result, 6)
	errs := make([]error, 6)
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], errs[i] = migrate.Up(ctx, pool, schema) }()
	}
	wg.Wait()
	applied := 0
	for i := range results {
		require.NoError(t, errs[i])
		applied += len(results[i].Applied)
	}
	require.Equal(t, migrate.Latest(), applied, "each migration was applied exactly once")
}

func TestInvalidSchemaIsRejected(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	for _, bad := range []string{"", "1abc", `a"b`, "a b", "a;drop", strings.Repeat("x", 64), "ünï"} {
		_, err := migrate.Up(context.Background(), pool, bad)
		require.ErrorIs(t, err, migrate.ErrInvalidSchema, bad)
		_, err = migrate.SQL(bad, 0, 1)
		require.ErrorIs(t, err, migrate.ErrInvalidSchema, bad)
	}
}

func TestPrintedSQLInstallsTheSchema(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	up, err := migrate.SQL(schema, 0, migrate.Latest())
	require.NoError(t, err)
	require.Contains(t, up, "CREATE TABLE \""+schema+"\".gendurable_instances")
	_, err = pool.Exec(ctx, up) // what a user's own migration tool would run
	require.NoError(t, err)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v, "the printed SQL records the version too")

	down, err := migrate.SQL(schema, migrate.Latest(), 0)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, down)
	require.NoError(t, err)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Zero(t, v)
}

func allVersions() []int {
	var vs []int
	for v := 1; v <= migrate.Latest(); v++ {
		vs = append(vs, v)
	}
	return vs
}

func reversed(vs []int) []int {
	out := make([]int, len(vs))
	for i, v := range vs {
		out[len(vs)-1-i] = v
	}
	return out
}

// TestStepwiseUpgrade installs version 1, puts data in it, and upgrades: an
// existing installation keeps its rows.
func TestStepwiseUpgrade(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	res, err := migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, res.Applied)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('m', 'a')`)
	require.NoError(t, err)
	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, allVersions()[1:], res.Applied)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE inbox = '{}'`).Scan(&n))
	require.Equal(t, 1, n, "the row survived and got the new columns' defaults")
	res, err = migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()[1:]), res.Applied)
}
