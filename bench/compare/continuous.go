package compare

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ContinuousResult is one continuous run: a producer (the comparison's own
// process) inserting at a fixed rate into a queue worked by one worker
// process at library defaults.
//
// Latencies are measured, over the jobs inserted after the warm-up
// (ContinuousWarmup: the queue goes from idle to busy), from NoopArgs.Ins, the producer's wall clock just
// before the InsertMany call that carried the job (the insert's commit comes
// after it, so pickup includes the insert statement itself): pickup = entry
// of the work function in the worker process; completion = arrival of the
// completion event in the worker process (River's job_completed, after the
// completer wrote the row; gendurable's StepEvent, after the outcome was
// written). Both processes run on this machine: one clock.
type ContinuousResult struct {
	System            string  `json:"system"`
	Rate              int     `json:"rate"` // jobs/s asked of the producer
	Round             int     `json:"round"`
	StatsFinishedFrac float64 `json:"stats_finished_frac"` // as in Result
	// StatsFinishedFracAfter is read once the rate's jobs are drained.
	StatsFinishedFracAfter float64 `json:"stats_finished_frac_after"`
	Inserted               int     `json:"inserted"`      // jobs inserted at the rate (the idle probe not counted)
	WarmupJobs             int     `json:"warmup_jobs"`   // of which inserted during the warm-up: not in the latency figures
	AchievedRate           float64 `json:"achieved_rate"` // Inserted / the producer's elapsed time
	Pickup                 Dist    `json:"pickup"`
	Complete               Dist    `json:"complete"`
	// InsertCall is the producer's InsertMany calls' own duration: the part
	// of every latency before the rows are committed and visible.
	InsertCall Dist `json:"insert_call"`
	// Pickup and completion of the one job inserted after the queue had
	// drained and stayed idle for IdleWait (-1: not measured).
	IdlePickupMillis   float64 `json:"idle_pickup_ms"`
	IdleCompleteMillis float64 `json:"idle_complete_ms"`
	IdleWaitSeconds    float64 `json:"idle_wait_seconds"`
	Anomalies          int64   `json:"anomalies"`
	Load1Before        float64 `json:"load1_before"`
	Load1After         float64 `json:"load1_after"`
}

func runContinuous(ctx context.Context, o *Options, admin *pgxpool.Pool, rep *Report) error {
	s := o.continuousSetting()
	for round := 1; round <= o.Rounds; round++ {
		for _, rate := range o.Rates {
			for _, system := range []string{SystemRiver, SystemGendurable} {
				fmt.Fprintf(o.Progress, "[continuous %s %d/s round %d/%d] %s\n", system, rate, round, o.Rounds, s.describe(system))
				res, err := runContinuousOne(ctx, o, admin, s, system, rate, round)
				if err != nil {
					return fmt.Errorf("continuous %s %d/s round %d: %w", system, rate, round, err)
				}
				rep.Continuous = append(rep.Continuous, res)
				fmt.Fprintf(o.Progress, "  %d jobs at %.0f/s (InsertMany call p50 %.1fms): pickup p50 %.1fms p99 %.1fms, completion p50 %.1fms p99 %.1fms; load1 %.2f→%.2f\n",
					res.Inserted, res.AchievedRate, res.InsertCall.P50Milli, res.Pickup.P50Milli, res.Pickup.P99Milli,
					res.Complete.P50Milli, res.Complete.P99Milli, res.Load1Before, res.Load1After)
				if o.IdleWait > 0 {
					fmt.Fprintf(o.Progress, "  after %gs idle: pickup %.1fms, completion %.1fms\n",
						res.IdleWaitSeconds, res.IdlePickupMillis, res.IdleCompleteMillis)
				}
			}
		}
	}
	return nil
}

func runContinuousOne(ctx context.Context, o *Options, admin *pgxpool.Pool, s setting, system string, rate, round int) (res ContinuousResult, err error) {
	res = ContinuousResult{System: system, Rate: rate, Round: round, Load1Before: loadAvg1(),
		IdlePickupMillis: -1, IdleCompleteMillis: -1, IdleWaitSeconds: o.IdleWait.Seconds()}
	if res.StatsFinishedFrac, err = reset(ctx, admin, o, system); err != nil {
		return res, err
	}
	expect := int(float64(rate)*o.ContinuousDuration.Seconds()*1.1) + 1000
	spec := o.workerSpecFor(system, s, expect)
	spec.Latency = true
	g, err := spawnWorkers(ctx, spec, 1, o.Progress)
	if err != nil {
		return res, err
	}
	defer g.kill()
	prod, pool, err := openProducer(ctx, o, system, false, int32(o.ContinuousInserters))
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if err := g.send("start"); err != nil {
		return res, fmt.Errorf("start worker: %w", err)
	}
	if err := g.wait(ctx, 60*time.Second, nil, func() bool { return g.procs[0].started }); err != nil {
		return res, fmt.Errorf("worker start: %w", err)
	}
	// Let the worker settle (River's notification listener, leader
	// election; gendurable's first idle picks) before the clock runs.
	select {
	case <-time.After(o.ContinuousSettle):
	case <-ctx.Done():
		return res, ctx.Err()
	}

	// The producer: every tick, hand the rows the rate asks for by now to a
	// free inserter (one InsertMany each, at most InsertBatch rows); while
	// every inserter is busy, the rows wait for the next tick.
	type batch struct {
		from, n int
		warmup  bool
	}
	batches := make(chan batch)
	var (
		mu       sync.Mutex
		calls    []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	for range o.ContinuousInserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var args []NoopArgs
			for b := range batches {
				args = args[:0]
				ins := time.Now().UnixNano()
				for i := range b.n {
					args = append(args, NoopArgs{Num: b.from + i, Ins: ins, Warmup: b.warmup})
				}
				err := prod.insert(ctx, args)
				d := time.Since(time.Unix(0, ins))
				mu.Lock()
				calls = append(calls, d)
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(o.ContinuousTick)
	t0 := time.Now()
	dispatched, warmupJobs := 0, 0
produce:
	for {
		elapsed := time.Since(t0)
		if elapsed >= o.ContinuousDuration {
			break
		}
		want := int(float64(rate) * elapsed.Seconds())
		if n := min(want-dispatched, o.InsertBatch); n > 0 {
			warm := elapsed < o.ContinuousWarmup
			select {
			case batches <- batch{dispatched, n, warm}:
				dispatched += n
				if warm {
					warmupJobs += n
				}
			default:
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			break produce
		}
	}
	tick.Stop()
	close(batches)
	wg.Wait()
	elapsed := time.Since(t0)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if firstErr != nil {
		return res, firstErr
	}
	inserted := dispatched
	res.Inserted, res.WarmupJobs = inserted, warmupJobs
	res.AchievedRate = float64(inserted) / elapsed.Seconds()
	res.InsertCall = dist(calls)
	countAtLeast := func(n int) func() bool {
		return func() bool { return g.procs[0].count >= int64(n) }
	}
	progress := func() {
		fmt.Fprintf(o.Progress, "  ... %d/%d done\n", g.completed(), inserted)
	}
	if err := g.wait(ctx, o.runTimeout(inserted), progress, countAtLeast(inserted)); err != nil {
		return res, fmt.Errorf("drain: %w", err)
	}
	res.StatsFinishedFracAfter = statsAfter(ctx, admin, o, system)

	// Pickup after an idle period: the queue drained; leave it idle, then
	// insert one job.
	if o.IdleWait > 0 {
		select {
		case <-time.After(o.IdleWait):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if err := prod.insert(ctx, []NoopArgs{{Num: idleNum, Ins: time.Now().UnixNano()}}); err != nil {
			return res, err
		}
		if err := g.wait(ctx, 60*time.Second, nil, countAtLeast(inserted+1)); err != nil {
			return res, fmt.Errorf("idle probe: %w", err)
		}
	}
	res.Load1After = loadAvg1()
	if err := g.stop(ctx); err != nil {
		return res, fmt.Errorf("stop: %w", err)
	}
	p := g.procs[0]
	p.mu.Lock()
	lat, anomalies := p.latency, p.anomalies
	p.mu.Unlock()
	if lat == nil {
		return res, fmt.Errorf("worker reported no latencies")
	}
	res.Pickup, res.Complete, res.Anomalies = lat.Pickup, lat.Complete, anomalies
	res.IdlePickupMillis, res.IdleCompleteMillis = lat.Idle.PickupMillis, lat.Idle.CompleteMillis

	want := int64(inserted)
	if o.IdleWait > 0 {
		want++
	}
	done, total, err := dbCounts(ctx, admin, o, system)
	if err != nil {
		return res, fmt.Errorf("count: %w", err)
	}
	if done != want || total != want {
		return res, fmt.Errorf("database disagrees: %d of %d rows completed, want %d of %d", done, total, want, want)
	}
	return res, nil
}
