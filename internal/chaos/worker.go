//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// EnvWorker is the environment variable that turns a process into a chaos
// worker: it holds the JSON WorkerConfig.
const EnvWorker = "CHAOS_WORKER"

// WorkerConfig configures one worker process.
type WorkerConfig struct {
	URL string `json:"url"`
	// EngineURL, if set, is where the engine's pool connects (a proxy the
	// harness can cut); the harness's own records (side effects, the fenced
	// resource) still go to URL, from a pool of their own.
	EngineURL string `json:"engine_url,omitempty"`
	Schema    string `json:"schema"`
	Name      string `json:"name"` // w1, w2, ...: part of the application_name

	Queue       string `json:"queue,omitempty"` // default "default"
	Concurrency int    `json:"concurrency"`
	Prefetch    int    `json:"prefetch,omitempty"`
	MaxConns    int    `json:"max_conns"`
	LeaseMs     int    `json:"lease_ms"`
	HeartbeatMs int    `json:"heartbeat_ms"`
	ReaperMs    int    `json:"reaper_ms"` // negative: no reaper in this process
	PollMs      int    `json:"poll_ms"`
	MaxPollMs   int    `json:"max_poll_ms"`
	DrainMs     int    `json:"drain_ms,omitempty"`
	StopMs      int    `json:"stop_ms,omitempty"` // bound on Engine.Stop at SIGTERM (default 15s)
	CommitConc  int    `json:"commit_conc,omitempty"`
	// KeyPolicies: Config.KeyPolicies (record them with Env.SetKeyPolicies
	// too, for the checker).
	KeyPolicies []gendurable.KeyPolicy `json:"key_policies,omitempty"`
	// GlobalConcurrency: the queue's QueueConfig.GlobalConcurrency.
	GlobalConcurrency int `json:"global_concurrency,omitempty"`

	Knobs Knobs `json:"knobs"`

	PanicHook   bool `json:"panic_hook,omitempty"`   // a hook that panics on every step event
	ReportPicks bool `json:"report_picks,omitempty"` // emit pick-latency windows
	CheckLeaks  bool `json:"check_leaks,omitempty"`  // run goleak after Stop

	// Signaller: send signal SignalName (dedup key "<name>-<round>") for each
	// round in [0, SignalRounds) to every instance id in [SignalFrom, SignalTo).
	SignalFrom   int64  `json:"signal_from,omitempty"`
	SignalTo     int64  `json:"signal_to,omitempty"`
	SignalName   string `json:"signal_name,omitempty"`
	SignalRounds int    `json:"signal_rounds,omitempty"`
	SignalPaceMs int    `json:"signal_pace_ms,omitempty"` // pause between rounds
}

// AppName is the application_name of the worker's connections: the
// harness finds (and terminates) them by it.
func (c *WorkerConfig) AppName() string { return AppName(c.Schema, c.Name) }

// AppName is the application_name of worker name's connections in schema.
func AppName(schema, name string) string { return "chaos:" + schema + ":" + name }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// Event is one line a worker writes on stdout (JSON).
type Event struct {
	Ev string `json:"ev"`
	T  int64  `json:"t"` // unix milliseconds (worker clock)
	// ready
	PID int `json:"pid,omitempty"`
	// conn: connection attempts and successes in the last window
	Attempts int     `json:"attempts,omitempty"`
	OK       int     `json:"ok,omitempty"`
	Times    []int64 `json:"times,omitempty"` // when each attempt began (unix ms)
	// pickfails: when each failed pick ended (unix ms), in the last window
	PickFails []int64 `json:"pick_fails,omitempty"`
	// picks: pick statement latency in the last window (microseconds)
	N   int   `json:"n,omitempty"`
	P50 int64 `json:"p50,omitempty"`
	P99 int64 `json:"p99,omitempty"`
	Max int64 `json:"max,omitempty"`
	// counts (cumulative) and stopped
	Counts map[string]int64 `json:"counts,omitempty"`
	Err    string           `json:"err,omitempty"`
	Leak   string           `json:"leak,omitempty"`
}

type emitter struct {
	mu sync.Mutex
	en *json.Encoder
}

func (e *emitter) emit(ev Event) {
	ev.T = time.Now().UnixMilli()
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.en.Encode(ev)
}

// counters are what the worker's hooks observe.
type counters struct {
	steps, stepErrs, fenced, commitErrs, leaseLost, reaped, reapedFailed, pickErrs atomic.Int64
	hookPanics                                                                     atomic.Int64
	connAttempts, connOK                                                           atomic.Int64

	mu        sync.Mutex
	picks     []time.Duration
	attempts  []int64 // unix ms of each connection attempt since the last report
	pickFails []int64 // unix ms of each failed pick since the last report
}

