package sqlq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Bulk operator statements: retry or cancel a batch of instances by id, and
// make a delayed instance eligible now. A batch is bounded by its caller
// (gendurable.MaxBulkIDs) and passed sorted; its rows are found one primary
// key probe each (a lateral lookup behind an OFFSET 0 fence, as the hot path
// does, so no statistics can turn it into a scan of a status' rows) and
// locked in id order first, so two bulk statements never lock the same rows
// in opposite orders (docs/design.md §5).

// retryManySQL is retrySQL for a batch: the failed rows among $1 go back to
// runnable with a fresh attempt budget. A row whose unique key another live
// row now holds is left failed (the single retry reports it as a conflict);
// two rows of the batch sharing a key still collide on the unique index
// (SQLSTATE 23505), and the caller then retries them one by one. Parents that
// still wait count each of their retried children again, once per child.
// Its rows ($1) are locked already, by retryLockSQL in the same transaction
// (RetryMany): it reads them on a snapshot taken after those locks, so they
// are as it finds them, and it does not lock them again.
var retryManySQL = `
WITH cand AS MATERIALIZED (
  SELECT c.id, c.fanout, c.children_total FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, ord) CROSS JOIN LATERAL (
    SELECT c.id, c.fanout, c.children_total, c.unique_key, c.unique_scope FROM {{schema}}.gendurable_instances AS c
    WHERE c.id = u.id AND c.status = 'failed'
    OFFSET 0 -- a fence: one primary-key probe per id
  ) AS c
  WHERE NOT (c.unique_key IS NOT NULL AND 'runnable' = ANY (c.unique_scope) AND EXISTS (
      -- Another holder: a failed row whose scope holds failed (UniqueForever)
      -- holds its own key, and was skipped by every RetryMany.
      SELECT 1 FROM {{schema}}.gendurable_instances AS h WHERE h.unique_guard = c.unique_key AND h.id <> c.id))
  ORDER BY u.ord
), k AS (
  SELECT p.id, ` + liveChildren(`SELECT cand.id FROM cand`) + ` AS kids
  FROM cand AS p
), r AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET attempt = 0, finished_at = NULL, claim_token = NULL, updated_at = now(), inbox = '{}', inbox_seen = NULL,
` + retryStatusSet + `,
      eligible_at = ` + retryKeepsEligible + `, lease_expires_at = ` + retryLease + `
  FROM k WHERE i.id = k.id -- locked by retryLockSQL, still failed
  RETURNING i.id, i.parent_id, i.parent_fanout, i.queue, ` + retryWait + ` AS wait_us
), p AS (
  UPDATE {{schema}}.gendurable_instances AS p
  SET ` + reawaitSet("x.n") + `
  FROM (SELECT parent_id, parent_fanout, count(*)::int AS n FROM r
        WHERE parent_id IS NOT NULL GROUP BY parent_id, parent_fanout) AS x
  WHERE p.id = x.parent_id AND p.fanout = x.parent_fanout AND ` + waitsForItsChildren("p") + `
  RETURNING p.id
), leftovers AS (
  -- A signal that raced the terminal outcome stayed unconsumed: consume it
  -- now, as the terminal outcome would have (see retrySQL).
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM (SELECT x.id FROM r CROSS JOIN LATERAL (
          SELECT s.id FROM {{schema}}.gendurable_signals AS s
          WHERE s.target_id = r.id AND s.consumed_at IS NULL
          OFFSET 0) AS x) AS l
  WHERE s.id = l.id AND s.consumed_at IS NULL -- rechecked on a version newer than the snapshot
  RETURNING s.id
)
SELECT id, queue, wait_us FROM r ORDER BY id`

