package sqlq

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Outcomes (docs/design.md §2, §4, §5): one statement applies a batch of outcomes. A
// single outcome is a batch of one; concurrent steps' outcomes can share the
// statement (group commit) without a new shape.
//
// The statement first locks the instance rows whose claim token still
// matches (the fence: FOR UPDATE re-checks the newest row version, and holds
// it until commit). Everything else — children inserted, signals consumed,
// the instance updated, parents joined — hangs off that locked set, so a
// fenced-out outcome changes nothing at all.

// Kind is what a step decided (docs/design.md §2). It is the one
// definition of the outcome kinds: the root package's Outcome carries one,
// the executor and committer branch on it, and the outcome statement's
// CASEs are written with its values (outcomeSQL renders {{next}} … from
// the constants below), so adding a kind starts here.
type Kind int16

// Outcome kinds. The numbers are what the batch's kind column carries.
const (
	KindNone     Kind = iota // the zero Outcome: invalid
	KindNext                 // go on to a named step
	KindReplay               // run the same step again (retry or snooze)
	KindDone                 // finished successfully
	KindStop                 // failed for good
	KindAwait                // park until a signal (or a timeout)
	KindChildren             // park until scheduled children finish
)

// String names the kind as outcomes, events and logs show it.
func (k Kind) String() string {
	switch k {
	case KindNext:
		return "next"
	case KindReplay:
		return "replay"
	case KindDone:
		return "done"
	case KindStop:
		return "stop"
	case KindAwait:
		return "await"
	case KindChildren:
		return "children"
	}
	return "none"
}

// kindSQL writes the kinds' values into the outcome statement's CASEs.
var kindSQL = strings.NewReplacer(
	"{{next}}", strconv.Itoa(int(KindNext)), "{{replay}}", strconv.Itoa(int(KindReplay)),
	"{{done}}", strconv.Itoa(int(KindDone)), "{{stop}}", strconv.Itoa(int(KindStop)),
	"{{await}}", strconv.Itoa(int(KindAwait)), "{{children}}", strconv.Itoa(int(KindChildren)))

// MaxErrorHistory bounds the error entries kept on a row; older ones fall off.
const MaxErrorHistory = 20

// MaxErrorText bounds one error text in the history, in bytes.
const MaxErrorText = 4000

// MaxStackText bounds the stack trace a panic's entry in the error history
// keeps beside its text, in bytes: with MaxErrorHistory entries a row's
// history stays under about 240 KiB even if every attempt panicked.
const MaxStackText = 8 << 10

// ErrorText makes an error text storable in the error history: valid
// UTF-8, no NUL bytes (PostgreSQL text cannot hold them), and at most
// MaxErrorText bytes, cut at a character boundary.
func ErrorText(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= MaxErrorText {
		return s
	}
	cut := MaxErrorText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(truncated)"
}

// StackText makes a panic's stack trace storable in the error history:
// valid UTF-8 without NUL bytes, at most MaxStackText bytes, cut after the
// last whole frame that fits (the innermost frames come first and are kept).
func StackText(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= MaxStackText {
		return s
	}
	const mark = "\n…(truncated)"
	// A frame is a function line and a tab-indented file line: cut before
	// a function line.
	cut := strings.LastIndexByte(s[:MaxStackText-len(mark)], '\n')
	for cut > 0 && s[cut+1] == '\t' {
		cut = strings.LastIndexByte(s[:cut], '\n')
	}
	if cut <= 0 {
		cut = MaxStackText - len(mark)
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
	}
	return s[:cut] + mark
}

// RejectedStop is the outcome that replaces o when the database rejected
// it as data (see Rejected): a Stop of the same claim that records why. It
// is the one rule for rejected outcomes, whichever path wrote them.
func RejectedStop(o *Outcome, err error) Outcome {
	kind, msg := "outcome_rejected", ErrorText("outcome rejected by the database: "+err.Error())
	return Outcome{ID: o.ID, Token: o.Token, Kind: KindStop, ErrKind: &kind, Err: &msg}
}

// parentJoinCTE decrements the parents of the rows in CTE "changed" that
// became done or failed; the decrement that reaches zero wakes the parent.
// A child counts only against the fan-out generation it was scheduled in.
// Concurrent children of one parent serialize on the parent's row lock and
// each decrement applies to the newest value. A parent that still holds the
// lease of a cancelled step (retried while that lease lived and a child of
// its fan-out ran: retrySQL) wakes eligible when the lease ends, as the
// retry made it, not at once: its next step must not run beside the
// cancelled one (retryEligible). Nor before its own eligible time: a
// parent whose join failed and backs off (a Replay), put back to awaiting
// a child retried meanwhile (waitsForItsChildren), waits out the backoff
// (TestAReArmedParentKeepsTheBackoffOfItsJoin); any other awaiting parent's
// eligible time is its fan-out's or its retry's, not past now().
var parentJoinCTE = `parents AS (
  UPDATE {{schema}}.gendurable_instances AS p
  SET children_pending = greatest(0, p.children_pending - x.n),
      status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - x.n <= 0
                    THEN 'runnable' ELSE p.status END,
      eligible_at = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - x.n <= 0
                         THEN greatest(p.eligible_at,
                                       CASE WHEN p.lease_expires_at > now() THEN p.lease_expires_at ELSE now() END)
                         ELSE p.eligible_at END,
      updated_at = now()
  FROM (SELECT parent_id, parent_fanout, count(*)::int AS n FROM changed
        WHERE status IN ('done', 'failed') AND parent_id IS NOT NULL GROUP BY parent_id, parent_fanout) AS x
  -- Only a parent that awaits them, or a failed one (countsDown), counts
  -- its children down, and never below zero: one that went on past the
  -- fan-out (retried before the children it had seen fail, which were then
  -- retried on their own) was counted below zero by their finish.
  WHERE p.id = x.parent_id AND p.fanout = x.parent_fanout AND ` + countsDown("p") + `
  RETURNING p.id
)`

