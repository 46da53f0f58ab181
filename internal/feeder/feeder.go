// Package feeder is the per-queue feeder: it claims runnable rows with the
// batched pick, buffers them (prefetch), starts them into a bounded number of
// running slots, keeps every held lease alive with one batched heartbeat per
// tick, and on stop hands the buffered rows straight back.
//
// It knows nothing of machines: each claimed row goes to an Executor that runs
// it to a committed outcome.
package feeder

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// Config is one queue's feeder settings; every field must already be
// defaulted and validated by the caller.
type Config struct {
	Queue             string
	Concurrency       int           // max steps running at once
	Prefetch          int           // rows claimed beyond running slots
	MinDemand         int           // don't pick for fewer free places, unless idle
	BusyPollInterval  time.Duration // poll interval after a pick that found rows (0: PollInterval)
	PollInterval      time.Duration // poll interval while steps run and picks find nothing
	MaxPollInterval   time.Duration // idle backoff ceiling
	Lease             time.Duration
	HeartbeatInterval time.Duration
	KeyPolicies       []sqlq.KeyPolicy // limits of partition keys by prefix
	Global            int              // the queue's running steps across every process at most (0: no bound)
	// KeyRate is the start rate (per second) and burst of a partition
	// key's policy, as the engine sees it (0: no rate); dispatch paces a
	// rated key's starts by it (paceLocked). Nil: no key is rated.
	KeyRate func(key string) (perSecond float64, burst int)
	// FloorCheck is how often, at most, the feeder looks for runnable plain
	// rows below its pick's floor while the queue is busy (see floorTick);
	// 0: DefaultFloorCheck; negative: no floor (every pick looks at every
	// row, as before schema version 11).
	FloorCheck time.Duration
}

// DefaultFloorCheck is Config.FloorCheck's default: a plain row that becomes
// visible below the pick's floor (a transaction that commits more than a
// second after its now(), a RunAt in the past, a reaped row) is picked at
// most this long, plus a check and a pick, after it does (docs/design.md §4).
const DefaultFloorCheck = time.Second

// floorCheckDuty bounds the share of time a queue's floor checks take: the
// next check starts no sooner than this many times the last one's duration
// after that one started. A check reads every index entry below the floor
// with its heap tuple; under a snapshot held elsewhere those are the entries
// of every row claimed since the hold began, so checks grow with the hold
// (0.8-1.2 s each six minutes into a hold at 2,000 jobs/s), and run once a second they
// kept a server process busy per engine. Spaced by their duration they take
// at most a tenth of one, and a row below the floor waits longer: at most
// floorCheckDuty × the last check's duration instead of FloorCheck.
const floorCheckDuty = 10

// floorCheckDue reports whether a floor check may start at now, the last
// one having started at ticked and taken took.
func floorCheckDue(now, ticked time.Time, took, every time.Duration) bool {
	return now.Sub(ticked) >= backoff.Spaced(every, floorCheckDuty, took)
}

// maxFloorPrios bounds the priorities the pick seeks to the floor within;
// rows of other priorities are still picked, their entries below the floor
// read but not their heap tuples.
const maxFloorPrios = 8

// Result is what an executor reports about a finished step.
type Result struct {
	// RunnableNow is true when the committed outcome made the instance
	// runnable at once (a Next or Replay without delay): there is work to
	// pick even if the last pick came back short.
	RunnableNow bool
	// KeyFreed is true when the committed outcome freed a slot of a
	// partition key: the key's next row may be claimable now, so the feeder
	// picks again at once rather than at its next poll tick (docs/design.md §6);
	// not set when the outcome handed the slot to the key's next row.
	KeyFreed bool
}

// Executor runs one claimed row to a committed (or fenced-out) outcome.
// ctx is cancelled when the engine stops after its drain timeout, or with
// cause ErrLeaseLost when the heartbeat finds the lease gone. Through h it
// may keep the row claimed under a new token and run its next step.
type Executor func(ctx context.Context, c *sqlq.Claimed, h Holder) Result

// Holder is what an executor may ask of the feeder that gave it a row.
type Holder interface {
	// Continue moves the held claim from the old token to the new one (the
	// outcome statement re-claimed the row), so that heartbeats follow it.
	// It reports false if the old claim is no longer held (lease lost), or
	// if its deadline or the new lease's (one lease after the outcome
	// statement was about to be sent, see Committing) has passed: the
	// caller must release the row then, and not run its next step.
	Continue(oldToken, newToken int64) bool
	// Stopping reports that the feeder is shutting down: finish, don't chain.
	Stopping() bool
	// Committing says the step has returned and its outcome is being
	// written: a heartbeat that no longer finds the claim (the outcome may
	// have just committed) is then no lost lease.
	Committing()
	// Detach frees the step's running slot before its outcome has
	// committed: the claim stays held (heartbeated, counted against the
	// claim window, waited for by Wait) until the returned func is called
	// with the final result. The executor then returns at once. It implies
	// Committing.
	Detach() func(Result)
	// MayHandOff reports that a keyed step's outcome may claim its key's
	// next row (the key hand-off, docs/design.md §6): the feeder is not
	// stopping; its last pick came back short of its demand (no other work
	// was waiting for the slot the key would keep) and no kick or wake has
	// said since that rows of this process became runnable; the next
	// buffered claim, whose slot the key would keep, has waited less than a
	// second; it has at least MinDemand free places (a hand-off keeps
	// the claims held as they are, and below MinDemand the feeder would not
	// pick for other keys); and, if its last pick was allowed no keyed row
	// (so looked at no other key's), its steps turn over at least one per
	// second (slower, no pick would look while the chain ran).
	MayHandOff() bool
	// HandOff moves the held claim from the old token (whose outcome
	// committed) to next, the row its outcome statement claimed in its
	// place: heartbeats follow it and its deadline counts from when the
	// outcome statement was about to be sent (see Committing). It reports
	// false if the old claim is no longer held, its deadline has passed, or
	// the feeder is stopping: the caller must release next then.
	HandOff(oldToken int64, next *sqlq.Claimed) bool
	// Abandon gives up a step that ignores its context (the caller writes
	// its outcome): its claim is no longer heartbeated and Wait no longer
	// waits for it, but it keeps its running slot until the executor
	// returns. It reports how many slots abandoned steps hold, and false
	// (changing nothing) if the executor has returned already. Call it
	// from any goroutine, at most once per step.
	Abandon() (slots int, ok bool)
	// Begin reports whether the step of the claim held now may start: false
	// once its instance was cancelled through this process (CancelSteps),
	// which then has nothing more to do with it — the claim is dead, its
	// step must not run. Decided under the feeder's lock: a cancel after a
	// true answer cancels a step that has begun.
	Begin(ctx context.Context) bool
}

// Events receives what the feeder observes. Methods are called from the
// feeder's goroutines and must be quick.
type Events interface {
	Pick(r PickReport)
	Saturation(queue string, inFlight, buffered, concurrency, prefetch int)
	// LeaseLost reports a claim given up: started, its step was
	// cancelled; else no step ran (it waited in the buffer, or was
	// dispatched but had not begun).
	LeaseLost(queue string, id int64, started bool)
	HeartbeatFailed(queue string, err error)
	Released(queue string, count int, err error)
}

// PickReport is one pick as the feeder saw it.
type PickReport struct {
	Queue         string
	Count, Demand int // rows claimed, rows asked for
	Duration      time.Duration
	Err           error
	// KeysFull and KeysRated count the partition keys passed over, full or
	// out of starts: element 0 for keys no policy matches, element i+1
	// for Config.KeyPolicies[i].
	KeysFull, KeysRated []int32
}

// maxErrorBackoff caps the wait between failed picks (unless
// MaxPollInterval is longer): a feeder is back at work within this long of
// the database accepting connections again.
const maxErrorBackoff = 2 * time.Second

// ErrLeaseLost is the cancellation cause of a step whose lease is gone.
var ErrLeaseLost = errors.New("gendurable: lease lost")

// ErrInstanceCancelled is the cause of a step whose instance was cancelled
// through this process (CancelSteps): its claim is gone, so it is an
// ErrLeaseLost too, and handled as one.
var ErrInstanceCancelled = fmt.Errorf("%w: its instance was cancelled", ErrLeaseLost)

// held is one claim this feeder holds, keyed by its claim token: the same
// instance may be claimed again (after its lease was reaped) while a zombie
// run of it is still returning, and the two must never be confused.
type held struct {
	id         int64
	running    bool                    // dispatched to a worker goroutine
	started    bool                    // and past startable: its step runs (or ran)
	committing bool                    // the step returned; its outcome is being written
	cancel     context.CancelCauseFunc // set once running
	// deadline is when this claim's lease may run out on the database
	// clock, as far as this process knows: a local instant no later than
	// the database's expiry (it is taken before the statement that set the
	// lease was sent). Past it the claim is given up (see expire).
	deadline     time.Time
	committingAt time.Time // when the outcome statement was about to be sent
	// marked: a heartbeat sent this claim as not started, so the database
	// may hold its mark (unstarted_token): an expiry would cost no
	// attempt. The step must not start until the mark is cleared
	// (clearMarks), or a run that did start could go uncharged.
	// unmarking: its clear is due or in flight; heartbeats send it as
	// started from then on.
	marked, unmarking bool
	// paced: a start of its rated key was taken for it (paceLocked).
	paced bool
	// passed: a plain claim a keyed one went ahead of by keyedFirst (add):
	// no other will.
	passed bool
	// key: a keyed claim's partition key (a hand-off keeps it: the
	// successor is of the same key). level: a buffered keyed claim's place
	// among its key's claims this feeder held when it was buffered (1: its
	// key's only one), by which add orders the buffer (fairAtLocked).
	key   *string
	level int
}

