//go:build linux

package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OracleMachines are the machines whose every step writes an oracle row.
var OracleMachines = []string{"flow", "leaf", "waiter", "clock_sleep", "clock_await", "clock_long", "clock_hang"}

// Report is what the checker found in one scenario's schema.
type Report struct {
	Instances int // every row (top-level and children)
	TopLevel  int
	Parents   int // instances that scheduled children
	Done      int
	Failed    int
	Stuck     int // not terminal
	Lost      int // MissingRows + LostChildren + LostOutcomes

	MissingRows  int // inserted by the harness, gone from the table
	LostChildren int // a committed fan-out scheduled more children than exist
	LostOutcomes int // a done instance whose committed oracle rows do not cover seq 0..final

	Runs        int // step runs (side-effect rows)
	Committed   int // committed oracle rows
	Duplicates  int // runs beyond the first per (instance, seq)
	MultiCommit int // (instance, seq) with more than one committed oracle row
	TokenReuse  int // committed oracle rows sharing a claim token
	NullToken   int // committed oracle rows written while the row had no claim token

	// Overlaps counts the runs of a partition key that started while the
	// key already had its limit of runs active (spans: see spansCTE).
	Overlaps  int
	OpenSpans int // partitioned runs whose end is unknown (excluded from Overlaps)
	// CutAtStop: runs that lost their claim while their process was
	// stopped; their span ends at the stop (a frozen process is not
	// running; see spansCTE).
	CutAtStop int
	// OverlapsCountingStops is Overlaps with the stopped time of those runs
	// counted as running (informational: what a wall-clock span shows).
	OverlapsCountingStops int
	// StaleStarts counts the runs that started with a claim that was no
	// longer current (its row carried another token, or was not executing,
	// or its lease had run out on the database clock) — but not a claim an
	// operator's cancel fenced out while it waited to start, the row keeping
	// its lease (cancelled_before): such a run may start and run until its
	// worker's next heartbeat, as a running step cancelled does (its slot
	// stays taken, its outcome is fenced out) — nor a run woken from a stop
	// (WokeStarts).
	StaleStarts int
	// SlotExcess counts the keyed runs that started while their key's
	// limit of other rows held a slot (executing, lease not run out on the
	// database clock): the key lease itself let one too many in. Runs woken
	// from a stop (WokeStarts) are left out.
	SlotExcess int
	// WokeStarts (no violation) counts the runs whose step was entered
	// before its process was stopped (SIGSTOP) and whose start reached the
	// database only after the wake, within 2 s of it: the start is stamped
	// after the stop, when the claim may be gone and its slot given to
	// another row. This is the wake race docs/design.md §6 and
	// RELIABILITY.md state: a step entered just before a stop takes its
	// next action on waking, before its worker's heartbeat has seen the
	// claim lost. Such runs are not counted as stale starts or slot excess.
	WokeStarts int
	// Uncharged counts the reaps that charged no attempt (claims a
	// heartbeat had marked not started; docs/design.md §4, "Prefetched
	// claims"); UnchargedStarted those of them whose step had started (a
	// run recorded under the reaped claim's token): the gate broken.
	// Entries without a token (keyed claims a pick revoked) are not
	// checked, nor unconfirmed ones (claims no heartbeat had written,
	// schema version 24: their step may have started).
	// UnconfirmedTwice counts the unconfirmed uncharged reaps of a step
	// that had gone free so before (an earlier unconfirmed entry of the
	// same step with none of another step between, in the 20 entries the
	// history keeps): such a claim goes free once per step in a row. UnconfirmedStarted (no
	// violation, the rule's price) counts the unconfirmed ones whose step
	// had started.
	Uncharged, UnchargedStarted, Unconfirmed, UnconfirmedTwice, UnconfirmedStarted int
	// KeyPeaks: by key limit, the most runs of one key with that limit
	// that were active at once.
	KeyPeaks map[int]int

	// The fenced resource (chaos_fenced): writes offered, refused, and
	// accepted although the writer's claim was no longer current.
	FencedWrites  int
	FencedRefused int
	StaleAccepted int // accepted stale writes: the fence let a zombie through
	StaleFirst    int // with CheckOpts.StaleFirstAllowed: stale writes accepted before any write of a newer claim (not in StaleAccepted)
	staleFilter   string
	StaleRefused  int // stale writes the fence refused

	LostWakeUps int // parked instances holding a matching unconsumed signal
	FaninEarly  int // parents whose join step started before their last child finished
	FaninMulti  int // parents whose join step committed more than once
	FaninWrong  int // join saw a different number of children than exist, or unfinished ones
	OrphanLive  int // live children of a finished parent
	RoundsWrong int // done waiters that did not receive exactly their rounds of signals
	PastLease   int // executing rows whose lease expired more than the grace ago
	DoneByFsm   map[string]int
	FailedByFsm map[string]int
	Samples     []string  // a few offending ids, for the failure message
	At          time.Time // database clock when the check ran
}

