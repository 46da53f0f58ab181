package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/sqlq"
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
	// CatchUpWithin, if above 0: a slot that passed — on start, or while
	// the loop was held up past it — is inserted only if it is younger than
	// this (the retention of finished rows: an older slot's row may have
	// been pruned, and inserting it again would run it twice).
	CatchUpWithin time.Duration
}

// Periodic inserts each schedule's slots as they come due: on start the
// most recent slot that already passed (unless SkipMissed; earlier missed
// slots are skipped), then each slot at its time. It has no interval of its
// own: it sleeps until the soonest next slot of its schedules (or the
// soonest retry), a minute at most (so a slot is seen due within a minute
// of its time also after the clock was set forward or the machine was
// suspended: a timer does not count either), and its loop ends once no schedule has another slot and
// none waits for its insert.
//
// Insert writes one slot; making each slot one instance across all
// processes (a unique key per slot) is its business. A failed insert is
// tried again — after RetryDelay, then twice as long each time up to
// MaxRetryDelay, jittered — until it succeeds or the schedule's next slot
// comes due: a slot that came due during a database outage is inserted,
// late, once the database answers again. When the next slot comes due
// first, the failed slot is tried once more then (its backoff may have put
// its next attempt past the next slot) and, failing again, the next slot
// takes its place (logged as an error): as on
// start, an outage leaves at most its most recent slot to run late. An
// error that Permanent reports as such gives the slot up at once. The
// schedules do not wait for each other's retries, but they share the loop:
// an attempt in flight holds the others up, up to StatementTimeout. A
// schedule held up past several of its slots (by such an attempt, a
// suspended process, the clock set forward) inserts the most recent of
// them, and skips the earlier ones. Each attempt runs under
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
	// Permanent reports whether an insert's error is one that trying again
	// cannot mend (the instance is invalid, whatever the database does):
	// such a slot is given up at once, logged as an error, and the schedule
	// goes on with its next slot. Nil: every error is tried again.
	Permanent func(err error) bool
	// RetryDelay is the wait before a failed insert's first retry; each
	// retry after it waits twice as long, up to MaxRetryDelay (jittered
	// into the upper half). Default (zero or negative) 200ms.
	RetryDelay time.Duration
	// MaxRetryDelay caps the wait between retries; default (zero or
	// negative) DefaultPeriodicMaxRetryDelay.
	MaxRetryDelay time.Duration
	// StatementTimeout bounds each insert attempt; default
	// DefaultStatementTimeout.
	StatementTimeout time.Duration

	// now is the wall clock (tests); nil is time.Now.
	now func() time.Time
	// maxSleep caps each wait of the loop (tests); zero is
	// periodicMaxSleep.
	maxSleep time.Duration
}

// periodicMaxSleep caps each wait of the loop. Slots are wall-clock
// instants, but a timer runs on the monotonic clock, which a clock set
// forward does not move and a suspended machine stops: a wait computed
// before either would end that much past the slot it waits for (a daily
// schedule's slot an hour late after the clock was stepped an hour
// forward). Waking at least this often, the loop sees such a slot due
// within this long of its time.
const periodicMaxSleep = time.Minute

// DefaultPeriodicMaxRetryDelay is the default cap of the wait between a
// slot's insert attempts.
const DefaultPeriodicMaxRetryDelay = 10 * time.Second

// dueSlot is a slot that came due and is not inserted yet.
type dueSlot struct {
	at      time.Time // the slot
	tries   int       // failed attempts so far
	retryAt time.Time // the next attempt, not before
}

// Start inserts the missed slots and then each slot as it comes due, until
// Stop, until ctx is done or until no schedule has another slot.
func (p *Periodic) Start(ctx context.Context) error {
	return p.StartLoop(ctx, p.loop)
}

func (p *Periodic) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

