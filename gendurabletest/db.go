package gendurabletest

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The environment variables NewDB reads.
const (
	// DatabaseURLEnv names the database tests run against; it wins over
	// DATABASE_URL, so tests can use another database than the program.
	DatabaseURLEnv = "GENDURABLE_TEST_DATABASE_URL"
	// ConnsEnv bounds the connections the pools of one test binary hold
	// at once (default 24).
	ConnsEnv = "GENDURABLE_TEST_CONNS"
)

// DefaultMaxConns is the size of a test's pool unless DBOpts.MaxConns says
// otherwise. It is below a queue's default Concurrency (10), so an engine
// with a default queue logs the warning that its concurrency reaches the
// pool size: harmless for steps that do not hold connections (no WithTx);
// give MaxConns more, or the queue less Concurrency, for those that do.
// Kept small so that several tests fit the budget (ConnsEnv) at once.
const DefaultMaxConns = 8

// DB is one test's database: a migrated schema of its own and a pool to
// reach it. Pass Schema in [gendurable.Config], or build the engine with
// [DB.NewEngine].
type DB struct {
	Pool   *pgxpool.Pool
	Schema string // gdtest_<random>, migrated to the latest version
}

// DBOpts tune NewDB. The zero value (or nil) is usable.
type DBOpts struct {
	// URL of the PostgreSQL server. Default: $GENDURABLE_TEST_DATABASE_URL,
	// else $DATABASE_URL; with neither, the test is skipped.
	URL string
	// MaxConns is the pool's size. Default DefaultMaxConns (8). An engine
	// whose queues' Concurrency adds up to it or more logs a warning: give
	// it more.
	MaxConns int32
}

// NewDB gives the test a fresh schema, migrated to the latest version, and
// a pool of at most MaxConns connections; when the test ends the pool is
// closed and the schema dropped (with everything in it, and nothing else).
// Tests that call it may run in parallel: each has a schema of its own.
//
// The server is DBOpts.URL, else $GENDURABLE_TEST_DATABASE_URL, else
// $DATABASE_URL. With none of them set, the test is skipped with a message
// saying so; a server that does not answer fails it.
//
// The pools of one test binary hold at most $GENDURABLE_TEST_CONNS
// connections between them (default 24): NewDB waits until its pool fits,
// so `go test` with many parallel tests does not exhaust the server's
// max_connections (100 by default). A pool bigger than the whole budget
// gets all of it, alone.
func NewDB(tb testing.TB, opts *DBOpts) *DB {
	tb.Helper()
	if opts == nil {
		opts = &DBOpts{}
	}
	url := opts.URL
	for _, k := range []string{DatabaseURLEnv, "DATABASE_URL"} {
		if url == "" {
			url = os.Getenv(k)
		}
	}
	if url == "" {
		tb.Skipf("gendurabletest: no database to test against: set %s or DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test)", DatabaseURLEnv)
	}
	maxConns := opts.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	pool, schema := dbtest.NewSchema(tb, &dbtest.Options{URL: url, MaxConns: maxConns})
	return &DB{Pool: pool, Schema: schema}
}

// NewEngine builds an engine on db with cfg (nil: the zero Config) and its
// Schema set to db.Schema, failing the test if the configuration is
// invalid. Without a Logger, the engine logs warnings and errors to the
// test's log. An engine the test starts is stopped when the test ends.
func (db *DB) NewEngine(tb testing.TB, cfg *gendurable.Config) *gendurable.Engine {
	tb.Helper()
	c := gendurable.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = db.Schema
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	eng, err := gendurable.New(db.Pool, &c)
	if err != nil {
		tb.Fatalf("gendurabletest: %v", err)
	}
	// Registered after NewDB's cleanups, so it runs before them: the engine
	// stops before its pool closes.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := eng.Stop(ctx); err != nil {
			tb.Errorf("gendurabletest: stopping the engine: %v", err)
		}
	})
	return eng
}

// tbWriter writes log lines to the test's log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