// countsDown is the condition on parent row alias that a finishing child
// of its current fan-out counts down (parentJoinCTE), and so the parents
// whose locks the look for held outcomes tries (lockedOutcomesSQL): one
// that awaits it, or a failed one, whose row the finish must lock so that
// a retry of it (which recounts its live children under that lock) and
// the finish take turns — a guard on a failed parent's count (> 0) lost
// that turn when the count had drifted, and a retried parent awaited a
// child that had finished (TestOperatorStormKeepsTheJoinCounts failed so
// once in a targeted run). So is a runnable one whose join has not run (its
// children_total above zero), for the same turn with a retry of a child
// that puts it back to awaiting its children (waitsForItsChildren): the
// retry counts the live children, and a child cancelled beside it that
// passed the parent by, unlocked, was counted live after it had failed
// (the storm test, once in ten runs). So, last, is one whose join is
// claimed (executing, its children_total above zero): a claim that finds
// a child of the fan-out live gives itself up and puts the parent back to
// awaiting its live children (Reawait), and a child finishing beside that
// must take its turn on the parent's lock and count down what it awaits;
// passing the parent by as executing on its snapshot, it left it awaiting
// a child that had finished. Counted down while its join runs, the parent
// only has its count lowered (not below zero; a Reawait counts afresh).
func countsDown(alias string) string {
	return `(` + alias + `.status = 'failed' OR ` + waitsForItsChildren(alias) +
		` OR ` + alias + `.status = 'executing' AND ` + alias + `.children_total > 0)`
}

// lockWaitIDs is the outcome statement's array of ids, read first: with
// @lock_wait set (milliseconds), it limits each of the statement's row lock
// waits (lock_timeout, for its own implicit transaction; a table lock is
// taken before the statement runs and waited for as before). It is set
// before any row is locked — the function scan of unnest evaluates its
// arguments before the lateral probes that lock run, and every other lock
// the statement takes hangs off those rows. A wait that runs out fails the statement with SQLSTATE 55P03
// (LockTimedOut) and nothing of it is written. NULL (a WithTx outcome, in
// the caller's transaction) leaves the session's setting alone. The group
// committer sets it so one row locked elsewhere cannot hold up a batch of
// unrelated outcomes (committer.Config.LockWait, docs/design.md §4).
var lockWaitIDs = `CASE WHEN @lock_wait::bigint IS NULL THEN @ids::bigint[]
                   WHEN ` + settingAtMost("lock_timeout", "@lock_wait::bigint") + ` IS NOT NULL
                   THEN @ids::bigint[] END`

// lengthFloor is an empty array that the outcome statement's unnest reads
// beside its batch, so that no plan estimates the batch at fewer rows than
// a generic plan does. The statement runs as a prepared statement, and
// PostgreSQL plans its first five runs with the values given (custom plans)
// before it weighs them against the one plan that serves any values (the
// generic plan). A custom plan estimates an array given as a constant at
// its length, the generic plan one given as a parameter at 10 rows, and an
// unnest of several arrays at the longest. Without this, every custom plan
// of a batch of fewer than 10 outcomes looked cheaper than the generic
// plan, and the statement was planned again on every run: 2.1 ms for one
// outcome against 0.7 ms on the generic plan (BenchmarkApplyOutcomes/done-1
// and BENCHMARKS.md). A scalar subquery's value is unknown to
// both plans (10 rows), so the two cost the same and the generic plan is
// kept; it is empty, so unnest pads its column with NULLs and the batch's
// length decides the rows.
const lengthFloor = `(SELECT '{}'::smallint[])`

// newRowColumns and newRowSelect are shared by inserts and children: the
// columns of a new instance and how each is computed from the unnest alias n.
//
// A keyed row's time is the statement's clock, read once (an InitPlan), not
// its transaction's now(): rows of one key run in (priority, eligible_at)
// order, and two statements of one transaction would otherwise tie (within
// one statement the rows of a key are spaced a microsecond apart, newRows.add).
// A plain row keeps now(): the pick's floor reckons with a row committed
// a little after its transaction's now() (docs/design.md §4), and plain rows
// have no order to keep.
const newRowColumns = `fsm, fsm_version, queue, step, state, priority, max_attempts, eligible_at,
   partition_key, unique_key, unique_scope, key_limit`

const newRowSelect = `n.fsm, n.fsm_version, n.queue, n.step, n.state::jsonb, n.priority, n.max_attempts,
       coalesce(n.run_at, CASE WHEN n.partition_key IS NULL THEN now() ELSE (SELECT clock_timestamp()) END
                          + n.run_in_us * interval '1 microsecond'), n.partition_key,
       n.unique_key,
       CASE WHEN n.unique_key IS NOT NULL THEN ARRAY(
         SELECT e.s FROM unnest(enum_range(NULL::{{schema}}.gendurable_status)) WITH ORDINALITY AS e(s, k)
         WHERE n.scope_mask & (1 << (e.k::int - 1)) <> 0) END,
       n.key_limit`

// outcomeShape says which optional parts a batch needs: a batch of plain
// Next/Done outcomes runs a statement without the children, signal and
// fan-in parts rather than parts that find nothing (BenchmarkApplyOutcomes).
type outcomeShape uint8

const (
	shapeChildren outcomeShape = 1 << iota // some outcome schedules children
	shapeConsume                           // some outcome consumes signals
	shapeTerminal                          // some outcome is Done or Stop: sweep its inbox, join its parent
	shapeHandoff                           // some outcome may hand its key's slot to the key's next row
	shapeCount    = 1 << iota
)

// outcomeSQL is the outcome statement of one shape, with named parameters
// (@name) that bindNamed numbers and the kinds' values filled in.
func outcomeSQL(shape outcomeShape) string { return kindSQL.Replace(outcomeSQLTemplate(shape)) }