// Feeder feeds one queue.
type Feeder struct {
	cfg  Config
	q    *sqlq.Queries
	db   sqlq.DB
	exec Executor
	ev   Events
	log  *slog.Logger

	kick chan struct{} // wake the loop: a completion or a local insert
	// unmark asks the heartbeat goroutine to clear the marks of the
	// buffered claims dispatch wants to start (see held.marked): it runs
	// there so that no heartbeat sending them as not started is in flight
	// at the same time.
	unmark chan struct{}
	// work feeds the step workers: Concurrency long-lived goroutines, so a
	// step does not pay for a new goroutine and its stack growth.
	work chan stepJob

	mu   sync.Mutex
	held map[int64]*held // by claim token
	// cancelled: instances cancelled through this process (CancelSteps),
	// when; kept for two leases, for claims of them a statement in flight
	// at the cancel brings back afterwards (cancelledSinceLocked).
	cancelled map[int64]time.Time
	buffer    []sqlq.Claimed   // claimed, not yet started, in dispatchOrder
	paced     map[string]*pace // rated keys' buckets of this process's starts (paceLocked)
	paceWake  time.Time        // when the earliest paced row may start, or a keyed claim falls overdue (zero: none waits); Run dispatches then
	rateWake  time.Time        // when a rated key a pick passed over out of starts has one again, at the latest (zero: none); Run picks then
	inFlight  int
	// committing counts detached steps whose outcome is not committed yet.
	committing int
	// abandoned counts running steps given up on (see Holder.Abandon).
	abandoned int
	more      bool // the last pick was full, or an outcome made work runnable or freed a key's slot
	hurry     bool // Hurry: poll from BusyPollInterval again, doubling while the picks find nothing
	// keyedShut: the last pick may have left keyed rows behind for want of
	// room (keyedRoomLocked): a step that returns makes some. keyedFull: it
	// did leave some (it claimed as many as its bound, above none).
	keyedShut, keyedFull bool
	// The running slots freed (steps returned) per keyedHorizon, over the
	// last len(freed) of them: freed[freedIdx] counts the current one,
	// begun at freedAt.
	freed    [4]int
	freedIdx int
	freedAt  time.Time
	// lastFreed is when a step last returned. keyedStuck: a keyed claim
	// went back overdue since (keyedOverdueLocked), so picks claim keyed
	// rows only into slots free now until a step returns.
	lastFreed  time.Time
	keyedStuck bool
	// keyedFirst: the pick in flight may claim one keyed row by the floor
	// (keyedRoomLocked), which add puts at the head of the buffer.
	keyedFirst bool
	// keysFullAt: when the last pick that walked the keys began, if its
	// walk went round every key and found none it could claim a row of
	// (zero otherwise); the picks that follow walk no key until
	// keysRecheck after it, unless keyNews (keysWalkDueLocked). keyNews:
	// this process did something since the last walk began that may have
	// made a keyed row claimable (an insert, a step of its own that freed
	// a key's slot, a claim given back or lost, a row of ours became
	// eligible, a failed pick).
	keysFullAt  time.Time
	keysRecheck time.Duration
	keyNews     bool
	// pollAt is Run's next poll (UnixNano), for Hurry.
	pollAt   atomic.Int64
	released int // rows handed back when Run stopped
	// releaseFailed rows were not handed back when Run stopped: the
	// statement failed with releaseErr.
	releaseFailed int
	releaseErr    error
	// lastBeat is when the held leases were last confirmed (or nothing was
	// held): dispatch holds buffered rows back when it is old.
	lastBeat time.Time
	// deadline fires at the earliest held claim's deadline (armedAt): the
	// claims whose lease may have run out on the database clock are given
	// up at once (see expire) — also the moment a stopped process resumes,
	// before it sends another heartbeat.
	deadline *time.Timer
	armedAt  time.Time
	timerOff bool // Heartbeat returned: the timer stays stopped
	// wakes are the instants this process knows rows become eligible (its
	// own delayed outcomes and inserts): a min-heap, at most maxWakes; the
	// loop picks at the earliest instead of waiting for its poll timer.
	wakes wakeHeap
	// keyCursor is the key the last pick's walk over partition keys
	// stopped at: the next pick starts after it (round robin). Loop only.
	keyCursor string
	// The pick's floor (docs/design.md §4), loop only: floor is the last
	// pick's PickResult.Floor (nil: none), prios the priorities plain rows
	// were claimed at lately (most recent first), floorTicked when floorTick
	// last started a check or dropped the floor, claimedSince whether a
	// pick claimed rows since then.
	floor        *time.Time
	prios        []int16
	floorTicked  time.Time
	claimedSince bool
	// floorFound is what the last floor check found (under mu): the
	// earliest eligible_at of a runnable plain row below the floor, or the
	// zero time when the check failed. checking: a check is running;
	// checkTook: how long the last one took (floorCheckDue).
	floorFound *time.Time
	checking   bool
	checkTook  time.Duration
	checks     sync.WaitGroup
	givingBack sync.WaitGroup // goGiveBack's goroutines
	heldBack   bool           // dispatch waits for a heartbeat (see dispatch)
	stopping   atomic.Bool    // Run is returning: no more chained steps
	// short: the last pick came back with fewer rows than it asked for
	// (and did not fail), and no local insert or wake has made work
	// runnable since, so keyed steps may hand their slots on.
	short atomic.Bool
	steps sync.WaitGroup
	// pending counts steps as steps does (each Add and Done with it), so
	// Wait can tell at once that none is left: with a context already
	// done, its wait on steps would lose the race to ctx.
	pending atomic.Int64

	// abortCtx bounds the statements a stopping feeder lets finish (a pick
	// in flight, the release of its buffer); Abort cancels it.
	abortCtx context.Context
	abort    context.CancelFunc
}

// New creates a feeder; Run starts it.
func New(cfg Config, q *sqlq.Queries, db sqlq.DB, exec Executor, ev Events, log *slog.Logger) *Feeder {
	s := &Feeder{
		cfg: cfg, q: q, db: db, exec: exec, ev: ev, log: log,
		kick:      make(chan struct{}, 1),
		unmark:    make(chan struct{}, 1),
		work:      make(chan stepJob, cfg.Concurrency),
		held:      make(map[int64]*held),
		cancelled: map[int64]time.Time{},
		// Not zero: dispatch waits while the leases look unconfirmed.
		lastBeat: time.Now(),
	}
	if s.cfg.FloorCheck == 0 {
		s.cfg.FloorCheck = DefaultFloorCheck
	}
	s.deadline = time.AfterFunc(time.Hour, s.expire)
	s.deadline.Stop()
	s.abortCtx, s.abort = context.WithCancel(context.Background())
	return s
}

// Abort ends, at once, the statements that Run's stop otherwise lets
// finish: a pick in flight (its answer may hold claims) and the release of
// prefetched rows. The engine calls it when its Stop's context ends while
// they still wait on the database — a network cut off, a stuck server.
// Rows such a pick claimed, or the release did not hand back, keep their
// leases and are reaped like a crashed worker's (docs/design.md §7).
func (s *Feeder) Abort() { s.abort() }

// confirmed records that the held leases were confirmed at the instant at
// (or that nothing was held then). The caller holds s.mu.
func (s *Feeder) confirmed(at time.Time) { s.lastBeat = at }

// armLocked sets the timer for the earliest deadline among the held claims,
// or for d if that is earlier than what it is armed for. The caller holds
// s.mu.
func (s *Feeder) armLocked(d time.Time) {
	if s.timerOff || (!s.armedAt.IsZero() && !d.Before(s.armedAt)) {
		return
	}
	s.armedAt = d
	s.deadline.Reset(time.Until(d))
}

// rearmLocked arms the timer for the earliest deadline among the held
// claims (none held: disarmed). The caller holds s.mu.
func (s *Feeder) rearmLocked() {
	s.armedAt = time.Time{}
	s.deadline.Stop()
	for _, h := range s.held {
		s.armLocked(h.deadline)
	}
}

// expire gives up every held claim whose deadline has passed: its lease
// may have run out on the database clock, where another process (or, for a
// keyed row, another row of its key) may take over. A running step is
// cancelled with ErrLeaseLost, a buffered row dropped (docs/design.md §6).
func (s *Feeder) expire() {
	s.mu.Lock()
	now := time.Now()
	var lost []lostClaim
	var back unstarted
	for token, h := range s.held {
		if h.deadline.After(now) {
			continue
		}
		if !h.running {
			back.add(h.id, token)
		}
		lost = append(lost, s.loseLocked(token, h))
	}
	s.rearmLocked()
	s.mu.Unlock()
	s.gaveUp(lost, back)
}

// gaveUp reports the claims given up (their instance ids) as lost leases
// and hands back those whose steps never started. Called without s.mu.
func (s *Feeder) gaveUp(lost []lostClaim, back unstarted) {
	for _, l := range lost {
		s.ev.LeaseLost(s.cfg.Queue, l.id, l.started)
	}
	if len(back.ids) > 0 {
		// Not on the caller's goroutine: a heartbeat that failed calls
		// expire, and must not wait on the database once more.
		s.goGiveBack(back)
	}
}

// goGiveBack runs giveBack on a goroutine of its own, which Run waits for
// before it returns; none is started once the feeder is stopping (Run's
// releaseBuffer, or the reaper, takes such claims).
func (s *Feeder) goGiveBack(u unstarted) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.goGiveBackLocked(u)
}

// goGiveBackLocked is goGiveBack for a caller holding s.mu.
func (s *Feeder) goGiveBackLocked(u unstarted) {
	if s.stopping.Load() {
		return
	}
	s.givingBack.Add(1)
	go func() {
		defer s.givingBack.Done()
		s.giveBack(u)
	}()
}

// unstarted lists claims given up before their step started.
type unstarted struct{ ids, tokens []int64 }

func (u *unstarted) add(id, token int64) {
	u.ids, u.tokens = append(u.ids, id), append(u.tokens, token)
}

