package gendurable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Wrapped errors returned by the package match them with
// [errors.Is].
var (
	// ErrInvalidConfig: a Config, QueueConfig or machine definition is invalid.
	// The error text says which field and why.
	ErrInvalidConfig = errors.New("gendurable: invalid config")

	// ErrNotMade: a method was called on a nil *Engine or on an Engine
	// that New did not make (its zero value): every Engine comes from New.
	// It matches ErrInvalidConfig too.
	ErrNotMade = fmt.Errorf("%w: the Engine was not made by gendurable.New (it is nil or a zero value)", ErrInvalidConfig)

	// ErrInvalidSchema: the schema name is not a plain SQL identifier.
	ErrInvalidSchema = sqlq.ErrInvalidSchema

	// ErrInvalidOutcome: a step (or Handle) returned an outcome that cannot be
	// applied — the zero Outcome, a Next to an undeclared step, a negative
	// delay, or a state or result that does not encode to JSON. A step's
	// invalid outcome is handed to Handle like any other step error; an
	// invalid outcome from Handle stops the instance.
	ErrInvalidOutcome = errors.New("gendurable: invalid outcome")

	// ErrUnknownMachine: an insert's *Machine or *Job is not the value
	// registered in the engine's Config.Machines under its (name, version):
	// none is, or another value of that name and version is (registration is
	// by value: build the definition once and share it).
	ErrUnknownMachine = errors.New("gendurable: machine not registered")

	// ErrInvalidInsert: insert options are out of range (negative max
	// attempts, priority outside smallint, both RunAt and RunIn set, ...),
	// or the state cannot be stored: over the limits, refused by
	// PostgreSQL, or not encodable to JSON (then [ErrStateEncode] too).
	ErrInvalidInsert = errors.New("gendurable: invalid insert")

	// ErrStateDecode: an instance's stored state does not decode into the
	// machine's state type. Such an instance is stopped with this reason: a
	// retry cannot fix stored data. WaitResult returns it too, for a
	// result that does not decode into its T ("result does not decode").
	ErrStateDecode = errors.New("gendurable: state does not decode")

	// ErrStateEncode: a state or result value does not encode to JSON
	// (NaN, a channel, a MarshalJSON that fails or panics). From an insert
	// it is [ErrInvalidInsert] too; from a step's outcome,
	// [ErrInvalidOutcome] too.
	ErrStateEncode = errors.New("gendurable: state does not encode")

	// ErrLeaseLost: the step's lease can no longer be confirmed — the
	// heartbeat found it reaped or taken over, or no heartbeat confirmed it
	// before its local deadline (a stalled process, a cut-off network). Its
	// context is cancelled with this cause. What the step returns then is
	// written only if the claim still holds when its statement runs: once
	// the row was reaped or claimed again, the fence rejects it; a lease
	// that only ran late locally may still be the step's, and its outcome
	// then commits — an outcome it returned as usual, or, for an error, a
	// run again that counts no attempt and does not ask Handle (error kind
	// "interrupted"), as for a step the engine's shutdown cancelled.
	ErrLeaseLost = feeder.ErrLeaseLost

	// ErrInstanceCancelled: the step's instance was cancelled through this
	// engine ([Engine.Cancel], CancelMany, CancelMatching, CancelTree) while
	// the step ran here; its context is cancelled with this cause as the
	// cancel commits (or as a claim of it that a pick or a key hand-off had
	// in flight arrives: such a claim is handed back, its step not
	// started), and what it returns is fenced out. Its claim is gone,
	// so it is an [ErrLeaseLost] too (errors.Is holds for both) and handled
	// as one: Handle is not asked. A cancel through another engine reaches
	// the step as a plain ErrLeaseLost, at this engine's next heartbeat
	// (HeartbeatInterval).
	ErrInstanceCancelled = feeder.ErrInstanceCancelled

	// ErrEngineStopped: the engine is shutting down; in-flight step contexts
	// are cancelled with this cause once the drain timeout passes.
	ErrEngineStopped = executor.ErrEngineStopped

	// ErrStepTimeout: the step ran longer than its machine's StepTimeout
	// (a job's Timeout). Its context is cancelled with this cause, and the
	// error Handle receives wraps it.
	ErrStepTimeout = executor.ErrStepTimeout

	// ErrInfrastructure: a step's WithTx transaction failed on its
	// connection, not by itself — the connection was lost or terminated
	// (SQLSTATE class 08, 57P01 admin shutdown, 57P02, 57P03, or a network
	// error), or the server had no connection to give (53300 too many
	// clients). A callback's error counts as such only when the
	// transaction's own connection is gone, not by its type or SQLSTATE:
	// one that only looks like it (an io.EOF, a net.Error of another
	// service, a 08001 of postgres_fdw) or the callback's own statement
	// timeout goes to Handle. Handle is not
	// asked and no attempt is counted: the step runs again after about a
	// second. The error history records it with kind "infrastructure", and
	// the StepEvent's Err wraps this error.
	ErrInfrastructure = executor.ErrInfrastructure

	// ErrTxOwned: a WithTx callback called Commit or Rollback on the
	// transaction it was given. The engine commits that transaction itself,
	// with the outcome, so the call does nothing but return this error (a
	// savepoint the callback began with tx.Begin it ends itself).
	ErrTxOwned = executor.ErrTxOwned

	// ErrSchemaVersion: the schema is not migrated to the version this
	// library needs (see package migrate). [Engine.Start] checks the version
	// and returns it; an operator call, insert or signal of an engine that
	// was not started returns it too when a statement misses a table, column
	// or function because the schema is at an older (or newer) version —
	// the error text names both versions and the command to run. Package
	// migrate returns it too (wrapped) for a schema newer than it knows or
	// whose version comment it cannot read.
	ErrSchemaVersion = sqlq.ErrSchemaVersion

	// ErrInvalidInput: an operator call ([Engine.List], [Engine.Pause],
	// [Engine.Resume], [Engine.Graph]) got a filter, name or search text it
	// cannot use: empty where a name is required, too long, not valid UTF-8,
	// holding NUL or another control character or a bidirectional control
	// (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), or a name
	// (queue, machine, step, signal) that starts or ends with white space —
	// the rule inserts, signals and config follow too (ErrInvalidInsert,
	// ErrInvalidSignal, ErrInvalidConfig). It is returned before any
	// SQL runs. The CLI exits 2 on it and the dashboard answers 400. An
	// instance id of 0 or less given to a call on one instance (Instance,
	// Describe, WaitReason, WaitResult, Retry, Cancel, RunNow, Signal) is
	// ErrInvalidInput and, as no instance has it, ErrNotFound too.
	ErrInvalidInput = errors.New("gendurable: invalid input")

	// ErrNotMigrated: the schema holds no gendurable tables: a statement
	// met SQLSTATE 42P01 (undefined table) on one of them. The error text
	// says to run `gendurable migrate up` (or migrate.Up, package
	// github.com/gendurable/gendurable/migrate) for the schema.
	// Operator calls, inserts and signals return it; the CLI exits 1 with
	// that hint and the dashboard shows it. It is [ErrSchemaVersion] too,
	// from every call ([Engine.Start] checks the version itself), so code
	// that branches on ErrSchemaVersion catches a schema never migrated.
	ErrNotMigrated = errors.New("gendurable: schema not migrated")

	// ErrAlreadyStarted: Start was called on a running engine.
	ErrAlreadyStarted = errors.New("gendurable: engine already started")
)

