package sqlq_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestOwnTransactionsEndWhenLeftIdle: every transaction of the library's
// own that spans round trips limits how long the server lets it wait on
// its client (docs/design.md §2), so a client cut off without its socket
// closing does not hold locks and a snapshot for the OS keepalive's hours.
// A WithTx outcome's transaction (BeginIdleLimited) is ended once idle for
// its limit; prune, throughput and migrate set a minute.
func TestOwnTransactionsEndWhenLeftIdle(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()

	t.Run("WithTx", func(t *testing.T) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlq.BeginIdleLimited(300 * time.Millisecond)})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var limit string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&limit))
		require.Equal(t, "300ms", limit)
		time.Sleep(time.Second) // idle, waiting on this client
		_, err = tx.Exec(ctx, `SELECT 1`)
		var pgErr *pgconn.PgError
		require.True(t, (errors.As(err, &pgErr) && pgErr.Code == "25P03") || errors.Is(err, io.EOF) || tx.Conn().IsClosed(),
			"the server ended the idle transaction: %v", err)
		// The setting is the transaction's alone: a session after it has
		// the server's default again.
		var after string
		require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&after))
		require.NotEqual(t, "300ms", after)
	})
	// A stricter limit the session has (an administrator's, for the role
	// or the database) is kept; a looser one gives way.
	for _, c := range []struct{ session, ours, want string }{
		{"100ms", "with", "100ms"}, {"10min", "with", "300ms"}, {"10s", "prune", "10s"}, {"10min", "prune", "1min"},
	} {
		t.Run("session "+c.session+" "+c.ours, func(t *testing.T) {
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', $1, false)`, c.session)
			require.NoError(t, err)
			defer func() { _, _ = conn.Exec(ctx, `RESET idle_in_transaction_session_timeout`) }()
			var tx pgx.Tx
			if c.ours == "with" {
				tx, err = conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlq.BeginIdleLimited(300 * time.Millisecond)})
				require.NoError(t, err)
			} else {
				tx, err = conn.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, sqlq.IdleLimitSettings[c.ours])
				require.NoError(t, err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var limit string
			require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&limit))
			require.Equal(t, c.want, limit)
		})
	}
	t.Run("retry", func(t *testing.T) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlq.BeginRetry})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var limit string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&limit))
		require.Equal(t, "1min", limit)
	})
	for name, first := range sqlq.IdleLimitSettings {
		t.Run(name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var args []any
			if name == "migrate" {
				args = []any{"idle_test"}
			}
			_, err = tx.Exec(ctx, first, args...)
			require.NoError(t, err)
			var limit string
			require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&limit))
			want := "1min"
			if name == "migrate" {
				want = "3s" // MigrateIdleLimit: a migration waits on its client the least
			}
			require.Equal(t, want, limit)
		})
	}
}

// TestPruneCountsNoBatchWhoseCommitFailed: a prune batch whose COMMIT
// fails deleted nothing, so Prune reports 0 with the error — not the rows
// its DELETE matched, which the caller would add to what was deleted
// before it. A deferred constraint trigger fails the commit on purpose.
func TestPruneCountsNoBatchWhoseCommitFailed(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	for _, stmt := range []string{
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, status, finished_at)
		 SELECT 'm', 'a', 'done', now() - interval '2 hours' FROM generate_series(1, 5)`,
		`CREATE FUNCTION ` + s + `.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'refused at commit'; END $$`,
		`CREATE CONSTRAINT TRIGGER refuse AFTER DELETE ON ` + s + `.gendurable_instances
		 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + s + `.refuse()`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	n, _, err := q.Prune(ctx, pool, time.Hour, 100, nil)
	require.ErrorContains(t, err, "refused at commit")
	require.Zero(t, n, "the batch rolled back: nothing was deleted")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_instances`).Scan(&left))
	require.Equal(t, 5, left)
}

// TestReapSweepsAgainOnlyWhatItMissed: a reap that fails rows (attempts
// exhausted) consumes their signals in its own statement and sends a second
// sweep only for rows it reports (a signal committed after its snapshot was
// taken, before it locked the row): none here, so one statement. Before, it
// always sent the second sweep: 2 statements.
func TestReapSweepsAgainOnlyWhatItMissed(t *testing.T) {
	t.Parallel()
	counter := &dbtest.Counter{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: counter})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, attempt, max_attempts, claim_token, lease_expires_at, inbox)
		VALUES ('m', 'a', 'executing', 2, 3, 7, now() - interval '1 second', '{"go": 2}') RETURNING id`).Scan(&id))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name) VALUES ($1, 'go'), ($1, 'go')`, id)
	require.NoError(t, err)

	before := counter.Count()
	res, err := q.Reap(ctx, pool, 10, nil, 0)
	require.NoError(t, err)
	reaped := res.Reaped
	require.Len(t, reaped, 1)
	require.Equal(t, "failed", reaped[0].Status)
	require.EqualValues(t, 1, counter.Count()-before, "statements of a reap that missed no signal")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_signals
		WHERE target_id = $1 AND consumed_at IS NULL`, id).Scan(&left))
	require.Zero(t, left, "the reap's own sweep consumed the failed row's signals")
}