// giveBack hands claims this process gave up before their steps started
// (their deadline passed while buffered, or before a worker began them)
// back to runnable at once, with no attempt counted — fenced by their
// tokens, so a claim the reaper took meanwhile, or whose row moved on,
// changes nothing. Without it such a claim waits for the reaper, which
// returns it uncharged only if a heartbeat marked it not started (once per
// attempt) or none confirmed it (once per step: docs/design.md §4).
// A failed statement is tried again (a fresh connection from the pool:
// the session may have been ended under it), 20 ms after the first failure,
// doubling, for up to 5 s or a lease; after that the claims are left to
// the reaper, as above — and the key of a keyed one waits for its lease (a
// fault probe: 60 s and, before schema version 24, an attempt, the sessions
// cut once as the release went).
func (s *Feeder) giveBack(u unstarted) {
	ctx, cancel := context.WithTimeout(s.abortCtx, min(s.cfg.Lease, 5*time.Second))
	defer cancel()
	released, err := s.release(ctx, u.ids, u.tokens)
	for wait := 20 * time.Millisecond; err != nil && ctx.Err() == nil; wait *= 2 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
			released, err = s.release(ctx, u.ids, u.tokens)
		}
		t.Stop()
	}
	if err != nil {
		s.log.Info("gendurable: handing back claims given up before their steps started failed; the reaper will recover them",
			"queue", s.cfg.Queue, "rows", len(u.ids), "err", err)
		return
	}
	if len(released) > 0 {
		s.mu.Lock()
		s.more = true // runnable again: maybe for this feeder's next pick
		s.keyNews = true
		s.mu.Unlock()
		s.wake()
	}
}

// CancelSteps cancels, with cause, the running steps of the instances in
// ids (which an operator just cancelled: their claims are fenced out) and
// drops their claims whose steps have not started — buffered, or
// dispatched to a worker that has not begun them — which would only run a
// step whose outcome is fenced out. A running step's claim stays held, and
// heartbeated, until the step ends: its lease keeps its key's slot as long
// as the step may still act (the heartbeat then finds it gone).
func (s *Feeder) CancelSteps(ids map[int64]bool, cause error) {
	s.mu.Lock()
	now := time.Now()
	s.pruneCancelledLocked(now)
	for id := range ids {
		s.cancelled[id] = now
	}
	n := 0
	for token, h := range s.held {
		if !ids[h.id] {
			continue
		}
		n++
		if h.running && h.started {
			h.cancel(cause)
			continue
		}
		// Buffered, or handed to a worker goroutine that has not begun it
		// (startable then finds it gone): its step never starts. The row
		// is finished: nothing to hand back.
		s.loseLocked(token, h)
	}
	if n > 0 {
		s.rearmLocked()
	}
	s.mu.Unlock()
	if n > 0 {
		s.wake() // a dropped claim frees a place
	}
}

// pruneCancelledLocked forgets the cancels older than two leases: no
// statement sent before one is still in flight (a pick's, and an outcome's
// try, run within a lease). Run by CancelSteps and every heartbeat, so a
// large bulk cancel's ids are not kept past that. The caller holds s.mu.
func (s *Feeder) pruneCancelledLocked(now time.Time) {
	if len(s.cancelled) == 0 {
		return
	}
	for id, at := range s.cancelled {
		if now.Sub(at) > 2*s.cfg.Lease {
			delete(s.cancelled, id)
		}
	}
	if len(s.cancelled) == 0 {
		s.cancelled = map[int64]time.Time{} // a map does not shrink
	}
}

// cancelledSinceLocked reports whether instance id was cancelled through
// this process (CancelSteps) at or after t: a claim of it that a statement
// sent at t brings back may predate the cancel, and its step must not run
// (the cancel found no claim of it to cancel: it was in flight). The
// caller holds s.mu.
func (s *Feeder) cancelledSinceLocked(id int64, t time.Time) bool {
	at, ok := s.cancelled[id]
	return ok && !at.Before(t)
}

// lostClaim is a claim given up: its instance, and whether its step had
// started (and is cancelled) or not (it waited in the buffer, or was
// dispatched but had not begun).
type lostClaim struct {
	id      int64
	started bool
}

// loseLocked gives up a held claim whose lease is gone: it is no longer
// heartbeated, its step is cancelled with ErrLeaseLost or, if it was only
// buffered, it is dropped. It returns what to report of it. The caller
// holds s.mu.
func (s *Feeder) loseLocked(token int64, h *held) lostClaim {
	delete(s.held, token)
	s.keyNews = true // its key's slot frees when the lease runs out
	if h.running {
		h.cancel(ErrLeaseLost)
		// A claim dispatched whose step has not started yet (the process
		// was stopped or starved before startable) ran nothing.
		return lostClaim{h.id, h.started}
	}
	for j := range s.buffer {
		if s.buffer[j].Token == token {
			s.buffer = append(s.buffer[:j], s.buffer[j+1:]...)
			break
		}
	}
	return lostClaim{h.id, false}
}

// Kick wakes the loop at once (a local insert made work runnable). Until
// the next pick, keyed outcomes do not hand their slots on: the new rows
// may be waiting for one.
func (s *Feeder) Kick() {
	s.mu.Lock()
	s.more = true
	s.keyNews = true
	s.short.Store(false)
	s.mu.Unlock()
	s.wake()
}

// Hurry wakes the loop and sets its poll interval back to the busy one,
// from which it doubles again while picks find nothing: rows were written
// in a transaction this process does not see commit (InsertTx), so a pick
// at once may not see them, and the idle backoff (up to MaxPollInterval)
// would leave them waiting. A transaction that commits d after the insert
// has its rows picked about 2d plus BusyPollInterval after it, at most.
//
// It asks for no pick itself (a loop of InsertTx calls would send one each,
// for rows not committed yet): the next poll, a busy interval away, looks.
//
// The loop is woken only when its next poll is further off than the busy
// interval: a stream of calls wakes it about once per interval, not once
// each (a wake of an idle loop picks).
func (s *Feeder) Hurry() {
	s.mu.Lock()
	s.hurry = true
	s.keyNews = true // the rows may be keyed: the next pick walks the keys
	s.mu.Unlock()
	if time.Until(time.Unix(0, s.pollAt.Load())) > s.busyPoll() {
		s.wake()
	}
}

// KickBelow wakes the loop for a row this process made eligible since t, a
// time that may be below the pick's floor (an insert's RunAt in the past):
// the next pick looks from t on (docs/design.md §4).
func (s *Feeder) KickBelow(t time.Time) {
	s.mu.Lock()
	if s.floorFound == nil || t.Before(*s.floorFound) {
		s.floorFound = &t
	}
	s.more = true
	s.keyNews = true // keyed rows too (a WithTx outcome's inserts)
	s.mu.Unlock()
	s.wake()
}

// maxWakes bounds the wake instants a feeder remembers; past it the
// latest are dropped (the poll timer finds those rows).
const maxWakes = 4096

// KickAt asks the loop to pick at t: a row this process wrote becomes
// eligible then (a retry's backoff, a durable sleep, RunIn). Rows that other
// processes delay are found by the poll timer as before.
func (s *Feeder) KickAt(t time.Time) {
	s.mu.Lock()
	earliest := len(s.wakes) == 0 || t.Before(s.wakes[0])
	s.wakes.pushBounded(t, maxWakes)
	s.mu.Unlock()
	if earliest {
		s.wake() // the loop's timer may need to fire sooner
	}
}

// nextWakeLocked drops the wake instants that have passed and reports
// whether there were any, and the next one still ahead (zero if none).
func (s *Feeder) nextWakeLocked(now time.Time) (due bool, next time.Time) {
	for len(s.wakes) > 0 && !s.wakes[0].After(now) {
		heap.Pop(&s.wakes)
		due = true
	}
	if len(s.wakes) > 0 {
		next = s.wakes[0]
	}
	return due, next
}

// wakeHeap is a min-heap of instants.
type wakeHeap []time.Time

// pushBounded adds t, keeping at most max instants. Full, it first drops
// the later half of what it holds (sorted, the earlier half is a valid
// heap): an instant is only ever dropped for earlier ones, at O(log n) a
// push amortized. Before, a full heap dropped whatever came: one InsertMany
// of 4,000 rows an hour ahead filled it, and a row due in a second,
// inserted after them, lost its wake and waited for the idle poll.
func (h *wakeHeap) pushBounded(t time.Time, max int) {
	if max <= 0 {
		return
	}
	if len(*h) >= max {
		slices.SortFunc(*h, func(a, b time.Time) int { return a.Compare(b) })
		*h = (*h)[:max/2]
	}
	heap.Push(h, t)
}

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h wakeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *wakeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