// cancelManySQL is cancelSQL for a batch: the live rows among $1 fail at
// once, each with its reason in $2 (the same position), their inboxes are
// consumed, their parents count them as finished, and workers still running
// one of their steps are fenced out. The bulk cancels, CancelTree (a level
// of a tree at a time) and Engine.failOversized run it. resweep flags a row
// whose sweep missed a signal that committed while the statement waited for
// the row (heldSignals): CancelManyEach sweeps those again.
//
// $4-$7 (NULL: any) are a filter's queue, status, step and state, which
// CancelMatching found the ids by: a row that no longer matches once its
// lock is held — its status or step moved while the statement waited for
// it (a SignalTx woke it, a worker claimed it) — is left alone, as one that
// finished is. The conditions sit under the lock, so PostgreSQL checks them
// again on the row version it locks (a probe cancelled a row of a filter on
// status awaiting_signal that a signal had woken meanwhile).
var cancelManySQL = `
WITH cand AS MATERIALIZED (
  SELECT c.id, u.reason, c.inbox
  FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS u(id, reason, ord) CROSS JOIN LATERAL (
    SELECT c.id, c.inbox FROM {{schema}}.gendurable_instances AS c
    WHERE c.id = u.id AND c.status NOT IN ('done', 'failed')
      AND ($4::text IS NULL OR c.queue = $4)
      AND ($5::text IS NULL OR c.status = $5::{{schema}}.gendurable_status)
      AND ($6::text IS NULL OR c.step = $6)
      AND ($7::jsonb IS NULL OR c.state @> $7::jsonb)
    OFFSET 0 -- a fence: one primary-key probe per id
    FOR NO KEY UPDATE
  ) AS c
  ORDER BY u.ord
), changed AS (
  UPDATE {{schema}}.gendurable_instances AS i
` + cancelSet(`cand.reason`) + `
  FROM cand WHERE i.id = cand.id -- locked by cand, still live
  RETURNING i.id, i.status, i.parent_id, i.parent_fanout, i.queue, cand.inbox AS held_inbox
), swept AS (
  -- A row whose inbox counts are empty has no unconsumed signal: every
  -- signal bumps them under the row lock cand holds.
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM (SELECT x.id FROM cand CROSS JOIN LATERAL (
          SELECT s.id FROM {{schema}}.gendurable_signals AS s
          WHERE s.target_id = cand.id AND s.consumed_at IS NULL
          OFFSET 0) AS x
        WHERE cand.inbox <> '{}'::jsonb) AS l
  -- consumed_at again: a signal consumed since the snapshot (by the step
  -- whose lock cand waited for) is rechecked on its new version and not
  -- counted as swept, so a signal that arrived meanwhile is not hidden.
  WHERE s.id = l.id AND s.consumed_at IS NULL
  RETURNING s.target_id
), ` + parentJoinCTE + `
SELECT c.id, c.queue,
       c.held_inbox <> '{}'::jsonb AND ` + heldSignals(`c.held_inbox`) + ` > coalesce(w.n, 0) AS resweep
FROM changed AS c
LEFT JOIN (SELECT target_id, count(*) AS n FROM swept GROUP BY target_id) AS w ON w.target_id = c.id
ORDER BY c.id`

// treeChildrenSQL returns the children (of every fan-out) of the ids $1,
// each with whether it is live: one lookup of the parent index
// (gendurable_instances_parent_fanout, by its leading column) per id,
// behind an OFFSET 0 fence as the bulk statements probe theirs. It locks
// nothing: Engine.CancelTree reads a level of the tree with it and cancels
// what it found with cancelManySQL, a batch at a time. Its rows are the
// children of at most gendurable.BulkBatch parents, whatever their number.
const treeChildrenSQL = `
SELECT c.id, c.status NOT IN ('done', 'failed') FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
  SELECT c.id, c.status FROM {{schema}}.gendurable_instances AS c WHERE c.parent_id = u.id OFFSET 0) AS c`

// parentsAmongSQL returns which of the ids $1 are the parent of another of
// them (one primary-key probe per id).
const parentsAmongSQL = `
SELECT DISTINCT c.parent_id FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
  SELECT c.parent_id FROM {{schema}}.gendurable_instances AS c WHERE c.id = u.id OFFSET 0) AS c
WHERE c.parent_id = ANY ($1::bigint[])`

// existingSQL returns which of the ids $1 exist.
const existingSQL = `
SELECT c.id FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
  SELECT c.id FROM {{schema}}.gendurable_instances AS c WHERE c.id = u.id OFFSET 0) AS c`

// runNowSQL makes a runnable row that is eligible later (scheduled, or
// backing off before its next attempt) eligible now. It returns the status
// the row had (NULL if none exists) and, if it was changed, its queue. A row
// retried while the lease of its cancelled step still lives stays eligible
// only when that lease ends (see retrySQL).
//
// The row is locked in a CTE of its own before the update computes its new
// values: an UPDATE computes them before it waits for a row lock (another
// transaction's lock alone leaves the row unchanged, so nothing computes
// them again), and the clock retryEligible reads would be from before the
// wait — below the pick's floor after a wait of over a second. The status
// it returns is the locked row's: as the transaction that held the row left
// it, not as the statement's snapshot, taken before the wait, saw it.
const runNowSQL = `
WITH l AS MATERIALIZED (
  SELECT id, status FROM {{schema}}.gendurable_instances WHERE id = $1 FOR NO KEY UPDATE
), u AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET eligible_at = ` + retryEligible + `, updated_at = now()
  FROM l WHERE i.id = l.id AND i.status = 'runnable' AND i.eligible_at > now()
  RETURNING i.queue, ` + retryWait + ` AS wait_us
)
SELECT (SELECT status::text FROM l), (SELECT queue FROM u), coalesce((SELECT wait_us FROM u), 0)`

// BulkChanged is one row a bulk statement changed.
type BulkChanged struct {
	ID    int64
	Queue string
	Wait  time.Duration // RetryMany: how long until the row is eligible (0: now; see retryWait)
}

