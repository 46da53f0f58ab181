package gendurable

import (
	"context"
	"time"
)

// Hook receives the engine's telemetry events (docs/design.md §8). OnEvent is called
// synchronously from the engine's goroutines, often on the hot path: it must
// be quick and must not block. Switch on the event's concrete type:
//
//	gendurable.HookFunc(func(ctx context.Context, ev gendurable.Event) {
//		switch e := ev.(type) {
//		case *gendurable.StepEvent:
//			stepDuration.Record(ctx, e.Duration.Seconds())
//		case *gendurable.ReapEvent:
//			reaped.Add(ctx, int64(e.Count))
//		}
//	})
//
// Events are passed by pointer and must not be retained after OnEvent returns.
type Hook interface {
	OnEvent(ctx context.Context, ev Event)
}

// HookFunc adapts a function to [Hook].
type HookFunc func(ctx context.Context, ev Event)

// OnEvent calls f.
func (f HookFunc) OnEvent(ctx context.Context, ev Event) { f(ctx, ev) }

// Event is one of the *…Event types of this package.
type Event interface {
	// EventName is a stable dotted name, e.g. "step.stop".
	EventName() string
}

// StepEvent: a step finished and its outcome was written (or fenced out).
// Its EventName, "step.stop", is the end of the step's run, whatever its
// outcome (as a span's start and stop), not the Stop outcome: Outcome says
// which.
type StepEvent struct {
	Queue      string
	Machine    string
	Version    int
	InstanceID int64
	Step       string        // the step that ran
	Attempt    int           // its attempt, from 0 (Run.Attempt)
	Outcome    string        // "next", "replay", "done", "stop", "await" (Await) or "children" (ScheduleChildren)
	Err        error         // the step's handled error (or panic), if any
	Duration   time.Duration // user code plus outcome commit
	Fenced     bool          // the claim token no longer matched: nothing was written
	// CommitErr: the outcome was not confirmed — not written (the lease
	// will expire), or its statement's (or a WithTx outcome's COMMIT's)
	// answer was lost, and it may have been written; the message says
	// which ("may have been written").
	CommitErr error
	// Interrupted: not the step's failure — the engine cancelled it (a
	// Stop, a lease it could not confirm in time) or its transaction failed
	// on its connection. It runs again, no attempt counted, Handle not
	// asked; Err says why (error kind "interrupted" or "infrastructure").
	Interrupted bool
	// Snoozed: the step returned a [JobSnooze] that was honoured (a
	// machine's default Handle, a Job): it runs again after the delay, no
	// attempt counted; Err is the *SnoozeError. Not set when a Handle of
	// the machine's own retried it (an attempt counted: a failure).
	Snoozed bool
}

// PickEvent: the feeder ran one pick statement.
type PickEvent struct {
	Queue    string
	Count    int // rows claimed
	Demand   int // rows asked for
	Duration time.Duration
	Err      error
	// Throttled counts, by key policy, the partition keys with runnable
	// rows that the pick passed over: full (as many running as the key's
	// limit) or rate limited (no start left in its bucket). Policies with
	// nothing to count are left out. A pick that walked no key — the last
	// walk found every key full, and it is not due again yet
	// (docs/design.md §6) — counts none.
	Throttled []KeyThrottle
}

// KeyThrottle is what one pick passed over under one key policy.
type KeyThrottle struct {
	Prefix      string // the KeyPolicy's prefix
	Default     bool   // keys that no KeyPolicy matches (limit 1)
	Full        int    // keys with no free slot
	RateLimited int    // keys with no start left in their bucket
}

// SaturationEvent: the feeder's load after a pick, and once more when the
// feeder stops (before its [DrainEvent]): Buffered 0, its prefetched rows
// handed back, and InFlight the steps still running (those ignoring their
// cancellation), so that a gauge fed from it does not keep the load of the
// last pick before the Stop.
type SaturationEvent struct {
	Queue       string
	InFlight    int
	Buffered    int
	Concurrency int
	Prefetch    int
}

// ReapEvent: a reap statement recovered expired leases, or failed. It
// comes after each statement that recovered rows, and after each that
// failed while the engine runs — its connection lost, or no reply within
// [Config].MaintenanceTimeout — with Err set and the counts zero, so a
// reaper that cannot reach the database is seen, not only logged.
type ReapEvent struct {
	Count  int // rows recovered
	Failed int // of which failed for good (attempts exhausted)
	// Uncharged: of which went back to runnable without an attempt
	// charged: claims whose last heartbeat found their step not yet
	// started (prefetched rows of a worker that died or stalled; see
	// [QueueConfig].Prefetch), and claims no heartbeat confirmed
	// ([StepError].Unconfirmed).
	Uncharged int
	IDs       []int64 // the instances recovered
	Duration  time.Duration
	Err       error // the statement failed; nothing was recovered by it
}

// DrainEvent: a queue's feeder stopped.
type DrainEvent struct {
	Queue     string
	Released  int  // prefetched rows handed straight back to runnable
	Completed bool // every in-flight step committed before the drain timeout
	Duration  time.Duration
}

// UnknownVersionEvent: a claimed row names a machine or version this process
// does not have; it was released back, runnable again after Delay.
type UnknownVersionEvent struct {
	Queue      string
	Machine    string
	Version    int
	InstanceID int64
	Delay      time.Duration
}

// LeaseLostEvent: a held row's lease was found gone (reaped after a stall,
// or the row was changed by an operator), or could no longer be confirmed
// in time (no heartbeat extended it before its local deadline). Its step
// context is cancelled; or, with Unstarted, the claim was waiting in the
// prefetch buffer: no step ran, and none is cancelled.
type LeaseLostEvent struct {
	Queue      string
	InstanceID int64
	Unstarted  bool
}

// PartitionContendedEvent was emitted when a claimed row's partition key
// was held by another step.
//
// Deprecated: no longer emitted. Partition keys are key leases taken by the
// pick itself: a row whose key is full is not claimed in the first place.
type PartitionContendedEvent struct {
	Queue        string
	InstanceID   int64
	PartitionKey string
}

// StepAbandonedEvent: a step ignored its context past its StepTimeout and
// was abandoned: the engine stopped heartbeating it and wrote its outcome
// itself (Outcome: "replay" or "stop"; Written is false if that failed —
// fenced out, or the database unreachable, when the lease runs out and the
// reaper takes over). Its goroutine keeps a slot of the queue's Concurrency
// until it returns; AbandonedSlots is how many such steps the queue's
// feeder in this process holds now.
type StepAbandonedEvent struct {
	Queue          string
	Machine        string
	Version        int
	InstanceID     int64
	Step           string
	Attempt        int           // from 0 (Run.Attempt)
	Running        time.Duration // how long the step had run
	Outcome        string
	Written        bool
	AbandonedSlots int
}

func (*StepEvent) EventName() string               { return "step.stop" }
func (*StepAbandonedEvent) EventName() string      { return "step.abandoned" }
func (*PickEvent) EventName() string               { return "pick" }
func (*SaturationEvent) EventName() string         { return "scheduler.saturation" }
func (*ReapEvent) EventName() string               { return "reaper.reaped" }
func (*DrainEvent) EventName() string              { return "scheduler.drain" }
func (*UnknownVersionEvent) EventName() string     { return "instance.unknown_version" }
func (*LeaseLostEvent) EventName() string          { return "lease.lost" }
func (*PartitionContendedEvent) EventName() string { return "partition.contended" }
