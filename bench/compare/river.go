package compare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// NoopArgs is the job both systems run: its work returns nil at once.
type NoopArgs struct {
	Num int `json:"num"`
	// Ins is the producer's wall clock (Unix ns) taken just before the
	// insert call that carried the job: set in the continuous mode only,
	// where latencies are measured from it (same machine, same clock).
	Ins int64 `json:"ins,omitempty"`
	// Warmup marks a continuous-mode job inserted during the warm-up: worked
	// and awaited like the others, left out of the latency figures.
	Warmup bool `json:"warmup,omitempty"`
}

// Kind is River's job kind.
func (NoopArgs) Kind() string { return "bench_noop" }

// idleNum marks the job inserted after an idle period.
const idleNum = -1

func riverWorkers(work func(context.Context, *river.Job[NoopArgs]) error) *river.Workers {
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(work))
	return workers
}

// riverProducer inserts through an insert-only River client.
type riverProducer struct {
	client *river.Client[pgx.Tx]
	fast   bool
}

func newRiverProducer(o *Options, pool *pgxpool.Pool, fast bool, logger *slog.Logger) (*riverProducer, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:  o.RiverSchema,
		Workers: riverWorkers(func(context.Context, *river.Job[NoopArgs]) error { return nil }),
		Logger:  logger,
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return &riverProducer{client: client, fast: fast}, nil
}

func (p *riverProducer) insert(ctx context.Context, args []NoopArgs) error {
	params := make([]river.InsertManyParams, len(args))
	for i, a := range args {
		params[i] = river.InsertManyParams{Args: a}
	}
	if p.fast {
		if _, err := p.client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("river InsertManyFast: %w", err)
		}
		return nil
	}
	if _, err := p.client.InsertMany(ctx, params); err != nil {
		return fmt.Errorf("river InsertMany: %w", err)
	}
	return nil
}

// riverWorker is River's side of a worker process: a client on the
// process's pool, counting completions from its event subscription (which
// fires after the completer has written the completed state, as `river
// bench` counts).
type riverWorker struct {
	client *river.Client[pgx.Tx]

	done      atomic.Int64
	last      atomic.Int64 // Unix ns of the last completion seen
	unwanted  atomic.Int64 // failed / cancelled events
	subCancel func()
	subDone   chan struct{}
	started   bool
	stopOnce  sync.Once
}

func newRiverWorker(spec *workerSpec, pool *pgxpool.Pool, logger *slog.Logger, lat *latencyRec) (*riverWorker, error) {
	work := func(_ context.Context, j *river.Job[NoopArgs]) error {
		if lat != nil {
			lat.picked(j.ID, j.Args)
		}
		return nil
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            spec.Schema,
		FetchCooldown:     spec.RiverFetchCooldown,
		FetchPollInterval: spec.RiverFetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: spec.RiverMaxWorkers}},
		Workers:           riverWorkers(work),
		Logger:            logger,
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	r := &riverWorker{client: client, subDone: make(chan struct{})}
	sub, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: spec.Expect + 1000, // never drop an event: they are our completion count
		Kinds: []river.EventKind{
			river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled,
		},
	})
	r.subCancel = cancel
	go func() {
		defer close(r.subDone)
		for ev := range sub {
			if ev.Kind != river.EventKindJobCompleted {
				r.unwanted.Add(1)
				continue
			}
			now := time.Now().UnixNano()
			if lat != nil {
				lat.completed(ev.Job.ID, now)
			}
			r.last.Store(now)
			r.done.Add(1)
		}
	}()
	return r, nil
}

func (r *riverWorker) start(ctx context.Context) error {
	if err := r.client.Start(ctx); err != nil {
		return fmt.Errorf("river start: %w", err)
	}
	r.started = true
	return nil
}

func (r *riverWorker) completed() int64      { return r.done.Load() }
func (r *riverWorker) lastCompletion() int64 { return r.last.Load() }
func (r *riverWorker) anomalies() int64      { return r.unwanted.Load() }

// stop stops the client (StopAndCancel if a graceful stop overruns) and
// ends the subscription. The pool is the caller's to close.
func (r *riverWorker) stop(ctx context.Context) error {
	var err error
	r.stopOnce.Do(func() {
		defer func() {
			r.subCancel()
			<-r.subDone
		}()
		if !r.started {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = r.client.Stop(sctx)
		if err != nil {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			defer ccancel()
			err = errors.Join(err, r.client.StopAndCancel(cctx))
		}
	})
	return err
}

func riverDBCounts(ctx context.Context, admin *pgxpool.Pool, o *Options) (done, total int64, err error) {
	err = admin.QueryRow(ctx, fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM %s`, o.riverJobTable())).Scan(&done, &total)
	return done, total, err
}
