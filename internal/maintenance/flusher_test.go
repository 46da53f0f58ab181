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
