package gendurable

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// StepFunc runs one step of an instance. It returns exactly one outcome, or an
// error, which is handed to the machine's Handle. It runs outside any
// database transaction; ctx is cancelled (context.Cause says why) when the
// engine stops, after its drain timeout ([ErrEngineStopped]); when the
// machine's StepTimeout passes ([ErrStepTimeout]); or when the step's lease
// is lost or cannot be confirmed in time ([ErrLeaseLost]) — an operator's
// [Engine.Cancel] among the reasons: through the engine running the step,
// at once ([ErrInstanceCancelled], an ErrLeaseLost too); through another,
// seen at the worker's next heartbeat.
type StepFunc[S any] func(ctx context.Context, r *Run[S]) (Outcome, error)

// HandleFunc decides what happens after a step returned an error or
// panicked (err is then a *PanicError). If Handle itself errors, panics or
// returns an invalid outcome, the instance is stopped.
//
// Handle runs in the worker that ran the step, before its outcome is
// written, so it can run for a step whose claim was taken away without the
// worker knowing yet: an operator's Cancel through another engine, or a
// lease the reaper took back, is learned at the worker's next heartbeat. Its outcome is then
// fenced out like the step's, but what Handle does itself (an alert, a
// refund) is done; fence such effects with [Run.Token] as a step would. A
// step whose context the engine already cancelled for a lost lease or a
// shutdown does not reach Handle.
type HandleFunc[S any] func(ctx context.Context, r *Run[S], err error) (Outcome, error)

// Machine defines a durable finite-state machine whose state is a value of
// type S, stored as JSON in the instance row. Register it in
// [Config.Machines]; insert instances with [Machine.New] and [Engine.Insert].
//
//	var Order = &gendurable.Machine[OrderState]{
//		Name:  "order",
//		Start: "reserve",
//		Steps: map[string]gendurable.StepFunc[OrderState]{
//			"reserve": func(ctx context.Context, r *gendurable.Run[OrderState]) (gendurable.Outcome, error) {
//				return r.Next("charge", r.State), nil
//			},
//			"charge": ...,
//		},
//	}
//
// The state is decoded with encoding/json: a number held in an interface
// (S any, map[string]any, a field of type any) decodes as a float64, so an
// integer beyond 2^53 (a 64-bit id) comes back rounded — 9007199254740993
// as 9007199254740992 — and the next outcome that passes r.State on stores
// it so. Give such numbers a typed field (int64, or json.Number). Only what
// encoding/json writes is stored: a struct S with fields, none of which it
// writes (all unexported, or tagged "-") and no MarshalJSON, is refused
// with [ErrInvalidConfig] — its every state would be stored as {} — and so
// is one embedding a pointer to an unexported struct, which encoding/json
// writes and cannot decode back.
//
// A Machine must not be modified once an engine uses it. One that was
// refused (by [New], an insert or [Machine.ValidateOutcome]) is checked
// again at its next use, so it may be completed after the refusal.
type Machine[S any] struct {
	// Name identifies the machine in the database (the fsm column). Required.
	Name string
	// Version of the machine; rows run on the version they were inserted
	// with, and several versions may be registered side by side. Default 1,
	// at most math.MaxInt32 (a PostgreSQL int).
	Version int
	// Queue new instances go to unless InsertOpts says otherwise.
	// Default "default".
	Queue string
	// Start is the step a new instance begins at. Required; must be a key of Steps.
	Start string
	// Steps maps each step name to its code. Every step an outcome names
	// must be declared here. Required, non-empty. A row at a step this map
	// no longer has (a deploy removed it without a new Version) runs into an
	// [ErrInvalidOutcome] ("step … is not declared"), handed to Handle with
	// Run.Step the old name — a Handle may move such rows on with Next —
	// and by default retried with Backoff until its attempts are spent.
	Steps map[string]StepFunc[S]
	// Handle decides the outcome after a failed step. Default: replay with
	// exponential backoff and jitter (see Backoff) until MaxAttempts, then
	// stop; an error wrapped with [JobCancel] stops at once ("cancelled"),
	// and a [JobSnooze] replays after its delay without counting an attempt,
	// as for a job. The default's replay keeps the state as stored, byte for byte
	// (a Replay of r.State would store it re-encoded through this
	// binary's S, without the fields it does not know).
	Handle HandleFunc[S]
	// MaxAttempts is the default attempt budget of new instances: handled
	// failures and expired leases both count (not the lease of a prefetched
	// claim whose step never started: see [QueueConfig].Prefetch), and so do the step's own
	// Replays, which the budget does not stop (see [Run.Replay]). Default 20.
	// The default Handle stops an instance whose budget is spent; a Handle
	// of your own owns it: one that replays whatever Run.Attempt says runs
	// the step past MaxAttempts for as long as it fails (an expired lease
	// past the budget still fails the instance).
	MaxAttempts int
	// Backoff gives the delay before retry number attempt+1 for the default
	// Handle. Default: 1s·2^attempt with jitter, capped at one hour. Where
	// it panics or returns a negative delay, the default's delay is used.
	Backoff func(attempt int) time.Duration
	// Inbox, when true, hands every step the instance's whole inbox
	// ([Run.Inbox]); without it only a step that follows an Await gets it.
	// Either way the signals come with the statement that claimed the row
	// (no statement of their own): those committed before the claim.
	Inbox bool
	// StepTimeout bounds one run of a step and of the Handle that follows
	// a failure (not a WithTx callback: that runs as part of the commit).
	// When it passes, the step's context is cancelled with cause
	// [ErrStepTimeout] and the error the step returns goes to Handle (by
	// default: retry with backoff, counting an attempt). A step that
	// ignores its context and is still running min(StepTimeout, 10s)
	// later is abandoned: the engine stops heartbeating it, writes its
	// outcome itself (a retry after Backoff, or a Stop once the attempts
	// are spent; Handle is not asked, error kind "timeout"), discards
	// whatever it returns later, and reports it with a
	// [StepAbandonedEvent] and an error log. Go cannot stop a goroutine, so
	// it keeps one of the queue's Concurrency slots until it returns (a
	// feeder started anew after Stop does not count it); while abandoned
	// steps hold every slot, the process claims nothing of that queue and
	// hands back what it had claimed ahead, so other processes run it (its
	// own retry included). Its key's slot
	// goes with the outcome the engine writes, so a successor of its key
	// may start while it still runs: fence its writes with [Run.Token]
	// (docs/design.md §6). Default 0: no timeout (a step runs as long as
	// its worker heartbeats); a positive value under 1ms is
	// [ErrInvalidConfig] (a Duration counts nanoseconds).
	StepTimeout time.Duration
	// Flow, when not empty, declares the machine's transitions: for each
	// step listed, the steps its outcomes may name and the kinds it may
	// return (see [FlowStep]). [New] checks that every name is one of
	// Steps ([*UnknownStepError] otherwise); at run time an outcome that
	// breaks it fails the instance at once with a [*TransitionError]
	// (kind "transition" in its history) instead of being retried; and
	// [Machine.ValidateOutcome] lets a test check an outcome the same way.
	// The dashboard draws the declared transitions, and its steps in this
	// order (Start first, then the Flow's order, then the rest by name).
	// Steps not listed are not checked. Default: empty, nothing is
	// checked and the steps are drawn Start first, then by name.
	Flow []FlowStep

	mu   sync.Mutex                  // serializes the builds
	core atomic.Pointer[machineCore] // built at the first use that finds the definition valid
}

