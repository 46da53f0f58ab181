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
		kept, err := q.Heartbeat(ctx, hb, []int64{1}, []int64{1}, []sqlq.ClaimState{sqlq.Started}, time.Minute, false)
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

// TestPickSharesTheBatchByFairShare (docs/design.md §6, "Fairness"): keys
// whose limits leave room for the whole batch, holding 6, 0 and 2 slots:
// a pick of 10 raises the ones holding fewest first, and leaves each
// holding 6 — the key holding most gets nothing, though it comes first in
// the walk.
func TestPickSharesTheBatchByFairShare(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	for key, held := range map[string]int{"a": 6, "b": 0, "c": 2} {
		exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, key_limit, status, claim_token, lease_expires_at)
		      SELECT 'm', 'a', $1, 100, 'executing', g, now() + interval '1 hour' FROM generate_series(1, $2::int) g`, key, held)
		exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, key_limit)
		      SELECT 'm', 'a', $1, 100 FROM generate_series(1, 50)`, key)
	}
	res, err := q.Pick(context.Background(), conn(), "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 10)
	for _, key := range []string{"a", "b", "c"} {
		require.Equal(t, 6, count(`SELECT count(*) FROM {{s}}.gendurable_instances
			WHERE partition_key = $1 AND status = 'executing'`, key), "key %s", key)
	}
}

// TestFairShareDoesNotStallTheWalk: a key left out of a pick because it
// holds more slots than the others (not because the batch ran out before
// its turn) does not hold the cursor. Here key "a" holds 20 long slots and
// 24 keys of limit 1 behind it have quick steps: version 12 stopped the
// cursor before "a" at every pick, so the same few keys right after it got
// every batch and the keys further on (and those past the first chunk)
// never ran.
func TestFairShareDoesNotStallTheWalk(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, key_limit, status, claim_token, lease_expires_at)
	      SELECT 'm', 'a', 'a', 100, 'executing', g, now() + interval '1 hour' FROM generate_series(1, 20) g`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, key_limit) SELECT 'm', 'a', 'a', 100 FROM generate_series(1, 50)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key)
	      SELECT 'm', 'a', 'b' || lpad(k::text, 2, '0') FROM generate_series(1, 24) k, generate_series(1, 50)`)
	c := conn()
	cursor := ""
	for i := 0; i < 30; i++ {
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute, Cursor: cursor})
		require.NoError(t, err)
		require.NotEmpty(t, res.Claimed, "pick %d", i)
		cursor = res.Cursor
		// Quick steps: each claimed row is done before the next pick.
		exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', lease_expires_at = NULL, claim_token = NULL
		      WHERE status = 'executing' AND partition_key <> 'a'`)
	}
	served := count(`SELECT count(DISTINCT partition_key) FROM {{s}}.gendurable_instances
		WHERE status = 'done' AND partition_key LIKE 'b%'`)
	require.Equal(t, 24, served, "keys of limit 1 that ran in 30 picks of 4 (120 places for 24 keys)")
}

// TestPickClaimsKeyedRowsOnlyUpToKeyed (version 23): a pick bounded to 3
// keyed rows claims 3 of 20 keys of room (phase 1 and phase 2 together) and
// fills the rest of its batch with plain rows; bounded to none, it claims
// plain rows only and leaves the cursor where it was.
func TestPickClaimsKeyedRowsOnlyUpToKeyed(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step) SELECT 'm', 'plain' FROM generate_series(1, 30)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key)
	      SELECT 'm', 'keyed', 'k' || lpad(g::text, 2, '0') FROM generate_series(1, 20) g`)
	c := conn()
	keyed := func(res sqlq.PickResult) (n int) {
		for _, r := range res.Claimed {
			if r.PartitionKey != nil {
				n++
			}
		}
		return n
	}
	for range 4 { // phase 1's share is half the batch at random: the bound holds either way
		res, err := q.Pick(context.Background(), c, "default", sqlq.PickOpts{Limit: 8, Lease: time.Minute, Keyed: 3})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 8)
		require.Equal(t, 3, keyed(res), "keyed rows of a pick bounded to 3")
		exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', lease_expires_at = NULL, claim_token = NULL WHERE status = 'executing'`)
	}
	res, err := q.Pick(context.Background(), c, "default", sqlq.PickOpts{Limit: 2, Lease: time.Minute, Keyed: -1, Cursor: "k05"})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2)
	require.Zero(t, keyed(res), "keyed rows of a pick bounded to none")
	require.Equal(t, "k05", res.Cursor)
	require.Equal(t, 12, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done' AND partition_key IS NOT NULL`))
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
// cursor (the lowest: the walk goes down the keys since version 21), or
// from the top key — visits each key once: three full keys are counted
// full three times, not six (version 6 walked them all again in its second
// phase).
func TestPickVisitsEachKeyOnce(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
	      SELECT 'm', 'a', 'k' || g, 'executing', g, now() + interval '1 hour' FROM generate_series(1, 3) g`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) SELECT 'm', 'a', 'k' || g FROM generate_series(1, 3) g`)
	c := conn()
	for _, cursor := range []string{"", "k1", "k3"} {
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute, Cursor: cursor})
		require.NoError(t, err)
		require.Empty(t, res.Claimed)
		require.Equal(t, []int32{3}, res.KeysFull, "cursor %q", cursor)
	}
}

// pickIndexReads is what the plain pick index of schema s has served
// (dbtest.IndexReads).
func pickIndexReads(t *testing.T, c *pgx.Conn, schema string) (tuples, blocks int64) {
	t.Helper()
	return dbtest.IndexReads(t, c, schema, "gendurable_instances_pick_plain")
}

// TestReapFloorSkipsFinishedLeasesUnderAHeldXmin (docs/design.md §4, "The
// reaper's floor"): while another session holds an xid, the lease index keeps
// the entry of every row that was executing since, and a sweep from its head
// reads each of them with its heap tuple. A sweep from the floor the last one
// returned reads what expired since. Rows it could see and left — one locked
// by another transaction, one past the LIMIT — keep the floor at or below
// their leases, and a later sweep from it recovers them.
func TestReapFloorSkipsFinishedLeasesUnderAHeldXmin(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`
	const finished = 3000
	// Rows claimed a minute ago and finished since: their executing
	// versions' entries stay in the lease index while the xid is held.
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at)
		SELECT 'm', 'a', 'executing', 1, now() - interval '1 minute' + g * interval '1 millisecond' FROM generate_series(1, $1::int) g`, finished)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now(), lease_expires_at = NULL, claim_token = NULL`)
	require.NoError(t, err)
	// expire inserts n executing rows whose leases ran out at from + 1 ms, + 2 ms, ….
	expire := func(n int, from time.Time) []int64 {
		t.Helper()
		rows, err := c.Query(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at)
			SELECT 'm', 'a', 'executing', 1, $2::timestamptz + g * interval '1 millisecond' FROM generate_series(1, $1::int) g
			RETURNING id`, n, from)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return ids
	}
	reap := func(name string, limit int, floor *time.Time) (sqlq.ReapResult, int64) {
		t.Helper()
		t0, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_lease")
		res, err := q.Reap(ctx, c, limit, floor, 0)
		require.NoError(t, err)
		t1, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_lease")
		t.Logf("%s: reaped %d, %d index entries, floor %v", name, len(res.Reaped), t1-t0, res.Floor)
		return res, t1 - t0
	}
	reapedIDs := func(res sqlq.ReapResult) []int64 {
		ids := []int64{}
		for _, r := range res.Reaped {
			ids = append(ids, r.ID)
		}
		return ids
	}

	var now time.Time
	require.NoError(t, c.QueryRow(ctx, `SELECT now()`).Scan(&now))
	first := expire(1, now.Add(-time.Second))
	res, read := reap("full", 10, nil)
	require.Equal(t, first, reapedIDs(res))
	require.GreaterOrEqual(t, read, int64(finished), "a full sweep reads every finished row's entry")
	floor := res.Floor
	require.True(t, floor.After(now.Add(-sqlq.ReapFloorSlack-time.Second)), "nothing left: the floor is now() - the slack")

	// Once the floor is two seconds behind now() - the slack: one lease that
	// ran out just above it, locked by another transaction, three more just
	// above that, past a LIMIT of 1. The floor stays below the locked one.
	time.Sleep(2 * time.Second)
	locked := expire(1, floor.Add(500*time.Millisecond))
	rest := expire(3, floor.Add(600*time.Millisecond))
	lc, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer func() { _ = lc.Close(ctx) }()
	ltx, err := lc.Begin(ctx)
	require.NoError(t, err)
	_, err = ltx.Exec(ctx, `SELECT 1 FROM `+s+`.gendurable_instances WHERE id = $1 FOR UPDATE`, locked[0])
	require.NoError(t, err)
	res, read = reap("from the floor", 1, &floor)
	require.Equal(t, rest[:1], reapedIDs(res), "the locked row is skipped, the LIMIT stops after one")
	require.LessOrEqual(t, read, int64(40), "a sweep from the floor reads what expired since")
	var lockedLease time.Time
	require.NoError(t, c.QueryRow(ctx, `SELECT lease_expires_at FROM `+s+`.gendurable_instances WHERE id = $1`, locked[0]).Scan(&lockedLease))
	require.True(t, res.Floor.Equal(lockedLease), "the floor is the locked row's lease: %v, want %v", res.Floor, lockedLease)
	floor = res.Floor
	res, _ = reap("past the LIMIT", 10, &floor)
	require.Equal(t, rest[1:], reapedIDs(res), "the rows past the LIMIT, the locked one still skipped")
	floor = res.Floor
	require.True(t, floor.Equal(lockedLease), "the floor is the locked row's lease: %v, want %v", floor, lockedLease)
	require.NoError(t, ltx.Rollback(ctx))
	res, read = reap("after the lock", 10, &floor)
	require.Equal(t, locked, reapedIDs(res), "the row locked before is recovered from the floor")
	require.LessOrEqual(t, read, int64(40))
}

