// Package maintenance holds the engine's background services, the work
// beside the hot path that no step asks for:
//
//   - [Reaper]: every interval, expired leases go back to runnable (or fail
//     once their attempts are spent);
//   - [TimeoutSweeper]: awaits whose deadline passed become runnable; it
//     sleeps until the next known deadline, and a local await pokes it;
//   - [Pruner]: every interval, finished rows older than the retention are
//     deleted with their signals;
//   - [Periodic]: each schedule's slots are inserted as they come due.
//
// Each is a [Service] with the same Start/Stop shape (River's startstop is
// the model): Start launches its loop and returns at once, Stop cancels it
// and waits for it to return. The engine starts them in one declared order
// and stops them in reverse. Their dependencies — the statements of
// internal/sqlq, a pool, a logger, callbacks for what the engine turns into
// its typed hook events — are explicit struct fields; no service calls back
// into the engine's own types, and no SQL is written here.
//
// # Deadlines
//
// Every statement a service sends runs under a deadline of its own (the
// service's StatementTimeout; a prune batch, one transaction, under the
// pruner's BatchTimeout), not only under the service's long-lived context.
// A connection cut off silently — a partition, a proxy or NAT that stops
// forwarding without closing — otherwise leaves the statement waiting for a
// reply until the OS's TCP keepalive gives up, two hours by default, and
// the loop with it. At the deadline pgx closes the connection; the service
// logs a warning and goes on with its next iteration, which the pool serves
// on a fresh connection (docs/design.md §7).
package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultStatementTimeout bounds one statement of a service whose
// StatementTimeout is zero. The engine sets max(LeaseDuration, 30s)
// (Config.MaintenanceTimeout).
const DefaultStatementTimeout = 30 * time.Second

// PruneTimeoutFactor: a prune batch's deadline is this many statement
// timeouts (the engine's pruner, and a Pruner whose BatchTimeout is zero).
// A batch deletes up to its Batch rows and their signals in one
// transaction: far longer than a reap, legitimately, on a large table or a
// busy server.
const PruneTimeoutFactor = 10

// bounded runs stmt under a context derived from ctx that also ends d
// from now: the deadline of one statement (or one short transaction).
// When that deadline, not ctx, ended it, the error says so, wrapping
// stmt's (which wraps context.DeadlineExceeded).
// An error that is a [NoStatement] is returned as it is.
func bounded(ctx context.Context, d time.Duration, stmt func(ctx context.Context) error) error {
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := stmt(sctx)
	var ns *NoStatement
	if err != nil && ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded) && !errors.As(err, &ns) {
		return fmt.Errorf("no reply within %s, statement abandoned and its connection closed: %w", d, err)
	}
	return err
}

// NoStatement marks the error of work under a statement's deadline that
// sent no statement — a Periodic's New that has not returned — so that
// the deadline's error does not say a statement was abandoned and its
// connection closed (a misuse probe saw that for a New blocked on a
// channel).
type NoStatement struct{ Err error }

func (e *NoStatement) Error() string { return e.Err.Error() }
func (e *NoStatement) Unwrap() error { return e.Err }

// Service is the shape every maintenance service shares.
type Service interface {
	// Start launches the service's loop in a goroutine and returns at once.
	// The loop runs until Stop, or until ctx is done. Starting a service
	// that is already started returns ErrStarted and changes nothing.
	Start(ctx context.Context) error
	// Stop cancels the loop and waits for it to return. Stop on a service
	// that was never started, or is already stopped, does nothing. A
	// stopped service may be started again.
	Stop()
}

// ErrStarted: Start was called on a service that is running (or whose loop
// ended on its own but that was not stopped yet).
var ErrStarted = errors.New("gendurable: maintenance service already started")

// BaseService gives a service the semantics of [Service]: embed it, and
// implement Start by calling StartLoop with the service's loop; the embedded
// Stop is then the service's Stop. The zero value is ready to use.
type BaseService struct {
	mu     sync.Mutex
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// stopped is the cause of a loop context that Stop or StopContext
// cancelled; ctx is StopContext's (Background for Stop).
type stopped struct{ ctx context.Context }

func (*stopped) Error() string { return "gendurable: maintenance service stopped" }

// StartLoop runs loop in a goroutine under a context derived from ctx,
// cancelled by Stop. It returns ErrStarted if a loop was started and not
// stopped since.
func (b *BaseService) StartLoop(ctx context.Context, loop func(ctx context.Context)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	b.cancel, b.done = cancel, done
	go func() {
		defer close(done)
		loop(ctx)
	}()
	return nil
}

// Stop cancels the loop and waits until it has returned. Concurrent calls
// all wait; a Start concurrent with a Stop waits for the Stop to finish.
func (b *BaseService) Stop() { b.StopContext(context.Background()) }

// StopContext is Stop for a caller that must return by ctx's deadline:
// work the loop does once cancelled, under [FinalContext] (the Flusher's
// last flush), ends when ctx does. The loop's return is still waited for.
func (b *BaseService) StopContext(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done == nil {
		return
	}
	b.cancel(&stopped{ctx})
	<-b.done
	b.cancel, b.done = nil, nil
}

// FinalContext is the context of a loop's last work once its context ctx
// is done (a final flush that must outlive the cancel): it ends after d,
// or when the context of the StopContext that cancelled ctx ends.
func FinalContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	var st *stopped
	if errors.As(context.Cause(ctx), &st) {
		release := context.AfterFunc(st.ctx, cancel)
		return final, func() { release(); cancel() }
	}
	return final, cancel
}

// StopBoundContext is the context of a loop's work begun while ctx, the
// loop's context, is live, that a Stop landing on it must not cut short
// (a merge whose statement may commit as the cancel arrives): it ends
// after d, or, once ctx is cancelled, when the context of the StopContext
// that cancelled it ends (at once if that has ended; at once for any other
// cancel of ctx).
func StopBoundContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	var mu sync.Mutex
	var releaseStop func() bool
	ended := false // the returned cancel ran: register nothing on the stop's context
	release := context.AfterFunc(ctx, func() {
		var st *stopped
		if !errors.As(context.Cause(ctx), &st) {
			cancel()
			return
		}
		mu.Lock()
		if !ended {
			releaseStop = context.AfterFunc(st.ctx, cancel)
		}
		mu.Unlock()
	})
	return work, func() {
		release()
		mu.Lock()
		ended = true
		if releaseStop != nil {
			releaseStop()
		}
		mu.Unlock()
		cancel()
	}
}

// stopOutOfTime reports whether ctx, a service loop's context, was ended
// by a stop whose own context has ended too (see FinalContext).
func stopOutOfTime(ctx context.Context) bool {
	var st *stopped
	return errors.As(context.Cause(ctx), &st) && st.ctx.Err() != nil
}

// StartAll starts services in order. If one fails to start, those already
// started are stopped in reverse order and its error is returned.
func StartAll(ctx context.Context, services []Service) error {
	for i, s := range services {
		if err := s.Start(ctx); err != nil {
			StopAll(context.Background(), services[:i])
			return err
		}
	}
	return nil
}

// StopAll stops services in the reverse of their start order, each after
// the loop of the one started after it has returned. Services that embed
// BaseService are stopped with StopContext(ctx): their last work after the
// cancel (the Flusher's final flush) ends when ctx does.
func StopAll(ctx context.Context, services []Service) {
	for i := len(services) - 1; i >= 0; i-- {
		if s, ok := services[i].(interface{ StopContext(context.Context) }); ok {
			s.StopContext(ctx)
		} else {
			services[i].Stop()
		}
	}
}
