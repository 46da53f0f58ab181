package gendurable

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// This file holds a machine's optional declared transitions ([Machine].Flow):
// their validation at registration, their check of every outcome at run
// time, and the step order the graph draws (docs/design.md §9).

// FlowStep declares where one step of a machine may lead (see
// [Machine].Flow).
//
//	Flow: []gendurable.FlowStep{
//		{Step: "reserve", To: []string{"charge"}},
//		{Step: "charge", To: []string{"ship", "refund"}},
//		{Step: "ship", Kinds: gendurable.OutcomeAwait, To: []string{"delivered"}},
//		{Step: "delivered"}, // no To: it can only finish (Done)
//		{Step: "refund", To: []string{"ship"}, Kinds: gendurable.OutcomeNext | gendurable.OutcomeDone},
//	}
type FlowStep struct {
	// Step is the step this declaration is about: a key of the machine's
	// Steps. Required.
	Step string
	// To lists the steps a Next, Await or ScheduleChildren of this step may
	// name. Each must be a key of the machine's Steps.
	To []string
	// Kinds lists the outcome kinds the step may return. Zero: Next, Await
	// and ScheduleChildren (to To) when To is not empty — the step moves
	// on —, and Done when it is — the step finishes. A step that may do
	// both says so: OutcomeNext | OutcomeDone. Replay and Stop are always
	// allowed: they are how a failure is retried and how it ends (the
	// default Handle returns them).
	Kinds OutcomeKinds
}

// OutcomeKinds is a set of outcome kinds, for [FlowStep].Kinds. Combine
// them with |.
type OutcomeKinds uint8

// The outcome kinds a [FlowStep] can allow.
const (
	OutcomeNext     OutcomeKinds = 1 << iota // Run.Next (and Outcome.After)
	OutcomeAwait                             // Run.Await
	OutcomeChildren                          // Run.ScheduleChildren
	OutcomeDone                              // Done

	allOutcomeKinds = OutcomeNext | OutcomeAwait | OutcomeChildren | OutcomeDone
	stepKinds       = OutcomeNext | OutcomeAwait | OutcomeChildren // kinds that name a step
)

// Bounds of a machine definition, so that its stored copy
// (docs/design.md §9) stays small.
const (
	// MaxSteps bounds the steps of one machine.
	MaxSteps = 256
	// MaxFlowTargets bounds the To entries of one machine's Flow, all
	// steps together.
	MaxFlowTargets = 4096
)

// kindNames lists the kinds of s by name, in a fixed order.
func (s OutcomeKinds) names() []string {
	var out []string
	for _, k := range []struct {
		bit  OutcomeKinds
		name string
	}{{OutcomeNext, "next"}, {OutcomeAwait, "await"}, {OutcomeChildren, "children"}, {OutcomeDone, "done"}} {
		if s&k.bit != 0 {
			out = append(out, k.name)
		}
	}
	return out
}

// String names the kinds, e.g. "next|done".
func (s OutcomeKinds) String() string {
	if s == 0 {
		return "none"
	}
	return strings.Join(s.names(), "|")
}

// kindBit is the OutcomeKinds bit of an outcome kind; 0 for Replay and
// Stop, which a Flow cannot forbid.
func kindBit(k sqlq.Kind) OutcomeKinds {
	switch k {
	case sqlq.KindNext:
		return OutcomeNext
	case sqlq.KindAwait:
		return OutcomeAwait
	case sqlq.KindChildren:
		return OutcomeChildren
	case sqlq.KindDone:
		return OutcomeDone
	}
	return 0
}

// ErrUndeclaredTransition: a step of a machine with a Flow returned an
// outcome its [FlowStep] does not allow — a Next, Await or
// ScheduleChildren to a step not in its To (a typo included), or a kind
// not in its Kinds. The error is a [*TransitionError]. At run time the
// instance fails at once, without asking Handle and without a retry (the
// same code would return the same outcome again), with error kind
// "transition" in its history. When Handle returns such an outcome, the
// history entry keeps the step's error (and a panic's stack), and the step
// event's Err wraps both that error and the *TransitionError.
var ErrUndeclaredTransition = errors.New("gendurable: undeclared transition")

// TransitionError describes an outcome that breaks its machine's Flow. It
// matches [ErrUndeclaredTransition] and [ErrInvalidOutcome] with
// [errors.Is].
type TransitionError struct {
	Machine string
	Version int
	From    string   // the step that returned the outcome
	Outcome string   // its kind: "next", "await", "children" or "done"
	To      string   // the step it names; "" for done
	Allowed []string // the From step's declared To, in declaration order
	Kinds   string   // the From step's allowed kinds, e.g. "next|done"
}

func (e *TransitionError) Error() string {
	if e.To == "" {
		return fmt.Sprintf("%s: machine %q version %d: step %q may not return %s (its Flow allows %s)",
			ErrUndeclaredTransition, e.Machine, e.Version, e.From, e.Outcome, e.Kinds)
	}
	return fmt.Sprintf("%s: machine %q version %d: step %q may not %s to %q (its Flow allows %s to %q)",
		ErrUndeclaredTransition, e.Machine, e.Version, e.From, e.Outcome, e.To, e.Kinds, e.Allowed)
}

// Is matches ErrUndeclaredTransition and ErrInvalidOutcome.
func (e *TransitionError) Is(target error) bool {
	return target == ErrUndeclaredTransition || target == ErrInvalidOutcome
}

// UnknownStepError: a machine's Flow names a step that is not a key of
// its Steps. [New] returns it (it matches [ErrInvalidConfig]).
type UnknownStepError struct {
	Machine string
	Version int
	Field   string // where the name appears, e.g. "Flow[1].To"
	Step    string // the name that is not a step
	Steps   []string
}

