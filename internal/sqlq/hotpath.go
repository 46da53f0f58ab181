package sqlq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Pick (SPEC §4.1): one statement claims up to $2 runnable rows of one queue.
//
// `queue = $1` (never ANY) lets the pick index hand rows over already in
// (priority, eligible_at) order so the LIMIT stops after the batch: the cost is
// O(batch), not O(backlog). FOR UPDATE SKIP LOCKED locks inside that one scan;
// the partition dedup is a window over the locked set (rows that lose stay
// runnable and unlock at commit); NOT EXISTS skips keys already executing, and
// a null key short-circuits it.

const pickSQL = `
WITH locked AS (
  SELECT c.id, c.partition_key, c.priority, c.eligible_at
  FROM {{schema}}.gendurable_instances AS c
  WHERE c.status = 'runnable' AND c.queue = $1 AND c.eligible_at <= now()
    AND (c.partition_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM {{schema}}.gendurable_instances AS x
          WHERE x.status = 'executing' AND x.partition_key = c.partition_key))
  ORDER BY c.priority, c.eligible_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER (
           PARTITION BY partition_key, CASE WHEN partition_key IS NULL THEN id END
           ORDER BY priority, eligible_at) AS rn
  FROM locked
)
UPDATE {{schema}}.gendurable_instances AS i
SET status = 'executing',
    lease_expires_at = now() + $3::bigint * interval '1 microsecond',
    claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
    updated_at = now()
FROM ranked AS r
WHERE i.id = r.id AND r.rn = 1
RETURNING i.id, i.claim_token, i.fsm, i.fsm_version, i.step, i.state, i.attempt,
          i.max_attempts, i.priority, i.partition_key, i.awaits, i.inserted_at`

// Claimed is one row the pick moved to executing.
type Claimed struct {
	ID           int64
	Token        int64
	FSM          string
	Version      int32
	Step         string
	State        []byte
	Attempt      int32
	MaxAttempts  int32
	Priority     int16
	PartitionKey *string
	Awaits       []string
	InsertedAt   time.Time
}

// Pick claims up to limit runnable rows of queue with a lease of the given length.
func (q *Queries) Pick(ctx context.Context, db DB, queue string, limit int, lease time.Duration) ([]Claimed, error) {
	rows, err := db.Query(ctx, q.pick, queue, limit, micros(lease))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		err := row.Scan(&c.ID, &c.Token, &c.FSM, &c.Version, &c.Step, &c.State, &c.Attempt,
			&c.MaxAttempts, &c.Priority, &c.PartitionKey, &c.Awaits, &c.InsertedAt)
		return c, err
	})
}

// ---------------------------------------------------------------------------
// Heartbeat (SPEC §4.5): one statement extends every lease a queue holds,
// fenced by the claim token. It returns the ids still held; a held row missing
// from the answer was reaped (or finished elsewhere) and its step is a zombie.

const heartbeatSQL = `
UPDATE {{schema}}.gendurable_instances AS i
SET lease_expires_at = now() + $3::bigint * interval '1 microsecond'
FROM unnest($1::bigint[], $2::bigint[]) AS h(id, token)
WHERE i.id = h.id AND i.claim_token = h.token AND i.status = 'executing'
RETURNING i.id`

// Heartbeat extends the leases of the (id, token) pairs and returns the ids it extended.
func (q *Queries) Heartbeat(ctx context.Context, db DB, ids, tokens []int64, lease time.Duration) ([]int64, error) {
	rows, err := db.Query(ctx, q.heartbeat, ids, tokens, micros(lease))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ---------------------------------------------------------------------------
// Reap (SPEC §2, §4.5): leases that expired (no outcome was written: a crash,
// a stall, a lost connection) go back to runnable with attempt + 1, or to
// failed once the attempts are spent. Driven by the lease partial index, so
// the cost is proportional to the expired rows only. Handle is not called.

const reapSQL = `
WITH expired AS (
  SELECT id FROM {{schema}}.gendurable_instances
  WHERE status = 'executing' AND lease_expires_at < now()
  ORDER BY lease_expires_at
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}.gendurable_instances AS i
SET status = CASE WHEN i.attempt + 1 >= i.max_attempts
                  THEN 'failed' ELSE 'runnable' END::{{schema}}.gendurable_status,
    attempt = i.attempt + 1,
    eligible_at = now(),
    lease_expires_at = NULL,
    claim_token = NULL,
    finished_at = CASE WHEN i.attempt + 1 >= i.max_attempts THEN now() END,
    updated_at = now(),
    errors = (CASE WHEN jsonb_array_length(i.errors) >= $2 THEN i.errors - 0 ELSE i.errors END)
             || jsonb_build_array(jsonb_build_object(
                  'step', i.step, 'attempt', i.attempt, 'at', now(), 'kind', 'lease_expired',
                  'error', CASE WHEN i.attempt + 1 >= i.max_attempts
                                THEN 'lease expired with no outcome (worker crashed or stalled); attempts exhausted'
                                ELSE 'lease expired with no outcome (worker crashed or stalled)' END))
FROM expired AS e
WHERE i.id = e.id
RETURNING i.id, i.fsm, i.queue, i.step, i.attempt, i.status::text`

// Reaped is one row the reaper recovered.
type Reaped struct {
	ID      int64
	FSM     string
	Queue   string
	Step    string
	Attempt int32
	Status  string // "runnable" or "failed"
}

// Reap recovers up to limit expired leases.
func (q *Queries) Reap(ctx context.Context, db DB, limit int) ([]Reaped, error) {
	rows, err := db.Query(ctx, q.reap, limit, MaxErrorHistory)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Reaped, error) {
		var r Reaped
		err := row.Scan(&r.ID, &r.FSM, &r.Queue, &r.Step, &r.Attempt, &r.Status)
		return r, err
	})
}

