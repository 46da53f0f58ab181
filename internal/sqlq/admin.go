package sqlq

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Admin statements: what operators read and steer. None is on the hot path;
// each is bounded (LIMIT, batches) so a large table cannot make one run away.

// ListFilter selects instances; nil fields do not filter.
type ListFilter struct {
	Queue, Status, FSM, Step *string
	From, To                 *time.Time // inserted_at range [From, To)
	// Search is an exact id (when SearchID is set), partition key or unique
	// key: each found through its index (the primary key,
	// gendurable_instances_partition_key, gendurable_instances_unique_key).
	Search   *string
	SearchID *int64
	// State keeps rows whose state contains this JSON document (jsonb @>),
	// checked on the window's rows like the other filters.
	State  *string
	Before *int64 // keyset paging: ids below this
	Limit  int    // rows returned
	// Scan bounds the rows a page looks at: the newest Scan instances below
	// Before (of those matching Search, if set) are filtered, no more.
	Scan int
}

// A list looks at a window: the newest $8 candidates below the cursor $7,
// taken from the primary key backwards (listScanSQL) or from the union of
// the id, partition-key and unique-key lookups (listSearchSQL), so no page
// reads more than $8 rows whatever the filters. The filters ($1-$6, $10) apply
// to the window and the page is at most $9 rows: the scan stops as soon as
// the page is full, so a plain first page reads about $9 rows. The window's
// last row (row number $8) is returned even if it does not match, flagged
// window_end: a page that did not fill up learns where its window ended, in
// the same pass, without a second statement (an aggregate over the window
// would let the planner pick a sequential scan and sort when the statistics
// lie about the table).
const listColsSQL = `
SELECT w.id, w.fsm, w.fsm_version, w.queue, w.step, w.status::text, w.attempt, w.max_attempts, w.priority,
       w.partition_key, w.parent_id, w.eligible_at, w.inserted_at, w.updated_at, w.finished_at,
       CASE WHEN w.hit THEN
         (SELECT e ->> 'error' FROM jsonb_array_elements(w.errors) AS e ORDER BY (e ->> 'at') DESC LIMIT 1)
       END,
       w.hit, w.rn = $8
FROM (
  SELECT x.*, row_number() OVER (ORDER BY x.id DESC) AS rn,
         coalesce(($1::text IS NULL OR x.queue = $1)
           AND ($2::text IS NULL OR x.status = $2::{{schema}}.gendurable_status)
           AND ($3::text IS NULL OR x.fsm = $3)
           AND ($4::text IS NULL OR x.step = $4)
           AND ($5::timestamptz IS NULL OR x.inserted_at >= $5)
           AND ($6::timestamptz IS NULL OR x.inserted_at < $6)
           AND ($10::jsonb IS NULL OR x.state @> $10::jsonb), false) AS hit
  FROM (`

const listTailSQL = `) AS x
) AS w
WHERE w.hit OR w.rn = $8
ORDER BY w.id DESC
LIMIT $9`

const listScanSQL = listColsSQL + `
    SELECT * FROM {{schema}}.gendurable_instances
    WHERE id < $7
    ORDER BY id DESC
    LIMIT $8
  ` + listTailSQL

const listSearchSQL = listColsSQL + `
    SELECT s.id, i.fsm, i.fsm_version, i.queue, i.step, i.status, i.attempt, i.max_attempts, i.priority,
           i.partition_key, i.parent_id, i.eligible_at, i.inserted_at, i.updated_at, i.finished_at,
           i.errors, i.state
    FROM (
      SELECT id FROM (
        (SELECT id FROM {{schema}}.gendurable_instances WHERE id = $11 AND id < $7)
        UNION
        (SELECT id FROM {{schema}}.gendurable_instances
         WHERE partition_key = $12 AND id < $7 ORDER BY id DESC LIMIT $8)
        UNION
        (SELECT id FROM {{schema}}.gendurable_instances
         WHERE unique_key = convert_to($12, 'UTF8') AND id < $7 ORDER BY id DESC LIMIT $8)
      ) AS u
      ORDER BY id DESC
      LIMIT $8
    ) AS s
    -- one primary-key probe per candidate, newest first, stopping with the
    -- page: a plain join let statistics that know a key is large pick a
    -- merge join walking the primary key down from the newest row, or a
    -- hash join over a sequential scan of the table
    CROSS JOIN LATERAL (SELECT * FROM {{schema}}.gendurable_instances AS i WHERE i.id = s.id OFFSET 0) AS i
  ` + listTailSQL

// ListRow is one instance in a list.
type ListRow struct {
	ID           int64
	FSM          string
	Version      int32
	Queue        string
	Step         string
	Status       string
	Attempt      int32
	MaxAttempts  int32
	Priority     int16
	PartitionKey *string
	ParentID     *int64
	EligibleAt   time.Time
	InsertedAt   time.Time
	UpdatedAt    time.Time
	FinishedAt   *time.Time
	LastError    *string
}

