package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// freshName is a schema name no one uses, dropped when the test ends.
func freshName(t *testing.T, pool *pgxpool.Pool) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := "gdscratch_" + hex.EncodeToString(b)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`) })
	return name
}

// TestEnsureKeepsItsOwnSchemaAndRefusesOthers: Ensure creates a missing
// schema marked and migrated, keeps a marked one with what is in it (where
// Prepare would drop it), creates it once when processes race for it, and
// refuses an unmarked one, changing nothing, with the caller's remedy.
func TestEnsureKeepsItsOwnSchemaAndRefusesOthers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	o := Options{Owner: "quickstart", Remedy: "drop it yourself"}

	own := freshName(t, pool)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs { // four processes starting at once: one creates it
		wg.Go(func() { errs[i] = Ensure(ctx, pool, own, o) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var comment string
	require.NoError(t, pool.QueryRow(ctx, `SELECT obj_description($1::regnamespace, 'pg_namespace')`, own).Scan(&comment))
	require.Contains(t, comment, "created by gendurable quickstart")
	v, err := migrate.Installed(ctx, pool, own)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)

	_, err = pool.Exec(ctx, `INSERT INTO "`+own+`".gendurable_queues (name) VALUES ('kept')`)
	require.NoError(t, err)
	require.NoError(t, Ensure(ctx, pool, own, o))
	var kept int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+own+`".gendurable_queues WHERE name = 'kept'`).Scan(&kept))
	require.Equal(t, 1, kept, "a marked schema keeps what is in it")

	other := freshName(t, pool)
	_, err = pool.Exec(ctx, `CREATE SCHEMA "`+other+`"; CREATE TABLE "`+other+`".mine (x int)`)
	require.NoError(t, err)
	err = Ensure(ctx, pool, other, o)
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, "holds 1 object and was not created by gendurable quickstart; drop it yourself")
	require.NotContains(t, err.Error(), "--reset-schema")
	var objects int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace`, other).Scan(&objects))
	require.Equal(t, 1, objects, "someone else's schema is left as it was")

	err = Prepare(ctx, pool, other, Options{Owner: "demo"})
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, "choose another --schema, or pass --reset-schema", "the default remedy")
}

// TestAMarkedSchemaWithSomeoneElsesRowsIsNotDropped: a schema demo or bench
// created is dropped on their next run only while it holds nothing but
// rows of their own machines. Instances of another machine, another
// machine's definition or an operator's queue row make it someone else's
// data: Prepare refuses it (ErrNotScratch, nothing changed) unless Reset,
// and Drop leaves it alone.
func TestAMarkedSchemaWithSomeoneElsesRowsIsNotDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout", "ship_item") // what the demo's package does in its init
	o := Options{Owner: "demo"}
	count := func(schema, table string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".`+table).Scan(&n))
		return n
	}
	for _, tc := range []struct{ name, insert, table string }{
		{"another machine's instances", `INSERT INTO {{s}}.gendurable_instances (fsm, step) VALUES ('billing', 'a'), ('checkout', 'a')`, "gendurable_instances"},
		{"another machine's definition", `INSERT INTO {{s}}.gendurable_machines (name, version, start_step, steps) VALUES ('billing', 1, 'a', '["a"]')`, "gendurable_machines"},
		{"an operator's paused queue", `INSERT INTO {{s}}.gendurable_queues (name, paused) VALUES ('orders', true)`, "gendurable_queues"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := freshName(t, pool)
			require.NoError(t, Prepare(ctx, pool, schema, o))
			_, err := pool.Exec(ctx, strings.ReplaceAll(tc.insert, "{{s}}", `"`+schema+`"`))
			require.NoError(t, err)
			before := count(schema, tc.table)

			err = Prepare(ctx, pool, schema, o)
			require.ErrorIs(t, err, ErrNotScratch)
			require.Contains(t, err.Error(), "holds rows they did not write")
			require.Equal(t, before, count(schema, tc.table), "a refused schema keeps its rows")
			require.ErrorIs(t, Drop(ctx, pool, schema), ErrNotScratch)
			require.Equal(t, before, count(schema, tc.table))

			reset := o
			reset.Reset = true
			require.NoError(t, Prepare(ctx, pool, schema, reset), "the operator's explicit reset drops it")
			require.Zero(t, count(schema, tc.table))
		})
	}

	// A schema someone else's workers are writing is refused without
	// waiting for their transactions (and so without holding them up
	// behind a lock request of its own).
	busy := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, busy, o))
	_, err := pool.Exec(ctx, `INSERT INTO "`+busy+`".gendurable_instances (fsm, step) VALUES ('billing', 'a')`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE "`+busy+`".gendurable_instances SET priority = 1`)
	require.NoError(t, err)
	start := time.Now()
	require.ErrorIs(t, Prepare(ctx, pool, busy, o), ErrNotScratch)
	require.Less(t, time.Since(start), 3*time.Second, "refused without waiting on the writer's lock")
	require.NoError(t, tx.Rollback(ctx))

	// Its own machines' rows, in every status, are the command's to drop,
	// and so are those of a machine another scratch command of the program
	// shares (bench reuses the demo's schema).
	Share("bench_job") // what bench's package does in its init
	schema := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, schema, o))
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('checkout', 'a'), ('ship_item', 'b'), ('bench_job', 'perform')`)
	require.NoError(t, err)
	require.NoError(t, Prepare(ctx, pool, schema, o))
	require.Zero(t, count(schema, "gendurable_instances"), "a rerun starts from an empty schema")
}
