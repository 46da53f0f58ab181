package compare

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Result is one run of one system in one setting.
type Result struct {
	System           string  `json:"system"`
	Setting          string  `json:"setting"`
	Round            int     `json:"round"`
	N                int     `json:"n"`
	InsertSeconds    float64 `json:"insert_seconds"`
	InsertRowsPerSec float64 `json:"insert_rows_per_sec"`
	StartMillis      float64 `json:"start_ms"`     // Start call (part of the work time)
	WorkSeconds      float64 `json:"work_seconds"` // from Start to the last completion committed
	JobsPerSec       float64 `json:"jobs_per_sec"`
	StopMillis       float64 `json:"stop_ms"`
	XactsPerJob      float64 `json:"xacts_per_job"`     // commits in the bench database during the work phase, per job
	WALBytesPerJob   float64 `json:"wal_bytes_per_job"` // server-wide WAL during the work phase, per job
	// CPU during the work phase, per job: this process (the system's Go
	// side) and the whole machine (PostgreSQL, this process, and anything
	// else running: noisy on a shared machine; -1 where unknown).
	ClientCPUMicrosPerJob  float64 `json:"client_cpu_us_per_job"`
	MachineCPUMicrosPerJob float64 `json:"machine_cpu_us_per_job"`
	Anomalies              int64   `json:"anomalies"`    // events other than a plain completion (failures, retries, fenced outcomes)
	DBCompleted            int64   `json:"db_completed"` // rows completed/done in the table after the run
}

// runner is one system's side of a run.
type runner interface {
	insert(ctx context.Context, from, to int) error
	start(ctx context.Context) error
	completed() int64
	finished() <-chan struct{}
	anomalies() int64
	stop(ctx context.Context) error
	dbCounts(ctx context.Context, admin *pgxpool.Pool) (done, total int64, err error)
}

// Run runs the whole comparison and returns its report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	if err := ensureDatabase(ctx, &o); err != nil {
		return nil, fmt.Errorf("ensure database %s: %w", o.Database, err)
	}
	admin, err := openPool(ctx, &o, 2, "gendurable-bench-admin")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := migrateAll(ctx, admin, &o); err != nil {
		return nil, err
	}

	rep := &Report{Options: summarize(&o)}
	began := time.Now()
	for round := 1; round <= o.Rounds; round++ {
		for _, name := range o.Settings {
			s := o.setting(name)
			for _, system := range []string{SystemRiver, SystemGendurable} {
				fmt.Fprintf(progress, "[%s %s round %d/%d] %s\n", system, name, round, o.Rounds, s.describe(system))
				res, err := runOne(ctx, &o, admin, s, system, round, progress)
				if err != nil {
					return rep, fmt.Errorf("%s %s round %d: %w", system, name, round, err)
				}
				rep.Results = append(rep.Results, res)
				fmt.Fprintf(progress, "  insert %d rows in %.2fs = %.0f rows/s; worked in %.2fs = %.0f jobs/s (start %.0fms, stop %.0fms, %.2f xacts/job, %.0f WAL B/job, CPU µs/job: client %.0f machine %.0f)\n",
					res.N, res.InsertSeconds, res.InsertRowsPerSec, res.WorkSeconds, res.JobsPerSec,
					res.StartMillis, res.StopMillis, res.XactsPerJob, res.WALBytesPerJob,
					res.ClientCPUMicrosPerJob, res.MachineCPUMicrosPerJob)
			}
		}
	}
	// Leave the bench database small.
	if err := reset(ctx, admin, &o); err != nil {
		fmt.Fprintf(progress, "final cleanup: %v\n", err)
	}
	rep.finish()
	fmt.Fprintf(progress, "total %.1fs\n", time.Since(began).Seconds())
	return rep, nil
}

func newLogger(w io.Writer, system string) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})).With("system", system)
}

