package sqlq

import (
	"context"
	"math"
	"strings"
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
	Before   *int64 // keyset paging: ids below this
	Limit    int    // rows returned
	// Scan bounds the rows a page looks at: the newest Scan instances below
	// Before (of those matching Search, if set) are filtered, no more.
	Scan int
}

// A list looks at a window: the newest $8 candidates below the cursor $7,
// taken from the primary key backwards (listScanSQL) or from the union of
// the id, partition-key and unique-key lookups (listSearchSQL), so no page
// reads more than $8 rows whatever the filters. The filters ($1-$6) apply
// to the window and the page is at most $9 rows: the scan stops as soon as
// the page is full, so a plain first page reads about $9 rows. Only a page
// that did not fill up needs to know where its window ended
// (listScanWindowSQL, listSearchWindowSQL: the ids alone).
const listColsSQL = `
SELECT w.id, w.fsm, w.fsm_version, w.queue, w.step, w.status::text, w.attempt, w.max_attempts, w.priority,
       w.partition_key, w.parent_id, w.eligible_at, w.inserted_at, w.updated_at, w.finished_at,
       (SELECT e ->> 'error' FROM jsonb_array_elements(w.errors) AS e ORDER BY (e ->> 'at') DESC LIMIT 1)
FROM (`

const listFilterSQL = `) AS w
WHERE ($1::text IS NULL OR w.queue = $1)
  AND ($2::text IS NULL OR w.status = $2::{{schema}}.gendurable_status)
  AND ($3::text IS NULL OR w.fsm = $3)
  AND ($4::text IS NULL OR w.step = $4)
  AND ($5::timestamptz IS NULL OR w.inserted_at >= $5)
  AND ($6::timestamptz IS NULL OR w.inserted_at < $6)
ORDER BY w.id DESC
LIMIT $9`

const listScanSQL = listColsSQL + `
  SELECT * FROM {{schema}}.gendurable_instances
  WHERE id < $7
  ORDER BY id DESC
  LIMIT $8
` + listFilterSQL

// searchIDsSQL is the search window's ids: $1 cursor, $2 window, $3 id, $4 key.
const searchIDsSQL = `
  SELECT id FROM (
    (SELECT id FROM {{schema}}.gendurable_instances WHERE id = $3 AND id < $1)
    UNION
    (SELECT id FROM {{schema}}.gendurable_instances
     WHERE partition_key = $4 AND id < $1 ORDER BY id DESC LIMIT $2)
    UNION
    (SELECT id FROM {{schema}}.gendurable_instances
     WHERE unique_key = convert_to($4, 'UTF8') AND id < $1 ORDER BY id DESC LIMIT $2)
  ) AS u
  ORDER BY id DESC
  LIMIT $2`

var listSearchSQL = listColsSQL + `
  SELECT i.* FROM (` + renumber(searchIDsSQL, "$1", "$7", "$2", "$8", "$3", "$10", "$4", "$11") + `) AS s
  JOIN {{schema}}.gendurable_instances AS i ON i.id = s.id
` + listFilterSQL

const listScanWindowSQL = `
SELECT count(*), coalesce(min(id), 0) FROM (
  SELECT id FROM {{schema}}.gendurable_instances WHERE id < $1 ORDER BY id DESC LIMIT $2
) AS w`

const listSearchWindowSQL = `
SELECT count(*), coalesce(min(id), 0) FROM (` + searchIDsSQL + `) AS w`

// renumber rewrites placeholders of a fragment (pairs old, new), so one
// fragment serves two statements whose parameters are numbered apart. (The
// fragment uses $1-$4 only, so no old placeholder is a prefix of another.)
func renumber(sql string, pairs ...string) string {
	return strings.NewReplacer(pairs...).Replace(sql)
}

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

func (f ListFilter) before() int64 {
	if f.Before != nil {
		return *f.Before
	}
	return math.MaxInt64
}

// ListSQL is the statement and arguments of a list page: the search window
// when f.Search is set, the primary-key window otherwise.
func (q *Queries) ListSQL(f ListFilter) (string, []any) {
	args := []any{f.Queue, f.Status, f.FSM, f.Step, f.From, f.To, f.before(), f.Scan, f.Limit}
	if f.Search == nil {
		return q.listScan, args
	}
	return q.listSearch, append(args, f.SearchID, *f.Search)
}

// ListInstances returns instances matching f, newest first.
func (q *Queries) ListInstances(ctx context.Context, db DB, f ListFilter) ([]ListRow, error) {
	sql, args := q.ListSQL(f)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ListRow, error) {
		var r ListRow
		err := row.Scan(&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step, &r.Status, &r.Attempt, &r.MaxAttempts,
			&r.Priority, &r.PartitionKey, &r.ParentID, &r.EligibleAt, &r.InsertedAt, &r.UpdatedAt, &r.FinishedAt, &r.LastError)
		return r, err
	})
}

// ListWindow is the window a list page looks at: Scanned rows (at most
// ListFilter.Scan) and the lowest id among them (0 if none).
type ListWindow struct {
	Scanned int
	Low     int64
}

// ListWindowSQL is the statement and arguments of ListWindow.
func (q *Queries) ListWindowSQL(f ListFilter) (string, []any) {
	if f.Search == nil {
		return q.listScanWindow, []any{f.before(), f.Scan}
	}
	return q.listSearchWindow, []any{f.before(), f.Scan, f.SearchID, *f.Search}
}

