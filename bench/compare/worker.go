package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gendurable/gendurable"
)

// workerEnv carries a worker process's spec (JSON). A process started with
// it is a worker, not a comparison: see IsWorker.
const workerEnv = "GENDURABLE_BENCH_WORKER"

// workerSpec is what a worker process runs: one system's client or engine
// on its own pool, working the "default" queue.
type workerSpec struct {
	System      string `json:"system"`
	Index       int    `json:"index"`
	DatabaseURL string `json:"database_url"`
	Database    string `json:"database"`
	Schema      string `json:"schema"`
	PoolConns   int32  `json:"pool_conns"`
	Expect      int    `json:"expect"` // jobs expected at most (sizes River's subscription buffer)

	RiverMaxWorkers        int                    `json:"river_max_workers"`
	RiverFetchCooldown     time.Duration          `json:"river_fetch_cooldown"`      // 0: River's default
	RiverFetchPollInterval time.Duration          `json:"river_fetch_poll_interval"` // 0: River's default
	GD                     gendurable.QueueConfig `json:"gd"`

	// Latency: record pickup and completion latency from NoopArgs.Ins.
	Latency bool `json:"latency"`
}

// workerSide is one system's worker in a worker process.
type workerSide interface {
	start(ctx context.Context) error
	stop(ctx context.Context) error
	completed() int64
	lastCompletion() int64
	anomalies() int64
}

// IsWorker reports whether this process was started as a worker process
// of a comparison (the compare command and the package's tests re-execute
// their own binary that way). Such a process calls WorkerMain and exits.
func IsWorker() bool { return os.Getenv(workerEnv) != "" }

// WorkerMain runs a worker process: it speaks a line protocol with the
// comparison that started it (stdin: "start", "stop"; stdout: "ready",
// "started", "progress", "stopped", "latency" lines), logs to stderr, and
// returns the exit code.
func WorkerMain() int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "compare worker: bad %s: %v\n", workerEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runWorker(ctx, &spec, os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "compare worker %s/%d: %v\n", spec.System, spec.Index, err)
		return 1
	}
	return 0
}

func runWorker(ctx context.Context, spec *workerSpec, in io.Reader, out, logw io.Writer) error {
	o := &Options{DatabaseURL: spec.DatabaseURL, Database: spec.Database}
	pool, err := openPool(ctx, o, spec.PoolConns, fmt.Sprintf("gendurable-bench-%s-w%d", spec.System, spec.Index))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := warmPool(ctx, pool); err != nil {
		return fmt.Errorf("warm pool: %w", err)
	}
	var lat *latencyRec
	if spec.Latency {
		lat = newLatencyRec()
	}
	w, err := newWorkerSide(spec, pool, newLogger(logw, spec.System), lat)
	if err != nil {
		return err
	}
	defer func() { _ = w.stop(context.WithoutCancel(ctx)) }()

	bw := bufio.NewWriter(out)
	say := func(format string, args ...any) error {
		fmt.Fprintf(bw, format+"\n", args...)
		return bw.Flush()
	}
	cmds := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	if err := say("ready"); err != nil {
		return err
	}
	select {
	case c, ok := <-cmds:
		if !ok || c != "start" {
			return nil // the comparison gave up before starting us
		}
	case <-ctx.Done():
		return nil
	}
	cpu0 := selfCPU()
	t0 := time.Now()
	if err := w.start(ctx); err != nil {
		return err
	}
	if err := say("started %d %d", t0.UnixNano(), time.Since(t0)); err != nil {
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	report := func(force bool) error {
		c := w.completed()
		if c == last && !force {
			return nil
		}
		last = c
		return say("progress %d %d %d", c, w.lastCompletion(), selfCPU()-cpu0)
	}
loop:
	for {
		select {
		case <-tick.C:
			if err := report(false); err != nil {
				return err
			}
		case c, ok := <-cmds:
			if !ok || c == "stop" {
				break loop
			}
		case <-ctx.Done():
			break loop
		}
	}
	if err := report(true); err != nil {
		return err
	}
	t1 := time.Now()
	if err := w.stop(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if err := say("stopped %d %d", time.Since(t1), w.anomalies()); err != nil {
		return err
	}
	if lat != nil {
		b, err := json.Marshal(lat.report())
		if err != nil {
			return fmt.Errorf("latency report: %w", err)
		}
		return say("latency %s", b)
	}
	return nil
}

func newWorkerSide(spec *workerSpec, pool *pgxpool.Pool, logger *slog.Logger, lat *latencyRec) (workerSide, error) {
	if spec.System == SystemRiver {
		return newRiverWorker(spec, pool, logger, lat)
	}
	return newGDWorker(spec, pool, logger, lat)
}

// latencyRec records, in a worker process, each job's pickup latency (the
// work function's entry minus NoopArgs.Ins) and completion latency (the
// completion event's arrival in the worker process — River's job_completed
// event, gendurable's StepEvent, both after the completion is written —
// minus NoopArgs.Ins). The job with Num == idleNum is recorded apart.
type latencyRec struct {
	mu       sync.Mutex
	ins      map[int64]int64 // job id → NoopArgs.Ins, picked and not yet completed
	idleID   int64
	pickup   []time.Duration
	complete []time.Duration
	idle     idleSample
}

type idleSample struct {
	PickupMillis   float64 `json:"pickup_ms"`   // -1: not seen
	CompleteMillis float64 `json:"complete_ms"` // -1: not seen
}

func newLatencyRec() *latencyRec {
	return &latencyRec{ins: map[int64]int64{}, idleID: -1, idle: idleSample{-1, -1}}
}

func (l *latencyRec) picked(id int64, a NoopArgs) {
	now := time.Now().UnixNano()
	if a.Ins == 0 || a.Warmup {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := time.Duration(now - a.Ins)
	if a.Num == idleNum {
		l.idleID = id
		l.idle.PickupMillis = ms(d)
	} else {
		l.pickup = append(l.pickup, d)
	}
	l.ins[id] = a.Ins
}

func (l *latencyRec) completed(id int64, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ins, ok := l.ins[id]
	if !ok {
		return
	}
	delete(l.ins, id)
	d := time.Duration(now - ins)
	if id == l.idleID {
		l.idle.CompleteMillis = ms(d)
		return
	}
	l.complete = append(l.complete, d)
}

// latencyReport is what a worker process reports of its latencies.
type latencyReport struct {
	Pickup   Dist       `json:"pickup"`
	Complete Dist       `json:"complete"`
	Idle     idleSample `json:"idle"`
}

// Dist summarizes latencies in milliseconds.
type Dist struct {
	N        int     `json:"n"`
	P50Milli float64 `json:"p50_ms"`
	P99Milli float64 `json:"p99_ms"`
	MaxMilli float64 `json:"max_ms"`
}

func (l *latencyRec) report() latencyReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	return latencyReport{Pickup: dist(l.pickup), Complete: dist(l.complete), Idle: l.idle}
}

// dist computes nearest-rank percentiles.
func dist(xs []time.Duration) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Dist{N: len(s), P50Milli: ms(rank(0.50)), P99Milli: ms(rank(0.99)), MaxMilli: ms(s[len(s)-1])}
}
