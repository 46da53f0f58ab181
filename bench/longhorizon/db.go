package longhorizon

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every statement of the driver, beside its siblings.
const (
	// dbMarker is the comment the driver puts on the databases it creates;
	// it drops only a database that carries it.
	dbMarker = "created by the gendurable long-horizon driver; dropped and recreated by its next run"

	sqlDBComment = `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1),
	       coalesce((SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1), '')`

	// sqlTableStats samples every event table ($1, names as the adapter
	// gave them, schema-qualified or on the search_path) that exists.
	sqlTableStats = `SELECT t.name,
	       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
	       coalesce(s.autovacuum_count, 0), coalesce(s.vacuum_count, 0), coalesce(s.autoanalyze_count, 0),
	       coalesce(s.n_tup_upd, 0), coalesce(s.n_tup_hot_upd, 0),
	       pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid)
	  FROM unnest($1::text[]) AS t(name)
	  JOIN pg_class c ON c.oid = to_regclass(t.name)
	  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid`

	// sqlServerStats: WAL position (server-wide) and the age of the oldest
	// transaction id or snapshot a backend of this database holds.
	sqlServerStats = `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
	       coalesce((SELECT max(greatest(age(backend_xid), age(backend_xmin)))
	                   FROM pg_stat_activity WHERE datname = current_database()), 0)`

	sqlNow = `SELECT now()`

	sqlHolderBegin = `BEGIN`
	sqlHolderXid   = `SELECT txid_current()`
	sqlReaderBegin = `BEGIN ISOLATION LEVEL REPEATABLE READ`
	// sqlReaderScan is formatted with a quoted table name: a full scan.
	sqlReaderScan = `SELECT count(*) FROM %s`
)

// Counter counts, in a system's own job table, the jobs inserted before an
// instant ($1, the database clock) that have not finished, and those that
// finished in failure. Table is matched against the descriptor's
// event_tables (equal, or the part after the schema); SQL is formatted with
// the quoted table name.
type Counter struct {
	Table string
	SQL   string
}

// DefaultCounters are the count queries of the systems the driver knows.
var DefaultCounters = map[string]Counter{
	"gendurable": {Table: "gendurable_instances", SQL: `SELECT count(*) FILTER (WHERE status IN ('runnable', 'executing')),
	       count(*) FILTER (WHERE status = 'failed') FROM %s WHERE inserted_at < $1`},
	"river": {Table: "river_job", SQL: `SELECT count(*) FILTER (WHERE state IN ('available', 'running', 'retryable', 'scheduled', 'pending')),
	       count(*) FILTER (WHERE state = 'discarded') FROM %s WHERE created_at < $1`},
}

