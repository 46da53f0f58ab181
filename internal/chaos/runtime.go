//go:build linux

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DDL creates the harness's own tables in a scenario schema (which must
// already hold gendurable's tables). {{s}} is the schema.
const DDL = `
CREATE TABLE {{s}}.chaos_effects (
  id       bigserial PRIMARY KEY,
  instance bigint NOT NULL,
  fsm      text NOT NULL,
  step     text NOT NULL,
  seq      int NOT NULL,
  attempt  int NOT NULL,
  run_id   text NOT NULL,
  pid      int NOT NULL,
  worker   text NOT NULL,
  pkey     text,
  token    bigint,      -- the run's claim token (Run.Token)
  honours  boolean NOT NULL DEFAULT true, -- false: the step ignores its context (LeafState.IgnoreCtx)
  -- keyed runs: how many other rows of the key held a slot (executing, lease
  -- not run out on the database clock) when this run started
  holders  int,
  -- whether the run's claim was still current when it started: the row
  -- carried its token, executing, with a lease not run out
  claim_current boolean,
  -- whether an operator's cancel had fenced this run's claim out shortly
  -- before it started (the row's last history entry is that cancel, naming
  -- the token, at most two heartbeat intervals and 500 ms earlier; the row
  -- keeps the claim's lease): a claim prefetched into a worker's buffer may
  -- start until the worker's next heartbeat, as a running step runs on
  cancelled_before boolean,
  -- the instance row's updated_at when this run started: for a run whose
  -- claim was current, the now() of the pick that claimed it (the clock a
  -- rated key's token bucket runs on; heartbeats leave updated_at alone)
  claimed  timestamptz,
  started  timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- when the step function was entered, on the worker's clock (the host's),
  -- taken before the side effect is sent: a run entered before its process
  -- was stopped whose write reached the database only after the wake has
  -- started stamped after the stop (see wokeStart in checker.go)
  entered  timestamptz,
  ended    timestamptz,
  -- why the work stopped short: NULL when it ran to its end, else the kind of
  -- its context's cause ('lease_lost', 'stopped', 'timeout', 'other')
  cause    text,
  -- when the step's work ended (done, or its context seen cancelled), on the
  -- worker's clock — the host's: the harness and its workers run on one
  -- machine — taken before the end is stamped in the database
  work_end timestamptz
);
CREATE INDEX ON {{s}}.chaos_effects (instance, seq);
CREATE INDEX ON {{s}}.chaos_effects (pkey) WHERE pkey IS NOT NULL;
CREATE TABLE {{s}}.chaos_oracle (
  id        bigserial PRIMARY KEY,
  instance  bigint NOT NULL,
  fsm       text NOT NULL,
  step      text NOT NULL,
  seq       int NOT NULL,
  attempt   int NOT NULL,
  token     bigint,
  run_id    text NOT NULL,
  pid       int NOT NULL,
  worker    text NOT NULL,
  started   timestamptz NOT NULL,
  ended     timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_start  timestamptz NOT NULL DEFAULT now(), -- the outcome transaction's now(): what eligible_at and deadlines count from
  note      jsonb
);
CREATE INDEX ON {{s}}.chaos_oracle (instance, seq);
-- top-level instances the harness inserted (children are found by parent_id)
CREATE TABLE {{s}}.chaos_expected (id bigint PRIMARY KEY, kind text, batch text);
CREATE INDEX ON {{s}}.chaos_expected (batch);
-- A resource outside the engine fenced by the claim token (Run.Token): one row
-- per partition key, written by keyed steps of fenced leaves at the start and
-- at the end of their work. A write carrying a token smaller than the last one
-- accepted is refused (counted in refused, not applied).
CREATE TABLE {{s}}.chaos_fenced (
  key     text PRIMARY KEY,
  token   bigint NOT NULL,
  writes  int NOT NULL DEFAULT 0,
  refused int NOT NULL DEFAULT 0
);
-- Every write offered to chaos_fenced, in the resource's own order (n, per
-- key): accepted or refused, and whether the writer's claim was still current
-- when it was applied (the instance row carried its token, executing, with a
-- lease not yet run out on the database clock). Accepted and not current: a
-- stale write the fence let through.
CREATE TABLE {{s}}.chaos_fenced_log (
  id       bigserial PRIMARY KEY,
  key      text NOT NULL,
  n        int NOT NULL,
  token    bigint NOT NULL,
  instance bigint NOT NULL,
  run_id   text NOT NULL,
  pid      int NOT NULL,
  phase    text NOT NULL, -- 'start' or 'end' of the step's work
  accepted boolean NOT NULL,
  current  boolean NOT NULL,
  at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- An application row per partition key that a keyed leaf with TxHoldMs updates
-- in its WithTx outcome and then holds (the transaction idle) for that long: a
-- run cut off from the database mid-transaction leaves the row locked for as
-- long as its server session lives, and the key's next runs need the lock.
CREATE TABLE {{s}}.chaos_key_tx (key text PRIMARY KEY, n int NOT NULL);
-- The key policies the scenario's workers run with (Config.KeyPolicies), for
-- the checker: a key's limit is its row's key_limit, else the longest prefix
-- here it starts with, else 1.
CREATE TABLE {{s}}.chaos_key_limits (prefix text PRIMARY KEY, lim int NOT NULL);
-- faults the harness injected, on the database clock (taken just before the fault)
CREATE TABLE {{s}}.chaos_faults (
  id     bigserial PRIMARY KEY,
  kind   text NOT NULL,
  pid    int,
  worker text,
  at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  until  timestamptz
);
`