// TestReapNextExpiryLooksOnlyWithinTheHorizon (docs/design.md §4, "The
// reaper's floor"): while another session holds an xid, the lease index
// keeps an entry for every lease written since and superseded (here 3,000
// rows whose leases run out in 30 s, finished since). A reap's probe for
// the next expiry without a horizon reads them all to reach the live lease
// after them; within a horizon of a second it reads a handful of entries
// and reports none (the reaper sleeps its Interval, the horizon, anyway) —
// and still finds a live lease that runs out within it.
func TestReapNextExpiryLooksOnlyWithinTheHorizon(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`
	const superseded = 3000
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at)
		SELECT 'm', 'a', 'executing', 1, now() + interval '30 seconds' + g * interval '1 millisecond' FROM generate_series(1, $1::int) g`, superseded)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now(), lease_expires_at = NULL, claim_token = NULL`)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at)
		VALUES ('m', 'a', 'executing', 2, now() + interval '1 minute')`)
	require.NoError(t, err)
	var now time.Time
	require.NoError(t, c.QueryRow(ctx, `SELECT now()`).Scan(&now))
	floor := now.Add(-time.Second) // nothing expired above it: the sweep reads no range before now()
	reap := func(name string, horizon time.Duration) (*time.Duration, int64) {
		t.Helper()
		t0, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_lease")
		res, err := q.Reap(ctx, c, 10, &floor, horizon)
		require.NoError(t, err)
		t1, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_lease")
		require.Empty(t, res.Reaped)
		t.Logf("%s: next %v, %d index entries", name, res.Next, t1-t0)
		return res.Next, t1 - t0
	}
	next, read := reap("no horizon", 0)
	require.NotNil(t, next)
	require.InDelta(t, time.Minute.Seconds(), next.Seconds(), 5, "the live lease, a minute ahead")
	require.GreaterOrEqual(t, read, int64(superseded), "past every superseded entry before it")
	next, read = reap("a second's horizon", time.Second)
	require.Nil(t, next, "nothing runs out within a second")
	require.LessOrEqual(t, read, int64(40))
	// A live lease within the horizon is still found.
	_, err = c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at)
		VALUES ('m', 'a', 'executing', 3, now() + interval '500 milliseconds')`)
	require.NoError(t, err)
	next, read = reap("a second's horizon, a lease within it", time.Second)
	require.NotNil(t, next)
	require.Less(t, *next, time.Second)
	require.LessOrEqual(t, read, int64(40))
}

// TestWakeTimedOutNextIsADurationWithinTheHorizon: the await-timeout
// sweep's next deadline is how long until it on the database clock (the
// sweeper used to take time.Until of the deadline on its own clock: an hour
// off the database's, it slept the whole Interval or swept every 10 ms), and
// looks no further than the horizon. While another session holds an xid the
// await-deadline index keeps the entry of every await that ended since
// (here 3,000 signalled before their deadlines, 30 s ahead): without a
// horizon the probe reads them all to reach the live deadline after them.
func TestWakeTimedOutNextIsADurationWithinTheHorizon(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`
	const ended = 3000
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
		SELECT 'm', 'w', 'awaiting_signal', '{go}', now() + interval '30 seconds' + g * interval '1 millisecond'
		FROM generate_series(1, $1::int) g`, ended)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'runnable', await_deadline = NULL, awaits = '{}'`)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
		VALUES ('m', 'w', 'awaiting_signal', '{go}', now() + interval '1 minute')`)
	require.NoError(t, err)
	wake := func(name string, horizon time.Duration) (*time.Duration, int64) {
		t.Helper()
		t0, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_await_deadline")
		floor := time.Now().Add(-time.Hour) // no due part to speak of: the probe alone
		res, err := q.WakeTimedOut(ctx, c, 10, &floor, 0, horizon)
		require.NoError(t, err)
		require.Zero(t, res.N)
		t1, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_await_deadline")
		t.Logf("%s: next %v, %d index entries", name, res.Next, t1-t0)
		return res.Next, t1 - t0
	}
	next, read := wake("no horizon", 0)
	require.NotNil(t, next)
	require.InDelta(t, time.Minute.Seconds(), next.Seconds(), 5, "a minute ahead, on the database clock")
	require.GreaterOrEqual(t, read, int64(ended), "past every ended await's entry")
	next, read = wake("a second's horizon", time.Second)
	require.Nil(t, next, "no deadline within a second")
	require.LessOrEqual(t, read, int64(40))
	_, err = c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
		VALUES ('m', 'w', 'awaiting_signal', '{go}', now() + interval '500 milliseconds')`)
	require.NoError(t, err)
	next, read = wake("a second's horizon, a deadline within it", time.Second)
	require.NotNil(t, next)
	require.Greater(t, *next, time.Duration(0))
	require.Less(t, *next, time.Second)
	require.LessOrEqual(t, read, int64(40))
}

