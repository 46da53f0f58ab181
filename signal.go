package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// ErrInstanceFinished: a signal was sent to an instance that is done or
// failed. Nothing was written.
var ErrInstanceFinished = errors.New("gendurable: instance already finished")

// ErrInvalidSignal: a signal's name, payload or dedup key is unusable.
var ErrInvalidSignal = errors.New("gendurable: invalid signal")

// SignalOpts are per-signal options.
type SignalOpts struct {
	// DedupKey makes the signal idempotent per instance: sending another
	// signal with the same key to the same instance writes nothing and
	// reports Duplicate, for the instance's whole life (consumed signals
	// keep their key until the instance is pruned).
	DedupKey string
}

// SignalResult is what a signal did.
type SignalResult struct {
	ID        int64 `json:"id"`        // the signal's id (for a duplicate, the original's)
	Duplicate bool  `json:"duplicate"` // the dedup key was already used: nothing was written
	Woke      bool  `json:"woke"`      // the instance was awaiting this name and is now runnable
}

// Signal sends a durable message to instance id. It is stored in the
// instance's inbox; if the instance awaits name it becomes runnable at once.
// A signal and a concurrent Await outcome serialize on the instance row, so
// a wake-up is never lost. payload may be nil or any JSON-encodable value.
// Sending to an unknown instance returns [ErrNotFound], to a finished one
// [ErrInstanceFinished] (unless its dedup key was already delivered to it:
// Duplicate, as for a live one); neither writes anything. name is 1 to 200
// bytes and a DedupKey at most 1000, both valid UTF-8 without NUL, another
// control character or a bidirectional control, neither starting nor ending
// with white space (the rule of queue names and keys: what a sender
// can use, an operator can type and see as it is): anything else is
// [ErrInvalidSignal], before any SQL runs. The name is taken as given: the
// CLI and the dashboard pass it on untrimmed.
//
// A context that ends, or a connection lost, while the statement is in
// flight may leave the signal delivered though an error comes back: send
// signals that must arrive exactly once with a DedupKey, and retry — a
// retry of a delivered one reports Duplicate.
func (e *Engine) Signal(ctx context.Context, id int64, name string, payload any, opts *SignalOpts) (SignalResult, error) {
	if err := e.usable(ctx, "Signal"); err != nil {
		return SignalResult{}, err
	}
	return e.signal(ctx, e.pool, id, name, payload, opts)
}

// SignalTx sends a signal inside the caller's transaction: it is delivered
// (and wakes the instance) only if the transaction commits. The instance
// row stays locked until then. An invalid name, dedup key or payload (one
// PostgreSQL cannot store included: a NUL character, a lone UTF-16
// surrogate escape) is [ErrInvalidSignal] before any SQL runs, so the
// transaction is left usable.
func (e *Engine) SignalTx(ctx context.Context, tx pgx.Tx, id int64, name string, payload any, opts *SignalOpts) (SignalResult, error) {
	if err := e.usable(ctx, "SignalTx"); err != nil {
		return SignalResult{}, err
	}
	if tx == nil {
		return SignalResult{}, errorf(ErrInvalidSignal, "SignalTx: nil transaction")
	}
	return e.signal(ctx, tx, id, name, payload, opts)
}

