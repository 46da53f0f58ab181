package sqlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Pick (docs/design.md §4, §5, §6): one statement claims up to $2 runnable rows of
// one queue. The work is the function gendurable_pick (migration 005): plain rows
// through the pick index in (priority, eligible_at) order — `queue = $1`, never
// ANY, so the LIMIT stops the scan: O(batch), not O(backlog) — and keyed rows key
// by key, round robin from the cursor, each key's live holders counted against its
// limit under a transaction-level advisory lock. A paused queue (one primary-key
// probe) yields nothing. The last row has no claim: it carries the cursor and
// the floor for the next pick (migration 011, docs/design.md §4).
//
// The claimed rows come back whole from the function, with the signals and
// children their steps will read: read there, by the statement that claimed
// them (this statement's own snapshot is older than the function's claims,
// and would miss a signal that woke a row just before it was claimed).

var pickSQL = `
SELECT p.next_cursor, p.keys_full, p.keys_rated, p.next_floor, i.id, i.claim_token, i.fsm, i.fsm_version, i.step, i.state, i.attempt,
       i.max_attempts, i.priority, i.partition_key, i.awaits, i.children_total, i.inserted_at,
       ` + freshInbox(`p.inbox_rows`, `i`, `'{}'`) + `, p.child_rows, i.inbox_seen
FROM {{schema}}.gendurable_pick($1, $2, $3::bigint, $4, $5::text[], $6::int[], $7::float8[], $8::int[], $9, $10,
                                 $11::timestamptz, $12::smallint[], $13::int) AS p
CROSS JOIN LATERAL (SELECT (p.c).*) AS i`

// freshInbox is list — the inbox rows of the claimed row named row, read
// in the claiming statement's snapshot — or, where the row's inbox counts,
// read under its lock, say it holds more unconsumed signals than the list,
// the list read again in a fresh snapshot (gendurable_inbox_fresh,
// migration 020): a signal that committed after the snapshot was taken,
// while the claim waited for the row or just before it locked it, is
// counted in the row but missing from the list (docs/design.md §2). skip
// is a bigint[] of signals the statement itself consumes. A row whose
// counts are empty has no signal (list is NULL then): nothing is counted
// for it, the common case on the hot path.
func freshInbox(list, row, skip string) string {
	return `CASE WHEN ` + row + `.inbox <> '{}'::jsonb THEN
        (SELECT CASE WHEN coalesce(jsonb_array_length(l.r), 0) >= ` + heldSignals(row+`.inbox`) + ` THEN l.r
                     ELSE {{schema}}.gendurable_inbox_fresh(` + row + `.id, ` + skip + `) END
         FROM (SELECT ` + list + ` AS r) AS l) END`
}

// inboxRowsSQL is the unconsumed signals of row i, oldest first, as one JSON
// array, so the statement that claims a row hands its step the inbox (docs/
// design.md §4): no load after the claim. A row whose inbox counts are empty
// has none (every signal bumps them under the row lock), so it is not asked.
const inboxRowsSQL = `(SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                                   'at', s.inserted_at) ORDER BY s.id)
           FROM {{schema}}.gendurable_signals AS s
           WHERE s.target_id = i.id AND s.consumed_at IS NULL)`

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
	Awaits       []string // non-nil: the step follows an await
	Children     int32    // > 0: the step follows a fan-out
	InsertedAt   time.Time
	Inbox        []SignalRow // the unconsumed signals when claimed, oldest first
	ChildRows    []ChildRow  // Children > 0: the children of the latest fan-out
	// Seen is, for a step its await's timeout woke, the ids of the signals
	// the step which parked had received (some may be consumed since): a
	// re-await does not count them as new (migration 018).
	Seen []int64
	// Buffered is when the claim reached its feeder's buffer (local
	// clock), by a pick; zero for a claim an outcome statement made (a
	// chained step, a key's successor), which runs at once.
	Buffered time.Time
}

// claimedRowSQL is the id of row $1 while claim $2 holds it (no row
// otherwise), read by primary key behind an OFFSET 0 fence: with the
// token and the status in the scan's own WHERE, a table whose statistics
// show few executing rows (analyzed in a quiet hour) had the planner read
// the partial lease index — every executing row's entry — for the one id,
// custom plans as well as generic (TestHotPathPlansUnderAdversarialStatistics:
// "claim-input-after-fanouts", "reawait", "release-unknown"). lock is a
// locking clause for the row (FOR NO KEY UPDATE), or empty: a statement
// that writes the row on what this reads must lock it here (or in an
// earlier statement of its transaction), for the token and status to be
// checked on its newest version.
func claimedRowLockedSQL(lock string) string {
	return `SELECT c.id FROM (
    SELECT i.id, i.claim_token, i.status FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = $1
    OFFSET 0 -- a fence: the outer conditions must not reach the scan
    ` + lock + `
  ) AS c
  WHERE c.claim_token = $2 AND c.status = 'executing'`
}

// claimedRowSQL is claimedRowLockedSQL without a lock.
var claimedRowSQL = claimedRowLockedSQL("")