// dbURL is base with its database replaced by name.
func dbURL(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%w: DATABASE_URL must be a postgres:// URL", ErrInvalidOption)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// recreateDatabase drops name if this driver created it (its comment is
// dbMarker) and creates it afresh; a database of that name the driver did
// not create is refused.
func recreateDatabase(ctx context.Context, maintURL, name string) error {
	conn, err := pgx.Connect(ctx, maintURL)
	if err != nil {
		return fmt.Errorf("maintenance connection: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	var comment string
	if err := conn.QueryRow(ctx, sqlDBComment, name).Scan(&exists, &comment); err != nil {
		return err
	}
	ident := pgx.Identifier{name}.Sanitize()
	if exists {
		if comment != dbMarker {
			return fmt.Errorf("%w: database %s exists and was not created by this driver; choose another --db-prefix", ErrInvalidOption, name)
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE "+ident+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	// COMMENT takes no parameters; the marker is a constant without quotes.
	_, err = conn.Exec(ctx, "COMMENT ON DATABASE "+ident+" IS '"+dbMarker+"'")
	return err
}

// dropDatabase drops name if this driver created it.
func dropDatabase(ctx context.Context, maintURL, name string) error {
	conn, err := pgx.Connect(ctx, maintURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	var comment string
	if err := conn.QueryRow(ctx, sqlDBComment, name).Scan(&exists, &comment); err != nil {
		return err
	}
	if !exists || comment != dbMarker {
		return nil
	}
	_, err = conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// quoteTable quotes "schema.table" or "table" as an identifier.
func quoteTable(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// TableSample is one event table at one instant.
type TableSample struct {
	Table                                   string
	Live, Dead, Autovacuum, Vacuum, Analyze int64
	Updates, HOTUpdates                     int64
	HeapBytes, IndexBytes, TotalBytes       int64
}

// DBSample is the database at one sample instant.
type DBSample struct {
	T        time.Time
	Tables   []TableSample
	WALBytes int64 // position, server-wide
	XminAge  int64
}

func sampleDB(ctx context.Context, conn *pgx.Conn, tables []string, t time.Time) (DBSample, error) {
	s := DBSample{T: t}
	rows, err := conn.Query(ctx, sqlTableStats, tables)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var ts TableSample
		if err := rows.Scan(&ts.Table, &ts.Live, &ts.Dead, &ts.Autovacuum, &ts.Vacuum, &ts.Analyze,
			&ts.Updates, &ts.HOTUpdates, &ts.HeapBytes, &ts.IndexBytes, &ts.TotalBytes); err != nil {
			rows.Close()
			return s, err
		}
		s.Tables = append(s.Tables, ts)
	}
	if err := rows.Err(); err != nil {
		return s, err
	}
	err = conn.QueryRow(ctx, sqlServerStats).Scan(&s.WALBytes, &s.XminAge)
	return s, err
}

// holdXmin opens a transaction that takes a transaction id and holds it
// (idle in transaction) until ctx ends, then rolls back: autovacuum cannot
// remove a tuple that died after it began.
func holdXmin(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sqlHolderBegin); err != nil {
		return err
	}
	var xid int64
	if err := conn.QueryRow(ctx, sqlHolderXid).Scan(&xid); err != nil {
		return err
	}
	<-ctx.Done()
	_, _ = conn.Exec(context.Background(), "ROLLBACK")
	return nil
}

// readLoop scans every table in one REPEATABLE READ transaction, commits,
// pauses, and again, until ctx ends. It returns the passes completed.
func readLoop(ctx context.Context, url string, tables []string, pause time.Duration) (int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	passes := 0
	for ctx.Err() == nil {
		if err := readPass(ctx, conn, tables); err != nil {
			if ctx.Err() != nil {
				break
			}
			return passes, err
		}
		passes++
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	return passes, nil
}

func readPass(ctx context.Context, conn *pgx.Conn, tables []string) error {
	if _, err := conn.Exec(ctx, sqlReaderBegin); err != nil {
		return err
	}
	for _, t := range tables {
		var n int64
		if err := conn.QueryRow(ctx, fmt.Sprintf(sqlReaderScan, quoteTable(t))).Scan(&n); err != nil {
			_, _ = conn.Exec(context.Background(), "ROLLBACK")
			return err
		}
	}
	_, err := conn.Exec(ctx, "COMMIT")
	return err
}

// findTable is the event table matching want ("schema.want" or "want").
func findTable(tables []string, want string) (string, bool) {
	for _, t := range tables {
		if t == want || strings.HasSuffix(t, "."+want) {
			return t, true
		}
	}
	return "", false
}

// countPending runs c against table for the jobs inserted before at.
func countPending(ctx context.Context, conn *pgx.Conn, c Counter, table string, at time.Time) (pending, failed int64, err error) {
	err = conn.QueryRow(ctx, fmt.Sprintf(c.SQL, quoteTable(table)), at).Scan(&pending, &failed)
	return pending, failed, err
}

func dbNow(ctx context.Context, conn *pgx.Conn) (time.Time, error) {
	var t time.Time
	err := conn.QueryRow(ctx, sqlNow).Scan(&t)
	return t, err
}

var errNoCounter = errors.New("no count query for this system")