// CheckOpts tune Check.
type CheckOpts struct {
	// PastLeaseGrace: an executing row counts in PastLease once its lease
	// expired longer ago than this (the reaper's interval plus slack).
	PastLeaseGrace time.Duration
	// StaleFirstAllowed: a stale write that reached the fenced resource
	// before any write of a newer claim of its key is accepted — a token
	// fence sees only the writes that reach it (RELIABILITY.md) — and is
	// counted in StaleFirst, not StaleAccepted. For scenarios where a
	// context-ignoring step keeps running while its key waits for the reap
	// (a cut-off process), not only after its successors ran (a stopped one).
	StaleFirstAllowed bool
}

// Check runs every check over schema.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, o CheckOpts) (*Report, error) {
	if o.PastLeaseGrace == 0 {
		o.PastLeaseGrace = 2 * time.Second
	}
	r := &Report{DoneByFsm: map[string]int{}, FailedByFsm: map[string]int{}, KeyPeaks: map[int]int{}}
	q := func(dst *int, stmt string, args ...any) error {
		if err := pool.QueryRow(ctx, SQL(schema, stmt), args...).Scan(dst); err != nil {
			return fmt.Errorf("chaos check: %w\n%s", err, stmt)
		}
		return nil
	}
	if err := pool.QueryRow(ctx, SQL(schema, `SELECT count(*), count(*) FILTER (WHERE parent_id IS NULL),
		count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed'),
		count(*) FILTER (WHERE status NOT IN ('done', 'failed')), clock_timestamp()
		FROM {{s}}.gendurable_instances`)).Scan(&r.Instances, &r.TopLevel, &r.Done, &r.Failed, &r.Stuck, &r.At); err != nil {
		return nil, fmt.Errorf("chaos check: %w", err)
	}
	rows, err := pool.Query(ctx, SQL(schema, `SELECT fsm, status::text, count(*) FROM {{s}}.gendurable_instances
		WHERE status IN ('done', 'failed') GROUP BY 1, 2`))
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var fsm, st string
		var n int
		if err := rows.Scan(&fsm, &st, &n); err != nil {
			rows.Close()
			return nil, err
		}
		if st == "done" {
			r.DoneByFsm[fsm] = n
		} else {
			r.FailedByFsm[fsm] = n
		}
	}
	rows.Close()

	staleAfterNewer := "" // every accepted stale write counts
	if o.StaleFirstAllowed {
		staleAfterNewer = ` AND EXISTS (SELECT 1 FROM {{s}}.chaos_fenced_log m WHERE m.key = l.key AND m.n < l.n AND m.token > l.token)`
	}
	r.staleFilter = staleAfterNewer
	checks := []struct {
		dst  *int
		stmt string
		args []any
	}{
		{&r.MissingRows, `SELECT count(*) FROM {{s}}.chaos_expected e
			WHERE NOT EXISTS (SELECT 1 FROM {{s}}.gendurable_instances i WHERE i.id = e.id)`, nil},
		{&r.Parents, `SELECT count(DISTINCT parent_id) FROM {{s}}.gendurable_instances WHERE parent_id IS NOT NULL`, nil},
		{&r.LostChildren, `SELECT count(*) FROM {{s}}.chaos_oracle o
			WHERE o.step = 'fanout' AND coalesce((o.note->>'scheduled')::int, 0) >
			      (SELECT count(*) FROM {{s}}.gendurable_instances c WHERE c.parent_id = o.instance)`, nil},
		{&r.LostOutcomes, `SELECT count(*) FROM {{s}}.gendurable_instances i WHERE ` + lostOutcome, []any{OracleMachines}},
		{&r.Runs, `SELECT count(*) FROM {{s}}.chaos_effects`, nil},
		{&r.Committed, `SELECT count(*) FROM {{s}}.chaos_oracle`, nil},
		{&r.Duplicates, `SELECT coalesce(sum(n - 1), 0)::int FROM
			(SELECT count(*) AS n FROM {{s}}.chaos_effects GROUP BY instance, seq) x`, nil},
		{&r.MultiCommit, `SELECT count(*) FROM
			(SELECT 1 FROM {{s}}.chaos_oracle GROUP BY instance, seq HAVING count(*) > 1) x`, nil},
		{&r.TokenReuse, `SELECT count(*) FROM
			(SELECT 1 FROM {{s}}.chaos_oracle WHERE token IS NOT NULL GROUP BY token HAVING count(*) > 1) x`, nil},
		{&r.NullToken, `SELECT count(*) FROM {{s}}.chaos_oracle WHERE token IS NULL`, nil},
		{&r.OpenSpans, spansCTE + `SELECT count(*) FROM spans WHERE ended IS NULL`, nil},
		{&r.CutAtStop, spansCTE + `SELECT count(*) FROM spans WHERE cut`, nil},
		{&r.Overlaps, spansCTE + excessCTE + `SELECT count(*) FROM excess`, nil},
		{&r.OverlapsCountingStops, rawSpansCTE + excessCTE + `SELECT count(*) FROM excess`, nil},
		{&r.StaleStarts, `SELECT count(*) FROM {{s}}.chaos_effects e WHERE ` + staleStart, nil},
		{&r.SlotExcess, `SELECT count(*) FROM {{s}}.chaos_effects e WHERE ` + slotExcess, nil},
		{&r.WokeStarts, `SELECT count(*) FROM {{s}}.chaos_effects e WHERE ` + wokeStart, nil},
		{&r.Uncharged, `SELECT count(*) FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x
			WHERE x @> '{"kind": "lease_expired", "uncharged": true}'`, nil},
		{&r.UnchargedStarted, `SELECT count(*) FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x
			WHERE ` + unchargedStarted, nil},
		{&r.Unconfirmed, `SELECT count(*) FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x
			WHERE x @> '{"kind": "lease_expired", "uncharged": true, "unconfirmed": true}'`, nil},
		{&r.UnconfirmedTwice, `SELECT count(*) FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) WITH ORDINALITY x(x, n)
			WHERE ` + unconfirmedTwice, nil},
		{&r.UnconfirmedStarted, `SELECT count(*) FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x
			WHERE x @> '{"unconfirmed": true}' AND EXISTS (
			  SELECT 1 FROM {{s}}.chaos_effects e WHERE e.instance = i.id AND e.token = (x->>'token')::bigint)`, nil},
		{&r.FencedWrites, `SELECT count(*) FROM {{s}}.chaos_fenced_log`, nil},
		{&r.FencedRefused, `SELECT count(*) FROM {{s}}.chaos_fenced_log WHERE NOT accepted`, nil},
		{&r.StaleAccepted, `SELECT count(*) FROM {{s}}.chaos_fenced_log l WHERE accepted AND NOT current` + staleAfterNewer, nil},
		{&r.StaleFirst, `SELECT count(*) FROM {{s}}.chaos_fenced_log l WHERE accepted AND NOT current AND $1::bool AND NOT EXISTS (
			SELECT 1 FROM {{s}}.chaos_fenced_log m WHERE m.key = l.key AND m.n < l.n AND m.token > l.token)`, []any{o.StaleFirstAllowed}},
		{&r.StaleRefused, `SELECT count(*) FROM {{s}}.chaos_fenced_log WHERE NOT accepted AND NOT current`, nil},
		{&r.LostWakeUps, `SELECT count(*) FROM {{s}}.gendurable_instances i WHERE ` + lostWakeUp, nil},
		{&r.FaninEarly, `SELECT count(*) FROM (
			  SELECT (SELECT max(c.finished_at) FROM {{s}}.gendurable_instances c WHERE c.parent_id = p.id) AS last_child,
			         (SELECT min(e.started) FROM {{s}}.chaos_effects e WHERE e.instance = p.id AND e.step = 'join') AS joined
			  FROM {{s}}.gendurable_instances p
			  WHERE EXISTS (SELECT 1 FROM {{s}}.gendurable_instances c WHERE c.parent_id = p.id)) x
			WHERE x.joined < x.last_child`, nil},
		{&r.FaninMulti, `SELECT count(*) FROM
			(SELECT 1 FROM {{s}}.chaos_oracle WHERE step = 'join' GROUP BY instance HAVING count(*) > 1) x`, nil},
		{&r.FaninWrong, `SELECT count(*) FROM {{s}}.chaos_oracle o
			WHERE o.step = 'join' AND o.fsm = 'flow' AND (
			  (o.note->>'terminal')::int <> (o.note->>'children')::int OR
			  (o.note->>'children')::int <> (SELECT count(*) FROM {{s}}.gendurable_instances c WHERE c.parent_id = o.instance))`, nil},
		{&r.OrphanLive, `SELECT count(*) FROM {{s}}.gendurable_instances c
			JOIN {{s}}.gendurable_instances p ON p.id = c.parent_id
			WHERE p.status IN ('done', 'failed') AND c.status NOT IN ('done', 'failed')`, nil},
		{&r.RoundsWrong, `SELECT count(*) FROM {{s}}.gendurable_instances i
			WHERE i.fsm = 'waiter' AND i.status = 'done' AND (
			  coalesce((i.result->>'rounds')::int, -1) <> (i.state->>'rounds')::int OR
			  (SELECT count(*) FROM {{s}}.gendurable_signals s WHERE s.target_id = i.id AND s.consumed_at IS NOT NULL)
			    <> (i.state->>'rounds')::int)`, nil},
		{&r.PastLease, `SELECT count(*) FROM {{s}}.gendurable_instances
			WHERE status = 'executing' AND lease_expires_at < now() - $1::bigint * interval '1 microsecond'`,
			[]any{o.PastLeaseGrace.Microseconds()}},
	}
	for _, c := range checks {
		if err := q(c.dst, c.stmt, c.args...); err != nil {
			return nil, err
		}
	}
	r.Lost = r.MissingRows + r.LostChildren + r.LostOutcomes
	rows, err = pool.Query(ctx, SQL(schema, spansCTE+runningCTE+`SELECT lim, max(n)::int FROM running GROUP BY lim`))
	if err != nil {
		return nil, fmt.Errorf("chaos check: key peaks: %w", err)
	}
	for rows.Next() {
		var lim, peak int
		if err := rows.Scan(&lim, &peak); err != nil {
			rows.Close()
			return nil, err
		}
		r.KeyPeaks[lim] = peak
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	r.sample(ctx, pool, schema)
	return r, nil
}