// TestWakeTimedOutStartsAtItsFloor: while another session holds an xid the
// await-deadline index keeps the entry of every await signalled since, and
// once their deadlines pass a sweep from the index's head reads them all
// (here 3,000) before the due awaits after them; from the floor the last
// sweep returned it reads a handful. The floor stays at a due await it
// could not wake (locked by another transaction), so the next sweep wakes
// it, and it lies WakeFloorSlack before the statement's now() at most.
func TestWakeTimedOutStartsAtItsFloor(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`
	const signalled = 3000
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
		SELECT 'm', 'w', 'awaiting_signal', '{go}', now() - interval '10 minutes' + g * interval '1 millisecond'
		FROM generate_series(1, $1::int) g`, signalled)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'runnable', await_deadline = NULL, awaits = '{}'`)
	require.NoError(t, err)
	due := func(ago string) int64 {
		t.Helper()
		var id int64
		require.NoError(t, c.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
			VALUES ('m', 'w', 'awaiting_signal', '{go}', now() - $1::interval) RETURNING id`, ago).Scan(&id))
		return id
	}
	wake := func(name string, floor *time.Time) (sqlq.WakeResult, int64) {
		t.Helper()
		t0, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_await_deadline")
		res, err := q.WakeTimedOut(ctx, c, 10, floor, 0, time.Second)
		require.NoError(t, err)
		t1, _ := dbtest.IndexReads(t, c, schema, "gendurable_instances_await_deadline")
		t.Logf("%s: woke %d, floor %s, %d index entries", name, res.N, res.Floor.Format(time.RFC3339Nano), t1-t0)
		return res, t1 - t0
	}
	var now time.Time
	require.NoError(t, c.QueryRow(ctx, `SELECT now()`).Scan(&now))

	due("1 second")
	res, read := wake("full", nil)
	require.Equal(t, 1, res.N)
	require.GreaterOrEqual(t, read, int64(signalled), "past every signalled await's entry")
	require.WithinDuration(t, now.Add(-sqlq.WakeFloorSlack), res.Floor, 2*time.Second, "nothing left: now() − the slack")

	// A due await locked by another transaction is passed over and holds
	// the floor at its deadline (here one older than the slack, after a
	// floor a minute back).
	locked := due("30 seconds")
	other, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer other.Close(ctx)
	lock, err := other.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `SELECT 1 FROM `+s+`.gendurable_instances WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)
	floor := now.Add(-time.Minute)
	res, read = wake("from a floor a minute back, one due await locked", &floor)
	require.Zero(t, res.N)
	require.LessOrEqual(t, read, int64(40), "a handful of entries from the floor")
	var lockedAt time.Time
	require.NoError(t, c.QueryRow(ctx, `SELECT await_deadline FROM `+s+`.gendurable_instances WHERE id = $1`, locked).Scan(&lockedAt))
	require.True(t, res.Floor.Equal(lockedAt), "the floor stays at the locked await's deadline: %s, %s", res.Floor, lockedAt)
	require.NoError(t, lock.Rollback(ctx))
	floor = res.Floor
	res, read = wake("from the floor, the lock gone", &floor)
	require.Equal(t, 1, res.N, "the await once locked")
	require.LessOrEqual(t, read, int64(40))
}

// TestPickFloorSkipsClaimedRowsUnderAHeldXmin (docs/design.md §4): while
// another session holds an xid, the pick index keeps the entries of every
// row claimed since, and a pick without a floor reads each of them (and its
// heap tuple) before the first runnable row. With the floor a pick reads
// O(batch) entries; with its priority among Prios it also reads O(1) index
// blocks, and without (an unlisted priority) it still fetches no heap tuple
// below the floor.
func TestPickFloorSkipsClaimedRowsUnderAHeldXmin(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`

	// A few thousand rows, claimed and finished after the hold began.
	const claimed, batch = 3000, 20
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, eligible_at)
		SELECT 'm', 'a', now() - interval '1 minute' + g * interval '1 millisecond' FROM generate_series(1, $1::int) g`, claimed)
	require.NoError(t, err)
	var floor *time.Time
	for n := 0; n < claimed; {
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 500, Lease: time.Minute, Floor: floor, Prios: []int16{0}})
		require.NoError(t, err)
		n += len(res.Claimed)
		floor = res.Floor
		ids := make([]int64, len(res.Claimed))
		for i, r := range res.Claimed {
			ids[i] = r.ID
		}
		_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now() WHERE id = ANY($1)`, ids)
		require.NoError(t, err)
	}
	res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 500, Lease: time.Minute, Floor: floor, Prios: []int16{0}})
	require.NoError(t, err)
	require.Empty(t, res.Claimed)
	require.NotNil(t, res.Floor, "a pick that claimed fewer rows than it asked for sets the floor")
	floor = res.Floor
	time.Sleep(10 * time.Millisecond) // now() moves past the floor's slack
	_, err = c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step) SELECT 'm', 'a' FROM generate_series(1, $1::int)`, 2*batch)
	require.NoError(t, err)

	pick := func(name string, o sqlq.PickOpts) (tuples, blocks int64) {
		t.Helper()
		t0, b0 := pickIndexReads(t, c, schema)
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		start := time.Now()
		res, err := q.Pick(ctx, tx, "default", o)
		took := time.Since(start)
		require.NoError(t, err)
		require.Len(t, res.Claimed, batch)
		require.NoError(t, tx.Rollback(ctx)) // every pick sees the same rows
		t1, b1 := pickIndexReads(t, c, schema)
		t.Logf("%s: %d index entries, %d index blocks, %v", name, t1-t0, b1-b0, took)
		return t1 - t0, b1 - b0
	}
	o := sqlq.PickOpts{Limit: batch, Lease: time.Minute}
	tuples, _ := pick("no floor", o)
	require.GreaterOrEqual(t, tuples, int64(claimed), "without a floor the pick reads every claimed row's entry")
	o.Floor = floor
	tuples, _ = pick("floor, priority not listed", o)
	require.LessOrEqual(t, tuples, int64(2*batch))
	o.Prios = []int16{-4, 0, 9}
	tuples, blocks := pick("floor", o)
	require.LessOrEqual(t, tuples, int64(2*batch))
	require.LessOrEqual(t, blocks, int64(20), "the scan starts at the floor")
}

// TestFullPicksMoveTheFloorUnderAHeldXmin: a standing backlog, where every
// pick claims all it asks for, gets a floor too (schema version 15): each
// full pick returns the eligible_at of the last row it claimed, so under a
// held xid the next pick starts there instead of reading the entries of
// every row claimed since the hold began. Before, a full pick returned the
// floor it was given (none, for a queue that was never short), and the picks
// of a backlog slowed as the hold went on.
func TestFullPicksMoveTheFloorUnderAHeldXmin(t *testing.T) {
	t.Parallel()
	q, c, schema := heldXmin(t)
	ctx := context.Background()
	s := `"` + schema + `"`

	// A backlog in the past, one millisecond apart; every pick below is full.
	const claimed, batch = 3000, 20
	_, err := c.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, eligible_at)
		SELECT 'm', 'a', now() - interval '1 minute' + g * interval '1 millisecond' FROM generate_series(1, $1::int) g`, claimed+2*batch)
	require.NoError(t, err)
	var floor *time.Time
	for n := 0; n < claimed; {
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 500, Lease: time.Minute, Floor: floor, Prios: []int16{0}})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 500, "the backlog fills every pick")
		n += len(res.Claimed)
		ids := make([]int64, len(res.Claimed))
		for i, r := range res.Claimed {
			ids[i] = r.ID
		}
		var last time.Time
		require.NoError(t, c.QueryRow(ctx, `SELECT max(eligible_at) FROM `+s+`.gendurable_instances WHERE id = ANY($1)`, ids).Scan(&last))
		require.NotNil(t, res.Floor, "a full pick sets the floor")
		require.True(t, res.Floor.Equal(last), "the floor is the last claimed row's eligible_at: %v, want %v", *res.Floor, last)
		floor = res.Floor
		_, err = c.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now() WHERE id = ANY($1)`, ids)
		require.NoError(t, err)
	}

	pick := func(name string, o sqlq.PickOpts) int64 {
		t.Helper()
		t0, _ := pickIndexReads(t, c, schema)
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		res, err := q.Pick(ctx, tx, "default", o)
		require.NoError(t, err)
		require.Len(t, res.Claimed, batch)
		require.NoError(t, tx.Rollback(ctx)) // every pick sees the same rows
		t1, _ := pickIndexReads(t, c, schema)
		t.Logf("%s: %d index entries", name, t1-t0)
		return t1 - t0
	}
	o := sqlq.PickOpts{Limit: batch, Lease: time.Minute, Prios: []int16{0}}
	require.GreaterOrEqual(t, pick("no floor", o), int64(claimed), "without a floor the pick reads every claimed row's entry")
	o.Floor = floor
	require.LessOrEqual(t, pick("the full picks' floor", o), int64(2*batch))
}

// heldXmin makes a schema, a connection to pick on, and an xid held open on
// another connection until the test ends: no row version dead since can be
// removed, or its index entries marked dead.
func heldXmin(t *testing.T) (*sqlq.Queries, *pgx.Conn, string) {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT txid_current()`)
	require.NoError(t, err)
	return q, c, schema
}

