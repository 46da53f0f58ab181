package benchrun

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/buildinfo"
	"github.com/gendurable/gendurable/internal/longhorizon"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LongHorizonQueue is the queue the long-horizon adapter inserts into and works.
const LongHorizonQueue = "long_horizon"

// LongHorizon is `gendurable bench --long-horizon`: the adapter of the public
// long-horizon benchmark (package internal/longhorizon), configured by
// getenv only (os.Getenv; see longhorizon.FromEnv, GENDURABLE_SCHEMA for
// the schema, default public, and RetentionEnv). It migrates the schema up, writes the
// descriptor to stdout, starts one engine working queue "long_horizon" with
// WORKER_COUNT running steps and every other setting at its default, and
// produces and samples until ctx ends (SIGTERM); then it stops the engine
// (steps get 1 s to finish, claims not started are handed back) and returns
// nil, within 5 s. Its job sleeps JOB_WORK_MS; a completion counts when its
// outcome has committed (the engine's StepEvent).
//
// Claim latency is insert → step start, both on the database clock: the
// row's inserted_at (now() of its insert transaction) and the step's start,
// read on this process's clock and moved to the database's by an offset
// measured every 30 s (the shortest of 5 round trips of SELECT
// clock_timestamp(), read as halfway through). On a local database the
// offset is a few microseconds; remote, its error is at most half a round
// trip.
//
// Errors about the environment wrap longhorizon.ErrInvalidEnv (exit 2).
func LongHorizon(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	return longhorizon.Exit(ctx, longHorizon(ctx, getenv, stdout, stderr))
}

// plainIdent is an identifier PostgreSQL takes as it is, unquoted.
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// eventRelations names the schema's relations as a harness passes them to
// to_regclass: a schema that is not a plain lower-case identifier is quoted.
func eventRelations(schema string, names ...string) []string {
	qs := schema
	if !plainIdent.MatchString(schema) {
		qs = pgx.Identifier{schema}.Sanitize()
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = qs + "." + n
	}
	return out
}

func longHorizon(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := longhorizon.FromEnv(getenv)
	if err != nil {
		return err
	}
	schema, err := longhorizon.SchemaFromEnv(getenv, "GENDURABLE_SCHEMA")
	if err != nil {
		return err
	}
	if schema == "" {
		schema = gendurable.DefaultSchema
	}
	retention, err := retentionFromEnv(getenv)
	if err != nil {
		return err
	}
	// Picks, heartbeats, outcomes (2 in flight), maintenance, the producer,
	// the depth poll and the clock.
	pcfg, err := longhorizon.PoolConfig(cfg, 12)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer longhorizon.CloseWithin(pool, time.Second, log)
	res, err := migrate.Up(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	q, err := sqlq.New(schema)
	if err != nil {
		return err
	}

	tel := &longhorizon.Telemetry{}
	workDur := time.Duration(cfg.WorkMs) * time.Millisecond
	job := &gendurable.Job[longhorizon.Job]{Name: "long_horizon_job", Perform: func(ctx context.Context, r *gendurable.Run[longhorizon.Job]) error {
		return tel.Work(ctx, r.InsertedAt, workDur)
	}}
	ecfg := longHorizonConfig(schema, job, cfg.WorkerCount, completions{tel},
		slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if retention > 0 {
		ecfg.Retention, ecfg.PruneInterval = retention, pruneIntervalFor(retention)
		log.Info("long horizon: pruning finished instances of the schema", "schema", schema,
			"retention", ecfg.Retention, "interval", ecfg.PruneInterval)
	}
	eng, err := gendurable.New(pool, ecfg)
	if err != nil {
		return err
	}

	// The database connected to (a URL naming none connects to the user's).
	dbName := pcfg.ConnConfig.Database
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		return err
	}
	out := longhorizon.NewEmitter(stdout)
	if err := out.Emit(longhorizon.Descriptor{
		Kind: "descriptor", System: "gendurable",
		EventTables: eventRelations(schema, "gendurable_instances"),
		EventIndexes: eventRelations(schema, "gendurable_instances_pkey", "gendurable_instances_pick_plain",
			"gendurable_instances_pick_keyed", "gendurable_instances_lease", "gendurable_instances_finished"),
		Extensions: []string{}, Version: buildinfo.Read().Short(), SchemaVersion: strconv.Itoa(res.To),
		DBName: dbName, StartedAt: time.Now().UTC().Format(longhorizon.TimeFormat),
		InstanceID: cfg.InstanceID,
	}); err != nil {
		return err
	}
	if err := eng.Start(ctx); err != nil {
		return err
	}
	sys := &gendurableSystem{eng: eng, job: job, pool: pool, q: q}
	runErr := longhorizon.Run(ctx, cfg, "gendurable", sys, tel, out, log)
	stopCtx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := eng.Stop(stopCtx); err != nil {
		log.Warn("long horizon: stop", "err", err)
	}
	log.Info("long horizon: stopped")
	return runErr
}

// RetentionEnv names the adapter's one setting of its own beyond the
// protocol: unset (the default), its engine prunes nothing; a Go duration
// (at least 1s), its engine deletes every finished instance of its schema
// that finished longer ago than that — the operator's choice for a schema
// that holds only the benchmark's rows (BENCHMARKS.md, "Long horizon — the
// adapters").
const RetentionEnv = "GENDURABLE_RETENTION"

// retentionFromEnv reads RetentionEnv: 0 when unset.
func retentionFromEnv(getenv func(string) string) (time.Duration, error) {
	raw := strings.TrimSpace(getenv(RetentionEnv))
	if raw == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("%w: %s=%q (want a duration of at least 1s, such as 90s or 10m)",
			longhorizon.ErrInvalidEnv, RetentionEnv, raw)
	}
	return d, nil
}

