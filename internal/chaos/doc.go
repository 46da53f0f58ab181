// Package chaos is gendurable's reliability harness: it runs real worker
// processes against a real PostgreSQL, injects faults (SIGKILL, SIGSTOP,
// database restarts, terminated backends, a skewed database clock, a
// starved connection pool, a long transaction elsewhere, poison steps) and
// checks every instance afterwards with an oracle.
//
// # The oracle
//
// Every step of the harness's machines
//
//   - appends a side-effect row to chaos_effects in autocommit when it starts
//     (and stamps its end there before returning): the non-transactional
//     side effect, kept whatever happens to the step; and
//   - returns its outcome with [gendurable.Outcome.WithTx], inserting an
//     oracle row into chaos_oracle in the transaction that commits the
//     outcome: instance, step, the state's sequence number, attempt, the
//     claim token read from the instance row inside that transaction, a
//     random run id, the worker's pid, and database clock_timestamp() at the
//     step's start and end. A fenced-out outcome rolls its oracle row back.
//
// Each machine state carries a sequence number (Seq) that the step's outcome
// increments, so "exactly one committed outcome per (instance, step, run)"
// becomes: exactly one chaos_oracle row per (instance, seq), no gaps.
// Effect rows per (instance, seq) beyond the first are duplicate step runs.
//
// Keyed "fenced" leaves also write chaos_fenced, a resource outside the
// engine fenced by the claim token (Run.Token): a write with a token older
// than the last one accepted for its key is refused, and every offer is
// logged with whether the writer's claim was still current, so that stale
// writes the fence let through can be counted.
//
// [Check] classifies every instance (terminal ok / failed / lost / stuck) and
// checks the invariants; [Report.Line] is the one-line summary a scenario
// prints. The scenarios themselves are tests behind the build tag "chaos"
// (see RELIABILITY.md at the repository root); worker processes are the test
// binary re-executed with the environment variable CHAOS_WORKER set (see
// [WorkerMain]), or the standalone ./internal/chaos/chaosworker.
package chaos