// SQL renders a statement for schema s ({{s}} is replaced).
func SQL(s, stmt string) string { return strings.ReplaceAll(stmt, "{{s}}", s) }

// Runtime is what the harness's step functions need: a pool for their
// side-effect rows, the schema, and who they are.
type Runtime struct {
	Pool   *pgxpool.Pool // nil in the harness's insert-only engine
	Schema string
	PID    int
	Worker string
	// Heartbeat is the worker's heartbeat interval: a run whose claim an
	// operator's cancel fenced out before it started is no stale start if
	// it started within two of them (and 500 ms) of the cancel (see
	// cancelled_before). Zero: never.
	Heartbeat time.Duration

	// Options of the process (scenario knobs for the poison machines).
	EffectErrors atomic.Int64 // side-effect writes that failed

	insEffect, endEffect, insOracle, fenceWrite, keyTx string
}

// NewRuntime prepares the statements for schema.
func NewRuntime(pool *pgxpool.Pool, schema string, pid int, worker string) *Runtime {
	return &Runtime{
		Pool: pool, Schema: schema, PID: pid, Worker: worker,
		insEffect: SQL(schema, `INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, token, honours, holders, claim_current, claimed, cancelled_before, entered)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
			        CASE WHEN $9::text IS NOT NULL THEN (SELECT count(*) FROM {{s}}.gendurable_instances h
			          WHERE h.partition_key = $9 AND h.status = 'executing' AND h.lease_expires_at > clock_timestamp() AND h.id <> $1) END,
			        coalesce((SELECT i.claim_token = $10 AND i.status = 'executing' AND i.lease_expires_at > clock_timestamp()
			                  FROM {{s}}.gendurable_instances i WHERE i.id = $1), false),
			        (SELECT i.updated_at FROM {{s}}.gendurable_instances i WHERE i.id = $1),
			        coalesce((SELECT i.claim_token IS NULL AND i.lease_expires_at > clock_timestamp()
			                         AND i.errors -> -1 ->> 'kind' = 'cancelled' AND (i.errors -> -1 ->> 'token')::bigint = $10
			                         AND (i.errors -> -1 ->> 'at')::timestamptz > clock_timestamp() - $12::bigint * interval '1 millisecond'
			                  FROM {{s}}.gendurable_instances i WHERE i.id = $1), false),
			        $13)
			RETURNING id, started`),
		endEffect: SQL(schema, `UPDATE {{s}}.chaos_effects SET ended = clock_timestamp(), cause = $2, work_end = $3 WHERE id = $1`),
		// The claim token is read from the instance row inside the outcome's
		// transaction: if the fence holds, it is this run's token.
		insOracle: SQL(schema, `INSERT INTO {{s}}.chaos_oracle (instance, fsm, step, seq, attempt, token, run_id, pid, worker, started, note)
			SELECT $1, $2, $3, $4, $5, (SELECT claim_token FROM {{s}}.gendurable_instances WHERE id = $1), $6, $7, $8, $9, $10`),
		keyTx: SQL(schema, `INSERT INTO {{s}}.chaos_key_tx AS k (key, n) VALUES ($1, 1)
			ON CONFLICT (key) DO UPDATE SET n = k.n + 1`),
		// A write to the fenced resource: applied if its token is at least the
		// last one accepted for the key, refused otherwise; logged either way
		// in the resource's order, with whether the writer's claim was still
		// current (read under a key-share lock: the newest committed version
		// of the instance row, which cannot be reaped or finished while the
		// write is applied).
		fenceWrite: SQL(schema, `WITH cur AS MATERIALIZED (
			  SELECT coalesce((SELECT i.claim_token = $2 AND i.status = 'executing' AND i.lease_expires_at > clock_timestamp()
			                   FROM {{s}}.gendurable_instances AS i WHERE i.id = $3 FOR KEY SHARE), false) AS current
			), w AS (
			  INSERT INTO {{s}}.chaos_fenced AS f (key, token, writes, refused)
			  SELECT $1, $2, 1, 0 FROM cur
			  ON CONFLICT (key) DO UPDATE SET
			    writes  = f.writes  + CASE WHEN f.token <= EXCLUDED.token THEN 1 ELSE 0 END,
			    refused = f.refused + CASE WHEN f.token <= EXCLUDED.token THEN 0 ELSE 1 END,
			    token   = greatest(f.token, EXCLUDED.token)
			  RETURNING f.token = $2 AS accepted, f.writes + f.refused AS n
			)
			INSERT INTO {{s}}.chaos_fenced_log (key, n, token, instance, run_id, pid, phase, accepted, current)
			SELECT $1, w.n, $2, $3, $4, $5, $6, w.accepted, cur.current FROM w, cur
			RETURNING accepted`),
	}
}