// pruneIntervalFor is the prune interval under a retention r: a quarter of
// it, from 1 s to the engine's default, so a finished row stays at most
// about 1.25 r.
func pruneIntervalFor(r time.Duration) time.Duration {
	return min(max(r/4, time.Second), gendurable.DefaultPruneInterval)
}

// longHorizonConfig is the adapter's engine: one queue of its own, every
// other setting at its default but one. The schema is the environment's
// (public by default), which may hold others' instances, and an engine
// that works queues prunes every finished instance of its schema past the
// retention, not only its own: the adapter keeps everything (Retention < 0),
// so it never deletes what it did not create.
func longHorizonConfig(schema string, job gendurable.Definition, workers int, hook gendurable.Hook, logger *slog.Logger) *gendurable.Config {
	return &gendurable.Config{
		Schema: schema, Machines: []gendurable.Definition{job},
		Queues:       map[string]gendurable.QueueConfig{LongHorizonQueue: {Concurrency: workers}},
		DrainTimeout: time.Second,
		Retention:    -1,
		Hooks:        []gendurable.Hook{hook},
		Logger:       logger,
	}
}

// completions counts committed steps (one per job).
type completions struct{ tel *longhorizon.Telemetry }

func (c completions) OnEvent(_ context.Context, ev gendurable.Event) {
	if e, ok := ev.(*gendurable.StepEvent); ok && !e.Fenced && e.CommitErr == nil {
		c.tel.Completed(1)
	}
}

type gendurableSystem struct {
	eng  *gendurable.Engine
	job  *gendurable.Job[longhorizon.Job]
	pool *pgxpool.Pool
	q    *sqlq.Queries
}

func (s *gendurableSystem) Insert(ctx context.Context, seq int64, n int, pad string) error {
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = s.job.New(longhorizon.Job{Seq: seq + int64(i), Pad: pad}).With(gendurable.InsertOpts{Queue: LongHorizonQueue})
	}
	_, err := s.eng.InsertMany(ctx, ps)
	return err
}

func (s *gendurableSystem) Depth(ctx context.Context) (int64, error) {
	return s.q.QueueDepth(ctx, s.pool, LongHorizonQueue, longhorizon.DepthCap)
}

func (s *gendurableSystem) DBNow(ctx context.Context) (time.Time, error) {
	return sqlq.DBNow(ctx, s.pool)
}