// TestPickFloorKeepsPriorityOrder: the pick claims in (priority,
// eligible_at) order across the floor's ranges: a row of a higher priority
// inserted after a backlog of lower ones goes first, whether its priority is
// listed or not, and the listed priorities' rows follow in order.
func TestPickFloorKeepsPriorityOrder(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	floor := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, priority) SELECT 'm', 'low', 5 FROM generate_series(1, 10)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, priority) VALUES ('m', 'mid', 2)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, priority) VALUES ('m', 'urgent', -3)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, priority) VALUES ('m', 'mid', 2)`)
	for _, prios := range [][]int16{nil, {5}, {2, 5}, {5, -3, 2}, {7}} {
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		res, err := q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute, Floor: &floor, Prios: prios})
		require.NoError(t, err)
		var steps []string
		for _, r := range res.Claimed {
			steps = append(steps, r.Step)
		}
		require.Equal(t, []string{"urgent", "mid", "mid", "low"}, steps, "prios %v", prios)
		// A full pick moves the floor up to the eligible_at of the last row it
		// claimed (a "low" one), never past it (TestFullPicksMoveTheFloorUnderAHeldXmin).
		var last time.Time
		require.NoError(t, tx.QueryRow(ctx, `SELECT eligible_at FROM gendurable_instances WHERE id = $1`,
			res.Claimed[3].ID).Scan(&last))
		require.NotNil(t, res.Floor)
		require.False(t, res.Floor.Before(floor), "the floor does not go down: %v", res.Floor)
		require.False(t, res.Floor.After(last), "the floor stays at or below the last claimed row: %v, %v", res.Floor, last)
		require.NoError(t, tx.Rollback(ctx))
	}
}

// TestPickFloorCheckFindsRowsBelowTheFloor: a row that became visible below
// the floor (here a RunAt in the past) is not picked until the floor check
// lowers the floor to it; then it is, and the next floor is set again.
func TestPickFloorCheckFindsRowsBelowTheFloor(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute, Floor: nil})
	require.NoError(t, err)
	require.NotNil(t, res.Floor, "an empty pick sets the floor")
	floor := *res.Floor
	at, err := q.PickFloorCheck(ctx, c, "default", floor)
	require.NoError(t, err)
	require.Nil(t, at, "nothing below the floor")

	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, eligible_at) VALUES ('m', 'late', now() - interval '1 hour')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key, eligible_at) VALUES ('m', 'keyed', 'k', now() - interval '2 hours')`)
	res, err = q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute, Floor: &floor, Prios: []int16{0}})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, "keyed", res.Claimed[0].Step, "keyed rows have no floor")

	at, err = q.PickFloorCheck(ctx, c, "default", floor)
	require.NoError(t, err)
	require.NotNil(t, at)
	require.Less(t, time.Until(*at), -59*time.Minute)
	res, err = q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute, Floor: at, Prios: []int16{0}})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, "late", res.Claimed[0].Step)
	require.True(t, res.Floor.After(floor.Add(-time.Second)), "the floor is set again: %v", res.Floor)
}

// The key hand-off (docs/design.md §6): the outcome statement that frees a
// keyed row's slot claims the key's next row itself.

// handoffDone is a Done of holder id that may hand its key's slot on under
// limit.
func handoffDone(id, token int64, limit int32) sqlq.Outcome {
	res := `{}`
	return sqlq.Outcome{ID: id, Token: token, Kind: sqlq.KindDone, Result: &res, Handoff: limit}
}

// applyOne applies outs in one batch and returns what was applied, by id.
func applyOne(t *testing.T, q *sqlq.Queries, db sqlq.DB, outs ...sqlq.Outcome) map[int64]sqlq.Applied {
	t.Helper()
	b := &sqlq.OutcomeBatch{Lease: time.Minute}
	for i := range outs {
		b.Add(&outs[i])
	}
	got, err := q.ApplyOutcomes(context.Background(), db, b)
	require.NoError(t, err)
	m := map[int64]sqlq.Applied{}
	for _, a := range got {
		m[a.ID] = a
	}
	return m
}

// TestOutcomeHandsOffTheKeysNextRow: a Done of key k's holder claims k's
// next eligible row in (priority, eligible_at) order — in the same
// transaction (its claim's updated_at is the holder's finished_at), as a
// pick would (executing, a lease, a fresh token, its inbox) — and no more
// than the one slot it freed.
func TestOutcomeHandsOffTheKeysNextRow(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, status, claim_token, lease_expires_at)
	      OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'k', 'executing', 1, now() + interval '1 minute')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, priority, eligible_at, inbox)
	      OVERRIDING SYSTEM VALUE VALUES
	        (2, 'm', 'b', 'k', 1, now() - interval '1 hour', '{}'),
	        (3, 'm', 'c', 'k', 0, now() - interval '1 minute', '{"go": 1}'),
	        (4, 'm', 'd', 'k', 0, now() + interval '1 hour', '{}'),
	        (5, 'm', 'e', 'k', 0, now() - interval '1 minute', '{}')`)
	exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES (3, 'go')`)
	// Row 3 follows an await that timed out after its parking step had
	// seen a signal "go" (migration 018): the hand-off carries that too.
	exec(`UPDATE {{s}}.gendurable_instances SET awaits = '{}', inbox_seen = '[7]' WHERE id = 3`)
	got := applyOne(t, q, conn(), handoffDone(1, 1, 1))
	require.Equal(t, "done", got[1].Status)
	s := got[1].Successor
	require.NotNil(t, s, "no successor")
	require.Equal(t, int64(3), s.ID, "the eligible head in (priority, eligible_at) order")
	require.Equal(t, "c", s.Step)
	require.Len(t, s.Inbox, 1)
	require.Equal(t, "go", s.Inbox[0].Name)
	require.Equal(t, []string{}, s.Awaits)
	require.Equal(t, []int64{7}, s.Seen)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances AS i, {{s}}.gendurable_instances AS p
		WHERE i.id = 3 AND p.id = 1 AND i.status = 'executing' AND i.claim_token = $1
		  AND i.lease_expires_at > now() + interval '50 seconds' AND i.updated_at = p.finished_at`, s.Token))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`))
}

// TestHandOffKeepsTheKeyLimit: the successor's own key_limit, else the
// limit passed, else 1, against the holders the statement does not free;
// one successor per freed row at most, two keys in one batch.
func TestHandOffKeepsTheKeyLimit(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	// Key k: holders 1001, 1002 (freed here) and 1003 (held elsewhere); key j: holder 1010.
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, status, claim_token, lease_expires_at)
	      OVERRIDING SYSTEM VALUE VALUES (1001, 'm', 'a', 'k', 'executing', 1, now() + interval '1 minute'),
	        (1002, 'm', 'a', 'k', 'executing', 2, now() + interval '1 minute'),
	        (1003, 'm', 'a', 'k', 'executing', 3, now() + interval '1 minute'),
	        (1010, 'm', 'a', 'j', 'executing', 10, now() + interval '1 minute')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) SELECT 'm', 'b', 'k' FROM generate_series(1, 5)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) SELECT 'm', 'b', 'j' FROM generate_series(1, 5)`)
	// Limit 2 for k: 3 still holds, so one of the two freed slots is taken again.
	got := applyOne(t, q, conn(), handoffDone(1001, 1, 2), handoffDone(1002, 2, 2), handoffDone(1010, 10, 1))
	require.Equal(t, 1, btoi(got[1001].Successor != nil)+btoi(got[1002].Successor != nil), "limit 2 with one other holder")
	require.NotNil(t, got[1010].Successor)
	require.Equal(t, "j", *got[1010].Successor.PartitionKey)
	require.Equal(t, 2, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE partition_key = 'k' AND status = 'executing'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE partition_key = 'j' AND status = 'executing'`))
	// The next row of k has its own key_limit 1: with 3 holding, no room.
	var succ sqlq.Claimed
	for _, a := range got {
		if a.Successor != nil && *a.Successor.PartitionKey == "k" {
			succ = *a.Successor
		}
	}
	exec(`UPDATE {{s}}.gendurable_instances SET key_limit = 1 WHERE partition_key = 'k' AND status = 'runnable'`)
	got = applyOne(t, q, conn(), handoffDone(succ.ID, succ.Token, 5))
	require.Nil(t, got[succ.ID].Successor, "the next row's own limit (1) is taken by row 1003")
	// A limit of 5 for k (no key_limit): one successor for the one freed row.
	exec(`UPDATE {{s}}.gendurable_instances SET key_limit = NULL WHERE partition_key = 'k'`)
	got = applyOne(t, q, conn(), handoffDone(1003, 3, 5))
	require.NotNil(t, got[1003].Successor)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE partition_key = 'k' AND status = 'executing'`))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNoHandOff: no successor when the key's lock is held (a pick is on
// it), when the queue is paused, when no row of the key is eligible, when
// the outcome asked for none, or when the outcome keeps the slot (a chained
// Next); a Replay that frees the slot hands it to the next row, never to
// itself.
func TestNoHandOff(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	holder := func(id int64, key string) {
		exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, status, claim_token, lease_expires_at)
		      OVERRIDING SYSTEM VALUE VALUES ($1, 'm', 'a', $2, 'executing', $1, now() + interval '1 minute')`, id, key)
		exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, partition_key) VALUES ('m', 'b', $1)`, key)
	}
	// The key's lock is held by another transaction (a pick).
	holder(1001, "locked")
	other := conn()
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('gendurable:' || current_schema()), hashtext('locked'))`)
	require.NoError(t, err)
	got := applyOne(t, q, conn(), handoffDone(1001, 1001, 1))
	require.Equal(t, "done", got[1001].Status)
	require.Nil(t, got[1001].Successor, "the key's lock is held")
	require.NoError(t, tx.Rollback(ctx))
	// Paused queue.
	holder(1002, "paused")
	exec(`INSERT INTO {{s}}.gendurable_queues (name, paused) VALUES ('default', true)`)
	got = applyOne(t, q, conn(), handoffDone(1002, 1002, 1))
	require.Nil(t, got[1002].Successor, "paused queue")
	exec(`UPDATE {{s}}.gendurable_queues SET paused = false`)
	// Not eligible yet.
	holder(1003, "later")
	exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() + interval '1 hour' WHERE partition_key = 'later' AND status = 'runnable'`)
	got = applyOne(t, q, conn(), handoffDone(1003, 1003, 1))
	require.Nil(t, got[1003].Successor, "not eligible")
	// Not asked.
	holder(1004, "unasked")
	got = applyOne(t, q, conn(), handoffDone(1004, 1004, 0))
	require.Nil(t, got[1004].Successor)
	// A chained Next keeps its slot; a Replay frees it for the next row.
	holder(1005, "chain")
	step := "b"
	got = applyOne(t, q, conn(), sqlq.Outcome{ID: 1005, Token: 1005, Kind: sqlq.KindNext, Step: &step, Continue: true, Handoff: 1})
	require.Equal(t, "executing", got[1005].Status)
	require.Nil(t, got[1005].Successor, "a chained Next keeps the slot")
	// Every claim is written unconfirmed (schema version 24): the chained
	// step's, and the successor's below.
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1005 AND unstarted_token = -1`))
	got = applyOne(t, q, conn(), sqlq.Outcome{ID: 1005, Token: *got[1005].Token, Kind: sqlq.KindReplay, Handoff: 1})
	require.Equal(t, "runnable", got[1005].Status)
	require.NotNil(t, got[1005].Successor)
	require.NotEqual(t, int64(1005), got[1005].Successor.ID)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND unstarted_token = -1`, got[1005].Successor.ID))
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing' AND partition_key <> 'chain'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`))
}

