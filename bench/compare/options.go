// Package compare runs the same trivial-job workload through River and
// through gendurable on one PostgreSQL and reports, round after round
// (A B A B …), for each system:
//
//   - throughput: N no-op jobs inserted up front (timed: insert rows/s), then
//     worked by 1, 2 or 4 worker processes (separate OS processes: this
//     binary re-executed as a worker, see [IsWorker]) at several worker
//     counts; jobs/s = N / (first worker's Start → last completion);
//   - continuous: a producer (this process) inserting at a fixed rate while a
//     worker process at library defaults works the queue: pickup and
//     completion latency p50/p99, and pickup after an idle period;
//   - insert: bulk insert alone, gendurable's InsertMany against both of
//     River's insert paths (InsertMany and InsertManyFast/COPY).
//
// Before every run the system's tables are given realistic statistics: the
// jobs table is filled with finished rows, analyzed, and emptied, so the
// planner sees a table in use (see [Options.FreshStats] for the fresh
// database instead).
package compare

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/gendurable/gendurable"
)

// Systems compared, in the order they run within a round.
const (
	SystemRiver      = "river"
	SystemGendurable = "gendurable"
)

// SettingBest is each system at its best; every other setting is a worker
// count both systems share ("10", "100", "1000").
const SettingBest = "best"

// Modes a comparison can run.
const (
	ModeThroughput = "throughput"
	ModeContinuous = "continuous"
	ModeInsert     = "insert"
)

// maxWorkerConns bounds the worker processes' connections together
// (processes × PoolConns): the server's max_connections is shared.
const maxWorkerConns = 80

// DefaultDatabaseURL is the maintenance connection used when none is given.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Options configures a comparison. DefaultOptions fills every field.
type Options struct {
	// DatabaseURL is the maintenance connection: the bench database is
	// created through it if missing. The runs use the same server, user and
	// parameters with the database replaced by Database.
	DatabaseURL string
	// Database the runs use (created if missing). Default "gendurable_bench".
	Database string
	// RiverSchema and GDSchema hold each system's tables.
	RiverSchema string
	GDSchema    string

	// Modes to run, in order: throughput, continuous, insert (default all).
	Modes []string

	N           int  // jobs per throughput run
	Rounds      int  // A B rounds (every mode)
	InsertBatch int  // rows per bulk-insert call, both systems
	Concurrent  bool // throughput: insert while the workers run (jobs/s then counts from worker start to last completion)
	// RiverInsertFast: the throughput runs insert with River's
	// InsertManyFast (COPY, no rows returned) instead of InsertMany (what
	// `river bench` uses, rows returned like gendurable's InsertMany). The
	// insert mode measures both paths regardless.
	RiverInsertFast bool

	// FreshStats: start every run from a freshly created schema, vacuumed
	// and analyzed while empty (no statistics: a new installation) instead
	// of realistic statistics. Figures with FreshStats are labelled
	// "fresh-stats".
	FreshStats bool
	// StatsRows is how many finished rows fill a jobs table before it is
	// analyzed and emptied (realistic statistics). Default 200 000.
	StatsRows int

	// Settings run with one worker process, in order: "best" and worker
	// counts ("10", "100", "1000").
	Settings []string
	// Procs are the worker process counts run with each of ProcsSettings
	// (each process its own pool and client/engine, at that setting).
	Procs         []int
	ProcsSettings []string

	// PoolConns is MaxConns of each worker process's pgx pool (the same for
	// both systems). Default 10; 0: pgxpool's default, max(4, GOMAXPROCS),
	// which is what `river bench` gets.
	PoolConns int32

	// River at its best: `river bench`'s own configuration.
	// FetchCooldown and FetchPollInterval apply to every worker-count
	// setting too.
	RiverMaxWorkers        int
	RiverFetchCooldown     time.Duration
	RiverFetchPollInterval time.Duration

	// GDBest is gendurable's "default" queue at its best; GDEqual at a
	// worker count (its Concurrency is set to the count; MinDemand 0 means
	// the worker count, half the default claim window). PollInterval of
	// GDBest applies to both.
	GDBest  gendurable.QueueConfig
	GDEqual gendurable.QueueConfig

	// Continuous mode: for each rate (jobs/s), the producer inserts for
	// ContinuousDuration (one InsertMany every ContinuousTick), the worker
	// process runs at library defaults with ContinuousWorkers workers
	// (River MaxWorkers, gendurable Concurrency); after the queue drained
	// and stayed idle for IdleWait, one more job measures pickup after an
	// idle period.
	Rates              []int
	ContinuousDuration time.Duration
	ContinuousTick     time.Duration
	ContinuousWorkers  int
	// ContinuousInserters is how many InsertMany calls the producer keeps
	// in flight at most (its pool's size), so that one slow call does not
	// hold the rate back.
	ContinuousInserters int
	IdleWait            time.Duration
	// ContinuousWarmup: jobs inserted during the first ContinuousWarmup of
	// the producer's run are worked but left out of the latency figures
	// (the idle-to-busy transition; pickup after idle is measured apart).
	ContinuousWarmup time.Duration
	// ContinuousSettle is the pause between the worker's Start and the
	// producer's first insert.
	ContinuousSettle time.Duration
	// ContinuousGD overrides gendurable's queue configuration in the
	// continuous mode (tests shorten the idle backoff); its zero value is
	// the library's defaults, Concurrency = ContinuousWorkers.
	ContinuousGD gendurable.QueueConfig

	// LimitDuration: in the throughput mode, once per round, measure the
	// database's physical limit for this long (see LimitResult; 0: don't).
	// LimitBatch is the rows per UPDATE (default 500).
	LimitDuration time.Duration
	LimitBatch    int

	// InsertN is the number of rows each insert-mode run inserts (0: N).
	InsertN int

	// RunTimeout bounds one run's work phase. 0: derived from N.
	RunTimeout time.Duration

	// Progress receives human-readable progress lines (nil: discarded),
	// worker processes' logs included.
	Progress io.Writer
}