// ListWindow says where a page's window ended, when the page read all of
// it: Full when it held ListFilter.Scan rows, Low the lowest id among them.
type ListWindow struct {
	Full bool
	Low  int64
}

// ListSQL is the statement and arguments of a list page: the search window
// when f.Search is set, the primary-key window otherwise.
func (q *Queries) ListSQL(f ListFilter) (string, []any) {
	before := int64(math.MaxInt64)
	if f.Before != nil {
		before = *f.Before
	}
	// One more row than asked: the window's last row may come after the
	// matches.
	args := []any{f.Queue, f.Status, f.FSM, f.Step, f.From, f.To, before, f.Scan, f.Limit + 1, f.State}
	if f.Search == nil {
		return q.listScan, args
	}
	return q.listSearch, append(args, f.SearchID, *f.Search)
}

// ListInstances returns at most f.Limit instances matching f, newest first,
// and, if the page read its whole window, where that window ended.
func (q *Queries) ListInstances(ctx context.Context, db DB, f ListFilter) ([]ListRow, ListWindow, error) {
	sql, args := q.ListSQL(f)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, ListWindow{}, err
	}
	defer rows.Close()
	var out []ListRow
	var win ListWindow
	for rows.Next() {
		var r ListRow
		var hit, end bool
		if err := rows.Scan(&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step, &r.Status, &r.Attempt, &r.MaxAttempts,
			&r.Priority, &r.PartitionKey, &r.ParentID, &r.EligibleAt, &r.InsertedAt, &r.UpdatedAt, &r.FinishedAt,
			&r.LastError, &hit, &end); err != nil {
			return nil, ListWindow{}, err
		}
		if end {
			win = ListWindow{Full: true, Low: r.ID}
		}
		if hit && len(out) < f.Limit {
			out = append(out, r)
		}
	}
	return out, win, rows.Err()
}

const queueCountsSQL = `
SELECT coalesce(c.queue, p.name), coalesce(c.status, ''), coalesce(c.n, 0), coalesce(p.paused, false)
FROM (SELECT queue, status::text AS status, count(*) AS n
      FROM {{schema}}.gendurable_instances GROUP BY 1, 2) AS c
FULL JOIN {{schema}}.gendurable_queues AS p ON p.name = c.queue
ORDER BY 1, 2`

// QueueCountRow is the count of one (queue, status); Status is "" for a
// paused queue without instances.
type QueueCountRow struct {
	Queue  string
	Status string
	Count  int64
	Paused bool
}

// QueueCounts counts instances by queue and status, with each queue's pause flag.
func (q *Queries) QueueCounts(ctx context.Context, db DB) ([]QueueCountRow, error) {
	rows, err := db.Query(ctx, q.queueCounts)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueCountRow, error) {
		var r QueueCountRow
		err := row.Scan(&r.Queue, &r.Status, &r.Count, &r.Paused)
		return r, err
	})
}

// setPausedSQL sets a queue's pause flag, creating its row, but only for a
// known queue (a row, or any instance in it; the runnable checks first, one
// per pick index — their partial indexes are of plain and of keyed rows, so
// one check of both had no index and scanned the table) unless $3 says to
// create it. No row comes back for an unknown queue. An unknown queue, or
// one whose instances are all waiting or finished, costs one scan of the
// instances table.
const setPausedSQL = `
WITH known AS (
  SELECT $3::bool
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues WHERE name = $1)
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances
                 WHERE queue = $1 AND status = 'runnable' AND partition_key IS NULL)
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances
                 WHERE queue = $1 AND status = 'runnable' AND partition_key IS NOT NULL)
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances WHERE queue = $1) AS known
)
INSERT INTO {{schema}}.gendurable_queues (name, paused)
SELECT $1, $2 FROM known WHERE known.known
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
RETURNING true`

