package gendurable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config and QueueConfig.
const (
	DefaultSchema              = "public"
	DefaultQueue               = "default"
	DefaultMaxAttempts         = 20
	DefaultLeaseDuration       = 60 * time.Second
	DefaultHeartbeatInterval   = 20 * time.Second
	DefaultReaperInterval      = 30 * time.Second
	DefaultDrainTimeout        = 10 * time.Second
	DefaultUnknownVersionDelay = 30 * time.Second
	DefaultConcurrency         = 10
	DefaultPollInterval        = time.Second
	DefaultBusyPollInterval    = 25 * time.Millisecond
	DefaultMaxPollInterval     = 5 * time.Second
	DefaultChainSteps          = 16
	DefaultRetention           = 7 * 24 * time.Hour
	DefaultPruneInterval       = time.Hour
	DefaultMaxStateBytes       = 1 << 20
	DefaultMaxSignalBytes      = 256 << 10
	DefaultMaxJSONDepth        = 1000
	DefaultPartitionRetryDelay = 250 * time.Millisecond
)

// Config configures an [Engine]. The zero value is usable (an insert-only
// engine on schema "public"); every field documents its default.
type Config struct {
	// Schema holding gendurable's tables (see package migrate). A plain
	// identifier; default "public".
	Schema string

	// Machines and jobs this engine can insert and run: *Machine[S] and
	// *Job[T] values. Several versions of one machine may be registered side
	// by side; each row runs on the version it was inserted with.
	Machines []Definition

	// Queues this engine works, by name. Empty: the engine only inserts.
	Queues map[string]QueueConfig

	// Periodic schedules whose slots this engine inserts while it runs
	// (see [Periodic]). Every process may list the same schedules: each slot
	// is inserted exactly once across all of them.
	Periodic []Periodic

	// LeaseDuration is how long a claimed row stays ours without a heartbeat.
	// A crashed worker's steps run again this long after its last heartbeat.
	// Default 60s.
	LeaseDuration time.Duration
	// HeartbeatInterval between lease extensions; HeartbeatInterval × 3 must
	// not exceed LeaseDuration. Default 20s, or LeaseDuration/3 if shorter.
	HeartbeatInterval time.Duration
	// ReaperInterval between sweeps for expired leases. Default 30s. Set it
	// negative to run no reaper in this process (another process must).
	ReaperInterval time.Duration
	// AwaitTimeoutInterval is the longest the await-timeout sweep sleeps:
	// it wakes at the next deadline it knows of (an await with a timeout
	// written by this process wakes it at once), and at least this often to
	// find deadlines that other processes wrote. Set it negative to run no
	// sweep in this process (another process must). Default: zero, which
	// follows ReaperInterval — 30s by default, and no sweep when
	// ReaperInterval is negative. It stays zero in [Engine.Config], so a
	// configuration copied from there and given another ReaperInterval
	// still follows it.
	AwaitTimeoutInterval time.Duration
	// DrainTimeout: on Stop, how long in-flight steps may run before their
	// contexts are cancelled. Default 10s.
	DrainTimeout time.Duration
	// UnknownVersionDelay: a claimed row whose (machine, version) is not
	// registered here is released, runnable again after this delay (another
	// process, or a later deploy, may know it). Default 30s.
	UnknownVersionDelay time.Duration
	// PartitionRetryDelay: a claimed row whose partition key turns out to be
	// held by another step goes back to runnable, eligible after this delay.
	// Default 250ms.
	PartitionRetryDelay time.Duration
	// MaxStateBytes bounds the encoded JSON state of an insert or outcome,
	// and the encoded result of a Done. Default 1 MiB.
	MaxStateBytes int
	// MaxSignalBytes bounds the encoded JSON payload of a signal. Default 256 KiB.
	MaxSignalBytes int
	// MaxJSONDepth bounds how deeply arrays and objects may nest in a
	// state, result or signal payload. PostgreSQL rejects documents nested
	// some ten thousand levels deep (it depends on its max_stack_depth);
	// this limit rejects them earlier, with a typed error and before any
	// SQL runs. Default 1000; negative leaves the check to the database.
	MaxJSONDepth int
	// Retention: a maintenance loop deletes instances that finished (done or
	// failed) longer ago than this, with their signals, in batches. Default
	// 7 days; negative keeps everything.
	Retention time.Duration
	// PruneInterval between prune sweeps, which run in engines that work
	// queues. Default 1h; negative runs no pruner in this process.
	PruneInterval time.Duration
	// CommitConcurrency is how many outcome statements this engine keeps in
	// flight at once. Outcomes of steps that finish while those run are
	// group-committed in the next statement. Default 2.
	CommitConcurrency int

	// Logger for the engine's own logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks receive telemetry events; see [Hook].
	Hooks []Hook
}