// claimInputSQL reads again what a claimed row's step reads besides the
// row, while claim $2 holds row $1 (no row otherwise): its unconsumed
// signals if $3, and if $4 the children of its latest fan-out, as the
// claim read them (the pick's child_rows). One primary-key probe, a range
// of the signals' inbox index, a range of the parent-fanout index; the row
// is read behind a fence, as claimedRowSQL's (it only reads: no lock).
const claimInputSQL = `
SELECT CASE WHEN $3::bool THEN ` + inboxRowsSQL + ` END,
       CASE WHEN $4::bool AND i.children_total > 0 THEN
         (SELECT jsonb_agg(jsonb_build_object('id', ch.id, 'fsm', ch.fsm, 'version', ch.fsm_version,
                                              'step', ch.step, 'status', ch.status, 'result', ch.result,
                                              'finished_at', ch.finished_at) ORDER BY ch.id)
          FROM {{schema}}.gendurable_instances AS ch
          WHERE ch.parent_id = i.id AND ch.parent_fanout = i.fanout) END
FROM (SELECT i.id, i.claim_token, i.status, i.children_total, i.fanout
      FROM {{schema}}.gendurable_instances AS i
      WHERE i.id = $1
      OFFSET 0 -- a fence: the primary key, not the lease index of every executing row
     ) AS i
WHERE i.claim_token = $2 AND i.status = 'executing'`

// ClaimInput reads again the inbox (if inbox) and the children (if
// children) of claimed row id, for a claim (token) that waited in its
// feeder's buffer before its step starts: signals committed since the
// claim read them are in the inbox, and a child an operator retried since
// shows as live. held is false if the claim is no longer the row's.
func (q *Queries) ClaimInput(ctx context.Context, db DB, id, token int64, inbox, children bool) (in []SignalRow, kids []ChildRow, held bool, err error) {
	var rawInbox, rawKids []byte
	err = db.QueryRow(ctx, q.claimInput, id, token, inbox, children).Scan(&rawInbox, &rawKids)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, err
	}
	if in, err = decodeInbox(rawInbox); err != nil {
		return nil, nil, false, err
	}
	if kids, err = decodeChildren(rawKids); err != nil {
		return nil, nil, false, err
	}
	return in, kids, true, nil
}

// KeyPolicy is the limit and rate of the keys that start with Prefix (the
// longest matching prefix wins; a row's own key_limit wins over its limit).
type KeyPolicy struct {
	Prefix string
	Limit  int
	Rate   float64 // starts per second; 0: none
	Burst  int     // the token bucket's size (with Rate)
}

// policyArrays are key policies as the column arrays the pick and the
// bucket prune take them in.
type policyArrays struct {
	prefixes []string
	limits   []int32
	rates    []float64
	bursts   []int32
}

func policyArraysOf(policies []KeyPolicy) policyArrays {
	pa := policyArrays{
		prefixes: make([]string, len(policies)),
		limits:   make([]int32, len(policies)),
		rates:    make([]float64, len(policies)),
		bursts:   make([]int32, len(policies)),
	}
	for i, p := range policies {
		pa.prefixes[i], pa.limits[i], pa.rates[i], pa.bursts[i] = p.Prefix, int32(p.Limit), p.Rate, int32(p.Burst)
	}
	return pa
}

// PickOpts are the knobs of one pick besides the queue.
type PickOpts struct {
	Limit    int           // rows at most
	Lease    time.Duration // of every claimed row
	Cursor   string        // the key the previous pick's walk stopped at ("" to start)
	Policies []KeyPolicy   // key limits by prefix
	MaxKeys  int           // keys visited at most (default 4 × Limit + 16)
	Global   int           // the queue's running steps across every process at most (0: no bound)
	// Keyed bounds the keyed rows among the claimed: a keyed claim takes a
	// slot of its key while it waits, so a worker claims only as many as it
	// expects to start soon (docs/design.md §6, "Keyed claims wait
	// little"). 0: up to Limit; negative: none.
	Keyed int
	// Floor is the previous pick's PickResult.Floor: plain rows eligible
	// before it are not looked at (nil: no floor). Below it the pick reads
	// no index entry of the priorities in Prios, and no heap tuple of any
	// other; rows that become visible below it are found by PickFloorCheck.
	Floor *time.Time
	// Prios are the priorities plain rows of the queue were claimed at
	// lately: the pick seeks straight to the floor within each.
	Prios []int16
}

// PickResult is what a pick claimed and what it saw of the keys.
type PickResult struct {
	Claimed []Claimed
	// Cursor is where the next pick of the queue starts its walk over keys.
	Cursor string
	// KeysFull and KeysRated count the keys the pick passed over because
	// they had no free slot, or no start left in their bucket: element 0
	// for keys no policy matches, element i+1 for PickOpts.Policies[i].
	KeysFull, KeysRated []int32
	// Floor is the floor for the next pick: PickOpts.Floor, or the pick's
	// now() less a second's slack when its plain part claimed fewer rows
	// than it asked for (every visible eligible plain row was taken).
	Floor *time.Time
	// Walked reports that the pick went as far as its walk over the keys
	// (it may have visited none): false when the queue is paused, or when
	// its GlobalConcurrency left the pick nothing to claim.
	Walked bool
}

