package compare

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Result is one throughput run of one system in one case (setting × worker
// processes).
type Result struct {
	System  string `json:"system"`
	Setting string `json:"setting"`
	Procs   int    `json:"procs"` // worker processes
	Round   int    `json:"round"`
	N       int    `json:"n"`
	// StatsFinishedFrac is the frequency of the finished status in the jobs
	// table's pg_stats when the run started (realistic statistics: close to
	// 1; fresh: 0), and when its work was done (autovacuum may have
	// analyzed the table meanwhile; -1: unknown).
	StatsFinishedFrac      float64 `json:"stats_finished_frac"`
	StatsFinishedFracAfter float64 `json:"stats_finished_frac_after"`
	InsertSeconds          float64 `json:"insert_seconds"`
	InsertRowsPerSec       float64 `json:"insert_rows_per_sec"`
	StartMillis            float64 `json:"start_ms"`     // longest Start call of the processes (part of the work time)
	WorkSeconds            float64 `json:"work_seconds"` // from the first Start to the last completion committed
	JobsPerSec             float64 `json:"jobs_per_sec"`
	StopMillis             float64 `json:"stop_ms"`           // longest Stop call of the processes
	XactsPerJob            float64 `json:"xacts_per_job"`     // commits in the bench database during the work phase, per job
	WALBytesPerJob         float64 `json:"wal_bytes_per_job"` // server-wide WAL during the work phase, per job
	// CPU during the work phase, per job: the worker processes (the
	// system's Go side, summed) and the whole machine (PostgreSQL, the
	// workers, and anything else running: noisy on a shared machine; -1
	// where unknown).
	ClientCPUMicrosPerJob  float64 `json:"client_cpu_us_per_job"`
	MachineCPUMicrosPerJob float64 `json:"machine_cpu_us_per_job"`
	Anomalies              int64   `json:"anomalies"`    // events other than a plain completion (failures, retries, fenced outcomes)
	DBCompleted            int64   `json:"db_completed"` // rows completed/done in the table after the run
	// Load1 is the machine's 1-minute load average (/proc/loadavg) before
	// the run's reset and after its last completion.
	Load1Before float64 `json:"load1_before"`
	Load1After  float64 `json:"load1_after"`
}

// producer inserts jobs: one bulk-insert call per batch.
type producer interface {
	insert(ctx context.Context, args []NoopArgs) error
}

func newProducer(o *Options, system string, pool *pgxpool.Pool, riverFast bool, logger *slog.Logger) (producer, error) {
	if system == SystemRiver {
		return newRiverProducer(o, pool, riverFast, logger)
	}
	return newGDProducer(o, pool, logger)
}

// insertRange inserts jobs Num from..to-1 in batches of o.InsertBatch.
func insertRange(ctx context.Context, o *Options, p producer, from, to int) error {
	args := make([]NoopArgs, 0, o.InsertBatch)
	for lo := from; lo < to; lo += o.InsertBatch {
		hi := min(lo+o.InsertBatch, to)
		args = args[:0]
		for i := lo; i < hi; i++ {
			args = append(args, NoopArgs{Num: i})
		}
		if err := p.insert(ctx, args); err != nil {
			return err
		}
	}
	return nil
}

// producerPoolConns: the bulk producer inserts one batch at a time; the
// continuous producer keeps up to ContinuousInserters calls in flight.
const producerPoolConns = 2

func dbCounts(ctx context.Context, admin *pgxpool.Pool, o *Options, system string) (done, total int64, err error) {
	if system == SystemRiver {
		return riverDBCounts(ctx, admin, o)
	}
	return gdDBCounts(ctx, admin, o)
}

// Run runs the whole comparison and returns its report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	o.Progress = &lockedWriter{w: o.Progress}
	progress := o.Progress
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
	for _, mode := range o.Modes {
		switch mode {
		case ModeThroughput:
			err = runThroughputs(ctx, &o, admin, rep)
		case ModeContinuous:
			err = runContinuous(ctx, &o, admin, rep)
		case ModeInsert:
			err = runInserts(ctx, &o, admin, rep)
		}
		if err != nil {
			rep.finish()
			return rep, err
		}
	}
	// Leave the bench database small.
	if err := emptyAll(ctx, admin, &o); err != nil {
		fmt.Fprintf(progress, "final cleanup: %v\n", err)
	}
	rep.finish()
	fmt.Fprintf(progress, "total %.1fs\n", time.Since(began).Seconds())
	return rep, nil
}

