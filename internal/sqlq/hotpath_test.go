package sqlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Key-lease semantics of the pick and the heartbeat (docs/design.md §6), on
// a few rows each; the plan shapes are in plan_test.go.

func keySetup(t *testing.T) (*sqlq.Queries, func(string, ...any), func(string, ...any) int, func() *pgx.Conn) {
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{{s}}", s), args...)
		require.NoError(t, err, sql)
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, strings.ReplaceAll(sql, "{{s}}", s), args...).Scan(&n))
		return n
	}
	conn := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, dbtest.URL())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		_, err = c.Exec(ctx, "SET search_path = "+s)
		require.NoError(t, err)
		return c
	}
	return q, exec, count, conn
}

const liveHolders = `SELECT count(*) FROM {{s}}.gendurable_instances
	WHERE partition_key = 'k' AND status = 'executing' AND lease_expires_at > now()`

// TestHeartbeatCommittingAfterExpiryHoldsTheSlot: a heartbeat whose statement
// locks a keyed row just before its lease runs out and commits after it
// (commit latency: fsync, synchronous replication, a CPU stall) holds the
// slot meanwhile: a pick in between finds the holder locked and counts it,
// so the key never has more live holders than its limit.
func TestHeartbeatCommittingAfterExpiryHoldsTheSlot(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, status, claim_token, lease_expires_at)
	      OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'k', 'executing', 1, now() + interval '1 second')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key) OVERRIDING SYSTEM VALUE VALUES (2, 'm', 'a', 'k')`)
	// Slow commits, for the heartbeat's session only.
	exec(`CREATE FUNCTION {{s}}.slow() RETURNS trigger LANGUAGE plpgsql AS $$
	      BEGIN IF current_setting('review.slow', true) = 'on' THEN PERFORM pg_sleep(1.5); END IF; RETURN NULL; END $$`)
	exec(`CREATE CONSTRAINT TRIGGER slow AFTER UPDATE ON {{s}}.gendurable_instances
	      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{s}}.slow()`)
	hb := conn()
	_, err := hb.Exec(ctx, "SET review.slow = on")
	require.NoError(t, err)
	start := time.Now()
	done := make(chan []sqlq.Kept)
	go func() {
		time.Sleep(800 * time.Millisecond) // the lease has 200ms left
		kept, err := q.Heartbeat(ctx, hb, []int64{1}, []int64{1}, time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- kept
	}()
	time.Sleep(1300 * time.Millisecond) // lease ran out; heartbeat not committed yet
	res, err := q.Pick(ctx, conn(), "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	t.Logf("pick at %v claimed %d rows", time.Since(start), len(res.Claimed))
	kept := <-done
	t.Logf("heartbeat returned at %v: kept %v", time.Since(start), kept)
	n := count(liveHolders)
	t.Logf("live holders of key k (limit 1): %d", n)
	require.LessOrEqual(t, n, 1, "key k has more live holders than its limit")
}

// TestPickHonoursEveryRowsKeyLimit: a row claimed behind the key's head in
// the same pick starts only while its own limit allows.
func TestPickHonoursEveryRowsKeyLimit(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, priority, key_limit)
	      VALUES ('m', 'a', 'k', 0, 3), ('m', 'a', 'k', 1, NULL), ('m', 'a', 'k', 1, 1)`)
	res, err := q.Pick(ctx, conn(), "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1, "the second row's limit (the default, 1) is reached by the head")
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE partition_key = 'k' AND status = 'executing' AND coalesce(key_limit, 1) < 3`))
}

// TestPickFillsItsBatchFromOneKey: with one key whose limit is the batch and
// no plain rows, one pick claims the whole batch.
func TestPickFillsItsBatchFromOneKey(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, key_limit)
	      SELECT 'm', 'a', 'k', 10 FROM generate_series(1, 10)`)
	res, err := q.Pick(context.Background(), conn(), "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 10)
}

// TestPicksOfOneRowServePlainRowsToo: picks of one row (a busy feeder's
// usual demand) do not always go to keyed rows.
func TestPicksOfOneRowServePlainRowsToo(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, priority, eligible_at) VALUES ('m', 'plain', 0, now() - interval '1 hour')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, priority)
	      SELECT 'm', 'keyed', 'k' || g, 9 FROM generate_series(1, 20) g`)
	c := conn()
	cursor := ""
	for i := 1; i <= 12; i++ { // each pick of one favours plain rows with probability 1/2
		res, err := q.Pick(context.Background(), c, "default", sqlq.PickOpts{Limit: 1, Lease: time.Minute, Cursor: cursor})
		require.NoError(t, err)
		cursor = res.Cursor
		if res.Claimed[0].PartitionKey == nil {
			return
		}
	}
	t.Fatal("12 picks of one row all went to keyed rows")
}

// TestPickLocksOnlyKeysWithRoom: a pick that walks many keys with nothing
// to claim holds no advisory lock (the lock table is shared by the whole
// server).
func TestPickLocksOnlyKeysWithRoom(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, eligible_at)
	      SELECT 'm', 'a', 'a-' || lpad(g::text, 5, '0'), now() + interval '1 hour' FROM generate_series(1, 3000) g`)
	tx, err := conn().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 700, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, res.Claimed)
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&n))
	require.Zero(t, n)
}

// TestPickRefusesRepeatableRead: the pick's locks work only with the fresh
// snapshots of read committed; in a repeatable-read transaction it refuses
// (SQLSTATE 25001) instead of overfilling a key.
func TestPickRefusesRepeatableRead(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) VALUES ('m', 'a', 'k')`)
	tx, err := conn().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 1, Lease: time.Minute})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "25001", pgErr.Code)
}

// TestPickVisitsEachKeyOnce: a pick whose walk goes round every key —
// from an empty cursor, or from the last key, where such a walk leaves the
// cursor — visits each key once: three full keys are counted full three
// times, not six (version 6 walked them all again in its second phase).
func TestPickVisitsEachKeyOnce(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
	      SELECT 'm', 'a', 'k' || g, 'executing', g, now() + interval '1 hour' FROM generate_series(1, 3) g`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) SELECT 'm', 'a', 'k' || g FROM generate_series(1, 3) g`)
	c := conn()
	for _, cursor := range []string{"", "k3"} {
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute, Cursor: cursor})
		require.NoError(t, err)
		require.Empty(t, res.Claimed)
		require.Equal(t, []int32{3}, res.KeysFull, "cursor %q", cursor)
	}
}