func (s *Feeder) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run picks and dispatches until pickCtx is done, then releases the buffered
// rows and returns. Steps run with contexts derived from workCtx and may
// still be running when Run returns: wait for them with Wait. The heartbeat
// must run (see Heartbeat) as long as anything is held.
func (s *Feeder) Run(pickCtx, workCtx context.Context) {
	for range s.cfg.Concurrency {
		go s.worker()
	}
	defer close(s.work) // after the last dispatch: workers finish their step and exit
	interval := s.cfg.PollInterval
	// After a failed pick (the database is down or restarting), no pick
	// before retryAt: kicks and poll ticks wait too, so a feeder does not
	// hammer a database that is coming back up.
	var retryAt time.Time
	// pollAt is when the poll timer fires next. It moves only when a pick
	// or a tick happens: kicks (every finished step sends one) must not
	// restart it, or a busy feeder would never look for other processes'
	// inserts.
	var pollAt time.Time
	setPoll := func(t time.Time) { pollAt = t; s.pollAt.Store(t.UnixNano()) } // Hurry reads it
	setPoll(time.Now().Add(interval))
	// busyUntil: a queue whose picks found rows within the last PollInterval
	// is busy. Its empty picks (a finished step wakes the feeder, the queue
	// has just drained) keep the busy interval instead of backing off, so
	// work another process inserts a moment later is still picked up within
	// BusyPollInterval (docs/design.md §4).
	var busyUntil time.Time
	failures := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for pickCtx.Err() == nil {
		s.dispatch(workCtx)

		s.mu.Lock()
		hurried := s.hurry
		if hurried {
			// The poll only ever moves earlier: hurries closer together
			// than the busy interval must not keep pushing it off (a
			// review: a stream of InsertTx calls stopped the polls).
			s.hurry = false
			interval = s.busyPoll()
			if at := time.Now().Add(interval); at.Before(pollAt) {
				setPoll(at)
			}
		}
		demand := s.demandLocked()
		keyed, first := s.keyedRoomLocked()
		s.keyedFirst = first
		walk := keyed == 0 || s.keysWalkDueLocked(time.Now())
		idle := s.inFlight+len(s.buffer) == 0 && s.committing == 0
		// Pick when there is room (at least MinDemand, or anything when
		// idle) and a reason to look: a full last pick, a kick, a poll tick,
		// or an idle queue — not a Hurry's wake alone, which only moved
		// the poll.
		shouldPick := demand > 0 && (demand >= s.cfg.MinDemand || idle) && (s.more || (idle && !hurried)) && !time.Now().Before(retryAt)
		if shouldPick {
			s.more = false // cleared first: a kick during the pick is not lost
			if walk && keyed > 0 {
				s.keyNews = false // likewise: news during the walk is not lost
			}
		}
		s.mu.Unlock()

		if shouldPick {
			n, err := s.pick(pickCtx, demand, keyed, walk)
			full := err == nil && n == demand
			s.mu.Lock()
			// A pick that claimed as many keyed rows as its bound allowed
			// is not out of work: the keyed steps it leaves do not hand
			// their slots on (MayHandOff). One allowed none did not look.
			keyedFull := s.keyedFull
			s.mu.Unlock()
			s.short.Store(err == nil && n < demand && !keyedFull)
			switch {
			case err != nil:
				// Database trouble: back off, with jitter, until a pick works.
				failures++
				retryAt = time.Now().Add(backoff.Delay(s.cfg.PollInterval, max(s.cfg.MaxPollInterval, maxErrorBackoff), failures))
				s.mu.Lock()
				s.more = true // the pick did not happen: look again once the backoff is over
				s.keyNews = true
				s.mu.Unlock()
			case n > 0:
				// Work is arriving: look again soon, for rows that other
				// processes insert (they cannot kick this feeder).
				failures, interval = 0, s.busyPoll()
				busyUntil = time.Now().Add(s.cfg.PollInterval)
			case time.Now().Before(busyUntil):
				failures, interval = 0, s.busyPoll()
			case idle:
				failures, interval = 0, min(interval*2, s.cfg.MaxPollInterval)
			case interval < s.cfg.PollInterval:
				failures, interval = 0, min(interval*2, s.cfg.PollInterval)
			default:
				failures = 0
			}
			setPoll(time.Now().Add(interval))
			if full {
				s.mu.Lock()
				s.more = true
				s.mu.Unlock()
			}
			if pickCtx.Err() != nil {
				break // the rows just claimed are released below, not started
			}
			s.dispatch(workCtx)
			s.ev.Saturation(s.cfg.Queue, s.inFlightNow(), s.bufferedNow(), s.cfg.Concurrency, s.cfg.Prefetch)
			if full {
				continue // a full pick: more is likely waiting
			}
		}

		s.mu.Lock()
		now := time.Now()
		due, nextWake := s.nextWakeLocked(now)
		if due {
			s.more = true // a row of ours became eligible
			s.keyNews = true
			s.short.Store(false)
		}
		// A paced row (dispatch) may start now: dispatch, no pick.
		paceDue, paceAt := false, s.paceWake
		if !paceAt.IsZero() && !now.Before(paceAt) {
			s.paceWake, paceDue = time.Time{}, true
		}
		// A rated key passed over has a start again: pick, walking.
		rateDue, rateAt := false, s.rateWake
		if !rateAt.IsZero() && !now.Before(rateAt) {
			s.rateWake, rateDue = time.Time{}, true
			s.more, s.keyNews = true, true
		}
		s.mu.Unlock()
		if due || paceDue || rateDue {
			continue
		}
		wait := time.Until(pollAt)
		if !nextWake.IsZero() {
			wait = min(wait, time.Until(nextWake))
		}
		wait = max(wait, time.Until(retryAt))
		if !paceAt.IsZero() {
			wait = min(wait, time.Until(paceAt)) // dispatch needs no database
		}
		if !rateAt.IsZero() {
			wait = min(wait, time.Until(rateAt))
		}
		resetTimer(timer, max(wait, 0))
		select {
		case <-pickCtx.Done():
		case <-s.kick:
			continue
		case <-timer.C:
			// The poll tick: look again. A wake of a row of ours, or of a
			// paced row, is seen at the top of the loop.
			if !time.Now().Before(pollAt) {
				setPoll(time.Now().Add(interval))
				s.mu.Lock()
				s.more = true
				s.mu.Unlock()
			}
			continue
		}
		break
	}
	s.mu.Lock() // goGiveBack starts no goroutine from here on
	s.stopping.Store(true)
	s.mu.Unlock()
	s.releaseBuffer()
	s.checks.Wait()
	s.givingBack.Wait()
}

// demandLocked is how many rows a pick may claim now: the running and
// prefetch window less the claims held; none while abandoned steps hold
// every slot. Outcomes waiting for their group
// commit hold claims too, but need no worker: they get a window of their
// own (as large as the running+prefetch one) before they hold back
// picking. The caller holds s.mu.
func (s *Feeder) demandLocked() int {
	if s.abandoned >= s.cfg.Concurrency {
		return 0 // no slot to start a claim in (handBackStrandedLocked)
	}
	window := s.cfg.Concurrency + s.cfg.Prefetch
	return window - (s.inFlight + len(s.buffer) + max(0, s.committing-window))
}

// keyedHorizon is how soon a worker must expect to start a keyed row to
// claim it: a keyed claim takes a slot of its key for as long as it is
// held, so one left waiting in a prefetch buffer behind busy slots keeps
// the key from workers of other processes that have slots free
// (docs/design.md §6, "Keyed claims wait little"). One still waiting for a
// slot after twice this is handed back.
const keyedHorizon = time.Second

// keyedRoomLocked is how many keyed rows a pick may claim now: the slots
// expected to free within the next keyedHorizon — the running slots free
// now, or as many as freed per horizon over the last four if that is more
// (a mean: a slot that freed a moment ago and was taken again does not
// count as one about to free) — less the buffered claims a keyed claim
// taken now would start behind (dispatchOrder). A worker whose steps are
// stuck, or take more than a horizon each, claims keyed rows only into
// slots free now; the rest of its prefetch window is for plain rows. But a
// worker whose buffer holds plain claims and no keyed one, and one of whose
// steps returned within the last two horizons, may claim one keyed row
// (first: it goes to the head of the buffer and takes the next slot that
// frees): else a backlog of slow plain steps, whose claims fill every slot
// as it frees, would leave no keyed row a place for as long as it lasts (a
// review: one keyed row behind 16 plain ones of 1.5 s ran after all of
// them). After a keyed claim went back overdue, only slots free now count
// until a step returns (keyedStuck). The caller holds s.mu.
func (s *Feeder) keyedRoomLocked() (room int, first bool) {
	now := time.Now()
	free := s.cfg.Concurrency - s.inFlight
	ahead, keyed := 0, false
	for i := range s.buffer {
		if s.buffer[i].PartitionKey != nil {
			keyed = true
		}
		if !dispatchOrder(&s.buffer[i]).After(now) {
			ahead++
		}
	}
	if s.keyedStuck {
		return max(0, free-ahead), false
	}
	room = max(free, s.freedLocked(now)/len(s.freed)) - ahead
	if room <= 0 && !keyed && len(s.buffer) > 0 && now.Sub(s.lastFreed) < 2*keyedHorizon {
		return 1, true // the buffer holds plain claims only, and they are starting
	}
	return max(0, room), false
}

// keysWalkDuty bounds the share of a queue's picks spent walking keys
// that were all full: after a walk that went round every key and could
// claim a row of none, the next walk starts no sooner than this many times
// that pick's duration after it began, unless this process hears of a key
// that may have room first (keyNews). A walk reads every key with runnable
// rows — two index probes and a count each, up to PickOpts.MaxKeys keys —
// and picks every BusyPollInterval walked them all while the key hand-off
// kept every slot taken: 16–22 of 72–76 buffers per step on the bench's
// 100 keys (docs/design.md §6, "A walk that finds every key full…").
const keysWalkDuty = 10

// keysRecheckAfter is how long after a walk that took took and found every
// key full the next one is due without news: keysWalkDuty times took, at
// least the busy poll interval and at most a keyedHorizon or the poll
// interval, whichever is longer.
func keysRecheckAfter(took, busy, poll time.Duration) time.Duration {
	return min(max(keysWalkDuty*took, busy), max(poll, keyedHorizon))
}

// keysAllFull reports whether a pick asked with o, which claimed n rows,
// got of them keyed, walked every key of the queue and found none it could
// claim a row of for want of a slot: it walked (its cursor row came back),
// claimed no keyed row and fewer rows than it could (so its walk ran on
// until it had been round), and ended where it began (a walk cut short by
// MaxKeys ends elsewhere). A key out of starts (rated) refills with time:
// a pick that passed one over is not all full.
func keysAllFull(o sqlq.PickOpts, res sqlq.PickResult, n, got int) bool {
	if !res.Walked || got > 0 || n >= o.Limit || res.Cursor != o.Cursor {
		return false
	}
	for _, r := range res.KeysRated {
		if r > 0 {
			return false
		}
	}
	return true
}

// keysWalkDueLocked reports whether a pick at now may walk the keys: the
// last walk did not find them all full, or it is keysRecheck old, or this
// process has done something since it began that may have made a keyed
// row claimable. The caller holds s.mu.
func (s *Feeder) keysWalkDueLocked(now time.Time) bool {
	return s.keyNews || s.keysFullAt.IsZero() || now.Sub(s.keysFullAt) >= s.keysRecheck
}

// freedLocked is how many running slots freed over the last len(s.freed)
// horizons. The caller holds s.mu.
func (s *Feeder) freedLocked(now time.Time) int {
	s.rollFreedLocked(now)
	n := 0
	for _, f := range s.freed {
		n += f
	}
	return n
}

