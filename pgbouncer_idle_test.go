//go:build linux

package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/pgbouncer"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPgBouncerWithTxIdleForALeaseCountsAnAttempt: behind PgBouncer the
// server's 25P03 does not reach the client (the pooler reports the lost
// server session its own way), so only the idle clock tells a callback
// that idled its transaction for TxIdleTimeout from a failover. In every
// exec mode usable through the pooler (not describe_exec: its Describe and
// its Execute are two round trips, which the pooler may send to two server
// sessions — the engine's own statements fail so, WithTx or not), such a step must count its attempts
// and fail, and a step that does not idle must commit (the BEGIN with its
// SET LOCAL works in that mode).
func TestPgBouncerWithTxIdleForALeaseCountsAnAttempt(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			var runs atomic.Int32
			m := &gendurable.Machine[orderArgs]{
				Name: "bidler", Start: "pay", MaxAttempts: 2,
				Backoff: func(int) time.Duration { return 10 * time.Millisecond },
				Steps: map[string]gendurable.StepFunc[orderArgs]{
					"pay": func(_ context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
						idle := r.State.I > 0
						if idle {
							runs.Add(1)
						}
						return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
							var limit string
							if err := tx.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout')").Scan(&limit); err != nil {
								return err
							}
							if limit != "1s" {
								return errorString("limit " + limit)
							}
							if idle {
								select {
								case <-time.After(2500 * time.Millisecond):
								case <-ctx.Done():
								}
							}
							_, err := tx.Exec(ctx, "SELECT $1::int", 2)
							return err
						}), nil
					},
				},
			}
			cfg := fastConfig("", m)
			cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
			b, _ := setupBouncer(t, mode, 3, cfg)
			b.start()
			ok := b.insert(m.New(orderArgs{}))
			idler := b.insert(m.New(orderArgs{I: 1}))
			b.waitStatus(ok, "done", 20*time.Second)
			eventually(t, 30*time.Second, func() bool { return gendurable.Status(b.row(idler).Status).Terminal() || runs.Load() > 4 },
				"neither finished nor rerun")
			r := b.row(idler)
			require.Equal(t, "failed", r.Status, "runs %d, errors: %v", runs.Load(), r.Errors)
			// Two attempts counted, each for the idle transaction. A run
			// interrupted besides (a heartbeat late on a loaded machine: the
			// lease is 1 s) counts none and says so (a newcomer's run of
			// the suite met one).
			counted := 0
			for _, e := range r.Errors {
				if e["kind"] == "interrupted" {
					continue
				}
				counted++
				require.Contains(t, e["error"], "left idle", "%v", r.Errors)
			}
			require.Equal(t, 2, counted, "%v", r.Errors)
			require.GreaterOrEqual(t, runs.Load(), int32(2), "%v", r.Errors)
		})
	}
}

// TestPgBouncerTimeoutsOfAWithTxCountAttempts: PgBouncer's own limits on
// a transaction — query_timeout (a statement of the callback too long) and
// idle_transaction_timeout (the callback's work between statements, or
// after its last one, too long) — end the session with a FATAL 08P01. The step fails for them,
// counting its attempts, as for PostgreSQL's statement or idle timeouts:
// taken for a lost connection, it ran again without an attempt counted,
// without end (a PgBouncer probe: 48 runs in 90 s, attempt 0 of 3).
func TestPgBouncerTimeoutsOfAWithTxCountAttempts(t *testing.T) {
	for _, tc := range []struct {
		name, setting string
		fn            func(ctx context.Context, tx pgx.Tx) error
	}{
		{"query_timeout", "query_timeout", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT pg_sleep(3)")
			return err
		}},
		{"idle_transaction_timeout", "idle_transaction_timeout", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			_, err := tx.Exec(ctx, "SELECT 2")
			return err
		}},
		// Idle after its last statement: the pooler ends the transaction
		// before the engine's outcome statement, the first to hear of it
		// (a PgBouncer probe: each attempt waited a lease for the reaper,
		// and the last error read "lease expired with no outcome").
		{"idle_transaction_timeout at the end", "idle_transaction_timeout", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			m := &gendurable.Machine[orderArgs]{
				Name: "pooled", Start: "pay", MaxAttempts: 2,
				Backoff: func(int) time.Duration { return 10 * time.Millisecond },
				Steps: map[string]gendurable.StepFunc[orderArgs]{
					"pay": func(_ context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
						runs.Add(1)
						return gendurable.Done(nil).WithTx(tc.fn), nil
					},
				},
			}
			cfg := fastConfig("", m)
			// Leases and the engine's own idle limit well above the
			// pooler's 1 s: only the pooler ends the transaction.
			cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.TxIdleTimeout = 20*time.Second, 2*time.Second, 20*time.Second
			b, _ := setupBouncerWith(t, pgx.QueryExecModeCacheDescribe, pgbouncer.Options{PoolSize: 3,
				Settings: map[string]string{tc.setting: "1"}}, cfg)
			b.start()
			id := b.insert(m.New(orderArgs{}))
			eventually(t, 40*time.Second, func() bool { return gendurable.Status(b.row(id).Status).Terminal() || runs.Load() > 4 },
				"neither finished nor rerun")
			r := b.row(id)
			require.Equal(t, "failed", r.Status, "runs %d, errors: %v", runs.Load(), r.Errors)
			require.Len(t, r.Errors, 2, "%v", r.Errors)
			for _, e := range r.Errors {
				require.Contains(t, e["error"], "PgBouncer's "+tc.setting, "%v", r.Errors)
			}
			require.Equal(t, int32(2), runs.Load())
		})
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }
