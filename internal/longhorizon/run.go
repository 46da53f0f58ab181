package longhorizon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/smallfile"
)

// System is what an adapter provides for one queue system.
type System interface {
	// Insert enqueues n jobs numbered from seq, each carrying pad as its
	// filler, in one batch; it returns once they are committed.
	Insert(ctx context.Context, seq int64, n int, pad string) error
	// Depth counts the jobs that could be claimed now and are not: runnable,
	// eligible, unclaimed — at most DepthCap of them (a bounded query).
	Depth(ctx context.Context) (int64, error)
	// DBNow reads the database's clock (clock_timestamp()).
	DBNow(ctx context.Context) (time.Time, error)
}

// DepthCap bounds the count of queue_depth: a larger backlog reads as
// DepthCap, so a poll's cost stays bounded however far the system falls
// behind.
const DepthCap = 1_000_000

// MaxBatch is the most jobs one Insert carries; the producer inserts every
// 10 ms what its rate has accrued, up to this (as the public adapters do).
const (
	MaxBatch    = 128
	batchPeriod = 10 * time.Millisecond
)

// Descriptor is the first line of an adapter's stdout.
type Descriptor struct {
	Kind          string   `json:"kind"` // "descriptor"
	System        string   `json:"system"`
	EventTables   []string `json:"event_tables"`
	EventIndexes  []string `json:"event_indexes,omitempty"`
	Extensions    []string `json:"extensions"`
	Version       string   `json:"version"`
	SchemaVersion string   `json:"schema_version"`
	DBName        string   `json:"db_name"`
	StartedAt     string   `json:"started_at"`
	InstanceID    int      `json:"instance_id"`
}

// Sample is one metric line.
type Sample struct {
	T           string  `json:"t"`
	System      string  `json:"system"`
	Kind        string  `json:"kind"`         // "adapter"
	SubjectKind string  `json:"subject_kind"` // "adapter"
	Subject     string  `json:"subject"`      // ""
	Metric      string  `json:"metric"`
	Value       float64 `json:"value"`
	WindowS     float64 `json:"window_s"`
	InstanceID  int     `json:"instance_id"`
}

// Metrics every sample tick emits, in order (observer metrics: instance 0 only).
var (
	Metrics         = []string{"claim_p50_ms", "claim_p95_ms", "claim_p99_ms", "enqueue_rate", "completion_rate", "queue_depth", "producer_target_rate"}
	ObserverMetrics = map[string]bool{"queue_depth": true, "producer_target_rate": true}
)

// TimeFormat is the protocol's timestamp: UTC, milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z"

// Telemetry is what workers report to. Safe for concurrent use.
type Telemetry struct {
	claims    Rolling
	enqueued  atomic.Int64
	completed atomic.Int64
	offsetNs  atomic.Int64 // database clock minus process clock
}

// Started records a job starting now in this process, inserted at insertedAt
// on the database clock: its claim latency is now, moved to the database
// clock by the measured offset, minus insertedAt.
func (t *Telemetry) Started(insertedAt time.Time) {
	now := time.Now()
	dbNow := now.Add(time.Duration(t.offsetNs.Load()))
	t.claims.Record(now, dbNow.Sub(insertedAt).Microseconds())
}

// Completed records n jobs whose completion has been written.
func (t *Telemetry) Completed(n int) { t.completed.Add(int64(n)) }

// Offset is the last measured offset of the database clock from this
// process's clock.
func (t *Telemetry) Offset() time.Duration { return time.Duration(t.offsetNs.Load()) }

