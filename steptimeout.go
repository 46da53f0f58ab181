package gendurable

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/scheduler"
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
// abandoned meanwhile: its outcome has been written for it, and res must be
// dropped.
func (e *Engine) runStep(ctx context.Context, queue string, core *machineCore, in *execInput, h scheduler.Holder) (res execResult, ok bool) {
	if core.stepTimeout <= 0 {
		return core.exec(ctx, in), true
	}
	stepCtx, cancel := context.WithTimeoutCause(ctx, core.stepTimeout, ErrStepTimeout)
	defer cancel()
	w := e.watchStep(queue, core, in.c, h)
	res = core.exec(stepCtx, in)
	return res, w.returned()
}

// watchStep arms the watchdog for the run of c's current step.
func (e *Engine) watchStep(queue string, core *machineCore, c *sqlq.Claimed, h scheduler.Holder) *stepWatch {
	claimed := *c
	start := time.Now()
	w := &stepWatch{}
	w.timer = time.AfterFunc(core.stepTimeout+min(core.stepTimeout, maxAbandonGrace), func() {
		if w.state.CompareAndSwap(watchRunning, watchAbandoned) {
			e.abandon(queue, core, &claimed, h, time.Since(start))
		}
	})
	return w
}

// returned reports whether the step returned before it was abandoned; if
// not, its outcome has been written already and what it returned must be
// dropped.
func (w *stepWatch) returned() bool {
	w.timer.Stop()
	return w.state.CompareAndSwap(watchRunning, watchReturned)
}

// abandon settles a step that ignores its context: it writes the outcome
// the default Handle would (a retry after the machine's backoff, or a Stop
// once the attempts are spent) fenced by the step's claim token, stops
// heartbeating the claim, and reports it. The step's goroutine keeps its
// slot until it returns.
func (e *Engine) abandon(queue string, core *machineCore, c *sqlq.Claimed, h scheduler.Holder, running time.Duration) {
	ctx := context.Background()
	stepErr := fmt.Errorf("%w: step %q ignored its context for %s after its StepTimeout of %s and was abandoned",
		ErrStepTimeout, c.Step, (running - core.stepTimeout).Round(time.Millisecond), core.stepTimeout)
	res := execResult{kind: kindReplay, stepErr: stepErr, out: sqlq.Outcome{
		ID: c.ID, Token: c.Token, Kind: sqlq.KindReplay, AttemptInc: 1, Delay: core.backoff(int(c.Attempt)),
		ErrKind: strPtr("timeout"), Err: strPtr(truncate(stepErr.Error())),
	}}
	if c.Attempt+1 >= c.MaxAttempts {
		res.kind, res.out.Kind, res.out.AttemptInc, res.out.Delay = kindStop, sqlq.KindStop, 0, 0
		res.out.Err = strPtr(truncate(fmt.Sprintf("%s; attempts exhausted (%d of %d)", stepErr, c.Attempt+1, c.MaxAttempts)))
	}
	r := e.committer.Commit(&res.out)
	// Whether or not the outcome was written: stop heartbeating. If it was
	// not, the lease runs out and the reaper takes the row.
	slots := h.Abandon()
	if r.Applied != nil {
		e.wakeApplied(r.Applied)
	}
	e.reportStep(ctx, queue, c, &res, r.Applied != nil, r.Err, running)
	e.log.Error("gendurable: step ignored its context past its StepTimeout; abandoned it (outcome written for it, its goroutine still holds a slot until it returns)",
		"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt, "step_timeout", core.stepTimeout,
		"running", running.Round(time.Millisecond), "outcome", res.kind.String(), "abandoned_slots", slots)
	e.emit(ctx, &StepAbandonedEvent{Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Step: c.Step,
		Attempt: int(c.Attempt), Running: running, Outcome: res.kind.String(), AbandonedSlots: slots})
}
