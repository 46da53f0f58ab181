package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
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
  started  timestamptz NOT NULL DEFAULT clock_timestamp(),
  ended    timestamptz
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

	// Options of the process (scenario knobs for the poison machines).
	EffectErrors atomic.Int64 // side-effect writes that failed

	insEffect, endEffect, insOracle string
}

// NewRuntime prepares the statements for schema.
func NewRuntime(pool *pgxpool.Pool, schema string, pid int, worker string) *Runtime {
	return &Runtime{
		Pool: pool, Schema: schema, PID: pid, Worker: worker,
		insEffect: SQL(schema, `INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id, started`),
		endEffect: SQL(schema, `UPDATE {{s}}.chaos_effects SET ended = clock_timestamp() WHERE id = $1`),
		// The claim token is read from the instance row inside the outcome's
		// transaction: if the fence holds, it is this run's token.
		insOracle: SQL(schema, `INSERT INTO {{s}}.chaos_oracle (instance, fsm, step, seq, attempt, token, run_id, pid, worker, started, note)
			SELECT $1, $2, $3, $4, $5, (SELECT claim_token FROM {{s}}.gendurable_instances WHERE id = $1), $6, $7, $8, $9, $10`),
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
	effectID int64
	started  time.Time
	ended    bool
}

// begin records the step's start as a side effect (autocommit, kept whatever
// happens next) and returns the run.
func begin[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int) (*stepRun, error) {
	s := &stepRun{rt: rt, id: r.ID, fsm: r.Machine, step: r.Step, seq: seq, attempt: r.Attempt, runID: randID()}
	var pkey *string
	if r.PartitionKey != "" {
		k := r.PartitionKey
		pkey = &k
	}
	err := rt.Pool.QueryRow(ctx, rt.insEffect, s.id, s.fsm, s.step, s.seq, s.attempt, s.runID, rt.PID, rt.Worker, pkey).
		Scan(&s.effectID, &s.started)
	if err != nil {
		rt.EffectErrors.Add(1)
		return nil, fmt.Errorf("chaos: side effect: %w", err)
	}
	return s, nil
}

// beginWork is begin, then work for d: the start of most harness steps.
func beginWork[S any](ctx context.Context, rt *Runtime, r *gendurable.Run[S], seq int, d time.Duration) (*stepRun, error) {
	run, err := begin(ctx, rt, r, seq)
	if err != nil {
		return nil, err
	}
	if err := run.work(ctx, d); err != nil {
		return nil, err
	}
	return run, nil
}

// work sleeps d (the step's "work"), honouring ctx, then stamps the end of
// the side effect.
func (s *stepRun) work(ctx context.Context, d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			s.end()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	s.end()
	return nil
}

// end stamps the side effect's end (a few quick tries; the span stays open
// if the database is unreachable, which the checker reports).
func (s *stepRun) end() {
	if s.ended {
		return
	}
	s.ended = true
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.rt.Pool.Exec(ctx, s.rt.endEffect, s.effectID)
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
	s.end()
	var noteJSON []byte
	if note != nil {
		noteJSON, _ = json.Marshal(note)
	}
	return o.WithTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.rt.insOracle, s.id, s.fsm, s.step, s.seq, s.attempt, s.runID, s.rt.PID, s.rt.Worker, s.started, noteJSON)
		return err
	})
}

func randID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