func (e *Engine) signal(ctx context.Context, db sqlq.DB, id int64, name string, payload any, opts *SignalOpts) (SignalResult, error) {
	if err := checkID("signal", id); err != nil {
		return SignalResult{}, err
	}
	if err := validateSignalName(name); err != nil {
		return SignalResult{}, fmt.Errorf("%w: %v", ErrInvalidSignal, err)
	}
	var dedup *string
	if opts != nil && opts.DedupKey != "" {
		if p := keyProblem(opts.DedupKey); p != "" {
			return SignalResult{}, errorf(ErrInvalidSignal, "DedupKey %s", p)
		}
		k := opts.DedupKey
		dedup = &k
	}
	var b []byte
	// A panic in the payload's MarshalJSON comes back as an error (as an
	// insert's state does), not in the caller of Signal.
	err := safely(func() (err error) { b, err = json.Marshal(payload); return err })
	if err != nil {
		return SignalResult{}, errorf(ErrInvalidSignal, "payload does not encode to JSON: %v", err)
	}
	if err := checkInputJSON(e.signalLimits, "payload", b, ErrInvalidSignal); err != nil {
		return SignalResult{}, err
	}
	p := string(b)
	r, err := e.q.Signal(ctx, db, id, name, &p, dedup)
	if err != nil {
		if sqlq.Rejected(err) {
			return SignalResult{}, fmt.Errorf("%w: the database rejected the payload: %w", ErrInvalidSignal, err)
		}
		return SignalResult{}, e.dbErr(ctx, err, fmt.Sprintf("signal %d", id))
	}
	switch {
	case r.Status == nil:
		return SignalResult{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	case r.ID == nil && r.DupID != nil:
		// Before the finished check: a sender retrying a delivery that
		// woke the instance, which then finished, learns it was delivered.
		return SignalResult{ID: *r.DupID, Duplicate: true}, nil
	case *r.Status == string(StatusDone) || *r.Status == string(StatusFailed):
		return SignalResult{}, fmt.Errorf("%w: instance %d is %s", ErrInstanceFinished, id, *r.Status)
	case r.ID == nil:
		return SignalResult{Duplicate: true}, nil
	}
	if r.Woke && r.Queue != nil && db == sqlq.DB(e.pool) {
		e.kickQueue(*r.Queue)
	}
	return SignalResult{ID: *r.ID, Woke: r.Woke}, nil
}

// validateSignalName checks a signal name by the rule of queue, machine and
// step names (nameProblem): 1 to 200 bytes of valid UTF-8 without NUL,
// another control character or a bidirectional control, not starting or
// ending with white space. Signal and Await check it alike, so a name an
// instance awaits is one an operator can type in the CLI or the dashboard.
func validateSignalName(name string) error {
	if p := nameProblem(name); p != "" {
		if len(name) > maxNameLen {
			return fmt.Errorf("signal name %s", p) // not quoted whole
		}
		return fmt.Errorf("signal name %q %s", name, p)
	}
	return nil
}

// WaitReason says what an instance is waiting for. Exactly the fields that
// apply to its status are set (and PartitionKey, whatever the status, for
// a keyed instance).
type WaitReason struct {
	Status Status `json:"status"`
	Step   string `json:"step"`  // the step it will run next (or is running)
	Queue  string `json:"queue"` // the queue it is (or will be) claimed from
	// Signals it awaits (awaiting_signal), with the deadline if the await
	// has a timeout, and the unconsumed signals it holds by name.
	Signals     []string       `json:"signals,omitempty"`
	Deadline    *time.Time     `json:"deadline,omitempty"`
	InboxByName map[string]int `json:"inbox_by_name,omitempty"`
	// awaiting_children: finished children of ChildrenTotal.
	ChildrenDone  int `json:"children_done,omitempty"`
	ChildrenTotal int `json:"children_total,omitempty"`
	// EligibleAt is when a runnable instance may next be picked (a delay,
	// a backoff or a durable sleep); in the past means it is waiting for a
	// free worker.
	EligibleAt time.Time `json:"eligible_at"`
	// PartitionKey is the instance's key, in every status (empty: none).
	// KeyHolders, KeyLimit: a runnable instance whose key has
	// no free slot — KeyHolders are the instances whose running steps hold
	// the key's slots (live leases), KeyLimit how many slots the key has
	// (the instance's own KeyLimit, else this engine's KeyPolicies, else 1).
	// A process that neither works the instance's queue nor has
	// KeyPolicies (the CLI) cannot know the limit the picking processes
	// apply: it reports the holders with KeyLimit 0, and the Summary says
	// so. PartitionHeldBy is the first holder.
	PartitionKey    string  `json:"partition_key,omitempty"`
	KeyHolders      []int64 `json:"key_holders,omitempty"`
	KeyLimit        int     `json:"key_limit,omitempty"`
	PartitionHeldBy int64   `json:"partition_held_by,omitempty"`
	// RateLimitedUntil: a runnable instance whose key's rate (a
	// [KeyPolicy] of this engine with a Rate) has no start left before
	// this time. A process without that rate cannot know the time: it
	// leaves this nil, and its Summary says the key is rated if its last
	// start left its bucket with less than a start, and how long ago.
	RateLimitedUntil *time.Time `json:"rate_limited_until,omitempty"`
	// LeaseExpiresAt: an executing instance's lease (one already past on
	// the database's clock means no heartbeat renewed it: the worker is
	// gone, stopped or cut off, no reaper has swept the row yet, and the
	// Summary says so); or, for a runnable one retried while the lease of
	// its cancelled step lived, that lease: it becomes eligible when the
	// lease ends (the step may run until then).
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// QueueRunning, GlobalConcurrency: a runnable, eligible instance of a
	// queue that this engine bounds with a [QueueConfig.GlobalConcurrency],
	// whose running steps across every process (live leases) take it all.
	// A process that does not bound the queue (the CLI) leaves them 0.
	QueueRunning      int `json:"queue_running,omitempty"`
	GlobalConcurrency int `json:"global_concurrency,omitempty"`
	// Delayed: a runnable instance not eligible before EligibleAt — a
	// delay, a durable sleep or a retry's backoff — read on the database's
	// clock (the Summary says "sleeping until" or "backing off until").
	// The other waits (a lease, a key, a rate, an unknown version) have
	// fields of their own and leave it false.
	Delayed bool `json:"delayed,omitempty"`
	// QueuePaused: a runnable instance whose queue is paused
	// ([Engine.Pause]): no process picks it until the queue is resumed.
	QueuePaused bool `json:"queue_paused,omitempty"`
	// Unstarted: an executing instance claimed ahead of a free slot
	// ([QueueConfig.Prefetch]) whose step had not started at its worker's
	// last heartbeat: it waits in that worker's buffer. A claim newer than
	// the worker's last heartbeat is not marked yet, and reads as running.
	Unstarted bool `json:"unstarted,omitempty"`
	// Summary is one human sentence, e.g. "awaiting signal payment (times
	// out in 14m)".
	Summary string `json:"summary"`
}

// String is w's Summary.
func (w *WaitReason) String() string {
	if w == nil {
		return "<nil>"
	}
	return w.Summary
}

// Wait is [Engine.WaitReason].
//
// Deprecated: it says what an instance waits for, not the instance's
// result; use WaitReason, or [WaitResult] to wait for an instance to finish.
func (e *Engine) Wait(ctx context.Context, id int64) (*WaitReason, error) {
	if err := e.usable(ctx, "Wait"); err != nil {
		return nil, err
	}
	return e.WaitReason(ctx, id)
}

// WaitReason reports what instance id is waiting for; [ErrNotFound] if it does
// not exist. The CLI and the dashboard show it.
func (e *Engine) WaitReason(ctx context.Context, id int64) (*WaitReason, error) {
	if err := e.usable(ctx, "WaitReason"); err != nil {
		return nil, err
	}
	return e.waitReasonOn(ctx, e.pool, id)
}

// waitReasonOn is WaitReason, read on db.
func (e *Engine) waitReasonOn(ctx context.Context, db sqlq.DB, id int64) (*WaitReason, error) {
	if err := checkID("wait reason", id); err != nil {
		return nil, err
	}
	unbounded := []string{} // the queues this engine works with no GlobalConcurrency: not counted
	for name, qc := range e.cfg.Queues {
		if qc.GlobalConcurrency == 0 {
			unbounded = append(unbounded, name)
		}
	}
	w, err := e.q.WaitInfo(ctx, db, id, unbounded)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("wait reason of %d", id))
	}
	r := &WaitReason{Status: Status(w.Status), Step: w.Step, Queue: w.Queue, EligibleAt: w.EligibleAt, InboxByName: w.Inbox}
	if w.PartitionKey != nil {
		r.PartitionKey = *w.PartitionKey
	}
	global := e.cfg.Queues[w.Queue].GlobalConcurrency // this engine's bound on the row's queue (0: none)
	// rated describes, for a process without the key's rate, the bucket
	// as a pick last left it: refilled_at is when a pick last looked at
	// it, with a start or not (its wording "its last start, 315ms ago"
	// came 1.7 s after the last start: a flow-control probe).
	ratedElsewhere := w.PartitionKey != nil && w.BucketTokens != nil && *w.BucketTokens < 1 && !e.ratesKey(*w.PartitionKey)
	rated := func() string {
		return fmt.Sprintf("as a pick last left its bucket, %s ago, it held %.2f of a start",
			w.Now.Sub(*w.BucketRefilled).Round(time.Millisecond), max(0, *w.BucketTokens))
	}
	held := len(w.KeyHolders) // the holders counted, not only those listed (at most 100)
	if w.KeyHeld != nil {
		held = int(*w.KeyHeld)
	}
	switch r.Status {
	case StatusAwaitingSignal:
		r.Signals, r.Deadline = w.Awaits, w.AwaitDeadline
		r.Summary = "awaiting signal " + strings.Join(w.Awaits, " or ")
		switch {
		case w.AwaitDeadline == nil:
		case w.AwaitDeadline.After(w.Now):
			r.Summary += fmt.Sprintf(" (times out %s)", fromNow(*w.AwaitDeadline, w.Now, time.Second))
		default:
			r.Summary += fmt.Sprintf(" (timed out %s ago; the await-timeout sweep wakes it)",
				w.Now.Sub(*w.AwaitDeadline).Round(time.Millisecond))
		}
	case StatusAwaitingChildren:
		r.ChildrenTotal = int(w.ChildrenTotal)
		r.ChildrenDone = int(w.ChildrenTotal - w.ChildrenPending)
		r.Summary = fmt.Sprintf("awaiting children: %d of %d finished", r.ChildrenDone, r.ChildrenTotal) // failed and cancelled ones count too
	case StatusRunnable:
		switch {
		case w.LeaseExpiresAt != nil && w.LeaseExpiresAt.After(w.Now):
			r.LeaseExpiresAt = w.LeaseExpiresAt
			r.Summary = fmt.Sprintf("waiting for the lease of its cancelled step to end at %s (%s): that step may still be running",
				w.LeaseExpiresAt.UTC().Format(time.RFC3339), fromNow(*w.LeaseExpiresAt, w.Now, time.Second))
		case w.PartitionKey != nil && held > 0 && !e.knowsKeyLimit(w.KeyLimit, w.Queue):
			// This process neither works the queue nor has KeyPolicies
			// (the CLI, a dashboard of its own): the key's limit is the
			// picking processes' policy, which it cannot see. Its guess of
			// 1 printed "3 of 1 slots" (an operator probe).
			r.KeyHolders = w.KeyHolders
			r.PartitionHeldBy = w.KeyHolders[0]
			r.Summary = fmt.Sprintf("partition key %q: %d %s held by %s; it waits for one if that is the key's limit "+
				"(1, unless a KeyPolicy of the processes that work queue %q says more: this process has none)",
				r.PartitionKey, held, slots(held), instanceList(w.KeyHolders, held), w.Queue)
			if ratedElsewhere {
				// A rated key with a holder read as a matter of its limit
				// alone (a PgBouncer probe: 2 of 4 slots held, its bucket
				// empty).
				r.Summary += ", or for its rate: the key is rated too, and " + rated()
			}
		case w.PartitionKey != nil && held > 0 && held >= e.keyLimit(*w.PartitionKey, w.KeyLimit):
			r.KeyHolders, r.KeyLimit = w.KeyHolders, e.keyLimit(*w.PartitionKey, w.KeyLimit)
			r.PartitionHeldBy = w.KeyHolders[0]
			r.Summary = fmt.Sprintf("waiting for partition key %q (%d of %d slots held by %s)",
				r.PartitionKey, held, r.KeyLimit, instanceList(w.KeyHolders, held))
		case w.PartitionKey != nil && w.BucketTokens != nil && e.rateLimitedUntil(*w.PartitionKey, *w.BucketTokens, *w.BucketRefilled, w.Now) != nil:
			r.RateLimitedUntil = e.rateLimitedUntil(*w.PartitionKey, *w.BucketTokens, *w.BucketRefilled, w.Now)
			r.Summary = fmt.Sprintf("partition key %q rate limited until %s (%s)", r.PartitionKey,
				r.RateLimitedUntil.UTC().Format(time.RFC3339Nano), fromNow(*r.RateLimitedUntil, w.Now, time.Millisecond))
		case ratedElsewhere:
			// The key has a bucket — a picking process's KeyPolicy rates
			// it — but not in this process (the CLI, a dashboard or an
			// insert-only engine of its own): it cannot tell when the next
			// start is due. Its silence read "waiting for a worker" with
			// the worker idle, waiting on the rate (a newcomer's probe).
			// Its last start may be long past: the bucket may be full
			// again by now, which only the rate could tell.
			r.Summary = fmt.Sprintf("partition key %q is rated by a KeyPolicy of the processes that work queue %q "+
				"(this process has no rate for it, so it cannot say when the next start is due): %s",
				r.PartitionKey, w.Queue, rated())
		case w.UnknownVersion != nil:
			r.Summary = fmt.Sprintf("released unrun until %s (%s): %s", w.EligibleAt.UTC().Format(time.RFC3339),
				fromNow(w.EligibleAt, w.Now, time.Second), *w.UnknownVersion)
		case w.EligibleAt.After(w.Now) && w.Attempt > 0:
			r.Delayed = true
			r.Summary = fmt.Sprintf("backing off until %s (%s) before attempt %d", w.EligibleAt.UTC().Format(time.RFC3339),
				fromNow(w.EligibleAt, w.Now, time.Second), w.Attempt+1) // attempts shown from 1
		case w.EligibleAt.After(w.Now):
			r.Delayed = true
			r.Summary = fmt.Sprintf("sleeping until %s (%s)", w.EligibleAt.UTC().Format(time.RFC3339), fromNow(w.EligibleAt, w.Now, time.Second))
		case w.GlobalHeld != nil && global > 0 && int(*w.GlobalHeld) >= global:
			// It read "waiting for a worker" with a worker idle, kept
			// from it by the bound (a flow-control probe).
			r.QueueRunning, r.GlobalConcurrency = int(*w.GlobalHeld), global
			r.Summary = fmt.Sprintf("waiting for room in queue %q: %d steps running across every process, its GlobalConcurrency %d",
				w.Queue, r.QueueRunning, r.GlobalConcurrency)
		default:
			r.Summary = fmt.Sprintf("runnable, waiting for a worker of queue %q", w.Queue)
			if _, ok := e.cfg.Queues[w.Queue]; !ok && len(e.cfg.Queues) > 0 {
				// A newcomer's Job{Queue: "emails"} in an engine that
				// works "default" only waited, saying nothing (a probe).
				r.Summary += " (not a queue this engine works)"
			}
			if _, ok := e.cfg.Queues[w.Queue]; !ok && w.GlobalHeld != nil && *w.GlobalHeld > 0 {
				// This process cannot see the GlobalConcurrency of the
				// processes that work the queue, if any (the CLI).
				r.Summary += fmt.Sprintf("; %d of its steps are running across every process: if the processes that work it "+
					"give it a GlobalConcurrency (this one cannot see it), that may be what holds this row back", *w.GlobalHeld)
			}
		}
		if w.QueuePaused {
			r.QueuePaused = true
			r.Summary += "; its queue is paused: no process picks it until the queue is resumed"
		}
	case StatusExecuting:
		r.LeaseExpiresAt = w.LeaseExpiresAt
		r.Summary = "running step " + w.Step
		if w.Unstarted {
			r.Unstarted = true
			r.Summary = "claimed by a worker ahead of a free slot (prefetched), step " + w.Step +
				" not started as of its last heartbeat"
		}
		if w.LeaseExpiresAt != nil && !w.LeaseExpiresAt.After(w.Now) {
			// No heartbeat renewed the lease: its worker is gone, stopped or
			// cut off, and no reaper has swept the row yet — every engine
			// of the schema down, say. "running step" read as if a worker
			// were at it (a crash probe: 6.6 s after the only worker's
			// SIGKILL).
			what, then := "step "+w.Step, " (or failed, if that run was its last attempt)"
			if w.Unstarted {
				what, then = "prefetched step "+w.Step+" (not started as of its last heartbeat)", ""
			}
			r.Summary = fmt.Sprintf("lease of %s expired %s ago with no outcome (no heartbeat renewed it: its worker crashed, stopped or was cut off, "+
				"or another transaction holds the row locked): "+
				"waiting for the reaper of a running engine of this schema to make it runnable again%s",
				what, w.Now.Sub(*w.LeaseExpiresAt).Round(time.Millisecond), then)
		}
	default:
		r.Summary = "finished (" + string(r.Status) + ")"
	}
	return r, nil
}

// fromNow says how long from now t is, rounded to round (to the
// millisecond under 10 s): "in 1h2m3s"; past
// what a Duration holds (about 292 years: a RunAt in the year 294275 is
// valid), "in over 100 years" rather than a saturated, unrounded figure.
func fromNow(t, now time.Time, round time.Duration) string {
	const far = 100 * 365 * 24 * time.Hour
	if t.After(now.Add(far)) {
		return "in over 100 years"
	}
	d := t.Sub(now)
	if d > 0 && d < 10*time.Second {
		round = min(round, time.Millisecond) // not "in 0s" with 450 ms to go
	}
	return "in " + d.Round(round).String()
}
