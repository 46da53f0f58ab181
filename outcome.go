package gendurable

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// Outcome is what a step decided. Build one with the methods of [Run]
// ([Run.Next], [Run.Replay]) or with [Done] and [Stop]; the zero Outcome is
// invalid. The engine validates an outcome before any SQL runs and applies it
// in one statement, fenced by the step's claim token.
type Outcome struct {
	kind     sqlq.Kind
	step     string
	state    any  // the machine's state value (S), encoded by the engine
	hasState bool // Next and Replay carry a state
	delay    time.Duration
	result   any
	reason   string
	snooze   bool // replay without counting an attempt (jobs)
	// snoozeErr: a job's honoured JobSnooze, reported to the hooks as
	// the step's error (StepEvent.Err, Snoozed), as a machine step's is.
	snoozeErr error
	final     bool // a job's Done: a result the engine cannot store stops the instance (Job.PerformResult)
	awaits    []string
	timeout   time.Duration
	children  []InsertParams
	txFn      func(ctx context.Context, tx pgx.Tx) error
}

// Kind names the outcome: "next", "replay", "done", "stop", "await",
// "children", or "none" for the zero Outcome.
func (o Outcome) Kind() string { return o.kind.String() }

// After returns a copy of a Next outcome that becomes runnable only after d —
// a durable sleep: the instance sleeps in the database, not in a process, so a
// restart or a crash does not shorten or lose it. On other outcomes it has no
// effect except on Replay, where it replaces the replay delay.
func (o Outcome) After(d time.Duration) Outcome {
	if o.kind == sqlq.KindNext || o.kind == sqlq.KindReplay {
		o.delay = d
	}
	return o
}

// Timeout returns a copy of an Await outcome with a deadline: if no awaited
// signal arrives within d, the instance becomes runnable at its next step
// anyway, with an empty Awaited view (that is how the step tells it timed
// out). A d of 0 means no deadline, as a zero StepTimeout means none: the
// await waits as long as it takes. A negative d is an [ErrInvalidOutcome]
// (as a negative [Outcome.After] is), handed to Handle. So a remaining time
// computed with time.Until that may have run out must not be passed as is:
// max(d, time.Nanosecond) times out at once when it has. It has no effect
// on other outcomes.
func (o Outcome) Timeout(d time.Duration) Outcome {
	if o.kind == sqlq.KindAwait {
		o.timeout = d
	}
	return o
}

// WithTx returns a copy of the outcome whose commit also runs fn: the engine
// opens a transaction, calls fn with it, applies the outcome in the same
// transaction and commits. The step's own writes to this database and its
// outcome thus commit together or not at all — exactly once, even when the
// step runs twice (a fenced-out outcome rolls fn's writes back). If fn
// returns an error, nothing is committed and the error goes to Handle —
// unless fn failed on its connection (it was lost or terminated, or the
// server had none to give: [ErrInfrastructure]); then the step runs again
// shortly without counting an attempt. Handle also gets the error of a
// transaction that fails after fn returned nil: the server refused the COMMIT (a
// deferred constraint or trigger; not a serialization failure, a deadlock
// or a lock or statement timeout, which retry the whole transaction, fn
// included), or a statement of fn's failed and fn returned nil anyway (the
// outcome then finds the transaction aborted) — nothing is committed, and
// Handle gets an error wrapping the server's (a *pgconn.PgError: for an
// aborted transaction, the first statement's that failed). fn must not call Commit or
// Rollback on tx (they return [ErrTxOwned]); a savepoint it begins with
// tx.Begin it ends itself. A transaction that waits on a lock
// keeps its claim (heartbeated) for as long as it waits; it is given up
// only once the lease is lost, or its server session is gone. fn must not
// leave the transaction idle — doing work of its own between statements, or
// between the rows of a result it reads — for [Config].TxIdleTimeout
// (default: the lease): the server then ends the transaction, as it must for
// a worker cut off from the database whose session would otherwise hold
// fn's locks for hours, and the step fails, counting an attempt. The engine
// tells that end from a lost connection by the server's error where one
// arrives, otherwise by timing the calls fn makes on tx: statements sent
// around it (tx.Conn(), tx.LargeObjects()) are not timed. tx is a wrapper,
// not the pool's own transaction type.
//
// WithTx(nil) is the outcome as it was, without a transaction. An outcome
// has one callback: WithTx on an outcome that has one replaces it (run
// both from one fn).
//
// Cost: a transaction of its own (BEGIN, fn's statements, the outcome,
// COMMIT) instead of one statement that can share a batched commit.
func (o Outcome) WithTx(fn func(ctx context.Context, tx pgx.Tx) error) Outcome {
	o.txFn = fn
	return o
}

// Done finishes the instance successfully. result (any JSON-encodable value,
// or nil) is stored in the instance's result column.
func Done(result any) Outcome { return Outcome{kind: sqlq.KindDone, result: result} }

// Stop fails the instance for good, recording reason in its error history
// as a step's error text is stored: NUL bytes left out, invalid UTF-8 as
// U+FFFD, cut at 4,000 bytes with "…(truncated)" added. It is not retried.
func Stop(reason string) Outcome { return Outcome{kind: sqlq.KindStop, reason: reason} }

// Next moves the instance to step with a new state, committed before the
// step runs; the attempt counter resets to 0.
func (r *Run[S]) Next(step string, state S) Outcome {
	return Outcome{kind: sqlq.KindNext, step: step, state: state, hasState: true}
}

