package sqlq

import (
	"context"
	"errors"
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
	Search                   *string    // exact id, partition key or unique key
	Before                   *int64     // keyset paging: ids below this
	Limit                    int
}

const listInstancesSQL = `
SELECT id, fsm, fsm_version, queue, step, status::text, attempt, max_attempts, priority,
       partition_key, parent_id, eligible_at, inserted_at, updated_at, finished_at,
       (SELECT e ->> 'error' FROM jsonb_array_elements(errors) AS e ORDER BY (e ->> 'at') DESC LIMIT 1)
FROM {{schema}}.gendurable_instances
WHERE ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR status = $2::{{schema}}.gendurable_status)
  AND ($3::text IS NULL OR fsm = $3)
  AND ($4::text IS NULL OR step = $4)
  AND ($5::timestamptz IS NULL OR inserted_at >= $5)
  AND ($6::timestamptz IS NULL OR inserted_at < $6)
  AND ($7::text IS NULL OR id::text = $7 OR partition_key = $7 OR unique_key = convert_to($7, 'UTF8'))
  AND ($8::bigint IS NULL OR id < $8)
ORDER BY id DESC
LIMIT $9`

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

// ListInstances returns instances matching f, newest first.
func (q *Queries) ListInstances(ctx context.Context, db DB, f ListFilter) ([]ListRow, error) {
	rows, err := db.Query(ctx, q.listInstances, f.Queue, f.Status, f.FSM, f.Step, f.From, f.To, f.Search, f.Before, f.Limit)
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
// known queue (a row, or any instance in it; the runnable check first, as it
// has an index) unless $3 says to create it. No row comes back for an
// unknown queue. An unknown queue costs one scan of the instances table.
const setPausedSQL = `
WITH known AS (
  SELECT $3::bool
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues WHERE name = $1)
      OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances WHERE queue = $1 AND status = 'runnable')
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