// stepRun is one run of one step: its side-effect row and what its oracle
// row will say.
type stepRun struct {
	rt       *Runtime
	id       int64
	fsm      string
	step     string
	seq      int
	attempt  int
	runID    string
	pkey     *string
	token    int64
	fenced   bool // writes the fenced resource of its key at the start and end of its work
	ignore   bool // ignores its context: works to the end and writes whatever happens
	effectID int64
	started  time.Time
	ended    bool
}

// begin records the step's start as a side effect (autocommit, kept whatever
// happens next) and returns the run.
func begin[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int) (*stepRun, error) {
	return beginRun(ctx, rt, r, seq, false)
}

func beginRun[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int, ignore bool) (*stepRun, error) {
	entered := time.Now()
	s := &stepRun{rt: rt, id: r.ID, fsm: r.Machine, step: r.Step, seq: seq, attempt: r.Attempt, runID: randID(), token: r.Token, ignore: ignore}
	if r.PartitionKey != "" {
		k := r.PartitionKey
		s.pkey = &k
	}
	if ignore {
		ctx = context.WithoutCancel(ctx)
	}
	grace := int64(0) // how long after a cancel of its claim a run may still start (see Heartbeat)
	if rt.Heartbeat > 0 {
		grace = (2*rt.Heartbeat + 500*time.Millisecond).Milliseconds()
	}
	err := rt.Pool.QueryRow(ctx, rt.insEffect, s.id, s.fsm, s.step, s.seq, s.attempt, s.runID, rt.PID, rt.Worker, s.pkey, s.token, !ignore, grace, entered).
		Scan(&s.effectID, &s.started)
	if err != nil {
		rt.EffectErrors.Add(1)
		return nil, fmt.Errorf("chaos: side effect: %w", err)
	}
	return s, nil
}

// beginWork is begin, then work for d: the start of most harness steps.
func beginWork[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int, d time.Duration) (*stepRun, error) {
	return beginFenced(ctx, rt, r, seq, d, false, false)
}

// beginFenced is beginWork; if fenced and the instance has a partition key,
// the run also writes its key's fenced resource (chaos_fenced), with its
// claim token, when its work starts and when it ends. Both writes honour
// ctx — a run whose context is done writes nothing more — unless ignore:
// then the run ignores its context throughout (it works to the end and
// writes whatever happens), as a careless step would.
func beginFenced[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int, d time.Duration, fenced, ignore bool) (*stepRun, error) {
	run, err := beginRun(ctx, rt, r, seq, ignore)
	if err != nil {
		return nil, err
	}
	if ignore {
		ctx = context.WithoutCancel(ctx)
	}
	run.fenced = fenced && run.pkey != nil
	if run.fenced {
		if err := run.fence(ctx, "start"); err != nil {
			if ctx.Err() != nil {
				run.cut(ctx)
				return nil, context.Cause(ctx)
			}
			run.end()
			return nil, err
		}
	}
	if err := run.work(ctx, d); err != nil {
		return nil, err
	}
	return run, nil
}

