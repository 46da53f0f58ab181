package longhorizon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/stretchr/testify/require"
)

// TestDepthPollsAreSpacedByTheirDuration: in fixed mode the depth is read
// at the sample ticks, no sooner than depthPollDuty times the last poll's
// duration after it started; when the producer steers by it, every 20–200
// ms, spaced likewise.
func TestDepthPollsAreSpacedByTheirDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		took, want time.Duration
	}{
		{20 * time.Millisecond, 5 * time.Second},
		{2 * time.Second, 20 * time.Second},
	} {
		if got := fixedPollGap(5*time.Second, c.took); got != c.want {
			t.Errorf("fixed, a poll of %v: next after %v, want %v", c.took, got, c.want)
		}
	}
	for _, c := range []struct {
		took, want time.Duration
	}{
		{500 * time.Microsecond, 20 * time.Millisecond},
		{5 * time.Millisecond, 50 * time.Millisecond},
		{100 * time.Millisecond, 200 * time.Millisecond},
	} {
		if got := depthTargetPollGap(c.took); got != c.want {
			t.Errorf("depth-target, a poll of %v: next after %v, want %v", c.took, got, c.want)
		}
	}
}

// depthSystem is a System whose depth the test sets; it inserts nothing.
type depthSystem struct {
	depth atomic.Int64
	stuck atomic.Bool // Depth waits for its context's end
}

func (s *depthSystem) Insert(context.Context, int64, int, string) error { return nil }
func (s *depthSystem) Depth(ctx context.Context) (int64, error) {
	if s.stuck.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.depth.Load(), nil
}
func (s *depthSystem) DBNow(context.Context) (time.Time, error) { return time.Now(), nil }

// TestSamplesReportTheDepthAtTheirTickAndWholeWindows: in fixed mode each
// sample's queue_depth is the depth at its tick (it was the last poll's,
// up to a sample period old), and no sample covers less than a whole
// window (the first tick after the start only starts the count).
func TestSamplesReportTheDepthAtTheirTickAndWholeWindows(t *testing.T) {
	t.Parallel()
	sys := &depthSystem{}
	var buf syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{ProducerMode: ModeFixed, ProducerRate: 100, WorkerCount: 1, SampleEvery: time.Second}
	started := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, "test", sys, &Telemetry{}, NewEmitter(&buf), slog.New(slog.DiscardHandler))
	}()
	// The depth moves every 100 ms: a sample shows the value of its tick.
	for time.Since(started) < 3500*time.Millisecond {
		sys.depth.Store(time.Now().UnixMilli() / 100)
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var depths, rates int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var s Sample
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		at, err := time.Parse(time.RFC3339Nano, s.T)
		if err != nil {
			t.Fatal(err)
		}
		if at.Before(nextBoundary(started, time.Second).Add(time.Second)) {
			t.Errorf("a sample at %s, the first tick after the start (%s): its window is not whole", s.T, started.Format(TimeFormat))
		}
		switch s.Metric {
		case "queue_depth":
			depths++
			if tick := at.UnixMilli() / 100; s.Value < float64(tick-3) || s.Value > float64(tick+3) {
				t.Errorf("queue_depth %v at %s: the depth at its tick was %d", s.Value, s.T, tick)
			}
		case "enqueue_rate":
			rates++
			if s.Value < 80 || s.Value > 120 {
				t.Errorf("enqueue_rate %v at %s over a whole second at 100/s", s.Value, s.T)
			}
		}
	}
	if depths < 2 || rates < 2 {
		t.Fatalf("%d depth and %d rate samples in 3.5 s:\n%s", depths, rates, buf.String())
	}
}

// TestAStuckDepthReadDoesNotHoldTheSamples: a depth read that never returns
// (a count waiting on a lock) is given up at its bound: every tick's lines
// still come, with the last depth read.
func TestAStuckDepthReadDoesNotHoldTheSamples(t *testing.T) {
	t.Parallel()
	sys := &depthSystem{}
	sys.depth.Store(42)
	var buf syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{ProducerMode: ModeFixed, ProducerRate: 10, WorkerCount: 1, SampleEvery: time.Second}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, "test", sys, &Telemetry{}, NewEmitter(&buf), slog.New(slog.DiscardHandler))
	}()
	for !strings.Contains(buf.String(), "queue_depth") {
		time.Sleep(10 * time.Millisecond)
	}
	sys.stuck.Store(true)
	stuckAt := time.Now()
	time.Sleep(3200 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var after []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var s Sample
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		at, _ := time.Parse(time.RFC3339Nano, s.T)
		if s.Metric == "queue_depth" && at.After(stuckAt) {
			after = append(after, s.T)
			if s.Value != 42 {
				t.Errorf("queue_depth %v at %s: want the last read, 42", s.Value, s.T)
			}
		}
	}
	if len(after) < 3 {
		t.Fatalf("%d ticks in the 3.2 s after the depth read got stuck (%v), want 3", len(after), after)
	}
}

// failingSystem fails every insert until failUntil, and counts the jobs of
// those that succeed.
type failingSystem struct {
	depthSystem
	failUntil time.Time
	inserted  atomic.Int64
}

func (s *failingSystem) Insert(_ context.Context, _ int64, n int, _ string) error {
	if time.Now().Before(s.failUntil) {
		return errors.New("connection refused")
	}
	s.inserted.Add(int64(n))
	return nil
}

