package maintenance

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

var _ Service = (*Flusher)(nil)

// TestFlusherFlushesOnItsIntervalAndOnStop: the last Flush runs on Stop,
// with a live context, so nothing counted before Stop is lost; a failing
// Flush does not stop the loop.
func TestFlusherFlushesOnItsIntervalAndOnStop(t *testing.T) {
	var calls, live, afterStop atomic.Int64
	var stopping atomic.Bool
	f := &Flusher{Name: "test flush", Interval: 10 * time.Millisecond, Flush: func(ctx context.Context) error {
		calls.Add(1)
		if stopping.Load() {
			afterStop.Add(1)
		}
		if ctx.Err() == nil {
			live.Add(1)
		}
		return errors.New("fails every time")
	}}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d flushes in 5s at a 10ms interval", calls.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopping.Store(true)
	f.Stop()
	if afterStop.Load() == 0 {
		t.Fatal("Stop ran no last flush")
	}
	if live.Load() != calls.Load() {
		t.Fatalf("%d of %d flushes ran with a cancelled context", calls.Load()-live.Load(), calls.Load())
	}
}

// TestFlusherFinalFlushEndsWithStopContext: the last Flush, stuck (on a
// dead connection, say), ends when the context given to StopContext does,
// not after FinalTimeout; a plain Stop still gives it FinalTimeout.
func TestFlusherFinalFlushEndsWithStopContext(t *testing.T) {
	var stopping atomic.Bool
	var lasted atomic.Int64
	f := &Flusher{Name: "test flush", Interval: time.Hour, FinalTimeout: 5 * time.Second, Flush: func(ctx context.Context) error {
		if !stopping.Load() {
			return nil
		}
		start := time.Now()
		<-ctx.Done()
		lasted.Store(int64(time.Since(start)))
		return ctx.Err()
	}}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopping.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	f.StopContext(ctx)
	// It starts a moment after the stop context was made: at least half
	// of that context's 100 ms, and far less than FinalTimeout.
	if d := time.Duration(lasted.Load()); d < 50*time.Millisecond || d > time.Second {
		t.Fatalf("the last flush lasted %s, want the stop context's 100ms", d)
	}

	f.FinalTimeout = 200 * time.Millisecond
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.Stop()
	if d := time.Duration(lasted.Load()); d < 200*time.Millisecond || d > 2*time.Second {
		t.Fatalf("after a plain Stop the last flush lasted %s, want FinalTimeout 200ms", d)
	}
}

// TestFlusherStopLandingOnAFlushDoesNotCancelIt: a Stop that came while a
// periodic flush was in flight cancelled it — logged as a failure "tried
// again later" of an engine that was stopping, and, when the statement had
// committed before the cancel reached it, its counts were put back and the
// final flush wrote them a second time. The flush under way now runs to its
// end (bounded by the Stop's own deadline), then the final one runs.
func TestFlusherStopLandingOnAFlushDoesNotCancelIt(t *testing.T) {
	inFlight := make(chan struct{})
	var cancelled, finals atomic.Int64
	var first atomic.Bool
	f := &Flusher{Name: "test flush", Interval: 10 * time.Millisecond, Flush: func(ctx context.Context) error {
		if first.CompareAndSwap(false, true) {
			close(inFlight)
			select {
			case <-ctx.Done():
				cancelled.Add(1)
				return ctx.Err()
			case <-time.After(300 * time.Millisecond):
				return nil
			}
		}
		finals.Add(1)
		return nil
	}}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-inFlight
	f.Stop()
	if cancelled.Load() != 0 {
		t.Fatal("the Stop cancelled the flush under way")
	}
	if finals.Load() != 1 {
		t.Fatalf("%d flushes after the one under way, want the final one", finals.Load())
	}
}

// TestFlusherStopDeadlineBoundsAFlushInFlight: a flush under way when a
// Stop comes is not cut short by the Stop, but it is by the Stop's own
// deadline: a flush stuck on a dead connection held StopContext (and so
// Engine.Stop) for its whole StatementTimeout past that deadline.
func TestFlusherStopDeadlineBoundsAFlushInFlight(t *testing.T) {
	inFlight := make(chan struct{})
	var once atomic.Bool
	f := &Flusher{Name: "test flush", Interval: 10 * time.Millisecond, StatementTimeout: 5 * time.Second,
		FinalTimeout: 5 * time.Second, Flush: func(ctx context.Context) error {
			if once.CompareAndSwap(false, true) {
				close(inFlight)
			}
			<-ctx.Done()
			return ctx.Err()
		}}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-inFlight
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	f.StopContext(ctx)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("StopContext with a 200ms deadline took %s", d)
	}
}