// Run is what a step sees of its instance.
type Run[S any] struct {
	ID           int64     // instance id
	Machine      string    // machine name
	Version      int       // machine version the row runs on
	Queue        string    // queue it was claimed from
	Step         string    // the step being run
	Attempt      int       // 0 on the first run of this step; +1 per replay or expired lease (see Instance.Attempt)
	MaxAttempts  int       // attempt budget of the instance
	Priority     int       // lower runs first
	PartitionKey string    // "" when the instance has none
	InsertedAt   time.Time // when the instance was inserted
	// Token is this run's claim token: the fencing token of the claim (and,
	// for a keyed instance, of its key's slot). Every claim draws a larger
	// one, across a reinstall of the schema (migrate down, then up) too, so
	// a resource the step writes to outside this database can refuse a
	// write that carries a token smaller than the last it accepted — the
	// write of a step that ran past its lease while a successor took over
	// (docs/design.md §6; example in the README).
	Token int64
	// State is the instance's state, decoded from the row. Outcomes take the
	// next state by value; changing State in place has no effect unless it is
	// passed to one.
	State S
	// Awaited holds, for a step that follows an Await, the unconsumed
	// signals whose name it awaited, oldest first — empty if the await timed
	// out. A Next or ScheduleChildren consumes exactly these.
	Awaited []Signal
	// Inbox holds every unconsumed signal (loaded after an Await, or for
	// every step when the machine sets Inbox).
	Inbox []Signal
	// Children holds, for a step that follows ScheduleChildren, the
	// instance's children with their final statuses and results.
	Children []Child

	// seen is, for a step woken by its await's timeout, the ids of the
	// signals the step that parked had received: an Await from this step
	// does not count those still in Inbox as new.
	seen []int64
}

// Signal is a durable message delivered to an instance.
type Signal struct {
	ID      int64
	Name    string
	Payload json.RawMessage // JSON; "null" when sent without one
	At      time.Time       // when it was sent (database clock)
}

// Decode unmarshals the signal's payload into v.
func (s Signal) Decode(v any) error { return json.Unmarshal(s.Payload, v) }

