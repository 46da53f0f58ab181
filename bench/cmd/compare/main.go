// Command compare runs the same trivial-job workload through River and
// through gendurable on one PostgreSQL, alternating A B A B for several
// rounds, and reports insert rows/s and jobs/s for each. The last line of its
// output is "ratio gendurable/river jobs_per_sec: X.XX" (each system at its
// best, medians of the rounds).
//
//	cd bench && go run ./cmd/compare [-rounds 3] [-n 50000] [-json]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gendurable/gendurable/bench/compare"
)

func main() {
	o := compare.DefaultOptions()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		o.DatabaseURL = u
	}
	var (
		settings = strings.Join(o.Settings, ",")
		asJSON   bool
		conns    = int(o.PoolConns)
	)
	flag.StringVar(&o.DatabaseURL, "database-url", o.DatabaseURL, "maintenance connection (env DATABASE_URL); the runs use the same server with -db")
	flag.StringVar(&o.Database, "db", o.Database, "database the runs use (created if missing)")
	flag.StringVar(&o.RiverSchema, "river-schema", o.RiverSchema, "schema of River's tables")
	flag.StringVar(&o.GDSchema, "gd-schema", o.GDSchema, "schema of gendurable's tables")
	flag.IntVar(&o.N, "n", o.N, "jobs per run")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds (each runs River then gendurable, per setting)")
	flag.IntVar(&o.InsertBatch, "insert-batch", o.InsertBatch, "rows per bulk-insert call")
	flag.BoolVar(&o.Concurrent, "concurrent-insert", o.Concurrent, "insert while the workers run (jobs/s counts from worker start)")
	flag.BoolVar(&o.RiverInsertFast, "river-insert-fast", o.RiverInsertFast, "River inserts with InsertManyFast (COPY) instead of InsertMany")
	flag.StringVar(&settings, "settings", settings, "settings to run, comma-separated: best, equal")
	flag.IntVar(&conns, "pool-conns", conns, "MaxConns of each system's pgx pool (0: pgxpool default, max(4, GOMAXPROCS), as river bench uses)")
	flag.IntVar(&o.EqualWorkers, "equal-workers", o.EqualWorkers, "worker count of the equal setting (River MaxWorkers, gendurable Concurrency)")
	flag.IntVar(&o.RiverMaxWorkers, "river-max-workers", o.RiverMaxWorkers, "River MaxWorkers at its best")
	flag.DurationVar(&o.RiverFetchCooldown, "river-fetch-cooldown", o.RiverFetchCooldown, "River FetchCooldown (both settings)")
	flag.DurationVar(&o.RiverFetchPollInterval, "river-fetch-poll-interval", o.RiverFetchPollInterval, "River FetchPollInterval (both settings)")
	flag.IntVar(&o.GDBest.Concurrency, "gd-concurrency", o.GDBest.Concurrency, "gendurable Concurrency at its best")
	flag.IntVar(&o.GDBest.Prefetch, "gd-prefetch", o.GDBest.Prefetch, "gendurable Prefetch at its best (0: library default, <0: none)")
	flag.IntVar(&o.GDBest.MinDemand, "gd-min-demand", o.GDBest.MinDemand, "gendurable MinDemand at its best (0: library default)")
	flag.DurationVar(&o.GDBest.PollInterval, "gd-poll-interval", o.GDBest.PollInterval, "gendurable PollInterval (both settings)")
	flag.IntVar(&o.GDEqual.Prefetch, "gd-equal-prefetch", o.GDEqual.Prefetch, "gendurable Prefetch in the equal setting (0: library default = concurrency)")
	flag.DurationVar(&o.RunTimeout, "run-timeout", o.RunTimeout, "bound on one run's work phase (0: 60s + 2ms per job)")
	flag.BoolVar(&asJSON, "json", false, "print one JSON object with every run instead of the table")
	flag.Parse()

	o.Settings = nil
	for _, s := range strings.Split(settings, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Settings = append(o.Settings, s)
		}
	}
	o.PoolConns = int32(conns)
	o.GDEqual.PollInterval = o.GDBest.PollInterval
	o.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := compare.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
	if asJSON {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteText(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}