// dispatchOrder is where a buffered claim stands in the order dispatch
// starts them (add keeps the buffer sorted by it): a keyed claim at the
// moment it was claimed, a plain one a keyedHorizon later. A keyed claim
// holds its key's slot while it waits, so it goes ahead of the plain
// claims taken less than a horizon before it — and of no older one: a
// stream of keyed claims cannot hold a plain claim back for longer. (The
// one keyed claim keyedRoomLocked allows a worker busy with plain claims
// goes first instead; add lets each plain claim be passed so once.)
func dispatchOrder(c *sqlq.Claimed) time.Time {
	if c.PartitionKey != nil {
		return c.Buffered
	}
	return c.Buffered.Add(keyedHorizon)
}

// keyedOverdueLocked reports whether c is a keyed claim that has waited in
// the buffer for a running slot for twice keyedHorizon with no step of
// this worker returning meanwhile — its slots are stuck — and may go back:
// its clear is not in flight (unmarking). A claim behind others while
// steps keep returning waits its turn. (A rated key's claim goes back too:
// its start is spent, so the key runs one start below its rate, never
// above.) If one is not yet overdue, Run is woken to dispatch when it will
// be (paceWake). The caller holds s.mu.
func (s *Feeder) keyedOverdueLocked(c sqlq.Claimed, now time.Time) bool {
	if c.PartitionKey == nil {
		return false
	}
	h := s.held[c.Token]
	if h == nil || h.unmarking {
		return false
	}
	due := c.Buffered
	if s.lastFreed.After(due) {
		due = s.lastFreed
	}
	due = due.Add(2 * keyedHorizon)
	if now.Before(due) {
		if s.paceWake.IsZero() || due.Before(s.paceWake) {
			s.paceWake = due
		}
		return false
	}
	return true
}

// rollFreedLocked moves the freed-slot windows on to now. The caller holds
// s.mu.
func (s *Feeder) rollFreedLocked(now time.Time) {
	for n := 0; now.Sub(s.freedAt) >= keyedHorizon; n++ {
		if n == len(s.freed) { // no window is recent: start afresh
			s.freed, s.freedAt = [len(s.freed)]int{}, now
			return
		}
		s.freedIdx = (s.freedIdx + 1) % len(s.freed)
		s.freed[s.freedIdx] = 0
		s.freedAt = s.freedAt.Add(keyedHorizon)
	}
}

// slotFreedLocked counts a running slot freed by a step that returned.
// The caller holds s.mu.
func (s *Feeder) slotFreedLocked() {
	now := time.Now()
	s.rollFreedLocked(now)
	s.freed[s.freedIdx]++
	s.lastFreed = now
	if s.keyedShut || s.keyedStuck {
		s.more = true // room for a keyed row the last pick left
	}
	s.keyedStuck = false
}

// ratedWakeAt is when a pick begun at start that passed over rated keys
// out of starts (rated: their counts per policy, as PickResult.KeysRated)
// should be followed by another: once the quickest of their policies'
// rates has given a start — a key the pick found with less than one
// start has one by then — and no sooner than the busy poll. Zero if it
// passed over none. Without it the next pick came with the poll, whose
// idle backoff left a rated key's backlog 25–50 % below its rate on an
// idle worker (a flow-control probe; docs/design.md §6).
func (s *Feeder) ratedWakeAt(start time.Time, rated []int32) time.Time {
	var every time.Duration
	for i, n := range rated {
		if n <= 0 || i == 0 || i > len(s.cfg.KeyPolicies) || s.cfg.KeyPolicies[i-1].Rate <= 0 {
			continue
		}
		secs := 1 / s.cfg.KeyPolicies[i-1].Rate
		if secs > maxRatedWake.Seconds() {
			continue // too far off to be worth a timer: the poll comes first
		}
		if d := time.Duration(secs * float64(time.Second)); every == 0 || d < every {
			every = d
		}
	}
	if every == 0 {
		return time.Time{}
	}
	return start.Add(max(every, s.busyPoll()))
}

// maxRatedWake: a rate slower than one start in this long is left to the
// poll (its idle backoff tops out at MaxPollInterval, 5 s by default).
const maxRatedWake = time.Minute

// busyPoll is the poll interval after a pick that found rows.
func (s *Feeder) busyPoll() time.Duration {
	if s.cfg.BusyPollInterval > 0 {
		return s.cfg.BusyPollInterval
	}
	return s.cfg.PollInterval
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

func (s *Feeder) inFlightNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}

func (s *Feeder) bufferedNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buffer)
}

// pick claims up to demand rows into the buffer. The statement is not
// cancelled by stopCtx: a pick cancelled after the server committed it would
// leave rows executing under tokens nobody holds, until the reaper takes
// them back. Rows claimed as the feeder stops are released by Run. Only
// Abort (a Stop out of time) cancels it.
//
// walk false: the pick claims no keyed row (nor looks at any key), because
// the last walk found every key full and nothing since says one may not be
// (keysWalkDueLocked); the keyed room and what the last walk left
// (keyedShut, keyedFull) are kept as they were.
func (s *Feeder) pick(stopCtx context.Context, demand, keyed int, walk bool) (int, error) {
	ctx, cancel := context.WithTimeout(s.abortCtx, s.cfg.Lease)
	defer cancel()
	s.floorTick(stopCtx)
	start := time.Now()
	opts := sqlq.PickOpts{Limit: demand, Lease: s.cfg.Lease, Cursor: s.keyCursor, Policies: s.cfg.KeyPolicies, Global: s.cfg.Global,
		Floor: s.floor, Prios: s.prios}
	if !walk {
		opts.Keyed = -1 // none
	} else if keyed < demand {
		opts.Keyed = keyed
		if keyed == 0 {
			opts.Keyed = -1 // none
		}
	}
	res, err := s.q.Pick(ctx, s.db, s.cfg.Queue, opts)
	rows := res.Claimed
	if err == nil {
		s.keyCursor = res.Cursor
		s.picked(res)
		got := 0
		for _, c := range rows {
			if c.PartitionKey != nil {
				got++
			}
		}
		if at := s.ratedWakeAt(start, res.KeysRated); !at.IsZero() {
			s.mu.Lock()
			if s.rateWake.IsZero() || at.Before(s.rateWake) {
				s.rateWake = at
			}
			s.mu.Unlock()
		}
		if walk {
			full := keyed > 0 && s.cfg.Global == 0 && keysAllFull(opts, res, len(rows), got)
			s.mu.Lock()
			s.keyedShut = keyed < demand && got >= keyed
			s.keyedFull = s.keyedShut && keyed > 0
			switch {
			case full:
				s.keysFullAt = start
				s.keysRecheck = keysRecheckAfter(time.Since(start), s.busyPoll(), s.cfg.PollInterval)
			case keyed > 0: // a walk that found room, or was not round every key
				s.keysFullAt = time.Time{}
			}
			s.mu.Unlock()
		}
	}
	s.ev.Pick(PickReport{Queue: s.cfg.Queue, Count: len(rows), Demand: demand, Duration: time.Since(start), Err: err,
		KeysFull: res.KeysFull, KeysRated: res.KeysRated})
	if err != nil {
		s.log.Warn("gendurable: pick failed", append([]any{"queue", s.cfg.Queue}, sqlq.ErrAttrs(err)...)...)
		return 0, err
	}
	s.add(rows, start)
	return len(rows), nil
}

// floorTick runs before each pick (docs/design.md §4). It lowers the floor
// to what a floor check found, and once per FloorCheck (or floorCheckDuty
// times the last check's duration, if that is longer) it either starts a
// check — the queue claimed rows since the last tick: a row may have become
// visible below the floor meanwhile — or, when the queue claimed nothing,
// drops the floor: the next pick looks at every row (an idle queue adds no
// statement) and sets the floor again.
func (s *Feeder) floorTick(stopCtx context.Context) {
	if s.cfg.FloorCheck < 0 {
		s.floor = nil
		return
	}
	s.mu.Lock()
	found := s.floorFound
	s.floorFound = nil
	took := s.checkTook
	s.mu.Unlock()
	if found != nil && s.floor != nil && found.Before(*s.floor) {
		s.floor = found
	}
	now := time.Now()
	if s.floor == nil || !floorCheckDue(now, s.floorTicked, took, s.cfg.FloorCheck) {
		return
	}
	s.mu.Lock()
	if s.checking {
		// The last check is still running: this tick waits for it rather
		// than being spent, so the next pick after it ticks at once.
		s.mu.Unlock()
		return
	}
	s.floorTicked = now
	if !s.claimedSince {
		s.mu.Unlock()
		s.floor = nil
		return
	}
	s.claimedSince = false
	s.checking = true
	s.mu.Unlock()
	s.checks.Add(1)
	go s.checkFloor(stopCtx, *s.floor)
}

// checkFloor looks for runnable plain rows below floor, off the pick path,
// and hands the earliest one's eligible_at to the next pick (waking it).
func (s *Feeder) checkFloor(stopCtx context.Context, floor time.Time) {
	defer s.checks.Done()
	ctx, cancel := context.WithTimeout(stopCtx, s.cfg.Lease)
	defer cancel()
	start := time.Now()
	at, err := s.q.PickFloorCheck(ctx, s.db, s.cfg.Queue, floor)
	took := time.Since(start)
	if err != nil {
		if stopCtx.Err() == nil {
			s.log.Warn("gendurable: pick floor check failed", append([]any{"queue", s.cfg.Queue}, sqlq.ErrAttrs(err)...)...)
		}
		at = &time.Time{} // unknown: the next pick looks at every row
	}
	s.mu.Lock()
	s.checking = false
	if err == nil {
		// A failed check found nothing to space by: its caller looks at
		// every row on the next pick instead.
		s.checkTook = took
	}
	if at != nil && (s.floorFound == nil || at.Before(*s.floorFound)) {
		s.floorFound = at
		s.more = true
	}
	s.mu.Unlock()
	if at != nil {
		s.wake()
	}
}