// Pick claims up to o.Limit runnable rows of queue.
func (q *Queries) Pick(ctx context.Context, db DB, queue string, o PickOpts) (PickResult, error) {
	pa := policyArraysOf(o.Policies)
	maxKeys := o.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 4*o.Limit + 16
	}
	var keyed *int // NULL: no bound beyond the limit
	if o.Keyed != 0 {
		k := max(o.Keyed, 0)
		keyed = &k
	}
	rows, err := db.Query(ctx, q.pick, queue, o.Limit, micros(o.Lease), o.Cursor, pa.prefixes, pa.limits, pa.rates, pa.bursts, maxKeys, o.Global,
		o.Floor, o.Prios, keyed)
	if err != nil {
		return PickResult{}, err
	}
	defer rows.Close()
	res := PickResult{Cursor: o.Cursor, Floor: o.Floor}
	skip := make([]any, len(rows.FieldDescriptions()))
	for rows.Next() {
		if rows.RawValues()[4] == nil {
			// The cursor row: no claim. Its cursor is NULL when the pick
			// walked no key (a GlobalConcurrency already taken: the batch
			// was 0), and the walk then starts where it did.
			var cursor *string
			skip[0], skip[1], skip[2], skip[3] = &cursor, &res.KeysFull, &res.KeysRated, &res.Floor
			if err := rows.Scan(skip...); err != nil {
				return PickResult{}, err
			}
			if cursor != nil {
				res.Cursor, res.Walked = *cursor, true
			}
			continue
		}
		var c Claimed
		var inbox, children, seen []byte
		if err := rows.Scan(nil, nil, nil, nil, &c.ID, &c.Token, &c.FSM, &c.Version, &c.Step, &c.State, &c.Attempt,
			&c.MaxAttempts, &c.Priority, &c.PartitionKey, &c.Awaits, &c.Children, &c.InsertedAt,
			&inbox, &children, &seen); err != nil {
			return PickResult{}, err
		}
		var err error
		if c.Seen, err = decodeSeen(seen); err != nil {
			return PickResult{}, err
		}
		if c.Inbox, err = decodeInbox(inbox); err != nil {
			return PickResult{}, err
		}
		if c.ChildRows, err = decodeChildren(children); err != nil {
			return PickResult{}, err
		}
		res.Claimed = append(res.Claimed, c)
	}
	return res, rows.Err()
}

// pickFloorCheckSQL finds the earliest eligible_at of the queue's runnable
// plain rows below a pick's floor: rows that became visible after the pick
// that set the floor (a transaction that committed more than the floor's
// slack after its now(), a RunAt in the past, a reaped or released row, a row
// a pick skipped while it was locked). It walks the plain pick index's
// entries below the floor, fetching each one's heap tuple — under a held
// snapshot, every row claimed since — so the feeder runs it off the pick
// path, at most once per FloorCheck, and only while the queue is busy.
const pickFloorCheckSQL = `
SELECT min(x.eligible_at) FROM {{schema}}.gendurable_instances AS x
WHERE x.status = 'runnable' AND x.queue = $1 AND x.partition_key IS NULL AND x.eligible_at < $2`

// PickFloorCheck returns the earliest eligible_at of queue's runnable plain
// rows below floor, or nil if there is none: the floor to lower to.
func (q *Queries) PickFloorCheck(ctx context.Context, db DB, queue string, floor time.Time) (*time.Time, error) {
	var at *time.Time
	err := db.QueryRow(ctx, q.pickFloorCheck, queue, floor).Scan(&at)
	return at, err
}

// decodeSeen decodes a row's inbox_seen ids (NULL: nil).
func decodeSeen(b []byte) ([]int64, error) {
	if b == nil {
		return nil, nil
	}
	var seen []int64
	if err := json.Unmarshal(b, &seen); err != nil {
		return nil, fmt.Errorf("decode inbox_seen: %w", err)
	}
	return seen, nil
}

func decodeInbox(b []byte) ([]SignalRow, error) {
	if b == nil {
		return nil, nil
	}
	var raw []struct {
		ID      int64           `json:"id"`
		Name    string          `json:"name"`
		Payload json.RawMessage `json:"payload"`
		At      time.Time       `json:"at"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("decode inbox: %w", err)
	}
	out := make([]SignalRow, len(raw))
	for i, r := range raw {
		out[i] = SignalRow{ID: r.ID, Name: r.Name, Payload: nullJSON(r.Payload), InsertedAt: r.At}
	}
	return out, nil
}

// decodeChildren decodes the pick's child_rows array (gendurable_pick,
// migration 006); NULL is no children.
func decodeChildren(b []byte) ([]ChildRow, error) {
	if b == nil {
		return nil, nil
	}
	var raw []struct {
		ID         int64           `json:"id"`
		FSM        string          `json:"fsm"`
		Version    int32           `json:"version"`
		Step       string          `json:"step"`
		Status     string          `json:"status"`
		Result     json.RawMessage `json:"result"`
		FinishedAt *time.Time      `json:"finished_at"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("decode children: %w", err)
	}
	out := make([]ChildRow, len(raw))
	for i, r := range raw {
		out[i] = ChildRow{ID: r.ID, FSM: r.FSM, Version: r.Version, Step: r.Step, Status: r.Status,
			Result: nullJSON(r.Result), FinishedAt: r.FinishedAt}
	}
	return out, nil
}

// nullJSON maps a JSON null (a NULL column inside jsonb_build_object) to nil,
// as scanning the column itself would.
func nullJSON(m json.RawMessage) []byte {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return m
}

// ---------------------------------------------------------------------------
// Heartbeat (docs/design.md §4, §5): one statement extends every lease a queue holds,
// fenced by the claim token. Rows locked by someone else at that moment (a
// caller's open SignalTx, an outcome committing) are skipped rather than
// waited for, so one long transaction elsewhere cannot stall the whole
// queue's heartbeat; they are reported as still held if their token still
// matches, and get extended on the next tick. A row that is not held any
// more was reaped (or finished elsewhere): its step is a zombie. A keyed row
// whose lease already ran out on the database clock is not extended either
// (checked after its row lock, on the clock of that moment): its key's slot
// may be another row's by now (docs/design.md §6). A row of a queue with a
// GlobalConcurrency ($4, bounded) is held to the same rule as a keyed row:
// once its lease has run out the pick no longer counts it among the queue's
// running steps, so its place may be another step's.