// DefaultOptions returns the defaults the command line starts from.
func DefaultOptions() Options {
	return Options{
		DatabaseURL:            DefaultDatabaseURL,
		Database:               "gendurable_bench",
		RiverSchema:            "river",
		GDSchema:               "gd",
		Modes:                  []string{ModeThroughput, ModeContinuous, ModeInsert},
		N:                      50000,
		Rounds:                 3,
		InsertBatch:            5000,
		StatsRows:              200000,
		Settings:               []string{SettingBest, "10", "100", "1000"},
		Procs:                  []int{1, 2, 4},
		ProcsSettings:          []string{"100"},
		PoolConns:              10,
		RiverMaxWorkers:        2000,
		RiverFetchCooldown:     2 * time.Millisecond,
		RiverFetchPollInterval: 20 * time.Millisecond,
		// gendurable at its best: many cheap workers (as River's 2000), fat
		// picks (MinDemand half the claim window), group-committed outcomes.
		GDBest: gendurable.QueueConfig{
			Concurrency:  1000,
			Prefetch:     1000,
			MinDemand:    1000,
			PollInterval: 20 * time.Millisecond,
		},
		GDEqual:             gendurable.QueueConfig{},
		Rates:               []int{2000, 8000},
		ContinuousDuration:  10 * time.Second,
		ContinuousTick:      10 * time.Millisecond,
		ContinuousWorkers:   1000,
		ContinuousInserters: 4,
		IdleWait:            11 * time.Second,
		ContinuousSettle:    time.Second,
		ContinuousWarmup:    time.Second,
		LimitDuration:       3 * time.Second,
		LimitBatch:          500,
	}
}

func (o *Options) validate() error {
	switch {
	case o.N <= 0:
		return errors.New("n must be positive")
	case o.Rounds <= 0:
		return errors.New("rounds must be positive")
	case o.InsertBatch <= 0:
		return errors.New("insert batch must be positive")
	case o.RiverMaxWorkers <= 0:
		return errors.New("river max workers must be positive")
	case o.StatsRows < 0:
		return errors.New("stats rows must not be negative")
	case o.InsertN < 0:
		return errors.New("insert n must not be negative")
	case o.Database == "" || o.RiverSchema == "" || o.GDSchema == "":
		return errors.New("database and schemas must be named")
	case o.RiverSchema == o.GDSchema:
		return errors.New("river and gendurable need distinct schemas")
	case len(o.Modes) == 0:
		return errors.New("no modes to run")
	}
	for _, m := range o.Modes {
		if m != ModeThroughput && m != ModeContinuous && m != ModeInsert {
			return fmt.Errorf("unknown mode %q (want %s, %s or %s)", m, ModeThroughput, ModeContinuous, ModeInsert)
		}
	}
	if o.hasMode(ModeThroughput) {
		if len(o.cases()) == 0 {
			return errors.New("no settings to run")
		}
		for _, s := range append(slices.Clone(o.Settings), o.ProcsSettings...) {
			if _, err := parseSetting(s); err != nil {
				return err
			}
		}
		if o.LimitDuration < 0 || o.LimitDuration > 0 && (o.LimitBatch <= 0 || o.LimitBatch > limitRowsPerConn) {
			return fmt.Errorf("limit: want a duration >= 0 and a batch of 1..%d", limitRowsPerConn)
		}
		conns := int(o.PoolConns)
		if conns <= 0 {
			conns = 4 // pgxpool's default on this kind of machine; a guess elsewhere
		}
		for _, p := range o.Procs {
			if p <= 0 || p*conns > maxWorkerConns {
				return fmt.Errorf("process count %d: want 1.. with processes × pool conns (%d) <= %d (the server is shared)", p, conns, maxWorkerConns)
			}
		}
	}
	if o.hasMode(ModeContinuous) {
		switch {
		case len(o.Rates) == 0:
			return errors.New("continuous mode needs a rate")
		case o.ContinuousDuration <= 0 || o.ContinuousTick <= 0:
			return errors.New("continuous duration and tick must be positive")
		case o.ContinuousWorkers <= 0:
			return errors.New("continuous workers must be positive")
		case o.ContinuousInserters <= 0 || o.ContinuousInserters > 8:
			return errors.New("continuous inserters: want 1..8")
		case o.IdleWait < 0 || o.ContinuousSettle < 0 || o.ContinuousWarmup < 0 || o.ContinuousWarmup >= o.ContinuousDuration:
			return errors.New("idle wait, settle and warm-up must not be negative; warm-up shorter than the duration")
		}
		for _, r := range o.Rates {
			if r <= 0 {
				return fmt.Errorf("rate %d: want positive", r)
			}
		}
	}
	return nil
}

