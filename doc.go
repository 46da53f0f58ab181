// Package gendurable runs durable finite-state machines and jobs on
// PostgreSQL.
//
// Each instance of a machine is one row. User code runs one step at a time,
// between two short database statements and outside any transaction. The one
// guarantee everything serves:
//
//	When a step completes, its outcome (the new state, the next step) is
//	committed to the database before execution of that instance proceeds.
//	A crash at any point loses at most the step that was running, which then
//	runs again (at-least-once).
//
// # Machines
//
// A [Machine] is typed by its state, a Go struct stored as JSON in the row.
// Its steps are functions that return exactly one [Outcome]:
//
//	type Order struct{ Item string; Charged bool }
//
//	var OrderMachine = &gendurable.Machine[Order]{
//		Name:  "order",
//		Start: "charge",
//		Steps: map[string]gendurable.StepFunc[Order]{
//			"charge": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
//				if err := payments.Charge(ctx, r.ID, r.State.Item); err != nil {
//					return gendurable.Outcome{}, err // Handle decides: retry with backoff by default
//				}
//				s := r.State
//				s.Charged = true
//				return r.Next("ship", s), nil // committed before "ship" runs
//			},
//			"ship": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
//				return gendurable.Done(map[string]string{"shipped": r.State.Item}), nil
//			},
//		},
//	}
//
// The outcomes:
//
//   - [Run.Next](step, state): go on at step with the new state; the attempt
//     counter resets. [Outcome.After](d) makes it a durable sleep.
//   - [Run.Replay](state, delay): run the same step again later, counting an
//     attempt.
//   - [Done](result): finished; result is stored as JSON.
//   - [Stop](reason): failed for good, reason recorded.
//
// Outcomes are validated before any SQL runs: a Next to a step the machine
// does not declare, the zero Outcome, or a state that does not encode is an
// [ErrInvalidOutcome], handed to Handle like any step error.
//
// # Failures
//
// A step that returns an error or panics calls the machine's Handle, whose
// outcome is applied instead. The default Handle replays with exponential
// backoff and jitter ([DefaultBackoff]) until MaxAttempts (default 20), then
// stops. If Handle itself fails, the instance stops. Every handled failure is
// recorded on the row (step, attempt, time, message; the last 20 are kept).
//
// A crash is different: no outcome is written, the lease expires, and the
// reaper returns the row to runnable with attempt + 1 without calling Handle.
// After MaxAttempts expired leases the reaper fails the instance.
//
// Every claim gets a fresh fencing token. Outcomes and heartbeats apply only
// while the token still matches, so a worker whose lease was reaped (a zombie
// after a long pause) can never overwrite a newer run; its step context is
// cancelled with [ErrLeaseLost].
//
// # Jobs
//
// A [Job] is the one-step special case: Perform returns nil (done), an error
// (retried with backoff), an error wrapped with [JobCancel] (failed at once),
// or [JobSnooze] (run again later without counting an attempt). A job is an
// instance with one step and shares every table, index and code path.
//
// # Engine
//
// [New] builds an [Engine] from a pgx pool and a [Config]; [Engine.Start]
// works the configured queues, [Engine.Stop] drains gracefully. Insert with
// [Engine.Insert], [Engine.InsertMany] (one statement) or their Tx variants,
// which enqueue inside the caller's pgx.Tx. An insert through an engine that
// works the queue wakes its scheduler at once; other processes find new work
// by polling with idle backoff (no LISTEN/NOTIFY).
//
// Per queue, a feeder claims runnable rows with one batched statement
// (`FOR UPDATE SKIP LOCKED`, O(batch) whatever the backlog), keeps up to
// Concurrency steps running and Prefetch more claimed, and extends every
// held lease with one batched heartbeat per tick. Leases are measured on the
// database clock.
//
// Rows run on the (machine, version) they were inserted with; several
// versions may be registered side by side. A row whose version this process
// does not know is released back after a delay, never run on the wrong
// version and never failed.
//
// # Schema
//
// The tables live in a schema of your choice (default "public"), installed
// by package [github.com/gendurable/gendurable/migrate], which can also print
// the SQL for your own migration tool.
//
// # Telemetry
//
// Hooks ([Hook]) receive typed events — [StepEvent], [PickEvent],
// [SaturationEvent], [ReapEvent], [DrainEvent], [UnknownVersionEvent],
// [LeaseLostEvent] — and the engine logs through log/slog.
package gendurable
