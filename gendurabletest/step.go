package gendurabletest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/internal/testlink"
	"github.com/jackc/pgx/v5"
)

// StepOpts describe the instance a step runs for in [RunStep]. The zero
// value (or nil) is the first attempt of a fresh instance, with no signals
// and no children.
type StepOpts struct {
	ID           int64     // Run.ID; default 1
	Attempt      int       // Run.Attempt; default 0, the first run of the step
	MaxAttempts  int       // Run.MaxAttempts; default the machine's
	Queue        string    // Run.Queue; default the machine's
	Priority     int       // Run.Priority
	PartitionKey string    // Run.PartitionKey
	Token        int64     // Run.Token; default 1
	InsertedAt   time.Time // Run.InsertedAt; default now

	// Awaits, when set, makes the step one that follows an Await of these
	// names: Run.Awaited holds the Inbox signals with one of them, and a
	// Next or ScheduleChildren consumes those.
	Awaits []string
	// TimedOut makes the step one that follows an Await that timed out:
	// Run.Awaited is empty, Run.Inbox holds Inbox.
	TimedOut bool
	// Inbox holds the instance's unconsumed signals, oldest first. The
	// step sees them when it follows an Await (Awaits or TimedOut) or when
	// the machine sets Inbox, as in the engine. A zero ID is numbered
	// 1, 2, … by position; a zero At is now. See [NewSignal].
	Inbox []gendurable.Signal
	// Children makes the step one that follows ScheduleChildren: Run.Children
	// holds them.
	Children []gendurable.Child

	// Registered, when non-nil, are the machines and jobs a child of
	// ScheduleChildren may be an instance of (besides the machine itself),
	// as Config.Machines is in the engine; a child of another one is an
	// invalid outcome. Nil accepts any valid definition.
	Registered []gendurable.Definition
	// Tx, when set, is the transaction a WithTx callback runs in; an error
	// of the callback goes to Handle, as in the engine, and so does a
	// transaction the callback left aborted (RunStep sends SELECT 1 on Tx
	// after it to see); the callback's Commit or Rollback of it returns
	// [gendurable.ErrTxOwned] and does nothing, as in the engine (the test
	// ends Tx itself). Without it the
	// callback does not run (StepResult.WithTx says there is one).
	Tx pgx.Tx
	// AllowInvalidOutcome lets a step return an outcome the engine would
	// reject ([gendurable.ErrInvalidOutcome]: the zero Outcome, a Next to
	// an undeclared step, a state that does not encode …) without failing
	// the test: the result then shows what Handle made of it. So does an
	// outcome PostgreSQL refuses (a state or result holding a NUL, "\u0000",
	// which the engine fails at once, error kind outcome_rejected): the
	// result then shows the outcome as returned.
	AllowInvalidOutcome bool
}

// StepResult is what the engine would write after the step: the outcome
// the step returned or, if it failed, the one Handle returned for it.
type StepResult[S any] struct {
	// Kind is "next", "replay", "await", "children", "done" or "stop".
	Kind string
	// Step is where the instance goes on: the Next target, or the step
	// that runs after the Await or the children; the step that ran for
	// the other kinds.
	Step string
	// State is the instance's state after the outcome, as the next step
	// will decode it (Done and Stop keep the state the step got).
	State S
	// Delay before the instance runs again: Next(...).After(d), a
	// Replay's delay (for a failure, the machine's Backoff).
	Delay time.Duration
	// CountsAttempt is true for a Replay that counts an attempt (false for
	// a job's JobSnooze).
	CountsAttempt bool
	// Awaits and Timeout are an Await's signal names and deadline.
	Awaits  []string
	Timeout time.Duration
	// Children are ScheduleChildren's children, as they would be inserted.
	Children []ChildInsert
	// Consumes lists the ids of the Inbox signals a Next or
	// ScheduleChildren consumes (Done and Stop consume the whole inbox).
	Consumes []int64
	// Result is a Done's result as stored (JSON).
	Result json.RawMessage
	// Reason is a Stop's entry in the error history: the reason the step
	// gave, or for a failure the error and what stopped it.
	Reason string
	// Recorded is the entry the outcome adds to the instance's error
	// history (a Stop, a handled failure); nil if none. Its At is zero.
	Recorded *gendurable.StepError
	// Err is the error the step (or its WithTx callback) failed with and
	// Handle got — a *gendurable.PanicError if it panicked; nil if the step
	// returned an outcome.
	Err error
	// Panic is Err when the step panicked: the value and the stack.
	Panic *gendurable.PanicError
	// WithTx is true when the outcome carries a WithTx callback.
	WithTx bool
}