const heartbeatSQL = `
WITH h AS MATERIALIZED (
  SELECT * FROM unnest($1::bigint[], $2::bigint[], $5::smallint[]) AS h(id, token, state)
), lockable AS MATERIALIZED (
  SELECT h.id, h.token, h.state FROM h CROSS JOIN LATERAL (
    SELECT i.claim_token, i.status, i.partition_key, i.lease_expires_at FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = h.id
    OFFSET 0 -- a fence: the outer conditions must not reach the scan
    FOR NO KEY UPDATE SKIP LOCKED
  ) AS l
  WHERE l.claim_token = h.token AND l.status = 'executing'
    AND ((l.partition_key IS NULL AND NOT $4::bool) OR l.lease_expires_at > clock_timestamp())
), extended AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET lease_expires_at = now() + $3::bigint * interval '1 microsecond',
      -- ClaimState: started, starting (unconfirmed), not started (marked).
      unstarted_token = CASE l.state WHEN 2 THEN NULL WHEN 1 THEN -1 ELSE l.token END
  FROM lockable AS l
  WHERE i.id = l.id
  RETURNING i.id, i.lease_expires_at
), snap AS (
  -- Held but locked by someone else, so not extended: a keyed row, or a
  -- row of a bounded queue, has what is left of its lease (its key's slot,
  -- or its place in the queue's bound, is at stake); any other row counts
  -- as extended, as its outcome's fence settles what happens to it.
  SELECT h.id, CASE WHEN s.partition_key IS NULL AND NOT $4::bool THEN now() + $3::bigint * interval '1 microsecond'
                    ELSE s.lease_expires_at END AS lease_expires_at
  FROM h CROSS JOIN LATERAL (
    SELECT i.claim_token, i.status, i.partition_key, i.lease_expires_at FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = h.id
    OFFSET 0
  ) AS s
  WHERE s.claim_token = h.token AND s.status = 'executing'
    AND ((s.partition_key IS NULL AND NOT $4::bool) OR s.lease_expires_at > clock_timestamp())
)
SELECT id, (extract(epoch FROM max(lease_expires_at) - clock_timestamp()) * 1000000)::bigint, bool_or(ext)
FROM (SELECT id, lease_expires_at, true AS ext FROM extended
      UNION ALL SELECT id, lease_expires_at, false FROM snap) AS k
GROUP BY id`

// Kept is a lease the heartbeat found still held: extended now, or (locked
// by someone else at that moment) as it was. Left is how much of it was
// left on the database clock when the statement looked.
type Kept struct {
	ID   int64
	Left time.Duration
	// Extended: this statement wrote the row (its lease, and its
	// not-started mark as the claim was sent); false when another
	// transaction held it locked.
	Extended bool
}

// ClaimState is what a heartbeat says of a claim's step (docs/design.md
// §4, "Prefetched claims", "Claims no heartbeat confirmed").
type ClaimState int8

const (
	// NotStarted: buffered. The heartbeat marks the claim
	// (unstarted_token = its token): an expiry costs no attempt, once per
	// step and attempt, and the step must not start until the mark is
	// cleared.
	NotStarted ClaimState = iota
	// Starting: its mark is being cleared for its step to start, which
	// may not have begun. The heartbeat writes -1, as a claim does: an
	// expiry costs no attempt once per visit of the step. (Written NULL, a
	// worker that died between the clear and the step's start was charged
	// for a step that never ran.)
	Starting
	// Started: its step runs, or its outcome is being written. The
	// heartbeat writes NULL: an expiry costs an attempt.
	Started
)

// Heartbeat extends the leases of the (id, token) pairs and returns those
// still held, writing with each what states[i] says of claim i's step (see
// ClaimState; the reaper reads it, reapSQL). bounded: the rows are of
// a queue with a GlobalConcurrency, whose leases are kept as keyed rows'
// are (see heartbeatSQL).
func (q *Queries) Heartbeat(ctx context.Context, db DB, ids, tokens []int64, states []ClaimState, lease time.Duration, bounded bool) ([]Kept, error) {
	if len(states) != len(ids) {
		return nil, fmt.Errorf("heartbeat: %d claim states for %d claims", len(states), len(ids))
	}
	st := make([]int16, len(states))
	for i, s := range states {
		st[i] = int16(s)
	}
	rows, err := db.Query(ctx, q.heartbeat, ids, tokens, micros(lease), bounded, st)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Kept, error) {
		var k Kept
		var us int64
		err := row.Scan(&k.ID, &us, &k.Extended)
		k.Left = time.Duration(us) * time.Microsecond
		return k, err
	})
}

// ---------------------------------------------------------------------------
// Reap (docs/design.md §4): leases that expired (no outcome was written: a crash,
// a stall, a lost connection) go back to runnable with attempt + 1, or to
// failed once the attempts are spent. Driven by the lease partial index, so
// the cost is proportional to the expired rows only. Handle is not called.
// A child failed here counts towards its parent's fan-in like any other.
// eligible_at is left as it was: a reaped row keeps its place in the
// backlog, ahead of rows that became eligible after it.
//
// The sweep starts at $3, the floor the last sweep returned (NULL: a full
// sweep, from the lease index's head). From the head, a sweep reads the
// entry of every row claimed since a snapshot held elsewhere began, with its
// heap tuple: the entries of rows that finished cannot be marked dead while
// it is held (docs/design.md §4, "The reaper's floor"). The floor it returns
// is the earliest of now() − ReapFloorSlack and the earliest expired lease
// of a row still executing that it did not reap (locked by another
// transaction, or past the LIMIT), read without locks on its snapshot: every
// row it could see and left is at or above it. What it cannot see is a lease
// that a transaction wrote and committed more than ReapFloorSlack after it
// had run out; the full sweeps find those.