// Emitter writes JSON lines, one Write per line, serialized and unbuffered:
// a line is out of the process as soon as it is emitted, so there is nothing
// to flush when a signal ends it.
type Emitter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewEmitter writes to w (the process's stdout).
func NewEmitter(w io.Writer) *Emitter { return &Emitter{w: w} }

// Emit writes v as one line.
func (e *Emitter) Emit(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err = e.w.Write(append(b, '\n'))
	return err
}

// Run drives a started system until ctx ends: it measures the clock offset
// (before returning from its first step and every 30 s), produces, polls the
// queue depth and emits the samples, aligned to wall-clock multiples of
// SampleEvery. The descriptor must have been emitted already. It returns nil
// when ctx ends, once its goroutines have stopped — or a second later, if
// one has not (a write to a stdout nobody reads blocks for as long, and the
// adapter must still exit within 5 s of SIGTERM; the process exits with
// the write unfinished, which a reader that stopped reading never sees).
func Run(ctx context.Context, cfg Config, name string, sys System, tel *Telemetry, out *Emitter, log *slog.Logger) error {
	if err := syncClock(ctx, sys, tel); err != nil {
		return fmt.Errorf("database clock: %w", err)
	}
	log.Info("long horizon: running", "system", name, "mode", cfg.ProducerMode, "rate", cfg.ProducerRate,
		"target_depth", cfg.TargetDepth, "workers", cfg.WorkerCount, "instance", cfg.InstanceID,
		"db_clock_offset", tel.Offset())
	r := &runner{cfg: cfg, name: name, sys: sys, tel: tel, out: out, log: log}
	r.rate.Store(math.Float64bits(cfg.ProducerRate))
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){r.clockLoop, r.depthLoop, r.produce, r.sample} {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	<-ctx.Done()
	select {
	case <-stopped:
	case <-time.After(stopWait):
		log.Warn("long horizon: a loop did not stop (a write to stdout that nobody reads?); exiting without it")
	}
	return nil
}

// stopWait is how long Run waits for its loops once ctx has ended.
const stopWait = time.Second

type runner struct {
	cfg  Config
	name string
	sys  System
	tel  *Telemetry
	out  *Emitter
	log  *slog.Logger

	rate      atomic.Uint64 // float64 bits: current producer target, jobs/s
	depth     atomic.Int64  // last polled queue depth (0 before the first poll)
	depthSeen atomic.Bool
	sincePoll atomic.Int64 // jobs inserted since the last depth poll
}

// syncClock measures the offset of the database clock: of 5 round trips,
// the shortest, assuming the database read its clock halfway through it.
func syncClock(ctx context.Context, sys System, tel *Telemetry) error {
	best := time.Duration(math.MaxInt64)
	var offset time.Duration
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		db, err := sys.DBNow(ctx)
		if err != nil {
			return err
		}
		rtt := time.Since(t0)
		if rtt < best {
			best, offset = rtt, db.Sub(t0.Add(rtt/2))
		}
	}
	tel.offsetNs.Store(int64(offset))
	return nil
}

func (r *runner) clockLoop(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := syncClock(ctx, r.sys, r.tel); err != nil && ctx.Err() == nil {
				r.log.Warn("long horizon: database clock", "err", err)
			}
		}
	}
}

// depthPollDuty spaces the depth polls by their duration: the next starts
// no sooner than this many times the last one's duration after it started.
// A count over a large backlog, under a snapshot held elsewhere, takes a
// third of a second or more; polled once a second it took over a third of a
// server process beside the system measured (BENCHMARKS.md, "Where a 2,000
// jobs/s hold's statement time goes").
const depthPollDuty = 10

// depthTargetPollGap is the time from one depth poll's start to the next's
// when the producer steers by the depth (it refills the queue only from a
// poll): depthPollDuty times the last poll's duration, within 20–200 ms. A
// fast system drains a small TARGET_DEPTH in far less than 200 ms, which
// left the queue empty between polls.
func depthTargetPollGap(took time.Duration) time.Duration {
	return min(200*time.Millisecond, max(20*time.Millisecond, depthPollDuty*took))
}

// fixedPollGap is the least time from one depth poll's start to the next's
// in fixed mode, where the depth is read at the sample ticks: a sample
// period, and at least depthPollDuty times the last poll's duration (a
// tick in between reports the last poll's depth).
func fixedPollGap(sampleEvery, took time.Duration) time.Duration {
	return backoff.Spaced(sampleEvery, depthPollDuty, took)
}

// depthLoop polls the queue depth every depthTargetPollGap when the
// producer steers by it (in every instance); in fixed mode the sample loop
// reads it at its ticks instead (pollDepthAtTick).
func (r *runner) depthLoop(ctx context.Context) {
	if r.cfg.ProducerMode != ModeDepthTarget {
		return
	}
	for {
		start := time.Now()
		r.pollDepth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(depthTargetPollGap(time.Since(start))))):
		}
	}
}