// ChildInsert is one child of a ScheduleChildren outcome, as the engine
// would insert it.
type ChildInsert struct {
	Machine      string
	Version      int
	Queue        string
	Step         string          // its Start step
	State        json.RawMessage // its state (a job's arguments)
	Priority     int
	MaxAttempts  int
	PartitionKey string
	UniqueKey    string
	RunAt        time.Time
	RunIn        time.Duration
}

// DecodeState unmarshals the child's state into v.
func (c ChildInsert) DecodeState(v any) error { return json.Unmarshal(c.State, v) }

// DecodeResult unmarshals a Done's result into v.
func (r *StepResult[S]) DecodeResult(v any) error { return json.Unmarshal(r.Result, v) }

// String sums the result up on one line, e.g. `next "ship"` or
// `replay in 1s after error: boom`.
func (r *StepResult[S]) String() string {
	var b strings.Builder
	b.WriteString(r.Kind)
	switch r.Kind {
	case "next", "await", "children":
		fmt.Fprintf(&b, " %q", r.Step)
	}
	if r.Delay > 0 {
		d := r.Delay
		if d >= time.Millisecond {
			d = d.Round(time.Millisecond) // a jittered backoff read "in 842.917526ms"
		}
		fmt.Fprintf(&b, " in %s", d)
	}
	if len(r.Awaits) > 0 {
		fmt.Fprintf(&b, " awaiting %s", strings.Join(r.Awaits, ", "))
	}
	if r.Timeout > 0 {
		fmt.Fprintf(&b, " for at most %s", r.Timeout)
	}
	if len(r.Children) > 0 {
		fmt.Fprintf(&b, " with %d children", len(r.Children))
	}
	if r.Result != nil {
		fmt.Fprintf(&b, " %s", clip(string(r.Result), 200))
	}
	switch {
	case r.Panic != nil:
		b.WriteString(" after a " + r.Panic.Error()) // Error survives a Value fmt cannot print
	case r.Err != nil:
		fmt.Fprintf(&b, " after error: %v", r.Err)
	case r.Kind == "stop":
		fmt.Fprintf(&b, ": %s", r.Reason)
	}
	return b.String()
}

// NewSignal builds a signal for StepOpts.Inbox, its payload encoded to JSON.
func NewSignal(tb testing.TB, name string, payload any) gendurable.Signal {
	tb.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		tb.Fatalf("gendurabletest: NewSignal %q: %v", name, err)
	}
	return gendurable.Signal{Name: name, Payload: b}
}