// QueueConfig tunes one queue's feeder. The zero value is usable.
type QueueConfig struct {
	// Concurrency is the number of steps of this queue that run at once in
	// this process. Default 10.
	Concurrency int
	// Prefetch is how many rows are claimed beyond the running slots so that
	// a finishing step finds the next one at hand. Buffered rows are
	// heartbeated like running ones and handed back on Stop. 0 means the
	// default (equal to Concurrency); negative means none.
	Prefetch int
	// MinDemand: don't pick for fewer free places than this, unless the
	// queue is idle (fewer, fatter picks). Default 1.
	MinDemand int
	// BusyPollInterval is the interval between picks while the queue is
	// busy — for PollInterval after its last pick that found rows, even if
	// the queue drained in between: work inserted by other processes (which
	// cannot kick this one) is picked up within about this long. After that,
	// each pick that finds nothing doubles the interval, up to PollInterval
	// while steps of this queue run and up to MaxPollInterval once the queue
	// is idle. Default 25ms (or PollInterval, if shorter).
	BusyPollInterval time.Duration
	// PollInterval is the interval between picks while steps of this queue
	// run and its last picks found nothing. Default 1s.
	PollInterval time.Duration
	// MaxPollInterval caps the idle backoff: each empty pick on an idle queue
	// doubles the interval up to this, so an idle queue costs at most one
	// pick per MaxPollInterval; work inserted by another process into an
	// idle queue waits up to this long. Default 5s.
	MaxPollInterval time.Duration
	// ChainSteps: after a Next without delay commits, the same worker runs
	// the instance's next step at once (the outcome statement keeps it
	// claimed), up to this many steps in a row before the instance goes
	// back to the queue like any other. Default 16; negative disables.
	ChainSteps int
}

type machineKey struct {
	name    string
	version int
}

// Engine inserts instances and, once started, works its queues. Create it
// with [New]; it is safe for concurrent use.
type Engine struct {
	pool     *pgxpool.Pool
	cfg      Config
	q        *sqlq.Queries
	log      *slog.Logger
	registry map[machineKey]*machineCore

	stateLimits, signalLimits jsonLimits

	mu      sync.Mutex
	running *runState
	scheds  map[string]*feeder.Feeder
	sweeper *maintenance.TimeoutSweeper // the running await-timeout sweep, poked by local awaits

	// partitionSlots bounds the pool connections pinned by partition locks.
	partitionSlots chan struct{}
	committer      *committer.Committer
	trans          transitions // observed step transitions, for Graph
}

// runState is one Start..Stop lifetime.
type runState struct {
	pickCancel context.CancelFunc
	workCancel context.CancelCauseFunc
	beatCancel context.CancelFunc
	loops      sync.WaitGroup // feeder loops
	heartbeats sync.WaitGroup
	scheds     map[string]*feeder.Feeder
	// services are the maintenance services, in start order (see
	// maintenanceServices); Stop stops them in reverse.
	services []maintenance.Service
}

// New validates cfg and returns an engine. It does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errorf(ErrInvalidConfig, "nil pool")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if err := c.withDefaults(); err != nil {
		return nil, err
	}
	q, err := sqlq.New(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	e := &Engine{pool: pool, cfg: c, q: q, log: c.Logger, registry: map[machineKey]*machineCore{},
		stateLimits:  jsonLimits{maxBytes: c.MaxStateBytes, bytesName: "MaxStateBytes", maxDepth: c.MaxJSONDepth},
		signalLimits: jsonLimits{maxBytes: c.MaxSignalBytes, bytesName: "MaxSignalBytes", maxDepth: c.MaxJSONDepth}}
	e.committer = committer.New(committer.Config{Lease: c.LeaseDuration, MaxInFlight: c.CommitConcurrency}, q, pool)
	// Keep connections for the engine's own statements: a pick and a
	// heartbeat per queue, the reaper, the timeout sweep and outcomes.
	reserve := 2*len(c.Queues) + 2
	e.partitionSlots = make(chan struct{}, max(1, int(pool.Config().MaxConns)-reserve))
	for _, d := range c.Machines {
		if d == nil {
			return nil, errorf(ErrInvalidConfig, "nil entry in Machines")
		}
		core, err := d.definition()
		if err != nil {
			return nil, err
		}
		k := machineKey{core.name, core.version}
		if prev := e.registry[k]; prev != nil && prev != core {
			return nil, errorf(ErrInvalidConfig, "machine %q version %d registered twice", core.name, core.version)
		}
		e.registry[k] = core
	}
	return e, nil
}

