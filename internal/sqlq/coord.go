package sqlq

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ---------------------------------------------------------------------------
// Signal (docs/design.md §2): insert the signal, then wake the instance if it awaits
// the name — one statement that first locks the instance row. The await
// outcome locks the same row, so the two serialize: whichever commits second
// sees the other's write on the row itself (the inbox counts), never a stale
// snapshot. A finished or unknown target gets no signal row.

const signalSQL = `
WITH target AS MATERIALIZED (
  SELECT id, status, awaits FROM {{schema}}.gendurable_instances WHERE id = $1 FOR UPDATE
), ins AS (
  INSERT INTO {{schema}}.gendurable_signals (target_id, name, payload, dedup_key)
  SELECT t.id, $2, $3::jsonb, $4 FROM target AS t WHERE t.status NOT IN ('done', 'failed')
  ON CONFLICT (target_id, dedup_key) DO NOTHING
  RETURNING id
), woke AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET inbox = jsonb_set(i.inbox, ARRAY[$2::text], to_jsonb(coalesce((i.inbox ->> $2::text)::int, 0) + 1)),
      status = CASE WHEN i.status = 'awaiting_signal' AND $2::text = ANY (i.awaits)
                    THEN 'runnable' ELSE i.status END,
      eligible_at = CASE WHEN i.status = 'awaiting_signal' AND $2::text = ANY (i.awaits)
                         THEN now() ELSE i.eligible_at END,
      await_deadline = CASE WHEN i.status = 'awaiting_signal' AND $2::text = ANY (i.awaits)
                            THEN NULL ELSE i.await_deadline END,
      updated_at = now()
  FROM ins, target AS t
  WHERE i.id = $1 AND t.id = i.id
  -- Woken: what the row was (as locked), not what it is now — a row
  -- inserted in this transaction is runnable and eligible at now() too.
  RETURNING t.status = 'awaiting_signal' AND $2::text = ANY (t.awaits) AS woke, i.queue
)
SELECT (SELECT status::text FROM target),
       (SELECT id FROM ins),
       (SELECT id FROM {{schema}}.gendurable_signals WHERE target_id = $1 AND dedup_key = $4),
       coalesce((SELECT woke FROM woke), false),
       (SELECT queue FROM woke)`

// SignalResult is what the signal statement did.
type SignalResult struct {
	Status *string // the target's status; nil: no such instance
	ID     *int64  // the new signal's id; nil: not inserted
	DupID  *int64  // the id already holding the dedup key, if any
	Woke   bool    // the instance went from awaiting_signal to runnable
	Queue  *string // the woken instance's queue
}

// signalDupSQL finds the signal holding a dedup key, in a snapshot of its
// own (see Signal).
const signalDupSQL = `SELECT id FROM {{schema}}.gendurable_signals WHERE target_id = $1 AND dedup_key = $2`

