package sqlq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// beforeRetryStatement is a pgx tracer that runs hook (once) just before
// Retry's second statement is sent: after its lock statement returned.
type beforeRetryStatement struct {
	once sync.Once
	hook func()
}

func (b *beforeRetryStatement) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "k.kids") && b.hook != nil {
		b.once.Do(b.hook)
	}
	return ctx
}

func (b *beforeRetryStatement) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRetryRacingACancelKeepsTheJoinCount: a Retry of a parent that is live
// when Retry locks, cancelled just after (before Retry's second statement),
// while a child's outcome holds the parent's row. The retry used to run on
// the row it had not locked: it counted the parent's live children on its
// snapshot (2), waited for the child's outcome, and wrote that count over
// the child's decrement, leaving the parent awaiting 2 children with 1 live
// — it would never wake. Now the retry statement retries only a row the lock
// statement locked, and Retry locks again when the row turned failed in
// between (waiting for the child's outcome, then counting on a snapshot
// that holds it).
func TestRetryRacingACancelKeepsTheJoinCount(t *testing.T) {
	t.Parallel()
	tr := &beforeRetryStatement{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 5, Tracer: tr})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var parent, c1 int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, children_total, children_pending)
		VALUES ('m', 'a', 'awaiting_children', 2, 2) RETURNING id`).Scan(&parent))
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, parent_id, parent_fanout)
		VALUES ('m', 'a', $1, 0) RETURNING id`, parent).Scan(&c1))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, parent_id, parent_fanout) VALUES ('m', 'a', $1, 0)`, parent)
	require.NoError(t, err)

	cancelled := make(chan error, 1)
	var childTx pgx.Tx
	var childDone sync.WaitGroup
	tr.hook = func() {
		go func() {
			_, _, err := q.Cancel(ctx, pool, parent, "operator")
			cancelled <- err
		}()
		select {
		case err := <-cancelled:
			// The cancel did not wait for Retry: the race is open. A child's
			// outcome now holds the parent's row (as parentJoinCTE does)
			// and commits once Retry's statement waits for it.
			cancelled <- err
			// (The hook runs on the test's goroutine, inside Retry.)
			var err2 error
			childTx, err2 = pool.Begin(ctx)
			require.NoError(t, err2)
			_, err2 = childTx.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1`, c1)
			require.NoError(t, err2)
			_, err2 = childTx.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET children_pending = children_pending - 1 WHERE id = $1`, parent)
			require.NoError(t, err2)
			childDone.Add(1)
			go func() {
				defer childDone.Done()
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					var waiting int
					_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
					if waiting > 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				_ = childTx.Commit(ctx)
			}()
		case <-time.After(10 * time.Second):
			// The cancel waits for Retry's lock. (Not here: the parent is
			// live, so Retry's lock statement locks nothing. Half a second
			// was too short for the cancel on a loaded machine, and the
			// test then raced nothing, the cancel committing after the retry.)
		}
	}
	_, _, _, err = q.Retry(ctx, pool, parent)
	require.NoError(t, err)
	childDone.Wait()
	require.NoError(t, <-cancelled)

	var status string
	var pending, live int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.status::text, p.children_pending,
		(SELECT count(*) FROM `+s+`.gendurable_instances AS c WHERE c.parent_id = p.id AND c.status NOT IN ('done', 'failed'))
		FROM `+s+`.gendurable_instances AS p WHERE p.id = $1`, parent).Scan(&status, &pending, &live))
	// Retried after the child's outcome, awaiting its one live child.
	require.Equal(t, "awaiting_children", status)
	require.Equal(t, live, pending, "a parent awaiting its children counts the live ones")
	require.Equal(t, 1, live)
}

