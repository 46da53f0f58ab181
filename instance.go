package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Status is an instance's lifecycle status.
type Status string

// The statuses of an instance.
const (
	StatusRunnable         Status = "runnable"
	StatusExecuting        Status = "executing"
	StatusAwaitingSignal   Status = "awaiting_signal"
	StatusAwaitingChildren Status = "awaiting_children"
	StatusDone             Status = "done"
	StatusFailed           Status = "failed"
)

// Terminal reports whether the status is final (done or failed).
func (s Status) Terminal() bool { return s == StatusDone || s == StatusFailed }

// ErrNotFound: no instance has the given id (from [Engine.Graph]: no such
// machine).
var ErrNotFound = errors.New("gendurable: instance not found")

// badIDError: an id no instance can have (ids are positive), refused
// before any SQL runs. It is [ErrInvalidInput], and [ErrNotFound] too — what
// the calls on one instance returned for it before they checked, after a
// round trip.
type badIDError struct {
	op string
	id int64
}

func (e badIDError) Error() string {
	return fmt.Sprintf("gendurable: invalid input: %s: id %d is not an instance id (ids are positive)", e.op, e.id)
}

func (e badIDError) Is(target error) bool { return target == ErrInvalidInput || target == ErrNotFound }

// checkID refuses a non-positive instance id (badIDError).
func checkID(op string, id int64) error {
	if id > 0 {
		return nil
	}
	return badIDError{op: op, id: id}
}

// StepError is one entry of an instance's error history.
type StepError struct {
	Step    string    `json:"step"`
	Attempt int       `json:"attempt"` // from 0, as Instance.Attempt
	At      time.Time `json:"at"`
	// Kind is "error", "panic", "stop", "lease_expired", "state_decode",
	// "outcome_rejected", "interrupted", "infrastructure", "timeout" (a
	// step abandoned past its StepTimeout), "cancelled" (an operator's
	// cancel), "transition" (an outcome its machine's Flow does not
	// declare) or "unknown_version" (released unrun by an engine without
	// the instance's machine version). Code that switches on it should
	// have a default case: kinds may be added.
	Kind  string `json:"kind"`
	Error string `json:"error"`
	// Uncharged: a "lease_expired" entry whose lost claim cost no attempt:
	// a heartbeat had found its step not started (a prefetched claim; see
	// [QueueConfig].Prefetch), or no heartbeat had written the claim since
	// it was taken (its answer was lost, or its worker died or was cut off
	// before its first heartbeat; the step may have run — once per step,
	// docs/design.md §4). False for every other entry.
	Uncharged bool `json:"uncharged,omitempty"`
	// Unconfirmed: an Uncharged entry of a claim no heartbeat had written
	// (schema version 24): its step may have started, so a step goes free
	// this way once only (docs/design.md §4, "Claims no heartbeat
	// confirmed"). False for every other entry.
	Unconfirmed bool `json:"unconfirmed,omitempty"`
	// Stack is a panic's stack trace (Kind "panic"), from the panicking
	// frame down, at most 8 KiB; empty for other errors (and for panics
	// recorded by versions that did not keep it).
	Stack string `json:"stack,omitempty"`
}

// Instance is a snapshot of one instance row. Its JSON form (the CLI's
// `show --json`) uses snake_case names, like every gendurable type.
type Instance struct {
	ID       int64           `json:"id"`
	Machine  string          `json:"machine"`
	Version  int             `json:"version"`
	Queue    string          `json:"queue"`
	Step     string          `json:"step"`
	Status   Status          `json:"status"`
	State    json.RawMessage `json:"state"`
	Result   json.RawMessage `json:"result,omitempty"` // set once done
	Priority int             `json:"priority"`
	// Attempt counts from 0: 0 while the step runs (or waits to run) for
	// the first time, +1 per failed attempt (a replay or an expired lease;
	// not an expired lease the reaper returns uncharged: a prefetched claim
	// whose step never started, or a claim no heartbeat confirmed, see
	// [StepError].Uncharged).
	// Attempt+1 is the run's number ("attempt 1 of 3"), as the CLI shows it.
	// A failed instance keeps the attempt it failed on: Attempt+1 is
	// MaxAttempts when its attempts ran out, whether the last one returned
	// an error or its lease expired (a reaper of an engine built before
	// schema version 21 still counts the expired run: MaxAttempts+1).
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	EligibleAt  time.Time `json:"eligible_at"`
	// LeaseExpiresAt is set while executing, and kept by an instance
	// cancelled mid-step (and retried since, while it lives): until then its
	// step may still run, and it holds its key's slot and its place in its
	// queue's GlobalConcurrency (docs/design.md §6). A finished instance's
	// is cleared by the prune's sweep once it ran out a minute ago.
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	PartitionKey   string     `json:"partition_key,omitempty"`
	// UniqueKey is the key the instance was inserted with (InsertOpts.UniqueKey),
	// "" if none; UniqueKeyHeld says whether its status is inside its unique
	// scope now, so that it keeps another insert with the key out.
	UniqueKey     string      `json:"unique_key,omitempty"`
	UniqueKeyHeld bool        `json:"unique_key_held,omitempty"`
	Errors        []StepError `json:"errors"` // oldest first, the last 20
	ParentID      *int64      `json:"parent_id,omitempty"`
	InsertedAt    time.Time   `json:"inserted_at"`
	UpdatedAt     time.Time   `json:"updated_at"`
	FinishedAt    *time.Time  `json:"finished_at,omitempty"`
}