// outcomeSQLTemplate is the outcome statement of one shape as written, with
// the kinds as placeholders ({{next}}, {{done}}, …).
func outcomeSQLTemplate(shape outcomeShape) string {
	var b strings.Builder
	b.WriteString(`
WITH locked AS MATERIALIZED (
  -- One primary-key probe per outcome (the lateral subquery cannot be
  -- flattened, and its only condition is the id); the fence is checked on
  -- the locked, newest row version.
  -- A keyed row whose lease ran out goes on only through the queue: its
  -- key's slot may be another row's by now (docs/design.md §6). The lease
  -- is read after the row lock, on the clock of that moment.
  SELECT o.*, c.fanout, c.inbox <> '{}'::jsonb AS has_inbox,
         o.cont_asked AND (c.partition_key IS NULL OR c.lease_expires_at > clock_timestamp()) AS cont` +
		iff(shape&shapeTerminal != 0, `,
         c.inbox AS held_inbox`) +
		iff(shape&shapeHandoff != 0, `,
         c.partition_key AS pkey, c.queue AS pqueue, c.parent_id AS pparent`) + `
  FROM unnest(` + lockWaitIDs + `, @tokens::bigint[], @kinds::smallint[], @steps::text[], @states::text[],
              @delays::bigint[], @attempt_inc::int[], @results::text[], @err_kinds::text[], @errs::text[],
              @awaits::text[], @timeouts::bigint[], @inbox_dec::text[], @cont::bool[], @err_stacks::text[],
              @seen::text[], ` + lengthFloor +
		iff(shape&shapeHandoff != 0, `, @handoff::int[]`) + `)
         AS o(id, token, kind, step, state, delay_us, attempt_inc, result, err_kind, err, awaits, timeout_us,
              inbox_dec, cont_asked, err_stack, seen, length_floor` + iff(shape&shapeHandoff != 0, `, handoff`) + `)
  CROSS JOIN LATERAL (
    SELECT i.claim_token, i.status, i.fanout, i.inbox, i.partition_key, i.lease_expires_at` +
		iff(shape&shapeHandoff != 0, `, i.queue, i.parent_id`) + `
    FROM {{schema}}.gendurable_instances AS i
    WHERE i.id = o.id
    OFFSET 0 -- a fence: the outer conditions must not reach the scan
    FOR UPDATE
  ) AS c
  WHERE c.claim_token = o.token AND c.status = 'executing'
)`)
	// A continued row's next step gets its inbox from here (docs/design.md
	// §4). Signals this statement consumes still look unconsumed to it (one
	// snapshot): leave them out by id.
	continuedInbox, continuedSkip := inboxRowsSQL, `'{}'`
	if shape&shapeConsume != 0 {
		continuedSkip = `@consume_id::bigint[]`
		continuedInbox = strings.Replace(inboxRowsSQL, "s.consumed_at IS NULL",
			"s.consumed_at IS NULL AND s.id <> ALL (@consume_id::bigint[])", 1)
	}
	kids := "0"
	if shape&(shapeChildren|shapeConsume) != 0 {
		b.WriteString(`, held AS (
  -- id -> fan-out generation of every outcome whose fence held: a lookup
  -- table for the array-driven parts below, so none joins two arrays.
  SELECT coalesce(jsonb_object_agg(id, fanout), '{}') AS m FROM locked
)`)
	}
	if shape&shapeChildren != 0 {
		kids = "coalesce(((SELECT m FROM kid_counts) ->> l.id::text)::int, 0)"
		// Children take their ids in the order the steps listed them (the
		// order Run.Children shows them in), drawn before the insert, and go
		// in in the order of their unique keys, as InsertMany's rows do
		// (insertKeyedTailSQL): two fan-outs, or a fan-out and an InsertMany,
		// of overlapping keys in other orders each waited for the other (a
		// probe: lock timeouts and fenced-out fan-outs, InsertMany calls
		// failing with a deadlock).
		b.WriteString(`, kids AS (
  INSERT INTO {{schema}}.gendurable_instances (id, ` + newRowColumns + `, parent_id, parent_fanout)
  OVERRIDING SYSTEM VALUE
  SELECT n.id, ` + newRowSelect + `, n.parent, ((SELECT m FROM held) ->> n.parent::text)::int + 1
  FROM (
    SELECT u.*, nextval((SELECT pg_get_serial_sequence('{{schema}}.gendurable_instances', 'id')::regclass)) AS id
    FROM unnest(@kid_parent::bigint[], @kid_fsm::text[], @kid_version::int[], @kid_queue::text[], @kid_step::text[],
                @kid_state::text[], @kid_priority::smallint[], @kid_max_attempts::int[], @kid_run_at::timestamptz[],
                @kid_run_in::bigint[], @kid_partition::text[], @kid_unique::bytea[], @kid_scope::int[],
                @kid_key_limit::int[])
         WITH ORDINALITY AS u(parent, fsm, fsm_version, queue, step, state, priority, max_attempts, run_at,
                              run_in_us, partition_key, unique_key, scope_mask, key_limit, ord)
    WHERE (SELECT m FROM held) ? u.parent::text
    ORDER BY u.ord
    OFFSET 0 -- ids drawn here, in the steps' order
  ) AS n
  ORDER BY n.unique_key, n.ord
  ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING
  RETURNING parent_id
), kid_counts AS (
  SELECT coalesce(jsonb_object_agg(parent_id, n), '{}') AS m
  FROM (SELECT parent_id, count(*)::int AS n FROM kids GROUP BY parent_id) AS k
)`)
	}
	if shape&shapeConsume != 0 {
		b.WriteString(`, consumed AS (
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM unnest(@consume_owner::bigint[], @consume_id::bigint[]) AS c(owner, sid)
  WHERE (SELECT m FROM held) ? c.owner::text
    AND s.id = c.sid AND s.target_id = c.owner AND s.consumed_at IS NULL
  RETURNING s.id
)`)
	}
	if shape&shapeTerminal != 0 {
		// A row whose inbox counts are empty has no unconsumed signal: every
		// signal bumps them under the row lock this statement holds.
		// It sweeps the signals of this statement's snapshot. A signal that
		// committed after the snapshot was taken, while this statement
		// waited for the row lock the signal held, is in the locked row's
		// counts but not in the snapshot: resweep reports it, and the
		// caller sweeps again in a statement of its own (ApplyOutcomes).
		b.WriteString(`, swept AS (
  UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
  FROM locked AS o
  WHERE o.kind IN ({{done}}, {{stop}}) AND o.has_inbox AND s.target_id = o.id AND s.consumed_at IS NULL
  RETURNING s.target_id
)`)
	}
	resweep := "false"
	if shape&shapeTerminal != 0 {
		resweep = `(o.kind IN ({{done}}, {{stop}}) AND o.has_inbox
              AND ` + heldSignals(`o.held_inbox`) + `
                  > (SELECT count(*) FROM swept AS w WHERE w.target_id = o.id))`
	}
	b.WriteString(`, changed AS (
  UPDATE {{schema}}.gendurable_instances AS i
  SET status = (CASE o.kind
        WHEN {{next}} THEN CASE WHEN o.cont THEN 'executing' ELSE 'runnable' END
        WHEN {{replay}} THEN 'runnable' WHEN {{done}} THEN 'done' WHEN {{stop}} THEN 'failed'
        WHEN {{await}} THEN CASE WHEN {{schema}}.gendurable_inbox_sub(i.inbox, o.inbox_dec::jsonb)
                                ?| ARRAY(SELECT jsonb_array_elements_text(o.awaits::jsonb))
                         THEN 'runnable' ELSE 'awaiting_signal' END
        ELSE CASE WHEN o.kids = 0 THEN 'runnable' ELSE 'awaiting_children' END
      END)::{{schema}}.gendurable_status,
      step = coalesce(o.step, i.step),
      state = coalesce(o.state::jsonb, i.state),
      attempt = CASE o.kind WHEN {{replay}} THEN i.attempt + o.attempt_inc WHEN {{done}} THEN i.attempt
                         WHEN {{stop}} THEN i.attempt ELSE 0 END,
      eligible_at = CASE WHEN o.kind IN ({{next}}, {{replay}}) THEN now() + o.delay_us * interval '1 microsecond'
                         WHEN o.kind IN ({{await}}, {{children}}) THEN now() ELSE i.eligible_at END,
      result = CASE WHEN o.kind = {{done}} THEN o.result::jsonb ELSE i.result END,
      -- A Stop of a step past an await keeps an empty list: a retry runs
      -- it as after a timeout, shown its inbox (retryStatusSet).
      awaits = CASE o.kind WHEN {{replay}} THEN i.awaits
                           WHEN {{await}} THEN ARRAY(SELECT jsonb_array_elements_text(o.awaits::jsonb))
                           WHEN {{stop}} THEN CASE WHEN i.awaits IS NOT NULL THEN '{}'::text[] END END,
      await_deadline = CASE WHEN o.kind = {{await}} AND o.timeout_us IS NOT NULL
                            THEN now() + o.timeout_us * interval '1 microsecond' END,
      -- What the parking step had received, for the step its timeout wakes
      -- (migration 018): kept through a Replay, gone with any other outcome.
      inbox_seen = CASE o.kind WHEN {{await}} THEN o.seen::jsonb WHEN {{replay}} THEN i.inbox_seen END,
      inbox = CASE WHEN o.kind IN ({{done}}, {{stop}}) THEN '{}'::jsonb
                   WHEN o.kind IN ({{next}}, {{children}}) AND o.inbox_dec IS NOT NULL
                     THEN {{schema}}.gendurable_inbox_sub(i.inbox, o.inbox_dec::jsonb)
                   ELSE i.inbox END,
      children_total = CASE o.kind WHEN {{replay}} THEN i.children_total WHEN {{stop}} THEN i.children_total
                                   WHEN {{children}} THEN o.kids ELSE 0 END,
      children_pending = CASE o.kind WHEN {{children}} THEN o.kids ELSE i.children_pending END,
      fanout = CASE o.kind WHEN {{children}} THEN i.fanout + 1 ELSE i.fanout END,
      lease_expires_at = CASE WHEN o.cont THEN now() + @lease::bigint * interval '1 microsecond' END,
      claim_token = o.new_token,
      -- A chained step's claim, as the pick's: no heartbeat has confirmed
      -- it started (schema version 24; docs/design.md §4).
      unstarted_token = CASE WHEN o.cont THEN -1 ELSE i.unstarted_token END,
      -- What a statement sent again after its answer was lost looks for
      -- (migration 019; RecoverOutcomes).
      outcome_token = o.token,
      chain_token = o.new_token,
      finished_at = CASE WHEN o.kind IN ({{done}}, {{stop}}) THEN now() END,
      updated_at = now(),
      errors = CASE WHEN o.err IS NULL THEN i.errors
               ELSE (CASE WHEN jsonb_array_length(i.errors) >= @max_errors THEN i.errors - 0 ELSE i.errors END)
                    || jsonb_build_array(jsonb_build_object(
                         'step', i.step, 'attempt', i.attempt, 'at', now(),
                         'kind', o.err_kind, 'error', o.err)
                       || CASE WHEN o.err_stack IS NULL THEN '{}'::jsonb
                               ELSE jsonb_build_object('stack', o.err_stack) END) END
  -- A chained step's claim token is drawn once, for its claim_token and
  -- its chain_token.
  FROM (SELECT l.*, ` + kids + ` AS kids,
               CASE WHEN l.cont THEN nextval('{{schema}}.gendurable_claim_token_seq') END AS new_token
        FROM locked AS l) AS o
  WHERE i.id = o.id
  RETURNING i.id, i.status, i.parent_id, i.parent_fanout, i.queue, i.claim_token, i.partition_key,
            CASE WHEN o.cont THEN ` + freshInbox(continuedInbox, `i`, continuedSkip) + ` END AS inbox_rows,
            ` + resweep + ` AS resweep
)`)
	if shape&shapeTerminal != 0 {
		b.WriteString(", " + parentJoinCTE)
	}
	if shape&shapeHandoff == 0 {
		b.WriteString(`
SELECT id, status::text, queue, claim_token, inbox_rows, resweep FROM changed`)
		return b.String()
	}
	// The key hand-off (docs/design.md §6): the freed keyed rows whose
	// outcome allows it (handoff: the key's policy limit as the engine sees
	// it) pass their keys to gendurable_handoff (migrations 010, 018), which claims
	// each key's next rows, one for one, under the pick's per-key lock. It
	// leaves out of its holders the rows this statement frees, and out of its
	// candidates every row this statement writes (its outcome rows, their
	// parents), whichever runs first. The successors come back after the
	// outcomes, with succ set; the caller matches them to the freed rows by
	// (queue, key).
	b.WriteString(`, handoff AS MATERIALIZED (
  SELECT h.c, h.inbox_rows, h.child_rows
  FROM (SELECT array_agg(l.pkey) FILTER (WHERE l.a) AS keys, array_agg(l.pqueue) FILTER (WHERE l.a) AS queues,
               array_agg(l.handoff) FILTER (WHERE l.a) AS limits,
               coalesce(array_agg(l.id) FILTER (WHERE NOT l.cont), '{}') AS freed,
               array_agg(l.id) || coalesce(array_agg(l.pparent) FILTER (WHERE l.pparent IS NOT NULL), '{}') AS skip
        FROM (SELECT l.*, l.handoff > 0 AND NOT l.cont AND l.pkey IS NOT NULL AS a FROM locked AS l) AS l) AS x
  CROSS JOIN LATERAL {{schema}}.gendurable_handoff(x.keys, x.queues, x.limits, x.freed, x.skip,
                                                  @lease::bigint) AS h
  WHERE x.keys IS NOT NULL
)
SELECT false AS succ, id, status::text, queue, claim_token, inbox_rows, partition_key,
       NULL::text AS fsm, NULL::int AS fsm_version, NULL::text AS step, NULL::jsonb AS state, NULL::int AS attempt,
       NULL::int AS max_attempts, NULL::smallint AS priority, NULL::text[] AS awaits, NULL::int AS children_total,
       NULL::timestamptz AS inserted_at, NULL::jsonb AS child_rows, resweep, NULL::jsonb AS inbox_seen
FROM changed
UNION ALL
SELECT true, (h.c).id, 'executing', (h.c).queue, (h.c).claim_token, ` + freshInbox(`h.inbox_rows`, `(h.c)`, `'{}'`) + `, (h.c).partition_key,
       (h.c).fsm, (h.c).fsm_version, (h.c).step, (h.c).state, (h.c).attempt,
       (h.c).max_attempts, (h.c).priority, (h.c).awaits, (h.c).children_total,
       (h.c).inserted_at, h.child_rows, false, (h.c).inbox_seen
FROM handoff AS h`)
	return b.String()
}

