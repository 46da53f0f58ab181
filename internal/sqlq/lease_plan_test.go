package sqlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestThePruneClearsTheExpiredLeasesOfCancelledSteps: a step cancelled
// mid-step keeps its lease (its key's slot) until the lease ends, and
// nothing cleared it after: the key-holders index kept every such row of
// the retention, and each pick of the key read the key's expired ones (the
// claims it may revoke), as did WaitInfo for the key's holders — 5,000
// index entries and heap rows per pick for a key with 5,000 cancelled
// steps. The prune's sweep clears the leases of finished rows that ran out
// (a live one, and an expired one of a row not finished, are kept), and
// the pick and WaitInfo then read about what they return — once VACUUM
// has removed the index entries of the leases cleared (a bitmap scan reads
// dead entries until then). The test has a database of its own: a
// transaction of another package's test, open in a shared database, kept
// VACUUM from removing them (the pick then read 5,001 entries).
func TestThePruneClearsTheExpiredLeasesOfCancelledSteps(t *testing.T) {
	ctx := context.Background()
	url := dbtest.NewDatabase(t)
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, URL: url})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `".gendurable_instances`
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	const cancelled, finished = 5_000, 100_000
	// The bulk: finished rows of other keys.
	exec(`INSERT INTO `+s+` (fsm, queue, step, status, partition_key, finished_at)
		SELECT 'm', 'q', 'a', 'done', 'o' || (g % 1000), now() - interval '1 hour'
		FROM generate_series(1, $1::int) g`, finished)
	// What a cancel mid-step leaves once the lease ran out (cancelSQL):
	// failed, token cleared, lease kept; within the retention.
	exec(`INSERT INTO `+s+` (fsm, queue, step, status, partition_key, lease_expires_at, finished_at)
		SELECT 'm', 'q', 'a', 'failed', 'k', now() - interval '1 hour', now() - interval '1 hour'
		FROM generate_series(1, $1::int)`, cancelled)
	// Kept: a lease still live, and an expired one of a retried row.
	exec(`INSERT INTO ` + s + ` (fsm, queue, step, status, partition_key, lease_expires_at, finished_at)
		VALUES ('m', 'q', 'a', 'failed', 'k', now() + interval '10 minutes', now())`)
	exec(`INSERT INTO ` + s + ` (fsm, queue, step, status, partition_key, lease_expires_at, eligible_at)
		VALUES ('m', 'q', 'a', 'runnable', 'k', now() - interval '1 hour', now() + interval '1 hour')`)
	var runnable int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+` (fsm, queue, step, partition_key)
		VALUES ('m', 'q', 'a', 'k') RETURNING id`).Scan(&runnable))
	exec(`ANALYZE ` + s)

	p := &maintenance.Pruner{Queries: q, DB: pool, Batch: 1000}
	n, err := p.RunOnce(ctx, 7*24*time.Hour, nil)
	require.NoError(t, err)
	require.Zero(t, n, "nothing finished before the retention")
	exec(`VACUUM ` + s) // as autovacuum would, after 5,000 updates
	runPlanCasesOn(t, url, []planCase{
		{"pick", 100, func(t *testing.T, tx pgx.Tx) {
			r, err := q.Pick(ctx, tx, "q", sqlq.PickOpts{Limit: 10, Lease: time.Minute,
				Policies: []sqlq.KeyPolicy{{Prefix: "k", Limit: 2}}})
			require.NoError(t, err)
			require.Len(t, r.Claimed, 1)
		}},
		{"wait-info", 100, func(t *testing.T, tx pgx.Tx) {
			w, err := q.WaitInfo(ctx, tx, runnable, nil)
			require.NoError(t, err)
			require.Equal(t, int64(1), *w.KeyHeld)
		}},
	})
	var leases, live, runnableLease int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE lease_expires_at IS NOT NULL),
		count(*) FILTER (WHERE lease_expires_at > now()),
		count(*) FILTER (WHERE status = 'runnable' AND lease_expires_at IS NOT NULL) FROM `+s).Scan(&leases, &live, &runnableLease))
	require.Equal(t, int64(1), live, "a live lease is kept")
	require.Equal(t, int64(1), runnableLease, "a row not finished keeps its lease")
	require.Equal(t, int64(2), leases, "the finished rows' expired leases are cleared")

}
