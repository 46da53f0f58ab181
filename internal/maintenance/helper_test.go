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
	"github.com/gendurable/gendurable/internal/syncbuf"
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

// texts runs a SELECT of one text column and returns its values.
func (d *db) texts(stmt string, args ...any) []string {
	d.t.Helper()
	rows, err := d.pool.Query(context.Background(), d.sql(stmt), args...)
	if err != nil {
		d.t.Fatalf("%s: %v", stmt, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		d.t.Fatalf("%s: %v", stmt, err)
	}
	return out
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

// proxied is a pool of two connections to the test's database through a
// CutProxy: every statement a service sends on it goes through the proxy,
// on the same connection while that one lives (a service sends one
// statement at a time). The second is the fresh connection the service
// goes on with once it abandoned a statement on a dead one: pgx keeps the
// dead connection's place in the pool for up to 15 s while it closes it.
func (d *db) proxied() (*pgxpool.Pool, *dbtest.CutProxy) {
	d.t.Helper()
	proxy := dbtest.NewCutProxyFor(d.t, dbtest.URL())
	cfg := proxy.PoolConfig(d.t, dbtest.URL())
	cfg.MaxConns = 2
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() {
		proxy.Close() // first: pgx closing a stranded connection waits 15 s for the server's goodbye
		pool.Close()
	})
	return pool, proxy
}

// strandedSweepTimeout and strandedSweepInterval are the deadline and
// interval of the services the dead-connection tests run.
const (
	strandedSweepTimeout  = time.Second
	strandedSweepInterval = 100 * time.Millisecond
)

// recoveredAfterDeadline fails t unless took — from the strand of a
// service's connection to the recovery of what its statement on that
// connection was to do — is about one statement deadline and interval: the
// statement sent on the dead connection waited its deadline out (not
// less), and the next sweep came on a fresh connection.
func recoveredAfterDeadline(t *testing.T, took time.Duration) {
	t.Helper()
	t.Logf("recovered %s after the strand (deadline %s, interval %s)", took.Round(time.Millisecond), strandedSweepTimeout, strandedSweepInterval)
	if took < strandedSweepTimeout/2 || took > strandedSweepTimeout+strandedSweepInterval+2*time.Second {
		t.Fatalf("recovered %s after the strand, want about deadline %s + interval %s", took, strandedSweepTimeout, strandedSweepInterval)
	}
}

// bufLogger is a logger writing its lines to l.
func bufLogger(l *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
