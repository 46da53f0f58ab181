package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// minSweepWait is the shortest sleep before a deadline that is due soon:
// a deadline a few microseconds away is swept a little late rather than in
// a busy loop.
const minSweepWait = 10 * time.Millisecond

// TimeoutSweeper wakes awaits whose deadline passed: they become runnable,
// and Kick is called for each queue that so received work. After each sweep
// it sleeps until the next known deadline, at most Interval (so deadlines
// set by other processes are found too); a local await outcome with an
// earlier deadline calls PokeIn to have it sweep at that deadline. Between
// full sweeps (at Start, after a failed one, and as the reaper's:
// fullSweepDue) a sweep starts at the floor the last one returned, so a
// snapshot held elsewhere does not make every sweep read the entry of every
// await signalled since it began (sqlq.WakeTimedOut).
//
// Each statement runs under StatementTimeout: one stuck on a dead
// connection is abandoned at that deadline, logged, and the next sweep
// comes an Interval later on a fresh connection
// (TestTimeoutSweeperAbandonsAStatementOnADeadConnection).
type TimeoutSweeper struct {
	BaseService

	Queries  *sqlq.Queries
	DB       sqlq.DB
	Interval time.Duration // longest sleep between sweeps; must be positive to Start
	Batch    int           // rows per statement; default DefaultBatch
	Log      *slog.Logger  // default slog.Default()
	// StatementTimeout bounds each sweep statement; default
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
	// Kick, if set, is called with each queue a sweep made work runnable
	// in (the engine wakes its local feeder).
	Kick func(queue string)
	// FloorSlack: how far before its statement's now() a sweep's floor
	// lies at least (sqlq.WakeTimedOut); at least sqlq.WakeFloorSlack. The
	// engine sets its lease plus that: longer than an outcome statement
	// that writes an await may run.
	FloorSlack time.Duration

	pokeOnce sync.Once
	poke     chan struct{}
	mu       sync.Mutex
	wakeAt   time.Time // the earliest wake a poke asked for since the loop last looked
}

func (s *TimeoutSweeper) pokes() chan struct{} {
	s.pokeOnce.Do(func() { s.poke = make(chan struct{}, 1) })
	return s.poke
}

// PokeIn has the loop sweep d from now (0: now) if that is sooner than it
// planned: an await whose deadline is no later than d from now was just
// written. A deadline after the planned sweep costs nothing: the loop used
// to sweep at once for every parked await, to learn the earliest deadline,
// which under a steady flow of awaits with timeouts was a sweep statement
// back to back with the last. It never blocks; pokes that arrive while one
// is pending are one poke.
func (s *TimeoutSweeper) PokeIn(d time.Duration) {
	at := time.Now().Add(max(d, 0))
	s.mu.Lock()
	if s.wakeAt.IsZero() || at.Before(s.wakeAt) {
		s.wakeAt = at
	}
	s.mu.Unlock()
	select {
	case s.pokes() <- struct{}{}:
	default:
	}
}

// takeWake returns, and forgets, the earliest wake asked for (zero: none).
func (s *TimeoutSweeper) takeWake() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.wakeAt
	s.wakeAt = time.Time{}
	return at
}

// Start sweeps at once, then again after each sleep, until Stop or until
// ctx is done.
func (s *TimeoutSweeper) Start(ctx context.Context) error {
	if s.Interval <= 0 {
		return fmt.Errorf("gendurable: await-timeout sweep: interval %s is not positive", s.Interval)
	}
	return s.StartLoop(ctx, s.loop)
}

func (s *TimeoutSweeper) loop(ctx context.Context) {
	select { // a poke from before this start: the first sweep covers it
	case <-s.pokes():
	default:
	}
	s.takeWake()
	var floor *time.Time // nil: a full sweep
	var lastFull time.Time
	var fullTook time.Duration
	for {
		from := floor
		start := time.Now()
		if fullSweepDue(start, lastFull, fullTook, s.Interval) {
			from = nil
		}
		wait, next, took, ok := s.sweep(ctx, from)
		if !ok {
			return
		}
		if from == nil && next != nil {
			lastFull, fullTook = start, took
		}
		floor = next // nil after an error: the next sweep is full
		if !s.sleep(ctx, time.Now().Add(wait)) {
			return
		}
	}
}

// sleep waits until planned, or until the earliest wake a poke asks for
// meanwhile if that is sooner; false once ctx is done.
func (s *TimeoutSweeper) sleep(ctx context.Context, planned time.Time) bool {
	t := time.NewTimer(time.Until(planned))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-s.pokes():
			if at := s.takeWake(); !at.IsZero() && at.Before(planned) {
				planned = at
				t.Reset(time.Until(planned)) // Go 1.23 timers: no stale value to drain
			}
		}
	}
}

// sweep runs one statement from floor (nil: a full sweep) and returns how
// long to sleep before the next, the floor the next may start at (nil after
// an error) and how long the statement took; false once ctx is done.
func (s *TimeoutSweeper) sweep(ctx context.Context, floor *time.Time) (time.Duration, *time.Time, time.Duration, bool) {
	batch := orDefault(s.Batch, DefaultBatch)
	var res sqlq.WakeResult
	start := time.Now()
	err := bounded(ctx, orDefault(s.StatementTimeout, DefaultStatementTimeout), func(ctx context.Context) (err error) {
		// The next deadline within the Interval: the loop sleeps no longer.
		res, err = s.Queries.WakeTimedOut(ctx, s.DB, batch, floor, s.FloorSlack, s.Interval)
		return err
	})
	took := time.Since(start)
	wait := s.Interval
	var next *time.Time
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return 0, nil, took, false
		}
		logger(s.Log).Warn("gendurable: await-timeout sweep failed", sqlq.ErrAttrs(err)...)
	case res.N == batch:
		wait, next = 0, &res.Floor // more are due
	case res.Next != nil:
		// On the database clock: time.Until of the deadline slept an hour
		// too long, or spun every minSweepWait, with this process's clock an
		// hour off the database's.
		wait, next = min(wait, max(*res.Next, minSweepWait)), &res.Floor
	default:
		next = &res.Floor
	}
	if s.Kick != nil {
		for _, q := range res.Queues {
			s.Kick(q)
		}
	}
	return wait, next, took, true
}
