package compare

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LimitResult is the database's physical limit as this comparison counts
// it, measured once per throughput round: rows/s of LimitBatch-row
// `UPDATE … FROM unnest($1::bigint[])` statements by primary key, each
// changing an indexed status column (no HOT update), one transaction
// each, on as many connections as a worker process has (PoolConns). A job
// costs two row writes (claim and completion), so JobCeiling = RowsPerSec/2.
type LimitResult struct {
	Round      int     `json:"round"`
	Conns      int     `json:"conns"`
	Batch      int     `json:"batch"`
	Rows       int64   `json:"rows"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
	JobCeiling float64 `json:"job_ceiling_per_sec"`
	Load1      float64 `json:"load1"`
}

// limitRowsPerConn: each connection cycles through its own rows, this many.
const limitRowsPerConn = 10000

func (o *Options) limitTable() string {
	return pgx.Identifier{o.GDSchema, "bench_limit"}.Sanitize()
}

func runLimit(ctx context.Context, o *Options, admin *pgxpool.Pool, round int) (res LimitResult, err error) {
	conns := int(o.PoolConns)
	if conns <= 0 {
		conns = 4
	}
	res = LimitResult{Round: round, Conns: conns, Batch: o.LimitBatch, Load1: loadAvg1()}
	t := o.limitTable()
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (id bigint PRIMARY KEY, status text NOT NULL, n int NOT NULL DEFAULT 0)`,
		`CREATE INDEX IF NOT EXISTS bench_limit_status ON ` + t + ` (status)`,
		`TRUNCATE ` + t,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return res, fmt.Errorf("limit table: %w", err)
		}
	}
	if _, err := admin.Exec(ctx, `INSERT INTO `+t+` (id, status) SELECT g, 'runnable' FROM generate_series(1, $1::int) g`,
		conns*limitRowsPerConn); err != nil {
		return res, fmt.Errorf("fill limit table: %w", err)
	}
	if _, err := admin.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
		return res, fmt.Errorf("vacuum limit table: %w", err)
	}
	pool, err := openPool(ctx, o, int32(conns), "gendurable-bench-limit")
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if err := warmPool(ctx, pool); err != nil {
		return res, fmt.Errorf("warm pool: %w", err)
	}
	update := `UPDATE ` + t + ` AS t
		SET status = CASE t.status WHEN 'runnable' THEN 'executing' ELSE 'runnable' END, n = t.n + 1
		FROM unnest($1::bigint[]) AS u(id) WHERE t.id = u.id`

	var (
		rows     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	batch := o.LimitBatch
	t0 := time.Now()
	deadline := t0.Add(o.LimitDuration)
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := int64(c * limitRowsPerConn)
			ids := make([]int64, batch)
			for i := 0; time.Now().Before(deadline); i++ {
				off := int64(i*batch) % int64(limitRowsPerConn-batch+1)
				for j := range ids {
					ids[j] = base + off + int64(j) + 1
				}
				tag, err := pool.Exec(ctx, update, ids)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				rows.Add(tag.RowsAffected())
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	if firstErr != nil {
		return res, fmt.Errorf("limit update: %w", firstErr)
	}
	res.Rows = rows.Load()
	res.Seconds = d.Seconds()
	res.RowsPerSec = float64(res.Rows) / d.Seconds()
	res.JobCeiling = res.RowsPerSec / 2
	return res, nil
}
