package benchrun

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
)

// IdleResult is what an idle engine costs.
type IdleResult struct {
	Seconds             float64 `json:"seconds"`
	Statements          int64   `json:"statements"`
	StatementsPerSecond float64 `json:"statements_per_sec"`
}

// Idle starts one engine with default settings on an empty queue, waits for
// its poll interval to back off (warmup), then counts its statements for d.
// It runs in o.Schema (o's database, schema and reset fields are used).
func Idle(ctx context.Context, o Options, warmup, d time.Duration) (*IdleResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	schema := o.Schema
	stmts := &counter{}
	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pcfg.ConnConfig.Tracer = stmts
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := o.prepare(ctx, pool); err != nil {
		return nil, err
	}
	defer o.drop(pool, schema)
	job, _, _, _ := machines(0)
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: schema, Machines: []gendurable.Definition{job},
		Queues: map[string]gendurable.QueueConfig{"default": {}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = eng.Stop(context.Background()) }()
	time.Sleep(warmup)
	stmts.reset()
	time.Sleep(d)
	n := stmts.n.Load()
	return &IdleResult{Seconds: d.Seconds(), Statements: n, StatementsPerSecond: float64(n) / d.Seconds()}, nil
}

// PickupResult is the latency from a local insert to its step starting.
type PickupResult struct {
	Samples int     `json:"samples"`
	P50Ms   float64 `json:"p50_ms"`
	P90Ms   float64 `json:"p90_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// Pickup inserts one job at a time into an idle engine (default settings,
// so its poll interval has backed off) and measures how long each takes to
// start running: the local wake-up, not polling, is what is measured. It
// runs in o.Schema (o's database, schema and reset fields are used).
func Pickup(ctx context.Context, o Options, samples int) (*PickupResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	schema := o.Schema
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := o.prepare(ctx, pool); err != nil {
		return nil, err
	}
	defer o.drop(pool, schema)
	started := make(chan time.Time, 1)
	job := &gendurable.Job[args]{Name: "bench_pickup", Perform: func(context.Context, *gendurable.Run[args]) error {
		started <- time.Now()
		return nil
	}}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: schema, Machines: []gendurable.Definition{job},
		Queues: map[string]gendurable.QueueConfig{"default": {}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = eng.Stop(context.Background()) }()
	var ds []float64
	for i := 0; i < samples; i++ {
		time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond) // let it go idle
		at := time.Now()
		if _, err := eng.Insert(ctx, job.New(args{I: i})); err != nil {
			return nil, err
		}
		select {
		case t := <-started:
			ds = append(ds, float64(t.Sub(at).Microseconds())/1000)
		case <-time.After(10 * time.Second):
			return nil, context.DeadlineExceeded
		}
	}
	sort.Float64s(ds)
	return &PickupResult{Samples: len(ds), P50Ms: ds[len(ds)/2], P90Ms: ds[len(ds)*9/10], MaxMs: ds[len(ds)-1]}, nil
}
