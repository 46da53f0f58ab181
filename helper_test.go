package gendurable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// testBundle is one test's isolated world: a schema, a pool and an engine.
type testBundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	eng    *gendurable.Engine
}

// fastConfig returns engine settings tuned for tests: short lease, quick polls.
func fastConfig(schema string, machines ...gendurable.Definition) *gendurable.Config {
	return &gendurable.Config{
		Schema:            schema,
		Machines:          machines,
		Queues:            map[string]gendurable.QueueConfig{"default": {Concurrency: 4, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}},
		LeaseDuration:     3 * time.Second,
		HeartbeatInterval: time.Second,
		ReaperInterval:    200 * time.Millisecond,
		DrainTimeout:      5 * time.Second,
	}
}

// setup creates a schema and an engine (not started) with cfg; cfg.Schema is
// filled in. A nil cfg means fastConfig with the given machines.
func setup(t *testing.T, cfg *gendurable.Config, machines ...gendurable.Definition) *testBundle {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, nil)
	if cfg == nil {
		cfg = fastConfig(schema, machines...)
	}
	cfg.Schema = schema
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	return &testBundle{t: t, pool: pool, schema: schema, eng: eng}
}

// start starts the engine and stops it when the test ends.
func (b *testBundle) start() {
	b.t.Helper()
	require.NoError(b.t, b.eng.Start(context.Background()))
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.eng.Stop(ctx)
	})
}

func (b *testBundle) insert(p gendurable.InsertParams) int64 {
	b.t.Helper()
	res, err := b.eng.Insert(context.Background(), p)
	require.NoError(b.t, err)
	return res.ID
}

// row is an instance row as the tests read it.
type row struct {
	ID          int64
	FSM         string
	Version     int
	Queue       string
	Step        string
	State       json.RawMessage
	Result      json.RawMessage
	Status      string
	Priority    int
	Attempt     int
	MaxAttempts int
	EligibleAt  time.Time
	LeaseExp    *time.Time
	Token       *int64
	Errors      []map[string]any
	FinishedAt  *time.Time
	Now         time.Time // the database clock when read
}

func (b *testBundle) row(id int64) row {
	b.t.Helper()
	var r row
	var errs []byte
	err := b.pool.QueryRow(context.Background(), fmt.Sprintf(`
		SELECT id, fsm, fsm_version, queue, step, state, result, status::text, priority, attempt,
		       max_attempts, eligible_at, lease_expires_at, claim_token, errors, finished_at, now()
		FROM %s.gendurable_instances WHERE id = $1`, b.schema), id).Scan(
		&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step, &r.State, &r.Result, &r.Status, &r.Priority,
		&r.Attempt, &r.MaxAttempts, &r.EligibleAt, &r.LeaseExp, &r.Token, &errs, &r.FinishedAt, &r.Now)
	require.NoError(b.t, err)
	require.NoError(b.t, json.Unmarshal(errs, &r.Errors))
	return r
}

// waitStatus polls until the instance has the status, failing after timeout.
func (b *testBundle) waitStatus(id int64, status string, timeout time.Duration) row {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := b.row(id)
		if r.Status == status {
			return r
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("instance %d: status %q (step %q, attempt %d, errors %v) after %s, want %q",
				id, r.Status, r.Step, r.Attempt, r.Errors, timeout, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exec runs SQL against the test schema ({{s}} is replaced by its name).
func (b *testBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.pool.Exec(context.Background(), replaceSchema(sql, b.schema), args...)
	require.NoError(b.t, err)
}

func (b *testBundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), replaceSchema(sql, b.schema), args...).Scan(&n))
	return n
}

func replaceSchema(sql, schema string) string { return strings.ReplaceAll(sql, "{{s}}", schema) }

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: "+msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testLogger sends engine logs to the test log (shown with -v or on failure).
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
