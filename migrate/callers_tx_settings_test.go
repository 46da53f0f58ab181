package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/stretchr/testify/require"
)

// TestACallersTransactionKeepsItsSettings: migrate in a transaction of the
// caller's (db a pgx.Tx, as To documents) limits each version's idle to
// MigrateIdleLimit and its lock waits to MigrateLockWait — set_config(…,
// true), which a released savepoint keeps for the rest of the caller's
// transaction. The caller's own work after the migration, in the same
// transaction, then ran under a 3 s idle limit: a pause of a few seconds on
// the client (a prompt, a call elsewhere) and the server ended the session,
// the caller's transaction and its migration with it.
func TestACallersTransactionKeepsItsSettings(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	show := func() (idle, lock string) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')`).Scan(&idle, &lock))
		return
	}
	idle, lock := show()
	_, err = migrate.Up(ctx, tx, schema)
	require.NoError(t, err)
	idleAfter, lockAfter := show()
	t.Logf("before %s/%s after %s/%s", idle, lock, idleAfter, lockAfter)
	require.Equal(t, idle, idleAfter, "the caller's idle limit after the migration")
	require.Equal(t, lock, lockAfter, "the caller's lock wait after the migration")

	time.Sleep(sqlq.MigrateIdleLimit + time.Second)
	var v string
	require.NoError(t, tx.QueryRow(ctx, `SELECT obj_description(($1 || '.gendurable_instances')::regclass, 'pg_class')`, `"`+schema+`"`).Scan(&v),
		"the caller's transaction outlived a pause of its own after the migration")
	require.NoError(t, tx.Commit(ctx))
}