// PanicError is the error Handle receives when a step panics.
type PanicError struct {
	Value any    // what was passed to panic
	Stack string // the goroutine's stack at the panic
}

// Error formats Value with %v. A Value whose String or Error method panics
// with a value that does the same would make fmt panic again (it gives up
// on nested panics), killing the worker that reports it; Error then names
// the value's type instead.
func (e *PanicError) Error() (msg string) {
	defer func() {
		if recover() != nil {
			msg = fmt.Sprintf("panic: a %T value (formatting it panicked)", e.Value)
		}
	}()
	return fmt.Sprintf("panic: %v", e.Value)
}

// CancelError marks a job error as final: the job fails at once, without
// further attempts. Create it with [JobCancel]. A machine's step may return
// it too: its default Handle stops the instance at once (a Handle of your
// own decides for itself).
type CancelError struct{ Err error }

// Error names the call, not "cancelled": an operator's cancel is that (a
// newcomer's probe read "job cancelled: bad address; stopped: cancelled"
// as one).
func (e *CancelError) Error() string {
	if e.Err == nil {
		return "JobCancel"
	}
	return "JobCancel: " + e.Err.Error()
}
func (e *CancelError) Unwrap() error { return e.Err }

// JobCancel wraps err so that a job returning it fails at once, with no
// further attempts.
func JobCancel(err error) error { return &CancelError{Err: err} }

// SnoozeError asks for a job to run again after a delay without counting an
// attempt. Create it with [JobSnooze]. A machine's step may return it too:
// its default Handle replays the step after the delay without counting an
// attempt (the error is in the history).
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string {
	if e.Delay < 0 {
		// Retried as an error from a machine's step too (its default
		// Handle): say why, as a job's invalid outcome does (a probe:
		// "job snoozed for -1s" counted an attempt without a word).
		return fmt.Sprintf("%s: JobSnooze with a negative delay %s", ErrInvalidOutcome, e.Delay)
	}
	return fmt.Sprintf("job snoozed for %s", e.Delay)
}

