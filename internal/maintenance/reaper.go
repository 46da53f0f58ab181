package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// DefaultBatch is how many rows one reap or await-timeout statement
// handles when a service's Batch is zero.
const DefaultBatch = 1000

// Reaped is what one reap statement recovered.
type Reaped struct {
	Count    int     // rows recovered
	Failed   int     // of which failed for good (attempts exhausted)
	IDs      []int64 // the instances recovered
	Duration time.Duration
}

// Reaper recovers expired leases: an expired row goes back to runnable with
// attempt + 1, or fails once its attempts are spent. It sweeps every
// Interval, and sooner when the next lease of any process runs out before
// that: after each sweep (and at Start) it reads that lease's expiry from
// the lease index, so a crashed worker's rows run again about a lease after
// its last heartbeat, not up to an Interval later.
type Reaper struct {
	BaseService

	Queries  *sqlq.Queries
	DB       sqlq.DB
	Interval time.Duration // between sweeps; must be positive to Start
	Batch    int           // rows per statement; default DefaultBatch
	Log      *slog.Logger  // default slog.Default()
	// OnReap, if set, is called after each statement that recovered rows
	// (the engine turns it into its ReapEvent).
	OnReap func(ctx context.Context, r *Reaped)
}

// Start runs sweeps until Stop or until ctx is done: every Interval, or at
// the next lease expiry if that comes first.
func (r *Reaper) Start(ctx context.Context) error {
	if r.Interval <= 0 {
		return fmt.Errorf("gendurable: reaper: interval %s is not positive", r.Interval)
	}
	return r.StartLoop(ctx, func(ctx context.Context) {
		t := time.NewTimer(r.next(ctx, 0))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			began := time.Now()
			if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
				logger(r.Log).Warn("gendurable: reaper sweep failed", "err", err)
			}
			t.Reset(r.next(ctx, time.Since(began)))
		}
	})
}

// expiryMargin is how long past a lease's expiry (database clock) the
// reaper sweeps for it, and minSweepGap the least time between sweeps.
const (
	expiryMargin = 50 * time.Millisecond
	minSweepGap  = 100 * time.Millisecond
)

// next is how long to wait before the next sweep: Interval, or until just
// past the next lease expiry if that is sooner. The probe looks back over
// the sweep just made (since: from before its first statement was sent): a
// lease that ran out while it ran was not seen by it, and gets a sweep
// after minSweepGap. Leases that ran out before — at Start, or a row the
// sweep skipped because its owner had it locked — are not looked at, and
// wait for the Interval as they did before the probe (so a row held locked
// does not hide the leases after it, and cannot make the loop spin).
func (r *Reaper) next(ctx context.Context, since time.Duration) time.Duration {
	d, ok, err := r.Queries.NextExpiry(ctx, r.DB, since)
	if err != nil || !ok {
		return r.Interval
	}
	return min(r.Interval, max(d+expiryMargin, minSweepGap))
}

// RunOnce runs one sweep now, batch after batch until no expired lease is
// left, and returns the number of rows recovered.
func (r *Reaper) RunOnce(ctx context.Context) (int, error) {
	batch := orDefault(r.Batch, DefaultBatch)
	total := 0
	for {
		start := time.Now()
		rows, err := r.Queries.Reap(ctx, r.DB, batch)
		if err != nil {
			return total, fmt.Errorf("gendurable: reap: %w", err)
		}
		if len(rows) > 0 {
			rep := &Reaped{Count: len(rows), Duration: time.Since(start), IDs: make([]int64, 0, len(rows))}
			for _, row := range rows {
				rep.IDs = append(rep.IDs, row.ID)
				if row.Status == "failed" {
					rep.Failed++
				}
			}
			logger(r.Log).Warn("gendurable: reaped expired leases", "count", rep.Count, "failed", rep.Failed)
			if r.OnReap != nil {
				r.OnReap(ctx, rep)
			}
		}
		total += len(rows)
		if len(rows) < batch {
			return total, nil
		}
	}
}

// every calls fn once per interval until ctx is done.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// logger is l, or slog.Default() if l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}