// pollDepth reads the queue depth once and records it (on an error, the
// last reading stays).
func (r *runner) pollDepth(ctx context.Context) {
	before := r.sincePoll.Load()
	n, err := r.sys.Depth(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("long horizon: queue depth", "err", err)
		}
		return
	}
	r.depth.Store(n)
	r.depthSeen.Store(true)
	r.sincePoll.Add(-before)
}

// depthAtTickTimeout bounds a depth read at a sample tick: a quarter of the
// sample period, at most a second.
func depthAtTickTimeout(sampleEvery time.Duration) time.Duration {
	return min(sampleEvery/4, time.Second)
}

// pollDepthAtTick reads the depth at a sample tick in fixed mode (instance
// 0 only: the one that reports it), unless the last poll was too slow for
// another so soon (fixedPollGap); next is when the next poll may start.
func (r *runner) pollDepthAtTick(ctx context.Context, next *time.Time) {
	if r.cfg.ProducerMode == ModeDepthTarget || r.cfg.InstanceID != 0 || time.Now().Before(*next) {
		return
	}
	start := time.Now()
	// Bounded: the tick's lines wait for it, and a count stuck on a lock
	// or a stalled database would hold every metric back (the last reading
	// is reported instead, and the next tries after ten times the bound).
	pctx, cancel := context.WithTimeout(ctx, depthAtTickTimeout(r.cfg.SampleEvery))
	r.pollDepth(pctx)
	if errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		r.log.Warn("long horizon: queue depth read past its bound; the sample reports the last one", "bound", depthAtTickTimeout(r.cfg.SampleEvery))
	}
	cancel()
	// Less half a period: ticks come a little after their boundary, later
	// or sooner from one to the next.
	*next = start.Add(fixedPollGap(r.cfg.SampleEvery, time.Since(start)) - r.cfg.SampleEvery/2)
}

func (r *runner) readRateFile() {
	if r.cfg.RateControlFile == "" {
		return
	}
	b, err := readRateFile(r.cfg.RateControlFile)
	if err != nil {
		return
	}
	if v, err := parseRate(strings.TrimSpace(string(b))); err == nil {
		r.rate.Store(math.Float64bits(v))
	}
}

// maxRateFile bounds what readRateFile reads: the file holds one number.
const maxRateFile = 64

// readRateFile reads a rate control file: a regular file of at most
// maxRateFile bytes (smallfile.Read). Anything else is an error: /dev/zero
// would be read until memory ran out, and opening a FIFO would block the
// producer until something wrote to it.
func readRateFile(name string) ([]byte, error) {
	return smallfile.Read(name, maxRateFile)
}

