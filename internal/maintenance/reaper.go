package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// DefaultBatch is how many rows one reap or await-timeout statement
// handles when a service's Batch is zero.
const DefaultBatch = 1000

// Reaped is what one reap statement recovered.
type Reaped struct {
	Count  int // rows recovered
	Failed int // of which failed for good (attempts exhausted)
	// Uncharged: of which returned without an attempt charged (claims
	// whose last heartbeat found their step not started, or that no
	// heartbeat confirmed).
	Uncharged int
	IDs       []int64 // the instances recovered
	Duration  time.Duration
	// Err: the statement failed (no reply by its deadline, a lost
	// connection, …); the counts are then zero.
	Err error
}

// Reaper recovers expired leases: an expired row goes back to runnable with
// attempt + 1, or fails once its attempts are spent (a prefetched claim whose
// step never started, and a claim no heartbeat confirmed, go back without the
// attempt: sqlq's reapSQL). It sweeps at Start,
// then every Interval, and sooner when the next lease of any process runs
// out before that: each sweep's last statement reports that lease's expiry
// (as the await-timeout sweep's reports its next deadline), so a crashed
// worker's rows run again about a lease after its last heartbeat, not up to
// an Interval later. Between full sweeps a sweep starts at the floor the last
// one returned, so a snapshot held elsewhere does not make every sweep read
// the lease entries of every row claimed since it began (fullSweepDue;
// docs/design.md §4, "The reaper's floor").
//
// Each reap statement runs under StatementTimeout: one stuck on a dead
// connection is abandoned at that deadline, logged, and the next sweep
// comes an Interval later on a fresh connection — an expired lease is
// recovered at most StatementTimeout + Interval after the connection died
// (TestReaperAbandonsAStatementOnADeadConnection).
type Reaper struct {
	BaseService

	Queries  *sqlq.Queries
	DB       sqlq.DB
	Interval time.Duration // longest sleep between sweeps; must be positive to Start
	Batch    int           // rows per statement; default DefaultBatch
	Log      *slog.Logger  // default slog.Default()
	// StatementTimeout bounds each reap statement; default
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
	// OnReap, if set, is called after each statement that recovered rows,
	// and after one that failed while the service runs (Err set; the
	// engine turns both into its ReapEvent).
	OnReap func(ctx context.Context, r *Reaped)
}

// expiryMargin is how long past a lease's expiry (database clock) the
// reaper sweeps for it, and minSweepGap the least time between sweeps.
const (
	expiryMargin = 50 * time.Millisecond
	minSweepGap  = 100 * time.Millisecond
)

// fullSweepEvery: between sweeps from the floor the last one returned
// (sqlq.Reap), a full sweep — from the lease index's head — runs at Start,
// after a failed sweep, and then at the first sweep once this many Intervals
// have passed since the last one started, and no sooner than fullSweepDuty
// times the duration of its last statement (it grows with a snapshot held
// elsewhere, as a floor check does). A lease below the floor (written by a
// transaction that committed more than sqlq.ReapFloorSlack after it ran out)
// is recovered by the next full sweep.
const (
	fullSweepEvery = 10
	fullSweepDuty  = 10
)

// fullSweepDue reports whether a sweep starting at now, the last full one
// having started at last and taken took, is a full one.
func fullSweepDue(now, last time.Time, took, interval time.Duration) bool {
	return last.IsZero() || now.Sub(last) >= backoff.Spaced(fullSweepEvery*interval, fullSweepDuty, took)
}

// Start runs sweeps until Stop or until ctx is done: one at once, then
// every Interval, or just past the next lease expiry if that comes first.
// Leases that ran out before a sweep's statement and were left (rows
// another transaction has locked) are not counted as next: they wait for
// the Interval, so a locked row neither hides the leases after it nor
// makes the loop spin.
func (r *Reaper) Start(ctx context.Context) error {
	if r.Interval <= 0 {
		return fmt.Errorf("gendurable: reaper: interval %s is not positive", r.Interval)
	}
	return r.StartLoop(ctx, func(ctx context.Context) {
		var floor *time.Time // nil: a full sweep
		var lastFull time.Time
		var fullTook time.Duration
		for {
			wait := r.Interval
			from := floor
			start := time.Now()
			if fullSweepDue(start, lastFull, fullTook, r.Interval) {
				from = nil
			}
			sw, err := r.sweep(ctx, from)
			if from == nil && err == nil {
				lastFull, fullTook = start, sw.took
			}
			floor = sw.floor // nil after an error: the next sweep is full
			switch {
			case err != nil && ctx.Err() == nil:
				logger(r.Log).Warn("gendurable: reaper sweep failed", sqlq.ErrAttrs(err)...)
			case sw.next != nil:
				wait = min(wait, max(*sw.next+expiryMargin, minSweepGap))
			}
			if !pause(ctx, wait) {
				return
			}
		}
	})
}

// RunOnce runs one full sweep now, batch after batch until no expired lease
// is left, and returns the number of rows recovered.
func (r *Reaper) RunOnce(ctx context.Context) (int, error) {
	sw, err := r.sweep(ctx, nil)
	return sw.n, err
}

// swept is what one sweep did and saw.
type swept struct {
	n     int            // rows recovered
	next  *time.Duration // the last statement's next expiry
	floor *time.Time     // where the next sweep may start; nil after an error
	// took is how long the last statement took — the one that reaped fewer
	// than a batch: what a sweep costs to read the index, without the
	// recovery of a crowd of expired rows before it.
	took time.Duration
}

// sweep is RunOnce from floor (nil: a full sweep).
func (r *Reaper) sweep(ctx context.Context, floor *time.Time) (swept, error) {
	batch := orDefault(r.Batch, DefaultBatch)
	total := 0
	for {
		start := time.Now()
		var res sqlq.ReapResult
		err := bounded(ctx, orDefault(r.StatementTimeout, DefaultStatementTimeout), func(ctx context.Context) (err error) {
			// Next within the Interval: the loop sleeps no longer anyway
			// (RunOnce, without an Interval, reads none).
			res, err = r.Queries.Reap(ctx, r.DB, batch, floor, max(r.Interval, time.Microsecond))
			return err
		})
		if err != nil {
			err = fmt.Errorf("gendurable: reap: %w", err)
			if r.OnReap != nil && ctx.Err() == nil {
				r.OnReap(ctx, &Reaped{Duration: time.Since(start), Err: err})
			}
			return swept{n: total}, err
		}
		rows := res.Reaped
		floor = &res.Floor
		if len(rows) > 0 {
			rep := &Reaped{Count: len(rows), Duration: time.Since(start), IDs: make([]int64, 0, len(rows))}
			for _, row := range rows {
				rep.IDs = append(rep.IDs, row.ID)
				if row.Status == "failed" {
					rep.Failed++
				}
				if !row.Charged {
					rep.Uncharged++
				}
			}
			logger(r.Log).Warn("gendurable: reaped expired leases", "count", rep.Count, "failed", rep.Failed, "uncharged", rep.Uncharged)
			if r.OnReap != nil {
				r.OnReap(ctx, rep)
			}
		}
		total += len(rows)
		if len(rows) < batch {
			return swept{n: total, next: res.Next, floor: floor, took: time.Since(start)}, nil
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

// pause waits d; false once ctx is done.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	return true
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