// TestCancelAndReapSweepWhateverTheCounts: Cancel and a reap that fails a
// row consume every unconsumed signal of it in their own statement, as they
// did before they reported rows to sweep again, even a signal the inbox
// counts do not show (counts and signals disagree only after a bug or a
// hand edit; the sweep does not rely on them). With the sweep limited to
// rows whose counts were not empty, as CancelMany's is, the signal stayed.
func TestCancelAndReapSweepWhateverTheCounts(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	seed := func(cols, vals string) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, `+cols+`)
			VALUES ('m', 'a', `+vals+`) RETURNING id`).Scan(&id))
		_, err := pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name) VALUES ($1, 'stray')`, id)
		require.NoError(t, err)
		return id
	}
	unconsumed := func(id int64) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_signals
			WHERE target_id = $1 AND consumed_at IS NULL`, id).Scan(&n))
		return n
	}

	live := seed(`status`, `'runnable'`)
	_, ok, err := q.Cancel(ctx, pool, live, "test")
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, unconsumed(live), "Cancel left a signal its counts did not show")

	expired := seed(`status, attempt, max_attempts, claim_token, lease_expires_at`,
		`'executing', 0, 1, 9, now() - interval '1 second'`)
	res, err := q.Reap(ctx, pool, 10, nil, 0)
	require.NoError(t, err)
	reaped := res.Reaped
	require.Len(t, reaped, 1)
	require.Equal(t, "failed", reaped[0].Status)
	require.Zero(t, unconsumed(expired), "a reap left a signal its counts did not show")
}

// TestReapPassesOverAChildWhoseParentIsLocked: a reap that fails a child
// updates its parent (the fan-in). With the parent held locked by another
// transaction (a Retry or a caller's SignalTx whose client was cut off:
// a probe saw it last 49 s), the reap statement waited for it, and so did
// every expired lease behind it, of every instance. Now the child is left
// for a later sweep, below the floor the reap returns, and the rest is
// reaped at once; once the lock goes, the child fails and its parent wakes.
func TestReapPassesOverAChildWhoseParentIsLocked(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var parent int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, children_total, children_pending, fanout)
		VALUES ('m', 'join', 'awaiting_children', 3, 3, 1) RETURNING id`).Scan(&parent))
	// Three children with their attempts spent, their leases the oldest,
	// as many as the reap's batch, and three unrelated expired leases.
	var children, others []int64
	rows, err := pool.Query(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, attempt, max_attempts, claim_token, lease_expires_at, parent_id, parent_fanout)
		SELECT 'm', 'a', 'executing', 0, 1, g, now() - interval '20 seconds' + g * interval '1 second', $1, 1
		FROM generate_series(1, 3) g RETURNING id`, parent)
	require.NoError(t, err)
	children, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	rows, err = pool.Query(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, attempt, max_attempts, claim_token, lease_expires_at)
		SELECT 'm', 'a', 'executing', 0, 3, 10 + g, now() - interval '1 second' FROM generate_series(1, 3) g RETURNING id`)
	require.NoError(t, err)
	others, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM `+s+`.gendurable_instances WHERE id = $1 FOR UPDATE`, parent)
	require.NoError(t, err)

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := q.Reap(sctx, pool, 3, nil, 0)
	require.NoError(t, err, "the reap waited for the locked parent")
	var reaped []int64
	for _, r := range res.Reaped {
		reaped = append(reaped, r.ID)
	}
	require.ElementsMatch(t, others, reaped, "a batch of the unrelated expired leases, the children passed over")
	var childLease time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT min(lease_expires_at) FROM `+s+`.gendurable_instances
		WHERE id = ANY ($1) AND status = 'executing'`, children).Scan(&childLease))
	require.False(t, res.Floor.After(childLease), "the children stay at or above the floor the next sweep starts at")

	require.NoError(t, holder.Rollback(ctx))
	res, err = q.Reap(ctx, pool, 10, &res.Floor, 0)
	require.NoError(t, err)
	reaped = reaped[:0]
	for _, r := range res.Reaped {
		reaped = append(reaped, r.ID)
		require.Equal(t, "failed", r.Status)
	}
	require.ElementsMatch(t, children, reaped)
	var status string
	var pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT status::text, children_pending FROM `+s+`.gendurable_instances WHERE id = $1`, parent).Scan(&status, &pending))
	require.Equal(t, "runnable", status, "the parent's fan-in counted the failed child")
	require.Zero(t, pending)
}

// TestPruneBucketsDeletesOnlyFullBucketsOfRatedKeys: a rate bucket is
// deleted once it has been full for a minute under the longest policy its
// key starts with (the pick reads a missing bucket as a full one); a
// bucket still refilling, or full for less than a minute, one whose
// longest policy has no rate and one no policy covers are kept. Batches
// walk the keys in order until one comes back short. A bucket a pick holds
// locked is passed over, not waited for.
func TestPruneBucketsDeletesOnlyFullBucketsOfRatedKeys(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	ctx := context.Background()
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_key_buckets (key, tokens, refilled_at) VALUES
		('r:full', 10, now() - interval '61 seconds'),    -- full for a minute
		('r:refilled', 0, now() - interval '90 seconds'), -- 0 + 30 s × 1/s: full 20 s after, 70 s ago
		('r:lately', 0, now() - interval '65 seconds'),   -- full only 55 s ago
		('r:spent', 0, now()),                            -- refilling
		('r:slow:a', 0, now() - interval '1 hour'),       -- 3.54 of 5 under its own, longer prefix
		('r:limit:a', 0, now() - interval '1 day'),       -- its longest prefix has no rate
		('other', 0, now() - interval '1 day')`) // no policy
	require.NoError(t, err)
	policies := []sqlq.KeyPolicy{
		{Prefix: "r:", Limit: 1, Rate: 1, Burst: 10},
		{Prefix: "r:slow:", Limit: 1, Rate: 0.001, Burst: 5},
		{Prefix: "r:limit:", Limit: 3},
	}
	var total int64
	var from *string
	calls := 0
	for {
		n, next, err := q.PruneBuckets(ctx, pool, policies, time.Minute, 2, from)
		require.NoError(t, err)
		total += n
		calls++
		if next == nil {
			break
		}
		from = next
	}
	require.Equal(t, int64(2), total)
	require.Equal(t, 4, calls, "7 keys 2 at a time")
	keys := func() []string {
		rows, err := pool.Query(ctx, `SELECT key FROM `+s+`.gendurable_key_buckets ORDER BY key`)
		require.NoError(t, err)
		left, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return left
	}
	require.Equal(t, []string{"other", "r:lately", "r:limit:a", "r:slow:a", "r:spent"}, keys())

	// A pick writing a full bucket: the prune passes it over at once, and
	// the bucket as the pick left it stays.
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_key_buckets VALUES ('r:racy', 10, now() - interval '2 minutes')`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE `+s+`.gendurable_key_buckets SET tokens = 0, refilled_at = now() WHERE key = 'r:racy'`)
	require.NoError(t, err)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, _, err := q.PruneBuckets(pctx, pool, policies, time.Minute, 100, nil)
	require.NoError(t, err, "the prune does not wait for the pick's lock")
	require.Zero(t, n)
	require.NoError(t, tx.Commit(ctx))
	var tokens float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT tokens FROM `+s+`.gendurable_key_buckets WHERE key = 'r:racy'`).Scan(&tokens))
	require.Zero(t, tokens)
	// Committed, the spent bucket is kept by the next sweep too.
	n, _, err = q.PruneBuckets(ctx, pool, policies, time.Minute, 100, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Contains(t, keys(), "r:racy")
}
