package gendurable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// JobStep is the name of a job's single step.
const JobStep = "perform"

// Job defines the one-step special case of a machine: Perform runs once per
// attempt with typed arguments T (stored as the instance's JSON state).
//
//   - nil: the job is done (with PerformResult, its result stored).
//   - an error: retried with exponential backoff and jitter until MaxAttempts,
//     then failed. A panic counts as an error.
//   - an error wrapped with [JobCancel]: failed at once, no more attempts.
//   - [JobSnooze](d): run again after d without counting an attempt.
//
// A job is an instance with one step: it shares every table, index and code
// path with machines. Register it in [Config.Machines]; insert with [Job.New].
// A Job must not be modified once used (by [New] or an insert): its fields,
// Perform included, are read once, at its first use that finds it valid (a
// use that refuses it — no Perform or Name yet — reads them again next
// time); a test that needs another Perform declares another Job.
//
// A job's completion commits on its own: Perform has no transaction to write
// in (River's JobCompleteTx). For writes — follow-up jobs included — that
// must commit together with the completion, declare a one-step [Machine]
// whose step returns Done(result).WithTx(fn), fn inserting with
// [Engine.InsertTx] or [Engine.InsertManyTx] on the tx it is given: they
// commit with the Done, and a failing fn or a fenced-out outcome (an
// operator's cancel meanwhile) rolls them back (see [Outcome.WithTx]).
type Job[T any] struct {
	// Name identifies the job kind in the database. Required.
	Name string
	// Version of the job kind. Default 1.
	Version int
	// Queue new jobs go to unless InsertOpts says otherwise. Default "default".
	Queue string
	// MaxAttempts of new jobs. Default 20.
	MaxAttempts int
	// Backoff gives the delay before retry number attempt+1. Default [DefaultBackoff].
	Backoff func(attempt int) time.Duration
	// Timeout bounds one run of Perform, as [Machine.StepTimeout] does a
	// step's. Default 0: no timeout.
	Timeout time.Duration
	// Perform does the work. job.State holds the arguments. Required,
	// unless PerformResult is set instead.
	Perform func(ctx context.Context, job *Run[T]) error
	// PerformResult is Perform for a job that has a result: when it returns
	// a nil error, result (any JSON-encodable value, or nil) is stored as
	// the instance's result, as a machine's [Done] stores it — read it with
	// [WaitResult] or [Engine.Instance] (its Result). Its errors mean what
	// Perform's do (a retry, [JobCancel], [JobSnooze]); the result that comes
	// with an error is not stored. A result the engine cannot store — one
	// encoding/json cannot encode, or one over [Config].MaxStateBytes or
	// MaxJSONDepth, or a number beyond PostgreSQL's numeric — fails the job
	// at once (kind "stop"), without another attempt: its work is done and
	// would only run again; so does one the database refuses (a NUL, a lone
	// surrogate escape: kind "outcome_rejected"). Set Perform or
	// PerformResult, not both.
	PerformResult func(ctx context.Context, job *Run[T]) (result any, err error)

	mu   sync.Mutex                  // serializes the builds
	core atomic.Pointer[machineCore] // its machine's, built at the first use that finds the job valid
}

func (j *Job[T]) definition() (*machineCore, error) {
	if j == nil {
		var zero T
		return nil, errorf(ErrInvalidConfig, "nil *Job[%T]", zero)
	}
	switch {
	case j.Perform == nil && j.PerformResult == nil:
		// Before the job's machine is built once for good: a Perform set
		// after this refusal is the one that runs (it was built without
		// one, and every run failed "job has no Perform func").
		return nil, errorf(ErrInvalidConfig, "job %q has no Perform func", j.Name)
	case j.Perform != nil && j.PerformResult != nil:
		return nil, errorf(ErrInvalidConfig, "job %q has both Perform and PerformResult: set one", j.Name)
	case j.MaxAttempts < 0 || j.Timeout < 0:
		// In the job's own words: its machine's check names StepTimeout,
		// a field a Job does not have.
		return nil, errorf(ErrInvalidConfig, "job %q: negative MaxAttempts or Timeout", j.Name)
	}
	if err := belowFloor(fmt.Sprintf("job %q: ", j.Name), time.Millisecond, map[string]time.Duration{"Timeout": j.Timeout}); err != nil {
		return nil, err
	}
	if core := j.core.Load(); core != nil {
		return core, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if core := j.core.Load(); core != nil {
		return core, nil
	}
	// Built from the job's fields as they are now, until a build succeeds:
	// a refusal (a Name not yet set) is not kept, as a Machine's is not.
	core, err := j.machine().definition()
	if err != nil {
		return nil, err
	}
	j.core.Store(core)
	return core, nil
}

// machine is the one-step Machine that runs j, from j's fields as they are.
func (j *Job[T]) machine() *Machine[T] {
	perform, performResult := j.Perform, j.PerformResult
	return &Machine[T]{
		Name: j.Name, Version: j.Version, Queue: j.Queue, Start: JobStep,
		MaxAttempts: j.MaxAttempts, Backoff: j.Backoff, StepTimeout: j.Timeout,
		Flow: []FlowStep{{Step: JobStep, Kinds: OutcomeDone}}, // finishes, snoozes (Replay) or fails
		Steps: map[string]StepFunc[T]{JobStep: func(ctx context.Context, r *Run[T]) (Outcome, error) {
			var result any
			var err error
			if performResult != nil {
				result, err = performResult(ctx, r)
			} else {
				err = perform(ctx, r)
			}
			var snooze *SnoozeError
			switch {
			case err == nil:
				// A result that cannot be stored (encoding/json refuses
				// it, or it is over the engine's size or depth limits)
				// would make the outcome invalid, retried like an error:
				// the job's work would run again for each attempt (two
				// reviews). final: it fails at once instead.
				o := Done(result)
				o.final = true
				return o, nil
			case errors.As(err, &snooze):
				o := replayAsStored(snooze.Delay) // the args as stored, as the default retry's
				o.snooze = true
				// Told to the hooks as a machine step's snooze is
				// (StepEvent.Snoozed, Err the *SnoozeError): a River
				// user's probe saw a job's snooze as a replay with no
				// error and Snoozed false.
				o.snoozeErr = err
				return o, nil
			}
			return Outcome{}, err
		}},
		// The default Handle: a JobCancel stops at once.
	}
}

// New prepares a new job with the given arguments for [Engine.Insert].
func (j *Job[T]) New(args T) InsertParams {
	return InsertParams{def: j, state: args}
}