func (c *Config) withDefaults() error {
	setDefault(&c.Schema, DefaultSchema)
	setDefault(&c.LeaseDuration, DefaultLeaseDuration)
	setDefault(&c.HeartbeatInterval, min(DefaultHeartbeatInterval, c.LeaseDuration/3))
	setDefault(&c.ReaperInterval, DefaultReaperInterval)
	setDefault(&c.DrainTimeout, DefaultDrainTimeout)
	setDefault(&c.UnknownVersionDelay, DefaultUnknownVersionDelay)
	setDefault(&c.PartitionRetryDelay, DefaultPartitionRetryDelay)
	setDefault(&c.MaxSignalBytes, DefaultMaxSignalBytes)
	setDefault(&c.MaxStateBytes, DefaultMaxStateBytes)
	setDefault(&c.MaxJSONDepth, DefaultMaxJSONDepth)
	setDefault(&c.Retention, DefaultRetention)
	setDefault(&c.PruneInterval, DefaultPruneInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.LeaseDuration < 0 || c.HeartbeatInterval < 0 || c.DrainTimeout < 0 || c.UnknownVersionDelay < 0:
		return errorf(ErrInvalidConfig, "durations must not be negative")
	case c.HeartbeatInterval*3 > c.LeaseDuration:
		return errorf(ErrInvalidConfig, "HeartbeatInterval × 3 (%s) exceeds LeaseDuration (%s): a live step could be reaped",
			c.HeartbeatInterval*3, c.LeaseDuration)
	case c.LeaseDuration < time.Millisecond:
		return errorf(ErrInvalidConfig, "LeaseDuration %s below 1ms", c.LeaseDuration)
	case c.MaxStateBytes < 0 || c.MaxSignalBytes < 0 || c.PartitionRetryDelay < 0:
		return errorf(ErrInvalidConfig, "negative MaxStateBytes, MaxSignalBytes or PartitionRetryDelay")
	}
	c.Periodic = slices.Clone(c.Periodic)
	names := map[string]bool{}
	for i := range c.Periodic {
		if err := c.Periodic[i].validate(); err != nil {
			return err
		}
		if names[c.Periodic[i].Name] {
			return errorf(ErrInvalidConfig, "two Periodic schedules named %q", c.Periodic[i].Name)
		}
		names[c.Periodic[i].Name] = true
	}
	queues := make(map[string]QueueConfig, len(c.Queues))
	for name, qc := range c.Queues {
		if name == "" || len(name) > maxNameLen {
			return errorf(ErrInvalidConfig, "queue name %q must be 1-%d bytes", name, maxNameLen)
		}
		if err := qc.withDefaults(name); err != nil {
			return err
		}
		queues[name] = qc
	}
	c.Queues = queues
	return nil
}

