package sqlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// BenchmarkApplyOutcomes measures one batch of 500 Done outcomes (claim
// included in the loop, excluded from the timer): planned for the batch as
// the engine does; through a forced generic plan; and through the plan the
// statement cache settles on after small batches came first (the default
// mode before the engine plans large batches itself).
func BenchmarkApplyOutcomes(b *testing.B) {
	for _, mode := range []string{"per-batch-plan", "cached-generic-plan", "cached-after-small-batches"} {
		b.Run(mode, func(b *testing.B) {
			pool, schema := dbtest.NewSchema(b, nil)
			ctx := context.Background()
			q, _ := sqlq.New(schema)
			const n = 500
			if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step)
				SELECT 'm', 'a' FROM generate_series(1, $1::int)`, (b.N+2)*n+200); err != nil {
				b.Fatal(err)
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			if mode == "cached-generic-plan" {
				if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
					b.Fatal(err)
				}
			}
			res := `null`
			if mode == "cached-after-small-batches" {
				for i := 0; i < 10; i++ {
					rows, err := q.Pick(ctx, conn, "default", 20, time.Minute)
					if err != nil {
						b.Fatal(err)
					}
					var batch sqlq.OutcomeBatch
					for _, r := range rows {
						batch.Add(&sqlq.Outcome{ID: r.ID, Token: r.Token, Kind: sqlq.KindDone, Result: &res})
					}
					if _, err := conn.Exec(ctx, q.ApplyOutcomesSQL(), batch.Args()...); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				rows, err := q.Pick(ctx, conn, "default", n, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				var batch sqlq.OutcomeBatch
				for _, r := range rows {
					batch.Add(&sqlq.Outcome{ID: r.ID, Token: r.Token, Kind: sqlq.KindDone, Result: &res})
				}
				args := batch.Args()
				if mode == "per-batch-plan" {
					args = append([]any{pgx.QueryExecModeExec}, args...)
				}
				b.StartTimer()
				if _, err := conn.Exec(ctx, q.ApplyOutcomesSQL(), args...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/outcome")
		})
	}
}

// BenchmarkInsertMany measures inserting 5,000 rows in one statement.
func BenchmarkInsertMany(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		name := "plain"
		if keyed {
			name = "unique-keys"
		}
		b.Run(name, func(b *testing.B) {
			pool, schema := dbtest.NewSchema(b, nil)
			ctx := context.Background()
			q, _ := sqlq.New(schema)
			const n = 5000
			rows := make([]sqlq.NewInstance, n)
			for i := 0; i < b.N; i++ {
				for j := range rows {
					rows[j] = sqlq.NewInstance{FSM: "m", Version: 1, Queue: "default", Step: "a", State: `{"i":1}`, MaxAttempts: 20}
					if keyed {
						rows[j].UniqueKey, rows[j].ScopeMask = []byte{byte(i), byte(j), byte(j >> 8)}, 0b1111
					}
				}
				if _, err := q.InsertMany(ctx, pool, rows); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
