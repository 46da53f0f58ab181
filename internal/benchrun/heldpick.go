package benchrun

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HeldPickResult is one pick's cost after claimed rows were claimed and
// finished, with or without a transaction holding an xid meanwhile, with
// or without the pick's floor (docs/design.md §4).
type HeldPickResult struct {
	Claimed  int     `json:"claimed"` // rows claimed and finished before the picks
	Held     bool    `json:"held"`    // an xid was held open on another connection since before the claims
	Floor    bool    `json:"floor"`   // the pick had a floor (now() − 1 s after the claims) with its priority listed
	Batch    int     `json:"batch"`
	MedianMs float64 `json:"median_ms"`
	P90Ms    float64 `json:"p90_ms"`
	// Per pick, from pg_stat_user_indexes and pg_statio_user_*: plain pick
	// index entries returned, index blocks and heap blocks read.
	IndexTuples float64 `json:"index_tuples"`
	IndexBlocks float64 `json:"index_blocks"`
	HeapBlocks  float64 `json:"heap_blocks"`
	// CheckMs is one floor check's duration (PickFloorCheck: it reads the
	// entries below the floor, heap tuples included); Floor runs only.
	CheckMs float64 `json:"check_ms,omitempty"`
}

// HeldPick measures, for each number of claimed rows, a pick of batch plain
// rows (median and p90 of repeats, each rolled back so every pick sees the
// same rows) without a held xid and with one, without the floor and with
// it. The claims are UPDATEs by primary key in batches of 2,000 rows (each
// its own transaction): what matters to the pick is that the rows left its
// index's predicate after the hold began, not how. It runs in o.Schema
// (recreated for each size and hold).
func HeldPick(ctx context.Context, o Options, sizes []int, batch, repeats int, progress io.Writer) ([]HeldPickResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	q, err := sqlq.New(o.Schema)
	if err != nil {
		return nil, err
	}
	s := `"` + o.Schema + `"`
	var out []HeldPickResult
	for _, n := range sizes {
		for _, held := range []bool{false, true} {
			if err := o.prepare(ctx, pool); err != nil {
				return nil, err
			}
			o.ResetSchema = false // from here on the schema is ours
			fmt.Fprintf(progress, "%d claimed rows, held xid %v…\n", n, held)
			res, err := heldPick(ctx, pool, q, s, o.Schema, n, held, batch, repeats)
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
	}
	o.drop(pool, o.Schema)
	return out, nil
}

func heldPick(ctx context.Context, pool *pgxpool.Pool, q *sqlq.Queries, s, schema string, n int, held bool, batch, repeats int) ([]HeldPickResult, error) {
	exec := func(sql string, args ...any) error {
		_, err := pool.Exec(ctx, sql, args...)
		return err
	}
	if held {
		holder, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = holder.Rollback(context.Background()) }()
		if _, err := holder.Exec(ctx, `SELECT txid_current()`); err != nil {
			return nil, err
		}
	}
	// Rows as they arrive at 200/s, claimed and finished in order.
	if err := exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step, eligible_at)
		SELECT 'bench_job', 'perform', now() - interval '1 second' - (($1::int - g) * interval '5 milliseconds')
		FROM generate_series(1, $1::int) g`, n); err != nil {
		return nil, err
	}
	var lo, hi int64
	if err := pool.QueryRow(ctx, `SELECT min(id), max(id) FROM `+s+`.gendurable_instances`).Scan(&lo, &hi); err != nil {
		return nil, err
	}
	for from := lo; from <= hi; from += 2000 {
		if err := exec(`UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now()
			WHERE id BETWEEN $1 AND $2`, from, min(from+1999, hi)); err != nil {
			return nil, err
		}
	}
	var floor time.Time
	if err := pool.QueryRow(ctx, `SELECT now() - interval '1 second'`).Scan(&floor); err != nil {
		return nil, err
	}
	if err := exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step) SELECT 'bench_job', 'perform' FROM generate_series(1, $1::int)`, 2*batch); err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	c := conn.Conn()
	var out []HeldPickResult
	for _, withFloor := range []bool{false, true} {
		o := sqlq.PickOpts{Limit: batch, Lease: time.Minute}
		if withFloor {
			o.Floor, o.Prios = &floor, []int16{0}
		}
		var ds []float64
		var r0, r1 reads
		for i := 0; i < repeats+2; i++ {
			if i == 2 { // the first two warm the cache and the statement
				if r0, err = readCounters(ctx, c, schema); err != nil {
					return nil, err
				}
			}
			tx, err := c.Begin(ctx)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			picked, err := q.Pick(ctx, tx, "default", o)
			d := time.Since(start)
			_ = tx.Rollback(ctx)
			if err != nil {
				return nil, err
			}
			if len(picked.Claimed) != batch {
				return nil, fmt.Errorf("pick returned %d rows, want %d", len(picked.Claimed), batch)
			}
			if i >= 2 {
				ds = append(ds, float64(d.Microseconds())/1000)
			}
		}
		if r1, err = readCounters(ctx, c, schema); err != nil {
			return nil, err
		}
		sort.Float64s(ds)
		k := float64(repeats)
		res := HeldPickResult{Claimed: n, Held: held, Floor: withFloor, Batch: batch,
			MedianMs: ds[len(ds)/2], P90Ms: ds[len(ds)*9/10],
			IndexTuples: float64(r1.tuples-r0.tuples) / k, IndexBlocks: float64(r1.idxBlocks-r0.idxBlocks) / k,
			HeapBlocks: float64(r1.heapBlocks-r0.heapBlocks) / k}
		if withFloor {
			start := time.Now()
			if _, err := q.PickFloorCheck(ctx, c, "default", floor); err != nil {
				return nil, err
			}
			res.CheckMs = float64(time.Since(start).Microseconds()) / 1000
		}
		out = append(out, res)
	}
	return out, nil
}

// reads are a table's cumulative read counters: the plain pick index's
// entries returned and blocks, and the heap's blocks.
type reads struct{ tuples, idxBlocks, heapBlocks int64 }

// readCounters flushes this backend's pending statistics (PostgreSQL 15:
// pg_stat_force_next_flush) and reads the counters afresh.
func readCounters(ctx context.Context, c *pgx.Conn, schema string) (reads, error) {
	var r reads
	if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return r, err
	}
	if _, err := c.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return r, err
	}
	err := c.QueryRow(ctx, `
		SELECT i.idx_tup_read, si.idx_blks_hit + si.idx_blks_read, st.heap_blks_hit + st.heap_blks_read
		FROM pg_stat_user_indexes AS i
		JOIN pg_statio_user_indexes AS si USING (indexrelid)
		JOIN pg_statio_user_tables AS st ON st.relid = i.relid
		WHERE i.schemaname = $1 AND i.indexrelname = 'gendurable_instances_pick_plain'`, schema).Scan(&r.tuples, &r.idxBlocks, &r.heapBlocks)
	return r, err
}