// TestReapChargesNoAttemptToAnUnstartedClaim (docs/design.md §4,
// "Prefetched claims", "Claims no heartbeat confirmed"): four claims of
// MaxAttempts 1 whose leases run out. The one whose last heartbeat found its
// step not started, and the one no heartbeat wrote since its claim (-1, as
// every claim leaves it since schema version 24), go back to runnable with
// their attempt uncharged, each entry saying why; one heartbeated as
// started, and one marked unstarted and then started, are charged and fail.
// Claimed again (the first marked unstarted again, the second not
// heartbeated again), both are charged this time: a mark once per attempt
// whatever came between, an unconfirmed claim once per step. A row of three
// attempts lost unconfirmed four times goes free once only: attempts 0, 0,
// 1, 2, and fails on the fourth loss; a row of 30 attempts lost so 31
// times goes free once too, though the history keeps only 20 entries; a
// loss of another step in between lets the first go free once more.
func TestReapChargesNoAttemptToAnUnstartedClaim(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, max_attempts)
	      OVERRIDING SYSTEM VALUE SELECT g, 'm', 'a', 1 FROM generate_series(1, 4) g`)
	claim := func(want int) map[int64]int64 {
		t.Helper()
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, res.Claimed, want)
		tokens := map[int64]int64{}
		for _, cl := range res.Claimed {
			tokens[cl.ID] = cl.Token
		}
		return tokens
	}
	beat := func(tokens map[int64]int64, started map[int64]bool) {
		t.Helper()
		var ids, toks []int64
		var st []sqlq.ClaimState
		for id, tok := range tokens {
			if s, ok := started[id]; ok {
				state := sqlq.NotStarted
				if s {
					state = sqlq.Started
				}
				ids, toks, st = append(ids, id), append(toks, tok), append(st, state)
			}
		}
		kept, err := q.Heartbeat(ctx, c, ids, toks, st, time.Minute, false)
		require.NoError(t, err)
		require.Len(t, kept, len(ids))
	}
	reap := func(want int) []sqlq.Reaped {
		t.Helper()
		exec(`UPDATE {{s}}.gendurable_instances SET lease_expires_at = now() - interval '1 second' WHERE status = 'executing'`)
		res, err := q.Reap(ctx, c, 100, nil, 0)
		require.NoError(t, err)
		require.Len(t, res.Reaped, want)
		return res.Reaped
	}

	tokens := claim(4)
	// 1: not started. 2: never heartbeated. 3: started. 4: not started, then started.
	beat(tokens, map[int64]bool{1: false, 3: true, 4: false})
	beat(tokens, map[int64]bool{4: true})
	byID := map[int64]sqlq.Reaped{}
	for _, r := range reap(4) {
		byID[r.ID] = r
	}
	for _, id := range []int64{1, 2} {
		require.False(t, byID[id].Charged, "row %d", id)
		require.Equal(t, "runnable", byID[id].Status, "row %d", id)
	}
	for _, id := range []int64{3, 4} {
		require.True(t, byID[id].Charged, "row %d", id)
		require.Equal(t, "failed", byID[id].Status, "row %d", id)
	}
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 1 AND status = 'runnable' AND attempt = 0 AND errors -> -1 @> '{"kind": "lease_expired", "uncharged": true}'
		  AND errors -> -1 ->> 'error' LIKE 'lease expired before the step started (a prefetched claim%'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 2 AND status = 'runnable' AND attempt = 0 AND errors -> -1 @> '{"kind": "lease_expired", "uncharged": true}'
		  AND errors -> -1 ->> 'error' LIKE 'lease expired before any heartbeat confirmed the step started%'
		  AND errors -> -1 @> '{"unconfirmed": true}'`))
	// Failed on their one attempt (max_attempts 1), which they keep: a row
	// failed by its lease said attempt 2 of 1.
	require.Equal(t, 2, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE status = 'failed' AND attempt = 0 AND errors -> -1 @> '{"kind": "lease_expired"}'
		  AND NOT errors -> -1 ? 'uncharged' AND errors -> -1 ->> 'error' LIKE '%attempts exhausted'`))
	for id, tok := range tokens {
		require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
			WHERE id = $1 AND (errors -> -1 ->> 'token')::bigint = $2`, id, tok), "row %d's entry names its lost claim", id)
	}

	// The same attempt lost again before its step started: charged now,
	// though another entry of that attempt came in between (a worker that
	// does not know the row's version handed it back). Row 2, claimed
	// again and never heartbeated: charged, its step went free once.
	tokens = claim(2)
	require.NoError(t, q.ReleaseUnknown(ctx, c, 1, tokens[1], 0, "unknown version"))
	again := claim(1)
	require.Contains(t, again, int64(1))
	beat(again, map[int64]bool{1: false})
	byID = map[int64]sqlq.Reaped{}
	for _, r := range reap(2) {
		byID[r.ID] = r
	}
	for _, id := range []int64{1, 2} {
		require.True(t, byID[id].Charged, "a second free expiry of row %d", id)
		require.Equal(t, "failed", byID[id].Status, "row %d", id)
	}
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 1 AND attempt = 0 AND jsonb_array_length(errors) = 3`), "failed on its one attempt, which it keeps")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 2 AND attempt = 0 AND jsonb_array_length(errors) = 2`), "failed on its one attempt, which it keeps")

	// Three attempts, four unconfirmed claims lost: free, then charged
	// on every later loss, whatever the attempt.
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, max_attempts)
	      OVERRIDING SYSTEM VALUE VALUES (5, 'm', 'a', 3)`)
	var attempts []int
	for range 4 {
		claim(1)
		r := reap(1)[0]
		require.Equal(t, int64(5), r.ID)
		attempts = append(attempts, count(`SELECT attempt FROM {{s}}.gendurable_instances WHERE id = 5`))
		if r.Status == "failed" {
			break
		}
	}
	require.Equal(t, []int{0, 1, 2, 2}, attempts)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 5 AND unconfirmed_freed = hashtext('a')`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 5 AND status = 'failed'
		AND jsonb_array_length(errors) = 4 AND errors -> 0 @> '{"uncharged": true}'
		AND NOT (errors -> 1) ? 'uncharged' AND NOT (errors -> 3) ? 'uncharged'`))

	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, max_attempts)
	      OVERRIDING SYSTEM VALUE VALUES (6, 'm', 'a', 30)`)
	free, losses := 0, 0
	for {
		claim(1)
		r := reap(1)[0]
		require.Equal(t, int64(6), r.ID)
		losses++
		if !r.Charged {
			free++
		}
		if r.Status == "failed" {
			break
		}
		require.Less(t, losses, 40)
	}
	require.Equal(t, 1, free, "one free loss in %d", losses)
	require.Equal(t, 31, losses, "MaxAttempts + 1")

	// Once per step in a row: a loss of another step goes free, and so
	// does one of the first step after it.
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, max_attempts)
	      OVERRIDING SYSTEM VALUE VALUES (7, 'm', 'a', 5)`)
	var charged []bool
	for _, step := range []string{"a", "a", "b", "a", "a"} {
		exec(`UPDATE {{s}}.gendurable_instances SET step = $1 WHERE id = 7`, step)
		claim(1)
		charged = append(charged, reap(1)[0].Charged)
	}
	require.Equal(t, []bool{false, true, false, false, true}, charged)

	// A mark cleared for the step to start, and a heartbeat sending a claim
	// as starting, leave -1: a worker that dies before the step begins
	// costs no attempt (a kill-storm probe: rows of MaxAttempts 1 failed
	// after one loss, never having run, while the clear wrote NULL).
	exec(`UPDATE {{s}}.gendurable_instances SET status = 'failed', finished_at = now() WHERE id = 7`)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, max_attempts)
	      OVERRIDING SYSTEM VALUE VALUES (8, 'm', 'a', 1), (9, 'm', 'a', 1)`)
	tokens = claim(2)
	beat(tokens, map[int64]bool{8: false, 9: false})
	cleared, err := q.ClearUnstarted(ctx, c, []int64{8}, []int64{tokens[8]}, time.Minute)
	require.NoError(t, err)
	require.True(t, cleared[tokens[8]])
	kept, err := q.Heartbeat(ctx, c, []int64{9}, []int64{tokens[9]}, []sqlq.ClaimState{sqlq.Starting}, time.Minute, false)
	require.NoError(t, err)
	require.Len(t, kept, 1)
	require.Equal(t, 2, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id IN (8, 9) AND unstarted_token = -1`))
	for _, r := range reap(2) {
		require.False(t, r.Charged, "row %d", r.ID)
		require.Equal(t, "runnable", r.Status, "row %d", r.ID)
	}
}

// TestClearUnstartedSkipsALockedRow: clearing the not-started marks of three
// claims while another transaction holds the second's row locked clears the
// first and third at once, reports the second held but not cleared (to be
// tried again) rather than waiting for the lock, and leaves out a claim
// whose token is no longer the row's.
func TestClearUnstartedSkipsALockedRow(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, claim_token, lease_expires_at, unstarted_token)
	      OVERRIDING SYSTEM VALUE SELECT g, 'm', 'a', 'executing', 10 + g, now() + interval '1 minute', 10 + g
	      FROM generate_series(1, 3) g`)
	tx := holdIn(t, conn(), `SELECT 1 FROM gendurable_instances WHERE id = 2 FOR UPDATE`)

	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	held, err := q.ClearUnstarted(cctx, conn(), []int64{1, 2, 3, 3}, []int64{11, 12, 13, 9}, time.Minute)
	require.NoError(t, err, "the clear waited on the locked row")
	require.Equal(t, map[int64]bool{11: true, 12: false, 13: true}, held)
	// Cleared to -1, a claim no heartbeat confirmed: its step has not
	// started yet (schema version 24).
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE unstarted_token IS DISTINCT FROM -1`))
	require.NoError(t, tx.Rollback(ctx))
	held, err = q.ClearUnstarted(ctx, conn(), []int64{2}, []int64{12}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[int64]bool{12: true}, held)
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE unstarted_token IS DISTINCT FROM -1`))
}