// picked notes what a pick tells the floor: the next floor, whether rows
// were claimed, and at which priorities.
func (s *Feeder) picked(res sqlq.PickResult) {
	if s.cfg.FloorCheck < 0 {
		return
	}
	s.floor = res.Floor
	if s.floor != nil && s.floorTicked.IsZero() {
		s.floorTicked = time.Now() // the first floor: checks start one FloorCheck from now
	}
	for _, c := range res.Claimed {
		s.claimedSince = true
		if c.PartitionKey != nil || (len(s.prios) > 0 && s.prios[0] == c.Priority) {
			continue
		}
		i := slices.Index(s.prios, c.Priority)
		if i < 0 {
			if len(s.prios) < maxFloorPrios {
				s.prios = append(s.prios, 0)
			}
			i = len(s.prios) - 1
		}
		copy(s.prios[1:i+1], s.prios[:i])
		s.prios[0] = c.Priority
	}
}

// pace is this process's own token bucket of a rated key (see paceLocked),
// with the rate and burst of the key's policy.
type pace struct {
	tokens, rate, burst float64
	at                  time.Time
}

// level is p's tokens at now, refilled.
func (p *pace) level(now time.Time) float64 {
	return min(p.burst, p.tokens+max(now.Sub(p.at).Seconds(), 0)*p.rate)
}

// maxPaced bounds the rated keys paceLocked tracks; past it, keys whose
// bucket has refilled (as good as untracked) are dropped, and if none has,
// the fullest one.
const maxPaced = 1024

// paceLocked takes a start of key from this process's bucket of it, as the
// key's policy sets it (Config.KeyRate): Rate, up to Burst.
// It returns 0 if the start may go ahead (always, for a key with no rate),
// or how long until it may. The pick draws the same bucket in the database
// for each row it claims, so claims stay within it across processes; a
// row waits for its start behind busy slots, and rows claimed over a while
// would otherwise start at once when the slots free — starts in this
// process stay within it too (docs/design.md §6,
// TestRatedRowsPrefetchedBehindBusySlotsDoNotStartTogether). The caller holds s.mu.
func (s *Feeder) paceLocked(key string, now time.Time) time.Duration {
	if s.cfg.KeyRate == nil {
		return 0
	}
	rate, burst := s.cfg.KeyRate(key)
	if rate <= 0 {
		return 0
	}
	if s.paced == nil {
		s.paced = map[string]*pace{}
	}
	p := s.paced[key]
	if p == nil {
		if len(s.paced) >= maxPaced {
			fullest, most := "", -1.0
			for k, q := range s.paced {
				switch l := q.level(now); {
				case l >= q.burst:
					delete(s.paced, k)
				case l/q.burst > most:
					fullest, most = k, l/q.burst
				}
			}
			if len(s.paced) >= maxPaced {
				delete(s.paced, fullest)
			}
		}
		b := float64(max(burst, 1))
		p = &pace{tokens: b, rate: rate, burst: b, at: now}
		s.paced[key] = p
	}
	p.tokens, p.at = p.level(now), now
	if p.tokens >= 1 {
		p.tokens--
		return 0
	}
	return max(time.Duration((1-p.tokens)/p.rate*float64(time.Second)), time.Nanosecond)
}

// add buffers rows claimed by a pick that was sent at start: their leases
// began after it, so their deadlines count from it. A pick that comes back
// late (the process was stopped while it was in flight) brings claims whose
// deadline may have passed: dispatch never starts them, and the timer gives
// them up at once.
func (s *Feeder) add(rows []sqlq.Claimed, start time.Time) {
	if len(rows) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var back unstarted
	var levels map[string]int // keyLevelsLocked, and the keyed claims buffered since
	for i := range rows {
		if rows[i].PartitionKey != nil {
			levels = s.keyLevelsLocked()
			break
		}
	}
	for i := range rows {
		c := &rows[i]
		if s.cancelledSinceLocked(c.ID, start) {
			// Cancelled while the pick was in flight: handed back, fenced
			// by its token (a claim the cancel overtook changes nothing).
			back.add(c.ID, c.Token)
			continue
		}
		c.Buffered = now
		h := &held{id: c.ID, deadline: start.Add(s.cfg.Lease), key: c.PartitionKey}
		s.held[c.Token] = h
		// In dispatchOrder: a plain claim goes last, a keyed one ahead of
		// the plain claims taken within the last keyedHorizon — or first,
		// claimed by the floor (keyedRoomLocked).
		at := len(s.buffer)
		for at > 0 && dispatchOrder(&s.buffer[at-1]).After(dispatchOrder(c)) {
			at--
		}
		if c.PartitionKey != nil {
			levels[*c.PartitionKey]++
		}
		if c.PartitionKey != nil && s.keyedFirst {
			// Ahead of the plain claims no such claim has passed before,
			// and they are passed: each waits behind one at most (a
			// review: every pick of a hot key went ahead of the same
			// plain claims, held 5–12 s with another engine idle).
			s.keyedFirst = false
			at = 0
			for at < len(s.buffer) && s.held[s.buffer[at].Token] != nil && s.held[s.buffer[at].Token].passed {
				at++
			}
			for _, b := range s.buffer[at:] {
				if h := s.held[b.Token]; h != nil && b.PartitionKey == nil {
					h.passed = true
				}
			}
		} else if c.PartitionKey != nil {
			h.level = levels[*c.PartitionKey]
			at = s.fairAtLocked(at, c, h.level, now)
		}
		s.buffer = slices.Insert(s.buffer, at, *c)
	}
	if len(back.ids) > 0 {
		s.goGiveBackLocked(back)
	}
	s.armLocked(start.Add(s.cfg.Lease))
}

// keyLevelsLocked counts this feeder's claims of each key — running,
// committing or buffered — before the claims add is buffering now. The
// caller holds s.mu.
func (s *Feeder) keyLevelsLocked() map[string]int {
	levels := map[string]int{}
	for _, h := range s.held {
		if h.key != nil {
			levels[*h.key]++
		}
	}
	return levels
}

// fairAtLocked is where in the buffer a keyed claim c of level goes, at or
// before at (its place by dispatchOrder): ahead of the keyed claims of other
// keys buffered at a higher level, within a horizon. So the buffer is shared
// between keys as the pick shares its batch (docs/design.md §6, "Fairness"):
// a tenant whose rows fill every running slot and the buffer behind them
// does not keep another tenant's claims waiting behind its own (before, a
// second tenant's claims waited for the whole buffer: the keys bench's
// fairness phase). It passes no claim of its own key (a key's buffered
// claims keep the order they were claimed in), no plain claim (their order is
// dispatchOrder's and keyedFirst's), no claim buffered keyedHorizon ago or
// more (MayHandOff judges by the head claim's wait; a claim waits at most
// about that long for being passed), and no claim with no level (the
// floor's head claim). The caller holds s.mu.
func (s *Feeder) fairAtLocked(at int, c *sqlq.Claimed, level int, now time.Time) int {
	for at > 0 {
		b := &s.buffer[at-1]
		h := s.held[b.Token]
		if b.PartitionKey == nil || *b.PartitionKey == *c.PartitionKey || h == nil || h.level <= level ||
			now.Sub(b.Buffered) >= keyedHorizon {
			break
		}
		at--
	}
	return at
}

// dispatch starts buffered rows into free running slots.
func (s *Feeder) dispatch(workCtx context.Context) {
	s.mu.Lock()
	s.handBackStrandedLocked() // rows a pick in flight added after the last slot was abandoned
	if len(s.buffer) > 0 && time.Since(s.lastBeat) > s.cfg.Lease-s.cfg.HeartbeatInterval {
		// No heartbeat has confirmed the claims for most of a lease (the
		// process was paused — SIGSTOP, a suspended VM — or the database
		// is slow): buffered rows may have been reaped and run elsewhere
		// meanwhile. Start none until a heartbeat has sorted them out.
		s.heldBack = true
		s.mu.Unlock()
		return
	}
	var lost []lostClaim
	var back unstarted
	free := s.cfg.Concurrency - s.inFlight
	now := time.Now()
	kept := s.buffer[:0] // filtered in place: kept never passes the read index
	unmark := false
	for i, c := range s.buffer {
		if free <= 0 {
			for _, c := range s.buffer[i:] {
				if s.keyedOverdueLocked(c, now) {
					// Its worker's slots are stuck: its key goes back to
					// the other workers, and no keyed row is claimed
					// ahead of a free slot until a step returns.
					delete(s.held, c.Token)
					back.add(c.ID, c.Token)
					s.keyedStuck = true
					continue
				}
				kept = append(kept, c)
			}
			break
		}
		h := s.held[c.Token]
		if h == nil {
			continue // its lease was lost while buffered
		}
		if !h.deadline.After(now) {
			// Its lease may have run out (the process was stopped while
			// its pick was in flight): give it up here, as the timer would
			// — not left held, where a heartbeat that ran before the timer
			// would extend it, out of the buffer, for as long as the
			// process lives.
			delete(s.held, c.Token)
			lost = append(lost, lostClaim{h.id, false})
			back.add(h.id, c.Token)
			continue
		}
		if h.deadline.Sub(now) < s.cfg.Lease/2 {
			// Less than half its lease is left: heartbeats have not
			// confirmed it for a while (the database is slow or was
			// unreachable, or another session held its row when the last
			// one ran). Its step would start only to be cancelled soon —
			// or, on a database that is just coming back, send its first
			// statement in time and have it run after the lease ran out.
			// It waits for a heartbeat to extend it (or give it up); the
			// rows behind it may start meanwhile.
			s.heldBack = true
			kept = append(kept, c)
			continue
		}
		if c.PartitionKey != nil && !h.paced {
			if wait := s.paceLocked(*c.PartitionKey, now); wait > 0 {
				// A rated key whose starts in this process would outrun
				// its bucket (rows claimed a token at a time while every
				// slot was busy): it waits for the next start the rate
				// allows, keeping its not-started mark and taking no slot;
				// the rows behind it may start meanwhile. The wake only
				// dispatches (Run): it is no reason to pick.
				kept = append(kept, c)
				if at := now.Add(wait); s.paceWake.IsZero() || at.Before(s.paceWake) {
					s.paceWake = at
				}
				continue
			}
			h.paced = true // its start is taken: an unmark below does not take another
		}
		if h.marked {
			// A heartbeat marked it not started: the mark is cleared
			// first (clearMarks), and its slot waits for it meanwhile, so
			// the buffer keeps its order.
			free--
			kept = append(kept, c)
			if !h.unmarking {
				h.unmarking, unmark = true, true
			}
			continue
		}
		ctx, cancel := context.WithCancelCause(workCtx)
		h.running, h.cancel = true, cancel
		s.inFlight++
		free--
		s.steps.Add(1)
		s.pending.Add(1)
		s.work <- stepJob{ctx: ctx, cancel: cancel, c: c} // never blocks: one place per slot
	}
	clear(s.buffer[len(kept):])
	s.buffer = kept
	if len(s.buffer) == 0 {
		s.buffer = nil // let a drained buffer's backing array go
	}
	// No re-arm for the claims given up here: the timer is armed no later
	// than their deadlines, already passed, and expire re-arms it.
	s.mu.Unlock()
	s.gaveUp(lost, back)
	if unmark {
		s.requestClear()
	}
}