func runThroughputs(ctx context.Context, o *Options, admin *pgxpool.Pool, rep *Report) error {
	for round := 1; round <= o.Rounds; round++ {
		for _, c := range o.cases() {
			s := o.setting(c.setting)
			for _, system := range []string{SystemRiver, SystemGendurable} {
				fmt.Fprintf(o.Progress, "[throughput %s %s procs=%d round %d/%d] %s\n", system, c.setting, c.procs, round, o.Rounds, s.describe(system))
				res, err := runOne(ctx, o, admin, s, c.procs, system, round)
				if err != nil {
					return fmt.Errorf("%s %s round %d: %w", system, c.key(), round, err)
				}
				rep.Results = append(rep.Results, res)
				fmt.Fprintf(o.Progress, "  insert %d rows in %.2fs = %.0f rows/s; worked in %.2fs = %.0f jobs/s (start %.0fms, stop %.0fms, %.2f xacts/job, %.0f WAL B/job, CPU µs/job: workers %.0f machine %.0f; stats finished %.2f→%.2f; load1 %.2f→%.2f)\n",
					res.N, res.InsertSeconds, res.InsertRowsPerSec, res.WorkSeconds, res.JobsPerSec,
					res.StartMillis, res.StopMillis, res.XactsPerJob, res.WALBytesPerJob,
					res.ClientCPUMicrosPerJob, res.MachineCPUMicrosPerJob, res.StatsFinishedFrac, res.StatsFinishedFracAfter, res.Load1Before, res.Load1After)
			}
		}
		if o.LimitDuration > 0 {
			fmt.Fprintf(o.Progress, "[limit round %d/%d] %d-row UPDATE … FROM unnest by primary key on %d connections for %s\n",
				round, o.Rounds, o.LimitBatch, o.PoolConns, o.LimitDuration)
			res, err := runLimit(ctx, o, admin, round)
			if err != nil {
				return fmt.Errorf("limit round %d: %w", round, err)
			}
			rep.Limits = append(rep.Limits, res)
			fmt.Fprintf(o.Progress, "  %.0f rows/s: job ceiling %.0f jobs/s (load1 %.2f)\n", res.RowsPerSec, res.JobCeiling, res.Load1)
		}
	}
	return nil
}

func newLogger(w io.Writer, system string) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})).With("system", system)
}

// workerSpecFor is the worker process spec of a system in a setting.
func (o *Options) workerSpecFor(system string, s setting, expect int) workerSpec {
	spec := workerSpec{
		System: system, DatabaseURL: o.DatabaseURL, Database: o.Database,
		PoolConns: o.PoolConns, Expect: expect,
		RiverMaxWorkers:        s.riverMaxWorkers,
		RiverFetchCooldown:     s.riverFetchCooldown,
		RiverFetchPollInterval: s.riverFetchPollInterval,
		GD:                     s.gd,
	}
	spec.Schema = o.GDSchema
	if system == SystemRiver {
		spec.Schema = o.RiverSchema
	}
	return spec
}

// openProducer opens the producer's pool (all connections up front) and
// its insert-only client or engine.
func openProducer(ctx context.Context, o *Options, system string, riverFast bool, conns int32) (producer, *pgxpool.Pool, error) {
	pool, err := openPool(ctx, o, conns, "gendurable-bench-producer-"+system)
	if err != nil {
		return nil, nil, err
	}
	if err := warmPool(ctx, pool); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("warm pool: %w", err)
	}
	p, err := newProducer(o, system, pool, riverFast, newLogger(o.Progress, system))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return p, pool, nil
}