var reapSQL = `
WITH expired AS MATERIALIZED (
  -- inbox as locked: a row another transaction changed since this
  -- statement's snapshot was taken is locked and read as it left it.
  -- free: the claim's last heartbeat found its step not started (a
  -- prefetched row; docs/design.md §4, "Prefetched claims":
  -- unstarted_token = claim_token, or 0 on a row a pick left without a
  -- token when it revoked a marked key holder), and no
  -- earlier expiry of this step and attempt went free (its error history
  -- says so): it costs no attempt. Once per attempt: should a step ever
  -- start under a mark (a worker clears it first; docs/design.md §4 says
  -- where that ends), one that kills its process as it starts is still
  -- charged on its second crash. Also free (unconfirmed): a claim no
  -- heartbeat has written since it was taken (-1, schema version 24:
  -- "Claims no heartbeat confirmed") — its answer lost, or its worker
  -- gone before its first heartbeat — once per step: its step may have
  -- started, so a step that kills its process goes free on its first
  -- crash only, whatever the attempt. The step of the row's last such
  -- free is kept, hashed, in unconfirmed_freed (not read from the
  -- history, which keeps 20 entries: a step with more attempts went free
  -- again); a claim of another step goes free once more.
  --
  -- A row the reap may fail (its attempts spent) joins its parent's fan-in
  -- (parents, below), which updates the parent: the parent is locked here,
  -- before the LIMIT, skipped if another transaction holds it (a Retry or
  -- a caller's SignalTx left open by a client cut off), and the child with
  -- it, for a later sweep — waiting for it held back every expired lease
  -- behind it, of every instance, and a child skipped after the LIMIT
  -- would still take a place of the batch.
  SELECT id, inbox, free, unconfirmed, NOT free AND attempt + 1 >= max_attempts AS fails
  FROM (SELECT id, inbox, attempt, max_attempts,
               coalesce(((unstarted_token = claim_token OR (claim_token IS NULL AND unstarted_token = 0))
                         AND NOT errors @> jsonb_build_array(jsonb_build_object(
                               'kind', 'lease_expired', 'uncharged', true, 'step', step, 'attempt', attempt)))
                        OR (unstarted_token = -1 AND unconfirmed_freed IS DISTINCT FROM hashtext(step)),
                        false) AS free,
               coalesce(unstarted_token = -1, false) AS unconfirmed
        FROM {{schema}}.gendurable_instances AS c
        WHERE status = 'executing' AND lease_expires_at < now()
          AND lease_expires_at >= coalesce($3::timestamptz, '-infinity')
          -- (A missing parent is counted, not tested with NOT EXISTS: the
          -- planner hashed that over a sequential scan of the table.)
          AND (c.parent_id IS NULL OR c.attempt + 1 < c.max_attempts
               OR EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances AS p WHERE p.id = c.parent_id
                          FOR NO KEY UPDATE SKIP LOCKED)
               OR (SELECT count(*) FROM {{schema}}.gendurable_instances AS p WHERE p.id = c.parent_id) = 0)
        ORDER BY lease_expires_at
        LIMIT $1
        FOR UPDATE OF c SKIP LOCKED) AS x
), changed AS (
UPDATE {{schema}}.gendurable_instances AS i
SET status = CASE WHEN e.fails THEN 'failed' ELSE 'runnable' END::{{schema}}.gendurable_status,
    -- A row whose attempts ran out keeps the attempt it failed on, as one
    -- whose last attempt returned an error does (Attempt+1 = MaxAttempts).
    attempt = i.attempt + CASE WHEN e.free OR e.fails THEN 0 ELSE 1 END,
    lease_expires_at = NULL,
    claim_token = NULL,
    finished_at = CASE WHEN e.fails THEN now() END,
    -- A failure consumes the inbox, as Stop and a cancel do (swept below).
    inbox = CASE WHEN e.fails THEN '{}'::jsonb ELSE i.inbox END,
    unconfirmed_freed = CASE WHEN e.free AND e.unconfirmed THEN hashtext(i.step) ELSE i.unconfirmed_freed END,
    inbox_seen = CASE WHEN e.fails THEN NULL ELSE i.inbox_seen END,
    -- A failed row awaits nothing: a retry runs its step (only a cancel of
    -- a parked row keeps what it awaited, to park it again: cancelSet). A
    -- step past an await keeps an empty list, for the retried step to be
    -- shown its inbox, as after a timeout (retryStatusSet).
    awaits = CASE WHEN e.fails AND i.awaits IS NOT NULL THEN '{}' WHEN e.fails THEN NULL ELSE i.awaits END,
    updated_at = now(),
    errors = (CASE WHEN jsonb_array_length(i.errors) >= $2 THEN i.errors - 0 ELSE i.errors END)
             || jsonb_build_array(jsonb_build_object(
                  'step', i.step, 'attempt', i.attempt, 'at', now(), 'kind', 'lease_expired',
                  'token', i.claim_token,
                  'error', CASE WHEN e.free AND e.unconfirmed
                                THEN 'lease expired before any heartbeat confirmed the step started (the worker crashed, stalled or was cut off soon after the claim, or the claim''s answer was lost); no attempt charged, once per visit of the step'
                                WHEN e.free
                                THEN 'lease expired before the step started (a prefetched claim; the worker crashed, stalled or was cut off); no attempt charged'
                                WHEN e.fails
                                THEN 'lease expired with no outcome (the worker crashed, stalled or was cut off, or its claim''s answer was lost); attempts exhausted'
                                ELSE 'lease expired with no outcome (the worker crashed, stalled or was cut off, or its claim''s answer was lost)' END)
                || CASE WHEN e.free AND e.unconfirmed THEN '{"uncharged": true, "unconfirmed": true}'::jsonb
                        WHEN e.free THEN '{"uncharged": true}'::jsonb ELSE '{}'::jsonb END)
FROM expired AS e
WHERE i.id = e.id
RETURNING i.id, i.fsm, i.queue, i.step, i.attempt, i.status, i.parent_id, i.parent_fanout, e.inbox AS held_inbox, e.free
), swept AS (
  -- The failed rows' signals on this statement's snapshot; one that
  -- committed after it was taken is in the locked counts, not here:
  -- resweep reports the row (heldSignals) and Reap sweeps it again.
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM (SELECT x.id FROM changed AS c CROSS JOIN LATERAL (
          SELECT s.id FROM {{schema}}.gendurable_signals AS s
          WHERE s.target_id = c.id AND s.consumed_at IS NULL
          OFFSET 0) AS x
        WHERE c.status = 'failed') AS l
  WHERE s.id = l.id AND s.consumed_at IS NULL -- rechecked on a version newer than the snapshot
  RETURNING s.target_id
), ` + parentJoinCTE + `
SELECT c.id, c.fsm, c.queue, c.step, c.attempt, c.status::text, n.next, n.floor,
       coalesce(c.status = 'failed' AND c.held_inbox <> '{}'::jsonb
                AND ` + heldSignals(`c.held_inbox`) + ` > (SELECT count(*) FROM swept AS w WHERE w.target_id = c.id),
                false),
       coalesce(NOT c.free, false)
FROM (SELECT ` + nextWithin("executing", "lease_expires_at", "$5") + ` AS next,
             ` + sweepFloor("executing", "lease_expires_at", "<", "$3", "$4", "expired") + ` AS floor) AS n
LEFT JOIN changed AS c ON true`