// stepJob is one buffered row handed to a worker.
type stepJob struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	c      sqlq.Claimed
}

func (s *Feeder) worker() {
	for j := range s.work {
		s.runClaim(j.ctx, j.cancel, j.c)
	}
}

func (s *Feeder) runClaim(ctx context.Context, cancel context.CancelCauseFunc, c sqlq.Claimed) {
	if !s.startable(c.Token) {
		// The process was stopped (or starved) between dispatch and here:
		// the claim's lease may have run out on the database clock, and the
		// row been reaped and run elsewhere. Its step must not start; if
		// the claim is still the row's, the row goes back unstarted.
		cancel(ErrLeaseLost)
		if !s.stopping.Load() { // Stop does not wait for a statement of a step that never started
			s.giveBack(unstarted{ids: []int64{c.ID}, tokens: []int64{c.Token}})
		}
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
		s.stepDone()
		s.wake()
		return
	}
	h := &holder{s: s, token: c.Token}
	res := s.exec(ctx, &c, h)
	cancel(nil)
	s.mu.Lock()
	s.inFlight--
	s.slotFreedLocked()
	h.returned = true // from here on, Abandon is a no-op
	if h.abandoned {  // Abandon settled the claim and the WaitGroup
		s.abandoned--
		s.more = true // a slot again, if every one was abandoned (demandLocked)
		delete(s.held, h.token)
		s.mu.Unlock()
		s.wake()
		return
	}
	if h.detached {
		s.committing++ // finish settles the claim and the WaitGroup
		s.mu.Unlock()
		s.wake()
		return
	}
	delete(s.held, h.token)
	if res.RunnableNow || res.KeyFreed {
		s.more = true
	}
	if res.KeyFreed {
		s.keyNews = true
	}
	s.mu.Unlock()
	s.stepDone()
	s.wake()
}

// startable reports whether a dispatched claim may start its step: it is
// still held and its deadline has not passed. A claim past its deadline is
// given up here, as expire would (reported as a lost lease); one no longer
// held was given up by expire already.
func (s *Feeder) startable(token int64) bool {
	s.mu.Lock()
	h := s.held[token]
	if h == nil {
		s.mu.Unlock()
		return false
	}
	if h.deadline.After(time.Now()) {
		h.started = true
		s.mu.Unlock()
		return true
	}
	l := s.loseLocked(token, h) // the timer re-arms when it fires, as in dispatch
	s.mu.Unlock()
	s.ev.LeaseLost(s.cfg.Queue, l.id, l.started)
	return false
}

// releaseBuffer hands the claimed-but-unstarted rows back to runnable.
func (s *Feeder) releaseBuffer() {
	s.mu.Lock()
	ids := make([]int64, 0, len(s.buffer))
	tokens := make([]int64, 0, len(s.buffer))
	for _, c := range s.buffer {
		if s.held[c.Token] != nil {
			ids = append(ids, c.ID)
			tokens = append(tokens, c.Token)
			delete(s.held, c.Token)
		}
	}
	s.buffer = nil
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.abortCtx, 10*time.Second)
	defer cancel()
	released, err := s.release(ctx, ids, tokens)
	s.mu.Lock()
	s.released = len(released)
	if err != nil {
		s.releaseFailed, s.releaseErr = len(ids), err
	}
	s.mu.Unlock()
	s.ev.Released(s.cfg.Queue, len(released), err)
	if err != nil {
		s.log.Warn("gendurable: releasing prefetched rows failed; the reaper will recover them",
			"queue", s.cfg.Queue, "rows", len(ids), "err", err)
	}
}

// release hands claims back (Release), trying again, up to eight times in
// all, 50 ms apart, when the statement failed on its connection (the pool's
// sessions terminated, the server restarting): each failure takes a dead
// connection out of the pool, which dials a fresh one in the end, and the
// rows need not wait out their lease
// (TestStopHandsBackPrefetchedRowsAfterItsSessionsWereTerminated).
func (s *Feeder) release(ctx context.Context, ids, tokens []int64) ([]int64, error) {
	for try := 1; ; try++ {
		released, err := s.q.Release(ctx, s.db, ids, tokens, 0)
		if err == nil || try == 8 || !sqlq.ConnectionFailure(err) {
			return released, err
		}
		select {
		case <-ctx.Done():
			return released, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ReleaseFailed reports the prefetched rows Run could not hand back when it
// stopped, and why (nil: none).
func (s *Feeder) ReleaseFailed() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseFailed, s.releaseErr
}

// ReleasedOnStop is the number of prefetched rows Run handed back when it stopped.
func (s *Feeder) ReleasedOnStop() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// InFlight reports the number of running steps.
func (s *Feeder) InFlight() int { return s.inFlightNow() }

// Abandoned reports the number of abandoned steps still running.
func (s *Feeder) Abandoned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned
}

// stepDone settles one started step in steps and pending.
func (s *Feeder) stepDone() {
	s.pending.Add(-1)
	s.steps.Done()
}

// Wait blocks until every started step has returned or ctx is done; it
// reports whether all steps returned. With none running it returns true,
// even if ctx is done.
func (s *Feeder) Wait(ctx context.Context) bool {
	if s.pending.Load() == 0 {
		return true
	}
	done := make(chan struct{})
	go func() { s.steps.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return s.pending.Load() == 0
	}
}

// Heartbeat extends every held lease once per HeartbeatInterval until ctx
// is done. A held row the database no longer shows as ours is dropped from
// the buffer or, if running, has its step context cancelled with
// ErrLeaseLost: it is a zombie whose outcome the fence will reject anyway.
func (s *Feeder) Heartbeat(ctx context.Context) {
	s.mu.Lock()
	s.confirmed(time.Now())
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.timerOff = true
		s.deadline.Stop()
		s.mu.Unlock()
	}()
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	var retry *time.Timer // a clear that left claims marked tries again
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	failures := 0
	clear := func() {
		if s.clearMarks(ctx) {
			failures = 0
			return
		}
		// Failed, or rows locked by someone else: again soon, backing off
		// up to a heartbeat interval.
		failures++
		d := backoff.Exp(20*time.Millisecond, s.cfg.HeartbeatInterval, failures)
		if retry == nil {
			retry = time.AfterFunc(d, s.requestClear)
		} else {
			retry.Reset(d)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.unmark:
			// A heartbeat already due runs before this clear; a clear in
			// flight (at most half a heartbeat interval) can still delay
			// the next one by that much.
			select {
			case <-t.C:
				s.expire()
				s.heartbeatOnce(ctx)
			default:
			}
			clear()
			continue
		case <-t.C:
		}
		// A process that was stopped past its leases gives them up before
		// it asks the database to extend them (the deadline timer may not
		// have run yet).
		s.expire()
		s.heartbeatOnce(ctx)
	}
}

// requestClear asks the heartbeat goroutine to run clearMarks.
func (s *Feeder) requestClear() {
	select {
	case s.unmark <- struct{}{}:
	default:
	}
}

// clearMarks clears, in the database, the marks of the buffered claims
// dispatch wants to start (held.unmarking), then lets dispatch start them.
// A claim the statement finds no longer ours is given up. It reports false
// if claims are left marked (the statement failed, or another transaction
// held their rows): the caller tries again.
func (s *Feeder) clearMarks(ctx context.Context) bool {
	s.mu.Lock()
	var ids, tokens []int64
	for token, h := range s.held {
		if h.unmarking && h.marked {
			ids, tokens = append(ids, h.id), append(tokens, token)
		}
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return true
	}
	// It cannot wait on a lock (see sqlq.ClearUnstarted): a slow answer is
	// a slow database, and a heartbeat may be due behind it. Half a
	// heartbeat interval, but not under an eighth of the lease (at most
	// 200 ms): with a heartbeat of a few milliseconds, a loaded database
	// answered none in time, and the claims never started
	// (TestNoFalseLeaseLossWhileOutcomesCommit under the full suite).
	cctx, cancel := context.WithTimeout(ctx, clearTimeout(s.cfg.HeartbeatInterval, s.cfg.Lease))
	sent := time.Now()
	held, err := s.q.ClearUnstarted(cctx, s.db, ids, tokens, s.cfg.Lease)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("gendurable: clearing the not-started marks of prefetched claims failed; they start once it succeeds",
				"queue", s.cfg.Queue, "claims", len(ids), "err", err)
		}
		return ctx.Err() != nil
	}
	done := true
	s.mu.Lock()
	var lost []lostClaim
	for _, token := range tokens {
		h := s.held[token]
		if h == nil || !h.unmarking {
			continue
		}
		cleared, ok := held[token]
		switch {
		case !ok:
			// Not executing under this token any more: reaped, or
			// finished by an operator.
			lost = append(lost, s.loseLocked(token, h))
		case cleared:
			h.marked, h.unmarking = false, false
			// The clear extended the lease by a whole one from when it
			// wrote the row, which is after it was sent.
			if d := sent.Add(s.cfg.Lease); d.After(h.deadline) {
				h.deadline = d
			}
		default:
			done = false // locked by someone else, or its lease ran out: again soon
		}
	}
	s.rearmLocked()
	s.mu.Unlock()
	for _, l := range lost {
		s.ev.LeaseLost(s.cfg.Queue, l.id, l.started)
	}
	s.wake()
	return done
}

