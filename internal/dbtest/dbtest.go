// Package dbtest gives gendurable's own tests an isolated, migrated schema on
// a real PostgreSQL: each test gets its own schema and pool, so tests run in
// parallel, and the schema is dropped when the test ends.
//
// The server is chosen by GENDURABLE_TEST_DATABASE_URL, else DATABASE_URL,
// else postgres://postgres@127.0.0.1:5432/test.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
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
	MaxConns  int32           // default 8
	Tracer    pgx.QueryTracer // optional statement tracer
	NoMigrate bool            // leave the schema empty
}

// NewSchema creates a fresh schema migrated to the latest version and a pool
// for it; both are cleaned up when t ends.
func NewSchema(t testing.TB, opts *Options) (*pgxpool.Pool, string) {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "gdtest_" + hex.EncodeToString(b)

	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("dbtest: parse %s: %v", URL(), err)
	}
	cfg.MaxConns = 8
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
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
		conn, err := pgx.Connect(ctx, URL())
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

// Counter is a pgx tracer that counts statements, optionally only those
// whose SQL contains a substring.
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
