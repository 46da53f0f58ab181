// Command compare runs the same trivial-job workload through River and
// through gendurable on one PostgreSQL, alternating A B A B for several
// rounds, in three modes: throughput (1, 2 and 4 worker processes, several
// worker counts), continuous (a producer at fixed rates, pickup and
// completion latency) and insert (bulk insert paths). Every run starts from
// realistic planner statistics (-fresh-stats for a new installation). The
// last line of its output is "ratio gendurable/river jobs_per_sec: X.XX"
// (each system at its best, one worker process, medians of the rounds).
//
//	cd bench && go run ./cmd/compare [-rounds 3] [-n 50000] [-modes throughput,continuous,insert] [-json]
//
// The binary re-executes itself as its worker processes (see
// compare.IsWorker).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/gendurable/gendurable/bench/compare"
)

func main() {
	if compare.IsWorker() {
		os.Exit(compare.WorkerMain())
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func intList(name, s string) ([]int, error) {
	var out []int
	for _, x := range splitList(s) {
		n, err := strconv.Atoi(x)
		if err != nil {
			return nil, fmt.Errorf("-%s: %q is not an integer", name, x)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func run() error {
	o := compare.DefaultOptions()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		o.DatabaseURL = u
	}
	var (
		modes         = strings.Join(o.Modes, ",")
		settings      = strings.Join(o.Settings, ",")
		procs         = joinInts(o.Procs)
		procsSettings = strings.Join(o.ProcsSettings, ",")
		rates         = joinInts(o.Rates)
		asJSON        bool
		conns         = int(o.PoolConns)
	)
	flag.StringVar(&o.DatabaseURL, "database-url", o.DatabaseURL, "maintenance connection (env DATABASE_URL); the runs use the same server with -db")
	flag.StringVar(&o.Database, "db", o.Database, "database the runs use (created if missing)")
	flag.StringVar(&o.RiverSchema, "river-schema", o.RiverSchema, "schema of River's tables")
	flag.StringVar(&o.GDSchema, "gd-schema", o.GDSchema, "schema of gendurable's tables")
	flag.StringVar(&modes, "modes", modes, "modes to run, in order, comma-separated: throughput, continuous, insert")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of every mode (each round runs River then gendurable in every case)")
	flag.IntVar(&o.InsertBatch, "insert-batch", o.InsertBatch, "rows per bulk-insert call (throughput and insert modes; the continuous producer's calls are capped by it)")
	flag.BoolVar(&o.FreshStats, "fresh-stats", o.FreshStats, "start every run from a freshly migrated schema with no statistics (VACUUM ANALYZE while empty) instead of realistic statistics; figures labelled fresh-stats")
	flag.IntVar(&o.StatsRows, "stats-rows", o.StatsRows, "finished rows filled into a jobs table, ANALYZEd and TRUNCATEd before every run (realistic statistics; 0: only TRUNCATE)")
	flag.IntVar(&conns, "pool-conns", conns, "MaxConns of each worker process's pgx pool (0: pgxpool default, max(4, GOMAXPROCS), as river bench uses)")

	flag.IntVar(&o.N, "n", o.N, "throughput: jobs per run")
	flag.BoolVar(&o.Concurrent, "concurrent-insert", o.Concurrent, "throughput: insert while the workers run (jobs/s counts from worker start)")
	flag.BoolVar(&o.RiverInsertFast, "river-insert-fast", o.RiverInsertFast, "throughput: River inserts with InsertManyFast (COPY) instead of InsertMany")
	flag.StringVar(&settings, "settings", settings, "throughput: settings run with one worker process, comma-separated: best, or a worker count both systems share")
	flag.StringVar(&procs, "procs", procs, "throughput: worker process counts run with each of -procs-settings")
	flag.StringVar(&procsSettings, "procs-settings", procsSettings, "throughput: settings run with each of -procs worker processes (per process)")
	flag.IntVar(&o.RiverMaxWorkers, "river-max-workers", o.RiverMaxWorkers, "throughput: River MaxWorkers at its best")
	flag.DurationVar(&o.RiverFetchCooldown, "river-fetch-cooldown", o.RiverFetchCooldown, "throughput: River FetchCooldown (every setting)")
	flag.DurationVar(&o.RiverFetchPollInterval, "river-fetch-poll-interval", o.RiverFetchPollInterval, "throughput: River FetchPollInterval (every setting)")
	flag.IntVar(&o.GDBest.Concurrency, "gd-concurrency", o.GDBest.Concurrency, "throughput: gendurable Concurrency at its best")
	flag.IntVar(&o.GDBest.Prefetch, "gd-prefetch", o.GDBest.Prefetch, "throughput: gendurable Prefetch at its best (0: library default, <0: none)")
	flag.IntVar(&o.GDBest.MinDemand, "gd-min-demand", o.GDBest.MinDemand, "throughput: gendurable MinDemand at its best (0: library default)")
	flag.DurationVar(&o.GDBest.PollInterval, "gd-poll-interval", o.GDBest.PollInterval, "throughput: gendurable PollInterval (every setting)")
	flag.IntVar(&o.GDEqual.Prefetch, "gd-equal-prefetch", o.GDEqual.Prefetch, "throughput: gendurable Prefetch at a worker count (0: library default = concurrency)")
	flag.IntVar(&o.GDEqual.MinDemand, "gd-equal-min-demand", o.GDEqual.MinDemand, "throughput: gendurable MinDemand at a worker count (0: the worker count)")

	flag.StringVar(&rates, "rates", rates, "continuous: producer rates, jobs/s, comma-separated")
	flag.DurationVar(&o.ContinuousDuration, "continuous-duration", o.ContinuousDuration, "continuous: how long the producer inserts at each rate")
	flag.DurationVar(&o.ContinuousTick, "continuous-tick", o.ContinuousTick, "continuous: interval between the producer's InsertMany calls")
	flag.IntVar(&o.ContinuousWorkers, "continuous-workers", o.ContinuousWorkers, "continuous: River MaxWorkers and gendurable Concurrency (everything else at library defaults)")
	flag.IntVar(&o.ContinuousInserters, "continuous-inserters", o.ContinuousInserters, "continuous: InsertMany calls the producer keeps in flight at most (its pool size)")
	flag.DurationVar(&o.ContinuousWarmup, "continuous-warmup", o.ContinuousWarmup, "continuous: jobs inserted during this first part of the producer's run are worked but left out of the latencies")
	flag.DurationVar(&o.ContinuousSettle, "continuous-settle", o.ContinuousSettle, "continuous: pause between the worker process's Start and the first insert")
	flag.DurationVar(&o.IdleWait, "idle-wait", o.IdleWait, "continuous: idle period before the one-job pickup probe (0: no probe)")

	flag.DurationVar(&o.LimitDuration, "limit-duration", o.LimitDuration, "throughput: once per round, measure the physical limit (rows/s of -limit-batch-row UPDATE … FROM unnest by primary key on -pool-conns connections) for this long (0: skip)")
	flag.IntVar(&o.LimitBatch, "limit-batch", o.LimitBatch, "throughput: rows per UPDATE of the physical-limit measurement")

	flag.IntVar(&o.InsertN, "insert-n", o.InsertN, "insert: rows per run (0: -n)")

	flag.DurationVar(&o.RunTimeout, "run-timeout", o.RunTimeout, "bound on one run's work phase (0: 60s + 2ms per job)")
	flag.BoolVar(&asJSON, "json", false, "print one JSON object with every run instead of the tables")
	flag.Parse()

	o.Modes = splitList(modes)
	o.Settings = splitList(settings)
	o.ProcsSettings = splitList(procsSettings)
	var err error
	if o.Procs, err = intList("procs", procs); err != nil {
		return err
	}
	if o.Rates, err = intList("rates", rates); err != nil {
		return err
	}
	o.PoolConns = int32(conns)
	o.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := compare.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return rep.WriteJSON(os.Stdout)
	}
	return rep.WriteText(os.Stdout)
}