func (qc *QueueConfig) withDefaults(name string) error {
	setDefault(&qc.Concurrency, DefaultConcurrency)
	switch {
	case qc.Prefetch == 0:
		qc.Prefetch = qc.Concurrency
	case qc.Prefetch < 0:
		qc.Prefetch = 0
	}
	setDefault(&qc.MinDemand, 1)
	switch {
	case qc.ChainSteps == 0:
		qc.ChainSteps = DefaultChainSteps
	case qc.ChainSteps < 0:
		qc.ChainSteps = 0
	}
	setDefault(&qc.PollInterval, DefaultPollInterval)
	setDefault(&qc.MaxPollInterval, max(DefaultMaxPollInterval, qc.PollInterval))
	setDefault(&qc.BusyPollInterval, min(DefaultBusyPollInterval, qc.PollInterval))
	switch {
	case qc.Concurrency < 0:
		return errorf(ErrInvalidConfig, "queue %q: negative Concurrency", name)
	case qc.MinDemand < 0 || qc.MinDemand > qc.Concurrency+qc.Prefetch:
		return errorf(ErrInvalidConfig, "queue %q: MinDemand %d outside 1..Concurrency+Prefetch (%d)", name, qc.MinDemand, qc.Concurrency+qc.Prefetch)
	case qc.BusyPollInterval < 0 || qc.PollInterval < qc.BusyPollInterval || qc.MaxPollInterval < qc.PollInterval:
		return errorf(ErrInvalidConfig, "queue %q: need 0 < BusyPollInterval <= PollInterval <= MaxPollInterval", name)
	}
	return nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Start checks that the schema is migrated, then starts the maintenance
// services (reaper, await-timeout sweep, pruner, periodic schedules, in
// that order) and the feeders of the configured queues in background
// goroutines. ctx bounds the start-up checks only; the engine runs until
// [Engine.Stop].
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running != nil {
		return ErrAlreadyStarted
	}
	v, err := sqlq.InstalledVersion(ctx, e.pool, e.cfg.Schema)
	if err != nil {
		return fmt.Errorf("gendurable: start: reading schema version: %w", err)
	}
	if want := sqlq.LatestVersion(); v != want {
		return fmt.Errorf("%w: schema %q is at version %d, this library needs %d (run migrate.Up)", ErrSchemaVersion, e.cfg.Schema, v, want)
	}

	rs := &runState{scheds: map[string]*feeder.Feeder{}}
	// The maintenance services start first and stop last, after the
	// feeders have drained. They run until Stop, not under ctx, which
	// bounds start-up only.
	services, sweeper := e.maintenanceServices()
	if err := maintenance.StartAll(context.Background(), services); err != nil {
		return fmt.Errorf("gendurable: start: %w", err)
	}
	rs.services = services
	pickCtx, pickCancel := context.WithCancel(context.Background())
	workCtx, workCancel := context.WithCancelCause(context.Background())
	beatCtx, beatCancel := context.WithCancel(context.Background())
	rs.pickCancel, rs.workCancel, rs.beatCancel = pickCancel, workCancel, beatCancel

	for name, qc := range e.cfg.Queues {
		ev := &schedEvents{e: e}
		s := feeder.New(feeder.Config{
			Queue: name, Concurrency: qc.Concurrency, Prefetch: qc.Prefetch, MinDemand: qc.MinDemand,
			BusyPollInterval: qc.BusyPollInterval, PollInterval: qc.PollInterval, MaxPollInterval: qc.MaxPollInterval,
			Lease: e.cfg.LeaseDuration, HeartbeatInterval: e.cfg.HeartbeatInterval,
		}, e.q, e.pool, e.executor(name, qc.ChainSteps), ev, e.log)
		rs.scheds[name] = s
		rs.loops.Add(1)
		go func() { defer rs.loops.Done(); s.Run(pickCtx, workCtx) }()
		rs.heartbeats.Add(1)
		go func() { defer rs.heartbeats.Done(); s.Heartbeat(beatCtx) }()
	}
	conc := 0
	for _, qc := range e.cfg.Queues {
		conc += qc.Concurrency
	}
	if poolMax := int(e.pool.Config().MaxConns); conc >= poolMax {
		e.log.Warn("gendurable: total queue concurrency reaches the pool size; partitioned steps each hold a connection, and heartbeats need one too",
			"concurrency", conc, "pool_max_conns", poolMax)
	}
	e.running = rs
	e.scheds = rs.scheds
	e.sweeper = sweeper
	e.log.Info("gendurable: engine started", "schema", e.cfg.Schema, "queues", len(e.cfg.Queues))
	return nil
}

// Stop shuts the engine down gracefully: it stops picking, hands prefetched
// rows straight back to runnable, waits up to DrainTimeout for in-flight
// steps to commit their outcomes, then cancels their contexts (cause
// ErrEngineStopped) and waits for them to return. Steps still running when
// ctx is done are abandoned to the reaper and Stop returns ctx's error.
// Steps already abandoned for ignoring their context past StepTimeout
// (the engine wrote their outcomes) are not waited for; if any still run,
// Stop says so with an error wrapping [ErrStepTimeout].
// The maintenance services stop last, in the reverse of their start order.
// Stop on an engine that is not running returns nil.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	rs := e.running
	e.running, e.scheds, e.sweeper = nil, nil, nil
	e.mu.Unlock()
	if rs == nil {
		return nil
	}
	start := time.Now()
	rs.pickCancel()
	rs.loops.Wait() // feeders stopped picking and released their buffers

	drainCtx, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	completed := true
	for _, s := range rs.scheds {
		if !s.Wait(drainCtx) {
			completed = false
		}
	}
	cancel()
	rs.workCancel(ErrEngineStopped)
	var err error
	abandoned := 0
	for _, s := range rs.scheds {
		if !s.Wait(ctx) {
			err = fmt.Errorf("gendurable: stop: steps ignoring cancellation are still running: %w", ctx.Err())
		}
		abandoned += s.Abandoned()
	}
	if abandoned > 0 {
		err = errors.Join(err, fmt.Errorf("gendurable: stop: %d steps abandoned for ignoring their context past StepTimeout are still running (the engine wrote their outcomes): %w",
			abandoned, ErrStepTimeout))
	}
	for name := range rs.scheds {
		e.emit(ctx, &DrainEvent{Queue: name, Released: rs.scheds[name].ReleasedOnStop(), Completed: completed, Duration: time.Since(start)})
	}
	rs.beatCancel()
	maintenance.StopAll(rs.services) // in reverse start order, each waited for
	rs.heartbeats.Wait()
	e.log.Info("gendurable: engine stopped", "drained", completed, "took", time.Since(start))
	return err
}