// ---------------------------------------------------------------------------
// Outcomes (SPEC §2, §4.4): one statement applies a batch of outcomes, each
// fenced by its claim token. A single outcome is a batch of one; concurrent
// steps' outcomes can share the statement (group commit) without a new shape.

// Outcome kinds as stored in the batch's kind column.
const (
	KindNext   int16 = 1
	KindReplay int16 = 2
	KindDone   int16 = 3
	KindStop   int16 = 4
)

// MaxErrorHistory bounds the error entries kept on a row; older ones fall off.
const MaxErrorHistory = 20

const applyOutcomesSQL = `
UPDATE {{schema}}.gendurable_instances AS i
SET status = CASE o.kind WHEN 1 THEN 'runnable' WHEN 2 THEN 'runnable' WHEN 3 THEN 'done'
                         ELSE 'failed' END::{{schema}}.gendurable_status,
    step = coalesce(o.step, i.step),
    state = coalesce(o.state::jsonb, i.state),
    attempt = CASE o.kind WHEN 1 THEN 0 WHEN 2 THEN i.attempt + o.attempt_inc ELSE i.attempt END,
    eligible_at = CASE WHEN o.kind IN (1, 2)
                       THEN now() + o.delay_us * interval '1 microsecond' ELSE i.eligible_at END,
    result = CASE WHEN o.kind = 3 THEN o.result::jsonb ELSE i.result END,
    awaits = CASE WHEN o.kind = 2 THEN i.awaits END,
    lease_expires_at = NULL,
    claim_token = NULL,
    finished_at = CASE WHEN o.kind IN (3, 4) THEN now() END,
    updated_at = now(),
    errors = CASE WHEN o.err IS NULL THEN i.errors
             ELSE (CASE WHEN jsonb_array_length(i.errors) >= $11 THEN i.errors - 0 ELSE i.errors END)
                  || jsonb_build_array(jsonb_build_object(
                       'step', i.step, 'attempt', i.attempt, 'at', now(),
                       'kind', o.err_kind, 'error', o.err)) END
FROM unnest($1::bigint[], $2::bigint[], $3::smallint[], $4::text[], $5::text[], $6::bigint[],
            $7::int[], $8::text[], $9::text[], $10::text[])
     AS o(id, token, kind, step, state, delay_us, attempt_inc, result, err_kind, err)
WHERE i.id = o.id AND i.claim_token = o.token AND i.status = 'executing'
RETURNING i.id`

// Outcome is one encoded outcome, ready for the batch statement.
type Outcome struct {
	ID         int64
	Token      int64
	Kind       int16
	Step       *string // nil keeps the current step
	State      *string // JSON; nil keeps the current state
	Delay      time.Duration
	AttemptInc int32   // replay only: 1, or 0 for a snooze
	Result     *string // JSON; done only
	ErrKind    *string // with Err: recorded in the error history
	Err        *string
}

// OutcomeBatch is a reusable set of column arrays for ApplyOutcomes.
type OutcomeBatch struct {
	ids, tokens           []int64
	kinds                 []int16
	steps, states         []*string
	delays                []int64
	attemptInc            []int32
	results, errKind, err []*string
}

// Reset empties the batch, keeping its capacity.
func (b *OutcomeBatch) Reset() {
	b.ids, b.tokens, b.kinds = b.ids[:0], b.tokens[:0], b.kinds[:0]
	b.steps, b.states, b.delays = b.steps[:0], b.states[:0], b.delays[:0]
	b.attemptInc, b.results, b.errKind, b.err = b.attemptInc[:0], b.results[:0], b.errKind[:0], b.err[:0]
}

// Len is the number of outcomes in the batch.
func (b *OutcomeBatch) Len() int { return len(b.ids) }

// Add appends one outcome.
func (b *OutcomeBatch) Add(o Outcome) {
	b.ids = append(b.ids, o.ID)
	b.tokens = append(b.tokens, o.Token)
	b.kinds = append(b.kinds, o.Kind)
	b.steps = append(b.steps, o.Step)
	b.states = append(b.states, o.State)
	b.delays = append(b.delays, micros(o.Delay))
	b.attemptInc = append(b.attemptInc, o.AttemptInc)
	b.results = append(b.results, o.Result)
	b.errKind = append(b.errKind, o.ErrKind)
	b.err = append(b.err, o.Err)
}

