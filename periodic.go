package gendurable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/cron"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// Periodic inserts one instance per slot of a schedule, exactly once across
// all processes: every started engine whose [Config].Periodic lists the
// schedule (working queues or not) computes the same slots and inserts each
// with a unique key derived from the schedule's name and the
// slot's time ([UniqueForever] scope), so whichever process is first wins
// and the others' inserts are no-ops.
//
// Missed slots: when no process ran at a slot's time (a deploy, an outage),
// an engine starting later inserts the most recent missed slot once — late,
// with RunAt set to the slot — and skips the earlier ones, so an outage
// costs one late run, not a burst. Set SkipMissed to skip it too. A slot
// counts as run while its row exists, so the most recent slot is inserted
// on start (or after the engine was held up past it: a suspended machine,
// the clock set forward) only while it is younger than the engine's
// [Config].Retention (any age if Retention is negative; give every process
// the Retention of those that prune, also one that works no queues): an older one's row may have been
// pruned, and inserting it again would run a slot twice — a @monthly
// schedule under the default 7 days would run each month's slot again at
// every restart after the 8th. Keep Retention longer than the schedule's
// period for a missed slot to run late. On start the engine looks back at
// most a year for the most recent slot. Adding a schedule, or changing its
// Schedule, is a start like any other: its most recent slot (of the new
// spec) runs late unless SkipMissed, even if a slot of the old spec ran
// since — unless that slot is later (see Order).
//
// Clocks: a process inserts a slot when its own clock reaches it, and the
// instance is eligible at the slot on the database clock (RunAt is the
// slot). So the process whose clock is furthest ahead inserts each slot,
// early by its skew, and the instance still runs at its time; a process
// whose clock is behind finds the slot taken, or inserts it late by its
// skew (eligible at once). A clock set forward, or a machine that was
// suspended, makes a slot due within a minute. A process whose clock is
// behind by more than the time between two slots can lose one: a process
// with a right clock that starts after a slot, before the one behind has
// reached it, inserts its most recent slot (the next one) on start, and the
// one behind then finds that later slot in the table (see Order) and
// inserts nothing, with a warning (a probe: @every 2s, one process 5 s
// behind, a slot lost at each start of another). Keep clocks in step
// (NTP) to well within the schedule's period.
//
// Order: a slot is not inserted once a row of a later slot of its schedule
// whose time has come (on the database clock) is in the table: the insert
// does nothing, as for a slot taken, and logs a warning. A prune keeps each
// schedule's newest such row, so whenever a slot's own row may have been
// pruned a later one's is there: an insert that reaches the database late
// — sent on a connection that was then cut off, given up by its engine,
// and run by the server when the connection healed — cannot run the slot a
// second time. So the slots of a schedule are inserted in their order, and
// a catch-up slot older than the schedule's latest slot row is not
// inserted (a schedule changed to an earlier time of day, its new spec's
// most recent slot before the old spec's last). A slot's row inserted
// before its time (by a process whose clock is ahead) does not count until
// its time: the slots before it still go in.
type Periodic struct {
	// Name identifies the schedule; it is part of every slot's unique key,
	// so renaming a schedule starts its slots afresh. Required: 1 to 200
	// bytes of valid UTF-8 without control characters or bidirectional
	// controls, not starting or ending with white space, like a queue name.
	Name string
	// Schedule is a standard 5-field cron expression ("*/15 * * * *",
	// "0 9 * * MON-FRI"), a descriptor (@hourly, @daily, @weekly, @monthly,
	// @yearly), or "@every <duration>" (slots aligned to the Unix epoch, at
	// least 1s apart). An optional "TZ=Area/City " prefix sets the time
	// zone; the default is UTC. In a zone with daylight saving, a time in
	// the hour skipped when the clocks go forward has no slot that day,
	// and a time in the hour repeated when they go back has one slot, at
	// its first occurrence: "30 2 * * *" in Europe/Berlin does not run on
	// the last Sunday of March, and "0 * * * *" has a two-hour gap on the
	// night the clocks go back. Required.
	Schedule string
	// New builds the instance for a slot (the slot's time is passed in).
	// Its UniqueKey, UniqueScope and RunAt are set by the engine: a
	// UniqueKey, RunAt or RunIn of New's is replaced, the slot running at
	// its time under a key of its own (an InsertOpts with UniqueByArgs or
	// UniquePeriod gives its slot up instead). Required.
	// An instance the engine refuses (ErrInvalidInsert, ErrUnknownMachine,
	// ErrStateEncode) gives its slot up at once, logged as an error, as
	// does a New that panics or a state whose encoding panics; a slot
	// whose insert fails otherwise (the database down) is tried again until
	// the schedule's next slot comes due. New runs on a goroutine of its
	// own: one that has not returned within [Config].MaintenanceTimeout
	// fails its slot's attempt (tried again once it has returned), so it
	// holds up neither Stop nor the other schedules for longer; it is not
	// called again for the schedule while it runs.
	New func(slot time.Time) InsertParams
	// SkipMissed: on start, do not insert a slot that passed while no
	// process ran.
	SkipMissed bool

	sched cron.Schedule
}