// executor returns the function that runs one claimed row of queue to a
// committed outcome: take the partition lock if the row has a key, load what
// the step needs, run it, write its outcome — and, after a Next without
// delay, go straight on with the next step under the fresh claim the
// outcome statement handed back (up to ChainSteps steps, never while the
// feeder is stopping), instead of releasing the row and picking it again.
func (e *Engine) executor(queue string, chain int) feeder.Executor {
	return func(ctx context.Context, c *sqlq.Claimed, h feeder.Holder) feeder.Result {
		core := e.registry[machineKey{c.FSM, int(c.Version)}]
		if core == nil {
			e.releaseUnknown(queue, c)
			return feeder.Result{}
		}
		// Loads and WithTx outcomes of a partitioned row run on the
		// connection that holds its key's lock.
		var db sqlq.DB = e.pool
		if c.PartitionKey != nil {
			lock, ok := e.lockPartition(ctx, queue, c)
			if !ok {
				return feeder.Result{}
			}
			defer lock.release()
			db = lock.conn
		}
		for n := 0; ; n++ {
			start := time.Now()
			in := &execInput{c: c, queue: queue, limits: e.stateLimits, newChild: e.newInstance}
			inputs(core, in)
			res, ok := e.runStep(ctx, queue, core, in, h)
			if !ok {
				return feeder.Result{} // abandoned: the watchdog writes its outcome
			}
			res.out.ID, res.out.Token = c.ID, c.Token
			res.out.Continue = n < chain && res.kind == kindNext && res.out.Delay <= 0 && res.txFn == nil &&
				ctx.Err() == nil && !h.Stopping()
			if !res.out.Continue && res.txFn == nil && c.PartitionKey == nil {
				// Nothing in this worker depends on the commit any more: free
				// the slot now; the claim stays held until the outcome commits.
				e.commitDetached(ctx, queue, c, &res, h.Detach(), start)
				return feeder.Result{}
			}
			var applied *sqlq.Applied
			var commitErr error
			if res.txFn != nil {
				applied, commitErr = e.commitTx(ctx, db, core, in, &res, h)
			} else {
				h.Committing()
				applied, commitErr = e.commit(ctx, &res.out)
			}
			e.reportStep(ctx, queue, c, &res, applied != nil, commitErr, time.Since(start))
			if applied != nil && applied.Status == string(StatusAwaitingSignal) && res.out.Timeout != nil {
				e.pokeTimeouts()
			}
			if applied != nil && applied.Token != nil && !h.Continue(c.Token, *applied.Token) {
				// The feeder gave up the claim meanwhile (its lease looked
				// lost): hand the re-claimed row back rather than strand it.
				e.releaseClaim(&sqlq.Claimed{ID: c.ID, Token: *applied.Token}, 0)
				return feeder.Result{RunnableNow: true}
			}
			if applied == nil || applied.Token == nil {
				runnable := applied != nil && applied.Status == string(StatusRunnable) && res.out.Delay <= 0
				return feeder.Result{RunnableNow: runnable}
			}
			// Still ours: the next step, with the state just committed.
			next := *c
			next.Token, next.Step, next.State = *applied.Token, *res.out.Step, []byte(*res.out.State)
			next.Attempt, next.Awaits, next.Children = 0, nil, 0
			next.Inbox, next.ChildRows = applied.Inbox, nil
			c = &next
		}
	}
}

// transitionTarget names where an outcome leads, for the machine graph.
func transitionTarget(from string, res *execResult) string {
	switch res.kind {
	case kindDone:
		return "done"
	case kindStop:
		return "failed"
	case kindReplay:
		return from
	}
	if res.out.Step != nil {
		return *res.out.Step
	}
	return from
}