func (c *counters) snapshot(rt *Runtime) map[string]int64 {
	return map[string]int64{
		"steps": c.steps.Load(), "step_errors": c.stepErrs.Load(), "fenced": c.fenced.Load(),
		"commit_errors": c.commitErrs.Load(), "lease_lost": c.leaseLost.Load(), "reaped": c.reaped.Load(),
		"reaped_failed": c.reapedFailed.Load(), "pick_errors": c.pickErrs.Load(),
		"effect_errors": rt.EffectErrors.Load(), "conn_attempts": c.connAttempts.Load(), "conn_ok": c.connOK.Load(),
	}
}

// WorkerMain runs a worker process configured by $CHAOS_WORKER until
// SIGTERM (graceful: Engine.Stop, pool close, optional leak check) or
// SIGKILL, and returns the process exit code. It writes Events on stdout
// and the engine's log (warnings and up) on stderr.
func WorkerMain() int {
	var cfg WorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(EnvWorker)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker: bad $"+EnvWorker+":", err)
		return 2
	}
	out := &emitter{en: json.NewEncoder(os.Stdout)}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	code, err := runWorker(cfg, out, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
	}
	return code
}

func runWorker(cfg WorkerConfig, out *emitter, logger *slog.Logger) (int, error) {
	ctx := context.Background()
	// From the start: a SIGTERM while the engine starts still means "stop gracefully".
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	engineURL := cfg.URL
	if cfg.EngineURL != "" {
		engineURL = cfg.EngineURL
	}
	pcfg, err := pgxpool.ParseConfig(engineURL)
	if err != nil {
		return 2, err
	}
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = int32(cfg.MaxConns)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.AppName()
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	// An idle connection is pinged before use; after a partition pgx would
	// otherwise keep an abandoned ping going for a minute, and the pool's
	// Close waits for it.
	pcfg.PingTimeout = 2 * time.Second
	c := &counters{}
	pcfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		c.connAttempts.Add(1)
		c.mu.Lock()
		c.attempts = append(c.attempts, time.Now().UnixMilli())
		c.mu.Unlock()
		return nil
	}
	pcfg.AfterConnect = func(context.Context, *pgx.Conn) error { c.connOK.Add(1); return nil }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 2, err
	}

	rtPool := pool
	if cfg.EngineURL != "" {
		hcfg, err := pgxpool.ParseConfig(cfg.URL)
		if err != nil {
			return 2, err
		}
		hcfg.MaxConns = 4
		hcfg.ConnConfig.RuntimeParams["application_name"] = cfg.AppName() + ":harness"
		hcfg.ConnConfig.ConnectTimeout = 2 * time.Second
		if rtPool, err = pgxpool.NewWithConfig(ctx, hcfg); err != nil {
			return 2, err
		}
		defer rtPool.Close()
	}
	rt := NewRuntime(rtPool, cfg.Schema, os.Getpid(), cfg.Name)
	rt.Heartbeat = ms(cfg.HeartbeatMs)
	defs := NewMachines(rt, cfg.Knobs)
	hooks := []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		switch e := ev.(type) {
		case *gendurable.StepEvent:
			c.steps.Add(1)
			if e.Err != nil {
				c.stepErrs.Add(1)
			}
			if e.Fenced {
				c.fenced.Add(1)
			}
			if e.CommitErr != nil {
				c.commitErrs.Add(1)
			}
		case *gendurable.LeaseLostEvent:
			c.leaseLost.Add(1)
		case *gendurable.ReapEvent:
			c.reaped.Add(int64(e.Count))
			c.reapedFailed.Add(int64(e.Failed))
		case *gendurable.PickEvent:
			if e.Err != nil {
				c.pickErrs.Add(1)
				c.mu.Lock()
				c.pickFails = append(c.pickFails, time.Now().UnixMilli())
				c.mu.Unlock()
			} else if cfg.ReportPicks {
				c.mu.Lock()
				c.picks = append(c.picks, e.Duration)
				c.mu.Unlock()
			}
		}
	})}
	if cfg.PanicHook {
		hooks = append(hooks, gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
			if _, ok := ev.(*gendurable.StepEvent); ok {
				c.hookPanics.Add(1)
				panic("chaos: a hook panics")
			}
		}))
	}
	queue := cfg.Queue
	if queue == "" {
		queue = gendurable.DefaultQueue
	}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   cfg.Schema,
		Machines: defs.All,
		Queues: map[string]gendurable.QueueConfig{queue: {
			Concurrency: cfg.Concurrency, Prefetch: cfg.Prefetch, GlobalConcurrency: cfg.GlobalConcurrency,
			PollInterval: ms(cfg.PollMs), MaxPollInterval: ms(cfg.MaxPollMs),
		}},
		LeaseDuration: ms(cfg.LeaseMs), HeartbeatInterval: ms(cfg.HeartbeatMs), ReaperInterval: ms(cfg.ReaperMs),
		DrainTimeout: ms(cfg.DrainMs), CommitConcurrency: cfg.CommitConc,
		KeyPolicies: cfg.KeyPolicies,
		Logger:      logger,
		Hooks:       hooks,
	})
	if err != nil {
		return 2, err
	}
	// The database may be restarting right now: keep trying to start.
	for deadline := time.Now().Add(60 * time.Second); ; {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = eng.Start(sctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return 3, fmt.Errorf("start: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out.emit(Event{Ev: "ready", PID: os.Getpid()})

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if cfg.SignalName != "" && cfg.SignalTo > cfg.SignalFrom {
		wg.Add(1)
		go func() { defer wg.Done(); signaller(bg, eng, cfg) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); reporter(bg, out, c, rt, cfg.ReportPicks) }()

	orphan := make(chan struct{})
	wg.Add(1)
	go func() { // exit with the harness
		defer wg.Done()
		ppid := os.Getppid()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
				if os.Getppid() != ppid {
					close(orphan)
					return
				}
			}
		}
	}()
	select {
	case <-term:
	case <-orphan:
		os.Exit(9)
	}
	signal.Stop(term)

	stopTimeout := 15 * time.Second
	if cfg.StopMs > 0 {
		stopTimeout = ms(cfg.StopMs)
	}
	sctx, cancel := context.WithTimeout(ctx, stopTimeout)
	stopStart := time.Now()
	stopErr := eng.Stop(sctx)
	stopDur := time.Since(stopStart)
	cancel()
	stopBG()
	wg.Wait()
	pool.Close() // pgx may take up to 15 s here with connections cut off (its cancel requests' timeout)
	ev := Event{Ev: "stopped", Counts: c.snapshot(rt)}
	ev.Counts["hook_panics"] = c.hookPanics.Load()
	ev.Counts["stop_ms"] = stopDur.Milliseconds()
	if stopErr != nil {
		ev.Err = stopErr.Error()
	}
	if cfg.CheckLeaks {
		if err := goleak.Find(goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("os/signal.loop"),
			goleak.IgnoreTopFunction("os/signal.signal_recv")); err != nil {
			ev.Leak = err.Error()
		}
	}
	out.emit(ev)
	if stopErr != nil || ev.Leak != "" {
		return 1, nil
	}
	return 0, nil
}