// spansCTE: partitioned step runs, each with its key's limit and the span
// in which it was running (database clock):
//
//   - it starts when its side-effect row is written;
//   - it ends when the run stamps its end (its work done, or its context
//     seen cancelled); a run of a killed process ends at the kill (recorded
//     just before SIGKILL);
//   - a run in flight when its process was stopped (SIGSTOP; recorded once
//     the process is stopped) ends at the stop if it lost its claim while
//     stopped — its context was cancelled with ErrLeaseLost, or its lease
//     ran out and was reaped: a frozen process is not running, and what the
//     run did after SIGCONT is the scenario's to check (how soon its work
//     ended, from work_end; its late writes, at the fenced resource; its
//     late outcome, by the fence). cut says so.
//
// Runs of steps that ignore their context (honours = false) are left out:
// nothing is promised about when they stop.
//
// A key's limit is its instance's key_limit, else the longest prefix of
// chaos_key_limits (the scenario's Config.KeyPolicies) it starts with,
// else 1. The scenarios give every instance of one key the same limit.
const spansCTE = `WITH spans AS (
  SELECT e.id, e.pkey, e.started, l.lim, st.at IS NOT NULL AS cut,
         CASE WHEN st.at IS NOT NULL THEN greatest(st.at, e.started) ELSE ` + spanEnd + ` END AS ended
  FROM {{s}}.chaos_effects e
  LEFT JOIN LATERAL (SELECT min(f.at) AS at FROM {{s}}.chaos_faults f
                     WHERE f.pid = e.pid AND f.kind = 'stop' AND f.at >= e.started - interval '1 second'
                       AND (e.ended IS NULL OR f.at < e.ended)
                       AND (e.cause = 'lease_lost' OR EXISTS (
                         SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x
                         WHERE i.id = e.instance AND x->>'kind' = 'lease_expired'
                           AND ((x->>'token')::bigint = e.token OR (x->>'token' IS NULL AND NOT x ? 'uncharged' AND (x->>'attempt')::int = e.attempt))))) st ON true
  CROSS JOIN LATERAL (SELECT ` + keyLimit + ` AS lim) l
  WHERE e.pkey IS NOT NULL AND e.honours
) `