// RunStep runs one step of def (a machine, or a job's [gendurable.JobStep])
// for an instance with the given state, without a database, through the
// engine's own code: the state goes through JSON as it does in the row,
// a failed or panicking step goes to the machine's Handle (by default: a
// retry after Backoff, or a stop once the attempts are spent), the outcome
// is checked against the machine and the default Config limits, and
// children are encoded as inserts. It returns what the engine would write.
//
// RunStep fails the test if step is not one of the machine's steps, if an
// opts.Inbox signal has a name no engine would take ([gendurable.Engine.Signal]'s
// rules: an empty one, say), or if
// the step returns an outcome the engine would reject (an
// ErrInvalidOutcome, such as a Next to an undeclared step) or PostgreSQL
// would (a state holding a NUL), unless opts.AllowInvalidOutcome. A step that errors or panics does not fail
// the test: the result says so (Err, Panic) and shows what Handle decided.
// ctx is the step's context (with the machine's StepTimeout, if any).
//
//	res := gendurabletest.RunStep(ctx, t, Order, "charge", OrderState{Item: "book"}, nil)
//	if res.Kind != "next" || res.Step != "ship" || !res.State.Charged {
//		t.Fatalf("charge: %s", res)
//	}
func RunStep[S any](ctx context.Context, tb testing.TB, def Typed[S], step string, state S, opts *StepOpts) *StepResult[S] {
	tb.Helper()
	if ctx == nil {
		tb.Fatalf("gendurabletest: RunStep: nil context (use t.Context())")
	}
	if opts == nil {
		opts = &StepOpts{}
	}
	d, err := testlink.Describe(def)
	if err != nil {
		tb.Fatalf("gendurabletest: RunStep: %v", err)
	}
	if !slices.Contains(d.Steps, step) {
		tb.Fatalf("gendurabletest: RunStep: machine %q has no step %q (its steps: %s)", d.Name, step, strings.Join(d.Steps, ", "))
	}
	if opts.Attempt < 0 || opts.MaxAttempts < 0 {
		tb.Fatalf("gendurabletest: RunStep: negative Attempt or MaxAttempts")
	}
	// The engine stores these as int4 and int2, and refuses an insert
	// beyond them (ErrInvalidInsert); converted unchecked, a test of
	// "attempts exhausted" saw Attempt 0 for 1<<32 (a misuse probe).
	if opts.Attempt >= math.MaxInt32 || opts.MaxAttempts > math.MaxInt32 || opts.Priority < math.MinInt16 || opts.Priority > math.MaxInt16 {
		tb.Fatalf("gendurabletest: RunStep: Attempt %d, MaxAttempts %d or Priority %d out of range (Attempt below %d, MaxAttempts at most %d, Priority %d..%d, as an insert allows)",
			opts.Attempt, opts.MaxAttempts, opts.Priority, math.MaxInt32, math.MaxInt32, math.MinInt16, math.MaxInt16)
	}
	stateJSON, err := json.Marshal(state)
	if err != nil {
		tb.Fatalf("gendurabletest: RunStep: the state does not encode: %v", err)
	}
	c := sqlq.Claimed{
		ID: orDefault(opts.ID, 1), Token: orDefault(opts.Token, 1), FSM: d.Name, Version: int32(d.Version),
		Step: step, State: stateJSON, Attempt: int32(opts.Attempt),
		MaxAttempts: int32(orDefault(opts.MaxAttempts, d.MaxAttempts)), Priority: int16(opts.Priority),
		Awaits: opts.Awaits, InsertedAt: orDefault(opts.InsertedAt, time.Now()),
	}
	if opts.TimedOut {
		c.Awaits = []string{}
	}
	if opts.PartitionKey != "" {
		k := opts.PartitionKey
		c.PartitionKey = &k
	}
	now := time.Now()
	for i, s := range opts.Inbox {
		payload := s.Payload
		if payload == nil {
			payload = json.RawMessage("null")
		}
		c.Inbox = append(c.Inbox, sqlq.SignalRow{ID: orDefault(s.ID, int64(i+1)), Name: s.Name, Payload: payload, InsertedAt: orDefault(s.At, now)})
	}
	in := testlink.StepInput{Claim: c, Queue: orDefault(opts.Queue, d.Queue)}
	for _, ch := range opts.Children {
		in.Children = append(in.Children, sqlq.ChildRow{ID: ch.ID, FSM: ch.Machine, Version: int32(ch.Version),
			Step: ch.Step, Status: string(ch.Status), Result: ch.Result, FinishedAt: ch.FinishedAt})
	}
	in.Claim.Children = int32(len(in.Children))
	if opts.Registered != nil {
		in.Registered = []any{}
		for _, r := range opts.Registered {
			in.Registered = append(in.Registered, r)
		}
	}

	out, err := testlink.RunStep(ctx, def, in)
	if err != nil {
		tb.Fatalf("gendurabletest: RunStep: %v", err)
	}
	res := &StepResult[S]{WithTx: out.TxFn != nil}
	if out.TxFn != nil && opts.Tx != nil {
		if txErr := out.TxFn(ctx, ownedTx{opts.Tx}); txErr != nil {
			out = out.Handle(ctx, txErr)
		} else if endErr := executor.EndedByCallback(opts.Tx); endErr != nil {
			out = out.Handle(ctx, endErr) // as the engine fails the step
		} else if _, err := opts.Tx.Exec(ctx, "SELECT 1"); err != nil {
			// What the engine's outcome statement would find: a statement
			// of the callback's failed and it returned nil.
			if stepErr := executor.AbortedByCallback(err, nil); stepErr != nil {
				out = out.Handle(ctx, stepErr)
			}
		}
	}
	if errors.Is(out.StepErr, gendurable.ErrInvalidOutcome) && !opts.AllowInvalidOutcome {
		tb.Fatalf("gendurabletest: step %q of machine %q returned an outcome the engine rejects: %v", step, d.Name, out.StepErr)
	}
	if out.Rejected != "" && !opts.AllowInvalidOutcome {
		tb.Fatalf("gendurabletest: step %q of machine %q returned an outcome PostgreSQL refuses (the engine fails the instance, error kind outcome_rejected): its %s",
			step, d.Name, out.Rejected)
	}
	if err := fill(res, &out.Out, step, opts.Attempt, stateJSON); err != nil {
		tb.Fatalf("gendurabletest: RunStep: %v", err)
	}
	res.Err = out.StepErr
	errors.As(out.StepErr, &res.Panic)
	return res
}