// JobSnooze, returned from a job's Perform, runs the job again after d
// without counting an attempt. d must not be negative (0: at once): a
// negative d is an invalid outcome ([ErrInvalidOutcome]), retried like an
// error, which counts an attempt.
func JobSnooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// notMigrated reports an undefined-table error (SQLSTATE 42P01) on one of
// gendurable's tables.
func notMigrated(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01" && strings.Contains(pgErr.Message, "gendurable_")
}

// schemaObjectMissing reports an error a schema at another version than
// the library's gives: an undefined table, column or function (SQLSTATE
// 42P01, 42703, 42883).
func schemaObjectMissing(err error) bool { return sqlq.ObjectMissing(err) }

// dbErr wraps a database error of the operation what, called with ctx: as
// [ErrSchemaVersion] when a table, column or function is missing and the
// schema is at another version than this library's (read only then, on
// this error path: an engine that was never started has not checked it);
// as [ErrNotMigrated], naming the schema and the command that fixes it,
// when the tables are missing; as "gendurable: what: err" otherwise.
//
// The version is read under the caller's ctx, for at most
// versionReadTimeout (or Config.MaintenanceTimeout if shorter): a caller
// whose ctx ends is not held by it (a caller of InsertTx holding a small
// pool's last connection waited the full bound for one), and gets the plain
// wrapped error if the read did not finish.
func (e *Engine) dbErr(ctx context.Context, err error, what string) error {
	if schemaObjectMissing(err) {
		ctx, cancel := context.WithTimeout(ctx, min(versionReadTimeout, e.cfg.MaintenanceTimeout))
		v, verr := sqlq.InstalledVersion(ctx, e.pool, e.cfg.Schema)
		cancel()
		if want := sqlq.LatestVersion(); verr == nil && v != 0 && v != want {
			return &schemaVersionError{what: what, schema: e.cfg.Schema, have: v, want: want, err: err}
		}
	}
	if notMigrated(err) {
		return &notMigratedError{schema: e.cfg.Schema, err: err}
	}
	return fmt.Errorf("gendurable: %s: %w", what, err)
}

// schemaVersionError says which versions differ and what to run instead
// of the database's "column ... does not exist", which it still wraps; or,
// from Start's check (err nil), before any statement fails.
type schemaVersionError struct {
	what, schema string
	have, want   int
	err          error
}

func (s *schemaVersionError) Error() string {
	if s.have == 0 { // Start's check, on a schema never migrated: as an insert says it
		return notMigratedText(s.schema)
	}
	fix := fmt.Sprintf("run `gendurable migrate up --schema %s` (or migrate.Up)", s.schema)
	if s.have > s.want {
		fix = "upgrade this process's gendurable"
	}
	return fmt.Sprintf("%v: %s: schema %q is at version %d, this library needs %d; %s",
		ErrSchemaVersion, s.what, s.schema, s.have, s.want, fix)
}

func (s *schemaVersionError) Unwrap() []error {
	errs := []error{ErrSchemaVersion}
	if s.have == 0 { // Start's check, on a schema never migrated
		errs = append(errs, ErrNotMigrated)
	}
	if s.err != nil { // nil: Start's check, no statement failed
		errs = append(errs, s.err)
	}
	return errs
}

// versionReadTimeout bounds dbErr's read of the schema version.
const versionReadTimeout = 5 * time.Second

// notMigratedError says what to run instead of the database's "relation
// ... does not exist", which it still wraps.
type notMigratedError struct {
	schema string
	err    error
}

func (n *notMigratedError) Error() string { return notMigratedText(n.schema) }

// notMigratedText is ErrNotMigrated's message, the same whichever call met
// it: the call's inner name ("queue counts: ", "start: ") said nothing to
// the reader (a newcomer's probe).
func notMigratedText(schema string) string {
	return fmt.Sprintf("%v: schema %q has no gendurable tables; run `gendurable migrate up --schema %s` (or migrate.Up) first",
		ErrNotMigrated, schema, schema)
}

// Unwrap: a schema with no gendurable tables is at another version than
// the library's (none), so it is ErrSchemaVersion too, whichever call met it
// — as Start's check says it.
func (n *notMigratedError) Unwrap() []error { return []error{ErrNotMigrated, ErrSchemaVersion, n.err} }

// errorf wraps a sentinel with a formatted explanation.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