// heldSignals is, in a finishing statement, the number of unconsumed
// signals the inbox counts inbox say the row held, read under its lock.
// Every signal bumps the counts under the row lock, so a signal that
// committed while the statement waited for the lock is counted there but is
// not in the statement's snapshot, which its sweep reads: a finishing
// statement (outcome, Cancel, CancelMany, Reap) whose sweep consumed fewer
// signals of a row than this reports the row to be swept again, in a
// statement of its own (SweepInboxes).
func heldSignals(inbox string) string {
	return `(SELECT coalesce(sum(n.value::int), 0) FROM jsonb_each_text(` + inbox + `) AS n)`
}

// iff is s if cond, else "".
func iff(cond bool, s string) string {
	if cond {
		return s
	}
	return ""
}

// namedStmt is a statement whose parameters were written @name: SQL holds
// them numbered in order of first use, Params their names in that order.
type namedStmt struct {
	SQL    string
	Params []string
}

var namedParamRE = regexp.MustCompile(`@[a-z_]+`)

// bindNamed numbers a statement's @name parameters.
func bindNamed(sql string) namedStmt {
	var st namedStmt
	index := map[string]int{}
	st.SQL = namedParamRE.ReplaceAllStringFunc(sql, func(m string) string {
		name := m[1:]
		n, ok := index[name]
		if !ok {
			st.Params = append(st.Params, name)
			n = len(st.Params)
			index[name] = n
		}
		return "$" + strconv.Itoa(n)
	})
	return st
}