// SetPaused pauses or resumes a queue for every process. A queue that has
// neither a row nor an instance is left alone (known false) unless create.
func (q *Queries) SetPaused(ctx context.Context, db DB, queue string, paused, create bool) (known bool, err error) {
	err = db.QueryRow(ctx, q.setPaused, queue, paused, create).Scan(&known)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// removeQueueSQL deletes a queue's row (its pause flag) when no instance,
// live or finished, is in the queue. The final SELECT sees the statement's
// snapshot, so "had a row" is as before the delete.
const removeQueueSQL = `
WITH busy AS (
  SELECT EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances WHERE queue = $1) AS busy
), gone AS (
  DELETE FROM {{schema}}.gendurable_queues AS q USING busy
  WHERE q.name = $1 AND NOT busy.busy
  RETURNING q.name
)
SELECT EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues WHERE name = $1),
       (SELECT busy FROM busy),
       EXISTS (SELECT 1 FROM gone)`

// RemoveQueue deletes a queue's row if no instance is in the queue. It
// reports whether the row existed, whether instances are in the queue, and
// whether the row was deleted.
func (q *Queries) RemoveQueue(ctx context.Context, db DB, queue string) (hadRow, busy, removed bool, err error) {
	err = db.QueryRow(ctx, q.removeQueue, queue).Scan(&hadRow, &busy, &removed)
	return hadRow, busy, removed, err
}

// cancelSet is what a cancel writes to each instance it cancels (reason the
// SQL expression of its reason, $3 MaxErrorHistory): Cancel and the bulk
// cancels share it. A row keeps its lease if it is executing, or if it is a
// row retried while its cancelled run's lease was live (retryLease): see
// cancelSQL. What a parked instance awaited stays, for a retry to park it
// again (retryStatusSet); a row past its await (woken, its step not yet
// finished) keeps an empty list, for a retry to run that step as after a
// timeout, shown its inbox; any other row awaits nothing. (Keep the SQL
// short: tests find a waiting cancel by 'cancelled' in pg_stat_activity's
// query, which keeps the first 1024 bytes.)
func cancelSet(reason string) string {
	return `
  SET status = 'failed', finished_at = now(), updated_at = now(),
      lease_expires_at = CASE WHEN i.status = 'executing' OR i.lease_expires_at > now() THEN i.lease_expires_at END,
      claim_token = NULL, inbox = '{}', inbox_seen = NULL,
      awaits = CASE WHEN i.status = 'awaiting_signal' THEN i.awaits WHEN i.awaits IS NOT NULL THEN '{}' END,
      await_deadline = CASE WHEN i.status = 'awaiting_signal' THEN i.await_deadline END,
      errors = (CASE WHEN jsonb_array_length(i.errors) >= $3 THEN i.errors - 0 ELSE i.errors END)
               || jsonb_build_array(jsonb_build_object(
                    'step', i.step, 'attempt', i.attempt, 'at', now(), 'kind', 'cancelled', 'error', ` + reason + `,
                    -- the claim it fenced out, if any (as a lease_expired entry names its lost claim)
                    'token', i.claim_token))`
}

// cancelSQL fails a live instance at once with a reason, as a Stop would:
// the inbox is consumed, a parent counts it as finished, and a worker still
// running a step of it is fenced out (its claim token is cleared). A row
// cancelled mid-step keeps its lease: its key's slot, and its place in its
// queue's GlobalConcurrency (migration 014), stay taken until the lease runs
// out, since the fenced step may still be running until its worker's next
// heartbeat (docs/design.md §6). So does a row retried since (retrySQL) whose
// lease is still live: cancelled again, it still stands for that step.
//
// The row is locked first (l): the lock returns the row as the transaction
// that held it left it, so the status reported is the one the cancel found
// (not the statement's snapshot's, taken before a wait for a finish), and
// the inbox counts include a signal that committed during that wait. Such a
// signal is not in the snapshot the sweep reads: resweep reports it, as the
// outcome statement does (heldSignals), and Cancel sweeps again.
var cancelSQL = `
WITH l AS MATERIALIZED (
  SELECT id, status, inbox FROM {{schema}}.gendurable_instances WHERE id = $1 FOR NO KEY UPDATE
), changed AS (
  UPDATE {{schema}}.gendurable_instances AS i
` + cancelSet(`$2::text`) + `
  FROM l WHERE i.id = l.id AND l.status NOT IN ('done', 'failed') -- locked by l, still live
  RETURNING i.id, i.status, i.parent_id, i.parent_fanout, l.inbox AS held_inbox
), swept AS (
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM changed AS c WHERE s.target_id = c.id AND s.consumed_at IS NULL
  RETURNING s.id
), ` + parentJoinCTE + `
SELECT (SELECT status::text FROM l), EXISTS (SELECT 1 FROM changed),
       coalesce((SELECT ` + heldSignals(`c.held_inbox`) + ` > (SELECT count(*) FROM swept) FROM changed AS c), false)`

// Cancel fails a live instance with reason; it returns the status the
// instance had when the cancel locked it (nil if none exists) and whether it
// was cancelled. One statement, and a second one (SweepInboxes) only when a
// signal committed while the statement waited for the row: the statement's
// sweep missed it. Best effort, as for the outcomes: the cancel is
// committed, and a Retry sweeps what is left (retrySQL).
func (q *Queries) Cancel(ctx context.Context, db DB, id int64, reason string) (status *string, cancelled bool, err error) {
	var resweep bool
	err = db.QueryRow(ctx, q.cancel, id, reason, MaxErrorHistory).Scan(&status, &cancelled, &resweep)
	if err != nil {
		return nil, false, err
	}
	if resweep {
		_ = q.SweepInboxes(ctx, db, []int64{id})
	}
	return status, cancelled, nil
}

// SlotKeyPrefix starts the unique key of every periodic slot's instance:
// the prefix, the schedule's name, ":", and the slot in UTC as RFC 3339
// (SlotKeyTimeLen bytes), so a schedule's keys sort by slot.
const (
	SlotKeyPrefix  = "gendurable:periodic:"
	SlotKeyTimeLen = len("2006-01-02T15:04:05Z")
	slotTimeLen    = "20" // SlotKeyTimeLen, for the SQL (TestSlotTimeLenIsSlotKeyTimeLen)
)

// slotKeySQL says key (an SQL expression) is a periodic slot's unique key.
func slotKeySQL(key string) string {
	return key + ` IS NOT NULL AND ` + key + ` >= '` + SlotKeyPrefix + `'::bytea AND ` + key + ` < '` + SlotKeyPrefix +
		`'::bytea || '\xff'::bytea AND length(` + key + `) > ` + slotTimeLen
}

// slotNowSQL is now() written as a slot key's time (RFC 3339 in UTC, as
// slotKey writes it): keys of one schedule compare with it as slots do.
const slotNowSQL = `convert_to(to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'UTF8')`

// laterDueSlotSQL says a row holds the key of a later slot of slot key
// key's schedule (key an SQL expression; slotKeySQL holds for it) whose
// time has come on the database clock: a range of the unique-key index from
// key to the schedule's key of now(), the rows of exactly the schedule's
// key length. A slot's row a process whose clock ran ahead inserted early
// does not count before its time: counted, it kept every process from
// inserting the slots before it (a review: one row a day ahead silenced its
// schedule for the day), and a prune kept it as the newest while deleting
// the slot it would stand for. The range also leaves out the keys of the
// schedules named "<name>:…", which sort after the digits of a time.
func laterDueSlotSQL(key string) string {
	prefix := `substring(` + key + ` FROM 1 FOR length(` + key + `) - ` + slotTimeLen + `)`
	return `EXISTS (
        SELECT 1 FROM {{schema}}.gendurable_instances AS l
        WHERE l.unique_key IS NOT NULL AND l.unique_key > ` + key + `
          AND l.unique_key <= ` + prefix + ` || ` + slotNowSQL + `
          AND length(l.unique_key) = length(` + key + `)
          AND substring(l.unique_key FROM 1 FOR length(l.unique_key) - ` + slotTimeLen + `) = ` + prefix + `)`
}

// newestSlotSQL says finished row i is the newest slot of its periodic
// schedule: no row holds a later slot's key of the same schedule whose time
// has come (laterDueSlotSQL). A prune keeps it, so that the schedule's
// service, started again, finds the slot it would run late inserted
// already, whatever ran the prune and with which retention: its catch-up
// runs the most recent slot that passed if that slot is younger than the
// engine's Retention (internal/maintenance), and a prune by an operator
// (Engine.Prune, the CLI) with a shorter one deleted that slot's row, so the
// slot ran again (a probe: a manual prune, then a restart). And so that a
// slot's own row, once pruned, leaves a later due slot's row behind, which
// keeps an insert of the slot that reaches the database late from running
// it again (insertSlotSQL). One row per schedule ever run, a removed
// schedule's too.
var newestSlotSQL = `(` + slotKeySQL("i.unique_key") + ` AND NOT ` + laterDueSlotSQL("i.unique_key") + `)`

// prunableSQL is what makes a finished instance i prunable besides its age:
// a finished child whose parent is still live, or failed (a retry runs the
// parent again at the step it failed in, which may read its children), is
// kept, whatever its age: the parent's next step reads it (Run.Children,
// with its result); it goes once the parent is done, or pruned itself (a
// later batch or sweep, the parent gone: a child that finished before its
// parent is behind the sweep's cursor, pruneLockSQL, and waits for the next
// sweep). A row cancelled mid-step whose lease is
// still live is kept until the lease ends (cancelSet): it stands for a step
// that may still run, its key's slot and its place in its queue's
// GlobalConcurrency. A finished parent with a live child (one cancelled
// alone: Cancel leaves its children running; or a child retried since) is
// kept until they have finished: Engine.CancelTree of it walks down to them
// through it. The newest slot of each periodic schedule is kept too
// (newestSlotSQL), whatever its age.
var prunableSQL = `
    NOT (i.lease_expires_at IS NOT NULL AND i.lease_expires_at > now())
    AND NOT ` + newestSlotSQL + `
    AND (i.parent_id IS NULL OR NOT EXISTS (
      SELECT 1 FROM {{schema}}.gendurable_instances AS p
      WHERE p.id = i.parent_id AND p.status <> 'done'))
    AND NOT (i.fanout > 0 AND EXISTS (
      SELECT 1 FROM {{schema}}.gendurable_instances AS c
      WHERE c.parent_id = i.id AND c.status NOT IN ('done', 'failed')))`

// pruneLockSQL locks up to $2 finished instances older than the retention
// that are prunable (prunableSQL), oldest first from $3 (a finished_at; NULL:
// the oldest), and returns their ids and finished_at: the first statement of
// a prune batch. A sweep's next batch starts at its last row's finished_at
// rather than at the index's head, which it would read again batch after
// batch: the rows kept or skipped as locked, and, while a snapshot held
// elsewhere keeps dead index entries from being marked, every row the
// sweep has deleted — quadratic in the rows a sweep deletes. Rows left
// behind (kept, or locked) are the next sweep's. It runs under pruneSettings: the
// planner may only walk the finished index in order and probe the parent's
// primary key and (for a row that fanned out) the parent index, so a batch
// costs O(batch) whatever the statistics say (docs/design.md §5), plus the
// old children of live parents, the finished children of the parents it
// probes, and the live leases and live children's parents it walks past.
//
// What it read of a row's children is on its snapshot, taken before it
// locked the row: a child retried meanwhile (its retry locks the parent
// first, retryLockSQL) may be live by the time the lock is granted. So the
// delete (pruneSQL) looks again, on a snapshot of its own taken after the
// locks: a retry that committed before it is seen, and one that had not
// yet taken the parent's lock waits for the prune's commit and then finds
// the parent gone (a retry of a child whose parent was pruned before it).
//
// Both read and delete the instances table ONLY: a table someone declared
// INHERITS gendurable_instances (an archive in another schema) is not
// gendurable's, and a scan or a DELETE of the parent takes its rows in (a
// probe: gendurable prune deleted an archive's rows finished 30 days ago).
var pruneLockSQL = `
SELECT i.id, i.finished_at FROM ONLY {{schema}}.gendurable_instances AS i
WHERE i.status IN ('done', 'failed') AND i.finished_at < now() - $1::bigint * interval '1 microsecond'
  AND i.finished_at >= coalesce($3::timestamptz, '-infinity')
  AND ` + prunableSQL + `
ORDER BY i.finished_at
LIMIT $2
FOR UPDATE OF i SKIP LOCKED`

// pruneSQL deletes those of the instances $1, locked by pruneLockSQL in the
// same transaction (so still finished), that are still prunable, with their
// signals: one primary-key probe per id behind an OFFSET 0 fence.
var pruneSQL = `
WITH doomed AS MATERIALIZED (
  SELECT i.id FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
    SELECT i.id, i.lease_expires_at, i.parent_id, i.fanout, i.unique_key FROM ONLY {{schema}}.gendurable_instances AS i
    WHERE i.id = u.id
    OFFSET 0 -- a fence: one primary-key probe per id
  ) AS i
  WHERE ` + prunableSQL + `
), signals AS (
  DELETE FROM ONLY {{schema}}.gendurable_signals AS s USING doomed AS d WHERE s.target_id = d.id
  RETURNING s.id
)
DELETE FROM ONLY {{schema}}.gendurable_instances AS i USING doomed AS d WHERE i.id = d.id`

// idleLimitSetting, in the first statement of a transaction of the
// library's own that is not a WithTx outcome's (prune, throughput, a
// migration), has the server end it should it wait on its client for a
// minute: a client cut off without its socket closing would otherwise
// leave the session holding its locks and its snapshot for the OS
// keepalive's hours (docs/design.md §2). Such a transaction sends its
// statements back to back; a minute is never a wait of its own. A
// stricter limit the session already has is kept.
var idleLimitSetting = idleLimitAtMost(ownTxIdle.Milliseconds())

// ownTxIdle is how long the server lets a transaction of the library's own
// that is not a WithTx outcome's wait on its client.
const ownTxIdle = time.Minute

// pruneSettings rule out, for the prune transaction only, the plans whose
// cost grows with the finished rows rather than the batch: a bitmap scan of
// every expired row followed by a sort, or a hash join that reads a whole
// table (a sequential or full index scan) to delete a batch. And no JIT:
// with those plans ruled out the planner's cost of a batch ran past
// jit_above_cost (a subplan under a NOT is priced for every row, the
// newest-slot check's among them), and PostgreSQL compiled each batch,
// on every connection until the generic plan took over, for far longer
// than the batch ran (TestAPruneBatchIsNotJITCompiled).
var pruneSettings = `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true),
       set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
       ` + idleLimitSetting

// Prune deletes one batch of finished instances older than retention,
// starting at from (nil: the oldest; else the next return of the sweep's
// last batch), and returns how many it deleted, and where the next batch of
// the sweep starts: nil unless the batch was full (it locked batch rows:
// more may be left, though some of them were kept on the second look,
// pruneSQL). It runs in a transaction of its own. With an error it returns
// 0: the batch rolled back, or its COMMIT failed — or, the connection lost
// on the way back, committed unseen, so callers' counts of what was
// deleted before an error are a lower bound.
func (q *Queries) Prune(ctx context.Context, db Beginner, retention time.Duration, batch int, from *time.Time) (deleted int64, next *time.Time, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pruneSettings); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, q.pruneLock, micros(retention), batch, from)
		if err != nil {
			return err
		}
		var ids []int64
		var id int64
		var last time.Time
		if _, err := pgx.ForEachRow(rows, []any{&id, &last}, func() error {
			ids = append(ids, id)
			return nil
		}); err != nil || len(ids) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, q.prune, ids)
		deleted = tag.RowsAffected()
		if len(ids) >= batch {
			next = &last
		}
		return err
	})
	if err != nil {
		return 0, nil, err // the batch did not commit (or its COMMIT failed): none of it counts
	}
	return deleted, next, nil
}