// rawSpansCTE is spansCTE without the cut at a stop: the stopped time of a
// stopped run counts as running.
const rawSpansCTE = `WITH spans AS (
  SELECT e.id, e.pkey, e.started, l.lim, false AS cut, ` + spanEnd + ` AS ended
  FROM {{s}}.chaos_effects e
  CROSS JOIN LATERAL (SELECT ` + keyLimit + ` AS lim) l
  WHERE e.pkey IS NOT NULL AND e.honours
) `

// spanEnd is the end of run e's span: its end stamp, or the kill of its process.
const spanEnd = `coalesce(e.ended, (SELECT CASE WHEN min(f.at) IS NOT NULL THEN greatest(min(f.at), e.started) END FROM {{s}}.chaos_faults f
                            WHERE f.pid = e.pid AND f.kind = 'kill' AND f.at >= e.started - interval '1 second'))`

// keyLimit is the limit of run e's key.
const keyLimit = `coalesce((SELECT i.key_limit FROM {{s}}.gendurable_instances i WHERE i.id = e.instance),
                (SELECT p.lim FROM {{s}}.chaos_key_limits p WHERE starts_with(e.pkey, p.prefix)
                 ORDER BY length(p.prefix) DESC LIMIT 1),
                1)`

// runningCTE follows spansCTE: a sweep over each key's span starts (d = 1)
// and ends (d = -1) in time order, ends first at equal times (a run that
// ends as another starts does not overlap it); n is how many of the key's
// runs are active just after each event. Open and empty spans are left out.
const runningCTE = `, events AS (
  SELECT id, pkey, lim, started AS t, 1 AS d FROM spans WHERE ended > started
  UNION ALL
  SELECT id, pkey, lim, ended, -1 FROM spans WHERE ended > started
), running AS (
  SELECT id, pkey, lim, t, d, sum(d) OVER (PARTITION BY pkey ORDER BY t, d, id ROWS UNBOUNDED PRECEDING) AS n
  FROM events
) `

