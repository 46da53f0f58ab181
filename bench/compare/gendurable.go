package compare

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gendurable/gendurable"
)

// gdNoop is the gendurable side of the no-op job, as the producer registers
// it; a worker process registers the same name with a Perform that records
// latencies when asked to (newGDWorker).
var gdNoop = &gendurable.Job[NoopArgs]{
	Name:    "bench_noop",
	Perform: func(context.Context, *gendurable.Run[NoopArgs]) error { return nil },
}

// gdProducer inserts through an insert-only engine.
type gdProducer struct {
	eng *gendurable.Engine
}

func newGDProducer(o *Options, pool *pgxpool.Pool, logger *slog.Logger) (*gdProducer, error) {
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   o.GDSchema,
		Machines: []gendurable.Definition{gdNoop},
		Logger:   logger,
	})
	if err != nil {
		return nil, fmt.Errorf("gendurable engine: %w", err)
	}
	return &gdProducer{eng: eng}, nil
}

func (p *gdProducer) insert(ctx context.Context, args []NoopArgs) error {
	params := make([]gendurable.InsertParams, len(args))
	for i, a := range args {
		params[i] = gdNoop.New(a)
	}
	if _, err := p.eng.InsertMany(ctx, params); err != nil {
		return fmt.Errorf("gendurable InsertMany: %w", err)
	}
	return nil
}

// gdWorker is gendurable's side of a worker process: an engine on the
// process's pool, counting completions from its StepEvent hook (called
// once the "done" outcome is written).
type gdWorker struct {
	eng *gendurable.Engine

	done     atomic.Int64
	last     atomic.Int64 // Unix ns of the last completion seen
	unwanted atomic.Int64 // anything but a committed "done"
	started  bool
	stopOnce sync.Once
}

func newGDWorker(spec *workerSpec, pool *pgxpool.Pool, logger *slog.Logger, lat *latencyRec) (*gdWorker, error) {
	r := &gdWorker{}
	hook := gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		e, ok := ev.(*gendurable.StepEvent)
		if !ok {
			return
		}
		if e.Outcome != "done" || e.Fenced || e.CommitErr != nil || e.Err != nil {
			r.unwanted.Add(1)
			return
		}
		now := time.Now().UnixNano()
		if lat != nil {
			lat.completed(e.InstanceID, now)
		}
		r.last.Store(now)
		r.done.Add(1)
	})
	job := &gendurable.Job[NoopArgs]{
		Name: gdNoop.Name,
		Perform: func(_ context.Context, j *gendurable.Run[NoopArgs]) error {
			if lat != nil {
				lat.picked(j.ID, j.State)
			}
			return nil
		},
	}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   spec.Schema,
		Machines: []gendurable.Definition{job},
		Queues:   map[string]gendurable.QueueConfig{"default": spec.GD},
		Logger:   logger,
		Hooks:    []gendurable.Hook{hook},
	})
	if err != nil {
		return nil, fmt.Errorf("gendurable engine: %w", err)
	}
	r.eng = eng
	return r, nil
}

func (r *gdWorker) start(ctx context.Context) error {
	if err := r.eng.Start(ctx); err != nil {
		return fmt.Errorf("gendurable start: %w", err)
	}
	r.started = true
	return nil
}

func (r *gdWorker) completed() int64      { return r.done.Load() }
func (r *gdWorker) lastCompletion() int64 { return r.last.Load() }
func (r *gdWorker) anomalies() int64      { return r.unwanted.Load() }

func (r *gdWorker) stop(ctx context.Context) error {
	var err error
	r.stopOnce.Do(func() {
		if !r.started {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = r.eng.Stop(sctx)
	})
	return err
}

func gdDBCounts(ctx context.Context, admin *pgxpool.Pool, o *Options) (done, total int64, err error) {
	inst, _ := o.gdTables()
	err = admin.QueryRow(ctx, fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM %s`, inst)).Scan(&done, &total)
	return done, total, err
}
