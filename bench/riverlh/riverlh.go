// Package riverlh is River's adapter of the public long-horizon benchmark of
// PostgreSQL job queues — the same protocol, environment and measurements as
// gendurable's (`gendurable bench --long-horizon`; the protocol is package
// internal/longhorizon of the gendurable module), so one driver runs both.
// The command is bench/cmd/river-long-horizon.
//
// River is set up as the benchmark's own River adapter sets it up
// (hardbyte/postgresql-job-queue-benchmarking, river-bench/main.go), so its
// figures compare with the published ones: River's migrations (rivermigrate),
// one queue (default) of WORKER_COUNT workers, FetchCooldown and
// FetchPollInterval 50 ms, JobTimeout and RescueStuckJobsAfter 30 s, every
// other setting at River's default (completed jobs kept 24 h); inserts
// through InsertManyFast (COPY), at most 128 jobs each.
package riverlh

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/longhorizon"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Args is a long-horizon job (longhorizon.Job, the same JSON as
// gendurable's) as River's job args.
type Args longhorizon.Job

// Kind is River's job kind.
func (Args) Kind() string { return "long_horizon_job" }

// Run is the adapter, configured by getenv only (os.Getenv; see
// longhorizon.FromEnv, and RIVER_SCHEMA for River's schema, default the
// connection's search path — public): it migrates, writes the descriptor,
// starts the client, and produces and samples until ctx ends (SIGTERM); then
// it stops the client (1 s for running jobs, then StopAndCancel, for at most
// 2 s), closes its pool (for at most 1 s) and returns nil, within 5 s.
// Migrations run under an advisory lock, so replicas started at once on a
// fresh database do not both apply them. Its job sleeps JOB_WORK_MS; a completion counts when River
// reports the job completed (EventKindJobCompleted, sent once its completer
// has written it).
//
// Claim latency is insert → job start on the database clock, measured as
// gendurable's adapter measures it: the job's created_at (set by the insert,
// now() on the database) against the start of Work on this process's clock
// moved to the database's by the measured offset.
//
// Errors about the environment wrap longhorizon.ErrInvalidEnv (exit 2).
func Run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	return longhorizon.Exit(ctx, run(ctx, getenv, stdout, stderr))
}

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := longhorizon.FromEnv(getenv)
	if err != nil {
		return err
	}
	schema, err := longhorizon.SchemaFromEnv(getenv, "RIVER_SCHEMA")
	if err != nil {
		return err
	}
	pcfg, err := longhorizon.PoolConfig(cfg, 20) // the public adapter's MAX_CONNECTIONS default
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	// Closing waits for every connection to come back, and one River still
	// holds (a fetch blocked on a lock) would hold the exit past its 5 s.
	defer longhorizon.CloseWithin(pool, time.Second, log)

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if err := migrateLocked(ctx, pcfg.ConnConfig.Copy(), pool, schema, migrator); err != nil {
		return err
	}
	versions, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return fmt.Errorf("river versions: %w", err)
	}
	schemaVersion := "0"
	if len(versions) > 0 {
		schemaVersion = fmt.Sprint(versions[len(versions)-1].Version)
	}

	tel := &longhorizon.Telemetry{}
	workDur := time.Duration(cfg.WorkMs) * time.Millisecond
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, j *river.Job[Args]) error {
		return tel.Work(ctx, j.CreatedAt, workDur)
	}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:               schema,
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.WorkerCount}},
		Workers:              workers,
		FetchCooldown:        50 * time.Millisecond,
		FetchPollInterval:    50 * time.Millisecond,
		JobTimeout:           30 * time.Second,
		RescueStuckJobsAfter: 30 * time.Second,
		SoftStopTimeout:      time.Second,
		Logger:               slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	events, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 100_000, // a full channel drops events, and they are the completion count
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
	})
	subDone := make(chan struct{})
	go func() {
		defer close(subDone)
		for range events {
			tel.Completed(1)
		}
	}()
	defer func() { cancelSub(); <-subDone }()

	table := "public.river_job"
	if schema != "" {
		table = schema + ".river_job"
	}
	out := longhorizon.NewEmitter(stdout)
	if err := out.Emit(longhorizon.Descriptor{
		Kind: "descriptor", System: "river", EventTables: []string{table}, Extensions: []string{},
		Version: riverVersion(), SchemaVersion: schemaVersion, DBName: pcfg.ConnConfig.Database,
		StartedAt: time.Now().UTC().Format(longhorizon.TimeFormat), InstanceID: cfg.InstanceID,
	}); err != nil {
		return err
	}
	// SIGTERM ends ctx: River then stops softly, running jobs cancelled
	// after SoftStopTimeout (without it, an ended Start context stopped the
	// client hard); the explicit stop below bounds the rest.
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("river start: %w", err)
	}
	sys := &system{client: client, pool: pool, table: "river_job"}
	if schema != "" {
		sys.table = pgx.Identifier{schema, "river_job"}.Sanitize()
	}
	runErr := longhorizon.Run(ctx, cfg, "river", sys, tel, out, log)
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer ccancel()
		if err := client.StopAndCancel(cctx); err != nil {
			log.Warn("long horizon: stop", "err", err)
		}
	}
	log.Info("long horizon: stopped")
	return runErr
}

type system struct {
	client *river.Client[pgx.Tx]
	pool   *pgxpool.Pool
	table  string // river_job, schema-qualified and sanitized if RIVER_SCHEMA is set
}

func (s *system) Insert(ctx context.Context, seq int64, n int, pad string) error {
	ps := make([]river.InsertManyParams, n)
	for i := range ps {
		ps[i] = river.InsertManyParams{Args: Args{Seq: seq + int64(i), Pad: pad}}
	}
	_, err := s.client.InsertManyFast(ctx, ps)
	return err
}

// Depth counts available jobs (River's state for runnable and unclaimed), at
// most longhorizon.DepthCap, through River's (state, queue, priority,
// scheduled_at, id) index.
func (s *system) Depth(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+s.table+
		` WHERE state = 'available' AND queue = $1 LIMIT $2) AS a`, river.QueueDefault, longhorizon.DepthCap).Scan(&n)
	return n, err
}

func (s *system) DBNow(ctx context.Context) (time.Time, error) {
	return sqlq.DBNow(ctx, s.pool)
}

// migrateLockKey is the advisory lock the River adapter's migrations run
// under: rivermigrate takes none, and two replicas started at once on a fresh
// database failed on each other's CREATE TYPE (SQLSTATE 23505, 42710).
const migrateLockKey = "gendurable bench: river-long-horizon migrations"

// migrateLocked creates schema if it is set and missing (CREATE SCHEMA IF
// NOT EXISTS races as well, SQLSTATE 23505) and applies River's migrations,
// holding migrateLockKey on a connection of its own, outside the pool (a
// pool of one connection works too). Not one transaction: River's
// migrations use an enum value in the transaction after the one that adds
// it (SQLSTATE 55P04 otherwise).
func migrateLocked(ctx context.Context, cfg *pgx.ConnConfig, pool *pgxpool.Pool, schema string, migrator *rivermigrate.Migrator[pgx.Tx]) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	// Closing the session releases the lock, whatever happened.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, migrateLockKey); err != nil {
		return fmt.Errorf("river migrate: lock: %w", err)
	}
	if schema != "" {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	return nil
}