// Instance reads one instance by id; [ErrNotFound] if there is none.
func (e *Engine) Instance(ctx context.Context, id int64) (*Instance, error) {
	if err := e.usable(ctx, "Instance"); err != nil {
		return nil, err
	}
	return e.instanceOn(ctx, e.pool, id)
}

// instanceOn is Instance, read on db.
func (e *Engine) instanceOn(ctx context.Context, db sqlq.DB, id int64) (*Instance, error) {
	if err := checkID("read instance", id); err != nil {
		return nil, err
	}
	r, err := e.q.GetInstance(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("read instance %d", id))
	}
	return instanceFromRow(r)
}

// instanceFromRow converts a stored row to an Instance.
func instanceFromRow(r sqlq.InstanceRow) (*Instance, error) {
	in := &Instance{
		ID: r.ID, Machine: r.FSM, Version: int(r.Version), Queue: r.Queue, Step: r.Step,
		Status: Status(r.Status), State: r.State, Result: r.Result, Priority: int(r.Priority),
		Attempt: int(r.Attempt), MaxAttempts: int(r.MaxAttempts), EligibleAt: r.EligibleAt,
		LeaseExpiresAt: r.LeaseExpiresAt, ParentID: r.ParentID,
		InsertedAt: r.InsertedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
	}
	if r.PartitionKey != nil {
		in.PartitionKey = *r.PartitionKey
	}
	in.UniqueKey, in.UniqueKeyHeld = string(r.UniqueKey), r.UniqueHeld
	if err := json.Unmarshal(r.Errors, &in.Errors); err != nil {
		return nil, fmt.Errorf("gendurable: instance %d: error history: %w", r.ID, err)
	}
	return in, nil
}

// ErrNotRetryable: only a failed instance can be retried.
var ErrNotRetryable = errors.New("gendurable: instance is not failed")

// ErrUniqueConflict: the operation would give an instance a unique key that
// another live instance holds.
var ErrUniqueConflict = errors.New("gendurable: unique key held by another instance")

