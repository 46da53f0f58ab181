// Command park-sweeps counts the await-timeout sweep statements one engine
// sends while it parks 5,000 instances in an Await with a one-minute
// timeout (no signal comes): before the sweeper took a deadline with each
// poke, every parked await swept at once (BENCHMARKS.md, "Await-timeout
// sweeps per parked await").
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go run ./cmd/park-sweeps SCHEMA
//
// It creates SCHEMA (refusing one that exists) and drops it at the end.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type S struct{}

var sweeps, all atomic.Int64

type tracer struct{}

func (tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	all.Add(1)
	if strings.Contains(d.SQL, "WITH due AS") {
		sweeps.Add(1)
	}
	return ctx
}
func (tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func main() {
	ctx := context.Background()
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: park-sweeps SCHEMA (created, then dropped)")
		os.Exit(2)
	}
	schema := os.Args[1]
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "park-sweeps: DATABASE_URL:", err)
		os.Exit(2)
	}
	cfg.ConnConfig.Tracer = tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, pgx.Identifier{schema}.Sanitize()).Scan(&exists); err != nil {
		panic(err)
	}
	if exists { // it drops its schema at the end: never one it did not create
		fmt.Fprintf(os.Stderr, "park-sweeps: schema %q exists: give a new one\n", schema)
		os.Exit(2)
	}
	if _, err := migrate.Up(ctx, pool, schema); err != nil {
		panic(err)
	}
	m := &gendurable.Machine[S]{Name: "park", Start: "a", Steps: map[string]gendurable.StepFunc[S]{
		"a": func(ctx context.Context, r *gendurable.Run[S]) (gendurable.Outcome, error) {
			return r.Await("b", r.State, "go").Timeout(time.Minute), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[S]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		},
	}}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{m},
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 100}}})
	if err != nil {
		panic(err)
	}
	const n = 5000
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = m.New(S{})
	}
	if _, err := eng.InsertMany(ctx, ps); err != nil {
		panic(err)
	}
	sweeps.Store(0)
	all.Store(0)
	start := time.Now()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var k int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+`.gendurable_instances WHERE status = 'awaiting_signal'`).Scan(&k)
		if k == n {
			break
		}
		if time.Now().After(deadline) {
			_ = eng.Stop(ctx)
			_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			fmt.Fprintf(os.Stderr, "park-sweeps: %d of %d parked after a minute\n", k, n)
			os.Exit(1)
		}
	}
	took := time.Since(start)
	_ = eng.Stop(ctx)
	fmt.Printf("%d parks in %s: %d sweep statements, %d statements in all\n", n, took.Round(time.Millisecond), sweeps.Load(), all.Load())
	_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}
