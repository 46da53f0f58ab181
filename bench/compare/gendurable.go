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

// gdNoop is the gendurable side of the no-op job.
var gdNoop = &gendurable.Job[NoopArgs]{
	Name:    "bench_noop",
	Perform: func(context.Context, *gendurable.Run[NoopArgs]) error { return nil },
}

// gdRun is one gendurable run: an engine on its own pool, counting
// completions from its StepEvent hook (called once the "done" outcome is
// written).
type gdRun struct {
	o   *Options
	s   setting
	eng *gendurable.Engine

	done     atomic.Int64
	unwanted atomic.Int64 // anything but a committed "done"
	doneCh   chan struct{}
	doneOnce sync.Once
	target   int64
	started  bool
}

func newGDRun(o *Options, s setting, pool *pgxpool.Pool, logger *slog.Logger) (*gdRun, error) {
	r := &gdRun{o: o, s: s, doneCh: make(chan struct{}), target: int64(o.N)}
	hook := gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		e, ok := ev.(*gendurable.StepEvent)
		if !ok {
			return
		}
		if e.Outcome != "done" || e.Fenced || e.CommitErr != nil || e.Err != nil {
			r.unwanted.Add(1)
			return
		}
		if r.done.Add(1) >= r.target {
			r.doneOnce.Do(func() { close(r.doneCh) })
		}
	})
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   o.GDSchema,
		Machines: []gendurable.Definition{gdNoop},
		Queues:   map[string]gendurable.QueueConfig{"default": s.gd},
		Logger:   logger,
		Hooks:    []gendurable.Hook{hook},
	})
	if err != nil {
		return nil, fmt.Errorf("gendurable engine: %w", err)
	}
	r.eng = eng
	return r, nil
}

func (r *gdRun) insert(ctx context.Context, from, to int) error {
	params := make([]gendurable.InsertParams, 0, r.o.InsertBatch)
	for lo := from; lo < to; lo += r.o.InsertBatch {
		hi := min(lo+r.o.InsertBatch, to)
		params = params[:0]
		for i := lo; i < hi; i++ {
			params = append(params, gdNoop.New(NoopArgs{Num: i}))
		}
		if _, err := r.eng.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("gendurable InsertMany: %w", err)
		}
	}
	return nil
}

func (r *gdRun) start(ctx context.Context) error {
	if err := r.eng.Start(ctx); err != nil {
		return err
	}
	r.started = true
	return nil
}

func (r *gdRun) completed() int64          { return r.done.Load() }
func (r *gdRun) finished() <-chan struct{} { return r.doneCh }
func (r *gdRun) anomalies() int64          { return r.unwanted.Load() }

func (r *gdRun) stop(ctx context.Context) error {
	if !r.started {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return r.eng.Stop(sctx)
}

func (r *gdRun) dbCounts(ctx context.Context, admin *pgxpool.Pool) (done, total int64, err error) {
	inst, _ := r.o.gdTables()
	err = admin.QueryRow(ctx, fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM %s`, inst)).Scan(&done, &total)
	return done, total, err
}
