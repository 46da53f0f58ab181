package maintenance

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var (
	_ Service = (*Reaper)(nil)
	_ Service = (*TimeoutSweeper)(nil)
	_ Service = (*Pruner)(nil)
	_ Service = (*Periodic)(nil)
)

// slowLoop is a service whose loop, once cancelled, takes a while to return.
type slowLoop struct {
	BaseService
	runs     atomic.Int64
	returned atomic.Bool
}

func (s *slowLoop) Start(ctx context.Context) error {
	return s.StartLoop(ctx, func(ctx context.Context) {
		s.runs.Add(1)
		s.returned.Store(false)
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond)
		s.returned.Store(true)
	})
}

// TestServiceLifecycle: Stop before Start does nothing; Start twice is an
// error; Stop waits for the loop to return; Stop twice does nothing; a
// stopped service starts again. It runs alone (not in parallel) so that it
// can check that no goroutine outlives Stop.
func TestServiceLifecycle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := &slowLoop{}
	s.Stop() // never started: nothing to do
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	s.Stop()
	if !s.returned.Load() {
		t.Fatal("Stop returned before the loop did")
	}
	s.Stop() // already stopped
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("restart: %v", err)
	}
	eventually(t, time.Second, func() bool { return s.runs.Load() == 2 }, "restarted loop did not run")
	s.Stop()
	if !s.returned.Load() || s.runs.Load() != 2 {
		t.Fatalf("after restart and Stop: runs %d, returned %v", s.runs.Load(), s.returned.Load())
	}
}

// TestServiceEndsWithItsContext: a loop also ends when Start's context is
// done; Stop afterwards returns at once, and Start again works.
func TestServiceEndsWithItsContext(t *testing.T) {
	t.Parallel()
	s := &slowLoop{}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	eventually(t, time.Second, s.returned.Load, "loop did not end with its context")
	if err := s.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start before Stop: %v, want ErrStarted", err)
	}
	s.Stop()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Stop()
}

// TestConcurrentStopsAllWait: every Stop returns only once the loop has.
func TestConcurrentStopsAllWait(t *testing.T) {
	t.Parallel()
	s := &slowLoop{}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var early atomic.Int64
	for range 4 {
		wg.Go(func() {
			s.Stop()
			if !s.returned.Load() {
				early.Add(1)
			}
		})
	}
	wg.Wait()
	if early.Load() > 0 {
		t.Fatalf("%d Stops returned before the loop did", early.Load())
	}
}

// recorder is a service that records its starts and stops in a shared log.
type recorder struct {
	name string
	log  *[]string
	fail bool
}

func (r *recorder) Start(context.Context) error {
	if r.fail {
		return errors.New("no")
	}
	*r.log = append(*r.log, "start "+r.name)
	return nil
}

func (r *recorder) Stop() { *r.log = append(*r.log, "stop "+r.name) }

// TestStartAllStopAllOrder: services start in order and stop in reverse;
// if one fails to start, those started before it are stopped in reverse.
func TestStartAllStopAllOrder(t *testing.T) {
	t.Parallel()
	var log []string
	services := []Service{&recorder{"a", &log, false}, &recorder{"b", &log, false}, &recorder{"c", &log, false}}
	if err := StartAll(context.Background(), services); err != nil {
		t.Fatal(err)
	}
	StopAll(context.Background(), services)
	if want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}; !slices.Equal(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}

	log = nil
	services = []Service{&recorder{"a", &log, false}, &recorder{"b", &log, false}, &recorder{"c", &log, true}}
	if err := StartAll(context.Background(), services); err == nil {
		t.Fatal("StartAll: no error")
	}
	if want := []string{"start a", "start b", "stop b", "stop a"}; !slices.Equal(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}
}

// TestServicesNeedAnInterval: a service with no interval refuses to start
// rather than spin.
func TestServicesNeedAnInterval(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]Service{
		"reaper":  &Reaper{},
		"sweeper": &TimeoutSweeper{},
		"pruner":  &Pruner{Interval: time.Hour},
	} {
		if err := s.Start(context.Background()); err == nil {
			s.Stop()
			t.Errorf("%s started without an interval", name)
		}
	}
}

// chanCtx is a context of its own type: context.AfterFunc on it starts a
// goroutine, which a registration never released leaves running.
type chanCtx struct {
	context.Context
	done chan struct{}
}

func (c chanCtx) Done() <-chan struct{} { return c.done }
func (c chanCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// TestStopBoundContextReleasedRightAfterAStopLeavesNothing: a loop context
// ended by a Stop just before the returned cancel runs registers nothing
// on the Stop's context that the cancel would not release. Before, the
// callback registered after the cancel had looked: a goroutine (or, for a
// timeout context, an entry) per call until the Stop's context ended (a
// review: 200 of 200).
func TestStopBoundContextReleasedRightAfterAStopLeavesNothing(t *testing.T) {
	stop := chanCtx{context.Background(), make(chan struct{})}
	defer close(stop.done)
	before := runtime.NumGoroutine()
	for range 200 {
		loop, cancel := context.WithCancelCause(context.Background())
		_, done := StopBoundContext(loop, time.Minute)
		cancel(&stopped{stop})
		done()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		t.Fatalf("%d goroutines left waiting on the Stop's context (%d before)", n-before, before)
	}
}

// TestBoundedSaysAStatementWasAbandonedOnlyForAStatement: a deadline that
// ends work which sent no statement (a Periodic's New blocked on a
// channel, a misuse probe) is not reported as "statement abandoned and its
// connection closed"; a statement's still is.
func TestBoundedSaysAStatementWasAbandonedOnlyForAStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	err := bounded(ctx, 10*time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done()
		return &NoStatement{Err: fmt.Errorf("New has not returned: %w", context.Cause(ctx))}
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotContains(t, err.Error(), "statement abandoned")
	require.Equal(t, "New has not returned: context deadline exceeded", err.Error())

	err = bounded(ctx, 10*time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("query: %w", ctx.Err())
	})
	require.ErrorContains(t, err, "no reply within 10ms, statement abandoned and its connection closed: query: context deadline exceeded")
}