// commitDetached hands a final outcome (no chaining, no partition lock, no
// transaction) to the group committer and returns at once; the feeder's
// claim is settled by finish when the outcome has committed.
func (e *Engine) commitDetached(ctx context.Context, queue string, c *sqlq.Claimed, res *execResult, finish func(feeder.Result), start time.Time) {
	claimed := *c
	r := *res
	e.committer.CommitAsync(&r.out, func(cr committer.Result) {
		ctx := context.WithoutCancel(ctx)
		if cr.Applied != nil {
			e.wakeApplied(cr.Applied)
		}
		e.reportStep(ctx, queue, &claimed, &r, cr.Applied != nil, cr.Err, time.Since(start))
		if cr.Applied != nil && cr.Applied.Status == string(StatusAwaitingSignal) && r.out.Timeout != nil {
			e.pokeTimeouts()
		}
		runnable := cr.Applied != nil && cr.Applied.Status == string(StatusRunnable) && r.out.Delay <= 0
		finish(feeder.Result{RunnableNow: runnable})
	})
}

// inputs hands the step what the claim brought along (docs/design.md §4):
// the inbox after an await, or for machines that read it; the children after
// a fan-out. The statement that claimed the row read them, so a step never
// costs a load of its own.
func inputs(core *machineCore, in *execInput) {
	if in.c.Awaits != nil || core.readsInbox {
		in.inbox = in.c.Inbox
	}
	if in.c.Children > 0 {
		in.children = in.c.ChildRows
	}
}

func (e *Engine) reportStep(ctx context.Context, queue string, c *sqlq.Claimed, res *execResult, applied bool, commitErr error, took time.Duration) {
	if applied {
		e.trans.add(c.FSM, c.Step, transitionTarget(c.Step, res), res.kind.String())
	}
	if len(e.cfg.Hooks) == 0 && commitErr == nil && applied && res.stepErr == nil && !e.log.Enabled(ctx, slog.LevelDebug) {
		return // the common case: nothing to tell anyone
	}
	ev := &StepEvent{
		Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Step: c.Step,
		Attempt: int(c.Attempt), Outcome: res.kind.String(), Err: res.stepErr,
		Duration: took, Fenced: commitErr == nil && !applied, CommitErr: commitErr,
	}
	e.emit(ctx, ev)
	switch {
	case commitErr != nil:
		e.log.Error("gendurable: outcome not written; the step will run again after its lease expires",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "err", commitErr)
	case ev.Fenced:
		e.log.Warn("gendurable: outcome fenced out: the lease was lost, another run owns the instance",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step)
	case errors.Is(res.stepErr, ErrInfrastructure):
		e.log.Warn("gendurable: step's transaction failed on its connection; it runs again without counting an attempt",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt, "err", res.stepErr)
	case res.stepErr != nil:
		e.log.Warn("gendurable: step failed", "queue", queue, "fsm", c.FSM, "id", c.ID,
			"step", c.Step, "attempt", c.Attempt, "outcome", ev.Outcome, "err", res.stepErr)
	default:
		e.log.Debug("gendurable: step done", "queue", queue, "fsm", c.FSM, "id", c.ID,
			"step", c.Step, "outcome", ev.Outcome, "took", took)
	}
}

// commit writes one outcome through the group committer. It returns the
// outcome if its fence held, nil if it was fenced out.
func (e *Engine) commit(stepCtx context.Context, o *sqlq.Outcome) (*sqlq.Applied, error) {
	r := e.committer.Commit(o)
	if r.Applied != nil {
		e.wakeApplied(r.Applied)
	}
	return r.Applied, r.Err
}

