package gendurabletest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
)

// deadlineMargin is how long before the test binary's deadline
// WorkUntilFinished gives up, so that it fails the test with its own
// message rather than the binary panicking.
const deadlineMargin = 2 * time.Second

// WorkUntilFinished works eng until every instance of ids is done or
// failed and returns them, in the order of ids. If eng is not running it
// is started, and stopped again before WorkUntilFinished returns; a running
// engine (or another process) just works on. An instance finished by eng
// is seen at once, one finished elsewhere within a second.
//
// It waits until ctx is done or shortly before the test binary's deadline
// (go test -timeout), whichever comes first; then it fails the test,
// listing each instance that has not finished with its status, step,
// attempt, last error and what it waits for. A Stop that says steps
// abandoned past their StepTimeout still run (the engine wrote their
// outcomes, as documented) is logged, not a failure.
//
//	ins := gendurabletest.WorkUntilFinished(ctx, t, eng, id)
//	if ins[0].Status != gendurable.StatusDone { ... }
func WorkUntilFinished(ctx context.Context, tb testing.TB, eng *gendurable.Engine, ids ...int64) []*gendurable.Instance {
	tb.Helper()
	if ctx == nil {
		tb.Fatalf("gendurabletest: WorkUntilFinished: nil context (use t.Context())")
	}
	if eng == nil {
		tb.Fatalf("gendurabletest: WorkUntilFinished: nil engine")
	}
	if len(eng.Config().Queues) == 0 {
		tb.Fatalf("gendurabletest: WorkUntilFinished: the engine works no queue (set Config.Queues)")
	}
	switch err := eng.Start(ctx); {
	case err == nil:
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := eng.Stop(stopCtx); err != nil {
				if onlyAbandoned(err) {
					// Steps that ignored their context past StepTimeout: the
					// engine wrote their outcomes, as documented; their
					// goroutines still run. Not a failure of the test.
					tb.Logf("gendurabletest: WorkUntilFinished: %v", err)
					return
				}
				tb.Errorf("gendurabletest: WorkUntilFinished: stopping the engine: %v", err)
			}
		}()
	case errors.Is(err, gendurable.ErrAlreadyStarted):
	default:
		tb.Fatalf("gendurabletest: WorkUntilFinished: starting the engine: %v", err)
	}
	waitCtx := ctx
	if d, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithDeadline(ctx, deadline.Add(-deadlineMargin))
			defer cancel()
		}
	}
	for _, id := range ids {
		if _, err := gendurable.WaitResult[json.RawMessage](waitCtx, eng, id); err != nil &&
			!errors.Is(err, gendurable.ErrInstanceFailed) && !errors.Is(err, gendurable.ErrStateDecode) {
			if errors.Is(err, gendurable.ErrNotFound) {
				tb.Fatalf("gendurabletest: WorkUntilFinished: %v", err)
			}
			if waitCtx.Err() == nil {
				tb.Fatalf("gendurabletest: WorkUntilFinished: instance %d: %v", id, err)
			}
			break // timed out: the report below says which are not finished
		}
	}
	// Read them all again with a live context, even after a timeout.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out := make([]*gendurable.Instance, len(ids))
	var pending []string
	for i, id := range ids {
		in, err := eng.Instance(readCtx, id)
		if err != nil {
			tb.Fatalf("gendurabletest: WorkUntilFinished: %v", err)
		}
		out[i] = in
		if !in.Status.Terminal() {
			pending = append(pending, describePending(readCtx, eng, in))
		}
	}
	if len(pending) > 0 {
		tb.Fatalf("gendurabletest: WorkUntilFinished: %d of %d instances did not finish (%v):\n%s",
			len(pending), len(ids), context.Cause(waitCtx), strings.Join(pending, "\n"))
	}
	return out
}

// describePending says where an unfinished instance stands and why.
func describePending(ctx context.Context, eng *gendurable.Engine, in *gendurable.Instance) string {
	s := fmt.Sprintf("    id %d (%s): %s at step %q, attempt %d of %d", in.ID, in.Machine, in.Status, in.Step,
		display.Run(in.Attempt, in.MaxAttempts, in.Status), in.MaxAttempts) // counted from 1, as the CLI and the dashboard show it
	unworkedSaid := false // the wait reason names a queue this engine does not work
	if w, err := eng.WaitReason(ctx, in.ID); err == nil && w.Summary != "" {
		s += "; " + w.Summary
		unworkedSaid = strings.Contains(w.Summary, "(not a queue this engine works)")
	}
	if n := len(in.Errors); n > 0 {
		s += fmt.Sprintf("; last error (%s): %s", in.Errors[n-1].Kind, clip(in.Errors[n-1].Error, 300))
	}
	// A runnable instance's wait reason names a queue this engine does not
	// work already; any other's does not.
	if _, ok := eng.Config().Queues[in.Queue]; !ok && !unworkedSaid {
		s += fmt.Sprintf("; queue %q is not one this engine works", in.Queue)
	}
	return s
}

// onlyAbandoned reports whether every error Stop returned says only that
// steps abandoned past their StepTimeout still run (wrapping
// gendurable.ErrStepTimeout): their outcomes are written.
func onlyAbandoned(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyAbandoned(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, gendurable.ErrStepTimeout)
}