func runOne(ctx context.Context, o *Options, admin *pgxpool.Pool, s setting, procs int, system string, round int) (res Result, err error) {
	res = Result{System: system, Setting: s.name, Procs: procs, Round: round, N: o.N, Load1Before: loadAvg1()}
	if res.StatsFinishedFrac, err = reset(ctx, admin, o, system); err != nil {
		return res, err
	}
	g, err := spawnWorkers(ctx, o.workerSpecFor(system, s, o.N), procs, o.Progress)
	if err != nil {
		return res, err
	}
	defer g.kill()
	prod, pool, err := openProducer(ctx, o, system, o.RiverInsertFast, producerPoolConns)
	if err != nil {
		return res, err
	}
	defer pool.Close()

	var insertDur time.Duration
	insertErr := make(chan error, 1)
	if !o.Concurrent {
		t0 := time.Now()
		if err := insertRange(ctx, o, prod, 0, o.N); err != nil {
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
	if err := g.send("start"); err != nil {
		return res, fmt.Errorf("start workers: %w", err)
	}
	if o.Concurrent {
		go func() {
			t0 := time.Now()
			err := insertRange(ctx, o, prod, 0, o.N)
			insertDur = time.Since(t0)
			insertErr <- err
		}()
	}
	t1 := time.Now()
	target := int64(o.N)
	err = g.wait(ctx, o.runTimeout(o.N), func() {
		fmt.Fprintf(o.Progress, "  ... %d/%d done after %.0fs\n", g.completed(), o.N, time.Since(t1).Seconds())
	}, func() bool {
		var n int64
		for _, p := range g.procs {
			n += p.count
		}
		return n >= target
	})
	if err != nil {
		done, total, _ := dbCounts(ctx, admin, o, system)
		return res, fmt.Errorf("work phase: %w (%d completions seen, database has %d done of %d rows)", err, g.completed(), done, total)
	}
	cpu1 := readCPU()
	res.Load1After = loadAvg1()
	res.StatsFinishedFracAfter = statsAfter(ctx, admin, o, system)
	var firstStart, lastDone int64
	var startDur, clientCPU time.Duration
	g.lock(func() {
		for _, p := range g.procs {
			if firstStart == 0 || p.startNs < firstStart {
				firstStart = p.startNs
			}
			lastDone = max(lastDone, p.lastNs)
			startDur = max(startDur, p.startDur)
			clientCPU += p.cpu
		}
	})
	if err := <-insertErr; err != nil {
		return res, err
	}

	if err := g.stop(ctx); err != nil {
		return res, fmt.Errorf("stop: %w", err)
	}
	var stopDur time.Duration
	g.lock(func() {
		for _, p := range g.procs {
			stopDur = max(stopDur, p.stopDur)
			res.Anomalies += p.anomalies
		}
	})
	pool.Close()                       // its backends exit and flush their statistics
	time.Sleep(200 * time.Millisecond) // so do the workers'
	after, err := readStats(ctx, admin)
	if err != nil {
		return res, fmt.Errorf("stats: %w", err)
	}
	xacts, wal, err := statsDelta(ctx, admin, before, after)
	if err != nil {
		return res, fmt.Errorf("stats: %w", err)
	}
	done, total, err := dbCounts(ctx, admin, o, system)
	if err != nil {
		return res, fmt.Errorf("count: %w", err)
	}
	if total != int64(o.N) || done != int64(o.N) {
		return res, fmt.Errorf("database disagrees: %d of %d rows completed, want %d of %d", done, total, o.N, o.N)
	}

	workDur := time.Duration(lastDone - firstStart)
	n := float64(o.N)
	res.InsertSeconds = insertDur.Seconds()
	res.InsertRowsPerSec = n / insertDur.Seconds()
	res.StartMillis = ms(startDur)
	res.StopMillis = ms(stopDur)
	res.WorkSeconds = workDur.Seconds()
	res.JobsPerSec = n / workDur.Seconds()
	res.XactsPerJob = float64(xacts) / n
	res.WALBytesPerJob = float64(wal) / n
	res.ClientCPUMicrosPerJob = float64(clientCPU) / float64(time.Microsecond) / n
	res.MachineCPUMicrosPerJob = -1
	if cpu0.hasBusy && cpu1.hasBusy {
		res.MachineCPUMicrosPerJob = float64(cpu1.busy-cpu0.busy) / float64(time.Microsecond) / n
	}
	res.DBCompleted = done
	return res, nil
}

// statsAfter reads the finished fraction at the end of a run (-1 if it
// cannot).
func statsAfter(ctx context.Context, admin *pgxpool.Pool, o *Options, system string) float64 {
	f, err := o.finishedFraction(ctx, admin, system)
	if err != nil {
		return -1
	}
	return f
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