// TestInboxSeenLivesFromAnAwaitToTheNextOutcome: the counts an Await
// outcome passes as already seen stay on the row (migration 018) through
// its timeout's wake, the claim that follows it and a Replay, so the step
// the timeout woke can pass them on; any other outcome, a retry and a
// cancel drop them.
func TestInboxSeenLivesFromAnAwaitToTheNextOutcome(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, claim_token, lease_expires_at, inbox)
	      OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'executing', 1, now() + interval '1 minute', '{"pay": 1}')`)
	var sid int64
	require.NoError(t, c.QueryRow(ctx, `INSERT INTO gendurable_signals (target_id, name) VALUES (1, 'pay') RETURNING id`).Scan(&sid))
	str := func(s string) *string { return &s }
	timeout := time.Millisecond
	got := applyOne(t, q, c, sqlq.Outcome{ID: 1, Token: 1, Kind: sqlq.KindAwait, Step: str("b"),
		Awaits: str(`["pay"]`), Timeout: &timeout, InboxDec: str(`{"pay": 1}`), Seen: str(fmt.Sprintf("[%d]", sid))})
	require.Equal(t, "awaiting_signal", got[1].Status, "the one pay was seen: the await parks")
	seen := fmt.Sprintf(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND inbox_seen = '[%d]'`, sid)
	require.Equal(t, 1, count(seen))

	time.Sleep(10 * time.Millisecond)
	woke, err := q.WakeTimedOut(ctx, c, 10, nil, time.Minute, time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, woke.N)
	require.Equal(t, 1, count(seen), "the timeout's wake keeps them")

	pick := func() sqlq.Claimed {
		t.Helper()
		res, err := q.Pick(ctx, c, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		return res.Claimed[0]
	}
	cl := pick()
	require.Equal(t, []string{}, cl.Awaits, "follows a timed-out await")
	require.Equal(t, []int64{sid}, cl.Seen, "the claim carries them")

	got = applyOne(t, q, c, sqlq.Outcome{ID: 1, Token: cl.Token, Kind: sqlq.KindReplay, AttemptInc: 1})
	require.Equal(t, "runnable", got[1].Status)
	require.Equal(t, 1, count(seen), "a Replay keeps them")
	cl = pick()
	require.Equal(t, []int64{sid}, cl.Seen)

	got = applyOne(t, q, c, sqlq.Outcome{ID: 1, Token: cl.Token, Kind: sqlq.KindNext, Step: str("c")})
	require.Equal(t, "runnable", got[1].Status)
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE inbox_seen IS NOT NULL`), "a Next drops them")

	// A retry and a cancel drop them with the inbox.
	exec(`UPDATE {{s}}.gendurable_instances SET status = 'failed', finished_at = now(), inbox_seen = '[1]' WHERE id = 1`)
	_, _, _, err = q.Retry(ctx, c, 1)
	require.NoError(t, err)
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE inbox_seen IS NOT NULL`), "a retry drops them")
	exec(`UPDATE {{s}}.gendurable_instances SET inbox_seen = '[1]' WHERE id = 1`)
	_, cancelled, err := q.Cancel(ctx, c, 1, "test")
	require.NoError(t, err)
	require.True(t, cancelled)
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE inbox_seen IS NOT NULL`), "a cancel drops them")
}

// statementLog records the statements a pool sends, in order.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	l.sql = append(l.sql, d.SQL)
	l.mu.Unlock()
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRetryTransactionsLimitTheirIdle: Retry and RetryMany lock the rows
// (and their parents) in one statement and retry them in the next; a
// client cut off between the two left them locked until the server's TCP
// keepalive gave up, and a locked parent held back its children's outcomes
// and every reap meanwhile (a probe: 49 s and counting). Both begin with
// the library's idle limit (a minute), in the BEGIN's own round trip.
func TestRetryTransactionsLimitTheirIdle(t *testing.T) {
	t.Parallel()
	log := &statementLog{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: log})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	var a, b int64
	require.NoError(t, pool.QueryRow(ctx, `WITH n AS (INSERT INTO "`+schema+`".gendurable_instances (fsm, step, status, finished_at)
		VALUES ('m', 'a', 'failed', now()), ('m', 'a', 'failed', now()) RETURNING id) SELECT min(id), max(id) FROM n`).Scan(&a, &b))
	for name, retry := range map[string]func() error{
		"Retry":     func() error { _, _, _, err := q.Retry(ctx, pool, a); return err },
		"RetryMany": func() error { _, err := q.RetryMany(ctx, pool, []int64{b}); return err },
	} {
		log.mu.Lock()
		log.sql = nil
		log.mu.Unlock()
		require.NoError(t, retry(), name)
		log.mu.Lock()
		require.NotEmpty(t, log.sql, name)
		require.Equal(t, sqlq.BeginRetry, log.sql[0], "%s begins with the idle limit", name)
		log.mu.Unlock()
	}
	var failed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE status = 'failed'`).Scan(&failed))
	require.Zero(t, failed, "both retried")
}