// pruneBucketsSQL deletes, of up to $4 rate buckets after key $5 in key
// order (NULL: from the first), those that have been full for $6
// microseconds: the bucket of a key whose policy — the longest of the
// prefixes $1 it starts with, as the pick takes it — has a rate ($2,
// starts per second) and held its burst ($3) again that long ago. The pick
// reads a missing bucket as a full one (Burst tokens), refilled as of its
// statement's start: a pick that began less than $6 before the delete and
// reads the bucket after it would have found it full all the same (the
// engine passes at least its lease, which bounds a pick's statement). A key the
// prefixes give no rate keeps its bucket. The rows are locked SKIP LOCKED
// first: a bucket a pick is writing is left to the next sweep, and the
// delete never waits for a pick, which holds its buckets' locks to its end
// in the order of its walk (it wraps around: ascending from its cursor,
// then from the first key) — waiting on one, the prune could close a
// deadlock with it. The condition reads only the deleted row's own
// columns, so a pick that committed after the statement's snapshot and
// before its lock is seen (the row is looked at again on its newest
// version). It returns how many it deleted, the last key it looked at and
// how many keys it looked at: one range of the primary key and a probe
// per key, O($4) whatever the table holds and whatever its statistics (as
// one join, the generic plan read the whole table).
var pruneBucketsSQL = `
WITH scan AS MATERIALIZED (
  SELECT b.key FROM {{schema}}.gendurable_key_buckets AS b
  WHERE b.key > coalesce($5::text, '')
  ORDER BY b.key
  LIMIT $4
), doomed AS (
  DELETE FROM {{schema}}.gendurable_key_buckets AS b
  WHERE b.key = ANY (ARRAY(
      SELECT l.key FROM {{schema}}.gendurable_key_buckets AS l
      WHERE l.key = ANY (ARRAY(SELECT s.key FROM scan AS s)) -- a primary-key probe per key
      FOR UPDATE SKIP LOCKED))
    AND (SELECT p.rate > 0
                AND b.tokens + extract(epoch FROM now() - $6::bigint * interval '1 microsecond' - b.refilled_at) * p.rate >= p.burst
         FROM unnest($1::text[], $2::double precision[], $3::int[]) AS p(prefix, rate, burst)
         WHERE starts_with(b.key, p.prefix) ORDER BY length(p.prefix) DESC LIMIT 1)
  RETURNING 1
)
SELECT (SELECT count(*) FROM doomed), (SELECT max(s.key) FROM scan AS s), (SELECT count(*) FROM scan)`

