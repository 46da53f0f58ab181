package benchrun

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BacklogResult is the pick latency at one backlog size.
type BacklogResult struct {
	Runnable int     `json:"runnable"`
	Batch    int     `json:"batch"`
	MedianMs float64 `json:"median_ms"`
	P90Ms    float64 `json:"p90_ms"`
}

// Backlog measures one pick's latency (median of repeats, each in a rolled
// back transaction so the backlog stays as seeded) with the given numbers
// of runnable rows, seeded with generate_series plus a terminal bulk of
// half as many rows, then VACUUM ANALYZEd. It runs in o.Schema (o's
// database, schema and reset fields are used), recreated for each size.
func Backlog(ctx context.Context, o Options, sizes []int, batch, repeats int, progress io.Writer) ([]BacklogResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	schema := o.Schema
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	q, err := sqlq.New(schema)
	if err != nil {
		return nil, err
	}
	var out []BacklogResult
	for _, n := range sizes {
		if err := o.prepare(ctx, pool); err != nil {
			return nil, err
		}
		o.ResetSchema = false // from here on the schema is ours
		fmt.Fprintf(progress, "seeding %d runnable rows…\n", n)
		s := `"` + schema + `"`
		for _, sql := range []string{
			`INSERT INTO ` + s + `.gendurable_instances (fsm, queue, step, priority, eligible_at)
			 SELECT 'bench_job', 'default', 'perform', (g % 3)::smallint, now() - (g % 10000) * interval '1 millisecond'
			 FROM generate_series(1, $1::int) g`,
			`INSERT INTO ` + s + `.gendurable_instances (fsm, step, status, finished_at)
			 SELECT 'bench_job', 'perform', 'done', now() FROM generate_series(1, $1::int / 2) g`,
		} {
			if _, err := pool.Exec(ctx, sql, n); err != nil {
				return nil, err
			}
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.gendurable_instances`); err != nil {
			return nil, err
		}
		var ds []float64
		for i := 0; i < repeats+2; i++ {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			picked, err := q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: batch, Lease: time.Minute})
			rows := picked.Claimed
			d := time.Since(start)
			_ = tx.Rollback(ctx)
			if err != nil {
				return nil, err
			}
			if len(rows) != batch {
				return nil, fmt.Errorf("pick returned %d rows, want %d", len(rows), batch)
			}
			if i >= 2 { // the first two warm the cache and the statement
				ds = append(ds, float64(d.Microseconds())/1000)
			}
		}
		sort.Float64s(ds)
		out = append(out, BacklogResult{Runnable: n, Batch: batch, MedianMs: ds[len(ds)/2], P90Ms: ds[len(ds)*9/10]})
	}
	o.drop(pool, schema)
	return out, nil
}
