package migrate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// stallingDB hands out transactions that go silent, as a migrator that was
// stopped (Ctrl-Z) or cut off from the server, just before the version's
// stamp: after the version's ALTER TABLE, holding the table's exclusive
// lock.
type stallingDB struct {
	migrate.DB
	stall time.Duration
}

func (d stallingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return stallingTx{Tx: tx, stall: d.stall}, nil
}

type stallingTx struct {
	pgx.Tx
	stall time.Duration
}

func (t stallingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.HasPrefix(sql, "COMMENT ON TABLE") {
		select {
		case <-time.After(t.stall):
		case <-ctx.Done():
		}
	}
	return t.Tx.Exec(ctx, sql, args...)
}

// TestAStalledMigratorDoesNotHoldTheWorkersForLong: a migrator that goes
// silent while it holds the instances table's exclusive lock (an upgrade
// probe: its connection cut off after a version's ALTER TABLE) stopped
// every worker's pick, heartbeat, outcome and reap for a minute, the
// idle limit of the library's own transactions: every running step's
// lease was lost and charged. The server ends such a migration within
// sqlq.MigrateIdleLimit, and the statements behind it go through.
func TestAStalledMigratorDoesNotHoldTheWorkersForLong(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, alteringVersion-1)
	require.NoError(t, err)

	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	migrated := make(chan error, 1)
	go func() {
		_, err := migrate.UpTo(mctx, stallingDB{DB: pool, stall: sqlq.MigrateIdleLimit + 7*time.Second}, schema, alteringVersion)
		migrated <- err
	}()
	// Wait until the migration holds the table's exclusive lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND granted)`,
			`"`+schema+`".gendurable_instances`).Scan(&held))
		if held {
			break
		}
		require.True(t, time.Now().Before(deadline), "the migration never took the table's lock")
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	qctx, qcancel := context.WithTimeout(ctx, sqlq.MigrateIdleLimit+5*time.Second)
	defer qcancel()
	var n int
	require.NoError(t, pool.QueryRow(qctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n),
		"a worker's statement waited for the silent migrator's lock")
	waited := time.Since(start)
	t.Logf("a statement behind the silent migrator waited %v", waited.Round(time.Millisecond))
	require.Less(t, waited, sqlq.MigrateIdleLimit+2*time.Second)
	require.Error(t, <-migrated, "the silent migration was ended by the server")
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, alteringVersion-1, v, "nothing of the ended version applied")
	// The next migration completes it.
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
}