func (p *Periodic) loop(ctx context.Context) {
	now := p.clock()
	next := make([]time.Time, len(p.Schedules))
	due := make([]*dueSlot, len(p.Schedules))
	for i := range p.Schedules {
		s := &p.Schedules[i]
		if last, ok := latestSlot(s.Next, now); ok && !s.SkipMissed && !p.tooOld(i, last, now) {
			due[i] = &dueSlot{at: last, retryAt: now}
		}
		next[i] = s.Next(now)
		p.noMoreSlots(i, next[i], now)
	}
	for ctx.Err() == nil {
		now := p.clock()
		for i := range p.Schedules {
			if t := next[i]; !t.IsZero() && !t.After(now) {
				first := t
				t = latestSince(p.Schedules[i].Next, t, now)
				if p.tooOld(i, t, now) {
					// Held up past it (a suspended machine, the clock set
					// forward): as on start.
					due[i] = nil
					next[i] = p.Schedules[i].Next(now)
					p.noMoreSlots(i, next[i], now)
					continue
				}
				if t.After(first) {
					// The loop was held up past several slots (an insert
					// waiting on a lock, a slow Next, a suspended process):
					// the most recent runs in their place. Said, as a slot
					// given up is (an outage probe saw five go unlogged).
					logger(p.Log).Info("gendurable: periodic slots skipped: the loop was held up past them; the most recent runs in their place",
						"periodic", p.Schedules[i].Name, "from", first, "next", t)
				}
				if old := due[i]; old != nil && old.tries > 0 && !p.tooOld(i, old.at, now) && ctx.Err() == nil &&
					p.insertSlot(ctx, i, old) {
					// One more try before this slot takes its place: its
					// backoff may have put it past this slot, or the loop
					// was held up past both, and the database may be back
					// (an outage that ended within MaxRetryDelay of the
					// next slot lost its slot).
					due[i] = nil
				}
				if old := due[i]; old != nil && old.tries > 0 {
					logger(p.Log).Error("gendurable: periodic slot not inserted: the next slot came due first",
						"periodic", p.Schedules[i].Name, "slot", old.at, "next", t, "attempts", old.tries)
				} else if old != nil {
					// Never tried: the loop was held up (or had only just
					// started) past the next slot, which runs in its place
					// as the most recent — no failure to report.
					logger(p.Log).Info("gendurable: periodic slot skipped: a later slot came due before it was tried",
						"periodic", p.Schedules[i].Name, "slot", old.at, "next", t)
				}
				due[i] = &dueSlot{at: t, retryAt: now}
				next[i] = p.Schedules[i].Next(now)
				p.noMoreSlots(i, next[i], now)
			}
		}
		for i, d := range due {
			if d != nil && d.tries > 0 && p.tooOld(i, d.at, now) {
				// Failing for longer than its catch-up window (cut off
				// from the database): another process may have run it
				// meanwhile and its row been pruned.
				due[i] = nil
				continue
			}
			if d != nil && !d.retryAt.After(now) && ctx.Err() == nil && p.insertSlot(ctx, i, d) {
				due[i] = nil // inserted, or given up
			}
		}
		wake := time.Time{}
		for i := range p.Schedules {
			for _, t := range []time.Time{next[i], retryAt(due[i])} {
				if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
					wake = t
				}
			}
		}
		if wake.IsZero() {
			return // no schedule has another slot, and none is waiting
		}
		timer := time.NewTimer(min(wake.Sub(p.clock()), positiveOr(p.maxSleep, periodicMaxSleep)))
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
}

// tooOld reports, and logs, that slot of schedule i is older than its
// CatchUpWithin at now: it may have run and its row been pruned, so it is
// not inserted late.
func (p *Periodic) tooOld(i int, slot, now time.Time) bool {
	w := p.Schedules[i].CatchUpWithin
	if w <= 0 || now.Sub(slot) < w {
		return false
	}
	logger(p.Log).Info("gendurable: periodic slot not run late: it is older than the retention of finished rows, "+
		"whose pruning may have removed its row", "periodic", p.Schedules[i].Name, "slot", slot, "retention", w)
	return true
}

// noMoreSlots logs that schedule i has no slot after now within the
// horizon of its Next (next is zero): it inserts nothing more in this
// process.
func (p *Periodic) noMoreSlots(i int, next, now time.Time) {
	if next.IsZero() {
		logger(p.Log).Warn("gendurable: periodic schedule has no slot within the next five years; it inserts nothing more",
			"periodic", p.Schedules[i].Name, "after", now)
	}
}

func retryAt(d *dueSlot) time.Time {
	if d == nil {
		return time.Time{}
	}
	return d.retryAt
}

// insertSlot makes one attempt at inserting d, the due slot of schedule i.
// It reports whether d is settled: inserted, or given up for a permanent
// error. Another failed attempt sets d's next attempt.
func (p *Periodic) insertSlot(ctx context.Context, i int, d *dueSlot) bool {
	name := p.Schedules[i].Name
	var id int64
	var dup bool
	err := bounded(ctx, orDefault(p.StatementTimeout, DefaultStatementTimeout), func(ctx context.Context) (err error) {
		id, dup, err = p.Insert(ctx, i, d.at)
		return err
	})
	if err == nil {
		if !dup {
			logger(p.Log).Debug("gendurable: periodic slot inserted", "periodic", name, "slot", d.at, "id", id)
		}
		return true
	}
	d.tries++
	if ctx.Err() == nil && p.Permanent != nil && p.Permanent(err) {
		logger(p.Log).Error("gendurable: periodic slot not inserted: its insert cannot succeed", "periodic", name, "slot", d.at,
			"attempts", d.tries, "err", err)
		return true
	}
	wait := backoff.Delay(positiveOr(p.RetryDelay, 200*time.Millisecond),
		positiveOr(p.MaxRetryDelay, DefaultPeriodicMaxRetryDelay), d.tries)
	d.retryAt = p.clock().Add(wait)
	if ctx.Err() == nil {
		logger(p.Log).Warn("gendurable: periodic slot insert failed; it is tried again", append([]any{"periodic", name, "slot", d.at,
			"attempt", d.tries, "retry_in", wait}, sqlq.ErrAttrs(err)...)...)
	}
	return false
}

// positiveOr is v, or d if v is not positive.
func positiveOr(v, d time.Duration) time.Duration {
	if v <= 0 {
		return d
	}
	return v
}

// latestSince returns the last slot at or before now of the schedule whose
// slots next gives, t being one such slot: usually t itself, but the loop
// may have been held up past several (an attempt that waited for its
// deadline, a suspended process, the clock set forward), and then the most
// recent of them is the one that runs, as on start.
func latestSince(next func(time.Time) time.Time, t, now time.Time) time.Time {
	if n := next(t); n.IsZero() || n.After(now) {
		return t
	}
	if last, ok := latestSlot(next, now); ok && last.After(t) {
		return last
	}
	for n := next(t); !n.IsZero() && !n.After(now); n = next(n) {
		t = n // more than a year of slots passed: latestSlot's windows missed them
	}
	return t
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
