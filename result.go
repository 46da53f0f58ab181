package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// ErrInstanceFailed: [WaitResult] waited for an instance that failed (it
// stopped, ran out of attempts, or was cancelled). The error is a
// *[FailedError].
var ErrInstanceFailed = errors.New("gendurable: instance failed")

// FailedError is how [WaitResult] reports a failed instance: its last
// recorded error. errors.Is(err, ErrInstanceFailed) holds.
type FailedError struct {
	ID int64
	// Step is the row's step when it failed: the step that failed, or, for
	// an instance cancelled while it awaited signals or children, the step
	// it was to run next (the await's), which never ran.
	Step string
	// Kind is the last error's kind: "stop", "error", "panic", "cancelled"
	// (an operator's or a program's Cancel), …. A job that gave up with
	// [JobCancel] has kind "error" (its error's), its Reason reading
	// "JobCancel: …; stopped: not retried" — not "cancelled", which only a
	// Cancel of the instance gives.
	Kind string

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
// *[FailedError] (errors.Is ErrInstanceFailed) if it failed (a cancelled
// instance too: Kind "cancelled"), [ErrStateDecode] if the result does not
// decode into T (T's UnmarshalJSON panicking included), [ErrNotFound] if
// there is no such instance, or ctx's error (wrapped: the message says
// what the last poll read, e.g. "instance 7 was runnable at step "send" at
// the last poll, in queue "emails", which this engine does not work"). An
// instance finished by a step of this engine wakes it at once; otherwise
// it polls, from every 10 ms backing off to every second. Any engine can
// wait, also one that works no queue. A poll that fails because the
// connection was lost or the server is restarting (SQLSTATE class 08,
// 57P01–57P03, 53300, a network error), or that has no reply within
// Config.MaintenanceTimeout (its connection cut off silently: it is
// closed), is tried again at the poll interval, so a database restart or a
// network cut does not end the wait; if ctx ends meanwhile, the error
// wraps ctx's and names the last failure. Any other failed read ends the
// wait with its error.
//
//	total, err := gendurable.WaitResult[Receipt](ctx, eng, id)
func WaitResult[T any](ctx context.Context, e *Engine, id int64) (T, error) {
	var zero T
	if err := e.usable(ctx, "WaitResult"); err != nil {
		return zero, err
	}
	poll := resultPollFirst
	var lost error     // the last poll's connection failure
	var last *Instance // what the last poll that answered read
	for {
		// Listen before looking, so a finish between the two is not missed.
		woken, stop := e.finished.listen(id)
		in, err := e.pollInstance(ctx, id)
		if err != nil && (ctx.Err() != nil || !sqlq.ConnectionFailure(err) && !errors.Is(err, errPollStalled)) {
			stop()
			if ctx.Err() != nil && lost != nil {
				return zero, e.waitEnded(ctx, id, lost, last)
			}
			return zero, err
		}
		lost = err // nil, or a connection failure: look again at the next poll
		if in != nil {
			last = in
		}
		var status Status
		if in != nil {
			status = in.Status
		}
		switch status {
		case StatusDone:
			stop()
			var v T
			if len(in.Result) == 0 || string(in.Result) == "null" {
				return v, nil
			}
			// A panic of T's UnmarshalJSON is a decode failure too, as a
			// state's is in a step (a misuse probe: it reached the caller).
			if err := safely(func() error { return json.Unmarshal(in.Result, &v) }); err != nil {
				var p *PanicError
				if errors.As(err, &p) {
					return zero, resultDecodeError{id: id, into: fmt.Sprintf("%T", v), why: fmt.Sprintf("its UnmarshalJSON panicked: %v", p.Value)}
				}
				return zero, resultDecodeError{id: id, into: fmt.Sprintf("%T", v), why: err.Error(), err: err}
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
			return zero, e.waitEnded(ctx, id, lost, last)
		case <-woken:
		case <-t.C:
			poll = min(2*poll, resultPollMax)
		}
		t.Stop()
		stop()
	}
}

// errPollStalled marks a WaitResult poll abandoned at its deadline.
var errPollStalled = errors.New("no reply")

// pollInstance is one poll of WaitResult: Instance under a deadline of
// MaintenanceTimeout as well as ctx. A connection cut off silently under
// it (a NAT or proxy that forgets it, a partition) is abandoned there —
// pgx closes it — and the next poll runs on a fresh connection, rather
// than waiting on it until ctx ends (TestWaitResultOnAConnectionCutOff).
func (e *Engine) pollInstance(ctx context.Context, id int64) (*Instance, error) {
	pctx, cancel := context.WithTimeout(ctx, e.cfg.MaintenanceTimeout)
	defer cancel()
	in, err := e.Instance(pctx, id)
	if err != nil && ctx.Err() == nil && pctx.Err() != nil {
		return nil, fmt.Errorf("%w within %s (MaintenanceTimeout): %w", errPollStalled, e.cfg.MaintenanceTimeout, err)
	}
	return in, err
}

// waitEnded is WaitResult's error when ctx ended: ctx's, naming lost, the
// connection failure of the last poll, if there was one, else what the last
// poll read (last, if any poll answered): a newcomer's wait on a queue no
// engine worked said "context deadline exceeded" and nothing else (a
// probe). No statement is sent for it: the caller's time is up.
func (e *Engine) waitEnded(ctx context.Context, id int64, lost error, last *Instance) error {
	if lost != nil {
		return fmt.Errorf("%w (the last poll before it failed: %v)", ctx.Err(), lost)
	}
	if last == nil {
		return ctx.Err()
	}
	note := fmt.Sprintf("instance %d was %s at step %q at the last poll", id, last.Status, last.Step)
	if _, ok := e.cfg.Queues[last.Queue]; !ok && last.Status == StatusRunnable && len(e.cfg.Queues) > 0 {
		// (An engine that works no queue inserts for others: no note.)
		note += fmt.Sprintf(", in queue %q, which this engine does not work", last.Queue)
	}
	return fmt.Errorf("%w (%s; Engine.WaitReason says what it waits for)", ctx.Err(), note)
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

// resultDecodeError: WaitResult's T does not fit the result. It is
// ErrStateDecode, whose words blamed the state (a newcomer's probe: "state
// does not decode: result of instance 2 into string").
type resultDecodeError struct {
	id        int64
	into, why string
	err       error // the decoder's, if not a panic
}

func (e resultDecodeError) Error() string {
	return fmt.Sprintf("gendurable: result does not decode: the Done result of instance %d into %s: %s", e.id, e.into, e.why)
}

func (e resultDecodeError) Is(target error) bool { return target == ErrStateDecode }
func (e resultDecodeError) Unwrap() error        { return e.err }