// TestClearUnstartedNeedsALiveLease: a claim whose lease has run out on the
// database clock is not cleared (held, to be tried again once a heartbeat
// has run), its mark kept; one cleared gets a whole lease from the moment
// the statement wrote it.
func TestClearUnstartedNeedsALiveLease(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, claim_token, lease_expires_at, unstarted_token)
	      OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'executing', 11, now() - interval '1 second', 11),
	                                     (2, 'm', 'a', 'executing', 12, now() + interval '1 second', 12)`)
	held, err := q.ClearUnstarted(ctx, conn(), []int64{1, 2}, []int64{11, 12}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[int64]bool{11: false, 12: true}, held)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND unstarted_token = 11
		AND lease_expires_at < now()`), "the run-out claim kept its mark and its lease")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 2 AND unstarted_token = -1
		AND lease_expires_at > clock_timestamp() + interval '50 seconds'`), "the cleared claim's lease extended")
}

// TestAPickTakesBackAnUnstartedExpiredKeyHolderFirst (version 23): the
// holder of key k (limit 1), a prefetched claim a heartbeat marked not
// started, outlives its lease; the pick that finds it puts it back as the
// reaper would — runnable, no attempt, an uncharged lease_expired entry
// naming its token — and claims it ahead of the key's next row (before,
// it claimed the next row, and the holder ran after it: a fault probe, a
// worker killed with claims buffered). A holder that was not marked, and
// one whose step and attempt went free once already, are revoked for the
// reaper, which charges them; a holder an engine of version 22 revoked
// (no token, its mark kept as 0) is still returned uncharged. Since version
// 24 a holder no heartbeat wrote since its claim (-1) is taken back as a
// marked one is, unless its step went free so once already, at any attempt
// (unconfirmed_freed).
func TestAPickTakesBackAnUnstartedExpiredKeyHolderFirst(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, max_attempts, status, claim_token, lease_expires_at, unstarted_token)
	      OVERRIDING SYSTEM VALUE VALUES
	        (1, 'm', 'a', 'k', 1, 'executing', 11, now() - interval '1 second', 11),
	        (3, 'm', 'a', 'j', 1, 'executing', 13, now() - interval '1 second', NULL),
	        (5, 'm', 'a', 'm', 1, 'executing', 15, now() - interval '1 second', 15),
	        (7, 'm', 'a', 'o', 1, 'executing', NULL, now() - interval '1 second', 0),
	        (9, 'm', 'a', 'p', 3, 'executing', 19, now() - interval '1 second', -1),
	        (11, 'm', 'a', 'q', 3, 'executing', 21, now() - interval '1 second', -1)`)
	exec(`UPDATE {{s}}.gendurable_instances SET errors = '[{"kind": "lease_expired", "uncharged": true, "step": "a", "attempt": 0}]' WHERE id = 5`)
	exec(`UPDATE {{s}}.gendurable_instances SET attempt = 1, unconfirmed_freed = hashtext('a') WHERE id = 11`)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key) OVERRIDING SYSTEM VALUE
	      VALUES (2, 'm', 'a', 'k'), (4, 'm', 'a', 'j'), (6, 'm', 'a', 'm'), (10, 'm', 'a', 'p'), (12, 'm', 'a', 'q')`)
	res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	var ids []int64
	for _, r := range res.Claimed {
		ids = append(ids, r.ID)
	}
	require.ElementsMatch(t, []int64{1, 4, 6, 9, 12}, ids, "k's and p's holders taken back and claimed first; j's, m's and q's next rows")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 9 AND attempt = 0 AND status = 'executing' AND claim_token <> 19 AND unstarted_token = -1 AND unconfirmed_freed = hashtext('a')
		  AND errors -> -1 @> '{"kind": "lease_expired", "uncharged": true, "unconfirmed": true, "token": 19}' AND jsonb_array_length(errors) = 1
		  AND errors -> -1 ->> 'error' LIKE 'lease expired before any heartbeat confirmed the step started%'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 1 AND attempt = 0 AND status = 'executing' AND claim_token <> 11
		  AND errors -> -1 @> '{"kind": "lease_expired", "uncharged": true, "token": 11}' AND jsonb_array_length(errors) = 1
		  AND NOT errors -> -1 ? 'unconfirmed'`))
	require.Equal(t, 3, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id IN (3, 5, 11) AND claim_token IS NULL AND status = 'executing'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 5 AND unstarted_token = 0`), "the revoke kept the mark")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 3 AND unstarted_token IS NULL`))
	rr, err := q.Reap(ctx, c, 100, nil, 0)
	require.NoError(t, err)
	byID := map[int64]sqlq.Reaped{}
	for _, r := range rr.Reaped {
		byID[r.ID] = r
	}
	require.Len(t, byID, 4)
	require.True(t, byID[11].Charged, "no heartbeat since its claim, its step went free so once, at an earlier attempt")
	require.Equal(t, "runnable", byID[11].Status)
	require.True(t, byID[3].Charged, "not marked")
	require.Equal(t, "failed", byID[3].Status)
	require.True(t, byID[5].Charged, "went free once on this step and attempt")
	require.Equal(t, "failed", byID[5].Status)
	require.False(t, byID[7].Charged, "revoked by an engine of version 22, marked")
	require.Equal(t, "runnable", byID[7].Status)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 7 AND attempt = 0 AND errors -> -1 @> '{"kind": "lease_expired", "uncharged": true, "token": null}'`))
	require.Equal(t, 20, sqlq.MaxErrorHistory, "migration 023's revoke keeps 20 entries, as the reaper")
}

// TestLockedOutcomesNamesRowsAndParentsHeldElsewhere: the committer's look
// after a lock wait ran out names an outcome whose row another transaction
// holds, and a finishing one whose parent it holds; not a non-finishing or
// fenced-out outcome under a held parent, nor a child of an earlier fan-out
// or of a parent gone (pruned: a retried child runs without one), nor a
// free row. It waits on nothing.
func TestLockedOutcomesNamesRowsAndParentsHeldElsewhere(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, fsm_version, queue, step, status)
		OVERRIDING SYSTEM VALUE VALUES (1, 'm', 1, 'q', 'a', 'awaiting_children')`)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, fsm_version, queue, step, status, parent_id, parent_fanout, claim_token)
		OVERRIDING SYSTEM VALUE VALUES (2, 'm', 1, 'q', 'a', 'executing', 1, 1, 20), (3, 'm', 1, 'q', 'a', 'executing', 1, 1, 30),
		(4, 'm', 1, 'q', 'a', 'executing', NULL, NULL, 40), (5, 'm', 1, 'q', 'a', 'executing', NULL, NULL, 50),
		(6, 'm', 1, 'q', 'a', 'executing', 1, 1, 60), (7, 'm', 1, 'q', 'a', 'executing', 1, 0, 70),
		(8, 'm', 1, 'q', 'a', 'executing', 100, 1, 80)`)
	exec(`UPDATE {{s}}.gendurable_instances SET fanout = 1 WHERE id = 1`)
	require.Equal(t, 8, count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
	holdIn(t, conn(), `UPDATE gendurable_instances SET updated_at = now() WHERE id IN (1, 4)`) // a SignalTx's lock

	lc, err := conn().Begin(ctx) // a lock wait would fail this at once
	require.NoError(t, err)
	_, err = lc.Exec(ctx, `SET LOCAL lock_timeout = '1ms'`)
	require.NoError(t, err)
	got, err := q.LockedOutcomes(ctx, lc, []int64{2, 3, 4, 5, 6, 7, 8, 99}, []int64{20, 30, 40, 50, 61, 70, 80, 990},
		[]bool{true, false, false, true, true, true, true, true})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{2, 4}, got, "2 finishes under held parent 1; 3 does not finish; 4 is held itself; "+
		"5 is free; 6 is fenced out, 7 of an earlier fan-out, 8's parent is gone (their statements would not touch "+
		"a parent); 99 does not exist")
	require.NoError(t, lc.Rollback(ctx))
}

// TestOutcomeLockWaitIsTheStatementsOwn: an outcome statement with a lock
// wait gives up on a held row after about that wait (55P03, nothing
// written), leaves the session's lock_timeout as it was, and keeps a
// stricter one of the session's; without one it leaves the setting alone.
func TestOutcomeLockWaitIsTheStatementsOwn(t *testing.T) {
	t.Parallel()
	q, exec, _, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, fsm_version, queue, step, status, claim_token, lease_expires_at)
		OVERRIDING SYSTEM VALUE VALUES (1, 'm', 1, 'q', 'a', 'executing', 7, now() + interval '1 hour')`)
	tx := holdIn(t, conn(), `SELECT 1 FROM gendurable_instances WHERE id = 1 FOR UPDATE`)

	c := conn()
	res := `{}`
	apply := func(wait time.Duration) (time.Duration, error) {
		b := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: wait}
		b.Add(&sqlq.Outcome{ID: 1, Token: 7, Kind: sqlq.KindDone, Result: &res})
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := q.ApplyOutcomes(actx, c, b)
		return time.Since(start), err
	}
	setting := func() string {
		var s string
		require.NoError(t, c.QueryRow(ctx, `SHOW lock_timeout`).Scan(&s))
		return s
	}
	took, err := apply(200 * time.Millisecond)
	require.True(t, sqlq.LockTimedOut(err), "got %v", err)
	require.GreaterOrEqual(t, took, 200*time.Millisecond)
	require.Equal(t, "0", setting(), "the wait was the statement's own")

	_, err = c.Exec(ctx, `SET lock_timeout = '50ms'`)
	require.NoError(t, err)
	took, err = apply(3 * time.Second)
	require.True(t, sqlq.LockTimedOut(err), "got %v", err)
	require.Less(t, took, 2*time.Second, "the session's stricter setting holds")
	require.Equal(t, "50ms", setting())

	_, err = c.Exec(ctx, `SET lock_timeout = '300ms'`)
	require.NoError(t, err)
	_, err = apply(0)
	require.True(t, sqlq.LockTimedOut(err), "no wait of its own: the session's applies; got %v", err)
	require.Equal(t, "300ms", setting())
	require.NoError(t, tx.Rollback(ctx))
	_, err = apply(100 * time.Millisecond)
	require.NoError(t, err, "written once the row is free")
}

