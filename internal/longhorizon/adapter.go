package longhorizon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/pgurl"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The pieces every adapter (gendurable's in internal/benchrun, River's in
// bench/riverlh) shares: its job, its work, its environment beyond Config,
// and how a stop during start-up ends it.

// Job is a long-horizon job's arguments: its number and a filler of about
// JOB_PAYLOAD_BYTES in all.
type Job struct {
	Seq int64  `json:"seq"`
	Pad string `json:"pad"`
}

// Work is a job's body: it records the start of the job inserted at
// insertedAt (claim latency), then sleeps d (JOB_WORK_MS), or until ctx
// ends (ctx's error).
func (t *Telemetry) Work(ctx context.Context, insertedAt time.Time, d time.Duration) error {
	t.Started(insertedAt)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SchemaFromEnv reads the schema the adapter's variable key names: "" when
// unset (the adapter's default), else a plain identifier by the rule of the
// gendurable schema (sqlq.ValidateSchema); anything else wraps
// ErrInvalidEnv.
func SchemaFromEnv(getenv func(string) string, key string) (string, error) {
	schema := strings.TrimSpace(getenv(key))
	if schema == "" {
		return "", nil
	}
	if err := sqlq.ValidateSchema(schema); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrInvalidEnv, key, err)
	}
	return schema, nil
}

// PoolConfig parses cfg.DatabaseURL (an invalid one wraps ErrInvalidEnv),
// with MaxConns maxConns unless the URL sets pool_max_conns.
func PoolConfig(cfg Config, maxConns int32) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: DATABASE_URL: %v", ErrInvalidEnv, pgurl.HideConnString(err))
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = maxConns
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		// As the CLI's commands: a server that accepts the connection and
		// never answers is an error after this long, not a silent hang.
		pcfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	return pcfg, nil
}

// defaultConnectTimeout bounds each connection attempt unless DATABASE_URL
// sets connect_timeout.
const defaultConnectTimeout = 10 * time.Second

// CloseWithin closes pool, waiting at most d for its connections to come
// back: a connection a stop abandoned on a database that does not answer
// (frozen, cut off) would hold pool.Close, and the adapter's exit, for as
// long. Past d the close goes on in the background (the process exits).
func CloseWithin(pool *pgxpool.Pool, d time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() { pool.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		log.Warn("long horizon: connections still in use after stopping; exiting without them")
	}
}

// Exit is what an adapter returns for its run's err: nil when ctx ended
// (SIGTERM while starting is a stop, not a failure), unless err is about
// the environment.
func Exit(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrInvalidEnv) {
		return nil
	}
	return err
}