// excessCTE follows spansCTE: the runs that started while their key
// already had its limit of runs active (for a limit of 1, the runs that
// started while another of their key was running).
const excessCTE = runningCTE + `, excess AS (SELECT id, pkey, lim, t, n FROM running WHERE d = 1 AND n > lim) `

// Predicates shared by the counts and the samples.
const (
	// lostOutcome: instance i is done, but its committed oracle rows do not
	// cover every seq up to its final one ($1: the oracle machines).
	lostOutcome = `i.status = 'done' AND i.fsm = ANY ($1) AND
	  (SELECT count(DISTINCT o.seq) FROM {{s}}.chaos_oracle o
	   WHERE o.instance = i.id AND o.seq BETWEEN 0 AND coalesce((i.result->>'seq')::int, -1))
	  <> coalesce((i.result->>'seq')::int, -1) + 1`
	// wokeStart: run e's step was entered before a stop of its process and
	// its start reached the database after the stop, at most 2 s after the
	// wake (see Report.WokeStarts).
	wokeStart = `EXISTS (SELECT 1 FROM {{s}}.chaos_faults f WHERE f.pid = e.pid AND f.kind = 'stop'
	  AND e.entered < f.at AND e.started >= f.at AND f.until IS NOT NULL AND e.started < f.until + interval '2 seconds')`
	// staleStart: run e started with a claim no longer current, neither
	// fenced out by an operator's cancel just before nor woken from a stop.
	staleStart = `NOT e.claim_current AND NOT coalesce(e.cancelled_before, false) AND NOT ` + wokeStart
	// slotExcess: keyed run e started while its key's limit of other rows
	// held a slot, not woken from a stop.
	slotExcess = `e.pkey IS NOT NULL AND e.holders >= ` + keyLimit + ` AND NOT ` + wokeStart
	// ReapedClaim: error entry e (a lease_expired one) is the reap of run
	// z's claim (z a chaos_effects row): it names z's token, or — the claim
	// revoked by a pick of its key before the reaper came (docs/design.md
	// §6), which clears the token — z's attempt.
	// An uncharged entry leaves the attempt as it was, so only a charged
	// one stands for its attempt.
	ReapedClaim = `((e->>'token')::bigint = z.token OR (e->>'token' IS NULL AND NOT e ? 'uncharged' AND (e->>'attempt')::int = z.attempt))`
	// unchargedStarted: error entry x of instance i is a reap that charged
	// no attempt, of a claim under which a step started.
	unchargedStarted = `x @> '{"kind": "lease_expired", "uncharged": true}' AND NOT x ? 'unconfirmed' AND EXISTS (
	  SELECT 1 FROM {{s}}.chaos_effects e WHERE e.instance = i.id AND e.token = (x->>'token')::bigint)`
	// unconfirmedTwice: error entry x (number n) of instance i is an
	// unconfirmed uncharged reap after an earlier one of its step, with
	// none of another step between.
	unconfirmedTwice = `x @> '{"kind": "lease_expired", "uncharged": true, "unconfirmed": true}' AND EXISTS (
	  SELECT 1 FROM jsonb_array_elements(i.errors) WITH ORDINALITY y(y, m)
	  WHERE m < n AND y @> jsonb_build_object('kind', 'lease_expired', 'uncharged', true, 'unconfirmed', true, 'step', x->'step')
	    AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(i.errors) WITH ORDINALITY z(z, k)
	                    WHERE k > m AND k < n AND z @> '{"kind": "lease_expired", "uncharged": true, "unconfirmed": true}'
	                      AND z->'step' IS DISTINCT FROM x->'step'))`
	// lostWakeUp: instance i is parked on a name it holds an unconsumed signal of.
	lostWakeUp = `i.status = 'awaiting_signal' AND EXISTS (
	  SELECT 1 FROM {{s}}.gendurable_signals s
	  WHERE s.target_id = i.id AND s.consumed_at IS NULL AND s.name = ANY (i.awaits))`
)