// commitTx writes a WithTx outcome: the step's callback and the outcome in
// one transaction. If the callback fails, nothing of it is kept and the
// error goes to Handle, whose outcome is written the ordinary way — unless
// it failed on its connection (see [ErrInfrastructure]): then the step runs
// again shortly, without counting an attempt. Transient failures retry the
// whole transaction (callback included) for up to a lease; a rejected
// outcome stops the instance like commit does. A transaction that waits (on
// a lock held elsewhere, for a connection) is not given up while the claim
// is heartbeated: only once the lease is lost (see txContext).
func (e *Engine) commitTx(stepCtx context.Context, db sqlq.DB, core *machineCore, in *execInput, res *execResult, h feeder.Holder) (*sqlq.Applied, error) {
	ctx, cancel := e.txContext(stepCtx)
	defer cancel()
	failures := 0
	var retryUntil time.Time
	for {
		applied, fnErr, err := e.tryCommitTx(ctx, stepCtx, db, res, h)
		switch {
		case errors.Is(fnErr, ErrInfrastructure):
			*res = execResult{kind: kindReplay, stepErr: fnErr, out: sqlq.Outcome{
				ID: in.c.ID, Token: in.c.Token, Kind: sqlq.KindReplay, AttemptInc: 0,
				Delay:   backoff.Delay(infraRetryDelay, infraRetryDelay, 1),
				ErrKind: strPtr("infrastructure"), Err: strPtr(truncate(fnErr.Error())),
			}}
			h.Committing()
			return e.commit(stepCtx, &res.out)
		case fnErr != nil:
			*res = core.handleErr(stepCtx, in, fnErr)
			res.out.ID, res.out.Token = in.c.ID, in.c.Token
			h.Committing()
			return e.commit(stepCtx, &res.out)
		case err == nil:
			if applied != nil {
				e.wakeApplied(applied)
			}
			return applied, nil
		case sqlq.Rejected(err):
			res.out = sqlq.Outcome{ID: in.c.ID, Token: in.c.Token, Kind: sqlq.KindStop,
				ErrKind: strPtr("outcome_rejected"), Err: strPtr(truncate("outcome rejected by the database: " + err.Error()))}
			res.kind, res.txFn = kindStop, nil
			h.Committing()
			return e.commit(stepCtx, &res.out)
		case errors.Is(context.Cause(stepCtx), feeder.ErrLeaseLost):
			return nil, nil
		}
		db = e.pool // the dedicated connection may be dead
		failures++
		if failures == 1 {
			retryUntil = time.Now().Add(e.cfg.LeaseDuration)
		} else if time.Now().After(retryUntil) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff.Delay(20*time.Millisecond, 2*time.Second, failures)):
		}
	}
}

// infraRetryDelay is about how long a step whose transaction failed on its
// connection waits before it runs again (jittered down to half of it).
const infraRetryDelay = time.Second

// txContext is the context of a WithTx outcome's transaction. A transaction
// that waits — on a row another transaction locked, for a pool connection —
// keeps its claim: the feeder heartbeats it all along. So the context has
// no deadline; it is cancelled when the lease is lost (the heartbeat found
// the row taken, or could not confirm it for a whole lease: the step
// context's cause is ErrLeaseLost), or a lease after the step context was
// cancelled for another reason (a stop), as before.
func (e *Engine) txContext(stepCtx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(stepCtx))
	stop := context.AfterFunc(stepCtx, func() {
		if errors.Is(context.Cause(stepCtx), feeder.ErrLeaseLost) {
			cancel()
			return
		}
		go func() {
			t := time.NewTimer(e.cfg.LeaseDuration)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		}()
	})
	return ctx, func() { stop(); cancel() }
}

// tryCommitTx runs one transaction of a WithTx outcome. fnErr is the
// callback's own failure, wrapped in ErrInfrastructure if it failed on its
// connection rather than by itself; err a database failure.
func (e *Engine) tryCommitTx(ctx, stepCtx context.Context, db sqlq.DB, res *execResult, h feeder.Holder) (applied *sqlq.Applied, fnErr, err error) {
	beginner, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, nil, errors.New("gendurable: internal: connection cannot begin a transaction")
	}
	tx, err := beginner.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Without a deadline, a connection that died silently (half-open after
	// a failover) would keep the claim forever: watch its server session.
	ctx, gone := context.WithCancelCause(ctx)
	defer gone(nil)
	fnCtx, fnGone := context.WithCancelCause(stepCtx)
	defer fnGone(nil)
	defer e.watchTx(tx.Conn().PgConn().PID(), func() { gone(errTxGone); fnGone(errTxGone) })()
	defer func() { _ = tx.Rollback(ctx) }()
	if fnErr := safely(func() error { return res.txFn(fnCtx, tx) }); fnErr != nil {
		if stepCtx.Err() == nil && (connectionFailure(fnErr) || tx.Conn().IsClosed() || context.Cause(fnCtx) == errTxGone) {
			fnErr = fmt.Errorf("%w: the step's transaction failed on its connection: %w", ErrInfrastructure, fnErr)
		}
		return nil, fnErr, nil
	}
	var b sqlq.OutcomeBatch
	b.Add(&res.out)
	rows, err := e.q.ApplyOutcomes(ctx, tx, &b)
	if err != nil {
		return nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil // fenced out: the rollback undoes the step's writes too
	}
	// The callback has run; from the commit on, the row may be finished
	// before this worker lets go of its claim.
	h.Committing()
	return &rows[0], nil, tx.Commit(ctx)
}

// errTxGone: the server session of a WithTx transaction no longer exists.
var errTxGone = errors.New("gendurable: the transaction's server session is gone")