// Signal inserts a signal for target and wakes it if it awaits name.
//
// A signal with the same dedup key committed by another sender while this
// statement waited for the instance's row lock is invisible to the
// statement's snapshot (READ COMMITTED): its insert skips the key, but it
// cannot read the holder's id. A second statement, with a newer snapshot,
// reads it.
func (q *Queries) Signal(ctx context.Context, db DB, target int64, name string, payload *string, dedupKey *string) (SignalResult, error) {
	var r SignalResult
	err := db.QueryRow(ctx, q.signal, target, name, payload, dedupKey).Scan(&r.Status, &r.ID, &r.DupID, &r.Woke, &r.Queue)
	if err == nil && r.Status != nil && r.ID == nil && r.DupID == nil && dedupKey != nil {
		err = db.QueryRow(ctx, q.signalDup, target, *dedupKey).Scan(&r.DupID)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	return r, err
}

// ---------------------------------------------------------------------------
// ---------------------------------------------------------------------------
// What a step reads besides its row — its unconsumed signals and its
// children — comes with the statement that claims it (pick, or a chaining
// outcome): see inboxRowsSQL and the pick function's child_rows.

// SignalRow is one unconsumed signal.
type SignalRow struct {
	ID         int64
	Name       string
	Payload    []byte
	InsertedAt time.Time
}

// ChildRow is one child of an instance.
type ChildRow struct {
	ID         int64
	FSM        string
	Version    int32
	Step       string
	Status     string
	Result     []byte
	LeftOut    int32 // ListAllChildren only; above 0: the result's length, left out (Result nil)
	FinishedAt *time.Time
	InsertedAt time.Time // ListAllChildren only
}

// ---------------------------------------------------------------------------
// Await timeouts: parked instances whose deadline passed become runnable at
// the step they parked for, awaiting nothing (the step then sees an empty
// Awaited view: it timed out; its inbox still holds everything unconsumed). Driven by the await-deadline partial
// index; the answer includes how long until the next deadline, on the
// database clock, so the caller can sleep until it instead of polling —
// looking no further than the horizon the caller passes (it sleeps no
// longer anyway): under a snapshot held elsewhere the index keeps the entry
// of every await that ended since, deadline and all.
//
// For the same reason the due part starts at a floor, as the reap does
// (docs/design.md §4, "The reaper's floor"): from the index's head it read
// the entry of every await signalled since such a snapshot began whose
// deadline has passed — a million of them took 260–395 ms, and a sweeper
// woken at each of a flow of deadlines ran back to back. The floor it
// returns is the earliest of now() − slack and the earliest due deadline of
// a row still awaiting that it did not wake (locked by another transaction,
// or past the LIMIT), read without locks on its snapshot. What it cannot see
// is a deadline that a transaction wrote and committed more than slack after
// it passed: the engine's slack is its lease plus WakeFloorSlack, longer
// than a group-committed outcome statement may run (the committer gives up
// on one after a lease) — a deadline is its statement's now() plus the
// timeout, and a statement waiting on a row another transaction holds
// locked (a caller's SignalTx) commits late. A WithTx outcome's
// transaction that ran longer than its await's timeout plus the slack can
// still; the full sweeps find those.

// WakeFloorSlack is the least slack of a wake's returned floor before its
// statement's now().
const WakeFloorSlack = ReapFloorSlack

var wakeTimedOutSQL = `
WITH due AS MATERIALIZED (
  SELECT id FROM {{schema}}.gendurable_instances
  WHERE status = 'awaiting_signal' AND await_deadline <= now()
    AND await_deadline >= coalesce($3::timestamptz, '-infinity')
  ORDER BY await_deadline
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), woke AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET status = 'runnable', eligible_at = now(), await_deadline = NULL, updated_at = now(),
      awaits = '{}' -- awaiting nothing now: the woken step sees an empty Awaited
  FROM due WHERE i.id = due.id
  RETURNING i.queue
)
SELECT coalesce(array_agg(DISTINCT queue), '{}') AS queues, count(*)::int AS n,
       ` + nextWithin("awaiting_signal", "await_deadline", "$2") + ` AS next,
       ` + sweepFloor("awaiting_signal", "await_deadline", "<=", "$3", "$4", "due") + ` AS floor
FROM woke`

// WakeResult is what one await-timeout sweep statement did and saw.
type WakeResult struct {
	Queues []string // the queues that received work
	N      int      // awaits woken
	// Next is how long until the next pending deadline on the database
	// clock (nil: none within the horizon past the statement's now();
	// horizon 0: no bound). A duration, not an instant: a process whose
	// clock is off the database's still sleeps the right time.
	Next *time.Duration
	// Floor is where the next sweep's due part may start (see above).
	Floor time.Time
}

// WakeTimedOut wakes up to limit timed-out awaits at or above floor (nil:
// from the index's head, a full sweep); the floor it returns lies at least
// slack (at least WakeFloorSlack) before its now().
func (q *Queries) WakeTimedOut(ctx context.Context, db DB, limit int, floor *time.Time, slack, horizon time.Duration) (WakeResult, error) {
	var res WakeResult
	var secs *float64
	err := db.QueryRow(ctx, q.wakeTimedOut, limit, micros(horizon), floor, micros(max(slack, WakeFloorSlack))).Scan(&res.Queues, &res.N, &secs, &res.Floor)
	if secs != nil {
		d := time.Duration(*secs * float64(time.Second))
		res.Next = &d
	}
	return res, err
}

// ---------------------------------------------------------------------------
// Claims too large to make: the pick hands a claimed row's unconsumed
// signals and its latest fan-out's children (with their results) to its step
// as one jsonb value each (docs/design.md §4), and PostgreSQL refuses to
// build one over 256 MB (SQLSTATE 54000): a pick that reaches such a row
// fails whole, every time. After a pick failed so, the engine looks for such
// rows at the head of the queue — the first rows in pick order, read
// through the pick index — and fails them (a cancel with the reason).

// MaxClaimBytes is how large a row's inbox or children, counted as their
// JSON text plus a margin per entry for what the pick adds beside it, may be
// before OversizedClaims reports the row: PostgreSQL's limit on one jsonb
// value (268,435,455 bytes), less 16 MiB.
const MaxClaimBytes = 268435455 - 16<<20

const oversizedClaimsSQL = `
SELECT c.id, c.kid_bytes, c.inbox_bytes FROM (
  SELECT i.id,
    CASE WHEN i.children_total > 0 THEN
      (SELECT coalesce(sum(coalesce(octet_length(ch.result::text), 0) + 256), 0)
       FROM {{schema}}.gendurable_instances AS ch
       WHERE ch.parent_id = i.id AND ch.parent_fanout = i.fanout) ELSE 0 END AS kid_bytes,
    CASE WHEN i.inbox <> '{}'::jsonb THEN
      (SELECT coalesce(sum(octet_length(s.payload::text) + octet_length(s.name) + 128), 0)
       FROM {{schema}}.gendurable_signals AS s
       WHERE s.target_id = i.id AND s.consumed_at IS NULL) ELSE 0 END AS inbox_bytes
  FROM (SELECT x.id, x.children_total, x.inbox, x.fanout FROM {{schema}}.gendurable_instances AS x
        WHERE x.queue = $1 AND x.status = 'runnable' AND x.eligible_at <= now()
        ORDER BY x.priority, x.eligible_at
        LIMIT $2) AS i
) AS c
WHERE greatest(c.kid_bytes, c.inbox_bytes) > $3`

// Oversized is a row whose claim would carry more than MaxClaimBytes.
type Oversized struct {
	ID         int64
	KidBytes   int64 // its latest fan-out's children with their results
	InboxBytes int64 // its unconsumed signals
}

// OversizedClaims reports, among the first limit runnable, eligible rows of
// queue in pick order, those whose inbox or children exceed maxBytes.
func (q *Queries) OversizedClaims(ctx context.Context, db DB, queue string, limit int, maxBytes int64) ([]Oversized, error) {
	rows, err := db.Query(ctx, q.oversizedClaims, queue, limit, maxBytes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Oversized, error) {
		var o Oversized
		err := r.Scan(&o.ID, &o.KidBytes, &o.InboxBytes)
		return o, err
	})
}

