package maintenance

import (
	"context"
	"log/slog"
	"time"
)

// Schedule is one periodic schedule as the [Periodic] service sees it.
type Schedule struct {
	Name string // for logs
	// Next returns the first slot strictly after t, or the zero time if
	// there is none (internal/cron's Schedule.Next).
	Next func(t time.Time) time.Time
	// SkipMissed: on start, do not insert the most recent slot that passed
	// while no process ran.
	SkipMissed bool
}

// Periodic inserts each schedule's slots as they come due: on start the
// most recent slot that already passed (unless SkipMissed; earlier missed
// slots are skipped), then each slot at its time. It has no interval of its
// own: it sleeps until the soonest next slot of its schedules, and its loop
// ends once no schedule has another slot.
//
// Insert writes one slot; making each slot one instance across all
// processes (a unique key per slot) is its business. A failed insert is
// retried a few times, then logged and given up. Each attempt runs under
// StatementTimeout: one stuck on a dead connection is abandoned at that
// deadline and retried on a fresh connection. Such an insert may have
// committed all the same (its reply was what got lost): the retry finds
// the slot's unique key taken and reports a duplicate, so a slot is still
// inserted once.
type Periodic struct {
	BaseService

	Schedules []Schedule
	// Insert inserts the instance of slot of Schedules[i]: its id, or that
	// the slot was inserted already (by this or another process).
	Insert func(ctx context.Context, i int, slot time.Time) (id int64, duplicate bool, err error)
	Log    *slog.Logger // default slog.Default()
	// RetryDelay: a failed insert is retried after RetryDelay, 2×, 3×, 4×
	// and 5× RetryDelay; default 200ms.
	RetryDelay time.Duration
	// StatementTimeout bounds each insert attempt; default
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
}

// insertAttempts is how many times a slot's insert is tried.
const insertAttempts = 5

// Start inserts the missed slots and then each slot as it comes due, until
// Stop, until ctx is done or until no schedule has another slot.
func (p *Periodic) Start(ctx context.Context) error {
	return p.StartLoop(ctx, p.loop)
}

func (p *Periodic) loop(ctx context.Context) {
	now := time.Now()
	next := make([]time.Time, len(p.Schedules))
	for i := range p.Schedules {
		s := &p.Schedules[i]
		if last, ok := latestSlot(s.Next, now); ok && !s.SkipMissed {
			p.insertSlot(ctx, i, last)
		}
		next[i] = s.Next(now)
	}
	for {
		soonest := time.Time{}
		for _, t := range next {
			if !t.IsZero() && (soonest.IsZero() || t.Before(soonest)) {
				soonest = t
			}
		}
		if soonest.IsZero() {
			return // no schedule has another slot
		}
		timer := time.NewTimer(time.Until(soonest))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		now := time.Now()
		for i := range p.Schedules {
			if t := next[i]; !t.IsZero() && !t.After(now) {
				p.insertSlot(ctx, i, t)
				next[i] = p.Schedules[i].Next(now)
			}
		}
	}
}

// insertSlot inserts the instance of one slot, retrying a failed insert.
func (p *Periodic) insertSlot(ctx context.Context, i int, slot time.Time) {
	name := p.Schedules[i].Name
	delay := orDefault(p.RetryDelay, 200*time.Millisecond)
	var err error
	for attempt := 0; attempt < insertAttempts; attempt++ {
		var id int64
		var dup bool
		if err = bounded(ctx, orDefault(p.StatementTimeout, DefaultStatementTimeout), func(ctx context.Context) (err error) {
			id, dup, err = p.Insert(ctx, i, slot)
			return err
		}); err == nil {
			if !dup {
				logger(p.Log).Info("gendurable: periodic slot inserted", "periodic", name, "slot", slot, "id", id)
			}
			return
		}
		if ctx.Err() == nil && attempt+1 < insertAttempts {
			logger(p.Log).Warn("gendurable: periodic slot insert failed; it is tried again", "periodic", name, "slot", slot, "attempt", attempt+1, "err", err)
		}
		t := time.NewTimer(time.Duration(attempt+1) * delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	logger(p.Log).Error("gendurable: periodic slot not inserted", "periodic", name, "slot", slot, "err", err)
}

// latestSlot returns the last slot at or before now of the schedule whose
// slots next gives, if one falls within a year.
func latestSlot(next func(time.Time) time.Time, now time.Time) (time.Time, bool) {
	for _, window := range []time.Duration{time.Hour, 25 * time.Hour, 32 * 24 * time.Hour, 367 * 24 * time.Hour} {
		var last time.Time
		for t := next(now.Add(-window)); !t.IsZero() && !t.After(now); t = next(t) {
			last = t
		}
		if !last.IsZero() {
			return last, true
		}
	}
	return time.Time{}, false
}