func (o *Options) hasMode(m string) bool { return slices.Contains(o.Modes, m) }

func (o *Options) insertN() int {
	if o.InsertN > 0 {
		return o.InsertN
	}
	return o.N
}

func (o *Options) runTimeout(n int) time.Duration {
	if o.RunTimeout > 0 {
		return o.RunTimeout
	}
	// Generous: 60 s plus 2 ms a job (500 jobs/s would still finish).
	return 60*time.Second + time.Duration(n)*2*time.Millisecond
}

// parseSetting returns the worker count of a setting (0 for "best").
func parseSetting(s string) (int, error) {
	if s == SettingBest {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("setting %q: want %q or a positive worker count", s, SettingBest)
	}
	return n, nil
}

// runCase is one row group of the throughput table: a setting worked by
// procs worker processes.
type runCase struct {
	setting string
	procs   int
}

func (c runCase) key() string {
	if c.procs == 1 {
		return c.setting
	}
	return fmt.Sprintf("%sx%dp", c.setting, c.procs)
}

// cases are the throughput cases in order: every setting with one process,
// then every procs setting with each process count (duplicates dropped).
func (o *Options) cases() []runCase {
	var cs []runCase
	add := func(c runCase) {
		if !slices.Contains(cs, c) {
			cs = append(cs, c)
		}
	}
	for _, s := range o.Settings {
		add(runCase{s, 1})
	}
	for _, s := range o.ProcsSettings {
		for _, p := range o.Procs {
			add(runCase{s, p})
		}
	}
	return cs
}

// setting is one configuration of both systems.
type setting struct {
	name                   string
	riverMaxWorkers        int
	riverFetchCooldown     time.Duration
	riverFetchPollInterval time.Duration
	gd                     gendurable.QueueConfig
}

func (o *Options) setting(name string) setting {
	s := setting{
		name:                   name,
		riverFetchCooldown:     o.RiverFetchCooldown,
		riverFetchPollInterval: o.RiverFetchPollInterval,
	}
	workers, _ := parseSetting(name)
	if workers > 0 {
		s.riverMaxWorkers = workers
		s.gd = o.GDEqual
		s.gd.Concurrency = workers
		s.gd.PollInterval = o.GDBest.PollInterval
		if s.gd.MinDemand == 0 {
			s.gd.MinDemand = workers
		}
	} else {
		s.riverMaxWorkers = o.RiverMaxWorkers
		s.gd = o.GDBest
	}
	// MinDemand above the claim window is invalid: cap it (flags and tests
	// shrink Concurrency).
	window := s.gd.Concurrency + max(s.gd.Prefetch, 0)
	if s.gd.Prefetch == 0 {
		window = 2 * s.gd.Concurrency
	}
	s.gd.MinDemand = min(s.gd.MinDemand, window)
	return s
}

// continuousSetting is the continuous mode's configuration: library
// defaults but for the worker count.
func (o *Options) continuousSetting() setting {
	s := setting{name: "defaults", riverMaxWorkers: o.ContinuousWorkers, gd: o.ContinuousGD}
	if s.gd.Concurrency == 0 {
		s.gd.Concurrency = o.ContinuousWorkers
	}
	return s
}

func (s setting) describe(system string) string {
	if system == SystemRiver {
		d := func(x time.Duration) string {
			if x == 0 {
				return "default"
			}
			return x.String()
		}
		return fmt.Sprintf("MaxWorkers=%d FetchCooldown=%s FetchPollInterval=%s",
			s.riverMaxWorkers, d(s.riverFetchCooldown), d(s.riverFetchPollInterval))
	}
	return fmt.Sprintf("QueueConfig%+v", s.gd)
}
