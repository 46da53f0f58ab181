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
// earlier deadline calls PokeIn to have it sweep at that deadline.
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
	for {
		wait, ok := s.sweep(ctx)
		if !ok || !s.sleep(ctx, time.Now().Add(wait)) {
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

// sweep runs one statement and returns how long to sleep before the next;
// false once ctx is done.
func (s *TimeoutSweeper) sweep(ctx context.Context) (time.Duration, bool) {
	batch := orDefault(s.Batch, DefaultBatch)
	var queues []string
	var n int
	var next *time.Duration
	err := bounded(ctx, orDefault(s.StatementTimeout, DefaultStatementTimeout), func(ctx context.Context) (err error) {
		// The next deadline within the Interval: the loop sleeps no longer.
		queues, n, next, err = s.Queries.WakeTimedOut(ctx, s.DB, batch, s.Interval)
		return err
	})
	wait := s.Interval
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return 0, false
		}
		logger(s.Log).Warn("gendurable: await-timeout sweep failed", "err", err)
	case n == batch:
		wait = 0 // more are due
	case next != nil:
		// On the database clock: time.Until of the deadline slept an hour
		// too long, or spun every minSweepWait, with this process's clock an
		// hour off the database's.
		wait = min(wait, max(*next, minSweepWait))
	}
	if s.Kick != nil {
		for _, q := range queues {
			s.Kick(q)
		}
	}
	return wait, true
}
