package compare

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/gendurable/gendurable/migrate"
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func checkIdent(kind, s string) error {
	if !identRE.MatchString(s) {
		return fmt.Errorf("%s %q: want a plain lower-case identifier", kind, s)
	}
	return nil
}

// ensureDatabase creates o.Database through the maintenance connection if it
// does not exist yet.
func ensureDatabase(ctx context.Context, o *Options) error {
	if err := checkIdent("database", o.Database); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, o.DatabaseURL)
	if err != nil {
		return fmt.Errorf("maintenance connection: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, o.Database).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{o.Database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created concurrently
		return nil
	}
	return err
}

// poolConfig is the bench database's pool configuration with maxConns
// (0: pgxpool's default).
func poolConfig(o *Options, maxConns int32, app string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.ConnConfig.Database = o.Database
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return cfg, nil
}

func openPool(ctx context.Context, o *Options, maxConns int32, app string) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(o, maxConns, app)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// warmPool opens every connection of the pool up front so that neither
// system pays connection set-up inside its timed phases.
func warmPool(ctx context.Context, pool *pgxpool.Pool) error {
	n := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, 0, n)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pool.Acquire(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		c.Release()
	}
	return firstErr
}

// migrateAll installs both systems' tables into their schemas.
func migrateAll(ctx context.Context, admin *pgxpool.Pool, o *Options) error {
	if err := checkIdent("river schema", o.RiverSchema); err != nil {
		return err
	}
	if err := checkIdent("gendurable schema", o.GDSchema); err != nil {
		return err
	}
	for _, system := range []string{SystemRiver, SystemGendurable} {
		if err := migrateSystem(ctx, admin, o, system); err != nil {
			return err
		}
	}
	return nil
}

func migrateSystem(ctx context.Context, admin *pgxpool.Pool, o *Options, system string) error {
	if system == SystemGendurable {
		if _, err := migrate.Up(ctx, admin, o.GDSchema); err != nil {
			return fmt.Errorf("gendurable migrate: %w", err)
		}
		return nil
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{o.RiverSchema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", o.RiverSchema, err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(admin), &rivermigrate.Config{Schema: o.RiverSchema})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	return nil
}

// dropSchemas removes both systems' schemas (tests use throwaway schemas).
func dropSchemas(ctx context.Context, admin *pgxpool.Pool, o *Options) error {
	_, err := admin.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; DROP SCHEMA IF EXISTS %s CASCADE",
		pgx.Identifier{o.RiverSchema}.Sanitize(), pgx.Identifier{o.GDSchema}.Sanitize()))
	return err
}

func (o *Options) riverJobTable() string {
	return pgx.Identifier{o.RiverSchema, "river_job"}.Sanitize()
}

func (o *Options) gdTables() (instances, signals string) {
	return pgx.Identifier{o.GDSchema, "gendurable_instances"}.Sanitize(),
		pgx.Identifier{o.GDSchema, "gendurable_signals"}.Sanitize()
}

// reset prepares one system's tables for a run and returns the fraction of
// its jobs table's status statistics that say "finished" (River
// `completed`, gendurable `done`): what the planner believes of the table.
//
// Realistic statistics (the default): the jobs table is filled with
// o.StatsRows finished rows, analyzed, and truncated. TRUNCATE keeps
// pg_statistic, so the planner sees the statistics of a table in use (mostly
// finished rows, as autovacuum leaves a working installation) over an empty
// table; the returned fraction is read back from pg_stats.
//
// FreshStats: the system's schema is dropped and migrated again, then
// vacuumed and analyzed empty: a new installation, no statistics at all.
//
// Either way the database is checkpointed (best effort) last.
func reset(ctx context.Context, admin *pgxpool.Pool, o *Options, system string) (finishedFrac float64, err error) {
	if o.FreshStats {
		if err := recreateSchema(ctx, admin, o, system); err != nil {
			return 0, err
		}
	}
	tables := o.tables(system)
	if _, err := admin.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
		return 0, fmt.Errorf("truncate: %w", err)
	}
	if o.FreshStats {
		// VACUUM cannot run in a transaction block: one statement per Exec.
		for _, t := range tables {
			if _, err := admin.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
				return 0, fmt.Errorf("vacuum %s: %w", t, err)
			}
		}
	} else if o.StatsRows > 0 {
		if _, err := admin.Exec(ctx, o.fillSQL(system), o.StatsRows); err != nil {
			return 0, fmt.Errorf("fill %s with finished rows: %w", tables[0], err)
		}
		for _, t := range tables {
			if _, err := admin.Exec(ctx, "ANALYZE "+t); err != nil {
				return 0, fmt.Errorf("analyze %s: %w", t, err)
			}
		}
		if _, err := admin.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
			return 0, fmt.Errorf("truncate: %w", err)
		}
	}
	finishedFrac, err = o.finishedFraction(ctx, admin, system)
	if err != nil {
		return 0, fmt.Errorf("read pg_stats: %w", err)
	}
	// Best effort: needs superuser or pg_checkpoint.
	_, _ = admin.Exec(ctx, "CHECKPOINT")
	return finishedFrac, nil
}