// Replay runs the same step again after delay with state, counting one more
// attempt. Signals are not consumed and awaited names are kept, so the replay
// sees the same inputs. MaxAttempts bounds the retries of the default Handle
// and of the reaper, not a step's own Replays: a step may replay past it
// (Run.Attempt then exceeds MaxAttempts), and its next failure or expired
// lease fails the instance at once. To poll without spending the attempt
// budget, return r.Next(r.Step, state).After(delay): it resets the counter.
func (r *Run[S]) Replay(state S, delay time.Duration) Outcome {
	return Outcome{kind: sqlq.KindReplay, state: state, hasState: true, delay: delay}
}

// replayAsStored is a Replay that carries no state: the row keeps its state
// as stored, byte for byte — fields this binary's type lacks (a newer
// deploy's) included, which re-encoding r.State would drop. The default
// Handle's retry and a job's snooze use it.
func replayAsStored(delay time.Duration) Outcome {
	return Outcome{kind: sqlq.KindReplay, delay: delay}
}

// MaxAwaitNames is how many signal names one Await may wait for. The names
// are stored with the row and shown whole by Describe, the dashboard and
// show, three times on the instance page: a hostile probe's Await of
// 100,000 valid names made that page grow with them, without bound.
const MaxAwaitNames = 100

// Await parks the instance until a signal with one of names arrives (see
// [Engine.Signal]); it then runs nextStep with state, and the step sees the
// matching signals in [Run.Awaited]. If a matching signal is already in the
// inbox that the step has not already seen, the instance runs on at once.
// Nothing is consumed: awaiting again from the woken step parks until a new
// matching signal arrives, and the next wake sees the old and the new ones
// together — signals accumulate until a Next (or ScheduleChildren) consumes
// the ones the step received. Add a deadline with [Outcome.Timeout].
//
// A step woken by its timeout sees Awaited empty and its whole [Run.Inbox];
// a matching signal sent after the timeout woke the instance, before the
// step started, is there, not in Awaited: look there before treating the
// timeout as final. (A claim that waited for a free slot reads the inbox
// again as its step starts; a signal sent in the milliseconds between that
// read and the step's start, or while the step runs, is not in it, and a
// Done or Stop of the step consumes it unseen.) Awaiting again from that step counts as received what
// the step that parked had received (the row keeps their ids): it parks
// unless a matching signal arrived that that step had not received — one
// sent after the timeout's wake, say — and then the wake sees it with the
// older ones, which are still unconsumed. Each
// name is checked as [Engine.Signal] checks it (1 to 200 bytes of valid
// UTF-8 without control characters or bidirectional controls, not starting
// or ending with white space); an invalid one, or more than
// [MaxAwaitNames] of them, makes the outcome [ErrInvalidOutcome].
func (r *Run[S]) Await(nextStep string, state S, names ...string) Outcome {
	return Outcome{kind: sqlq.KindAwait, step: nextStep, state: state, hasState: true, awaits: names}
}

// ScheduleChildren inserts children (instances of any registered machine,
// each with its own insert options) with this instance as their parent, in
// the same statement that parks it; once every child is done or failed, the
// instance runs nextStep with state and sees them in [Run.Children], in
// the order given here (their ids follow it; a unique-key duplicate is left
// out). With no children (or only unique-key duplicates) it runs on at
// once. Children with unique keys go in in the order of their keys, as
// [Engine.InsertMany]'s rows do, so fan-outs and batches of overlapping
// keys, each in its own order, do not deadlock.
func (r *Run[S]) ScheduleChildren(nextStep string, state S, children ...InsertParams) Outcome {
	return Outcome{kind: sqlq.KindChildren, step: nextStep, state: state, hasState: true, children: children}
}

// validate checks an outcome against its machine before any SQL runs.
func (o Outcome) validate(steps map[string]bool) error {
	switch o.kind {
	case sqlq.KindNext:
		if !steps[o.step] {
			return fmt.Errorf("%w: Next names step %q, which the machine does not declare", ErrInvalidOutcome, o.step)
		}
		if o.delay < 0 {
			return fmt.Errorf("%w: negative delay %s", ErrInvalidOutcome, o.delay)
		}
	case sqlq.KindReplay:
		if o.delay < 0 && o.snooze {
			return fmt.Errorf("%w: JobSnooze with a negative delay %s", ErrInvalidOutcome, o.delay)
		}
		if o.delay < 0 {
			return fmt.Errorf("%w: negative replay delay %s", ErrInvalidOutcome, o.delay)
		}
	case sqlq.KindAwait:
		if !steps[o.step] {
			return fmt.Errorf("%w: Await names next step %q, which the machine does not declare", ErrInvalidOutcome, o.step)
		}
		if len(o.awaits) == 0 {
			return fmt.Errorf("%w: Await needs at least one signal name", ErrInvalidOutcome)
		}
		if len(o.awaits) > MaxAwaitNames {
			return fmt.Errorf("%w: Await of %d signal names, more than %d", ErrInvalidOutcome, len(o.awaits), MaxAwaitNames)
		}
		for _, n := range o.awaits {
			if err := validateSignalName(n); err != nil {
				return fmt.Errorf("%w: Await: %v", ErrInvalidOutcome, err)
			}
		}
		if o.timeout < 0 {
			return fmt.Errorf("%w: negative await timeout %s", ErrInvalidOutcome, o.timeout)
		}
	case sqlq.KindChildren:
		if !steps[o.step] {
			return fmt.Errorf("%w: ScheduleChildren names next step %q, which the machine does not declare", ErrInvalidOutcome, o.step)
		}
	case sqlq.KindDone, sqlq.KindStop:
	default:
		return fmt.Errorf("%w: the step returned the zero Outcome", ErrInvalidOutcome)
	}
	return nil
}