// ProgramLimit reports a statement refused for exceeding a limit of
// PostgreSQL's (SQLSTATE 54000: a jsonb value over 256 MB among them).
func ProgramLimit(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "54000"
}

// ---------------------------------------------------------------------------
// Wait visibility: what a parked or pending instance waits for, in one read.

const waitInfoSQL = `
SELECT i.status::text, i.step, i.eligible_at, i.awaits, i.await_deadline,
       i.children_total, i.children_pending, i.partition_key,
       CASE WHEN i.partition_key IS NOT NULL AND i.status = 'runnable' THEN
         ARRAY(SELECT x.id FROM {{schema}}.gendurable_instances AS x
               WHERE x.partition_key = i.partition_key AND x.lease_expires_at IS NOT NULL
                 AND (x.lease_expires_at > now() OR x.claim_token IS NOT NULL) AND x.id <> i.id
               ORDER BY x.lease_expires_at LIMIT 100) END,
       -- how many there are (the list above stops at 100: a key of limit
       -- 120 fully held read "100 slots held", and "waiting for a worker")
       CASE WHEN i.partition_key IS NOT NULL AND i.status = 'runnable' THEN
         (SELECT count(*) FROM {{schema}}.gendurable_instances AS x
          WHERE x.partition_key = i.partition_key AND x.lease_expires_at IS NOT NULL
            AND (x.lease_expires_at > now() OR x.claim_token IS NOT NULL) AND x.id <> i.id) END,
       -- the queue's running steps as a pick with a GlobalConcurrency
       -- counts them (live leases in the queue), unless the caller works
       -- the row's queue with no such bound ($2: the queues it does)
       -- (two counts, as the pick's: each status's partial lease index
       -- serves one; a count of both scanned the table)
       CASE WHEN NOT i.queue = ANY ($2::text[]) AND i.status = 'runnable' THEN
         (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
          WHERE h.status = 'executing' AND h.lease_expires_at > now() AND h.queue = i.queue)
         + (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
            WHERE h.status <> 'executing' AND h.lease_expires_at > now() AND h.queue = i.queue) END,
       i.inbox, i.lease_expires_at, now(), i.key_limit, b.tokens, b.refilled_at,
       -- released unrun by a process that did not know its (machine,
       -- version), and not run since: the release's history entry
       CASE WHEN i.status = 'runnable' AND i.errors -> -1 ->> 'kind' = '` + KindUnknownVersion + `'
                 AND (i.errors -> -1 ->> 'retry_at')::timestamptz = i.eligible_at
            THEN i.errors -> -1 ->> 'error' END,
       coalesce((SELECT qp.paused FROM {{schema}}.gendurable_queues AS qp WHERE qp.name = i.queue), false),
       i.attempt,
       -- a prefetched claim its worker's last heartbeat marked not started
       coalesce(i.status = 'executing' AND i.unstarted_token = i.claim_token, false),
       i.queue
FROM {{schema}}.gendurable_instances AS i
LEFT JOIN {{schema}}.gendurable_key_buckets AS b ON b.key = i.partition_key AND i.status = 'runnable'
WHERE i.id = $1`

