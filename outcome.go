package gendurable

import (
	"fmt"
	"time"
)

type outcomeKind uint8

const (
	kindNone outcomeKind = iota
	kindNext
	kindReplay
	kindDone
	kindStop
)

func (k outcomeKind) String() string {
	switch k {
	case kindNext:
		return "next"
	case kindReplay:
		return "replay"
	case kindDone:
		return "done"
	case kindStop:
		return "stop"
	default:
		return "none"
	}
}

// Outcome is what a step decided. Build one with the methods of [Run]
// ([Run.Next], [Run.Replay]) or with [Done] and [Stop]; the zero Outcome is
// invalid. The engine validates an outcome before any SQL runs and applies it
// in one statement, fenced by the step's claim token.
type Outcome struct {
	kind     outcomeKind
	step     string
	state    any  // the machine's state value (S), encoded by the engine
	hasState bool // Next and Replay carry a state
	delay    time.Duration
	result   any
	reason   string
	snooze   bool // replay without counting an attempt (jobs)
}

// Kind names the outcome: "next", "replay", "done", "stop", or "none" for the
// zero Outcome.
func (o Outcome) Kind() string { return o.kind.String() }

// After returns a copy of a Next outcome that becomes runnable only after d —
// a durable sleep: the instance sleeps in the database, not in a process, so a
// restart or a crash does not shorten or lose it. On other outcomes it has no
// effect except on Replay, where it replaces the replay delay.
func (o Outcome) After(d time.Duration) Outcome {
	if o.kind == kindNext || o.kind == kindReplay {
		o.delay = d
	}
	return o
}

// Done finishes the instance successfully. result (any JSON-encodable value,
// or nil) is stored in the instance's result column.
func Done(result any) Outcome { return Outcome{kind: kindDone, result: result} }

// Stop fails the instance for good, recording reason in its error history.
// It is not retried.
func Stop(reason string) Outcome { return Outcome{kind: kindStop, reason: reason} }

// Next moves the instance to step with a new state, committed before the
// step runs; the attempt counter resets to 0.
func (r *Run[S]) Next(step string, state S) Outcome {
	return Outcome{kind: kindNext, step: step, state: state, hasState: true}
}

// Replay runs the same step again after delay with state, counting one more
// attempt. Signals are not consumed and awaited names are kept, so the replay
// sees the same inputs.
func (r *Run[S]) Replay(state S, delay time.Duration) Outcome {
	return Outcome{kind: kindReplay, state: state, hasState: true, delay: delay}
}

// validate checks an outcome against its machine before any SQL runs.
func (o Outcome) validate(steps map[string]bool) error {
	switch o.kind {
	case kindNext:
		if !steps[o.step] {
			return fmt.Errorf("%w: Next names step %q, which the machine does not declare", ErrInvalidOutcome, o.step)
		}
		if o.delay < 0 {
			return fmt.Errorf("%w: negative delay %s", ErrInvalidOutcome, o.delay)
		}
	case kindReplay:
		if o.delay < 0 {
			return fmt.Errorf("%w: negative replay delay %s", ErrInvalidOutcome, o.delay)
		}
	case kindDone, kindStop:
	default:
		return fmt.Errorf("%w: the step returned the zero Outcome", ErrInvalidOutcome)
	}
	return nil
}