// fill describes the encoded outcome o in r.
func fill[S any](r *StepResult[S], o *sqlq.Outcome, step string, attempt int, state []byte) error {
	r.Kind, r.Step, r.Delay, r.Consumes = o.Kind.String(), step, o.Delay, o.Consume
	r.CountsAttempt = o.Kind == sqlq.KindReplay && o.AttemptInc > 0
	if o.Step != nil {
		r.Step = *o.Step
	}
	if o.State != nil {
		state = []byte(*o.State)
	}
	if err := json.Unmarshal(state, &r.State); err != nil {
		return fmt.Errorf("the outcome's state does not decode into %T: %w", r.State, err)
	}
	if o.Awaits != nil {
		if err := json.Unmarshal([]byte(*o.Awaits), &r.Awaits); err != nil {
			return err
		}
	}
	if o.Timeout != nil {
		r.Timeout = *o.Timeout
	}
	if o.Result != nil {
		r.Result = json.RawMessage(*o.Result)
	}
	if o.ErrKind != nil && o.Err != nil {
		r.Recorded = &gendurable.StepError{Step: step, Attempt: attempt, Kind: *o.ErrKind, Error: *o.Err}
		if o.Kind == sqlq.KindStop {
			r.Reason = *o.Err
		}
	}
	for _, ch := range o.Children {
		ci := ChildInsert{Machine: ch.FSM, Version: int(ch.Version), Queue: ch.Queue, Step: ch.Step,
			State: json.RawMessage(ch.State), Priority: int(ch.Priority), MaxAttempts: int(ch.MaxAttempts),
			UniqueKey: string(ch.UniqueKey), RunIn: ch.RunIn}
		if ch.PartitionKey != nil {
			ci.PartitionKey = *ch.PartitionKey
		}
		if ch.RunAt != nil {
			ci.RunAt = *ch.RunAt
		}
		r.Children = append(r.Children, ci)
	}
	return nil
}

// orDefault is v, or d when v is the zero value.
func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// ownedTx is the transaction a WithTx callback gets in RunStep: as the
// engine's, it refuses to be committed or rolled back by the callback.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return gendurable.ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return gendurable.ErrTxOwned }