// WaitRow is the raw material of a wait reason.
type WaitRow struct {
	Status          string
	Step            string
	EligibleAt      time.Time
	Awaits          []string
	AwaitDeadline   *time.Time
	ChildrenTotal   int32
	ChildrenPending int32
	PartitionKey    *string
	KeyHolders      []int64    // the key's live slot holders (at most 100)
	KeyHeld         *int64     // how many hold the key's slots (all of them)
	GlobalHeld      *int64     // the queue's running steps (a runnable row of a queue not among unbounded)
	KeyLimit        *int32     // the row's own KeyLimit
	BucketTokens    *float64   // a rated key's tokens as of BucketRefilled
	BucketRefilled  *time.Time // (runnable rows only)
	Inbox           map[string]int
	LeaseExpiresAt  *time.Time
	Now             time.Time
	UnknownVersion  *string // the entry of its release by a process that did not know its machine version
	QueuePaused     bool    // its queue is paused (Engine.Pause)
	Attempt         int32   // > 0 on a runnable row: a retry (backing off while not yet eligible)
	Unstarted       bool    // an executing row whose claim its worker's last heartbeat marked not started
	Queue           string
}

// WaitInfo reads what instance id waits for; pgx.ErrNoRows if it does not
// exist. GlobalHeld is read for a runnable row of a queue not among
// unbounded (the queues the caller works with no GlobalConcurrency).
func (q *Queries) WaitInfo(ctx context.Context, db DB, id int64, unbounded []string) (WaitRow, error) {
	var w WaitRow
	err := db.QueryRow(ctx, q.waitInfo, id, unbounded).Scan(&w.Status, &w.Step, &w.EligibleAt, &w.Awaits,
		&w.AwaitDeadline, &w.ChildrenTotal, &w.ChildrenPending, &w.PartitionKey, &w.KeyHolders, &w.KeyHeld, &w.GlobalHeld,
		&w.Inbox, &w.LeaseExpiresAt, &w.Now, &w.KeyLimit, &w.BucketTokens, &w.BucketRefilled, &w.UnknownVersion, &w.QueuePaused, &w.Attempt, &w.Unstarted, &w.Queue)
	return w, err
}

// ---------------------------------------------------------------------------
// Read one instance by primary key (admin and tests; not on the hot path).

const getInstanceSQL = `
SELECT id, fsm, fsm_version, queue, step, state, result, status::text, priority, attempt,
       max_attempts, eligible_at, lease_expires_at, partition_key, errors, parent_id, awaits,
       inserted_at, updated_at, finished_at, unique_key, unique_guard IS NOT NULL
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
	Awaits         []string
	InsertedAt     time.Time
	UpdatedAt      time.Time
	FinishedAt     *time.Time
	UniqueKey      []byte // nil: inserted without one
	UniqueHeld     bool   // the row's status is in its unique scope: it holds the key now
}

// GetInstance reads one instance; pgx.ErrNoRows when there is none.
func (q *Queries) GetInstance(ctx context.Context, db DB, id int64) (InstanceRow, error) {
	var r InstanceRow
	err := db.QueryRow(ctx, q.getInstance, id).Scan(&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step,
		&r.State, &r.Result, &r.Status, &r.Priority, &r.Attempt, &r.MaxAttempts, &r.EligibleAt,
		&r.LeaseExpiresAt, &r.PartitionKey, &r.Errors, &r.ParentID, &r.Awaits, &r.InsertedAt, &r.UpdatedAt, &r.FinishedAt,
		&r.UniqueKey, &r.UniqueHeld)
	return r, err
}

// instancesOfSQL reads the newest instances of one machine version, for
// package gendurabletest's assertions. There is no index on fsm: it scans
// the table, which is fine for a test's schema and not meant for more.
const instancesOfSQL = `
SELECT id, fsm, fsm_version, queue, step, state, result, status::text, priority, attempt,
       max_attempts, eligible_at, lease_expires_at, partition_key, errors, parent_id, awaits,
       inserted_at, updated_at, finished_at