func (e *UnknownStepError) Error() string {
	return fmt.Sprintf("%s: machine %q version %d: %s names step %q, which is not one of its Steps %v",
		ErrInvalidConfig, e.Machine, e.Version, e.Field, e.Step, e.Steps)
}

// Is matches ErrInvalidConfig.
func (e *UnknownStepError) Is(target error) bool { return target == ErrInvalidConfig }

// flowRule is one declared step, resolved.
type flowRule struct {
	to    []string // declaration order, no duplicates
	toSet map[string]bool
	kinds OutcomeKinds // resolved: never zero
}

// buildFlow validates a machine's Flow against its steps and returns the
// rules by step (nil for no Flow) and the step order: Start, then the
// Flow's steps in order, then any other step by name.
func buildFlow(name string, version int, start string, steps map[string]bool, flow []FlowStep) (map[string]*flowRule, []string, error) {
	order := []string{start}
	seen := map[string]bool{start: true}
	var rules map[string]*flowRule
	targets := 0
	for i, fs := range flow {
		if !steps[fs.Step] {
			return nil, nil, &UnknownStepError{Machine: name, Version: version, Field: fmt.Sprintf("Flow[%d].Step", i), Step: fs.Step, Steps: sortedKeys(steps)}
		}
		if rules[fs.Step] != nil {
			return nil, nil, fmt.Errorf("%w: machine %q: step %q declared twice in Flow", ErrInvalidConfig, name, fs.Step)
		}
		if fs.Kinds&^allOutcomeKinds != 0 {
			return nil, nil, fmt.Errorf("%w: machine %q: Flow[%d] (step %q): unknown Kinds bits %#x", ErrInvalidConfig, name, i, fs.Step, uint8(fs.Kinds&^allOutcomeKinds))
		}
		r := &flowRule{kinds: fs.Kinds, toSet: map[string]bool{}}
		for _, to := range fs.To {
			if !steps[to] {
				return nil, nil, &UnknownStepError{Machine: name, Version: version, Field: fmt.Sprintf("Flow[%d].To", i), Step: to, Steps: sortedKeys(steps)}
			}
			if !r.toSet[to] {
				r.toSet[to] = true
				r.to = append(r.to, to)
			}
		}
		targets += len(fs.To)
		if r.kinds == 0 {
			r.kinds = OutcomeDone
			if len(r.to) > 0 {
				r.kinds = stepKinds
			}
		}
		switch {
		case fs.Kinds != 0 && fs.Kinds&stepKinds != 0 && len(r.to) == 0:
			return nil, nil, fmt.Errorf("%w: machine %q: Flow[%d] (step %q) allows %s but lists no To step", ErrInvalidConfig, name, i, fs.Step, fs.Kinds)
		case len(r.to) > 0 && r.kinds&stepKinds == 0:
			return nil, nil, fmt.Errorf("%w: machine %q: Flow[%d] (step %q) lists To steps but its Kinds (%s) allow none of next, await, children", ErrInvalidConfig, name, i, fs.Step, fs.Kinds)
		case targets > MaxFlowTargets:
			return nil, nil, fmt.Errorf("%w: machine %q: Flow lists more than %d To steps", ErrInvalidConfig, name, MaxFlowTargets)
		}
		if rules == nil {
			rules = map[string]*flowRule{}
		}
		rules[fs.Step] = r
		if !seen[fs.Step] {
			seen[fs.Step] = true
			order = append(order, fs.Step)
		}
	}
	for _, s := range sortedKeys(steps) {
		if !seen[s] {
			order = append(order, s)
		}
	}
	return rules, order, nil
}

// checkFlow returns a *TransitionError if the outcome o of step from breaks
// the machine's Flow; nil if it keeps it, or if the machine (or the step)
// declares nothing.
func (core *machineCore) checkFlow(from string, o Outcome) error {
	r := core.flow[from]
	if r == nil {
		return nil
	}
	bit := kindBit(o.kind)
	if bit == 0 {
		return nil // Replay, Stop; the zero Outcome is validate's to refuse
	}
	ok := r.kinds&bit != 0
	if ok && bit&stepKinds != 0 {
		ok = r.toSet[o.step]
	}
	if ok {
		return nil
	}
	e := &TransitionError{Machine: core.name, Version: core.version, From: from, Outcome: o.kind.String(),
		Allowed: slices.Clone(r.to), Kinds: r.kinds.String()}
	if bit&stepKinds != 0 {
		e.To = o.step
	}
	return e
}

// ValidateOutcome checks o, returned by step, the way the engine checks a
// step's outcome before any SQL runs: the step it names exists, its delays
// and await names are valid, its state is of type S, and it keeps the
// machine's Flow (a [*TransitionError] otherwise). It does not encode the
// state, nor check children's insert options (that needs an engine).
// It returns the machine's configuration error if the machine is invalid,
// and [ErrInvalidOutcome] if step is not one of its Steps.
//
// Test helpers (gendurabletest.RunStep) call it on the outcome of a step
// run without a database, so that a typo'd Next target fails the test
// instead of a production instance.
func (m *Machine[S]) ValidateOutcome(step string, o Outcome) error {
	core, err := m.definition()
	if err != nil {
		return err
	}
	if !core.steps[step] {
		return fmt.Errorf("%w: step %q is not declared by machine %q version %d", ErrInvalidOutcome, step, core.name, core.version)
	}
	if err := core.checkFlow(step, o); err != nil {
		return err
	}
	if err := o.validate(core.steps); err != nil {
		return err
	}
	if o.hasState {
		if _, ok := o.state.(S); !ok {
			var zero S
			return fmt.Errorf("%w: %w: state is %T, the machine's state type is %T", ErrInvalidOutcome, ErrStateEncode, o.state, zero)
		}
	}
	return nil
}