// sample collects a few offending ids for a failure message.
func (r *Report) sample(ctx context.Context, pool *pgxpool.Pool, schema string) {
	add := func(label, stmt string, args ...any) {
		rows, err := pool.Query(ctx, SQL(schema, stmt), args...)
		if err != nil {
			r.Samples = append(r.Samples, label+": "+err.Error())
			return
		}
		defer rows.Close()
		var parts []string
		for rows.Next() {
			var s string
			if rows.Scan(&s) == nil {
				parts = append(parts, s)
			}
		}
		if len(parts) > 0 {
			r.Samples = append(r.Samples, label+": "+strings.Join(parts, "; "))
		}
	}
	if r.Stuck > 0 {
		add("stuck", `SELECT format('%s #%s %s at %s attempt %s eligible in %s errors %s', fsm, id, status, step, attempt,
			eligible_at - now(), left(errors::text, 300))
			FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed') ORDER BY id LIMIT 5`)
	}
	if r.MultiCommit > 0 {
		add("multi-commit", `SELECT format('#%s seq %s: %s commits', instance, seq, count(*)) FROM {{s}}.chaos_oracle
			GROUP BY instance, seq HAVING count(*) > 1 LIMIT 5`)
	}
	if r.LostOutcomes > 0 {
		add("lost outcome", `SELECT format('%s #%s final seq %s', i.fsm, i.id, i.result->>'seq') FROM {{s}}.gendurable_instances i
			WHERE `+lostOutcome+` LIMIT 5`, OracleMachines)
	}
	if r.Overlaps > 0 {
		add("overlap", spansCTE+excessCTE+`SELECT format('key %s (limit %s): run %s started at %s with %s running: %s', x.pkey, x.lim, x.id, x.t, x.n - 1,
			  (SELECT string_agg(format('run %s [%s, %s]%s', a.id, a.started, a.ended, CASE WHEN a.cut THEN ' cut at a stop' ELSE '' END), ', ' ORDER BY a.started)
			   FROM spans a WHERE a.pkey = x.pkey AND a.id <> x.id AND a.started <= x.t AND x.t < a.ended))
			FROM excess x ORDER BY x.t LIMIT 5`)
	}
	if r.StaleStarts > 0 {
		add("stale start", `SELECT format('%s #%s %s (token %s, attempt %s) started at %s by pid %s', fsm, instance, step, token, attempt, started, pid)
			FROM {{s}}.chaos_effects e WHERE `+staleStart+` ORDER BY started LIMIT 5`)
	}
	if r.SlotExcess > 0 {
		add("slot excess", `SELECT format('key %s: run %s (instance %s, token %s) started at %s with %s other rows holding a slot', e.pkey, e.id, e.instance, e.token, e.started, e.holders)
			FROM {{s}}.chaos_effects e WHERE `+slotExcess+` ORDER BY e.started LIMIT 5`)
	}
	if r.StaleAccepted > 0 {
		add("stale write accepted", `SELECT format('key %s: %s write #%s of run %s (instance %s, token %s, pid %s) at %s', key, phase, n, run_id, instance, token, pid, at)
			FROM {{s}}.chaos_fenced_log l WHERE accepted AND NOT current`+r.staleFilter+` ORDER BY id LIMIT 5`)
	}
	if r.UnchargedStarted > 0 {
		add("uncharged started", `SELECT format('%s #%s: %s', i.fsm, i.id, x::text)
			FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) x WHERE `+unchargedStarted+` LIMIT 5`)
	}
	if r.UnconfirmedTwice > 0 {
		add("unconfirmed twice", `SELECT format('%s #%s: %s', i.fsm, i.id, x::text)
			FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) WITH ORDINALITY x(x, n) WHERE `+unconfirmedTwice+` LIMIT 5`)
	}
	if r.LostWakeUps > 0 {
		add("lost wake-up", `SELECT format('#%s awaits %s', i.id, i.awaits) FROM {{s}}.gendurable_instances i
			WHERE `+lostWakeUp+` LIMIT 5`)
	}
	if r.Failed > 0 {
		add("failed", `SELECT format('%s #%s at %s: %s', fsm, id, step, left((errors->-1)::text, 300))
			FROM {{s}}.gendurable_instances WHERE status = 'failed' ORDER BY id LIMIT 5`)
	}
	if r.FaninEarly > 0 || r.FaninWrong > 0 {
		add("fan-in", `SELECT format('parent #%s note %s', o.instance, o.note) FROM {{s}}.chaos_oracle o
			WHERE o.step = 'join' AND (o.note->>'terminal')::int <> (o.note->>'children')::int LIMIT 5`)
	}
}

