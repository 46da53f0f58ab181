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
}

// Kind is River's job kind.
func (NoopArgs) Kind() string { return "bench_noop" }

// riverRun is one River run: a client on its own pool, counting completions
// from its event subscription (which fires after the completer has written
// the completed state, as `river bench` counts).
type riverRun struct {
	o      *Options
	s      setting
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]

	done      atomic.Int64
	unwanted  atomic.Int64 // failed / cancelled / discarded events
	doneCh    chan struct{}
	doneOnce  sync.Once
	subCancel func()
	subDone   chan struct{}
	target    int64
	started   bool
}

func newRiverRun(o *Options, s setting, pool *pgxpool.Pool, logger *slog.Logger) (*riverRun, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[NoopArgs]) error { return nil }))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            o.RiverSchema,
		FetchCooldown:     s.riverFetchCooldown,
		FetchPollInterval: s.riverFetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: s.riverMaxWorkers}},
		Workers:           workers,
		Logger:            logger,
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	r := &riverRun{o: o, s: s, pool: pool, client: client, doneCh: make(chan struct{}), subDone: make(chan struct{}), target: int64(o.N)}
	sub, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: o.N + 1000, // never drop an event: they are our completion count
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
			if r.done.Add(1) >= r.target {
				r.doneOnce.Do(func() { close(r.doneCh) })
			}
		}
	}()
	return r, nil
}

func (r *riverRun) insert(ctx context.Context, from, to int) error {
	params := make([]river.InsertManyParams, 0, r.o.InsertBatch)
	for lo := from; lo < to; lo += r.o.InsertBatch {
		hi := min(lo+r.o.InsertBatch, to)
		params = params[:0]
		for i := lo; i < hi; i++ {
			params = append(params, river.InsertManyParams{Args: NoopArgs{Num: i}})
		}
		if r.o.RiverInsertFast {
			if _, err := r.client.InsertManyFast(ctx, params); err != nil {
				return fmt.Errorf("river InsertManyFast: %w", err)
			}
		} else if _, err := r.client.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("river InsertMany: %w", err)
		}
	}
	return nil
}

func (r *riverRun) start(ctx context.Context) error {
	if err := r.client.Start(ctx); err != nil {
		return err
	}
	r.started = true
	return nil
}

func (r *riverRun) completed() int64          { return r.done.Load() }
func (r *riverRun) finished() <-chan struct{} { return r.doneCh }
func (r *riverRun) anomalies() int64          { return r.unwanted.Load() }

// stop stops the client (StopAndCancel if a graceful stop overruns) and
// ends the subscription. The pool is the caller's to close.
func (r *riverRun) stop(ctx context.Context) error {
	defer func() {
		r.subCancel()
		<-r.subDone
	}()
	if !r.started {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := r.client.Stop(sctx)
	if err != nil {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		err = errors.Join(err, r.client.StopAndCancel(cctx))
	}
	return err
}

func (r *riverRun) dbCounts(ctx context.Context, admin *pgxpool.Pool) (done, total int64, err error) {
	err = admin.QueryRow(ctx, fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM %s`, r.o.riverJobTable())).Scan(&done, &total)
	return done, total, err
}