// PruneBuckets deletes one batch of the rate buckets that have been full
// for at least full under policies (pruneBucketsSQL), looking at up to
// batch keys after from (nil: from the first), and returns how many it
// deleted and where the next batch starts: nil once a batch looked at
// fewer than batch keys.
func (q *Queries) PruneBuckets(ctx context.Context, db DB, policies []KeyPolicy, full time.Duration, batch int, from *string) (deleted int64, next *string, err error) {
	pa := policyArraysOf(policies)
	var last *string
	var seen int64
	if err := db.QueryRow(ctx, q.pruneBuckets, pa.prefixes, pa.rates, pa.bursts, batch, from, micros(full)).Scan(&deleted, &last, &seen); err != nil {
		return 0, nil, err
	}
	if seen >= int64(batch) {
		next = last
	}
	return deleted, next, nil
}

// clearLeasesSQL clears the lease a finished row kept from a cancel
// mid-step (cancelSQL) once it ran out more than $2 microseconds ago. Such a
// lease holds nothing once past — no key slot, no place in a queue's
// GlobalConcurrency, nothing a retry keeps — but it stays in the key-holders
// index, whose range of a key's expired leases the pick reads for every key
// it visits (the expired leases a claim still holds) and WaitInfo reads for
// the key's holders: left, a key's cancelled steps of the whole retention
// were read by each pick of the key (5,000 of them: 5,000 index entries and
// heap rows a pick, 22 ms). One range of the lingering-leases index, up to
// $1 rows, each locked by primary key (SKIP LOCKED: a retry or prune at
// work on it keeps it) and looked at again there. It returns how many it
// cleared and how many the range held.
var clearLeasesSQL = `
WITH c AS MATERIALIZED (
  SELECT id FROM {{schema}}.gendurable_instances
  WHERE status <> 'executing' AND lease_expires_at < now() - $2::bigint * interval '1 microsecond'
    AND status IN ('done', 'failed')
  ORDER BY lease_expires_at
  LIMIT $1
), l AS MATERIALIZED (
  SELECT x.id FROM c
  CROSS JOIN LATERAL (SELECT i.id, i.status, i.lease_expires_at FROM {{schema}}.gendurable_instances AS i
                      WHERE i.id = c.id OFFSET 0 FOR NO KEY UPDATE SKIP LOCKED) AS x
  WHERE x.status IN ('done', 'failed') AND x.lease_expires_at < now() - $2::bigint * interval '1 microsecond'
), u AS (
  UPDATE {{schema}}.gendurable_instances AS i SET lease_expires_at = NULL
  FROM l WHERE i.id = l.id
  RETURNING 1
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM c)`