// Violations lists the invariants the report breaks. allowFailed lets
// scenarios whose instances are meant to fail (poison) pass.
func (r *Report) Violations(allowFailed bool) []string {
	var v []string
	chk := func(n int, what string) {
		if n != 0 {
			v = append(v, fmt.Sprintf("%d %s", n, what))
		}
	}
	chk(r.Lost, fmt.Sprintf("lost (%d rows missing, %d children missing, %d committed outcomes missing)", r.MissingRows, r.LostChildren, r.LostOutcomes))
	chk(r.Stuck, "stuck (not terminal)")
	if !allowFailed {
		chk(r.Failed, "failed")
	}
	chk(r.MultiCommit, "(instance, seq) committed more than once")
	chk(r.TokenReuse, "claim tokens shared by two committed outcomes")
	chk(r.NullToken, "outcomes committed without a claim token (fence broken)")
	chk(r.Overlaps, "partition-key overlaps (runs started while their key had its limit running)")
	chk(r.StaleStarts, "steps started with a claim that was no longer current")
	chk(r.SlotExcess, "keyed runs started while their key's limit of other rows held live slots")
	chk(r.StaleAccepted, "stale writes accepted at the fenced resource")
	chk(r.UnchargedStarted, "reaps that charged no attempt for a claim whose step had started")
	chk(r.UnconfirmedTwice, "unconfirmed claims that went free on a step that had gone free before")
	chk(r.LostWakeUps, "parked instances with a matching unconsumed signal (lost wake-ups)")
	chk(r.FaninEarly, "parents resumed before their last child finished")
	chk(r.FaninMulti, "parents resumed more than once")
	chk(r.FaninWrong, "parents that saw the wrong children")
	chk(r.OrphanLive, "live children of finished parents")
	chk(r.RoundsWrong, "waiters that did not consume exactly their signals")
	chk(r.PastLease, "rows executing past their lease")
	if len(v) > 0 && len(r.Samples) > 0 {
		v = append(v, "samples: "+strings.Join(r.Samples, " | "))
	}
	return v
}