// TestRetryParksAgainOnlyACancelledAwait: Retry parks a row again only if
// it was cancelled while parked (awaits kept by the cancel, its last error
// the cancel's) — also a parent past its fan-out with a child of that
// fan-out live again, which awaits its signal, not the child. A row a
// reaper of an earlier version failed after a signal woke it (awaits kept,
// its last error lease_expired) runs its step as after a timeout (awaits
// empty, so the step is shown its inbox).
func TestRetryParksAgainOnlyACancelledAwait(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	ctx := context.Background()
	c := conn()
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, finished_at, awaits, await_deadline, errors, fanout, children_total)
	      OVERRIDING SYSTEM VALUE VALUES
	        (1, 'm', 'ship', 'failed', now(), '{pay}', NULL, '[{"kind": "cancelled", "error": "op"}]', 0, 0),
	        (2, 'm', 'ship', 'failed', now(), '{pay}', NULL, '[{"kind": "lease_expired", "error": "crashed"}]', 0, 0),
	        (3, 'm', 'approve', 'failed', now(), '{approve}', now() + interval '1 hour', '[{"kind": "cancelled", "error": "op"}]', 1, 0),
	        (4, 'm', 'join', 'failed', now(), NULL, NULL, '[{"kind": "cancelled", "error": "op"}]', 1, 1)`)
	// Row 4 was cancelled while it awaited its fan-out (children_total kept,
	// 1): awaits NULL.
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, parent_id, parent_fanout) OVERRIDING SYSTEM VALUE VALUES (11, 'm', 'a', 4, 1)`)
	// Row 3's child of its fan-out 1, live again (retried on its own).
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, parent_id, parent_fanout) OVERRIDING SYSTEM VALUE VALUES (10, 'm', 'a', 3, 1)`)
	for _, id := range []int64{1, 2, 3, 4} {
		_, _, _, err := q.Retry(ctx, c, id)
		require.NoError(t, err)
	}
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND status = 'awaiting_signal'
		AND awaits = '{pay}' AND await_deadline IS NULL`), "cancelled while parked: parked again")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 2 AND status = 'runnable' AND awaits = '{}'`),
		"failed by a reaper after a wake: runs its step as after a timeout (awaits empty: shown its inbox)")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 3 AND status = 'awaiting_signal'
		AND awaits = '{approve}' AND await_deadline > now() + interval '59 minutes'`), "its signal, with its deadline, not the child")
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 4 AND status = 'awaiting_children'
		AND children_pending = 1`), "a parent cancelled on its fan-out awaits its live child, counted (awaits NULL must not leave the count)")
}

// TestRetryManyRetriesARowHoldingItsOwnKey: a failed row whose unique scope
// holds failed (UniqueForever) holds its own key; RetryMany's check for
// another holder found the row itself and skipped it, every time, while a
// single Retry retried it.
func TestRetryManyRetriesARowHoldingItsOwnKey(t *testing.T) {
	t.Parallel()
	q, exec, count, conn := keySetup(t)
	exec(`INSERT INTO {{s}}.gendurable_instances (id, fsm, step, status, finished_at, unique_key, unique_scope)
	      OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'a', 'failed', now(), 'k1'::bytea,
	        '{runnable,executing,awaiting_signal,awaiting_children,done,failed}')`)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND unique_guard IS NOT NULL`), "it holds its key")
	changed, err := q.RetryMany(context.Background(), conn(), []int64{1})
	require.NoError(t, err)
	require.Len(t, changed, 1)
	require.Equal(t, 1, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = 1 AND status = 'runnable'`))
}

// TestReawaitTakesItsTurnWithAFinishingChild: a claimed parent found a
// child live and gives its claim up (Reawait) while that child's finishing
// outcome is written, uncommitted. The finish must count down the parent
// it now awaits: before, it passed the parent by as executing on its
// snapshot (only an awaiting, woken or failed parent counted down), the
// reawait counted the child live on its own, and the parent awaited a
// child that had finished — for ever.
func TestReawaitTakesItsTurnWithAFinishingChild(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var parent, child int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, claim_token, lease_expires_at, fanout, children_total, children_pending)
		VALUES ('m', 'join', 'executing', 100, now() + interval '1 minute', 1, 1, 0) RETURNING id`).Scan(&parent))
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, claim_token, lease_expires_at, parent_id, parent_fanout)
		VALUES ('m', 'a', 'executing', 200, now() + interval '1 minute', $1, 1) RETURNING id`, parent).Scan(&child))

	// The child's outcome, written and not committed yet.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res := `{}`
	batch := sqlq.OutcomeBatch{Lease: time.Minute}
	batch.Add(&sqlq.Outcome{ID: child, Token: 200, Kind: sqlq.KindDone, Result: &res})
	applied, err := q.ApplyOutcomes(ctx, tx, &batch)
	require.NoError(t, err)
	require.Len(t, applied, 1)

	type answer struct {
		status string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		st, err := q.Reawait(ctx, pool, parent, 100)
		got <- answer{st, err}
	}()
	// Commit the child's finish once the reawait waits for the parent's
	// lock, or has answered without waiting.
	var a *answer
	for deadline := time.Now().Add(5 * time.Second); a == nil && time.Now().Before(deadline); {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		select {
		case x := <-got:
			a = &x
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.NoError(t, tx.Commit(ctx))
	if a == nil {
		x := <-got
		a = &x
	}
	require.NoError(t, a.err)

	var status string
	var pending, live int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.status::text, p.children_pending,
		(SELECT count(*) FROM `+s+`.gendurable_instances AS c WHERE c.parent_id = p.id AND c.status NOT IN ('done', 'failed'))
		FROM `+s+`.gendurable_instances AS p WHERE p.id = $1`, parent).Scan(&status, &pending, &live))
	require.Equal(t, 0, live)
	require.Equal(t, "runnable", status, "the parent awaits %d children, none of them live", pending)
	require.Equal(t, "runnable", a.status)
}