FROM {{schema}}.gendurable_instances WHERE fsm = $1 AND fsm_version = $2
ORDER BY id DESC LIMIT $3`

// InstancesOf reads up to limit instances of machine fsm at version, newest first.
func (q *Queries) InstancesOf(ctx context.Context, db DB, fsm string, version int32, limit int) ([]InstanceRow, error) {
	rows, err := db.Query(ctx, q.instancesOf, fsm, version, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (InstanceRow, error) {
		var r InstanceRow
		err := row.Scan(&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step,
			&r.State, &r.Result, &r.Status, &r.Priority, &r.Attempt, &r.MaxAttempts, &r.EligibleAt,
			&r.LeaseExpiresAt, &r.PartitionKey, &r.Errors, &r.ParentID, &r.Awaits, &r.InsertedAt, &r.UpdatedAt, &r.FinishedAt)
		return r, err
	})
}

// ---------------------------------------------------------------------------
// Retry (admin): a failed instance goes back to runnable at its current step
// with a fresh attempt budget. A parent that failed in the step after its
// fan-out sees the same children again (a failing outcome keeps the
// fan-out's children_total, and prune keeps a failed parent's children). If it is a child whose parent still waits on
// its fan-out, the parent waits for it again; a child of an earlier fan-out
// no longer counts for its parent. The unique index may refuse the move (another
// live instance took the key meanwhile): the caller reports that.
//
// A row cancelled mid-step keeps its lease (cancelSet): the cancelled step
// may run until its worker's next heartbeat. A retry keeps that lease while
// it is live, so the retried row itself counts as one of its key's holders
// and one of its queue's running steps until then (the pick and the hand-off
// count a row with a live lease whatever its status, docs/design.md §6):
// neither it nor another row of its key, or of its queue beyond the queue's
// GlobalConcurrency, starts beside the step that was cancelled. The row
// itself becomes eligible when that lease ends: claimed before (its key
// having room beside the lease), its new lease would replace the one that
// counted the cancelled step, and its key would count one holder less than
// it runs.

// retryLease is the lease a retried row keeps, and retryEligible when it
// becomes eligible (retrySQL, retryManySQL, runNowSQL). Both read the clock
// (clock_timestamp()), not the transaction's start: a retry or run-now may
// have waited for the row's lock, and a row made eligible from before a
// wait of over a second lies below the floor of a busy queue's picks
// (docs/design.md §4), which pass it over until a floor check finds it —
// the feeder this engine wakes found nothing, and the row ran 0.3–0.9 s
// late (TestRetryAndRunNowThatWaitedForTheRowRunAtOnce).
const (
	retryLease    = `CASE WHEN i.lease_expires_at > clock_timestamp() THEN i.lease_expires_at END`
	retryEligible = `CASE WHEN i.lease_expires_at > clock_timestamp() THEN i.lease_expires_at ELSE clock_timestamp() END`
)

// retryKeepsEligible is when a retried row becomes eligible: as
// retryEligible, but not before the row's own eligible_at, which a cancel
// keeps. A row cancelled while it waited — a durable sleep (Outcome.After),
// a RunAt, a backoff — waits out the rest of it when retried; a probe's
// reminder due in an hour, cancelled and retried, ran at once. (Run-now
// makes it eligible now: runNowSQL keeps retryEligible.) A row that failed
// otherwise was eligible when it was claimed, in the past.
const retryKeepsEligible = `greatest(` + retryEligible + `, i.eligible_at)`

// retryStatusSet is the status a retry gives a failed row i, from k.kids,
// the live children of its current fan-out (liveChildren, counted once per
// row in a CTE k of the statement): runnable, or, for a parent cancelled
// while it awaited its fan-out with children of it still live,
// awaiting_children again with those children pending, so its next step
// runs once they have finished, not beside them. The children are counted
// (through the parent's children index), not read from children_pending: a
// cancel that took a parent and its children in one statement changed the
// parent's row once and never counted them down.
//
// The count is taken on the statement's snapshot, so the statement must
// not wait for the row's lock after taking it: a child that finished
// meanwhile (its outcome held the parent's row) would be counted live, and
// the parent would wait for it for ever. Retry and RetryMany lock the rows
// first (retryLockSQL), in a statement of their own in the same
// transaction: no child of a locked row can finish until the retry commits,
// and the retry statement's snapshot, taken after the locks, holds every
// child that finished before.
//
// The same lock statement locks the parents of the rows it retries. A
// retried child counts itself on its parent only if the statement's
// snapshot sees the parent awaiting it, and a retried parent counts only
// the children its snapshot sees live: a child and its parent retried at
// once, each holding only its own row, saw each other failed, and the
// parent awaited one child less than were live — another child's finish
// woke it beside the retried one. With the parent's row locked first, the
// two retries take turns, and the second one's snapshot holds the first
// one's change. (A prune deletes a finished parent only under its lock,
// after looking at its children in a snapshot taken then: pruneSQL.)
const retryStatusSet = `      status = CASE WHEN ` + reparkAwait + ` THEN 'awaiting_signal'::{{schema}}.gendurable_status
                    WHEN k.kids > 0 THEN 'awaiting_children'::{{schema}}.gendurable_status
                    ELSE 'runnable' END,
      children_pending = CASE WHEN NOT ` + reparkAwait + ` AND k.kids > 0 THEN k.kids ELSE i.children_pending END,
      await_deadline = CASE WHEN ` + reparkAwait + ` AND i.await_deadline IS NOT NULL
                            THEN greatest(i.await_deadline, clock_timestamp()) END,
      -- A step past an await (an empty list: cancelSet, the reaper, a
      -- Stop) runs as after a timeout, shown its inbox (docs/design.md §2).
      awaits = CASE WHEN ` + reparkAwait + ` THEN i.awaits WHEN i.awaits IS NOT NULL THEN '{}'::text[] END`

// reparkAwait says a failed row i was cancelled while parked in an Await:
// cancelSet kept what it awaited, and its last error is the cancel's. A
// retry parks it again, before anything else — a parent past its fan-out
// that awaits a signal awaits the signal, not a child of that fan-out
// retried on its own. Rows that a reaper or an engine of schema version 17
// failed after a signal woke them keep awaits too, but their last error is
// not a cancel: they run their step, as before. Never NULL (awaits NULL
// makes the comparison NULL, and NOT NULL is NULL: a parent's children
// count was left as it was).
const reparkAwait = `coalesce(cardinality(i.awaits) > 0 AND i.errors -> -1 ->> 'kind' = 'cancelled', false)`

// retryLockSQL locks the failed rows among $1 (the caller's ids, sorted)
// and their parents, every one in id order so that two retries lock shared
// rows in the same order, one primary-key probe each, and returns the ids
// among $1 that are failed once locked: the first statement of a retry (see
// retryStatusSet). The parents are read before any lock is taken: a row's
// parent_id never changes. A parent is locked whatever its status.
const retryLockSQL = `
WITH t AS (
  SELECT array_agg(DISTINCT x.id ORDER BY x.id) AS ids
  FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
    SELECT c.id, c.parent_id FROM {{schema}}.gendurable_instances AS c
    WHERE c.id = u.id AND c.status = 'failed'
    OFFSET 0 -- a fence: one primary-key probe per id
  ) AS c CROSS JOIN LATERAL (VALUES (c.id), (c.parent_id)) AS x(id)
  WHERE x.id IS NOT NULL
)
SELECT c.id FROM t CROSS JOIN LATERAL unnest(t.ids) WITH ORDINALITY AS u(id, ord) CROSS JOIN LATERAL (
  SELECT c.id, c.status FROM {{schema}}.gendurable_instances AS c
  WHERE c.id = u.id
  OFFSET 0 -- a fence: one primary-key probe per id
  FOR NO KEY UPDATE
) AS c
WHERE c.status = 'failed' AND c.id = ANY ($1::bigint[])
ORDER BY u.ord`

// beginIdleLimitedFunc runs fn in a transaction of the library's own that
// spans round trips (Retry, RetryMany: a lock statement, then the retry),
// begun with idleLimitSetting in the BEGIN's round trip, so a client cut
// off between the two does not leave the rows and their parents locked
// until the server's TCP keepalive gives up: a locked parent holds back
// its children's outcomes and every reap (docs/design.md §2). In a
// transaction of the caller's (a savepoint) the caller owns its idle time.
func beginIdleLimitedFunc(ctx context.Context, db TxDB, fn func(pgx.Tx) error) error {
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return pgx.BeginTxFunc(ctx, b, pgx.TxOptions{BeginQuery: BeginIdleLimited(ownTxIdle)}, fn)
	}
	return pgx.BeginFunc(ctx, db, fn)
}

// TxDB is a DB that begins a transaction (a savepoint, in a transaction).
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// lockForRetry runs retryLockSQL in tx and returns the ids it locked.
func (q *Queries) lockForRetry(ctx context.Context, tx pgx.Tx, ids []int64) ([]int64, error) {
	rows, err := tx.Query(ctx, q.retryLock, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// liveChildren counts the unfinished children of the current fan-out of
// row p while p has not joined them (its children_total, cleared by the
// outcome of the step after the fan-out, above zero), and also those
// among retried, if set (a subquery of ids the same statement
// retries: its snapshot still sees them failed, so counted by status alone
// a parent retried with its children — a retry by filter after a cancel by
// filter — went runnable and ran its next step beside them; its own row
// being failed in that snapshot, the statement's count of retried children
// for waiting parents, CTE p, passes it over). A parent past its join
// counts none: a child of that fan-out retried after the join runs on its
// own, and a retry of the parent failed in a later step reruns that step.
// Counted, the retry parked it awaiting the child, its children_pending
// above its children_total (TestRetryOfAParentPastItsJoinRerunsItsStep).
func liveChildren(retried string) string {
	live := `c.status NOT IN ('done', 'failed')`
	if retried != "" {
		live = `(` + live + ` OR c.id IN (` + retried + `))`
	}
	return `(SELECT count(*)::int FROM {{schema}}.gendurable_instances AS c
         WHERE p.children_total > 0 AND c.parent_id = p.id AND c.parent_fanout = p.fanout AND ` + live + `)`
}

// waitsForItsChildren says parent row p, locked, still waits for the
// children of its current fan-out: it awaits them, or it is runnable with
// its join step not run yet — its last child finished (or was cancelled)
// and woke it, and its next outcome has not cleared children_total. A
// retried child counts again in either: the second is put back to awaiting
// it. Before, only the first did; a parent woken by the cancel of its last
// child and not yet run when the child was retried ran its join step beside
// the retried child, which its Run.Children showed runnable (a fault probe
// found it in a kill storm; TestRetryOfTheLastChildPutsAWokenParentBackToAwaitingIt
// holds the parent in the window by pausing its queue).
// A parent whose join step is claimed (executing) has read its children:
// the retried child runs on its own if the join commits (a claim that
// waited in its feeder's buffer reads them again as it starts: ClaimInput),
// and if the claim ends without its outcome, the next claim finds the
// child live and gives itself up (Reawait). A runnable parent's children_pending
// may be stale (a retry that found no live child keeps it): put back, it
// awaits its live children counted afresh, the retried ones with them.
func waitsForItsChildren(p string) string {
	return `(` + p + `.status = 'awaiting_children' OR ` + p + `.status = 'runnable' AND ` + p + `.children_total > 0)`
}

// reawaitSet is the SET of a retry's parent p that waitsForItsChildren: it
// awaits n more children (the retried ones, CTE r), or, runnable, its live
// children counted afresh with them.
func reawaitSet(n string) string {
	return `children_pending = CASE WHEN p.status = 'awaiting_children' THEN p.children_pending + ` + n + `
                              ELSE ` + liveChildren(`SELECT r.id FROM r`) + ` END,
      status = 'awaiting_children', updated_at = now()`
}

// retrySQL retries row $1 if retryLockSQL locked it ($2, its result): a row
// that snapshot saw live and that a cancel failed just after is not locked,
// nor is its parent, so it is not retried here (its live children would be
// counted on this snapshot while a child's outcome held the row, and that
// count written over the child's decrement); Retry locks again.
var retrySQL = `
WITH k AS (
  SELECT p.id, ` + liveChildren("") + ` AS kids
  FROM {{schema}}.gendurable_instances AS p WHERE p.id = $1 AND p.id = ANY ($2::bigint[])
), r AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET attempt = 0, finished_at = NULL, claim_token = NULL, updated_at = now(), inbox = '{}', inbox_seen = NULL,
` + retryStatusSet + `,
      eligible_at = ` + retryKeepsEligible + `, lease_expires_at = ` + retryLease + `
  FROM k WHERE i.id = k.id AND i.status = 'failed'
  RETURNING i.id, i.parent_id, i.parent_fanout, i.queue, ` + retryWait + ` AS wait_us
), p AS (
  UPDATE {{schema}}.gendurable_instances AS p
  SET ` + reawaitSet("1") + `
  FROM r WHERE p.id = r.parent_id AND p.fanout = r.parent_fanout AND ` + waitsForItsChildren("p") + `
  RETURNING p.id
), leftovers AS (
  -- A signal that raced the terminal outcome, if the finisher's second sweep
  -- (ApplyOutcomes, Cancel, Reap) failed, stayed unconsumed while the inbox
  -- counts went to zero: consume it now, as the terminal outcome would have.
  -- The counts (SET inbox above) go to zero with it: every signal of a
  -- failed instance is consumed, and counts left over would wake a retried
  -- await for signals no step can see.
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM r WHERE s.target_id = r.id AND s.consumed_at IS NULL
  RETURNING s.id
)
SELECT (SELECT status::text FROM {{schema}}.gendurable_instances WHERE id = $1),
       (SELECT queue FROM r), coalesce((SELECT wait_us FROM r), 0)`

// retryWait is, in RETURNING of a retry (or run-now) of row i, how long
// (microseconds, on the database clock, read now) until the row, runnable, becomes
// eligible: 0 if it is eligible now or not runnable (a parent awaiting its
// children is woken by them). The engine wakes its feeder of the queue then
// (a retried row waits for the lease of its cancelled step).
const retryWait = `CASE WHEN i.status = 'runnable' AND i.eligible_at > clock_timestamp()
         THEN ceil(extract(epoch FROM i.eligible_at - clock_timestamp()) * 1000000)::bigint ELSE 0 END`

// Retry moves a failed instance back to runnable; it returns the status the
// instance had (nil if none exists), its queue if it was retried, and how
// long until it is eligible (0: now). A row that turns failed between the
// lock statement and the retry statement (a cancel committing in between)
// is locked again, up to three tries; a row that is still flipping after
// that is reported failed and not retried (queue nil), and a Retry of it
// again is safe.
func (q *Queries) Retry(ctx context.Context, db TxDB, id int64) (status *string, queue *string, wait time.Duration, err error) {
	var us int64
	err = beginIdleLimitedFunc(ctx, db, func(tx pgx.Tx) error {
		for try := 1; ; try++ {
			locked, err := q.lockForRetry(ctx, tx, []int64{id})
			if err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, q.retry, id, locked).Scan(&status, &queue, &us); err != nil {
				return err
			}
			// Not locked, and failed on the retry statement's later
			// snapshot: a cancel committed between the two. Lock it now.
			if len(locked) > 0 || status == nil || *status != "failed" || try == 3 {
				return nil
			}
		}
	})
	if err != nil {
		return nil, nil, 0, err
	}
	return status, queue, time.Duration(us) * time.Microsecond, nil
}

// reawaitLockSQL locks a claimed row, fenced by its claim token: the first
// statement of Reawait (by primary key: claimedRowLockedSQL). A row the
// claim no longer holds is locked too, until Reawait's transaction ends
// having written nothing.
var reawaitLockSQL = claimedRowLockedSQL("FOR NO KEY UPDATE")

// reawaitSQL gives up claim $2 of parent $1 without running its step: the
// parent awaits the live children of its current fan-out, counted on this
// statement's snapshot, or, with none left, is runnable now. Like a
// release, it counts no attempt.
var reawaitSQL = `
WITH cur AS MATERIALIZED (` + claimedRowSQL + `)
UPDATE {{schema}}.gendurable_instances AS p
SET children_pending = k.kids,
    status = (CASE WHEN k.kids > 0 THEN 'awaiting_children' ELSE 'runnable' END)::{{schema}}.gendurable_status,
    eligible_at = now(), lease_expires_at = NULL, claim_token = NULL, updated_at = now()