// holdIn runs sql (a statement that locks rows) in a transaction of its own
// on c, and keeps the transaction open until the test ends (or the caller
// rolls it back).
func holdIn(t *testing.T, c *pgx.Conn, sql string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, sql)
	require.NoError(t, err)
	return tx
}

// TestRecoverOutcomesFindsWhatALostAttemptWrote (schema version 19): every
// outcome writes its claim token (outcome_token), and a chained Next the
// token it drew for the next step (chain_token, the row's claim_token).
// RecoverOutcomes finds, by those, the outcomes a statement whose answer
// was lost wrote: a chained step's claim while it is still the row's and
// its lease lives; an outcome without chaining with no claim; nothing for a
// token that wrote nothing, nor a claim once the row was claimed again.
func TestRecoverOutcomesFindsWhatALostAttemptWrote(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step) SELECT 'm', 'a' FROM generate_series(1, 3)`)
	exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES (1, 'go')`)
	exec(`UPDATE {{s}}.gendurable_instances SET inbox = '{"go": 1}' WHERE id = 1`)
	res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 3)
	tok := map[int64]int64{}
	for _, r := range res.Claimed {
		tok[r.ID] = r.Token
	}
	step, state, result := "b", `{}`, `{}`
	got := applyOne(t, q, c,
		sqlq.Outcome{ID: 1, Token: tok[1], Kind: sqlq.KindNext, Step: &step, State: &state, Continue: true},
		sqlq.Outcome{ID: 2, Token: tok[2], Kind: sqlq.KindDone, Result: &result},
		sqlq.Outcome{ID: 3, Token: tok[3], Kind: sqlq.KindNext, Step: &step, State: &state, Continue: true})
	require.Len(t, got, 3)
	require.NotNil(t, got[1].Token)
	require.Equal(t, 3, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE outcome_token IS NOT NULL`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE id = 1 AND claim_token = chain_token AND claim_token = $1 AND outcome_token = $2`, *got[1].Token, tok[1]),
		"the chained claim's token is the one drawn, in both columns")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 2 AND chain_token IS NULL`))

	// Row 3 claimed again meanwhile (as a reaper and a pick would, after its lease).
	exec(`UPDATE {{s}}.gendurable_instances SET claim_token = nextval('{{s}}.gendurable_claim_token_seq') WHERE id = 3`)
	found, err := q.RecoverOutcomes(ctx, c, []int64{1, 2, 3, 1}, []int64{tok[1], tok[2], tok[3], tok[1] + 1000})
	require.NoError(t, err)
	byID := map[int64][]sqlq.Applied{}
	for _, a := range found {
		byID[a.ID] = append(byID[a.ID], a)
	}
	require.Len(t, byID[1], 1, "a token that wrote nothing finds nothing")
	require.Equal(t, *got[1].Token, *byID[1][0].Token, "the chained step's claim")
	require.Equal(t, "executing", byID[1][0].Status)
	require.Len(t, byID[1][0].Inbox, 1, "with its inbox, as the statement returned it")
	require.Len(t, byID[2], 1)
	require.Equal(t, "done", byID[2][0].Status)
	require.Nil(t, byID[2][0].Token)
	require.Len(t, byID[3], 1, "row 3's outcome was written")
	require.Nil(t, byID[3][0].Token, "but its claim is another's now")

	// A later outcome of the chained claim writes its own token.
	applyOne(t, q, c, sqlq.Outcome{ID: 1, Token: *got[1].Token, Kind: sqlq.KindDone, Result: &result})
	found, err = q.RecoverOutcomes(ctx, c, []int64{1}, []int64{tok[1]})
	require.NoError(t, err)
	require.Empty(t, found)
}

// TestAChildCountsDownOnlyAParentThatAwaitsIt (a crash probe): a parent
// retried after its children had failed went on to its next step; the
// children, retried on their own after it, then counted it down as they
// finished, to -3. A finishing child counts down only a parent that awaits
// its fan-out, or was failed while it did.
func TestAChildCountsDownOnlyAParentThatAwaitsIt(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	// 1 went on and finished; 2 awaits; 3 went on and failed at its next
	// step (a review: "failed" alone let it be counted below zero); 4 was
	// cancelled while it awaited (its retry recounts its live children
	// under its row lock, which the child's finish must wait for).
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, fanout, children_total, children_pending)
	      VALUES ('p', 'join', 'done', 1, 2, 0), ('p', 'join', 'awaiting_children', 1, 2, 2),
	             ('p', 'join', 'failed', 1, 2, 0), ('p', 'join', 'failed', 1, 2, 2)`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, parent_id, parent_fanout)
	      VALUES ('c', 'a', 1, 1), ('c', 'a', 2, 1), ('c', 'a', 3, 1), ('c', 'a', 4, 1)`)
	res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 4, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 4)
	result := `{}`
	var outs []sqlq.Outcome
	for _, r := range res.Claimed {
		outs = append(outs, sqlq.Outcome{ID: r.ID, Token: r.Token, Kind: sqlq.KindDone, Result: &result})
	}
	require.Len(t, applyOne(t, q, c, outs...), 4)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND children_pending = 0 AND status = 'done'`),
		"a parent that went on is not counted down")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 2 AND children_pending = 1`),
		"a parent that awaits is")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 3 AND children_pending = 0`),
		"a parent that went on and failed is not counted below zero")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 4 AND children_pending = 1`),
		"a parent cancelled while it awaited is")
}

// TestAReleasedKeyedRowKeepsItsPlace: a keyed row handed back at once
// (a claim given up before its step started, a worker's buffer on Stop) is
// the key's head again, as a reaped one is; before, its eligible_at became
// the release's now(), and at limit 1 the rows inserted after it ran first.
// One released with a delay (an unknown version's) waits for it; a plain
// row handed back is eligible from the release (the pick's floor reckons
// with that: docs/design.md §4).
func TestAReleasedKeyedRowKeepsItsPlace(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key, eligible_at) OVERRIDING SYSTEM VALUE
	      SELECT g, 'm', 'a', 'k', now() - interval '1 hour' + g * interval '1 second' FROM generate_series(1, 3) g`)
	db := conn()
	picked, err := q.Pick(ctx, db, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, picked.Claimed, 1)
	require.EqualValues(t, 1, picked.Claimed[0].ID)
	_, err = q.Release(ctx, db, []int64{1}, []int64{picked.Claimed[0].Token}, 0)
	require.NoError(t, err)
	picked, err = q.Pick(ctx, db, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, picked.Claimed, 1)
	require.EqualValues(t, 1, picked.Claimed[0].ID, "the key's first row, released, is its head again")
	_, err = q.Release(ctx, db, []int64{1}, []int64{picked.Claimed[0].Token}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND eligible_at > now() + interval '59 minutes'`))
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, eligible_at) OVERRIDING SYSTEM VALUE VALUES (9, 'm', 'a', now() - interval '1 hour')`)
	exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', claim_token = 99, lease_expires_at = now() + interval '1 minute' WHERE id = 9`)
	_, err = q.Release(ctx, db, []int64{9}, []int64{99}, 0)
	require.NoError(t, err)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 9 AND status = 'runnable' AND eligible_at > now() - interval '1 minute'`))
}

// TestReleaseMakesNoTokenUp: a pick draws a rated key's tokens for the rows
// it claims; releasing those claims unstarted gives nothing back (the
// bucket may have refilled since), so no pick after it claims more than the
// bucket allows.
func TestReleaseMakesNoTokenUp(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	for i := range 3 {
		exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, partition_key) OVERRIDING SYSTEM VALUE VALUES ($1, 'm', 'a', 'r')`, i+1)
	}
	db := conn()
	// A rate so slow that nothing refills during the test.
	policies := []sqlq.KeyPolicy{{Prefix: "r", Limit: 5, Rate: 1e-6, Burst: 2}}
	picked, err := q.Pick(ctx, db, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute, Policies: policies})
	require.NoError(t, err)
	require.Len(t, picked.Claimed, 2, "the burst")
	var ids, toks []int64
	for _, c := range picked.Claimed {
		ids, toks = append(ids, c.ID), append(toks, c.Token)
	}
	got, err := q.Release(ctx, db, ids, toks, 0)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, got)
	require.Equal(t, 0, count(`SELECT round(tokens)::int FROM {{s}}.gendurable_key_buckets WHERE key = 'r'`))
	picked, err = q.Pick(ctx, db, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute, Policies: policies})
	require.NoError(t, err)
	require.Empty(t, picked.Claimed, "the released claims' tokens stay spent")
}

