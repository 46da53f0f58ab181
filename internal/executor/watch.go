package executor

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// maxAbandonGrace caps how long a step may ignore its cancelled context
// after its StepTimeout before the executor abandons it.
const maxAbandonGrace = 10 * time.Second

// stepWatch is the watchdog of one run of a step with a StepTimeout: if the
// step has not returned StepTimeout + grace after it started, the executor
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
// fails) under its definition's StepTimeout. ok is false if the step was
// abandoned meanwhile: the watchdog writes its outcome, and res must be
// dropped.
func (r *run) runStep(ctx context.Context, in *Input) (res Result, ok bool) {
	timeout := r.def.StepTimeout
	if timeout <= 0 {
		return r.def.Run(ctx, in), true
	}
	stepCtx, cancel := context.WithTimeoutCause(ctx, timeout, ErrStepTimeout)
	defer cancel()
	claimed := *in.Claim
	start := time.Now()
	w := &stepWatch{}
	w.timer = time.AfterFunc(timeout+min(timeout, maxAbandonGrace), func() {
		if w.state.CompareAndSwap(watchRunning, watchAbandoned) {
			r.abandon(ctx, &claimed, time.Since(start))
		}
	})
	res = r.def.Run(stepCtx, in)
	return res, w.returned()
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
// after the definition's backoff, or a Stop once the attempts are spent —
// fenced by the step's claim token, and reports it. stepCtx is the step's
// context before its timeout.
func (r *run) abandon(stepCtx context.Context, c *sqlq.Claimed, running time.Duration) {
	x, timeout := r.x, r.def.StepTimeout
	ctx := context.Background()
	// The feeder first: once the claim is not heartbeated, no heartbeat can
	// mistake the outcome written below for a lost lease. stillRunning is
	// false if the step returned in the meantime (its result is dropped all
	// the same: this goroutine won).
	slots, stillRunning := r.h.Abandon()
	stepErr := fmt.Errorf("%w: step %q ignored its context for %s after its StepTimeout of %s and was abandoned",
		ErrStepTimeout, c.Step, (running - timeout).Round(time.Millisecond), timeout)
	res := Result{StepErr: stepErr, Out: sqlq.Outcome{
		ID: c.ID, Token: c.Token, Kind: sqlq.KindReplay, AttemptInc: 1,
		ErrKind: ptr("timeout"), Err: ptr(sqlq.ErrorText(stepErr.Error())),
	}}
	switch {
	case errors.Is(context.Cause(stepCtx), ErrEngineStopped):
		// Shutdown cancelled it too: like any step interrupted by a stop, it
		// runs again as is, without counting an attempt.
		res.Out.AttemptInc = 0
	case c.Attempt+1 >= c.MaxAttempts:
		res.Out.Kind, res.Out.AttemptInc = sqlq.KindStop, 0
		res.Out.Err = ptr(sqlq.ErrorText(fmt.Sprintf("%s; attempts exhausted (%d of %d)", stepErr, c.Attempt+1, c.MaxAttempts)))
	default:
		res.Out.Delay = r.def.Backoff(int(c.Attempt))
	}
	// If it is not written (the database is unreachable), the lease runs
	// out and the reaper takes the row.
	cr := x.cfg.Committer.Commit(&res.Out)
	x.settled(ctx, r.queue, c, &res, cr.Applied, cr.Err, running)
	x.cfg.Log.Error("gendurable: step ignored its context past its StepTimeout; abandoned it",
		"queue", r.queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt, "step_timeout", timeout,
		"running", running.Round(time.Millisecond), "outcome", res.Out.Kind.String(), "outcome_written", cr.Applied != nil,
		"still_running", stillRunning, "abandoned_slots", slots)
	x.cfg.Events.Abandoned(ctx, r.queue, c, Abandonment{Running: running, Outcome: res.Out.Kind, Written: cr.Applied != nil, Slots: slots})
}

func ptr(s string) *string { return &s }
