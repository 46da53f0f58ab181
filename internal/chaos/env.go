//go:build linux

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the database the scenarios use unless told otherwise:
// GENDURABLE_TEST_DATABASE_URL, else DATABASE_URL, else the local server.
func DefaultURL() string {
	for _, k := range []string{"GENDURABLE_TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Env is one scenario's world: a fresh schema with gendurable's tables and
// the harness's, an admin pool, and an insert-only engine.
type Env struct {
	URL    string
	Schema string
	Admin  *pgxpool.Pool
	Eng    *gendurable.Engine
	M      *Machines
}

// NewEnv creates schema chaos_<name>_<random> on url.
func NewEnv(ctx context.Context, url, name string) (*Env, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "chaos_" + name + "_" + hex.EncodeToString(b)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 6
	pcfg.ConnConfig.RuntimeParams["application_name"] = AppName(schema, "harness")
	pcfg.ConnConfig.ConnectTimeout = 3 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("chaos: create schema: %w", err)
	}
	if _, err := migrate.Up(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("chaos: migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, SQL(schema, DDL)); err != nil {
		pool.Close()
		return nil, fmt.Errorf("chaos: harness tables: %w", err)
	}
	m := NewMachines(NewRuntime(nil, schema, os.Getpid(), "harness"), Knobs{})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: m.All})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Env{URL: url, Schema: schema, Admin: pool, Eng: eng, M: m}, nil
}

// Close drops the schema (unless keep) and closes the pool.
func (e *Env) Close(keep bool) error {
	defer e.Admin.Close()
	if keep {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.Admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.Schema+" CASCADE")
	return err
}

// Worker returns a worker config for this env with the harness's usual
// timings (lease 2s, heartbeat 500ms, reaper 500ms, polls 20-200ms).
func (e *Env) Worker(name string) WorkerConfig {
	return WorkerConfig{
		URL: e.URL, Schema: e.Schema, Name: name,
		Concurrency: 8, MaxConns: 10,
		LeaseMs: 2000, HeartbeatMs: 500, ReaperMs: 500, PollMs: 20, MaxPollMs: 200, DrainMs: 3000,
	}
}

// Insert inserts ps (in one statement per 1000) and records them as
// expected, in the same transaction. It retries through database trouble
// (a restarting server) until ctx is done. A retry first looks for its
// batch: a commit whose answer was lost with the connection did happen,
// and inserting again would strand the first copies.
func (e *Env) Insert(ctx context.Context, kind string, ps []gendurable.InsertParams) ([]int64, error) {
	var ids []int64
	for len(ps) > 0 {
		n := min(len(ps), 1000)
		var got []int64
		batch := randID()
		err := Retry(ctx, func(ctx context.Context) error {
			got = got[:0]
			rows, err := e.Admin.Query(ctx, SQL(e.Schema, `SELECT id FROM {{s}}.chaos_expected WHERE batch = $1 ORDER BY id`), batch)
			if err != nil {
				return err
			}
			if got, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(got) > 0 {
				return err
			}
			return pgx.BeginFunc(ctx, e.Admin, func(tx pgx.Tx) error {
				res, err := e.Eng.InsertManyTx(ctx, tx, ps[:n])
				if err != nil {
					return err
				}
				for _, r := range res {
					got = append(got, r.ID)
				}
				_, err = tx.Exec(ctx, SQL(e.Schema, `INSERT INTO {{s}}.chaos_expected (id, kind, batch) SELECT unnest($1::bigint[]), $2, $3`), got, kind, batch)
				return err
			})
		})
		if err != nil {
			return ids, err
		}
		ids = append(ids, got...)
		ps = ps[n:]
	}
	return ids, nil
}

// Retry runs fn until it succeeds, fails with a non-connection error, or ctx
// is done. Errors that say the database is unreachable or restarting are
// retried every 100ms.
func Retry(ctx context.Context, fn func(ctx context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := fn(actx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Transient reports whether err looks like the database being unreachable
// or restarting, rather than a bad statement or an answer (a finished
// instance, a rejected input).
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "57P01", code == "57P02", code == "57P03", strings.HasPrefix(code, "08"), code == "53300", code == "40001", code == "40P01":
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr), pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	msg := err.Error()
	for _, s := range []string{"conn closed", "connection reset", "broken pipe", "connection refused", "closed pool", "unexpected EOF"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Now is the database clock.
func (e *Env) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
	})
	return t, err
}

// Fault records a fault about to be injected (database clock) and returns
// its id and time.
func (e *Env) Fault(ctx context.Context, kind string, p *Proc) (int64, time.Time, error) {
	var pid *int
	var worker *string
	if p != nil {
		pid, worker = &p.PID, &p.Name
	}
	var id int64
	var at time.Time
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, SQL(e.Schema, `INSERT INTO {{s}}.chaos_faults (kind, pid, worker) VALUES ($1, $2, $3) RETURNING id, at`),
			kind, pid, worker).Scan(&id, &at)
	})
	return id, at, err
}

// FaultEnd stamps the end of fault id.
func (e *Env) FaultEnd(ctx context.Context, id int64) (time.Time, error) {
	var at time.Time
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, SQL(e.Schema, `UPDATE {{s}}.chaos_faults SET until = clock_timestamp() WHERE id = $1 RETURNING until`), id).Scan(&at)
	})
	return at, err
}

// TerminateWorkers terminates every backend of this env's workers (by
// application_name) and returns how many it terminated.
func (e *Env) TerminateWorkers(ctx context.Context) (int, error) {
	var n int
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, AppName(e.Schema, "w")+"%").Scan(&n)
	})
	return n, err
}

// TerminateWorker terminates every backend of worker name (by
// application_name) and returns how many it terminated.
func (e *Env) TerminateWorker(ctx context.Context, name string) (int, error) {
	var n int
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()`, AppName(e.Schema, name)).Scan(&n)
	})
	return n, err
}

// SetKeyPolicies records the key policies the scenario's workers run with
// (WorkerConfig.KeyPolicies), so that the checker knows each key's limit.
func (e *Env) SetKeyPolicies(ctx context.Context, policies []gendurable.KeyPolicy) error {
	return Retry(ctx, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, e.Admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, SQL(e.Schema, `DELETE FROM {{s}}.chaos_key_limits`)); err != nil {
				return err
			}
			for _, p := range policies {
				if _, err := tx.Exec(ctx, SQL(e.Schema, `INSERT INTO {{s}}.chaos_key_limits (prefix, lim) VALUES ($1, $2)`), p.Prefix, p.Limit); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// Count runs a count query ({{s}} is the schema).
func (e *Env) Count(ctx context.Context, stmt string, args ...any) (int, error) {
	var n int
	err := Retry(ctx, func(ctx context.Context) error {
		return e.Admin.QueryRow(ctx, SQL(e.Schema, stmt), args...).Scan(&n)
	})
	return n, err
}

// WaitTerminal polls until no instance is live (or until deadline) and
// returns how long it took and the number still live.
func (e *Env) WaitTerminal(ctx context.Context, deadline time.Time) (time.Duration, int, error) {
	start := time.Now()
	for {
		live, err := e.Count(ctx, `SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`)
		if err != nil {
			return time.Since(start), -1, err
		}
		if live == 0 || time.Now().After(deadline) {
			return time.Since(start), live, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Check runs the checker on this env.
func (e *Env) Check(ctx context.Context, o CheckOpts) (*Report, error) {
	var r *Report
	err := Retry(ctx, func(ctx context.Context) error {
		var err error
		r, err = Check(ctx, e.Admin, e.Schema, o)
		return err
	})
	return r, err
}