// TestStatementsOnOneClaimedRowAreFencedAfterALockWait (a review): the
// release of an unknown version and Reawait read their row by primary key
// behind a fence, and check the claim's token and status there; one that
// waited for another transaction's lock on the row — a cancel, a new claim
// — must check them on the row as that transaction left it. The first form
// of the release read them without the lock, and its UPDATE, which
// re-checks only the id after a wait, turned a row cancelled meanwhile
// back to runnable and cleared a new claim.
func TestStatementsOnOneClaimedRowAreFencedAfterALockWait(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, claim_token, lease_expires_at, children_total)
		OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'executing', 11, now() + interval '1 minute', 0),
		       (2, 'm', 'a', 'executing', 21, now() + interval '1 minute', 0),
		       (3, 'm', 'join', 'executing', 31, now() + interval '1 minute', 1)`)
	for _, c := range []struct {
		name   string
		change string // what the other transaction does to the row, holding its lock
		write  func(db *pgx.Conn) error
		after  string // the row as the other transaction left it
	}{
		{"release-unknown after a new claim", `UPDATE gendurable_instances SET claim_token = 12 WHERE id = 1`,
			func(db *pgx.Conn) error { return q.ReleaseUnknown(ctx, db, 1, 11, 0, "unknown version") },
			`id = 1 AND status = 'executing' AND claim_token = 12`},
		{"release-unknown after a cancel", `UPDATE gendurable_instances SET status = 'failed', claim_token = NULL WHERE id = 2`,
			func(db *pgx.Conn) error { return q.ReleaseUnknown(ctx, db, 2, 21, 0, "unknown version") },
			`id = 2 AND status = 'failed' AND claim_token IS NULL`},
		{"reawait after a new claim", `UPDATE gendurable_instances SET claim_token = 32 WHERE id = 3`,
			func(db *pgx.Conn) error {
				status, err := q.Reawait(ctx, db, 3, 31)
				if err == nil && status != "" {
					return errors.New("reawait wrote " + status)
				}
				return err
			},
			`id = 3 AND status = 'executing' AND claim_token = 32`},
	} {
		other, err := conn().Begin(ctx)
		require.NoError(t, err)
		_, err = other.Exec(ctx, c.change)
		require.NoError(t, err, c.name)
		done := make(chan error, 1)
		w := conn()
		go func() { done <- c.write(w) }()
		select {
		case err := <-done:
			t.Fatalf("%s: the write did not wait for the row's lock: %v", c.name, err)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, other.Commit(ctx), c.name)
		select {
		case err := <-done:
			require.NoError(t, err, c.name)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the write did not end after the lock was freed", c.name)
		}
		require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE `+c.after), c.name)
	}
}