// RetryMany retries the failed instances among ids (sorted, no duplicates) (see retryManySQL) and
// returns those it retried.
//
// It locks the rows first, in a statement of its own (see retryStatusSet):
// the retry statement, run on the ids it locked, counts their children on a
// snapshot taken once no child of theirs can finish any more.
func (q *Queries) RetryMany(ctx context.Context, db TxDB, ids []int64) (changed []BulkChanged, err error) {
	err = beginIdleLimitedFunc(ctx, db, func(tx pgx.Tx) error {
		locked, err := q.lockForRetry(ctx, tx, ids)
		if err != nil || len(locked) == 0 {
			return err
		}
		rows, err := tx.Query(ctx, q.retryMany, locked)
		if err != nil {
			return err
		}
		changed, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkChanged, error) {
			var c BulkChanged
			var us int64
			err := row.Scan(&c.ID, &c.Queue, &us)
			c.Wait = time.Duration(us) * time.Microsecond
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return changed, nil
}

// CancelMany cancels the live instances among ids (sorted, no duplicates) with reason (see
// cancelManySQL) and returns those it cancelled.
func (q *Queries) CancelMany(ctx context.Context, db DB, ids []int64, reason string) ([]BulkChanged, error) {
	return q.CancelStillMatching(ctx, db, ids, reason, Recheck{})
}

// Recheck is what of a filter a bulk cancel checks again on each row it
// locks (nil: anything): the fields a row's version can change or that
// name it (cancelManySQL).
type Recheck struct {
	Queue, Status, Step, State *string
}

// CancelStillMatching is CancelMany of the rows that still match r once
// locked.
func (q *Queries) CancelStillMatching(ctx context.Context, db DB, ids []int64, reason string, r Recheck) ([]BulkChanged, error) {
	reasons := make([]string, len(ids))
	for i := range reasons {
		reasons[i] = reason
	}
	return q.cancelManyEach(ctx, db, ids, reasons, r)
}

// CancelManyEach is CancelMany with a reason per id (reasons[i] for ids[i]).
//
// A signal that committed while the statement waited for its row is not in
// the statement's snapshot, so its sweep missed it; the statement reports
// such rows, and they are swept again, in a snapshot of their own: the rows
// are failed now, so no signal arrives after it, unless a Retry came in
// between (sweepInboxesSQL leaves a retried row alone). Best effort: the
// cancel is committed, and a Retry sweeps what is left (retrySQL).
func (q *Queries) CancelManyEach(ctx context.Context, db DB, ids []int64, reasons []string) ([]BulkChanged, error) {
	return q.cancelManyEach(ctx, db, ids, reasons, Recheck{})
}

func (q *Queries) cancelManyEach(ctx context.Context, db DB, ids []int64, reasons []string, r Recheck) ([]BulkChanged, error) {
	rows, err := db.Query(ctx, q.cancelMany, ids, reasons, MaxErrorHistory, r.Queue, r.Status, r.Step, r.State)
	if err != nil {
		return nil, err
	}
	var resweep []int64
	changed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkChanged, error) {
		var c BulkChanged
		var again bool
		err := row.Scan(&c.ID, &c.Queue, &again)
		if again {
			resweep = append(resweep, c.ID)
		}
		return c, err
	})
	if err == nil && len(resweep) > 0 {
		_ = q.SweepInboxes(ctx, db, resweep)
	}
	return changed, err
}

// TreeChild is a child TreeChildren found: its id and whether it is live
// (not done, not failed).
type TreeChild struct {
	ID   int64
	Live bool
}

// TreeChildren returns the children of every fan-out of parents (see
// treeChildrenSQL), in no particular order.
func (q *Queries) TreeChildren(ctx context.Context, db DB, parents []int64) ([]TreeChild, error) {
	rows, err := db.Query(ctx, q.treeChildren, parents)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TreeChild, error) {
		var c TreeChild
		err := row.Scan(&c.ID, &c.Live)
		return c, err
	})
}

// ParentsAmong returns which of ids are the parent of another of them, in
// no particular order.
func (q *Queries) ParentsAmong(ctx context.Context, db DB, ids []int64) ([]int64, error) {
	rows, err := db.Query(ctx, q.parentsAmong, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// Existing returns which of ids exist, in no particular order.
func (q *Queries) Existing(ctx context.Context, db DB, ids []int64) ([]int64, error) {
	rows, err := db.Query(ctx, q.existing, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// RunNow makes a delayed runnable instance eligible now. It returns the
// status the instance had (nil if none exists), its queue if it was delayed,
// and how long until it is eligible: 0, or what is left of the lease of its
// cancelled step (see runNowSQL). One statement: the status is the one it
// found once it held the row, after a change it waited for (a cancel
// committing).
func (q *Queries) RunNow(ctx context.Context, db DB, id int64) (status, queue *string, wait time.Duration, err error) {
	var us int64
	err = db.QueryRow(ctx, q.runNow, id).Scan(&status, &queue, &us)
	return status, queue, time.Duration(us) * time.Microsecond, err
}
