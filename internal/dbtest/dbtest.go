// Package dbtest gives gendurable's own tests an isolated, migrated schema on
// a real PostgreSQL: each test gets its own schema and pool, so tests run in
// parallel, and the schema is dropped when the test ends.
//
// The server is chosen by GENDURABLE_TEST_DATABASE_URL, else DATABASE_URL,
// else postgres://postgres@127.0.0.1:5432/test.
//
// The server is shared (other packages' tests, other clients, at most 100
// connections by default), so the pools of one test process hold at most
// Budget connections between them: NewSchema waits until its pool's
// MaxConns, plus the connections its helper processes will open
// (Options.Extra), fit in what the running tests have left. The suite's
// peak is then bounded whatever -parallel is.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// URL is the test database URL.
func URL() string {
	for _, k := range []string{"GENDURABLE_TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Options tune NewSchema.
type Options struct {
	URL      string // default URL()
	MaxConns int32  // default 8
	// Extra is how many connections the test's other processes (workers it
	// starts) will hold at most; reserved from the budget with MaxConns.
	Extra     int32
	Tracer    pgx.QueryTracer // optional statement tracer
	NoMigrate bool            // leave the schema empty
}

// DefaultBudget is Budget unless GENDURABLE_TEST_CONNS sets it.
const DefaultBudget = 24

// Budget is how many connections the test pools of one process may hold at
// once (GENDURABLE_TEST_CONNS, default DefaultBudget). A test that asks for
// more than all of it gets all of it, alone.
var Budget = func() int32 {
	if n, err := strconv.Atoi(os.Getenv("GENDURABLE_TEST_CONNS")); err == nil && n > 0 {
		return int32(n)
	}
	return DefaultBudget
}()

var budget = struct {
	sync.Mutex
	cond  *sync.Cond
	inUse int32
}{}

func init() { budget.cond = sync.NewCond(&budget.Mutex) }

// reserve waits until n connections fit in the budget and takes them.
func reserve(n int32) int32 {
	n = min(n, Budget)
	budget.Lock()
	for budget.inUse+n > Budget {
		budget.cond.Wait()
	}
	budget.inUse += n
	budget.Unlock()
	return n
}

func release(n int32) {
	budget.Lock()
	budget.inUse -= n
	budget.Unlock()
	budget.cond.Broadcast()
}

// NewSchema creates a fresh schema migrated to the latest version and a pool
// for it; both are cleaned up when t ends.
func NewSchema(t testing.TB, opts *Options) (*pgxpool.Pool, string) {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	maxConns := int32(8)
	if opts.MaxConns > 0 {
		maxConns = opts.MaxConns
	}
	// Held until the pool is closed and the schema dropped (cleanups run
	// last in, first out; this one is registered first).
	held := reserve(maxConns + max(0, opts.Extra))
	t.Cleanup(func() { release(held) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "gdtest_" + hex.EncodeToString(b)

	url := opts.URL
	if url == "" {
		url = URL()
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("dbtest: parse the database URL: %v", err)
	}
	cfg.MaxConns = maxConns
	if opts.Tracer != nil {
		cfg.ConnConfig.Tracer = opts.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	if opts.NoMigrate {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatalf("dbtest: create schema: %v", err)
		}
	} else if _, _, err := sqlq.Migrate(ctx, pool, schema, sqlq.LatestVersion()); err != nil {
		t.Fatalf("dbtest: migrate %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool.Close()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Logf("dbtest: cleanup connect: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("dbtest: drop schema %s: %v", schema, err)
		}
	})
	return pool, schema
}

// NewDatabase creates a fresh database on the test server and returns its
// URL (pass it as Options.URL); it is dropped when t ends. A test that
// needs VACUUM to remove what it left dead uses one: a transaction open in
// the test database — another package's test, run in parallel — holds back
// what VACUUM may remove there, but not in another database.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "gdtest_db_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Logf("dbtest: cleanup connect: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("dbtest: drop database %s: %v", name, err)
		}
	})
	u, err := neturl.Parse(URL())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return URL() + " dbname=" + name // a key=value string: the last dbname wins
	}
	u.Path = "/" + name
	return u.String()
}

// Counter is a pgx tracer that counts statements, except those whose SQL
// begins with "-- untraced" (a test's own queries on the traced pool).
type Counter struct {
	n atomic.Int64
}

// TraceQueryStart counts one statement.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.HasPrefix(strings.TrimSpace(data.SQL), "-- untraced") {
		c.n.Add(1)
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Count is the number of statements seen so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// Reset zeroes the count.
func (c *Counter) Reset() { c.n.Store(0) }

// IndexReads is what index (of schema's) has served: index entries returned
// (idx_tup_read) and blocks read, as c's backend sees them. The reading
// backend's pending counters are flushed first (pg_stat_force_next_flush:
// otherwise at most once a second), so c must be the connection that read.
// It skips the test before PostgreSQL 15, which has no such flush.
func IndexReads(t testing.TB, c *pgx.Conn, schema, index string) (tuples, blocks int64) {
	t.Helper()
	ctx := context.Background()
	var version int
	if err := c.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Skipf("PostgreSQL %d: reading index counters needs pg_stat_force_next_flush (15 and later)", version)
	}
	if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush(), pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `
		SELECT i.idx_tup_read, s.idx_blks_hit + s.idx_blks_read
		FROM pg_stat_user_indexes AS i JOIN pg_statio_user_indexes AS s USING (indexrelid)
		WHERE i.schemaname = $1 AND i.indexrelname = $2`, schema, index).Scan(&tuples, &blocks); err != nil {
		t.Fatal(err)
	}
	return tuples, blocks
}