// Child is one child instance as its parent sees it.
type Child struct {
	ID      int64           `json:"id"`
	Machine string          `json:"machine"`
	Version int             `json:"version"`
	Step    string          `json:"step"`
	Status  Status          `json:"status"`
	Result  json.RawMessage `json:"result,omitempty"` // the child's Done result
	// ResultLeftOut, above 0, is the length in bytes (as JSON text) of a
	// result [DescribeOptions].ValueBytes left out: Result is then nil.
	// Run.Children leaves it 0.
	ResultLeftOut int        `json:"result_left_out,omitempty"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	// InsertedAt is when the child was scheduled. Set by [Engine.Describe]
	// (InstanceDetail.Children); Run.Children leaves it zero.
	InsertedAt time.Time `json:"inserted_at,omitzero"`
}

// Definition is a registered machine or job: a *Machine[S] or a *Job[T].
type Definition interface {
	definition() (*machineCore, error)
}

// machineCore is the untyped face of a machine: what validation, inserts
// and the admin API need, and the executor's Definition built from it.
type machineCore struct {
	name        string
	version     int
	queue       string
	start       string
	steps       map[string]bool
	order       []string             // the steps as the graph lists them: Start, Flow order, the rest by name
	flow        map[string]*flowRule // declared transitions by step; nil: none declared
	maxAttempts int
	encode      func(state any) (string, error) // checks the dynamic type is S
	readsInbox  bool                            // every step gets the inbox, not only one after an await
	stepTimeout time.Duration                   // 0: none
	backoff     func(attempt int) time.Duration // retry delay of the default Handle
	exec        func(ctx context.Context, in *execInput) executor.Result
	handleErr   func(ctx context.Context, in *execInput, err error) executor.Result
}

// execInput is a step run's input: what the executor hands over, and the
// engine's limits and child encoder for the outcome.
type execInput struct {
	*executor.Input
	limits   jsonLimits // of the outcome's state and result
	newChild func(InsertParams) (sqlq.NewInstance, error)
	// direct: user code runs on the caller's goroutine, uncontained
	// (gendurabletest.RunStep: a t.Fatal in the step is the test's own, and
	// must stop the test there).
	direct bool
}

// executorDefinition is core as the executor runs it, with this engine's
// limits and child encoder.
func (core *machineCore) executorDefinition(limits jsonLimits, newChild func(InsertParams) (sqlq.NewInstance, error)) *executor.Definition {
	in := func(x *executor.Input) *execInput { return &execInput{Input: x, limits: limits, newChild: newChild} }
	return &executor.Definition{
		StepTimeout: core.stepTimeout,
		ReadsInbox:  core.readsInbox,
		Backoff:     core.retryDelay,
		Run:         func(ctx context.Context, x *executor.Input) executor.Result { return core.exec(ctx, in(x)) },
		Handle: func(ctx context.Context, x *executor.Input, err error) executor.Result {
			return core.handleErr(ctx, in(x), err)
		},
	}
}

func (m *Machine[S]) definition() (*machineCore, error) {
	if m == nil {
		var zero S
		return nil, errorf(ErrInvalidConfig, "nil *Machine[%T]", zero)
	}
	if core := m.core.Load(); core != nil {
		return core, nil // every use after the first: no lock
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if core := m.core.Load(); core != nil {
		return core, nil
	}
	// A refusal is not kept: no engine uses a machine that was refused, so
	// one completed after it (its Steps set in an init func, after a
	// package-level insert or ValidateOutcome had met it half built) is
	// built then. Kept, the first refusal ("declares no Steps") came back
	// from every later New, Insert and ValidateOutcome (an API probe).
	core, err := m.build()
	if err != nil {
		return nil, err
	}
	m.core.Store(core)
	return core, nil
}

func (m *Machine[S]) build() (*machineCore, error) {
	if p := nameProblem(m.Name); p != "" {
		return nil, fmt.Errorf("%w: machine Name %s %s", ErrInvalidConfig, quoted(m.Name), p)
	}
	if p := nameProblem(orDefault(m.Queue, DefaultQueue)); p != "" {
		return nil, fmt.Errorf("%w: machine %q: Queue %s %s", ErrInvalidConfig, m.Name, quoted(m.Queue), p)
	}
	if m.Version < 0 {
		return nil, fmt.Errorf("%w: machine %q: negative Version", ErrInvalidConfig, m.Name)
	}
	if m.Version > math.MaxInt32 {
		// Stored as a PostgreSQL int: larger ones wrapped around on insert.
		return nil, fmt.Errorf("%w: machine %q: Version %d is more than %d", ErrInvalidConfig, m.Name, m.Version, math.MaxInt32)
	}
	if m.MaxAttempts < 0 || m.StepTimeout < 0 {
		return nil, fmt.Errorf("%w: machine %q: negative MaxAttempts or StepTimeout", ErrInvalidConfig, m.Name)
	}
	if m.MaxAttempts > math.MaxInt32 {
		// Stored as a PostgreSQL int: larger ones were cut to their low
		// 32 bits on insert (2³²+1 stored as 1).
		return nil, fmt.Errorf("%w: machine %q: MaxAttempts %d is more than %d", ErrInvalidConfig, m.Name, m.MaxAttempts, math.MaxInt32)
	}
	if err := belowFloor(fmt.Sprintf("machine %q: ", m.Name), time.Millisecond, map[string]time.Duration{"StepTimeout": m.StepTimeout}); err != nil {
		return nil, err
	}
	if len(m.Steps) == 0 {
		return nil, fmt.Errorf("%w: machine %q declares no Steps", ErrInvalidConfig, m.Name)
	}
	if t, e := reflect.TypeFor[S](), unsettableEmbed(reflect.TypeFor[S](), 0); e != nil {
		// encoding/json writes its fields but cannot decode them back:
		// every step of a row that had it set would fail to decode.
		return nil, fmt.Errorf("%w: machine %q: state type %s embeds %s, a pointer to an unexported struct, which "+
			"encoding/json cannot decode into: embed it by value, or export its type", ErrInvalidConfig, m.Name, t, e)
	}
	if t := reflect.TypeFor[S](); hidesEverything(t) {
		// Stored as {}: every insert and every step's state would be lost
		// without a word (a newcomer's probe: type Order struct{ item string }).
		return nil, fmt.Errorf("%w: machine %q: state type %s has no field JSON stores (none exported, none tagged "+
			"otherwise, no MarshalJSON): its state would be stored as {}; export its fields", ErrInvalidConfig, m.Name, t)
	}
	if len(m.Steps) > MaxSteps {
		return nil, fmt.Errorf("%w: machine %q declares %d Steps, more than %d", ErrInvalidConfig, m.Name, len(m.Steps), MaxSteps)
	}
	steps := make(map[string]bool, len(m.Steps))
	for name, fn := range m.Steps {
		if fn == nil {
			return nil, fmt.Errorf("%w: machine %q: step %q has a nil func", ErrInvalidConfig, m.Name, name)
		}
		if p := nameProblem(name); p != "" {
			return nil, fmt.Errorf("%w: machine %q: step name %s %s", ErrInvalidConfig, m.Name, quoted(name), p)
		}
		steps[name] = true
	}
	if !steps[m.Start] {
		return nil, fmt.Errorf("%w: machine %q: Start step %q is not one of its Steps %v", ErrInvalidConfig, m.Name, m.Start, sortedKeys(steps))
	}
	flow, order, err := buildFlow(m.Name, orDefault(m.Version, 1), m.Start, steps, m.Flow)
	if err != nil {
		return nil, err
	}
	backoff := m.Backoff
	if backoff == nil {
		backoff = DefaultBackoff
	}
	return &machineCore{
		name:        m.Name,
		version:     orDefault(m.Version, 1),
		queue:       orDefault(m.Queue, DefaultQueue),
		start:       m.Start,
		steps:       steps,
		order:       order,
		flow:        flow,
		maxAttempts: orDefault(m.MaxAttempts, DefaultMaxAttempts),
		encode:      encodeTyped[S],
		readsInbox:  m.Inbox,
		stepTimeout: m.StepTimeout,
		backoff:     backoff,
		exec:        m.exec,
		handleErr:   m.handleErr,
	}, nil
}

// New prepares a new instance starting at the machine's Start step with the
// given state, for [Engine.Insert] and [Engine.InsertMany].
func (m *Machine[S]) New(state S) InsertParams {
	return InsertParams{def: m, state: state}
}

// newRun builds the step's view of its instance; it fails only when the
// stored state does not decode.
func (m *Machine[S]) newRun(in *execInput) (*Run[S], error) {
	c := in.Claim
	r := &Run[S]{
		ID: c.ID, Machine: c.FSM, Version: int(c.Version), Queue: in.Queue, Step: c.Step,
		Attempt: int(c.Attempt), MaxAttempts: int(c.MaxAttempts), Priority: int(c.Priority),
		InsertedAt: c.InsertedAt, Token: c.Token,
	}
	if c.PartitionKey != nil {
		r.PartitionKey = *c.PartitionKey
	}
	if err := safely(func() error { return json.Unmarshal(c.State, &r.State) }); err != nil {
		return nil, fmt.Errorf("%w into %T: %v", ErrStateDecode, r.State, err)
	}
	for _, sr := range in.Inbox {
		sig := Signal{ID: sr.ID, Name: sr.Name, Payload: sr.Payload, At: sr.InsertedAt}
		if sig.Payload == nil {
			sig.Payload = json.RawMessage("null") // sent without one (stored as NULL)
		}
		r.Inbox = append(r.Inbox, sig)
		if slices.Contains(c.Awaits, sr.Name) {
			r.Awaited = append(r.Awaited, sig)
		}
	}
	if c.Awaits != nil && len(c.Awaits) == 0 {
		r.seen = c.Seen // woken by its timeout
	}
	for _, cr := range in.Children {
		r.Children = append(r.Children, Child{ID: cr.ID, Machine: cr.FSM, Version: int(cr.Version),
			Step: cr.Step, Status: Status(cr.Status), Result: cr.Result, FinishedAt: cr.FinishedAt})
	}
	return r, nil
}

// exec decodes the state, runs the step and, on failure, Handle, and encodes
// the resulting outcome. It never returns without an outcome to apply.
func (m *Machine[S]) exec(ctx context.Context, in *execInput) executor.Result {
	r, err := m.newRun(in)
	if err != nil {
		// Stored data will not decode on a retry either: stop with the reason.
		return stopResult("state_decode", err.Error(), err)
	}
	var out Outcome
	fn := m.Steps[in.Claim.Step]
	if fn == nil {
		err = fmt.Errorf("%w: step %q is not declared by machine %q version %d", ErrInvalidOutcome, in.Claim.Step, m.Name, m.core.Load().version)
	} else {
		out, err = callStep(in.direct, func() (Outcome, error) { return fn(ctx, r) })
	}
	if err != nil && errors.Is(context.Cause(ctx), ErrStepTimeout) && !errors.Is(err, ErrStepTimeout) {
		err = fmt.Errorf("%w (%s): %w", ErrStepTimeout, m.core.Load().stepTimeout, err)
	}
	if err == nil {
		if terr := m.core.Load().checkFlow(in.Claim.Step, out); terr != nil {
			// A declared transition broken is a bug in the step's code: the
			// same code would return it again, so no retry (docs/design.md §9).
			return stopResult("transition", terr.Error(), terr)
		}
	}
	var enc sqlq.Outcome
	if err == nil {
		err = safely(func() (err error) { enc, err = m.encodeOutcome(out, r, in); return err })
		if err != nil && out.final {
			// A job's result that cannot be stored: its work is done, and
			// another attempt would only run it again (Job.PerformResult).
			return stopResult("stop", "PerformResult's result cannot be stored: "+err.Error(), err)
		}
	}
	if err == nil {
		return executor.Result{Out: enc, TxFn: safeTx(out.txFn, in.direct), StepErr: out.snoozeErr}
	}
	res := m.handle(ctx, r, in, err)
	// A step this process does not declare is likely declared by another
	// version of the code, running beside it in a rolling deploy: its retry
	// is left to the poll of every process rather than woken here first.
	// A Handle that moves the row on to a step declared here (design §9)
	// is woken as usual.
	res.NoLocalWake = fn == nil && (res.Out.Step == nil || m.Steps[*res.Out.Step] == nil)
	return res
}

// handleErr runs the failure path for an error found after the step
// returned (a WithTx callback that failed).
func (m *Machine[S]) handleErr(ctx context.Context, in *execInput, stepErr error) executor.Result {
	r, err := m.newRun(in)
	if err != nil {
		return stopResult("state_decode", err.Error(), err)
	}
	return m.handle(ctx, r, in, stepErr)
}

// handle asks Handle what to do after stepErr and encodes its answer.
func (m *Machine[S]) handle(ctx context.Context, r *Run[S], in *execInput, stepErr error) executor.Result {
	if cause := context.Cause(ctx); errors.Is(cause, ErrEngineStopped) || errors.Is(cause, ErrLeaseLost) {
		// The engine cancelled the step — at shutdown, or because no
		// heartbeat confirmed its lease in time (a slow or unreachable
		// database, a row another session held locked): not the step's
		// fault, so no attempt is counted and Handle is not asked. It runs
		// again as is. (If the claim no longer holds, the fence drops this.)
		why := "interrupted by engine shutdown: "
		switch {
		case errors.Is(cause, ErrInstanceCancelled):
			why = "interrupted: its instance was cancelled: "
		case errors.Is(cause, ErrLeaseLost):
			why = "interrupted: its lease could not be confirmed in time: "
		}
		if !errors.Is(stepErr, cause) {
			// A step (or pgx within it) returns ctx.Err(), context.Canceled:
			// say why, for the log and the hooks (StepEvent.Err).
			stepErr = fmt.Errorf("%w (%w)", stepErr, cause)
		}
		return executor.Result{
			Out: sqlq.Outcome{Kind: sqlq.KindReplay, AttemptInc: 0,
				ErrKind: strPtr("interrupted"), Err: strPtr(truncate(why + stepErr.Error()))},
			StepErr: stepErr,
		}
	}
	handle := m.Handle
	if handle == nil {
		handle = m.defaultHandle
	}
	out, err := callStep(in.direct, func() (Outcome, error) { return handle(ctx, r, stepErr) })
	var enc sqlq.Outcome
	if err == nil && out.txFn != nil {
		err = fmt.Errorf("%w: Handle may not return a WithTx outcome", ErrInvalidOutcome)
	}
	if err == nil {
		if terr := m.core.Load().checkFlow(r.Step, out); terr != nil {
			// The failure is Handle's broken Flow, but the step's error (a
			// panic's stack included) is what an operator debugs: keep both.
			cause := fmt.Errorf("%w; Handle's outcome: %w", stepErr, terr)
			res := stopResult("transition", cause.Error(), cause)
			res.Out.ErrStack = errStack(stepErr)
			return res
		}
	}
	if err == nil {
		err = safely(func() (err error) { enc, err = m.encodeOutcome(out, r, in); return err })
	}
	if err != nil {
		// The event and the log carry Handle's failure too, as the row does.
		cause := fmt.Errorf("%w; Handle failed: %w", stepErr, err)
		res := stopResult(errKind(stepErr), cause.Error(), cause)
		if res.Out.ErrStack = errStack(stepErr); res.Out.ErrStack == nil {
			res.Out.ErrStack = errStack(err) // Handle itself panicked
		}
		return res
	}
	msg := stepErr.Error()
	if out.kind == sqlq.KindStop {
		msg = fmt.Sprintf("%s; stopped: %s", stepErr, out.reason)
	}
	enc.ErrKind, enc.Err, enc.ErrStack = strPtr(errKind(stepErr)), strPtr(truncate(msg)), errStack(stepErr)
	return executor.Result{Out: enc, StepErr: stepErr}
}

func (m *Machine[S]) defaultHandle(_ context.Context, r *Run[S], err error) (Outcome, error) {
	// JobCancel and JobSnooze from a machine's step mean what they mean
	// from a job's Perform (a River user's probe: they were retried as
	// plain errors, each counting an attempt).
	var cancel *CancelError
	if errors.As(err, &cancel) {
		return Stop("not retried"), nil
	}
	var snooze *SnoozeError
	if errors.As(err, &snooze) && snooze.Delay >= 0 {
		o := replayAsStored(snooze.Delay)
		o.snooze = true
		return o, nil
	}
	if r.Attempt+1 >= r.MaxAttempts {
		return Stop(fmt.Sprintf("attempts exhausted (%d of %d)", r.Attempt+1, r.MaxAttempts)), nil
	}
	// The stored state, not r.State re-encoded: this worker may be failing
	// at a step only a newer deploy declares, whose state has fields this
	// S lacks (TestTheDefaultRetryKeepsTheStoredState).
	return replayAsStored(m.core.Load().retryDelay(r.Attempt)), nil
}

// retryDelay is the machine's Backoff for attempt, or DefaultBackoff's
// where the user's panics or returns a negative delay (which Replay
// refuses: the instance would fail at its first error, attempts left).
func (core *machineCore) retryDelay(attempt int) time.Duration {
	d := DefaultBackoff(attempt)
	_ = safely(func() error {
		if u := core.backoff(attempt); u >= 0 {
			d = u
		}
		return nil
	})
	return d
}

// encodeOutcome validates o for this machine and encodes it for the database.
func (m *Machine[S]) encodeOutcome(o Outcome, r *Run[S], in *execInput) (sqlq.Outcome, error) {
	if err := m.core.Load().checkOutcome(r.Step, o); err != nil {
		return sqlq.Outcome{}, err
	}
	enc := sqlq.Outcome{Delay: o.delay}
	switch o.kind {
	case sqlq.KindNext:
		enc.Kind, enc.Step = sqlq.KindNext, strPtr(o.step)
		consumeAwaited(&enc, r.Awaited)
	case sqlq.KindAwait:
		enc.Kind, enc.Step = sqlq.KindAwait, strPtr(o.step)
		names, _ := json.Marshal(o.awaits)
		enc.Awaits = strPtr(string(names))
		if o.timeout > 0 {
			t := o.timeout
			enc.Timeout = &t
		}
		// Signals the step already received do not wake it again at once:
		// re-awaiting after a wake parks until a new matching one arrives.
		// A step its timeout woke received none, but the one that parked
		// had received r.seen (the row kept their ids, migration 018):
		// those still unconsumed are no newer for it. The row keeps the ids
		// for the step a timeout of this await wakes.
		seen := r.Awaited
		if len(seen) == 0 && len(r.seen) > 0 {
			was := make(map[int64]bool, len(r.seen))
			for _, id := range r.seen {
				was[id] = true
			}
			for _, sig := range r.Inbox {
				if was[sig.ID] {
					seen = append(seen, sig)
				}
			}
		}
		if len(seen) > 0 {
			counts, ids := map[string]int{}, make([]int64, 0, len(seen))
			for _, sig := range seen {
				counts[sig.Name]++
				ids = append(ids, sig.ID)
			}
			b, _ := json.Marshal(counts)
			enc.InboxDec = strPtr(string(b))
			b, _ = json.Marshal(ids)
			enc.Seen = strPtr(string(b))
		}
	case sqlq.KindChildren:
		enc.Kind, enc.Step = sqlq.KindChildren, strPtr(o.step)
		consumeAwaited(&enc, r.Awaited)
		for i, p := range o.children {
			child, err := in.newChild(p)
			if err != nil {
				return sqlq.Outcome{}, fmt.Errorf("%w: child #%d: %w", ErrInvalidOutcome, i, err)
			}
			enc.Children = append(enc.Children, child)
		}
	case sqlq.KindReplay:
		enc.Kind, enc.AttemptInc = sqlq.KindReplay, 1
		if o.snooze {
			enc.AttemptInc = 0
		}
	case sqlq.KindDone:
		enc.Kind = sqlq.KindDone
		b, err := json.Marshal(o.result)
		if err != nil {
			return sqlq.Outcome{}, fmt.Errorf("%w: Done result: %v", ErrInvalidOutcome, err)
		}
		if err := checkJSON(in.limits, "Done result", b); err != nil {
			return sqlq.Outcome{}, fmt.Errorf("%w: %w", ErrInvalidOutcome, err)
		}
		enc.Result = strPtr(string(b))
	case sqlq.KindStop:
		enc.Kind = sqlq.KindStop
		enc.ErrKind, enc.Err = strPtr("stop"), strPtr(truncate(o.reason))
	}
	if o.hasState {
		s, err := encodeTyped[S](o.state)
		if err != nil {
			return sqlq.Outcome{}, fmt.Errorf("%w: %v", ErrInvalidOutcome, err)
		}
		if err := checkJSON(in.limits, "state", s); err != nil {
			return sqlq.Outcome{}, fmt.Errorf("%w: %w", ErrInvalidOutcome, err)
		}
		enc.State = &s
	}
	return enc, nil
}

// checkOutcome checks an outcome against its machine's steps before it is
// encoded (a Next to a step that does not exist, bad delays or await
// names): such an error goes to Handle like a step's error. The machine's
// declared Flow is checked before it, by checkFlow, and fails the instance
// at once. The engine and gendurabletest.RunStep both go through exec, so
// both rules hold in both (TestRunStepUndeclaredTransitionFailsTheTest).
func (core *machineCore) checkOutcome(_ string, o Outcome) error {
	return o.validate(core.steps)
}

// consumeAwaited makes a progressing outcome consume exactly the awaited
// signals the step received: a same-name signal that arrived after the step
// loaded its inbox survives.
func consumeAwaited(enc *sqlq.Outcome, awaited []Signal) {
	if len(awaited) == 0 {
		return
	}
	counts := map[string]int{}
	for _, s := range awaited {
		enc.Consume = append(enc.Consume, s.ID)
		counts[s.Name]++
	}
	dec, _ := json.Marshal(counts)
	enc.InboxDec = strPtr(string(dec))
}

// encodeTyped encodes a state that must be of type S.
func encodeTyped[S any](state any) (string, error) {
	s, ok := state.(S)
	var zero S
	if !ok && state == nil && any(zero) == nil {
		// S is an interface type (Machine[any]): a nil state is its zero
		// value, which the assertion cannot tell from a missing one.
		s, ok = zero, true
	}
	if !ok {
		return "", fmt.Errorf("%w: state is %T, the machine's state type is %T", ErrStateEncode, state, zero)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrStateEncode, err)
	}
	return string(b), nil
}

// callStep runs fn — a step, or Handle — turning a panic, or (in a test
// binary, unless direct) a call of runtime.Goexit, into a *PanicError.
func callStep(direct bool, fn func() (Outcome, error)) (out Outcome, err error) {
	if p := userCode(direct, func() { out, err = callRecovered(fn) }); p != nil {
		return Outcome{}, p
	}
	return out, err
}

// userCode runs fn, which recovers its own panics: on the caller's
// goroutine, or contained in a test binary unless direct, a Goexit in it
// then coming back as a *PanicError (nil if fn returned).
func userCode(direct bool, fn func()) *PanicError {
	if !inTest || direct {
		fn()
		return nil
	}
	if stack, exited := contained(fn); exited {
		return &PanicError{Value: goexitValue, Stack: stack}
	}
	return nil
}

// inTest is whether this is a test binary (testing.Testing). There, and
// only there, user code runs contained: runtime.Goexit is what t.FailNow,
// t.Fatal, t.SkipNow and testify's require call, and a test that runs a
// real engine meets it in its steps. Containing it costs a goroutine per
// call (2.5–3 µs against 40 ns on the 2-core machine of BENCHMARKS.md:
// `go test . -run X -bench CallStep`), which a production step does not
// pay for a call it does not make.
var inTest = testing.Testing()

func callRecovered(fn func() (Outcome, error)) (out Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = Outcome{}, &PanicError{Value: v, Stack: string(debug.Stack())}
		}
	}()
	out, err = fn()
	return out, saneError(err)
}

// saneError is err, unless its Error method panics — a typed nil pointer
// returned as an error, whose method reads its receiver, is the usual
// case: then an error that says so. The engine formats a step's error for
// the row, the log and the hooks outside any recover; such an error took
// the worker's process down, and the next process's after the reaper gave
// the row back (a library-misuse probe). It is not unwrapped: its other
// methods may panic alike.
func saneError(err error) error {
	if err == nil {
		return nil
	}
	if p := safely(func() error { _ = err.Error(); return nil }); p != nil {
		return &brokenError{msg: fmt.Sprintf("an error of type %T whose Error method panicked: %v", err, p.(*PanicError).Value)}
	}
	return err
}

// brokenError stands for an error whose Error method panicked (saneError).
type brokenError struct{ msg string }

func (e *brokenError) Error() string { return e.msg }

// goexitValue is the Value of the [PanicError] of a step, Handle or WithTx
// callback that called runtime.Goexit in a test binary — as t.FailNow,
// t.Fatal, t.SkipNow and testify's require functions do, in a test that
// runs a real engine. It is handled like any panic: Handle gets the error,
// and by default the step runs again after its backoff, until its
// attempts are spent. Outside a test binary a Goexit ends the worker's
// goroutine: the row stays executing under a heartbeated lease and the
// queue has one place less until the process restarts.
const goexitValue = "runtime.Goexit called (t.FailNow, t.Fatal, t.SkipNow or a require assertion inside a step?)"

// contained runs fn on a goroutine of its own and waits for it. A call of
// runtime.Goexit in fn ends that goroutine only: exited is true, and stack
// is the goroutine's stack as it exited. Run on the worker's goroutine, the
// Goexit ended the worker: the step's outcome was never written (the row
// stayed executing, its lease heartbeated) and its place in the queue was
// lost for the process's life. A panic must be recovered inside fn.
func contained(fn func()) (stack string, exited bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		returned := false
		defer func() {
			if !returned {
				stack, exited = string(debug.Stack()), true
			}
		}()
		fn()
		returned = true
	}()
	<-done
	return stack, exited
}

// safeTx wraps a WithTx callback so that a panic in it, or (in a test
// binary) a call of runtime.Goexit, comes back as a *PanicError, handed to
// Handle like any step error.
func safeTx(fn func(ctx context.Context, tx pgx.Tx) error, direct bool) func(ctx context.Context, tx pgx.Tx) error {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx) (err error) {
		if p := userCode(direct, func() { err = safely(func() error { return fn(ctx, tx) }) }); p != nil {
			return p
		}
		return saneError(err)
	}
}

// safely runs fn, turning a panic (e.g. in a user's MarshalJSON) into a *PanicError.
func safely(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: string(debug.Stack())}
		}
	}()
	return fn()
}

func stopResult(kind, msg string, cause error) executor.Result {
	return executor.Result{
		Out:     sqlq.Outcome{Kind: sqlq.KindStop, ErrKind: strPtr(kind), Err: strPtr(truncate(msg))},
		StepErr: cause,
	}
}

// errStack is the stack trace a panic's entry in the error history keeps
// (StepError.Stack): from the panicking frame down, the recovery's own
// frames left out, at most sqlq.MaxStackText bytes. nil for other errors.
func errStack(err error) *string {
	var p *PanicError
	if !errors.As(err, &p) || p.Stack == "" {
		return nil
	}
	return strPtr(sqlq.StackText(panickingFrames(p.Stack)))
}

// panickingFrames drops the frames of a debug.Stack taken in a deferred
// recover above the call to panic (runtime/debug.Stack, the deferred
// function, runtime.gopanic), keeping the goroutine header line.
func panickingFrames(stack string) string {
	head, rest, ok := strings.Cut(stack, "\n")
	if !ok {
		return stack
	}
	i := strings.Index(rest, "\npanic(")
	if !strings.HasPrefix(rest, "panic(") && i < 0 {
		return stack
	}
	if i >= 0 {
		rest = rest[i+1:]
	}
	// Skip "panic(...)" and its file line.
	for range 2 {
		if _, after, ok := strings.Cut(rest, "\n"); ok {
			rest = after
		}
	}
	return head + "\n" + rest
}

func errKind(err error) string {
	switch err.(type) {
	case *PanicError:
		return "panic"
	}
	return "error"
}

// DefaultBackoff is the retry delay of the default Handle: 1s·2^attempt,
// capped at one hour, with up to 50% jitter subtracted so that many failing
// instances do not retry in lockstep.
func DefaultBackoff(attempt int) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	d := time.Hour
	if attempt < 12 {
		d = min(time.Second<<attempt, time.Hour)
	}
	return d - time.Duration(rand.Int64N(int64(d)/2+1))
}

// truncate makes an error text storable (sqlq.ErrorText).
func truncate(s string) string { return sqlq.ErrorText(s) }

func strPtr(s string) *string { return &s }

// nonEmpty is a pointer to s, or nil for "": a filter's unset field.
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// orDefault is v, or d when v is the zero value.
func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// setDefault sets *v to d when it holds the zero value.
func setDefault[T comparable](v *T, d T) { *v = orDefault(*v, d) }

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// hidesEverything reports whether t is a struct (or a pointer to one) with
// fields, none of which encoding/json writes, and no marshaler it calls:
// every value of it is stored as {}. A struct without fields (or with blank
// ones only) says so on purpose, and is not. A state is encoded as the S
// value itself, not addressable: a MarshalJSON on *T is not called for a
// T (json.Marshal of a big.Int value is {}), only for a *T.
func hidesEverything(t reflect.Type) bool {
	addressable := false
	for t.Kind() == reflect.Pointer {
		t, addressable = t.Elem(), true
	}
	if t.Kind() != reflect.Struct || marshalsItself(t, addressable) {
		return false
	}
	named := false
	for i := range t.NumField() {
		if t.Field(i).Name != "_" {
			named = true
		}
	}
	return named && !storesAField(t, addressable, 0)
}

// marshalsItself reports whether encoding/json calls a marshaler (JSON or
// text) of t's: t's own, or *t's when the value is addressable.
func marshalsItself(t reflect.Type, addressable bool) bool {
	if t.Implements(jsonMarshalerType) || t.Implements(textMarshalerType) {
		return true
	}
	p := reflect.PointerTo(t)
	return addressable && (p.Implements(jsonMarshalerType) || p.Implements(textMarshalerType))
}

// storesAField reports whether encoding/json writes a field of struct t:
// an exported one not tagged "-", or one promoted from an embedded struct.
// An embedded struct without a JSON name is walked by encoding/json, its
// marshaler never called (it is called only as t's, promoted, which
// hidesEverything checks); one given a name is a field, its marshaler
// called.
func storesAField(t reflect.Type, addressable bool, depth int) bool {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		ft, addr := f.Type, addressable
		for ft.Kind() == reflect.Pointer {
			ft, addr = ft.Elem(), true
		}
		switch {
		case f.Anonymous && ft.Kind() == reflect.Struct:
			// Its fields are promoted, exported or not; deeper than a few
			// levels, assume it stores something rather than refuse.
			name, _, _ := strings.Cut(tag, ",")
			if depth >= 8 || (name != "" && marshalsItself(ft, addr)) || storesAField(ft, addr, depth+1) {
				return true
			}
		case f.IsExported():
			return true
		}
	}
	return false
}

// unsettableEmbed is the first embedded field type of struct t (or of a
// struct it embeds) that is a pointer to an unexported struct type:
// encoding/json writes its fields, and cannot decode them back ("cannot set
// embedded pointer to unexported struct"; given a JSON name, its decode
// panics: reflect.Value.Set using value obtained using unexported field).
// Nil if none.
func unsettableEmbed(t reflect.Type, depth int) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || depth >= 8 {
		return nil
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if !f.Anonymous || tag == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct && !f.IsExported() {
			return ft
		}
		if e := unsettableEmbed(ft, depth+1); e != nil {
			return e
		}
	}
	return nil
}