// nextWithin is the SQL of a sweep's sleep hint: seconds from now() to the
// earliest col of a row in status that lies after now(), looked for no
// further than horizon microseconds past it (the parameter; 0: no bound) —
// under a snapshot held elsewhere the range after now() holds the entry of
// every row that passed through status since it began (a lease superseded
// by a heartbeat, an await signalled before its deadline), and a sweeper
// sleeps no longer than its interval anyway. NULL if none.
func nextWithin(status, col, horizon string) string {
	return `(SELECT extract(epoch FROM x.` + col + ` - now())::float8
              FROM {{schema}}.gendurable_instances AS x
              WHERE x.status = '` + status + `' AND x.` + col + ` > now()
                AND x.` + col + ` <= CASE WHEN ` + horizon + `::bigint > 0 THEN now() + ` + horizon + `::bigint * interval '1 microsecond'
                                          ELSE 'infinity'::timestamptz END
              ORDER BY x.` + col + `
              LIMIT 1)`
}

// sweepFloor is the SQL of the floor a sweep's next statement may start at
// (docs/design.md §4, "The reaper's floor"): the earliest of now() less
// slack microseconds (the parameter) and the earliest col, due (col due
// now(): "<" or "<="), at or above floor (the parameter; NULL: no bound),
// of a row still in status that the sweep's CTE left did not take — one
// another transaction holds locked, or one past its LIMIT — read without
// locks on the statement's snapshot.
func sweepFloor(status, col, due, floor, slack, left string) string {
	return `least(now() - ` + slack + `::bigint * interval '1 microsecond',
             (SELECT x.` + col + ` FROM {{schema}}.gendurable_instances AS x
              WHERE x.status = '` + status + `' AND x.` + col + ` ` + due + ` now()
                AND x.` + col + ` >= coalesce(` + floor + `::timestamptz, '-infinity')
                AND x.id NOT IN (SELECT l.id FROM ` + left + ` AS l)
              ORDER BY x.` + col + `
              LIMIT 1))`
}

// Reaped is one row the reaper recovered.
type Reaped struct {
	ID      int64
	FSM     string
	Queue   string
	Step    string
	Attempt int32
	Status  string // "runnable" or "failed"
	// Charged: the lost run cost an attempt. False for a claim whose last
	// heartbeat found its step not started, the first time on its step and
	// attempt, and for one no heartbeat confirmed, the first time on its
	// step (reapSQL).
	Charged bool
}

// ReapFloorSlack: a reap's returned floor lies at least this far before its
// statement's now(): a lease written by a transaction that commits
// up to this long after it ran out is still above the next sweep's floor.
const ReapFloorSlack = 10 * time.Second

// ReapResult is what one reap statement did and saw.
type ReapResult struct {
	Reaped []Reaped
	// Next is how long until the next lease still ahead of the statement's
	// now() runs out, on the database clock (the first entry of the lease
	// index past it; nil if none, or none within the horizon Reap was
	// given): leases that ran out before now() and were left are rows
	// another transaction has locked, and are not counted.
	Next *time.Duration
	// Floor is where the next sweep may start (reapSQL), on the database
	// clock.
	Floor time.Time
}

// Reap recovers up to limit expired leases at or above floor (nil: from the
// oldest; else a Floor an earlier Reap returned). Its Next looks no further
// than horizon past the statement's now() (0: no bound): a reaper that
// sleeps at most that long needs nothing further, and the probe's read is
// bounded under a snapshot held elsewhere.
func (q *Queries) Reap(ctx context.Context, db DB, limit int, floor *time.Time, horizon time.Duration) (ReapResult, error) {
	var res ReapResult
	rows, err := db.Query(ctx, q.reap, limit, MaxErrorHistory, floor, micros(ReapFloorSlack), micros(horizon))
	if err != nil {
		return res, err
	}
	defer rows.Close()
	var resweep []int64
	for rows.Next() {
		var id *int64
		var fsm, queue, step, status *string
		var attempt *int32
		var secs *float64
		var again, charged bool
		if err := rows.Scan(&id, &fsm, &queue, &step, &attempt, &status, &secs, &res.Floor, &again, &charged); err != nil {
			return ReapResult{}, err
		}
		if again {
			resweep = append(resweep, *id)
		}
		if secs != nil {
			d := time.Duration(*secs * float64(time.Second))
			res.Next = &d
		}
		if id != nil { // nil: the one row of a statement that reaped nothing
			res.Reaped = append(res.Reaped, Reaped{ID: *id, FSM: *fsm, Queue: *queue, Step: *step, Attempt: *attempt, Status: *status, Charged: charged})
		}
	}
	if err := rows.Err(); err != nil {
		return ReapResult{}, err
	}
	// The failed rows whose sweep missed a signal (resweep: it committed
	// after the statement's snapshot was taken, before the row was locked),
	// once more, on a fresh snapshot. No signal can follow while the rows
	// are failed (sweepInboxesSQL leaves a row retried in between alone).
	// Best effort, as for a cancel: the reap is committed, and a Retry
	// sweeps what is left.
	if len(resweep) > 0 {
		_ = q.SweepInboxes(ctx, db, resweep)
	}
	return res, nil
}