func (p *Periodic) validate() error {
	if problem := nameProblem(p.Name); problem != "" {
		// The name is in every slot's unique key, which an insert checks as
		// it checks a name (it would refuse every slot).
		return errorf(ErrInvalidConfig, "Periodic needs a Name of 1-%d bytes: %s %s", maxNameLen, quoted(p.Name), problem)
	}
	if p.New == nil {
		return errorf(ErrInvalidConfig, "Periodic %q has no New func", p.Name)
	}
	s, err := cron.Parse(p.Schedule)
	if err != nil {
		return fmt.Errorf("%w: Periodic %q: %w", ErrInvalidConfig, p.Name, err)
	}
	if s.Next(time.Now()).IsZero() {
		// "0 0 29 2 */7" (a 29 February that is a Sunday): a schedule that
		// would never insert anything, and say nothing about it.
		return errorf(ErrInvalidConfig, "Periodic %q: schedule %q has no slot within the next five years", p.Name, p.Schedule)
	}
	p.sched = s
	return nil
}

// slotKeyPrefix starts every slot's unique key; an insert of anything else
// with such a key is refused (ErrInvalidInsert).
const slotKeyPrefix = sqlq.SlotKeyPrefix

// slotKey is the unique key of one slot of a schedule.
func slotKey(name string, slot time.Time) string {
	return slotKeyPrefix + name + ":" + slot.UTC().Format(time.RFC3339)
}

// insertSlot inserts the instance of one slot of schedule p, once across all
// processes. The periodic service (internal/maintenance) calls it as slots
// come due, and retries it if it fails.
//
// New (on a goroutine of its own: periodicNew) and the encoding of the
// state it builds are the user's code: a panic in either gives the slot up (it is an
// ErrInvalidInsert or ErrStateEncode, which the service does not retry)
// instead of taking the process down.
func (e *Engine) insertSlot(ctx context.Context, p *Periodic, slot time.Time) (id int64, duplicate bool, err error) {
	params, err := e.periodicNew(ctx, p, slot)
	if err != nil {
		return 0, false, err
	}
	params.slot = true
	params.opts.UniqueKey = slotKey(p.Name, slot)
	params.opts.UniqueScope = UniqueForever
	params.opts.RunAt, params.opts.RunIn = slot, 0
	var res InsertResult
	var pe *PanicError
	err = safely(func() (err error) { res, err = e.Insert(ctx, params); return err })
	if errors.As(err, &pe) {
		return 0, false, fmt.Errorf("%w: Periodic %q: encoding the state: %w", ErrStateEncode, p.Name, err)
	}
	if err == nil && res.Duplicate && res.ID == 0 {
		// No row holds the slot's key: the insert found a later slot of
		// the schedule in the table (see Periodic, "Order").
		e.log.Warn("gendurable: periodic slot not inserted: a later slot of its schedule is in the table",
			"periodic", p.Name, "slot", slot)
	}
	return res.ID, res.Duplicate, err
}

// newCall is a call of a schedule's New, on a goroutine of its own.
type newCall struct {
	slot   time.Time
	done   chan struct{}
	params InsertParams
	err    error // a panic
}

// periodicNew calls p.New(slot) on a goroutine of its own and waits for it
// until ctx ends (Stop) or MaintenanceTimeout passes: a New that blocks (a
// lookup without a deadline) holds up neither Stop nor, past that wait, the
// other schedules. The slot's insert then fails and is tried again (as
// after a database error) without calling New again while the earlier call
// has not returned: a second attempt finds it still running and fails at
// once; one that finds it returned uses its result, if for the same slot.
func (e *Engine) periodicNew(ctx context.Context, p *Periodic, slot time.Time) (InsertParams, error) {
	e.newCallsMu.Lock()
	c, waited := e.newCalls[p.Name], true
	if c != nil {
		select {
		case <-c.done:
			if !c.slot.Equal(slot) {
				c = nil
			}
		default:
			if !c.slot.Equal(slot) {
				e.newCallsMu.Unlock()
				return InsertParams{}, fmt.Errorf("gendurable: Periodic %q: New for the slot %s has not returned yet",
					p.Name, c.slot.UTC().Format(time.RFC3339))
			}
		}
	}
	if c == nil {
		if e.newCalls == nil {
			e.newCalls = map[string]*newCall{}
		}
		c, waited = &newCall{slot: slot, done: make(chan struct{})}, false
		e.newCalls[p.Name] = c
		go func() {
			defer close(c.done)
			c.err = safely(func() error { c.params = p.New(slot); return nil })
		}()
	}
	e.newCallsMu.Unlock()
	wait := e.cfg.MaintenanceTimeout
	if waited {
		wait = 0 // an earlier attempt waited for this call already
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-ctx.Done():
		// The slot's attempt is bounded by MaintenanceTimeout too: its
		// deadline and the timer below race.
		return InsertParams{}, &maintenance.NoStatement{Err: fmt.Errorf("gendurable: Periodic %q: New(%s) has not returned; the slot is tried again once it has: %w",
			p.Name, slot.UTC().Format(time.RFC3339), context.Cause(ctx))}
	case <-timer.C:
		select {
		case <-c.done:
		default:
			return InsertParams{}, &maintenance.NoStatement{Err: fmt.Errorf("gendurable: Periodic %q: New(%s) has not returned after %s; the slot is tried again once it has",
				p.Name, slot.UTC().Format(time.RFC3339), e.cfg.MaintenanceTimeout)}
		}
	}
	e.newCallsMu.Lock()
	if e.newCalls[p.Name] == c {
		delete(e.newCalls, p.Name)
	}
	e.newCallsMu.Unlock()
	if c.err != nil {
		return InsertParams{}, fmt.Errorf("%w: Periodic %q: New: %w", ErrInvalidInsert, p.Name, c.err)
	}
	return c.params, nil
}
