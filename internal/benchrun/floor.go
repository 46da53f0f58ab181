package benchrun

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FloorResult is the physical floor of this server at a connection count.
type FloorResult struct {
	Conns      int     `json:"conns"`
	Batch      int     `json:"batch"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// JobsPerSec is half of RowsPerSec: a job writes its row twice (claim, outcome).
	JobsPerSec float64 `json:"jobs_limit_per_sec"`
}

// MaxFloorConns bounds Floor's connections: each seeds 5,000 rows of its
// own, and a pool's size is an int32.
const MaxFloorConns = 1000

// Floor measures rows/s of 500-row UPDATE … FROM unnest statements by
// primary key that flip the indexed status column, from conns connections
// at once for d, each on rows of its own (no lock waits). It runs in
// o.Schema (o's database, schema and reset fields are used).
func Floor(ctx context.Context, o Options, conns int, d time.Duration) (*FloorResult, error) {
	if conns < 1 || conns > MaxFloorConns {
		return nil, fmt.Errorf("bench: the floor takes 1..%d connections", MaxFloorConns)
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	const batch = 500
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := o.prepare(ctx, pool); err != nil {
		return nil, err
	}
	defer o.drop(pool, o.Schema)
	q, err := sqlq.New(o.Schema)
	if err != nil {
		return nil, err
	}
	// Ten batches of rows per connection, so consecutive statements of one
	// connection touch different pages, as a queue's would.
	ids, err := q.FloorSeed(ctx, pool, conns*batch*10)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE "`+o.Schema+`".gendurable_instances`); err != nil {
		return nil, err
	}
	var rows atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	start := time.Now()
	deadline := start.Add(d)
	for c := range conns {
		mine := ids[c*batch*10 : (c+1)*batch*10]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				n, err := q.FloorFlip(ctx, pool, mine[(i%10)*batch:(i%10+1)*batch])
				if err != nil {
					errs <- err
					return
				}
				rows.Add(n)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start).Seconds()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	r := float64(rows.Load()) / took
	return &FloorResult{Conns: conns, Batch: batch, Seconds: took, RowsPerSec: r, JobsPerSec: r / 2}, nil
}