// clearUnstartedSQL clears the marks a heartbeat left on claims it found not
// started (heartbeatSQL's unstarted_token), before their steps start,
// fenced by the token. Cleared is -1, an unconfirmed claim's mark (schema
// version 24): the step has not begun, and an expiry before a heartbeat
// sends it as started costs no attempt, once per visit of the step. Like
// the heartbeat it skips a row another transaction holds locked (a
// caller's open SignalTx must not stall it), and reports it as held if its
// token is still the row's.
//
// A step starts on a lease live on the database clock: the clear skips a
// claim whose lease has run out (reported held, not cleared: the feeder
// tries again as for a locked row, and succeeds once a heartbeat has
// extended the lease — or the heartbeat finds the claim lost), and extends
// the lease of a claim it clears by a whole lease from the moment it
// writes the row (clock_timestamp, not the statement's start: a statement
// held up, by a lock or a stopped server process, would write a lease
// already past). A
// heartbeat counts a plain row locked by someone else as extended (its
// outcome's fence settles a running step's fate), so a buffered claim
// whose row a stalled heartbeat of its own held locked for longer than the
// lease started, after the stall, seconds past its lease (a probe:
// SIGSTOP of that heartbeat's server process inside its UPDATE).
const clearUnstartedSQL = `
WITH h AS MATERIALIZED (
  SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS h(id, token)
), lockable AS MATERIALIZED (
  SELECT h.id FROM h CROSS JOIN LATERAL (
    SELECT i.claim_token, i.status, i.lease_expires_at FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = h.id
    OFFSET 0 -- a fence: the outer conditions must not reach the scan
    FOR NO KEY UPDATE SKIP LOCKED
  ) AS l
  WHERE l.claim_token = h.token AND l.status = 'executing' AND l.lease_expires_at > clock_timestamp()
), cleared AS (
  -- -1, not NULL: the step has not started yet (docs/design.md §4).
  UPDATE {{schema}}.gendurable_instances AS i
  SET unstarted_token = -1,
      lease_expires_at = greatest(i.lease_expires_at, clock_timestamp() + $3::bigint * interval '1 microsecond')
  FROM lockable AS l
  WHERE i.id = l.id
  RETURNING i.id
)
SELECT h.token, EXISTS (SELECT 1 FROM cleared AS c WHERE c.id = h.id)
FROM h CROSS JOIN LATERAL (
  SELECT i.claim_token, i.status FROM {{schema}}.gendurable_instances AS i
  WHERE i.id = h.id
  OFFSET 0
) AS s
WHERE s.claim_token = h.token AND s.status = 'executing'`

// ClearUnstarted clears the not-started marks of the (id, token) claims
// (docs/design.md §4, "Prefetched claims"), to -1, and extends their
// leases by lease. It returns, by token, the claims still held: true if the mark is
// cleared (the step may start, its lease live for lease from no earlier
// than the statement was sent), false if another transaction held the row
// locked or its lease had run out on the database clock (try again once a
// heartbeat has run). A claim it does not return is no longer held.
func (q *Queries) ClearUnstarted(ctx context.Context, db DB, ids, tokens []int64, lease time.Duration) (map[int64]bool, error) {
	rows, err := db.Query(ctx, q.clearUnstarted, ids, tokens, micros(lease))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := make(map[int64]bool, len(ids))
	for rows.Next() {
		var token int64
		var cleared bool
		if err := rows.Scan(&token, &cleared); err != nil {
			return nil, err
		}
		held[token] = cleared
	}
	return held, rows.Err()
}

// ---------------------------------------------------------------------------
// Release: claimed rows go straight back to runnable without counting an
// attempt — prefetched rows at shutdown, claims given up before their steps
// started, rows of a version this process does not know (with a delay).
//
// A released row of a rated key does not give its claim's token back: the
// bucket may have refilled to its burst since the claim drew it, and a
// token returned on top would be one made up (TestReleaseMakesNoTokenUp).
// The token is spent.

const releaseSQL = `
WITH cur AS MATERIALIZED (
  SELECT r.id FROM unnest($1::bigint[], $2::bigint[]) AS r(id, token) CROSS JOIN LATERAL (
    SELECT i.claim_token, i.status FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = r.id
    OFFSET 0 -- a fence: the outer conditions must not reach the scan
    FOR NO KEY UPDATE
  ) AS c
  WHERE c.claim_token = r.token AND c.status = 'executing'
)
UPDATE {{schema}}.gendurable_instances AS i
SET status = 'runnable',
    -- A keyed row handed back at once keeps its place among its key's rows,
    -- as a reaped row does: at now() it would go behind the rows inserted
    -- after it (docs/design.md §6, "Order within a key").
    eligible_at = CASE WHEN $3::bigint = 0 AND i.partition_key IS NOT NULL THEN i.eligible_at
                       ELSE now() + $3::bigint * interval '1 microsecond' END,
    lease_expires_at = NULL,
    claim_token = NULL,
    updated_at = now()
FROM cur AS c
WHERE i.id = c.id
RETURNING i.id`