// reporter writes connection, pick and count windows.
func reporter(ctx context.Context, out *emitter, c *counters, rt *Runtime, picks bool) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var lastAttempts, lastOK int64
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n++
		a, ok := c.connAttempts.Load(), c.connOK.Load()
		if a != lastAttempts || ok != lastOK {
			c.mu.Lock()
			times := c.attempts
			c.attempts = nil
			c.mu.Unlock()
			out.emit(Event{Ev: "conn", Attempts: int(a - lastAttempts), OK: int(ok - lastOK), Times: times})
			lastAttempts, lastOK = a, ok
		}
		c.mu.Lock()
		fails := c.pickFails
		c.pickFails = nil
		c.mu.Unlock()
		if len(fails) > 0 {
			out.emit(Event{Ev: "pickfails", PickFails: fails})
		}
		if picks {
			c.mu.Lock()
			ds := c.picks
			c.picks = nil
			c.mu.Unlock()
			if len(ds) > 0 {
				slices.Sort(ds)
				q := func(p float64) int64 { return ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds() }
				out.emit(Event{Ev: "picks", N: len(ds), P50: q(0.5), P99: q(0.99), Max: ds[len(ds)-1].Microseconds()})
			}
		}
		if n%4 == 0 {
			out.emit(Event{Ev: "counts", Counts: c.snapshot(rt)})
		}
	}
}

// signaller sends the configured signals, each round to every id, retrying
// through database trouble; finished or unknown instances are skipped.
func signaller(ctx context.Context, eng *gendurable.Engine, cfg WorkerConfig) {
	rounds := max(1, cfg.SignalRounds)
	for r := 0; r < rounds; r++ {
		if r > 0 && cfg.SignalPaceMs > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(ms(cfg.SignalPaceMs)):
			}
		}
		for id := cfg.SignalFrom; id < cfg.SignalTo; id++ {
			for ctx.Err() == nil {
				sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := eng.Signal(sctx, id, cfg.SignalName, map[string]any{"from": cfg.Name, "round": r},
					&gendurable.SignalOpts{DedupKey: fmt.Sprintf("%s-%d", cfg.SignalName, r)})
				cancel()
				if err == nil || errors.Is(err, gendurable.ErrInstanceFinished) || errors.Is(err, gendurable.ErrNotFound) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}