// ClearExpiredLeases clears, in one statement, up to batch leases that
// finished rows kept from a cancel mid-step and that ran out more than
// after ago (clearLeasesSQL); more says a batch may be left (it cleared as
// many as it was allowed to).
func (q *Queries) ClearExpiredLeases(ctx context.Context, db DB, batch int, after time.Duration) (cleared int64, more bool, err error) {
	var seen int64
	if err := db.QueryRow(ctx, q.clearLeases, batch, micros(after)).Scan(&cleared, &seen); err != nil {
		return 0, false, err
	}
	return cleared, cleared >= int64(batch), nil
}

// listSignalsSQL: $3 above 0 leaves out a payload longer than that many
// bytes as JSON text (NULL, and its length), so that a page of signals is
// bounded in bytes as well as in rows. The length is measured on the server
// (jsonb written out as text) for the rows the LIMIT keeps only: measured
// in the scan, it was for every signal of the instance before the sort.
//
// The instance's signal ids are read first, through the (target_id,
// dedup_key) index, and sorted (t, p): no index holds an instance's
// signals in id order, and under statistics that say the instance has
// many (a few instances that receive most signals), a plan walked the
// primary key backwards from the newest signal of any instance, filtering
// (a plan probe: every signal of the table for an instance with three).
// The page's rows are then fetched by primary key.
const listSignalsSQL = `
WITH t AS MATERIALIZED (SELECT id FROM {{schema}}.gendurable_signals WHERE target_id = $1),
p AS MATERIALIZED (SELECT id FROM t ORDER BY id DESC LIMIT $2)
SELECT s.id, s.name, CASE WHEN l.n > $3::int THEN NULL ELSE s.payload END,
       CASE WHEN l.n > $3::int THEN l.n ELSE 0 END, s.dedup_key, s.inserted_at, s.consumed_at
FROM p
CROSS JOIN LATERAL (SELECT g.id, g.name, g.payload, g.dedup_key, g.inserted_at, g.consumed_at
                    FROM {{schema}}.gendurable_signals AS g WHERE g.id = p.id OFFSET 0) AS s
CROSS JOIN LATERAL (SELECT CASE WHEN $3::int > 0 THEN coalesce(octet_length(s.payload::text), 0) ELSE 0 END AS n
                    OFFSET 0) AS l
ORDER BY s.id DESC`