// Release returns claimed rows to runnable, eligible after delay; with no
// delay a keyed row keeps its eligible_at, so its place in its key's order.
func (q *Queries) Release(ctx context.Context, db DB, ids, tokens []int64, delay time.Duration) ([]int64, error) {
	rows, err := db.Query(ctx, q.release, ids, tokens, micros(delay))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// releaseUnknownSQL hands back a claimed row whose (machine, version) the
// claiming process does not know, like Release, and says so in the row's
// error history — an entry of kind "unknown_version" that takes the place of
// the previous one if that was one too, so that a row released every
// UnknownVersionDelay for days does not push its real errors out — so that
// Describe, WaitReason and the dashboard tell it from a durable sleep. No
// attempt is counted. One row, by primary key, fenced by its token: the
// claim is read and locked behind a fence (claimedRowLockedSQL), so the
// token and status do not reach the scan and are checked on the newest
// version of the locked row — the UPDATE's own WHERE holds only the id, and
// without the lock a release that waited for another transaction's lock on
// the row (a cancel, a new claim) wrote the row on the snapshot's claim (a
// review: a finished row back to runnable).
var releaseUnknownSQL = `
WITH cur AS MATERIALIZED (` + claimedRowLockedSQL("FOR NO KEY UPDATE") + `)
UPDATE {{schema}}.gendurable_instances AS i
SET status = 'runnable',
    eligible_at = now() + $3::bigint * interval '1 microsecond',
    lease_expires_at = NULL,
    claim_token = NULL,
    updated_at = now(),
    errors = (CASE WHEN i.errors -> -1 ->> 'kind' = '` + KindUnknownVersion + `' THEN i.errors - (-1)
                   WHEN jsonb_array_length(i.errors) >= $5::int THEN i.errors - 0
                   ELSE i.errors END)
             || jsonb_build_array(jsonb_build_object('step', i.step, 'attempt', i.attempt, 'at', now(),
                                                     'kind', '` + KindUnknownVersion + `', 'error', $4::text,
                                                     'retry_at', now() + $3::bigint * interval '1 microsecond'))
FROM cur
WHERE i.id = cur.id`

// KindUnknownVersion is the error kind of the history entry a release of
// a row of an unknown (machine, version) writes.
const KindUnknownVersion = "unknown_version"

// ReleaseUnknown returns a claimed row of a machine version the process
// does not know to runnable, eligible after delay, with msg in its error
// history (releaseUnknownSQL); a claim that is no longer the row's changes
// nothing.
func (q *Queries) ReleaseUnknown(ctx context.Context, db DB, id, token int64, delay time.Duration, msg string) error {
	_, err := db.Exec(ctx, q.releaseUnknown, id, token, micros(delay), ErrorText(msg), MaxErrorHistory)
	return err
}

const sessionAlive = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`

// SessionAlive reports whether the server session with backend pid still
// exists (a WithTx transaction's connection may die silently).
func (q *Queries) SessionAlive(ctx context.Context, db DB, pid uint32) (bool, error) {
	var alive bool
	err := db.QueryRow(ctx, sessionAlive, int64(pid)).Scan(&alive)
	return alive, err
}

// BeginIdleLimited is the statement that begins a transaction of the
// engine's own that spans round trips (a WithTx outcome's): BEGIN, and
// idle_in_transaction_session_timeout for this transaction only, in one
// round trip (a simple-protocol query of two statements, which a
// transaction-pooling proxy runs as one transaction). A client cut off from
// the server without its socket closing (a partition, a host gone) leaves
// its session idle in transaction, holding its locks and xmin, until the
// server's TCP keepalive notices — two hours by default; with this the
// server ends the session after idle of its own (docs/design.md §2). The
// setting counts only time the session waits for its client: a statement
// that runs or waits on a lock is not idle.
//
// The server takes whole milliseconds from 1 to 2^31-1 (about 24.8 days):
// idle is brought into that range (a longer one is as good as none). A
// stricter limit the session already has (set for the role or database by
// its administrator) is kept.
func BeginIdleLimited(idle time.Duration) string {
	return "begin; select " + idleLimitAtMost(min(max(idle.Milliseconds(), 1), math.MaxInt32))
}

// idleLimitAtMost is a set_config call that limits the transaction's
// idle_in_transaction_session_timeout to ms milliseconds, keeping a
// stricter one the session has (0 is none).
func idleLimitAtMost(ms int64) string {
	return settingAtMost("idle_in_transaction_session_timeout", strconv.FormatInt(ms, 10))
}

// settingAtMost is a set_config call that limits the transaction's timeout
// setting name to the milliseconds of the SQL expression ms (a literal or
// a bigint parameter), keeping a stricter one the session has (0 is none):
// one an administrator set for the role or database still applies.
func settingAtMost(name, ms string) string {
	return fmt.Sprintf(`set_config('%[1]s', CASE
  WHEN current_setting('%[1]s')::interval > interval '0'
   AND current_setting('%[1]s')::interval <= (%[2]s) * interval '1 millisecond'
  THEN current_setting('%[1]s') ELSE (%[2]s)::text END, true)`, name, ms)
}

// BackendPID returns the process id of the server session db runs on: in a
// transaction, the session that runs the whole transaction, even behind a
// transaction-pooling proxy.
func (q *Queries) BackendPID(ctx context.Context, db DB) (uint32, error) {
	var pid int64
	err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return uint32(pid), err
}