// watchTx checks once per lease, while a WithTx transaction runs, that its
// server session (backend pid) still exists, and calls gone once if it does
// not. A check that fails (the database is unreachable) proves nothing: the
// heartbeat gives the claim up if that lasts a lease. The returned func
// stops the watch and waits for it.
func (e *Engine) watchTx(pid uint32, gone func()) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(e.cfg.LeaseDuration)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			qctx, qcancel := context.WithTimeout(ctx, e.cfg.HeartbeatInterval)
			var alive bool
			err := e.pool.QueryRow(qctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int64(pid)).Scan(&alive)
			qcancel()
			if err == nil && !alive {
				gone()
				return
			}
		}
	}()
	return func() { cancel(); <-exited }
}

// connectionFailure reports an error that says the connection or the
// server failed rather than the statement: the connection was lost or could
// not be made (SQLSTATE class 08, a network error, EOF), the server is
// shutting down or starting up (57P01, 57P02, 57P03), or it has no
// connection to give (53300). A context's deadline or cancellation is not
// one: it is the caller's.
func connectionFailure(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || slices.Contains([]string{"57P01", "57P02", "57P03", "53300"}, pgErr.Code)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// wakeApplied kicks the local feeder of an outcome that made its instance
// runnable (an Await that found its signal, children that were all
// duplicates; a Next's own queue also learns from the step's completion).
func (e *Engine) wakeApplied(a *sqlq.Applied) {
	if a.Status == string(StatusRunnable) {
		e.kickQueue(a.Queue)
	}
}

func (e *Engine) pokeTimeouts() {
	e.mu.Lock()
	sweeper := e.sweeper
	e.mu.Unlock()
	if sweeper != nil {
		sweeper.Poke()
	}
}

func (e *Engine) kickQueue(queue string) {
	e.mu.Lock()
	s := e.scheds[queue]
	e.mu.Unlock()
	if s != nil {
		s.Kick()
	}
}

func (e *Engine) releaseUnknown(queue string, c *sqlq.Claimed) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.releaseClaim(c, e.cfg.UnknownVersionDelay)
	e.log.Warn("gendurable: claimed a row of a machine version this process does not know; released it",
		"queue", queue, "fsm", c.FSM, "version", c.Version, "id", c.ID, "retry_in", e.cfg.UnknownVersionDelay)
	e.emit(ctx, &UnknownVersionEvent{Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Delay: e.cfg.UnknownVersionDelay})
}

// Reap runs one reaper sweep now: every expired lease goes back to runnable
// with attempt + 1, or fails once its attempts are spent. It returns the
// number of rows recovered. Engines run it every ReaperInterval; it is
// exported for tools and tests.
func (e *Engine) Reap(ctx context.Context) (int, error) {
	return e.reaper().RunOnce(ctx)
}

func (e *Engine) emit(ctx context.Context, ev Event) {
	for _, h := range e.cfg.Hooks {
		e.callHook(ctx, h, ev)
	}
}

// callHook shields the engine from a panicking hook: telemetry must never
// take a worker down.
func (e *Engine) callHook(ctx context.Context, h Hook, ev Event) {
	defer func() {
		if v := recover(); v != nil {
			e.log.Error("gendurable: hook panicked", "event", ev.EventName(), "panic", v)
		}
	}()
	h.OnEvent(ctx, ev)
}

// schedEvents adapts feeder observations to hooks and logs.
type schedEvents struct{ e *Engine }

func (s *schedEvents) Pick(queue string, count, demand int, d time.Duration, err error) {
	s.e.emit(context.Background(), &PickEvent{Queue: queue, Count: count, Demand: demand, Duration: d, Err: err})
}

func (s *schedEvents) Saturation(queue string, inFlight, buffered, concurrency, prefetch int) {
	if len(s.e.cfg.Hooks) == 0 {
		return
	}
	s.e.emit(context.Background(), &SaturationEvent{Queue: queue, InFlight: inFlight, Buffered: buffered, Concurrency: concurrency, Prefetch: prefetch})
}

func (s *schedEvents) LeaseLost(queue string, id int64) {
	s.e.log.Warn("gendurable: lease lost; cancelling the step", "queue", queue, "id", id)
	s.e.emit(context.Background(), &LeaseLostEvent{Queue: queue, InstanceID: id})
}

func (s *schedEvents) HeartbeatFailed(queue string, err error) {
	s.e.log.Warn("gendurable: heartbeat failed", "queue", queue, "err", err)
}

func (s *schedEvents) Released(queue string, count int, err error) {
	if count > 0 {
		s.e.log.Info("gendurable: released prefetched rows", "queue", queue, "count", count)
	}
}