// clearTimeout bounds one statement clearing not-started marks (clearMarks).
func clearTimeout(heartbeat, lease time.Duration) time.Duration {
	return max(heartbeat/2, min(lease/8, 200*time.Millisecond))
}

func (s *Feeder) heartbeatOnce(ctx context.Context) {
	s.mu.Lock()
	s.pruneCancelledLocked(time.Now())
	if len(s.held) == 0 {
		s.confirmed(time.Now())
		s.mu.Unlock()
		return
	}
	ids := make([]int64, 0, len(s.held))
	tokens := make([]int64, 0, len(s.held))
	// Whether each claim's step has started: a claim sent as not started
	// is marked so in the database, and if this process dies before it
	// starts the reaper charges it no attempt (docs/design.md §4,
	// "Prefetched claims"). Such a claim starts only once its mark is
	// cleared again (clearMarks, run by this goroutine: never beside this
	// statement). One dispatch wants to start is sent as starting: its
	// mark is cleared, and it reads as a claim no heartbeat confirmed.
	states := make([]sqlq.ClaimState, 0, len(s.held))
	for token, h := range s.held {
		ids = append(ids, h.id)
		tokens = append(tokens, token)
		st := sqlq.NotStarted
		switch {
		case h.running || h.committing:
			st = sqlq.Started
		case h.unmarking:
			st = sqlq.Starting
		default:
			h.marked = true
		}
		states = append(states, st)
	}
	// A slow heartbeat (a busy database, a pool queue) still counts if it
	// lands before the leases it extends lapse: give it half the time left
	// rather than cancel it after one interval and lose its place in the
	// queue — and keep the other half for a retry on a fresh connection, in
	// case this one hangs (a half-open connection after a failover).
	timeout := max(s.cfg.HeartbeatInterval, time.Until(s.lastBeat.Add(s.cfg.Lease))/2)
	s.mu.Unlock()

	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, timeout)
	kept, err := s.q.Heartbeat(hctx, s.db, ids, tokens, states, s.cfg.Lease, s.cfg.Global > 0)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.ev.HeartbeatFailed(s.cfg.Queue, err)
			s.expire()
		}
		return
	}
	// What is left of each kept lease, on the database clock when the
	// statement looked, counts from start, which is no later.
	byID := make(map[int64]sqlq.Kept, len(kept))
	for _, k := range kept {
		byID[k.ID] = k
	}
	cleared := false
	// The statement reports ids, but this feeder may hold one instance under
	// two tokens: a zombie whose lease was reaped, and the claim it picked
	// again since. A row has one token, and tokens only grow: only the
	// newest of them can be the one the id was kept for.
	newest := make(map[int64]int64, len(ids))
	for i, id := range ids {
		newest[id] = max(newest[id], tokens[i])
	}
	s.mu.Lock()
	s.confirmed(start)
	resume := s.heldBack
	s.heldBack = false
	var lost []lostClaim
	for i, token := range tokens {
		h := s.held[token]
		if k, ok := byID[ids[i]]; ok && newest[ids[i]] == token && h != nil {
			// Extended, or held but locked by someone else and not
			// extended (k.Left says how long it still is ours).
			h.deadline = start.Add(k.Left)
			if states[i] != sqlq.NotStarted && h.unmarking && k.Extended {
				// Sent as started (dispatch was waiting to start it when
				// the statement was built): the statement cleared its mark.
				h.marked, h.unmarking = false, false
				cleared = true
			}
			continue
		}
		if h == nil || h.committing {
			// Finished meanwhile; or its outcome is being written and may
			// just have committed: its fence settles it.
			continue
		}
		// Gone: stop heartbeating it; cancel its step, or drop it from the buffer.
		lost = append(lost, s.loseLocked(token, h))
	}
	s.rearmLocked()
	s.mu.Unlock()
	for _, l := range lost {
		s.ev.LeaseLost(s.cfg.Queue, l.id, l.started)
	}
	if resume || cleared {
		s.wake() // dispatch the buffered claims that are still ours
	}
}

// holder tracks the claim token a running step currently holds.
type holder struct {
	s         *Feeder
	token     int64 // guarded by s.mu
	detached  bool  // set by the step's own goroutine before it returns
	abandoned bool  // guarded by s.mu
	returned  bool  // the executor returned; guarded by s.mu
}

func (h *holder) Continue(oldToken, newToken int64) bool {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	e := h.s.held[oldToken]
	if e == nil || oldToken != h.token {
		return false
	}
	// The outcome statement gave the row a fresh lease; it was sent after
	// committingAt. An answer that comes back past that lease's deadline,
	// or past the old claim's (the process was stopped while the statement
	// was in flight, and woke with the answer waiting before the timer ran),
	// is not acted on: the new lease may have run out on the database clock,
	// the row been reaped and run elsewhere — for a keyed row, its key taken
	// by its next row — and for a row of a queue with a GlobalConcurrency
	// the statement may have re-claimed it after its lease ran out, when
	// its place could be another step's. The timer gives the claim up.
	now := time.Now()
	deadline := e.committingAt.Add(h.s.cfg.Lease)
	if !deadline.After(now) || !e.deadline.After(now) || h.s.cancelledSinceLocked(e.id, e.committingAt) {
		return false
	}
	delete(h.s.held, oldToken)
	e.committing = false // the next step runs
	e.deadline = deadline
	h.s.held[newToken] = e
	h.token = newToken
	// A heartbeat confirmed while the outcome was in flight may have
	// armed the timer past this deadline.
	h.s.armLocked(e.deadline)
	return true
}

func (h *holder) Committing() {
	h.s.mu.Lock()
	if e := h.s.held[h.token]; e != nil {
		e.committing, e.committingAt = true, time.Now()
	}
	h.s.mu.Unlock()
}

func (h *holder) Stopping() bool { return h.s.stopping.Load() }

func (h *holder) MayHandOff() bool {
	s := h.s
	if s.stopping.Load() || !s.short.Load() {
		return false
	}
	// A hand-off keeps the claims this feeder holds as they are: it must
	// not keep the feeder below MinDemand free places, where it would not
	// pick for other keys' rows (see Run).
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buffer) > 0 && time.Since(s.buffer[0].Buffered) > keyedHorizon {
		// The slot is the next buffered claim's, which has waited a horizon
		// already: a chain of hand-offs would keep it waiting for as long
		// as the key has rows (a review: three plain claims started after
		// a key's 8 rows, 12–15 s after they were claimed).
		return false
	}
	if s.keyedShut && !s.keyedFull && s.freedLocked(time.Now())/len(s.freed) == 0 {
		// The last pick was allowed no keyed row, so it did not look at
		// other keys' rows — and with steps this slow (fewer than one
		// returning per horizon) no pick ever would while the chain keeps
		// the slot: another key's row waited for the whole backlog (a
		// probe: behind five 3 s steps of one key, on one slot). The slot
		// frees instead, and the pick that follows visits the keys in
		// turn; one pick per step of a second or more is cheap.
		return false
	}
	return s.demandLocked() >= s.cfg.MinDemand
}

func (h *holder) HandOff(oldToken int64, next *sqlq.Claimed) bool {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held[oldToken]
	if e == nil || oldToken != h.token || s.stopping.Load() {
		return false
	}
	// The outcome statement gave next its lease; it was sent after
	// committingAt.
	deadline := e.committingAt.Add(s.cfg.Lease)
	if !deadline.After(time.Now()) || s.cancelledSinceLocked(next.ID, e.committingAt) {
		return false
	}
	delete(s.held, oldToken)
	e.id, e.committing, e.deadline, e.key = next.ID, false, deadline, next.PartitionKey
	s.held[next.Token] = e
	h.token = next.Token
	s.armLocked(deadline) // as in Continue
	// The slot turned over: counted as freed (and taken again), so that a
	// worker whose slots run chains of hand-offs still claims other keys'
	// rows (keyedRoomLocked) — and once one has waited a second, the
	// chain stops for it (MayHandOff). Not counting them, a new key's row
	// waited for as long as the chains had rows (a review: 4–6 s behind two
	// keys of 600 rows of 10 ms on two slots).
	s.slotFreedLocked()
	return true
}

func (h *holder) Begin(ctx context.Context) bool {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return !errors.Is(context.Cause(ctx), ErrInstanceCancelled)
}

func (h *holder) Abandon() (int, bool) {
	s := h.s
	s.mu.Lock()
	if h.returned {
		s.mu.Unlock()
		return s.Abandoned(), false
	}
	h.abandoned = true
	s.abandoned++
	delete(s.held, h.token)
	n := s.abandoned
	s.handBackStrandedLocked()
	s.mu.Unlock()
	s.stepDone()
	return n, true
}

// handBackStrandedLocked hands the buffered claims back when abandoned
// steps hold every slot: no slot may free for them (an abandoned step keeps
// its slot until it returns, which a step that ignores its context may
// never do), while another process could run them now — the abandoned
// step's own retry among them. demandLocked claims no more meanwhile; a
// pick already in flight when the last slot was abandoned adds its rows
// after, and dispatch hands those back. Once the feeder is stopping the
// buffer is left to Run's releaseBuffer (the hand-back is registered under
// s.mu, which Run takes to set stopping, so one of the two has the rows).
// The caller holds s.mu.
func (s *Feeder) handBackStrandedLocked() {
	if s.abandoned < s.cfg.Concurrency || len(s.buffer) == 0 || s.stopping.Load() {
		return
	}
	var back unstarted
	for _, c := range s.buffer {
		if s.held[c.Token] != nil {
			back.add(c.ID, c.Token)
			delete(s.held, c.Token)
		}
	}
	s.buffer = nil
	if len(back.ids) > 0 {
		s.goGiveBackLocked(back)
	}
}

func (h *holder) Detach() func(Result) {
	h.detached = true
	h.Committing()
	return func(res Result) {
		s := h.s
		s.mu.Lock()
		s.committing--
		delete(s.held, h.token)
		if res.RunnableNow || res.KeyFreed {
			s.more = true
		}
		if res.KeyFreed {
			s.keyNews = true
		}
		s.mu.Unlock()
		s.stepDone()
		s.wake()
	}
}