// ApplyOutcomes applies the batch in one statement and returns the ids whose
// fence held. An id missing from the answer was not written: its claim token
// no longer matched (the lease was reaped and the row claimed again, or an
// operator moved it), so that step's outcome is dropped.
func (q *Queries) ApplyOutcomes(ctx context.Context, db DB, b *OutcomeBatch) ([]int64, error) {
	rows, err := db.Query(ctx, q.applyOutcomes, b.ids, b.tokens, b.kinds, b.steps, b.states,
		b.delays, b.attemptInc, b.results, b.errKind, b.err, MaxErrorHistory)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ---------------------------------------------------------------------------
// Release: claimed rows go straight back to runnable without counting an
// attempt — prefetched rows at shutdown, rows of a version this process does
// not know (with a delay), rows whose partition key is contended.

const releaseSQL = `
UPDATE {{schema}}.gendurable_instances AS i
SET status = 'runnable',
    eligible_at = now() + $3::bigint * interval '1 microsecond',
    lease_expires_at = NULL,
    claim_token = NULL,
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS r(id, token)
WHERE i.id = r.id AND i.claim_token = r.token AND i.status = 'executing'
RETURNING i.id`

// Release returns claimed rows to runnable, eligible after delay.
func (q *Queries) Release(ctx context.Context, db DB, ids, tokens []int64, delay time.Duration) ([]int64, error) {
	rows, err := db.Query(ctx, q.release, ids, tokens, micros(delay))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ---------------------------------------------------------------------------
// Insert (SPEC §6): many rows in one statement from column arrays. A missing
// run-at falls back to now() + run-in on the database clock.

const insertManySQL = `
INSERT INTO {{schema}}.gendurable_instances
  (fsm, fsm_version, queue, step, state, priority, max_attempts, eligible_at, partition_key)
SELECT n.fsm, n.fsm_version, n.queue, n.step, n.state::jsonb, n.priority, n.max_attempts,
       coalesce(n.run_at, now() + n.run_in_us * interval '1 microsecond'), n.partition_key
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::smallint[],
            $7::int[], $8::timestamptz[], $9::bigint[], $10::text[])
     AS n(fsm, fsm_version, queue, step, state, priority, max_attempts, run_at, run_in_us, partition_key)
RETURNING id`

// NewInstance is one row to insert.
type NewInstance struct {
	FSM          string
	Version      int32
	Queue        string
	Step         string
	State        string // JSON
	Priority     int16
	MaxAttempts  int32
	RunAt        *time.Time
	RunIn        time.Duration
	PartitionKey *string
}

// InsertMany inserts the rows in one statement and returns their ids in order.
func (q *Queries) InsertMany(ctx context.Context, db DB, in []NewInstance) ([]int64, error) {
	n := len(in)
	var (
		fsm, queue, step, state = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		version, maxAttempts    = make([]int32, n), make([]int32, n)
		priority                = make([]int16, n)
		runAt                   = make([]*time.Time, n)
		runIn                   = make([]int64, n)
		partition               = make([]*string, n)
	)
	for i, r := range in {
		fsm[i], version[i], queue[i], step[i], state[i] = r.FSM, r.Version, r.Queue, r.Step, r.State
		priority[i], maxAttempts[i], runAt[i], runIn[i], partition[i] = r.Priority, r.MaxAttempts, r.RunAt, micros(r.RunIn), r.PartitionKey
	}
	rows, err := db.Query(ctx, q.insertMany, fsm, version, queue, step, state, priority, maxAttempts, runAt, runIn, partition)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ---------------------------------------------------------------------------
// Read one instance by primary key (admin and tests; not on the hot path).

const getInstanceSQL = `
SELECT id, fsm, fsm_version, queue, step, state, result, status::text, priority, attempt,
       max_attempts, eligible_at, lease_expires_at, partition_key, errors, parent_id,
       inserted_at, updated_at, finished_at
FROM {{schema}}.gendurable_instances WHERE id = $1`

// InstanceRow is one instance as stored.
type InstanceRow struct {
	ID             int64
	FSM            string
	Version        int32
	Queue          string
	Step           string
	State          []byte
	Result         []byte
	Status         string
	Priority       int16
	Attempt        int32
	MaxAttempts    int32
	EligibleAt     time.Time
	LeaseExpiresAt *time.Time
	PartitionKey   *string
	Errors         []byte
	ParentID       *int64
	InsertedAt     time.Time
	UpdatedAt      time.Time
	FinishedAt     *time.Time
}

// GetInstance reads one instance; pgx.ErrNoRows when there is none.
func (q *Queries) GetInstance(ctx context.Context, db DB, id int64) (InstanceRow, error) {
	var r InstanceRow
	err := db.QueryRow(ctx, q.getInstance, id).Scan(&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step,
		&r.State, &r.Result, &r.Status, &r.Priority, &r.Attempt, &r.MaxAttempts, &r.EligibleAt,
		&r.LeaseExpiresAt, &r.PartitionKey, &r.Errors, &r.ParentID, &r.InsertedAt, &r.UpdatedAt, &r.FinishedAt)
	return r, err
}