func runOne(ctx context.Context, o *Options, admin *pgxpool.Pool, s setting, system string, round int, progress io.Writer) (res Result, err error) {
	res = Result{System: system, Setting: s.name, Round: round, N: o.N}
	if err := reset(ctx, admin, o); err != nil {
		return res, err
	}
	pool, err := openPool(ctx, o, o.PoolConns, "gendurable-bench-"+system)
	if err != nil {
		return res, err
	}
	poolClosed := false
	defer func() {
		if !poolClosed {
			pool.Close()
		}
	}()
	if err := warmPool(ctx, pool); err != nil {
		return res, fmt.Errorf("warm pool: %w", err)
	}

	var r runner
	logger := newLogger(progress, system)
	switch system {
	case SystemRiver:
		rr, err := newRiverRun(o, s, pool, logger)
		if err != nil {
			return res, err
		}
		r = rr
	default:
		gr, err := newGDRun(o, s, pool, logger)
		if err != nil {
			return res, err
		}
		r = gr
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = r.stop(context.WithoutCancel(ctx))
		}
	}()

	var insertDur time.Duration
	insertErr := make(chan error, 1)
	if !o.Concurrent {
		t0 := time.Now()
		if err := r.insert(ctx, 0, o.N); err != nil {
			return res, err
		}
		insertDur = time.Since(t0)
		insertErr <- nil
	}

	before, err := readStats(ctx, admin)
	if err != nil {
		return res, fmt.Errorf("stats: %w", err)
	}
	cpu0 := readCPU()
	t1 := time.Now()
	if err := r.start(ctx); err != nil {
		return res, fmt.Errorf("start: %w", err)
	}
	startDur := time.Since(t1)
	if o.Concurrent {
		go func() {
			t0 := time.Now()
			err := r.insert(ctx, 0, o.N)
			insertDur = time.Since(t0)
			insertErr <- err
		}()
	}

	timeout := time.NewTimer(o.runTimeout())
	defer timeout.Stop()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var workDur time.Duration
wait:
	for {
		select {
		case <-r.finished():
			workDur = time.Since(t1)
			cpu1 := readCPU()
			res.ClientCPUMicrosPerJob = float64(cpu1.self-cpu0.self) / float64(time.Microsecond) / float64(o.N)
			res.MachineCPUMicrosPerJob = -1
			if cpu0.hasBusy && cpu1.hasBusy {
				res.MachineCPUMicrosPerJob = float64(cpu1.busy-cpu0.busy) / float64(time.Microsecond) / float64(o.N)
			}
			break wait
		case <-tick.C:
			fmt.Fprintf(progress, "  ... %d/%d done after %.0fs\n", r.completed(), o.N, time.Since(t1).Seconds())
		case <-timeout.C:
			done, total, _ := r.dbCounts(ctx, admin)
			return res, fmt.Errorf("timed out after %s: %d completions seen, database has %d done of %d rows",
				o.runTimeout(), r.completed(), done, total)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	if err := <-insertErr; err != nil {
		return res, err
	}

	t2 := time.Now()
	stopped = true
	if err := r.stop(ctx); err != nil {
		return res, fmt.Errorf("stop: %w", err)
	}
	res.StopMillis = ms(time.Since(t2))
	pool.Close() // its backends exit and flush their statistics
	poolClosed = true
	time.Sleep(200 * time.Millisecond)
	after, err := readStats(ctx, admin)
	if err != nil {
		return res, fmt.Errorf("stats: %w", err)
	}
	xacts, wal, err := statsDelta(ctx, admin, before, after)
	if err != nil {
		return res, fmt.Errorf("stats: %w", err)
	}

	done, total, err := r.dbCounts(ctx, admin)
	if err != nil {
		return res, fmt.Errorf("count: %w", err)
	}
	if total != int64(o.N) || done != int64(o.N) {
		return res, fmt.Errorf("database disagrees: %d of %d rows completed, want %d of %d", done, total, o.N, o.N)
	}

	res.InsertSeconds = insertDur.Seconds()
	res.InsertRowsPerSec = float64(o.N) / insertDur.Seconds()
	res.StartMillis = ms(startDur)
	res.WorkSeconds = workDur.Seconds()
	res.JobsPerSec = float64(o.N) / workDur.Seconds()
	res.XactsPerJob = float64(xacts) / float64(o.N)
	res.WALBytesPerJob = float64(wal) / float64(o.N)
	res.Anomalies = r.anomalies()
	res.DBCompleted = done
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