// Outcome is one encoded outcome, ready for the batch statement.
type Outcome struct {
	ID         int64
	Token      int64
	Kind       Kind
	Step       *string // nil keeps the current step
	State      *string // JSON; nil keeps the current state
	Delay      time.Duration
	AttemptInc int32   // replay only: 1, or 0 for a snooze
	Result     *string // JSON; done only
	ErrKind    *string // with Err: recorded in the error history
	Err        *string
	ErrStack   *string        // with Err: a panic's stack trace (StackText), recorded beside it
	Awaits     *string        // await: JSON array of names
	Timeout    *time.Duration // await: deadline after now
	InboxDec   *string        // JSON name → count: consumed (next, children) or already seen (await)
	Seen       *string        // await: JSON array of the ids of the signals counted in InboxDec
	Consume    []int64        // ids of signals consumed (next, children)
	Children   []NewInstance  // children: rows to insert under this parent
	// Continue (next only, no delay): the instance stays claimed by this
	// worker under a fresh claim token and lease, so it can run its next
	// step at once without a pick.
	Continue bool
	// Handoff, if above 0, lets an outcome that frees a keyed row's slot
	// claim the key's next eligible row in the same statement (the key
	// hand-off, docs/design.md §6): it is the key's policy limit as the
	// engine sees it (1 without a policy); a row's own key_limit wins.
	// Applied.Successor is what it claimed.
	Handoff int32
}

// OutcomeBatch is a reusable set of column arrays for ApplyOutcomes.
type OutcomeBatch struct {
	ids, tokens             []int64
	kinds                   []int16
	steps, states           []*string
	delays                  []int64
	attemptInc              []int32
	results, errKind, err   []*string
	errStack                []*string
	awaits, inboxDec, seen  []*string
	timeouts                []*int64
	consumeOwner, consumeID []int64
	children                newRows
	childParent             []int64
	cont                    []bool
	handoff                 []int32
	// Lease is the lease given to continued outcomes.
	Lease time.Duration
	// LockWait, if above 0, limits each lock wait of the statement (see
	// lockWaitIDs); rounded up to whole milliseconds.
	LockWait time.Duration
}