// SignalListRow is one signal of an instance, consumed or not.
type SignalListRow struct {
	ID         int64
	Name       string
	Payload    []byte
	LeftOut    int32 // above 0: the payload's length, left out (Payload nil)
	DedupKey   *string
	InsertedAt time.Time
	ConsumedAt *time.Time
}

// ListSignals returns an instance's signals, newest first.
func (q *Queries) ListSignals(ctx context.Context, db DB, id int64, limit, valueBytes int) ([]SignalListRow, error) {
	rows, err := db.Query(ctx, q.listSignals, id, limit, valueBytes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SignalListRow, error) {
		var s SignalListRow
		err := row.Scan(&s.ID, &s.Name, &s.Payload, &s.LeftOut, &s.DedupKey, &s.InsertedAt, &s.ConsumedAt)
		return s, err
	})
}

// insertSpanSQL is the insert times of the instances with the lowest and
// the highest id (NULL: there is none): two primary-key probes.
const insertSpanSQL = `
SELECT (SELECT i.inserted_at FROM {{schema}}.gendurable_instances AS i ORDER BY i.id LIMIT 1),
       (SELECT i.inserted_at FROM {{schema}}.gendurable_instances AS i ORDER BY i.id DESC LIMIT 1)`

// InsertSpan returns the insert times of the instances with the lowest and
// the highest id (nil if there is no instance). Ids are drawn as rows are
// inserted and inserted_at is the inserting transaction's start, so no
// instance was inserted much before the first or after the last: at most
// as long as an inserting transaction ran.
func (q *Queries) InsertSpan(ctx context.Context, db DB) (first, last *time.Time, err error) {
	err = db.QueryRow(ctx, q.insertSpan).Scan(&first, &last)
	return first, last, err
}

