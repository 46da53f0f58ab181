package sqlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// BenchmarkApplyOutcomes measures one batch of 500 outcomes through the
// engine's path (pgx statement cache: the plan PostgreSQL settles on), with
// the claim in the loop but outside the timer; "done-1" and "done-50" are
// "done" with batches of 1 and 50 (a statement's fixed cost shows in the
// first, the keyed workload's batch size is near the second). "floor" is the physical floor
// measured in the same run: a bare UPDATE … FROM unnest by primary key that
// moves the same rows to done, no fence, no history, nothing returned.
func BenchmarkApplyOutcomes(b *testing.B) {
	for _, mode := range []string{"floor", "done", "done-1", "done-50", "next", "next-continue", "done-generic"} {
		b.Run(mode, func(b *testing.B) {
			pool, schema := dbtest.NewSchema(b, &dbtest.Options{MaxConns: 2})
			ctx := context.Background()
			q, _ := sqlq.New(schema)
			n := 500
			switch mode {
			case "done-1":
				n = 1
			case "done-50":
				n = 50
			}
			if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step)
				SELECT 'm', 'a' FROM generate_series(1, $1::int)`, (b.N+2)*n+200); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE "`+schema+`".gendurable_instances`); err != nil {
				b.Fatal(err)
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			if mode == "done-generic" {
				if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
					b.Fatal(err)
				}
			}
			floor := `UPDATE "` + schema + `".gendurable_instances AS i
				SET status = 'done', result = r.res::jsonb, finished_at = now()
				FROM unnest($1::bigint[], $2::text[]) AS r(id, res) WHERE i.id = r.id`
			res := `{"ok":true}`
			step := "b"
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				picked, err := q.Pick(ctx, conn, "default", sqlq.PickOpts{Limit: n, Lease: time.Minute})
				rows := picked.Claimed
				if err != nil || len(rows) != n {
					b.Fatal(err, len(rows))
				}
				batch := sqlq.OutcomeBatch{Lease: time.Minute}
				ids, results := make([]int64, 0, n), make([]string, 0, n)
				for _, r := range rows {
					o := sqlq.Outcome{ID: r.ID, Token: r.Token, Kind: sqlq.KindDone, Result: &res}
					if mode == "next" || mode == "next-continue" {
						o = sqlq.Outcome{ID: r.ID, Token: r.Token, Kind: sqlq.KindNext, Step: &step, State: &res,
							Continue: mode == "next-continue"}
					}
					batch.Add(&o)
					ids, results = append(ids, r.ID), append(results, res)
				}
				b.StartTimer()
				if mode == "floor" {
					_, err = conn.Exec(ctx, floor, ids, results)
				} else {
					var applied []sqlq.Applied
					applied, err = q.ApplyOutcomes(ctx, conn, &batch)
					if err == nil && len(applied) != n {
						b.Fatalf("applied %d of %d", len(applied), n)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				if mode == "next-continue" {
					b.StopTimer()
					// Hand the rows back so the next pick finds runnable work.
					if _, err := conn.Exec(ctx, `UPDATE "`+schema+`".gendurable_instances SET status = 'done',
						claim_token = NULL, lease_expires_at = NULL WHERE id = ANY ($1)`, ids); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/row")
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

// BenchmarkInsertPath compares two ways to insert 5,000 plain rows and get
// their ids: the engine's one unnest statement, and COPY into a temporary
// staging table followed by INSERT … SELECT … RETURNING (five round trips:
// begin, create, copy, insert, commit). The engine keeps unnest: see
// BENCHMARKS.md for the figures.
func BenchmarkInsertPath(b *testing.B) {
	for _, path := range []string{"unnest", "copy-staging"} {
		b.Run(path, func(b *testing.B) {
			pool, schema := dbtest.NewSchema(b, &dbtest.Options{MaxConns: 2})
			ctx := context.Background()
			q, _ := sqlq.New(schema)
			const n = 5000
			rows := make([]sqlq.NewInstance, n)
			for j := range rows {
				rows[j] = sqlq.NewInstance{FSM: "m", Version: 1, Queue: "default", Step: "a", State: `{"i":1}`, MaxAttempts: 20}
			}
			copyRows := make([][]any, n)
			for j := range copyRows {
				copyRows[j] = []any{int64(j), "m", int32(1), "default", "a", `{"i":1}`, int16(0), int32(20)}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if path == "unnest" {
					if _, err := q.InsertMany(ctx, pool, rows); err != nil {
						b.Fatal(err)
					}
					continue
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `CREATE TEMP TABLE stage (ord bigint, fsm text, fsm_version int, queue text,
						step text, state text, priority smallint, max_attempts int) ON COMMIT DROP`); err != nil {
						return err
					}
					if _, err := tx.CopyFrom(ctx, pgx.Identifier{"stage"},
						[]string{"ord", "fsm", "fsm_version", "queue", "step", "state", "priority", "max_attempts"},
						pgx.CopyFromRows(copyRows)); err != nil {
						return err
					}
					r, err := tx.Query(ctx, `INSERT INTO "`+schema+`".gendurable_instances
						(fsm, fsm_version, queue, step, state, priority, max_attempts)
						SELECT fsm, fsm_version, queue, step, state::jsonb, priority, max_attempts FROM stage ORDER BY ord
						RETURNING id`)
					if err != nil {
						return err
					}
					_, err = pgx.CollectRows(r, pgx.RowTo[int64])
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkKeyHandOff measures the outcome statement of 50 keyed Dones, one
// per key (the bench's partition workload in small): "done" frees the slots
// (the next holders are then picked, outside the timer), "handoff" also
// claims each key's next row in the same statement (docs/design.md §6).
func BenchmarkKeyHandOff(b *testing.B) {
	for _, mode := range []string{"done", "handoff"} {
		b.Run(mode, func(b *testing.B) {
			pool, schema := dbtest.NewSchema(b, &dbtest.Options{MaxConns: 2})
			ctx := context.Background()
			q, _ := sqlq.New(schema)
			const keys = 50
			if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, partition_key)
				SELECT 'm', 'a', 'key-' || (g % $2) FROM generate_series(1, $1::int) g`, (b.N+2)*keys, keys); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE "`+schema+`".gendurable_instances`); err != nil {
				b.Fatal(err)
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			pick := func() []sqlq.Claimed {
				picked, err := q.Pick(ctx, conn, "default", sqlq.PickOpts{Limit: keys, Lease: time.Minute})
				if err != nil || len(picked.Claimed) != keys {
					b.Fatal(err, len(picked.Claimed))
				}
				return picked.Claimed
			}
			holders := pick()
			res := `{"ok":true}`
			handoff := int32(0)
			if mode == "handoff" {
				handoff = 1
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				batch := sqlq.OutcomeBatch{Lease: time.Minute}
				for _, h := range holders {
					batch.Add(&sqlq.Outcome{ID: h.ID, Token: h.Token, Kind: sqlq.KindDone, Result: &res, Handoff: handoff})
				}
				applied, err := q.ApplyOutcomes(ctx, conn, &batch)
				if err != nil || len(applied) != keys {
					b.Fatal(err, len(applied))
				}
				if mode == "done" {
					b.StopTimer()
					holders = pick()
					b.StartTimer()
					continue
				}
				holders = holders[:0]
				for _, a := range applied {
					if a.Successor == nil {
						b.Fatalf("no successor for %d", a.ID)
					}
					holders = append(holders, *a.Successor)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*keys), "µs/row")
		})
	}
}