// Reset empties the batch, keeping its capacity.
func (b *OutcomeBatch) Reset() {
	b.ids, b.tokens, b.kinds = b.ids[:0], b.tokens[:0], b.kinds[:0]
	b.steps, b.states, b.delays = b.steps[:0], b.states[:0], b.delays[:0]
	b.attemptInc, b.results, b.errKind, b.err = b.attemptInc[:0], b.results[:0], b.errKind[:0], b.err[:0]
	b.errStack = b.errStack[:0]
	b.awaits, b.inboxDec, b.seen, b.timeouts = b.awaits[:0], b.inboxDec[:0], b.seen[:0], b.timeouts[:0]
	b.consumeOwner, b.consumeID, b.childParent = b.consumeOwner[:0], b.consumeID[:0], b.childParent[:0]
	b.cont, b.handoff = b.cont[:0], b.handoff[:0]
	b.children.reset()
}

// Len is the number of outcomes in the batch.
func (b *OutcomeBatch) Len() int { return len(b.ids) }

// Add appends one outcome.
func (b *OutcomeBatch) Add(o *Outcome) {
	b.ids = append(b.ids, o.ID)
	b.tokens = append(b.tokens, o.Token)
	b.kinds = append(b.kinds, int16(o.Kind))
	b.steps = append(b.steps, o.Step)
	b.states = append(b.states, o.State)
	b.delays = append(b.delays, micros(o.Delay))
	b.attemptInc = append(b.attemptInc, o.AttemptInc)
	b.results = append(b.results, o.Result)
	b.errKind = append(b.errKind, o.ErrKind)
	b.err = append(b.err, o.Err)
	b.errStack = append(b.errStack, o.ErrStack)
	b.awaits = append(b.awaits, o.Awaits)
	b.inboxDec = append(b.inboxDec, o.InboxDec)
	b.seen = append(b.seen, o.Seen)
	b.cont = append(b.cont, o.Continue && o.Kind == KindNext && o.Delay <= 0)
	b.handoff = append(b.handoff, max(o.Handoff, 0))
	var timeout *int64
	if o.Timeout != nil {
		t := micros(*o.Timeout)
		timeout = &t
	}
	b.timeouts = append(b.timeouts, timeout)
	for _, sid := range o.Consume {
		b.consumeOwner = append(b.consumeOwner, o.ID)
		b.consumeID = append(b.consumeID, sid)
	}
	for i := range o.Children {
		b.childParent = append(b.childParent, o.ID)
		b.children.add(&o.Children[i])
	}
}

// shape is which optional parts of the outcome statement the batch needs.
func (b *OutcomeBatch) shape() outcomeShape {
	var sh outcomeShape
	if len(b.childParent) > 0 {
		sh |= shapeChildren
	}
	if len(b.consumeID) > 0 {
		sh |= shapeConsume
	}
	for _, k := range b.kinds {
		if Kind(k) == KindDone || Kind(k) == KindStop {
			sh |= shapeTerminal
			break
		}
	}
	for _, h := range b.handoff {
		if h > 0 {
			sh |= shapeHandoff
			break
		}
	}
	return sh
}

// arg is the value of one named parameter of the outcome statement.
func (b *OutcomeBatch) arg(name string) any {
	c := &b.children
	switch name {
	case "ids":
		return b.ids
	case "tokens":
		return b.tokens
	case "kinds":
		return b.kinds
	case "steps":
		return b.steps
	case "states":
		return b.states
	case "delays":
		return b.delays
	case "attempt_inc":
		return b.attemptInc
	case "results":
		return b.results
	case "err_kinds":
		return b.errKind
	case "errs":
		return b.err
	case "err_stacks":
		return b.errStack
	case "awaits":
		return b.awaits
	case "timeouts":
		return b.timeouts
	case "inbox_dec":
		return b.inboxDec
	case "seen":
		return b.seen
	case "cont":
		return b.cont
	case "handoff":
		return b.handoff
	case "lease":
		return micros(b.Lease)
	case "lock_wait":
		if b.LockWait <= 0 {
			return nil
		}
		return min((b.LockWait + time.Millisecond - 1).Milliseconds(), math.MaxInt32)
	case "max_errors":
		return MaxErrorHistory
	case "kid_parent":
		return b.childParent
	case "kid_fsm":
		return c.fsm
	case "kid_version":
		return c.version
	case "kid_queue":
		return c.queue
	case "kid_step":
		return c.step
	case "kid_state":
		return c.state
	case "kid_priority":
		return c.priority
	case "kid_max_attempts":
		return c.maxAttempts
	case "kid_run_at":
		return c.runAt
	case "kid_run_in":
		return c.runIn
	case "kid_partition":
		return c.partition
	case "kid_unique":
		return c.uniqueKey
	case "kid_scope":
		return c.scopeMask
	case "kid_key_limit":
		return c.keyLimit
	case "consume_owner":
		return b.consumeOwner
	case "consume_id":
		return b.consumeID
	}
	panic("sqlq: unknown outcome parameter " + name)
}

// outcomeStatement is the outcome statement for this batch's shape and its
// parameters, in order.
func (q *Queries) outcomeStatement(b *OutcomeBatch) (string, []any) {
	st := &q.applyOutcomes[b.shape()]
	args := make([]any, len(st.Params))
	for i, name := range st.Params {
		args[i] = b.arg(name)
	}
	return st.SQL, args
}

// Applied is one outcome whose fence held, with the status it produced.
type Applied struct {
	ID     int64
	Status string
	Queue  string
	Token  *int64      // a continued outcome's new claim token
	Inbox  []SignalRow // a continued outcome: the unconsumed signals, for its next step
	// Successor is the row of the same key and queue that this outcome's
	// statement claimed in its place (Outcome.Handoff), held like a
	// pick's claim: executing under its own claim token and a lease that
	// began when the statement's transaction did.
	Successor *Claimed
}

// Runnable reports that the outcome left its instance runnable.
func (a *Applied) Runnable() bool { return a.Status == "runnable" }

// AwaitingSignal reports that the outcome parked its instance for a signal.
func (a *Applied) AwaitingSignal() bool { return a.Status == "awaiting_signal" }

