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
//	runs again (at-least-once) while the instance has attempts left: the
//	reaper charges the lost run one, and fails the instance once none is left
//	(rows claimed ahead and not started go back uncharged: see Failures).
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
//   - [Run.Await](nextStep, state, names...): park until a signal arrives.
//   - [Run.ScheduleChildren](nextStep, state, children...): fan out, fan in.
//
// Outcomes are validated before any SQL runs: a Next to a step the machine
// does not declare, the zero Outcome, or a state that does not encode is an
// [ErrInvalidOutcome], handed to Handle like any step error.
//
// A machine may declare its transitions in [Machine].Flow: for each step,
// the steps it may lead to and the outcome kinds it may return. [New]
// refuses a Flow that names an unknown step ([*UnknownStepError]); at run
// time an outcome that breaks it fails the instance at once, without a
// retry ([*TransitionError], [ErrUndeclaredTransition]), and
// [Machine.ValidateOutcome] checks an outcome the same way in a test. Every
// engine stores its machines' definitions in the database when it starts,
// so that [Engine.Graph] and [Engine.ListMachines] — the CLI, the dashboard
// — show every machine, registered in the process or not
// (docs/design.md §9).
//
// # Signals and await
//
// [Engine.Signal] sends a durable message to an instance (optionally with a
// dedup key: the same key twice is a no-op that says so). A step parks the
// instance with [Run.Await](nextStep, state, names...), optionally with
// [Outcome.Timeout]; the first matching signal makes it runnable at
// nextStep, whose [Run.Awaited] holds the matching signals ([Run.Inbox] all
// of them). A timed-out await runs nextStep with an empty Awaited;
// Timeout(0) is no deadline, and a negative one an invalid outcome.
//
// A Next (or ScheduleChildren) consumes exactly the awaited signals the
// step received; a same-name signal that arrived later survives. Replay and
// Await consume nothing, so awaiting again accumulates; Done and Stop
// consume the whole inbox. Signal and the await outcome serialize on the
// instance row, so no interleaving loses a wake-up, and a signal to an
// unknown or finished instance is an error that writes nothing.
//
// # Children
//
// [Run.ScheduleChildren](nextStep, state, children...) inserts children —
// instances of any registered machine, each with its own insert options —
// in the same statement that parks the parent. Each child's Done or Stop
// (or failure by the reaper) decrements the parent; the last one wakes it
// at nextStep, whose [Run.Children] lists the children with their statuses
// and results. Children may fan out in turn.
//
// # Unique and partition keys
//
// [InsertOpts].UniqueKey keeps at most one instance with the key in the
// statuses of UniqueScope (by default the live ones; [UniqueForever] keeps
// it after the instance finishes). A duplicate insert returns the existing
// id with Duplicate set — across processes, and within one InsertMany.
//
// [InsertOpts].PartitionKey bounds how many instances sharing a key run a
// step at once, across every process: one by default, or the limit of the
// key's [KeyPolicy] or of the insert's KeyLimit. A running keyed step's row
// is its key's slot, stamped with its fencing token ([Run].Token) and
// lease; the pick takes slots key by key, round robin, and an outcome that
// frees a slot usually hands it to the key's next row in the same
// statement (not for rated keys, nor while the queue's picks come back
// full). A step whose lease cannot be confirmed is cancelled, and a
// successor starts only once the old slot's lease ran out on the database
// clock; a step that ignores its context can still act after that, which
// the token lets a resource refuse.
// Nothing pins a connection, so keys work behind a transaction-pooling proxy.
//
// # Transactional outcomes and periodic instances
//
// [Outcome.WithTx] runs a callback in the transaction that commits the
// outcome, so a step's own writes to the same database happen exactly once
// (a fenced-out outcome rolls them back). It costs a transaction of its own.
// A transaction waiting on a lock keeps its heartbeated claim as long as it
// waits; a callback that fails on its connection ([ErrInfrastructure]) runs
// again without counting an attempt.
//
// [Config].Periodic inserts one instance per slot of a cron schedule
// (5-field, @hourly…, or @every), exactly once across processes; see
// [Periodic] for the missed-slot policy.
//
// [WaitResult] blocks until an instance finishes and returns its Done
// result, decoded, or its failure ([FailedError]).
// [Engine.WaitReason] says what an instance waits for: signals and deadline,
// children k of n, the partition key's holder, or its eligible time.
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
// reaper returns the row to runnable with attempt + 1 without calling Handle,
// in its old place in the backlog (its eligible_at is kept). After
// MaxAttempts expired leases the reaper fails the instance. A row the
// crashed worker had only claimed ahead (QueueConfig.Prefetch) costs no
// attempt if a heartbeat of the worker marked it not started: it goes back
// to runnable with its attempt unchanged, and its error entry says so
// (StepError.Uncharged).
// A marked claim starts only after the worker has cleared its mark; an
// attempt goes free at most once — a second lease lost on the same step
// and attempt is charged whatever the mark says (docs/design.md §4,
// "Prefetched claims"). A claim no heartbeat has written yet — its answer
// lost (a pick's claims, the successor of a key hand-off, whose statement
// committed while the worker's connection lost the reply), or taken less
// than about a HeartbeatInterval before the worker died or was cut off —
// also goes back uncharged, but once per visit of a step: its step may
// have started, so a step that kills its process at once is charged from
// its second crash on (docs/design.md §4, "Claims no heartbeat
// confirmed"). A chained
// Next's next step lost that way is also recovered: the group committer
// sends the statement again, finds what the lost attempt wrote, and the
// worker runs that step (docs/design.md §4, "A lost answer").
//
// Every claim gets a fresh fencing token. Outcomes and heartbeats apply only
// while the token still matches, so a worker whose lease was reaped (a zombie
// after a long pause) can never overwrite a newer run; its step context is
// cancelled with [ErrLeaseLost].
//
// Machine.StepTimeout (a job's Timeout) bounds a step: its context is
// cancelled with [ErrStepTimeout] and the error goes to Handle. A step that
// ignores its context as well is abandoned shortly after: the engine writes
// its outcome (retry, or failed once the attempts are spent, error kind
// "timeout"), stops heartbeating it and reports a [StepAbandonedEvent]; its
// goroutine keeps its slot until it returns, so Concurrency still holds.
//
// A step, Handle or WithTx callback that calls runtime.Goexit — as
// t.FailNow, t.Fatal and testify's require functions do — is handled like
// a panic inside a test binary. Outside one, Goexit ends the worker's
// goroutine: no outcome is written, the row stays executing under a lease
// the heartbeat keeps alive, and the queue has one running place less,
// until the process restarts (then the lease runs out and the reaper
// charges an attempt). Keep test helpers out of production steps.
//
// While the database is unreachable, workers keep running: failed picks back
// off exponentially with jitter (up to 2s, or MaxPollInterval if longer),
// outcome writes retry for up to a lease, and work resumes once the database
// answers again. Bad input — an oversized or too deeply nested state or
// payload ([Config.MaxStateBytes], [Config.MaxSignalBytes],
// [Config.MaxJSONDepth]), invalid options, and in an insert or a signal
// NUL characters, lone UTF-16 surrogate escapes or invalid UTF-8 (from a
// json.RawMessage or a MarshalJSON) — is a typed error before any SQL runs,
// and a rejected insert or signal writes nothing. (An outcome whose state
// or result the database refuses — a NUL in a string — fails its instance
// at once, error kind "outcome_rejected". encoding/json itself writes
// invalid UTF-8 in a Go string as U+FFFD, as it does everywhere.)
// RELIABILITY.md in the repository lists the fault scenarios this is tested
// against.
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
// works the queue wakes its feeder at once (a Tx variant, whose rows are
// seen only once the caller commits, sets its polls back to the busy
// interval instead); other processes find new work by polling with idle
// backoff (no LISTEN/NOTIFY).
//
// Per queue, a feeder claims runnable rows with one batched statement
// (`FOR UPDATE SKIP LOCKED`, O(batch) whatever the backlog), keeps up to
// Concurrency steps running and Prefetch more claimed, and extends every
// held lease with one batched heartbeat per tick. Leases are measured on the
// database clock. Outcomes of concurrent steps are group-committed — one
// statement for all of them, each step still waiting for its own commit
// before its instance goes on — and a Next continues in the same worker
// without a new pick (QueueConfig.ChainSteps).
//
// # Operating
//
// The Engine also serves operators: [Engine.List], [Engine.Describe],
// [Engine.Retry], [Engine.Cancel], [Engine.Queues], [Engine.Pause] and
// [Engine.Resume], [Engine.Prune] (also run periodically, see
// Config.Retention), [Engine.ListMachines] and [Engine.Graph]. The gendurable command and the
// dashboard package are built on them. Their names, filters and search text
// are validated like inserts — [ErrInvalidInput] before any SQL runs — and
// their reads are bounded: a list page looks at no more than
// ListFilter.MaxScan instances, and a search by id, partition key or unique
// key is an index lookup. [Engine.RetryMany] and [Engine.CancelMany] act on
// up to [MaxBulkIDs] ids, [Engine.RetryMatching] and [Engine.CancelMatching]
// on everything a ListFilter matches, [BulkBatch] instances per statement
// (a filter without criteria needs ListFilter.All), and [Engine.CancelTree]
// on an instance and every live descendant, parents before their children,
// also in batches; on error, their [BulkResult] holds what was changed
// before it. [Engine.RunNow] makes a
// scheduled or backing-off instance eligible now. On a schema that was never
// migrated they return [ErrNotMigrated]; on one migrated to another
// version than the library's, [ErrSchemaVersion].
//
// Rows run on the (machine, version) they were inserted with; several
// versions may be registered side by side. A row whose version this process
// does not know is released back after a delay, never run on the wrong
// version and never failed; its error history (kind "unknown_version") and
// [Engine.WaitReason] say so.
//
// A deploy that changes a machine without a new Version meets its old rows
// where they are (docs/design.md §9): a row at a step the machine no longer
// declares goes to Handle as an [ErrInvalidOutcome] (Run.Step is the old
// name, so a Handle can move it on) and is by default retried with backoff
// until its attempts are spent (the default retry keeps the state as
// stored, fields this binary's S lacks included); a state that no longer
// decodes into S (a job's args, likewise) fails the instance at once, kind
// "state_decode" — also while another version that could decode it runs
// beside this one: change a state's types with a new Version.
// Either is in its error history; [Engine.Retry] runs it again after the
// definition is fixed. A failure consumes the instance's inbox like any
// finish: a retried step that had been woken by a signal sees an empty
// Awaited, as after a timeout (its Inbox holds only the signals sent since
// the retry) — a step that must not lose a signal's
// payload copies it into the state (a Next) before work that may fail.
//
// # Testing
//
// Package [github.com/gendurable/gendurable/gendurabletest] runs one step
// of a machine without a database and shows the outcome the engine would
// write (RunStep), gives each test a schema of its own (NewDB), asserts
// what code under test inserted (RequireInserted), and works an engine
// until given instances finish (WorkUntilFinished).
//
// # Schema
//
// The tables live in a schema of your choice (default "public"), installed
// by package [github.com/gendurable/gendurable/migrate], which can also print
// the SQL for your own migration tool.
//
// # Telemetry
//
// Hooks ([Hook]) receive typed events — [StepEvent], [PickEvent] (with the
// partition keys a pick passed over, full or rate limited, by key policy),
// [SaturationEvent], [ReapEvent], [DrainEvent], [UnknownVersionEvent],
// [LeaseLostEvent], [StepAbandonedEvent] — and the engine logs through
// log/slog.
package gendurable