// work sleeps d (the step's "work"), honouring ctx, then (for a fenced run)
// writes the fenced resource and stamps the end of the side effect. A run
// whose context is done stops at once and records why (cut).
func (s *stepRun) work(ctx context.Context, d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			s.cut(ctx)
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	if s.fenced {
		if err := s.fence(ctx, "end"); err != nil {
			if ctx.Err() != nil {
				s.cut(ctx)
				return context.Cause(ctx)
			}
			s.end()
			return err
		}
	}
	s.end()
	return nil
}

// fence offers one write to the fenced resource of the run's key. It tries
// again through connection trouble (the worker's backends may have been
// terminated) as long as ctx is not done, and never once it is.
func (s *stepRun) fence(ctx context.Context, phase string) error {
	var err error
	for i := 0; i < 3 && ctx.Err() == nil; i++ {
		if _, err = s.rt.FenceWrite(ctx, s.rt.Pool, *s.pkey, s.token, s.id, s.runID, phase); err == nil {
			return nil // accepted or refused: the resource decided
		}
		if !Transient(err) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	s.rt.EffectErrors.Add(1)
	return fmt.Errorf("chaos: fenced write (%s): %w", phase, err)
}

// FenceWrite offers one write carrying token to the fenced resource of key
// on behalf of a run of instance, and reports whether it was accepted.
func (rt *Runtime) FenceWrite(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string, token, instance int64, runID, phase string) (bool, error) {
	var accepted bool
	err := db.QueryRow(ctx, rt.fenceWrite, key, token, instance, runID, rt.PID, phase).Scan(&accepted)
	return accepted, err
}

// CauseKind names the cause of a cancelled step context as the harness
// records it (chaos_effects.cause).
func CauseKind(cause error) string {
	switch {
	case errors.Is(cause, gendurable.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(cause, gendurable.ErrEngineStopped):
		return "stopped"
	case errors.Is(cause, gendurable.ErrStepTimeout):
		return "timeout"
	default:
		return "other"
	}
}

// cut stamps the end of a run whose context is done, with the cause and when
// the step saw it (this process's clock).
func (s *stepRun) cut(ctx context.Context) {
	s.stamp(CauseKind(context.Cause(ctx)), time.Now())
}

// end stamps the side effect's end (a few quick tries; the span stays open
// if the database is unreachable, which the checker reports).
func (s *stepRun) end() { s.stamp("", time.Now()) }

func (s *stepRun) stamp(cause string, workEnd time.Time) {
	if s.ended {
		return
	}
	s.ended = true
	var c *string
	if cause != "" {
		c = &cause
	}
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.rt.Pool.Exec(ctx, s.rt.endEffect, s.effectID, c, workEnd)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.rt.EffectErrors.Add(1)
}

// commit attaches the oracle row to the outcome: it is inserted in the
// transaction that applies the outcome, so it exists iff the outcome
// committed.
func (s *stepRun) commit(o gendurable.Outcome, note any) gendurable.Outcome {
	return s.commitHolding(o, note, 0)
}

// commitHolding is commit; a keyed run with hold > 0 also updates its key's
// row of chaos_key_tx in the outcome's transaction and then leaves the
// transaction idle for hold (honouring the context), as an application
// that works between its statements would.
func (s *stepRun) commitHolding(o gendurable.Outcome, note any, hold time.Duration) gendurable.Outcome {
	s.end()
	var noteJSON []byte
	if note != nil {
		noteJSON, _ = json.Marshal(note)
	}
	return o.WithTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.rt.insOracle, s.id, s.fsm, s.step, s.seq, s.attempt, s.runID, s.rt.PID, s.rt.Worker, s.started, noteJSON)
		if err != nil || hold <= 0 || s.pkey == nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.rt.keyTx, *s.pkey); err != nil {
			return err
		}
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
			return nil
		}
	})
}

func randID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