// Line is the scenario's one-line summary:
//
//	chaos worker-kill: 20000 instances, 0 lost, 0 stuck, 37 duplicate step runs, 12 kills
func (r *Report) Line(scenario string, tail ...string) string {
	s := fmt.Sprintf("chaos %s: %d instances, %d lost, %d stuck, %d duplicate step runs", scenario, r.Instances, r.Lost, r.Stuck, r.Duplicates)
	for _, t := range tail {
		if t != "" {
			s += ", " + t
		}
	}
	return s
}

// Invariants is a compact list of the invariant counts, for the summary.
func (r *Report) Invariants() string {
	s := fmt.Sprintf("%d failed, %d double commits, %d stale starts, %d partition overlaps, %d key slot excesses, %d lost wake-ups, %d early/double fan-ins, %d past lease, %d uncharged reaps (%d of a started step; %d unconfirmed, %d of them of a started step, %d of a step gone free before)",
		r.Failed, r.MultiCommit+r.TokenReuse+r.NullToken, r.StaleStarts, r.Overlaps, r.SlotExcess, r.LostWakeUps, r.FaninEarly+r.FaninMulti+r.FaninWrong, r.PastLease,
		r.Uncharged, r.UnchargedStarted, r.Unconfirmed, r.UnconfirmedStarted, r.UnconfirmedTwice)
	if r.FencedWrites > 0 {
		s += fmt.Sprintf(", %d stale writes accepted", r.StaleAccepted)
	}
	if r.WokeStarts > 0 {
		s += fmt.Sprintf(", %d steps entered before a stop that started on waking", r.WokeStarts)
	}
	return s
}
