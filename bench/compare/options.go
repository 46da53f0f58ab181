// Package compare runs the same trivial-job workload through River and
// through gendurable on one PostgreSQL and reports insert rows/s and worked
// jobs/s for each, round after round (A B A B …).
//
// Each run starts from empty, vacuumed tables: insert N no-op jobs with the
// system's bulk insert (timed), then start the workers and time until the last
// job's completion is committed (counted from each system's own completion
// events: River's subscription, gendurable's StepEvent hook), then stop the
// workers and check the database agrees.
package compare

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gendurable/gendurable"
)

// Systems compared, in the order they run within a round.
const (
	SystemRiver      = "river"
	SystemGendurable = "gendurable"
)

// Settings: each system at its best, and both at one equal worker count.
const (
	SettingBest  = "best"
	SettingEqual = "equal"
)

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

	N           int  // jobs per run
	Rounds      int  // A B rounds per setting
	InsertBatch int  // rows per bulk-insert call, both systems
	Concurrent  bool // insert while the workers run (jobs/s then counts from worker start to last completion)
	// RiverInsertFast uses River's InsertManyFast (COPY, no rows returned)
	// instead of InsertMany (what `river bench` uses, rows returned like
	// gendurable's InsertMany).
	RiverInsertFast bool

	// Settings to run, in order; default best then equal.
	Settings []string

	// PoolConns is MaxConns of each system's pgx pool (the same for both).
	// Default 10; 0: pgxpool's default, max(4, GOMAXPROCS), which is what
	// `river bench` gets.
	PoolConns int32

	// River at its best: `river bench`'s own configuration.
	RiverMaxWorkers        int
	RiverFetchCooldown     time.Duration
	RiverFetchPollInterval time.Duration

	// GDBest is gendurable's "default" queue at its best; GDEqual at the
	// equal worker count (its Concurrency is set to EqualWorkers).
	GDBest  gendurable.QueueConfig
	GDEqual gendurable.QueueConfig

	// EqualWorkers: River MaxWorkers and gendurable Concurrency in the
	// "equal" setting.
	EqualWorkers int

	// RunTimeout bounds one run's work phase. 0: derived from N.
	RunTimeout time.Duration

	// Progress receives human-readable progress lines (nil: discarded).
	Progress io.Writer
}

// DefaultOptions returns the defaults the command line starts from.
func DefaultOptions() Options {
	return Options{
		DatabaseURL:            DefaultDatabaseURL,
		Database:               "gendurable_bench",
		RiverSchema:            "river",
		GDSchema:               "gd",
		N:                      50000,
		Rounds:                 3,
		InsertBatch:            5000,
		Settings:               []string{SettingBest, SettingEqual},
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
		GDEqual: gendurable.QueueConfig{
			MinDemand:    100,
			PollInterval: 20 * time.Millisecond,
		},
		EqualWorkers: 100,
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
	case o.EqualWorkers <= 0:
		return errors.New("equal worker count must be positive")
	case o.RiverMaxWorkers <= 0:
		return errors.New("river max workers must be positive")
	case o.Database == "" || o.RiverSchema == "" || o.GDSchema == "":
		return errors.New("database and schemas must be named")
	case o.RiverSchema == o.GDSchema:
		return errors.New("river and gendurable need distinct schemas")
	}
	if len(o.Settings) == 0 {
		return errors.New("no settings to run")
	}
	for _, s := range o.Settings {
		if s != SettingBest && s != SettingEqual {
			return fmt.Errorf("unknown setting %q (want %q or %q)", s, SettingBest, SettingEqual)
		}
	}
	return nil
}

func (o *Options) runTimeout() time.Duration {
	if o.RunTimeout > 0 {
		return o.RunTimeout
	}
	// Generous: 60 s plus 2 ms a job (500 jobs/s would still finish).
	return 60*time.Second + time.Duration(o.N)*2*time.Millisecond
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
	switch name {
	case SettingEqual:
		s.riverMaxWorkers = o.EqualWorkers
		s.gd = o.GDEqual
		s.gd.Concurrency = o.EqualWorkers
	default:
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

func (s setting) describe(system string) string {
	if system == SystemRiver {
		return fmt.Sprintf("MaxWorkers=%d FetchCooldown=%s FetchPollInterval=%s",
			s.riverMaxWorkers, s.riverFetchCooldown, s.riverFetchPollInterval)
	}
	return fmt.Sprintf("QueueConfig%+v", s.gd)
}