// listAllChildrenSQL: $3 as in listSignalsSQL, for the children's results,
// measured for the rows the LIMIT keeps only (measured in the scan, every
// child of the parent was written out as text before the sort).
const listAllChildrenSQL = `
SELECT c.id, c.fsm, c.fsm_version, c.step, c.status::text, CASE WHEN l.n > $3::int THEN NULL ELSE c.result END,
       CASE WHEN l.n > $3::int THEN l.n ELSE 0 END, c.finished_at, c.inserted_at
FROM (SELECT id, fsm, fsm_version, step, status, result, finished_at, inserted_at
      FROM {{schema}}.gendurable_instances WHERE parent_id = $1
      ORDER BY id LIMIT $2) AS c
CROSS JOIN LATERAL (SELECT CASE WHEN $3::int > 0 THEN coalesce(octet_length(c.result::text), 0) ELSE 0 END AS n
                    OFFSET 0) AS l
ORDER BY c.id`

// ListAllChildren returns an instance's children of every fan-out; a
// result longer than valueBytes (above 0) is left out (ChildRow.LeftOut).
func (q *Queries) ListAllChildren(ctx context.Context, db DB, id int64, limit, valueBytes int) ([]ChildRow, error) {
	rows, err := db.Query(ctx, q.listAllChildren, id, limit, valueBytes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChildRow, error) {
		var c ChildRow
		err := row.Scan(&c.ID, &c.FSM, &c.Version, &c.Step, &c.Status, &c.Result, &c.LeftOut, &c.FinishedAt, &c.InsertedAt)
		return c, err
	})
}

const stepCountsSQL = `
SELECT step, status::text, count(*),
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() AND attempt > 0),
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at > now() AND attempt = 0)
FROM {{schema}}.gendurable_instances
WHERE fsm = $1 GROUP BY 1, 2 ORDER BY 1, 2`

// StepCountRow counts one machine's instances at a step in a status.
type StepCountRow struct {
	Step   string
	Status string
	Count  int64
	// Of runnable rows not eligible yet: after a failure (attempt > 0,
	// backing off), or delayed on purpose (attempt 0: a Next with After, a
	// RunIn, a snooze).
	BackingOff, Delayed int64
}

// StepCounts counts a machine's instances by step and status.
func (q *Queries) StepCounts(ctx context.Context, db DB, fsm string) ([]StepCountRow, error) {
	rows, err := db.Query(ctx, q.stepCounts, fsm)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepCountRow, error) {
		var r StepCountRow
		err := row.Scan(&r.Step, &r.Status, &r.Count, &r.BackingOff, &r.Delayed)
		return r, err
	})
}

// throughputSQL counts the instances that finished (done or failed) in the
// last $1 microseconds by queue, status and minute (0: the minute that ends
// now, on the database's clock). It walks gendurable_instances_finished
// (finished_at, partial on status IN ('done', 'failed'), the prune index)
// backwards from now and stops after $2 rows, so a busy hour costs at most
// $2 index entries and heap rows; when it stops early, the oldest minutes
// counted are incomplete (the caller sees the total reach $2). One row
// always comes back, with now() and NULLs when nothing finished. It runs
// under throughputSettings: statistics that say the hour holds a handful
// of rows must not buy a bitmap scan of every finish in it and a sort.
const throughputSQL = `
WITH f AS (
  SELECT queue, status, finished_at
  FROM {{schema}}.gendurable_instances
  WHERE status IN ('done', 'failed')
    AND finished_at > now() - $1::bigint * interval '1 microsecond'
  ORDER BY finished_at DESC
  LIMIT $2
)
SELECT now(), g.queue, g.status, g.ago, g.n
FROM (SELECT 1) AS one
LEFT JOIN (
  SELECT queue, status::text AS status,
         greatest(0, floor(extract(epoch FROM now() - finished_at) / 60))::int AS ago, count(*) AS n
  FROM f GROUP BY 1, 2, 3
) AS g ON true`

// throughputSettings leave the planner the ordered walk of the finished
// index only (as pruneSettings do for the pruner), for this transaction.
var throughputSettings = `SELECT set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true),
       ` + idleLimitSetting

// ThroughputRow is the count of one (queue, status, minute ago).
type ThroughputRow struct {
	Queue  string
	Status string // done or failed
	Ago    int    // whole minutes between the finish and now
	Count  int64
}

// Throughput counts the finishes of the last window by queue, status and
// minute, reading at most limit rows (newest first), in a transaction of
// its own. now is the database's clock.
func (q *Queries) Throughput(ctx context.Context, db Beginner, window time.Duration, limit int) (now time.Time, out []ThroughputRow, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, throughputSettings); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, q.throughput, micros(window), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var queue, status *string
			var ago *int32
			var n *int64
			if err := rows.Scan(&now, &queue, &status, &ago, &n); err != nil {
				return err
			}
			if queue != nil {
				out = append(out, ThroughputRow{Queue: *queue, Status: *status, Ago: int(*ago), Count: *n})
			}
		}
		return rows.Err()
	})
	return now, out, err
}
