package compare

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	if _, err := admin.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{o.RiverSchema}.Sanitize()); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(admin), &rivermigrate.Config{Schema: o.RiverSchema})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	if _, err := migrate.Up(ctx, admin, o.GDSchema); err != nil {
		return fmt.Errorf("gendurable migrate: %w", err)
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

// reset empties both systems' job tables, vacuums and analyzes them, and
// checkpoints so every run starts from the same place.
func reset(ctx context.Context, admin *pgxpool.Pool, o *Options) error {
	inst, sig := o.gdTables()
	rj := o.riverJobTable()
	if _, err := admin.Exec(ctx, fmt.Sprintf("TRUNCATE %s, %s, %s", rj, inst, sig)); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	// VACUUM cannot run in a transaction block: one statement per Exec.
	for _, t := range []string{rj, inst, sig} {
		if _, err := admin.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	// Best effort: needs superuser or pg_checkpoint.
	_, _ = admin.Exec(ctx, "CHECKPOINT")
	return nil
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
