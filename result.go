package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrInstanceFailed: [WaitResult] waited for an instance that failed (it
// stopped, ran out of attempts, or was cancelled). The error is a
// *[FailedError].
var ErrInstanceFailed = errors.New("gendurable: instance failed")

// FailedError is how [WaitResult] reports a failed instance: its last
// recorded error. errors.Is(err, ErrInstanceFailed) holds.
type FailedError struct {
	ID     int64
	Step   string // the step it failed at
	Kind   string // the last error's kind ("stop", "error", "panic", "cancelled", …)
	Reason string // the last error's text
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("gendurable: instance %d failed at step %q (%s): %s", e.ID, e.Step, e.Kind, e.Reason)
}

// Is makes errors.Is(err, ErrInstanceFailed) hold.
func (e *FailedError) Is(target error) bool { return target == ErrInstanceFailed }

// Polling bounds of WaitResult for instances finished by other processes.
const (
	resultPollFirst = 10 * time.Millisecond
	resultPollMax   = time.Second
)

// WaitResult blocks until instance id is finished and returns its Done
// result decoded into T (a nil result decodes to T's zero value) — or a
// *[FailedError] (errors.Is ErrInstanceFailed) if it failed, [ErrNotFound] if
// there is no such instance, or ctx's error — or the error of a read that
// failed: a poll is not retried, so a database restart or a lost connection
// ends the wait with its error (the instance is unaffected: call it again). An instance finished by a step
// of this engine wakes it at once; otherwise it polls, from every 10 ms
// backing off to every second. Any engine can wait, also one that works no
// queue.
//
//	total, err := gendurable.WaitResult[Receipt](ctx, eng, id)
func WaitResult[T any](ctx context.Context, e *Engine, id int64) (T, error) {
	var zero T
	poll := resultPollFirst
	for {
		// Listen before looking, so a finish between the two is not missed.
		woken, stop := e.finished.listen(id)
		in, err := e.Instance(ctx, id)
		if err != nil {
			stop()
			return zero, err
		}
		switch in.Status {
		case StatusDone:
			stop()
			var v T
			if len(in.Result) == 0 || string(in.Result) == "null" {
				return v, nil
			}
			if err := json.Unmarshal(in.Result, &v); err != nil {
				return zero, fmt.Errorf("%w: result of instance %d into %T: %v", ErrStateDecode, id, v, err)
			}
			return v, nil
		case StatusFailed:
			stop()
			f := &FailedError{ID: id, Step: in.Step}
			if n := len(in.Errors); n > 0 {
				f.Kind, f.Reason = in.Errors[n-1].Kind, in.Errors[n-1].Error
			}
			return zero, f
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			stop()
			return zero, ctx.Err()
		case <-woken:
		case <-t.C:
			poll = min(2*poll, resultPollMax)
		}
		t.Stop()
		stop()
	}
}

// finishWaiters wakes WaitResult callers when a step of this process
// finishes their instance.
type finishWaiters struct {
	mu sync.Mutex
	by map[int64]map[chan struct{}]struct{}
}

// listen returns a channel closed when id is finished here, and a func that
// stops listening.
func (w *finishWaiters) listen(id int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.by == nil {
		w.by = map[int64]map[chan struct{}]struct{}{}
	}
	if w.by[id] == nil {
		w.by[id] = map[chan struct{}]struct{}{}
	}
	w.by[id][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		if set := w.by[id]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(w.by, id)
			}
		}
		w.mu.Unlock()
	}
}

// notify wakes every listener of id.
func (w *finishWaiters) notify(id int64) {
	w.mu.Lock()
	set := w.by[id]
	delete(w.by, id)
	w.mu.Unlock()
	for ch := range set {
		close(ch)
	}
}
