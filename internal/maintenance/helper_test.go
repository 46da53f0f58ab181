package maintenance

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// db is one test's migrated schema.
type db struct {
	t    *testing.T
	pool *pgxpool.Pool
	q    *sqlq.Queries
}

func newDB(t *testing.T) *db {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	q, err := sqlq.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	return &db{t: t, pool: pool, q: q}
}

// sql runs a statement whose {{s}} is the test's schema.
func (d *db) sql(stmt string) string { return strings.ReplaceAll(stmt, "{{s}}", `"`+d.q.Schema+`"`) }

// id runs an INSERT … RETURNING id.
func (d *db) id(stmt string, args ...any) int64 {
	d.t.Helper()
	var id int64
	if err := d.pool.QueryRow(context.Background(), d.sql(stmt), args...).Scan(&id); err != nil {
		d.t.Fatalf("%s: %v", stmt, err)
	}
	return id
}

// count runs a SELECT count(*).
func (d *db) count(stmt string, args ...any) int {
	d.t.Helper()
	var n int
	if err := d.pool.QueryRow(context.Background(), d.sql(stmt), args...).Scan(&n); err != nil {
		d.t.Fatalf("%s: %v", stmt, err)
	}
	return n
}

// status is the status of instance id.
func (d *db) status(id int64) string {
	d.t.Helper()
	var s string
	if err := d.pool.QueryRow(context.Background(), d.sql(`SELECT status::text FROM {{s}}.gendurable_instances WHERE id = $1`), id).Scan(&s); err != nil {
		d.t.Fatalf("status of %d: %v", id, err)
	}
	return s
}

func eventually(t *testing.T, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// quiet is a logger that drops everything.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// countingDB counts the QueryRow statements that have returned their row.
type countingDB struct {
	sqlq.DB
	done atomic.Int64
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return countedRow{c.DB.QueryRow(ctx, sql, args...), &c.done}
}

type countedRow struct {
	pgx.Row
	done *atomic.Int64
}

func (r countedRow) Scan(dest ...any) error {
	defer r.done.Add(1)
	return r.Row.Scan(dest...)
}