// TestFailedInsertsAreOfferedAgain: in fixed mode the jobs of a failed
// insert are inserted later (they were dropped: half a second of failures
// at 200/s lost 100 jobs).
func TestFailedInsertsAreOfferedAgain(t *testing.T) {
	t.Parallel()
	sys := &failingSystem{failUntil: time.Now().Add(500 * time.Millisecond)}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{ProducerMode: ModeFixed, ProducerRate: 200, WorkerCount: 1, SampleEvery: time.Second}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- Run(ctx, cfg, "test", sys, &Telemetry{}, NewEmitter(io.Discard), slog.New(slog.DiscardHandler))
	}()
	time.Sleep(1500 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	offered := 200 * time.Since(start).Seconds()
	if got := float64(sys.inserted.Load()); got < offered-60 {
		t.Fatalf("%v jobs inserted of %.0f offered in %v, the first 500 ms failing", got, offered, time.Since(start).Round(time.Millisecond))
	}
}

// blockingWriter blocks the write it is told to (the n-th, from 1) until
// release is closed, or for hold if hold > 0; the rest go to buf.
type blockingWriter struct {
	mu      sync.Mutex
	buf     syncbuf.Buffer
	writes  int
	n       int
	hold    time.Duration
	release chan struct{}
	blocked chan struct{} // closed when the blocking write begins
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	block := w.writes == w.n
	w.mu.Unlock()
	if block {
		close(w.blocked)
		if w.hold > 0 {
			time.Sleep(w.hold)
		} else {
			<-w.release
		}
	}
	return w.buf.Write(p)
}

// TestRunReturnsWhenStdoutIsNotRead: a write to a stdout nobody reads
// blocks its loop for good; once ctx ends Run still returns (within its
// second), so the adapter exits within 5 s of SIGTERM. It used to wait for
// the write.
func TestRunReturnsWhenStdoutIsNotRead(t *testing.T) {
	t.Parallel()
	w := &blockingWriter{n: 1, release: make(chan struct{}), blocked: make(chan struct{})}
	t.Cleanup(func() { close(w.release) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{ProducerMode: ModeFixed, ProducerRate: 10, WorkerCount: 1, SampleEvery: time.Second}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, "test", &depthSystem{}, &Telemetry{}, NewEmitter(w), slog.New(slog.DiscardHandler))
	}()
	select {
	case <-w.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("no sample was written")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(stopWait + 2*time.Second):
		t.Fatal("Run waited for a write nobody reads")
	}
}

// TestATickAfterAHeldLoopIsSkipped: a sample loop held past its next tick
// (here by a slow write; a stopped process is the same for it) emits no
// sample whose count covers more than one window: the tick that comes late
// is skipped, and so is the next, which starts a whole window again. It
// used to emit the late tick with window_s 1 and a count of two or three.
func TestATickAfterAHeldLoopIsSkipped(t *testing.T) {
	t.Parallel()
	w := &blockingWriter{n: 1, hold: 2300 * time.Millisecond, blocked: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{ProducerMode: ModeFixed, ProducerRate: 100, WorkerCount: 1, SampleEvery: time.Second}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, "test", &depthSystem{}, &Telemetry{}, NewEmitter(w), slog.New(slog.DiscardHandler))
	}()
	<-w.blocked
	held := time.Now()
	time.Sleep(2300*time.Millisecond + 3500*time.Millisecond) // the hold, then three ticks
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var ticks []time.Time
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(w.buf.String()), "\n") {
		var s Sample
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if !seen[s.T] {
			seen[s.T] = true
			at, err := time.Parse(time.RFC3339Nano, s.T)
			if err != nil {
				t.Fatal(err)
			}
			ticks = append(ticks, at)
		}
	}
	if len(ticks) < 2 {
		t.Fatalf("ticks %v: want the held one and one after", ticks)
	}
	// The held tick is the first (its first line was the held write); the
	// next emitted one comes at least three periods later: the tick that
	// fired once the write returned and the one after it were skipped.
	first := ticks[0]
	if first.After(held) {
		t.Fatalf("first tick %s after the hold began at %s", first, held)
	}
	if gap := ticks[1].Sub(first); gap < 4*time.Second {
		t.Errorf("ticks %v: the tick %s after the held one covers more than a whole window", ticks, ticks[1].Format(TimeFormat))
	}
}

// TestRateFileIsAShortRegularFile: the rate control file is read only if it
// is a regular file of at most maxRateFile bytes. /dev/zero used to be read
// until memory ran out, and a FIFO would block the
// producer until something wrote to it.
func TestRateFileIsAShortRegularFile(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "rate")
	require.NoError(t, os.WriteFile(ok, []byte(" 250\n"), 0o600))
	b, err := readRateFile(ok)
	require.NoError(t, err)
	require.Equal(t, " 250\n", string(b))

	long := filepath.Join(dir, "long")
	require.NoError(t, os.WriteFile(long, bytes.Repeat([]byte("1"), maxRateFile+1), 0o600))
	_, err = readRateFile(long)
	require.ErrorContains(t, err, "longer than")

	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() { _, err := readRateFile(fifo); done <- err }()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "not a regular file")
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO blocked")
	}

	_, err = readRateFile("/dev/zero")
	require.ErrorContains(t, err, "not a regular file")
}