// tables are a system's tables, its jobs table first.
func (o *Options) tables(system string) []string {
	if system == SystemRiver {
		return []string{o.riverJobTable()}
	}
	inst, sig := o.gdTables()
	return []string{inst, sig}
}

// fillSQL inserts $1 finished rows of the bench job into a system's jobs
// table, finished over the last hours, as a working installation has them.
func (o *Options) fillSQL(system string) string {
	if system == SystemRiver {
		return `INSERT INTO ` + o.riverJobTable() + ` (state, attempt, max_attempts, attempted_at, attempted_by,
			created_at, scheduled_at, finalized_at, priority, args, kind, queue)
		SELECT 'completed', 1, 25, t, '{bench}', t, t, t, 1, jsonb_build_object('num', g), 'bench_noop', 'default'
		FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - (g % 7200) * interval '1 second' AS t) x`
	}
	inst, _ := o.gdTables()
	return `INSERT INTO ` + inst + ` (fsm, fsm_version, queue, step, state, status, attempt,
			eligible_at, inserted_at, updated_at, finished_at)
		SELECT 'bench_noop', 1, 'default', 'perform', jsonb_build_object('num', g), 'done', 0, t, t, t, t
		FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - (g % 7200) * interval '1 second' AS t) x`
}

// finishedFraction reads the frequency of the finished status in the jobs
// table's pg_stats (0 when there are no statistics).
func (o *Options) finishedFraction(ctx context.Context, admin *pgxpool.Pool, system string) (float64, error) {
	schema, table, column, value := o.GDSchema, "gendurable_instances", "status", "done"
	if system == SystemRiver {
		schema, table, column, value = o.RiverSchema, "river_job", "state", "completed"
	}
	var frac float64
	err := admin.QueryRow(ctx, `SELECT coalesce((
			SELECT f FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS u(v, f)
			WHERE s.schemaname = $1 AND s.tablename = $2 AND s.attname = $3 AND u.v = $4), 0)::float8`,
		schema, table, column, value).Scan(&frac)
	return frac, err
}

// recreateSchema drops a system's schema and migrates it again.
func recreateSchema(ctx context.Context, admin *pgxpool.Pool, o *Options, system string) error {
	schema := o.GDSchema
	if system == SystemRiver {
		schema = o.RiverSchema
	}
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return migrateSystem(ctx, admin, o, system)
}

// dbStats is a snapshot of server counters used to report the database
// work behind a run: committed transactions in the bench database and WAL
// written (server-wide).
type dbStats struct {
	xactCommit int64
	walLSN     string
}

func readStats(ctx context.Context, admin *pgxpool.Pool) (dbStats, error) {
	var s dbStats
	// pg_stat_clear_snapshot: don't reuse a cached stats snapshot.
	_, _ = admin.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	err := admin.QueryRow(ctx, `SELECT xact_commit, pg_current_wal_lsn()::text FROM pg_stat_database WHERE datname = current_database()`).
		Scan(&s.xactCommit, &s.walLSN)
	return s, err
}

// statsDelta returns committed transactions and WAL bytes between a and b.
func statsDelta(ctx context.Context, admin *pgxpool.Pool, a, b dbStats) (xacts int64, walBytes int64, err error) {
	err = admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint`, a.walLSN, b.walLSN).Scan(&walBytes)
	return b.xactCommit - a.xactCommit, walBytes, err
}

// emptyAll truncates both systems' tables (the bench database is left
// small after a comparison).
func emptyAll(ctx context.Context, admin *pgxpool.Pool, o *Options) error {
	tables := append(o.tables(SystemRiver), o.tables(SystemGendurable)...)
	if _, err := admin.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
		return err
	}
	_, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+o.limitTable())
	return err
}
