package compare

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Insert paths of the insert mode.
const (
	PathRiverInsertMany     = "river/InsertMany"
	PathRiverInsertManyFast = "river/InsertManyFast"
	PathGDInsertMany        = "gendurable/InsertMany"
)

var insertPaths = []string{PathRiverInsertMany, PathGDInsertMany, PathRiverInsertManyFast}

// InsertResult is one insert-mode run: InsertN rows in batches of
// InsertBatch through one bulk-insert path, no workers running.
type InsertResult struct {
	Path              string  `json:"path"`
	Round             int     `json:"round"`
	N                 int     `json:"n"`
	StatsFinishedFrac float64 `json:"stats_finished_frac"`
	Seconds           float64 `json:"seconds"`
	RowsPerSec        float64 `json:"rows_per_sec"`
	Load1             float64 `json:"load1"` // before the run's reset
}

func runInserts(ctx context.Context, o *Options, admin *pgxpool.Pool, rep *Report) error {
	for round := 1; round <= o.Rounds; round++ {
		for _, path := range insertPaths {
			fmt.Fprintf(o.Progress, "[insert %s round %d/%d]\n", path, round, o.Rounds)
			res, err := runInsertOne(ctx, o, admin, path, round)
			if err != nil {
				return fmt.Errorf("insert %s round %d: %w", path, round, err)
			}
			rep.Inserts = append(rep.Inserts, res)
			fmt.Fprintf(o.Progress, "  %d rows in %.2fs = %.0f rows/s (stats finished %.2f, load1 %.2f)\n",
				res.N, res.Seconds, res.RowsPerSec, res.StatsFinishedFrac, res.Load1)
		}
	}
	return nil
}

func runInsertOne(ctx context.Context, o *Options, admin *pgxpool.Pool, path string, round int) (res InsertResult, err error) {
	system := SystemGendurable
	if path != PathGDInsertMany {
		system = SystemRiver
	}
	n := o.insertN()
	res = InsertResult{Path: path, Round: round, N: n, Load1: loadAvg1()}
	if res.StatsFinishedFrac, err = reset(ctx, admin, o, system); err != nil {
		return res, err
	}
	prod, pool, err := openProducer(ctx, o, system, path == PathRiverInsertManyFast, producerPoolConns)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	t0 := time.Now()
	if err := insertRange(ctx, o, prod, 0, n); err != nil {
		return res, err
	}
	d := time.Since(t0)
	_, total, err := dbCounts(ctx, admin, o, system)
	if err != nil {
		return res, fmt.Errorf("count: %w", err)
	}
	if total != int64(n) {
		return res, fmt.Errorf("database has %d rows, want %d", total, n)
	}
	res.Seconds = d.Seconds()
	res.RowsPerSec = float64(n) / d.Seconds()
	return res, nil
}
