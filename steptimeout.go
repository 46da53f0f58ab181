package gendurable

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// maxAbandonGrace caps how long a step may ignore its cancelled context
// after its StepTimeout before the engine abandons it.
const maxAbandonGrace = 10 * time.Second

// stepWatch is the watchdog of one run of a step with a StepTimeout: if the
// step has not returned StepTimeout + grace after it started, the engine
// writes its outcome itself and gives it up (see Machine.StepTimeout).
// Exactly one of the step's return and the watchdog wins.
type stepWatch struct {
	state atomic.Int32 // watchRunning, watchReturned or watchAbandoned
	timer *time.Timer
}

const (
	watchRunning int32 = iota
	watchReturned
	watchAbandoned
)

// runStep runs the user code of one step (the step, and Handle if it
// fails) under its machine's StepTimeout. ok is false if the step was
// abandoned meanwhile: the watchdog writes its outcome, and res must be
// dropped.
func (e *Engine) runStep(ctx context.Context, queue string, core *machineCore, in *execInput, h feeder.Holder) (res execResult, ok bool) {
	if core.stepTimeout <= 0 {
		return core.exec(ctx, in), true
	}
	stepCtx, cancel := context.WithTimeoutCause(ctx, core.stepTimeout, ErrStepTimeout)
	defer cancel()
	w := e.watchStep(ctx, queue, core, in.c, h)
	res = core.exec(stepCtx, in)
	return res, w.returned()
}

// watchStep arms the watchdog for the run of c's current step; ctx is the
// step's context before its timeout.
func (e *Engine) watchStep(ctx context.Context, queue string, core *machineCore, c *sqlq.Claimed, h feeder.Holder) *stepWatch {
	claimed := *c
	start := time.Now()
	w := &stepWatch{}
	w.timer = time.AfterFunc(core.stepTimeout+min(core.stepTimeout, maxAbandonGrace), func() {
		if w.state.CompareAndSwap(watchRunning, watchAbandoned) {
			e.abandon(ctx, queue, core, &claimed, h, time.Since(start))
		}
	})
	return w
}

// returned reports whether the step returned before it was abandoned; if
// not, the watchdog writes its outcome and what it returned must be
// dropped.
func (w *stepWatch) returned() bool {
	w.timer.Stop()
	return w.state.CompareAndSwap(watchRunning, watchReturned)
}

// abandon settles a step that ignores its context: it gives up the claim
// in the feeder (no more heartbeats; the slot stays taken until the step
// returns), then writes the outcome the default Handle would — a retry
// after the machine's backoff, or a Stop once the attempts are spent —
// fenced by the step's claim token, and reports it.
func (e *Engine) abandon(stepCtx context.Context, queue string, core *machineCore, c *sqlq.Claimed, h feeder.Holder, running time.Duration) {
	ctx := context.Background()
	// The feeder first: once the claim is not heartbeated, no heartbeat can
	// mistake the outcome written below for a lost lease. stillRunning is
	// false if the step returned in the meantime (its result is dropped all
	// the same: this goroutine won).
	slots, stillRunning := h.Abandon()
	stepErr := fmt.Errorf("%w: step %q ignored its context for %s after its StepTimeout of %s and was abandoned",
		ErrStepTimeout, c.Step, (running - core.stepTimeout).Round(time.Millisecond), core.stepTimeout)
	res := execResult{kind: kindReplay, stepErr: stepErr, out: sqlq.Outcome{
		ID: c.ID, Token: c.Token, Kind: sqlq.KindReplay, AttemptInc: 1,
		ErrKind: strPtr("timeout"), Err: strPtr(truncate(stepErr.Error())),
	}}
	switch {
	case errors.Is(context.Cause(stepCtx), ErrEngineStopped):
		// Shutdown cancelled it too: like any step interrupted by a stop, it
		// runs again as is, without counting an attempt.
		res.out.AttemptInc = 0
	case c.Attempt+1 >= c.MaxAttempts:
		res.kind, res.out.Kind, res.out.AttemptInc = kindStop, sqlq.KindStop, 0
		res.out.Err = strPtr(truncate(fmt.Sprintf("%s; attempts exhausted (%d of %d)", stepErr, c.Attempt+1, c.MaxAttempts)))
	default:
		res.out.Delay = DefaultBackoff(int(c.Attempt))
		_ = safely(func() error { res.out.Delay = core.backoff(int(c.Attempt)); return nil })
	}
	r := e.committer.Commit(&res.out)
	// If it was not written (the database is unreachable), the lease runs
	// out and the reaper takes the row.
	if r.Applied != nil {
		e.wakeApplied(r.Applied)
	}
	e.reportStep(ctx, queue, c, &res, r.Applied != nil, r.Err, running)
	e.log.Error("gendurable: step ignored its context past its StepTimeout; abandoned it",
		"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt, "step_timeout", core.stepTimeout,
		"running", running.Round(time.Millisecond), "outcome", res.kind.String(), "outcome_written", r.Applied != nil,
		"still_running", stillRunning, "abandoned_slots", slots)
	e.emit(ctx, &StepAbandonedEvent{Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Step: c.Step,
		Attempt: int(c.Attempt), Running: running, Outcome: res.kind.String(), Written: r.Applied != nil, AbandonedSlots: slots})
}
