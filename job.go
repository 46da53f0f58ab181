package gendurable

import (
	"context"
	"errors"
	"sync"
	"time"
)

// JobStep is the name of a job's single step.
const JobStep = "perform"

// Job defines the one-step special case of a machine: Perform runs once per
// attempt with typed arguments T (stored as the instance's JSON state).
//
//   - nil: the job is done.
//   - an error: retried with exponential backoff and jitter until MaxAttempts,
//     then failed. A panic counts as an error.
//   - an error wrapped with [JobCancel]: failed at once, no more attempts.
//   - [JobSnooze](d): run again after d without counting an attempt.
//
// A job is an instance with one step: it shares every table, index and code
// path with machines. Register it in [Config.Machines]; insert with [Job.New].
// A Job must not be modified once used (by [New] or an insert): its fields,
// Perform included, are read once, at its first use with a Perform set; a
// test that needs another Perform declares another Job.
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
	// Perform does the work. Required. job.State holds the arguments.
	Perform func(ctx context.Context, job *Run[T]) error

	once sync.Once
	m    *Machine[T]
}

func (j *Job[T]) definition() (*machineCore, error) {
	if j == nil {
		var zero T
		return nil, errorf(ErrInvalidConfig, "nil *Job[%T]", zero)
	}
	if j.Perform == nil {
		// Before the job's machine is built once for good: a Perform set
		// after this refusal is the one that runs (it was built without
		// one, and every run failed "job has no Perform func").
		return nil, errorf(ErrInvalidConfig, "job %q has no Perform func", j.Name)
	}
	j.once.Do(func() {
		perform := j.Perform
		j.m = &Machine[T]{
			Name: j.Name, Version: j.Version, Queue: j.Queue, Start: JobStep,
			MaxAttempts: j.MaxAttempts, Backoff: j.Backoff, StepTimeout: j.Timeout,
			Flow: []FlowStep{{Step: JobStep, Kinds: OutcomeDone}}, // finishes, snoozes (Replay) or fails
			Steps: map[string]StepFunc[T]{JobStep: func(ctx context.Context, r *Run[T]) (Outcome, error) {
				err := perform(ctx, r)
				var snooze *SnoozeError
				switch {
				case err == nil:
					return Done(nil), nil
				case errors.As(err, &snooze):
					o := replayAsStored(snooze.Delay) // the args as stored, as the default retry's
					o.snooze = true
					return o, nil
				}
				return Outcome{}, err
			}},
			// The default Handle: a JobCancel stops at once.
		}
	})
	return j.m.definition()
}

// New prepares a new job with the given arguments for [Engine.Insert].
func (j *Job[T]) New(args T) InsertParams {
	return InsertParams{def: j, state: args}
}