// produce inserts jobs: in fixed mode, every 10 ms what the rate has accrued
// since (an open loop: credit a slow insert leaves behind is inserted
// after it, MaxBatch at a time, and so are the jobs of a failed insert); in depth-target mode, up to MaxBatch
// whenever the last polled depth plus what was inserted since is below
// TARGET_DEPTH.
func (r *runner) produce(ctx context.Context) {
	pad := strings.Repeat("x", max(0, r.cfg.PayloadBytes-32))
	var seq int64
	var credit float64
	last := time.Now()
	lastFile := time.Time{}
	for ctx.Err() == nil {
		n := 0
		if r.cfg.ProducerMode == ModeDepthTarget {
			if !r.depthSeen.Load() {
				sleepCtx(ctx, 50*time.Millisecond)
				continue
			}
			n = min(MaxBatch, r.cfg.TargetDepth-int(r.depth.Load()+r.sincePoll.Load()))
			if n <= 0 {
				sleepCtx(ctx, 20*time.Millisecond)
				continue
			}
		} else {
			if time.Since(lastFile) >= time.Second {
				r.readRateFile()
				lastFile = time.Now()
			}
			if d := batchPeriod - time.Since(last); d > 0 {
				sleepCtx(ctx, d)
			}
			now := time.Now()
			credit += math.Float64frombits(r.rate.Load()) * now.Sub(last).Seconds()
			last = now
			if credit < 1 {
				continue
			}
			n = min(MaxBatch, int(credit))
			credit -= float64(n)
		}
		if err := r.sys.Insert(ctx, seq, n, pad); err != nil {
			if ctx.Err() != nil {
				return
			}
			if r.cfg.ProducerMode != ModeDepthTarget {
				credit += float64(n) // offered still: inserted with the next batch
			}
			r.log.Warn("long horizon: insert", "jobs", n, "err", err)
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		seq += int64(n)
		r.tel.enqueued.Add(int64(n))
		r.sincePoll.Add(int64(n))
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// nextBoundary is the first multiple of every (since the Unix epoch) after now.
func nextBoundary(now time.Time, every time.Duration) time.Time {
	return now.Truncate(every).Add(every)
}

// sample emits the metrics at every wall-clock multiple of SampleEvery but
// the first after Run started, where it starts counting: every rate is
// over a whole window, the time since the previous tick (a tick missed or
// fired late, the process stopped, is skipped with the one after it, not
// caught up). In fixed mode it reads
// the queue depth at each tick (pollDepthAtTick), after taking the rates.
func (r *runner) sample(ctx context.Context) {
	var nextPoll time.Time
	t := time.NewTimer(time.Until(nextBoundary(time.Now(), r.cfg.SampleEvery)))
	select {
	case <-ctx.Done():
		t.Stop()
		return
	case <-t.C:
	}
	lastTick := time.Now()
	lastEnq, lastDone := r.tel.enqueued.Load(), r.tel.completed.Load()
	rebase := false
	r.pollDepthAtTick(ctx, &nextPoll)
	for {
		at := nextBoundary(time.Now(), r.cfg.SampleEvery)
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		now := time.Now()
		enq, done := r.tel.enqueued.Load(), r.tel.completed.Load()
		// A tick that fires late (the process was stopped, or starved) or
		// after ticks were missed (a write held the loop) would label a
		// count of more than its window with its own t and window_s: it is
		// skipped, and so is the next one, which only starts a whole window
		// again.
		if late := now.Sub(at) > r.cfg.SampleEvery/2 || now.Sub(lastTick) > r.cfg.SampleEvery*3/2; late || rebase {
			rebase = late
			lastTick, lastEnq, lastDone = now, enq, done
			r.pollDepthAtTick(ctx, &nextPoll)
			continue
		}
		dt := now.Sub(lastTick).Seconds()
		q := r.tel.claims.Window(now).Quantiles(0.50, 0.95, 0.99)
		r.pollDepthAtTick(ctx, &nextPoll)
		mode := r.cfg.ProducerMode
		target := math.Float64frombits(r.rate.Load())
		if mode == ModeDepthTarget {
			target = 0
		}
		values := map[string][2]float64{
			"claim_p50_ms":         {ms(q[0]), windowSecs},
			"claim_p95_ms":         {ms(q[1]), windowSecs},
			"claim_p99_ms":         {ms(q[2]), windowSecs},
			"enqueue_rate":         {float64(enq-lastEnq) / dt, r.cfg.SampleEvery.Seconds()},
			"completion_rate":      {float64(done-lastDone) / dt, r.cfg.SampleEvery.Seconds()},
			"queue_depth":          {float64(r.depth.Load()), 0},
			"producer_target_rate": {target, 0},
		}
		lastTick, lastEnq, lastDone = now, enq, done
		ts := at.UTC().Format(TimeFormat)
		for _, m := range Metrics {
			if ObserverMetrics[m] && r.cfg.InstanceID != 0 {
				continue
			}
			v := values[m]
			if err := r.out.Emit(Sample{T: ts, System: r.name, Kind: "adapter", SubjectKind: "adapter",
				Metric: m, Value: round3(v[0]), WindowS: v[1], InstanceID: r.cfg.InstanceID}); err != nil {
				r.log.Warn("long horizon: write sample", "err", err)
			}
		}
	}
}

func ms(micros int64) float64 { return float64(micros) / 1000 }

// round3 keeps three decimals (microseconds of a millisecond figure).
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