// ApplyOutcomes applies the batch in one statement and returns the outcomes
// whose fence held. An id missing from the answer was not written: its claim
// token no longer matched (the lease was reaped and the row claimed again, or
// an operator moved it), so that step's outcome is dropped whole.
//
// A batch with hand-offs (Outcome.Handoff) also claims successors: each
// comes back on the Applied of a freed row of its key and queue whose
// outcome allowed it, one for one.
func (q *Queries) ApplyOutcomes(ctx context.Context, db DB, b *OutcomeBatch) ([]Applied, error) {
	applied, resweep, err := q.applyOutcomes1(ctx, db, b)
	if err != nil || len(resweep) == 0 {
		return applied, err
	}
	// A finishing outcome whose statement waited for its row while a
	// signal's transaction held it, and committed: that signal is not in
	// the statement's snapshot, so the statement's sweep of the inbox
	// missed it. Sweep again, on a fresh snapshot: the rows are finished,
	// so no signal can arrive after this one (the signal statement refuses
	// a finished instance under the row lock) unless a Retry made a row
	// live again meanwhile, which the sweep then leaves alone
	// (sweepInboxesSQL).
	if serr := q.SweepInboxes(ctx, db, resweep); serr != nil {
		if _, inTx := db.(pgx.Tx); inTx {
			return nil, serr // the caller's transaction is aborted: nothing was written
		}
		// The outcomes are committed: only the sweep failed. A Retry of
		// such an instance sweeps what is left (retrySQL).
	}
	return applied, nil
}

// SweepInboxes marks every unconsumed signal of the instances ids that are
// still finished consumed (see sweepInboxesSQL). It completes the sweep of
// a finishing statement that waited for a row whose signal committed
// meanwhile, and reported it (see heldSignals, ApplyOutcomes, Cancel,
// CancelMany, Reap).
func (q *Queries) SweepInboxes(ctx context.Context, db DB, ids []int64) error {
	_, err := db.Exec(ctx, q.sweepInboxes, ids)
	return err
}

// RecoverOutcomes finds, among outcomes (ids with their claim tokens) that
// a statement found fenced out, those an earlier attempt of the same
// statement wrote: its connection lost the answer after the server had
// committed (migration 019). Each comes back as ApplyOutcomes would have
// returned it then, with the row's status and queue as they are now; a
// chained step's new claim token and inbox only while that claim is still
// the row's claim (its claim_token is the chain_token the attempt drew) and
// its lease lives, and never for an outcome the attempt wrote without
// chaining. The group committer asks after a retry that followed an
// attempt whose fate it could not know; only then may an outcome be
// fenced out by its own write. One primary-key probe per outcome, no lock.
func (q *Queries) RecoverOutcomes(ctx context.Context, db DB, ids, tokens []int64) ([]Applied, error) {
	rows, err := db.Query(ctx, q.recoverOutcomes, ids, tokens)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Applied, error) {
		var a Applied
		var inbox []byte
		err := row.Scan(&a.ID, &a.Status, &a.Queue, &a.Token, &inbox)
		if err == nil {
			a.Inbox, err = decodeInbox(inbox)
		}
		return a, err
	})
}

// recoverOutcomesSQL is RecoverOutcomes' statement: outcome_token names the
// outcome a row's last outcome statement wrote, chain_token the claim it
// drew for a chained step (019_outcome_tokens.up.sql).
const recoverOutcomesSQL = `
SELECT i.id, i.status::text, i.queue,
       CASE WHEN i.chained THEN i.claim_token END,
       CASE WHEN i.chained AND i.inbox <> '{}'::jsonb THEN ` + inboxRowsSQL + ` END
FROM unnest($1::bigint[], $2::bigint[]) AS u(id, token)
CROSS JOIN LATERAL (
  SELECT i.id, i.status, i.queue, i.claim_token, i.inbox, i.outcome_token,
         i.chain_token IS NOT NULL AND i.claim_token = i.chain_token AND i.status = 'executing'
           AND i.lease_expires_at > now() AS chained
  FROM {{schema}}.gendurable_instances AS i
  WHERE i.id = u.id
  OFFSET 0
) AS i
WHERE i.outcome_token = u.token`