FROM cur, (SELECT ` + liveChildren("") + ` AS kids
      FROM {{schema}}.gendurable_instances AS p WHERE p.id = $1) AS k
WHERE p.id = cur.id
RETURNING p.status::text`

// Reawait hands back the claim (id, token) of a parent whose claim found a
// child of its current fan-out still live — retried by an operator after
// it woke the parent, then the parent's claim was let go without its join
// (a release, a reap, a failed or replayed join): the join must not run
// beside that child. The parent goes back to awaiting its live children,
// counted afresh, or to runnable if none is left by then. The row is
// locked first, in a statement of its own (reawaitLockSQL), so the count's
// snapshot holds every child that finished before: a child finishing
// after it counts down the parent it now awaits (countsDown takes in a
// parent whose join is claimed for that turn). It returns the new status,
// or "" if the claim was no longer the row's (nothing written).
func (q *Queries) Reawait(ctx context.Context, db TxDB, id, token int64) (status string, err error) {
	err = beginIdleLimitedFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q.reawaitLock, id, token)
		if err != nil {
			return err
		}
		locked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(locked) == 0 {
			return err
		}
		err = tx.QueryRow(ctx, q.reawait, id, token).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	return status, err
}

// uniqueHolderSQL finds the instance holding instance $1's unique key (one
// probe of the unique index), and that key as text.
const uniqueHolderSQL = `
SELECT h.id, convert_from(i.unique_key, 'UTF8')
FROM {{schema}}.gendurable_instances AS i
JOIN {{schema}}.gendurable_instances AS h ON h.unique_guard = i.unique_key AND h.id <> i.id
WHERE i.id = $1
LIMIT 1`

// UniqueHolder returns the instance that holds id's unique key, and the
// key; ok is false if none does (any more).
func (q *Queries) UniqueHolder(ctx context.Context, db DB, id int64) (holder int64, key string, ok bool, err error) {
	err = db.QueryRow(ctx, q.uniqueHolder, id).Scan(&holder, &key)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", false, nil
	}
	return holder, key, err == nil, err
}