// Retry moves a failed instance back to runnable at the step it failed in,
// with a fresh attempt budget; its error history is kept. One cancelled
// while it waited — a durable sleep ([Outcome.After]), a RunAt or RunIn, a
// backoff — waits out the rest of that wait ([Engine.RunNow] ends it). A child whose
// parent still waits is waited for again — a parent that awaits its
// children, or one their finish (or cancel) woke whose next step has not
// run yet, which goes back to awaiting them; a parent whose next step is
// running has read its children, and if that step commits its outcome the
// child runs on its own (one claimed by a pick but not yet started reads
// them again as it starts, and awaits the child instead of running). If
// the step ends without one (it fails or replays, its claim is released at a
// Stop, or its lease lapses and the row is reaped), the parent's next claim
// finds the child live and does not run the step: the parent awaits its
// live children again, no attempt counted. A parent
// cancelled while it
// awaited its children, some of which still run, awaits them again; an
// instance cancelled while it was parked in an Await awaits the same names
// again, with the same deadline (one that passed meanwhile wakes it as a
// timeout at the timeout sweeper's next look) — the cancel consumed its
// signals, so it waits for new ones. One cancelled after a signal woke it,
// before its next step ran, is no longer parked: that step runs as after
// a timeout, with Awaited empty and in its Inbox only the signals sent
// since the retry (so does a step past an await that failed otherwise: its
// own Stop, the reaper) (docs/design.md §2). [ErrNotFound], [ErrNotRetryable]
// (not failed), or [ErrUniqueConflict] (another live instance now holds its
// unique key) leave everything unchanged. An instance cancelled while its
// step ran keeps that step's lease — its key's slot, its place in its
// queue's GlobalConcurrency — until the lease ends ([Engine.Cancel]);
// retried before then, it keeps the lease and becomes eligible when the
// lease ends (a parent put back to awaiting its children: when they have
// finished and the lease has ended), so it never runs beside the cancelled
// run; this engine wakes its feeder of the queue then. The retry locks
// the instance's parent with it, so a child and its parent retried at the
// same moment take turns, and the parent awaits the child whichever goes
// first. The retry is logged at Info on the engine's Logger.
func (e *Engine) Retry(ctx context.Context, id int64) error {
	if err := e.usable(ctx, "Retry"); err != nil {
		return err
	}
	if err := checkID("retry", id); err != nil {
		return err
	}
	type answer struct {
		status, queue *string
		wait          time.Duration
	}
	a, err := againOnDeadlock(ctx, func() (answer, error) {
		status, queue, wait, err := e.q.Retry(ctx, e.pool, id)
		return answer{status, queue, wait}, err
	})
	status, queue, wait := a.status, a.queue, a.wait
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return e.uniqueConflict(ctx, id, pgErr)
	}
	if err != nil {
		return e.dbErr(ctx, err, fmt.Sprintf("retry %d", id))
	}
	switch {
	case status == nil:
		return fmt.Errorf("%w: id %d", ErrNotFound, id)
	case queue == nil:
		return fmt.Errorf("%w: instance %d is %s", ErrNotRetryable, id, *status)
	}
	if wait > 0 {
		// Eligible when its cancelled step's lease ends: wake the feeder then
		// (a kick now would find nothing, and the idle backoff could leave
		// the row waiting up to MaxPollInterval past that).
		e.kickQueueAt(*queue, time.Now().Add(wait))
		e.log.Info("gendurable: instance retried", "id", id, "eligible_in", wait)
		return nil
	}
	e.kickQueue(*queue)
	e.log.Info("gendurable: instance retried", "id", id)
	return nil
}

// ErrNotDelayed: [Engine.RunNow] applies to a runnable instance that is
// eligible later (scheduled with RunAt or RunIn, or backing off before its
// next attempt), not to one executing, parked or finished.
var ErrNotDelayed = errors.New("gendurable: instance is not waiting to run")

// RunNow makes a runnable instance that is eligible later — scheduled, or
// backing off before its next attempt — eligible now; its attempt count is
// kept (an instance retried after a cancel of its running step becomes
// eligible when that step's lease ends, not before: see [Engine.Retry]).
// An instance already eligible is left as it is (nil). [ErrNotFound],
// or [ErrNotDelayed] for an instance executing, awaiting a signal or
// children, or finished. An instance retried while the lease of its
// cancelled step still lives becomes eligible when that lease ends, not
// before (its step may still be running until then). An instance that
// another transaction finished while the call waited for it is reported as
// it is now ([ErrNotDelayed] with its new status). The change is logged
// at Info on the engine's Logger.
func (e *Engine) RunNow(ctx context.Context, id int64) error {
	if err := e.usable(ctx, "RunNow"); err != nil {
		return err
	}
	if err := checkID("run now", id); err != nil {
		return err
	}
	status, queue, wait, err := e.q.RunNow(ctx, e.pool, id)
	switch {
	case err != nil:
		return e.dbErr(ctx, err, fmt.Sprintf("run now %d", id))
	case status == nil:
		return fmt.Errorf("%w: id %d", ErrNotFound, id)
	case queue != nil && wait > 0:
		e.kickQueueAt(*queue, time.Now().Add(wait))
		e.log.Info("gendurable: instance made eligible when its cancelled step's lease ends", "id", id, "eligible_in", wait)
	case queue != nil:
		e.kickQueue(*queue)
		e.log.Info("gendurable: instance made eligible now", "id", id)
	case Status(*status) != StatusRunnable:
		return fmt.Errorf("%w: instance %d is %s", ErrNotDelayed, id, *status)
	}
	return nil
}

// uniqueConflict is the error of a retry of id refused because another
// instance holds its unique key: it names that instance and the key, as
// text (the server's detail shows the key's bytes in hex and the column).
func (e *Engine) uniqueConflict(ctx context.Context, id int64, pgErr *pgconn.PgError) error {
	holder, key, ok, err := e.q.UniqueHolder(ctx, e.pool, id)
	if err != nil || !ok {
		return fmt.Errorf("%w: instance %d: %s", ErrUniqueConflict, id, pgErr.Detail)
	}
	return fmt.Errorf("%w: instance %d's unique key %q is held by instance %d", ErrUniqueConflict, id, key, holder)
}