// LockedOutcomes returns the ids, among the outcomes' ids (with their
// claim tokens), whose row another transaction holds locked at this moment,
// or whose parent it does where the outcome finishes its row (terminal, in
// step with ids: a Done or Stop whose fence holds joins its parent's
// fan-in). It waits on no lock: the group committer asks after an outcome
// statement ran out of its lock wait (OutcomeBatch.LockWait), to take those
// outcomes out of the batch and write the rest at once, and again as it
// waits for them. The answer may be stale by the time it is used (a lock
// taken or let go since); the committer treats it as a hint.
func (q *Queries) LockedOutcomes(ctx context.Context, db DB, ids, tokens []int64, terminal []bool) ([]int64, error) {
	rows, err := db.Query(ctx, q.lockedOutcomes, ids, tokens, terminal)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// lockedOutcomesSQL tries, without waiting (SKIP LOCKED), the locks the
// outcome statement would take: first the parent of each finishing outcome
// whose fence holds and whose parent is there with the child's fan-out,
// awaiting it or cancelled while it did (FOR NO KEY UPDATE, as its fan-in update does; a
// parent gone, of another fan-out, or gone on past it, is not waited for
// by the statement and is not tried),
// a few rows; then, for the outcomes not already named by a held parent,
// the outcome's own row (FOR UPDATE, as the statement does) — so the rows
// of children waiting on one held parent are not locked each round, which
// would make a heartbeat pass over them. It returns the ids that could not
// have one of them: one primary-key probe per id and per parent, behind
// OFFSET 0 fences. The locks go with the statement's own implicit
// transaction.
var lockedOutcomesSQL = `
WITH o AS MATERIALIZED (
  SELECT u.id, x.parent_id, x.parent_fanout
  FROM unnest($1::bigint[], $2::bigint[], $3::bool[]) AS u(id, token, terminal) CROSS JOIN LATERAL (
    SELECT CASE WHEN u.terminal AND i.claim_token = u.token AND i.status = 'executing' THEN i.parent_id END AS parent_id,
           i.parent_fanout
    FROM {{schema}}.gendurable_instances AS i WHERE i.id = u.id OFFSET 0) AS x
), p AS MATERIALIZED (
  SELECT d.id, d.fanout
  FROM (SELECT DISTINCT parent_id AS id, parent_fanout AS fanout FROM o WHERE parent_id IS NOT NULL) AS d
  CROSS JOIN LATERAL (
    SELECT e.fanout, e.status, e.children_pending, e.children_total FROM {{schema}}.gendurable_instances AS e WHERE e.id = d.id OFFSET 0) AS e
  WHERE e.fanout = d.fanout AND ` + countsDown("e") + `
    AND NOT EXISTS (
    SELECT 1 FROM {{schema}}.gendurable_instances AS l WHERE l.id = d.id OFFSET 0 FOR NO KEY UPDATE SKIP LOCKED)
)
SELECT o.id FROM o
WHERE CASE WHEN (o.parent_id, o.parent_fanout) IN (SELECT id, fanout FROM p) THEN true
           ELSE NOT EXISTS (SELECT 1 FROM {{schema}}.gendurable_instances AS l WHERE l.id = o.id OFFSET 0
                            FOR UPDATE SKIP LOCKED) END`

// sweepInboxesSQL marks the unconsumed signals of the instances $1 that
// are still finished consumed: one primary-key probe and one probe of the
// signals' inbox index (target_id, consumed_at IS NULL) per id, whatever
// the statistics say. It runs after the finish committed, so a Retry may
// have come in between, and a signal sent to the retried, live instance
// after it: that one is the instance's. Such a signal is in this
// statement's snapshot only if the retry is too (the signal statement
// refuses a finished instance under the row lock), so a row the snapshot
// sees live is left alone.
const sweepInboxesSQL = `
UPDATE {{schema}}.gendurable_signals AS s SET consumed_at = now()
FROM (SELECT x.id FROM unnest($1::bigint[]) AS u(id) CROSS JOIN LATERAL (
        SELECT i.id FROM {{schema}}.gendurable_instances AS i
        WHERE i.id = u.id AND i.status IN ('done', 'failed')
        OFFSET 0) AS f CROSS JOIN LATERAL (
        SELECT s.id FROM {{schema}}.gendurable_signals AS s
        WHERE s.target_id = f.id AND s.consumed_at IS NULL
        OFFSET 0) AS x) AS l
WHERE s.id = l.id AND s.consumed_at IS NULL -- rechecked on a version newer than the snapshot`

// applyOutcomes1 runs the outcome statement; resweep lists the finished
// rows whose inbox sweep missed a signal.
func (q *Queries) applyOutcomes1(ctx context.Context, db DB, b *OutcomeBatch) (out []Applied, resweep []int64, err error) {
	sql, args := q.outcomeStatement(b)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, err
	}
	if b.shape()&shapeHandoff == 0 {
		out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Applied, error) {
			var a Applied
			var inbox []byte
			var again bool
			err := row.Scan(&a.ID, &a.Status, &a.Queue, &a.Token, &inbox, &again)
			if err == nil {
				a.Inbox, err = decodeInbox(inbox)
			}
			if again {
				resweep = append(resweep, a.ID)
			}
			return a, err
		})
		return out, resweep, err
	}
	defer rows.Close()
	var keys []*string
	var succs []Claimed
	var queues []string // of succs
	for rows.Next() {
		var succ bool
		var a Applied
		var c Claimed
		var inbox, children, seen []byte
		// NULL in the outcome rows.
		var fsm, step *string
		var version, attempt, maxAttempts, kids *int32
		var priority *int16
		var inserted *time.Time
		var again bool
		if err := rows.Scan(&succ, &a.ID, &a.Status, &a.Queue, &a.Token, &inbox, &c.PartitionKey,
			&fsm, &version, &step, &c.State, &attempt, &maxAttempts, &priority, &c.Awaits,
			&kids, &inserted, &children, &again, &seen); err != nil {
			return nil, nil, err
		}
		if !succ {
			var err error
			if a.Inbox, err = decodeInbox(inbox); err != nil {
				return nil, nil, err
			}
			if again {
				resweep = append(resweep, a.ID)
			}
			out, keys = append(out, a), append(keys, c.PartitionKey)
			continue
		}
		if a.Token == nil || fsm == nil || step == nil || version == nil || attempt == nil || maxAttempts == nil ||
			priority == nil || kids == nil || inserted == nil {
			return nil, nil, fmt.Errorf("sqlq: hand-off row %d came back incomplete", a.ID)
		}
		c.ID, c.Token, c.FSM, c.Version, c.Step = a.ID, *a.Token, *fsm, *version, *step
		c.Attempt, c.MaxAttempts, c.Priority, c.Children, c.InsertedAt = *attempt, *maxAttempts, *priority, *kids, *inserted
		var err error
		if c.Seen, err = decodeSeen(seen); err != nil {
			return nil, nil, err
		}
		if c.Inbox, err = decodeInbox(inbox); err != nil {
			return nil, nil, err
		}
		if c.ChildRows, err = decodeChildren(children); err != nil {
			return nil, nil, err
		}
		succs, queues = append(succs, c), append(queues, a.Queue)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	b.matchSuccessors(out, keys, succs, queues)
	return out, resweep, nil
}

// matchSuccessors gives each successor to a row of its key and queue that
// the statement freed and whose outcome allowed a hand-off: the statement
// claimed at most one successor per such row. A successor that found no
// such row (none can) stays executing until its lease runs out, and the
// reaper takes it back.
func (b *OutcomeBatch) matchSuccessors(applied []Applied, keys []*string, succs []Claimed, queues []string) {
	if len(succs) == 0 {
		return
	}
	allowed := make(map[int64]bool, len(b.ids))
	for i, id := range b.ids {
		if b.handoff[i] > 0 {
			allowed[id] = true
		}
	}
	type slot struct{ queue, key string }
	waiting := map[slot][]*Applied{}
	for i := range applied {
		a := &applied[i]
		if allowed[a.ID] && keys[i] != nil && a.Status != "executing" {
			k := slot{a.Queue, *keys[i]}
			waiting[k] = append(waiting[k], a)
		}
	}
	for i := range succs {
		c := &succs[i]
		k := slot{queues[i], *c.PartitionKey}
		if w := waiting[k]; len(w) > 0 {
			w[0].Successor = c
			waiting[k] = w[1:]
		}
	}
}
