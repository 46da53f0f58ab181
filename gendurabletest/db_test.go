package gendurabletest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Parallel tests each get a schema of their own, which is gone once the
// test ended.
func TestNewDBParallel(t *testing.T) {
	var mu sync.Mutex
	var schemas []string
	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"a", "b", "c"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 2})
				require.EqualValues(t, 2, db.Pool.Config().MaxConns)
				if name == "a" {
					// And the default is the documented one.
					require.EqualValues(t, gendurabletest.DefaultMaxConns, gendurabletest.NewDB(t, nil).Pool.Config().MaxConns)
				}
				eng := db.NewEngine(t, &gendurable.Config{Machines: []gendurable.Definition{orderMachine}})
				_, err := eng.Insert(t.Context(), orderMachine.New(order{Item: name}))
				require.NoError(t, err)
				// Only this test's insert is in its schema.
				got := gendurabletest.RequireInserted(t.Context(), t, eng, orderMachine, nil)
				require.Equal(t, name, got.State.Item)
				mu.Lock()
				schemas = append(schemas, db.Schema)
				mu.Unlock()
			})
		}
	})
	require.Len(t, schemas, 3)
	conn, err := pgx.Connect(context.Background(), databaseURL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var left int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, schemas).Scan(&left))
	require.Zero(t, left, "the schemas are dropped when their tests end")
}

func TestNewDBSkipsWithoutADatabase(t *testing.T) {
	t.Setenv(gendurabletest.DatabaseURLEnv, "")
	t.Setenv("DATABASE_URL", "")
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) { gendurabletest.NewDB(tb, nil) }))
	require.Equal(t, "SKIP gendurabletest: no database to test against: set GENDURABLE_TEST_DATABASE_URL or DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test)", f.message())
}

func TestNewEngineInvalidConfig(t *testing.T) {
	t.Parallel()
	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 1})
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		db.NewEngine(tb, &gendurable.Config{Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: -1}}})
	}))
	require.Contains(t, f.message(), "gendurabletest: gendurable: invalid config: queue \"default\": negative Concurrency")
}