// ListWindow measures the window of f's page, for a page that did not fill
// up: where to continue below it.
func (q *Queries) ListWindow(ctx context.Context, db DB, f ListFilter) (ListWindow, error) {
	sql, args := q.ListWindowSQL(f)
	var w ListWindow
	err := db.QueryRow(ctx, sql, args...).Scan(&w.Scanned, &w.Low)
	return w, err
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

const setPausedSQL = `
INSERT INTO {{schema}}.gendurable_queues (name, paused) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()`

// SetPaused pauses or resumes a queue for every process.
func (q *Queries) SetPaused(ctx context.Context, db DB, queue string, paused bool) error {
	_, err := db.Exec(ctx, q.setPaused, queue, paused)
	return err
}

// cancelSQL fails a live instance at once with a reason, as a Stop would:
// the inbox is consumed, a parent counts it as finished, and a worker still
// running a step of it is fenced out (its claim token is cleared).
const cancelSQL = `
WITH changed AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET status = 'failed', finished_at = now(), updated_at = now(),
      lease_expires_at = NULL, claim_token = NULL, awaits = NULL, await_deadline = NULL, inbox = '{}',
      errors = (CASE WHEN jsonb_array_length(i.errors) >= $3 THEN i.errors - 0 ELSE i.errors END)
               || jsonb_build_array(jsonb_build_object(
                    'step', i.step, 'attempt', i.attempt, 'at', now(), 'kind', 'cancelled', 'error', $2::text))
  WHERE i.id = $1 AND i.status NOT IN ('done', 'failed')
  RETURNING i.id, i.status, i.parent_id, i.parent_fanout
), swept AS (
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM changed AS c WHERE s.target_id = c.id AND s.consumed_at IS NULL
  RETURNING s.id
), ` + parentJoinCTE + `
SELECT (SELECT status::text FROM {{schema}}.gendurable_instances WHERE id = $1),
       EXISTS (SELECT 1 FROM changed)`

// Cancel fails a live instance with reason; it returns the status the
// instance had (nil if none exists) and whether it was cancelled.
func (q *Queries) Cancel(ctx context.Context, db DB, id int64, reason string) (status *string, cancelled bool, err error) {
	err = db.QueryRow(ctx, q.cancel, id, reason, MaxErrorHistory).Scan(&status, &cancelled)
	return status, cancelled, err
}

// pruneSQL deletes up to $2 finished instances older than the retention,
// and their signals, oldest first.
const pruneSQL = `
WITH doomed AS MATERIALIZED (
  SELECT id FROM {{schema}}.gendurable_instances
  WHERE status IN ('done', 'failed') AND finished_at < now() - $1::bigint * interval '1 microsecond'
  ORDER BY finished_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), signals AS (
  DELETE FROM {{schema}}.gendurable_signals AS s USING doomed AS d WHERE s.target_id = d.id
  RETURNING s.id
)
DELETE FROM {{schema}}.gendurable_instances AS i USING doomed AS d WHERE i.id = d.id`

// Prune deletes one batch of finished instances older than retention and
// returns how many it deleted.
func (q *Queries) Prune(ctx context.Context, db DB, retention time.Duration, batch int) (int64, error) {
	tag, err := db.Exec(ctx, q.prune, micros(retention), batch)
	return tag.RowsAffected(), err
}

const listSignalsSQL = `
SELECT id, name, payload, dedup_key, inserted_at, consumed_at
FROM {{schema}}.gendurable_signals WHERE target_id = $1
ORDER BY id DESC LIMIT $2`

// SignalListRow is one signal of an instance, consumed or not.
type SignalListRow struct {
	ID         int64
	Name       string
	Payload    []byte
	DedupKey   *string
	InsertedAt time.Time
	ConsumedAt *time.Time
}

// ListSignals returns an instance's signals, newest first.
func (q *Queries) ListSignals(ctx context.Context, db DB, id int64, limit int) ([]SignalListRow, error) {
	rows, err := db.Query(ctx, q.listSignals, id, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SignalListRow, error) {
		var s SignalListRow
		err := row.Scan(&s.ID, &s.Name, &s.Payload, &s.DedupKey, &s.InsertedAt, &s.ConsumedAt)
		return s, err
	})
}

const listAllChildrenSQL = `
SELECT id, fsm, fsm_version, step, status::text, result, finished_at
FROM {{schema}}.gendurable_instances WHERE parent_id = $1
ORDER BY id LIMIT $2`

// ListAllChildren returns an instance's children of every fan-out.
func (q *Queries) ListAllChildren(ctx context.Context, db DB, id int64, limit int) ([]ChildRow, error) {
	rows, err := db.Query(ctx, q.listAllChildren, id, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChildRow, error) {
		var c ChildRow
		err := row.Scan(&c.ID, &c.FSM, &c.Version, &c.Step, &c.Status, &c.Result, &c.FinishedAt)
		return c, err
	})
}

const stepCountsSQL = `
SELECT step, status::text, count(*) FROM {{schema}}.gendurable_instances
WHERE fsm = $1 GROUP BY 1, 2 ORDER BY 1, 2`

// StepCountRow counts one machine's instances at a step in a status.
type StepCountRow struct {
	Step   string
	Status string
	Count  int64
}

// StepCounts counts a machine's instances by step and status.
func (q *Queries) StepCounts(ctx context.Context, db DB, fsm string) ([]StepCountRow, error) {
	rows, err := db.Query(ctx, q.stepCounts, fsm)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepCountRow, error) {
		var r StepCountRow
		err := row.Scan(&r.Step, &r.Status, &r.Count)
		return r, err
	})
}
