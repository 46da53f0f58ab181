// Package longhorizon speaks the protocol of the public long-horizon
// benchmark of PostgreSQL job queues (hardbyte/postgresql-job-queue-benchmarking,
// CONTRIBUTING_ADAPTERS.md), for any system: an adapter is one long-running
// process configured by its environment, whose stdout carries one JSON object
// per line — a descriptor, then every SAMPLE_EVERY_S seconds one sample per
// metric — and whose stderr carries logs. SIGTERM ends it: it flushes and
// exits 0 within 5 seconds.
//
// What a system provides is a [System] (insert a batch, count the queue,
// read the database clock, describe itself); its workers report each job
// they start ([Telemetry.Started], with the row's insert time on the database
// clock) and each job whose completion is written ([Telemetry.Completed]).
// [Run] does the rest: the producer, the clock offset, the depth poller and
// the sampler. gendurable's adapter is `gendurable bench --long-horizon`
// (internal/benchrun); River's is bench/cmd/river-long-horizon.
package longhorizon

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidEnv wraps every error about the environment: adapters exit 2 on it.
var ErrInvalidEnv = errors.New("invalid environment")

// Producer modes.
const (
	ModeFixed       = "fixed"        // PRODUCER_RATE jobs/s, open loop
	ModeDepthTarget = "depth-target" // keep about TARGET_DEPTH jobs runnable
)

// ScenarioLongHorizon is the one scenario adapters implement.
const ScenarioLongHorizon = "long_horizon"

// Config is an adapter's configuration, read from the environment by FromEnv.
type Config struct {
	DatabaseURL  string        // DATABASE_URL, required
	Scenario     string        // SCENARIO: long_horizon (the default, and the only one)
	ProducerMode string        // PRODUCER_MODE: fixed (default) or depth-target
	ProducerRate float64       // PRODUCER_RATE: jobs/s of this process, required in fixed mode
	TargetDepth  int           // TARGET_DEPTH: required (≥ 1) in depth-target mode, ignored in fixed mode
	WorkerCount  int           // WORKER_COUNT: jobs running at once in this process, required
	PayloadBytes int           // JOB_PAYLOAD_BYTES: about this many bytes of job arguments; default 256
	WorkMs       int           // JOB_WORK_MS: each job sleeps this long; default 1
	SampleEvery  time.Duration // SAMPLE_EVERY_S: whole seconds between samples; default 5
	// InstanceID is BENCH_INSTANCE_ID (default 0), the replica number the
	// harness gives each process. Every record carries it; only instance 0
	// emits the observer metrics (queue_depth, producer_target_rate), which
	// describe the whole queue rather than this replica.
	InstanceID int
	// RateControlFile is PRODUCER_RATE_CONTROL_FILE: if set, the producer
	// re-reads its rate from this file (a number of jobs/s) every second,
	// so a driver can change the offered load without a restart (its
	// high-load phase). Unreadable contents keep the last rate, and so does
	// anything but a regular file of at most 64 bytes (readRateFile).
	RateControlFile string
}

// Limits of the numeric settings.
const (
	MaxWorkerCount  = 10_000
	MaxPayloadBytes = 512 << 10
	MaxWorkMs       = 60_000
	MaxSampleEveryS = 3_600
	MaxProducerRate = 1_000_000
	MaxTargetDepth  = 10_000_000
)

// FromEnv reads the configuration through getenv (os.Getenv). Every
// problem is an error wrapping ErrInvalidEnv that names the variable.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		DatabaseURL:     strings.TrimSpace(getenv("DATABASE_URL")),
		Scenario:        strings.TrimSpace(getenv("SCENARIO")),
		ProducerMode:    strings.TrimSpace(getenv("PRODUCER_MODE")),
		RateControlFile: strings.TrimSpace(getenv("PRODUCER_RATE_CONTROL_FILE")),
	}
	bad := func(format string, a ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidEnv}, a...)...)
	}
	if c.DatabaseURL == "" {
		return bad("DATABASE_URL is not set")
	}
	if c.Scenario == "" {
		c.Scenario = ScenarioLongHorizon
	}
	if c.Scenario != ScenarioLongHorizon {
		return bad("SCENARIO %q is not supported (want %s)", c.Scenario, ScenarioLongHorizon)
	}
	if c.ProducerMode == "" {
		c.ProducerMode = ModeFixed
	}
	if c.ProducerMode != ModeFixed && c.ProducerMode != ModeDepthTarget {
		return bad("PRODUCER_MODE %q is not supported (want %s or %s)", c.ProducerMode, ModeFixed, ModeDepthTarget)
	}
	intVar := func(name string, def, lo, hi int, required bool) (int, error) {
		raw := strings.TrimSpace(getenv(name))
		if raw == "" {
			if required {
				return 0, fmt.Errorf("%w: %s is not set", ErrInvalidEnv, name)
			}
			return def, nil
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%w: %s=%q (want an integer from %d to %d)", ErrInvalidEnv, name, raw, lo, hi)
		}
		return n, nil
	}
	var err error
	if c.WorkerCount, err = intVar("WORKER_COUNT", 0, 1, MaxWorkerCount, true); err != nil {
		return Config{}, err
	}
	if c.PayloadBytes, err = intVar("JOB_PAYLOAD_BYTES", 256, 0, MaxPayloadBytes, false); err != nil {
		return Config{}, err
	}
	if c.WorkMs, err = intVar("JOB_WORK_MS", 1, 0, MaxWorkMs, false); err != nil {
		return Config{}, err
	}
	every, err := intVar("SAMPLE_EVERY_S", 5, 1, MaxSampleEveryS, false)
	if err != nil {
		return Config{}, err
	}
	c.SampleEvery = time.Duration(every) * time.Second
	if c.InstanceID, err = intVar("BENCH_INSTANCE_ID", 0, 0, 1_000_000, false); err != nil {
		return Config{}, err
	}
	depthTarget := c.ProducerMode == ModeDepthTarget
	if c.TargetDepth, err = intVar("TARGET_DEPTH", 0, map[bool]int{true: 1}[depthTarget], MaxTargetDepth, depthTarget); err != nil {
		return Config{}, err
	}
	if raw := strings.TrimSpace(getenv("PRODUCER_RATE")); raw != "" || c.ProducerMode == ModeFixed {
		if raw == "" {
			return bad("PRODUCER_RATE is not set (PRODUCER_MODE=fixed needs it)")
		}
		r, err := parseRate(raw)
		if err != nil {
			return bad("PRODUCER_RATE=%q (%v)", raw, err)
		}
		c.ProducerRate = r
	}
	return c, nil
}

// parseRate reads a rate in jobs/s: a finite number from 0 to MaxProducerRate.
func parseRate(raw string) (float64, error) {
	r, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || r > MaxProducerRate {
		return 0, fmt.Errorf("want a number of jobs/s from 0 to %d", MaxProducerRate)
	}
	return r, nil
}
