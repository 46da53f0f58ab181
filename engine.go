package gendurable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
)

// Defaults of Config and QueueConfig.
const (
	DefaultSchema              = "public"
	DefaultQueue               = "default"
	DefaultMaxAttempts         = 20
	DefaultLeaseDuration       = 60 * time.Second
	MinLeaseDuration           = 100 * time.Millisecond // Config.LeaseDuration's floor
	MaxLeaseDuration           = 24 * time.Hour         // Config.LeaseDuration's ceiling
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
	// DefaultMinMaintenanceTimeout is the least default MaintenanceTimeout,
	// which is max(LeaseDuration, DefaultMinMaintenanceTimeout).
	DefaultMinMaintenanceTimeout = 30 * time.Second
)

// Config configures an [Engine]. The zero value is usable (an insert-only
// engine on schema "public"); every field documents its default. A
// time.Duration counts nanoseconds, so a forgotten unit (ReaperInterval:
// 30) would run a sweep thousands of times a second: a positive interval,
// delay or timeout under 1ms — HeartbeatInterval, ReaperInterval,
// AwaitTimeoutInterval, PruneInterval, UnknownVersionDelay, TxIdleTimeout,
// DrainTimeout (30 would cancel every running step the moment Stop begins),
// a queue's poll intervals, a machine's StepTimeout — or a Retention under
// 1s is [ErrInvalidConfig] (and LeaseDuration under 100ms, MaintenanceTimeout
// under 1s).
type Config struct {
	// Schema holding gendurable's tables (see package migrate). A plain
	// identifier, not a system schema's (information_schema, pg_…);
	// default "public".
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
	// Default 60s; under 100ms is [ErrInvalidConfig] (a lease must outlast
	// a pick's and a heartbeat's round trips on a loaded database, or no
	// step ever holds its claim), and so is over 24h (a crashed worker's
	// steps would wait that long; heartbeats keep a long step's lease, so a
	// lease need not outlast the step).
	LeaseDuration time.Duration
	// HeartbeatInterval between lease extensions; it must not exceed
	// LeaseDuration / 3. Default 20s, or LeaseDuration/3 if shorter.
	HeartbeatInterval time.Duration
	// ReaperInterval is the longest wait between sweeps for expired leases
	// (the first runs at Start). Default 30s. The reaper also sweeps as the
	// next lease of any process runs out when that comes sooner (each sweep
	// reads that expiry from the lease index in its own statement), so a
	// crashed worker's rows run again about LeaseDuration after its last
	// heartbeat rather than up to ReaperInterval later, once a sweep has run
	// since the crash. A lease written by a transaction that committed more
	// than LeaseDuration + 10s after it began (a WithTx step's outcome that
	// keeps its row running; a GlobalConcurrency pick that waited that long
	// for its queue's lock) is found by the next full sweep: every ten
	// intervals, or later when a full sweep takes long (docs/design.md §4,
	// "The reaper's floor"). Set it negative to run no reaper in this
	// process (another process must).
	ReaperInterval time.Duration
	// AwaitTimeoutInterval is the longest the await-timeout sweep sleeps:
	// it wakes at the next deadline it knows of (an await with a timeout
	// written by this process wakes it at that deadline), and at least this often to
	// find deadlines that other processes wrote. A deadline that became
	// visible more than LeaseDuration + 10s after it passed (a WithTx
	// transaction that outlasted its await's timeout by that much) waits
	// for the sweep's next full pass, every ten intervals (docs/design.md
	// §4). Set it negative to run no
	// sweep in this process (another process must). Default: zero, which
	// follows ReaperInterval — 30s by default, and no sweep when
	// ReaperInterval is negative. It stays zero in [Engine.Config], so a
	// configuration copied from there and given another ReaperInterval
	// still follows it.
	AwaitTimeoutInterval time.Duration
	// DrainTimeout: on Stop, how long in-flight steps may run before their
	// contexts are cancelled. Default 10s.
	DrainTimeout time.Duration
	// TxIdleTimeout bounds how long a [Outcome.WithTx] transaction may wait
	// on its own client — the callback's work between its statements — before
	// the server ends it (idle_in_transaction_session_timeout, set for that
	// transaction only). It is what frees the locks of a worker cut off from
	// the database: a network partition leaves the worker's session open on
	// the server, holding the callback's locks until the OS's TCP keepalive
	// gives up (two hours by default), and the step's rerun elsewhere would
	// wait on them. A step whose transaction the server ends this way fails,
	// counting an attempt, with an error that says so. Waiting on a lock or
	// on a running statement is not idle. A stricter limit the session
	// already has (set for the role or database) is kept; a callback ended
	// by that one before TxIdleTimeout is not told apart from a lost
	// connection unless the server's reason reaches it (no attempt is
	// counted, the step runs again). Default:
	// LeaseDuration; negative sets no limit (the server's own setting
	// applies).
	TxIdleTimeout time.Duration
	// UnknownVersionDelay: a claimed row whose (machine, version) is not
	// registered here is released, runnable again after this delay (another
	// process, or a later deploy, may know it), with an entry of kind
	// "unknown_version" in its error history (no attempt counted; each
	// release's entry replaces the previous one's), so that Describe and
	// WaitReason ("released unrun until …") tell it from a sleep. Default 30s.
	UnknownVersionDelay time.Duration
	// PartitionRetryDelay has no effect since partition keys are key leases
	// taken by the pick itself (a row whose key is full is not claimed).
	//
	// Deprecated: kept so that existing configurations compile.
	PartitionRetryDelay time.Duration
	// KeyPolicies set how many instances of a partition key may run at once,
	// across every process, by key prefix: a key takes the Limit of the
	// longest Prefix it starts with. A key no policy matches runs one at a
	// time (Limit 1, the classic partition key); an insert's
	// [InsertOpts].KeyLimit wins over every policy. Policies are read by the
	// pick, so changing them (in the process that picks) applies to rows
	// already inserted. See docs/design.md §6.
	KeyPolicies []KeyPolicy
	// MaxStateBytes bounds the encoded JSON state of an insert or outcome,
	// and the encoded result of a Done, with numbers counted as PostgreSQL
	// writes them back: numbers with an exponent count written out in full
	// (1e6 as 1000000). It is not the exact size jsonb returns (its text adds
	// a space after each ':' and ',', and stores an escape such as \u003c
	// as one character). Default 1 MiB; over 268,435,455 bytes (256 MiB
	// less one: what a jsonb value can hold) is [ErrInvalidConfig].
	MaxStateBytes int
	// MaxSignalBytes bounds the encoded JSON payload of a signal, measured
	// likewise. Default 256 KiB; over 268,435,455 bytes is [ErrInvalidConfig].
	MaxSignalBytes int
	// MaxJSONDepth bounds how deeply arrays and objects may nest in a
	// state, result or signal payload. PostgreSQL rejects documents nested
	// some ten thousand levels deep (it depends on its max_stack_depth);
	// this limit rejects them earlier, with a typed error and before any
	// SQL runs. Default 1000; negative leaves the check to the database.
	MaxJSONDepth int
	// Retention: a maintenance loop deletes instances that finished (done or
	// failed) longer ago than this, with their signals, in batches (a
	// finished child whose parent is still live is kept until the parent
	// finishes, and a finished parent while a child of it is live, for
	// [Engine.CancelTree] of it to reach them). Default 7 days; negative
	// keeps everything. The pruner of any engine that works a queue deletes
	// the schema's finished rows of every queue, not only its own, and
	// periodic slots count as run while their rows exist (Periodic): give
	// every process of a schema the same Retention.
	Retention time.Duration
	// PruneInterval between prune sweeps, which run in engines that work
	// queues. Default 1h; negative runs no pruner in this process. A sweep
	// also deletes the rate buckets of this engine's rated KeyPolicies that
	// have been full for a minute or LeaseDuration, the longer (a missing
	// bucket counts as a full one),
	// so a table of one row per rated key does not keep every key ever
	// rated.
	PruneInterval time.Duration
	// MaintenanceTimeout bounds each statement of the maintenance services
	// (reap, await-timeout sweep, periodic insert, the merge of observed
	// transitions) and each poll of [WaitResult]; a prune batch, one
	// transaction of up to PruneBatch rows, gets 10 × MaintenanceTimeout. A statement stuck on a connection
	// cut off silently (a partition, a proxy that stops forwarding without
	// closing) is abandoned at its deadline — pgx closes the connection —
	// and the service goes on with its next sweep on a fresh connection
	// instead of waiting for the OS's TCP keepalive (two hours by default):
	// an expired lease is then recovered within MaintenanceTimeout +
	// ReaperInterval of the cut. A periodic insert abandoned so is retried;
	// had it committed, the retry finds its slot taken (each slot is still
	// one instance). Default max(LeaseDuration, 30s): far above a healthy
	// maintenance statement (milliseconds), and a stuck one costs at most
	// about a lease more. Negative or under a second is [ErrInvalidConfig]:
	// a deadline that short would abandon healthy statements too, every
	// sweep. One too long for 10 × it to be a Duration gives a prune batch
	// the longest Duration. The read of the schema version after a call's
	// statement met a missing table or column (to return [ErrSchemaVersion])
	// runs under the caller's context for at most 5 s, or MaintenanceTimeout
	// if shorter. See docs/design.md §7.
	MaintenanceTimeout time.Duration
	// CommitConcurrency is how many outcome statements this engine keeps in
	// flight at once. Outcomes of steps that finish while those run are
	// group-committed in the next statement. Default 2 (for 0 or a negative
	// value); over 100 is [ErrInvalidConfig] (each needs a connection:
	// a default server's max_connections). One more connection is used
	// while outcomes wait on a row lock another transaction holds (a
	// caller's open SignalTx on a parent): after a short wait they are
	// taken out of their batch, which is written without them, and written
	// on that connection once their locks go (docs/design.md §4).
	CommitConcurrency int

	// Logger for the engine's own logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks receive telemetry events; see [Hook].
	Hooks []Hook
}

// QueueConfig tunes one queue's feeder. The zero value is usable.
type QueueConfig struct {
	// Concurrency is the number of steps of this queue that run at once in
	// this process. Default 10, at most 65,536 (each place is a goroutine
	// from Start on). Concurrency + Prefetch (a pick's batch at most) is at
	// most 1<<20.
	Concurrency int
	// Prefetch is how many rows are claimed beyond the running slots so that
	// a finishing step finds the next one at hand. A keyed row's claim holds
	// a slot of its key, so only as many keyed rows are prefetched as are
	// expected to start within a second, and one still waiting after two
	// seconds in which no step returned goes back (docs/design.md §6,
	// "Keyed claims wait little"). Buffered rows are
	// heartbeated like running ones and handed back on Stop; if the process
	// dies instead, the reaper returns a buffered row to runnable without
	// charging an attempt once a heartbeat has marked it not started (a row
	// claimed less than a HeartbeatInterval before the death, or before a
	// database outage longer than the lease, goes back uncharged too, but
	// once per step, as a claim no heartbeat confirmed: see the package
	// doc, "Failures"). 0 means the
	// default: equal to Concurrency, or none in a queue with a
	// GlobalConcurrency — a buffered claim takes a place of that bound with
	// no step running, so an engine that prefetched kept the bound's
	// places from the other processes' free slots (docs/design.md §6,
	// "Queue-wide"). Negative means none (-1 in [Engine.Config]).
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
	// is idle. Default 25ms (or PollInterval, if shorter). Rows of
	// partition keys are the exception while every key is full: after a
	// pick that found them all so, picks look at no key for ten times its
	// duration (at most a second, or PollInterval if longer) unless this
	// process frees a key's slot or inserts a keyed row meanwhile — a key
	// freed by another process waits for that look (docs/design.md §6).
	BusyPollInterval time.Duration
	// PollInterval is the interval between picks while steps of this queue
	// run and its last picks found nothing. Default 1s (or MaxPollInterval,
	// if set and shorter).
	PollInterval time.Duration
	// MaxPollInterval caps the idle backoff: each empty pick on an idle queue
	// doubles the interval up to this, so an idle queue costs at most one
	// pick per MaxPollInterval; work inserted by another process into an
	// idle queue waits up to this long. Default 5s (or PollInterval, if
	// longer).
	MaxPollInterval time.Duration
	// GlobalConcurrency, if not 0, bounds how many steps of this queue run
	// at once across every process (counted as executing rows with a live
	// lease, and rows an operator cancelled mid-step whose lease is still
	// live, retried or not: their step may run until its worker's next
	// heartbeat; under a lock of the queue taken by each pick). Every process
	// working the queue should set the same value. It costs each pick of
	// the queue a read of the live leases of all queues. Default 0: only
	// Concurrency, per process. At most 2147483647 (the pick's int4). Such
	// a queue prefetches nothing unless Prefetch says otherwise.
	GlobalConcurrency int
	// ChainSteps: after a Next without delay commits, the same worker runs
	// the instance's next step at once (the outcome statement keeps it
	// claimed), up to this many steps in a row before the instance goes
	// back to the queue like any other. Default 16; negative disables (-1
	// in [Engine.Config]).
	ChainSteps int
}

type machineKey struct {
	name    string
	version int
}

// Engine inserts instances and, once started, works its queues. Create it
// with [New] (which checks the Config and does not touch the database),
// call [Engine.Start] to work Config.Queues and run the maintenance
// services, and [Engine.Stop] to drain. Inserts, signals and the operator
// calls (List, Describe, Retry, Cancel, …) work on a stopped engine too, so
// a process that only inserts, or a tool, need not start it. An Engine is
// safe for concurrent use. Its zero value is not usable: the methods of one
// New did not make (or of a nil *Engine) return [ErrNotMade].
type Engine struct {
	pool     *pgxpool.Pool
	cfg      Config
	q        *sqlq.Queries
	log      *slog.Logger
	registry map[machineKey]*machineCore

	stateLimits, signalLimits jsonLimits

	mu       sync.Mutex
	running  *runState
	stopping *runState // the run a Stop in progress is stopping; nil once it returned
	// starting is the Start in progress, between its checks on the
	// database and its engine running: e.mu is not held across those
	// round trips (a cut network would hold every caller that takes it —
	// an Insert's kick, Stop — until Start's ctx ends). nil otherwise.
	starting *startState
	// stops counts Stop calls: a Start that waited for a Stop or another
	// Start in progress goes on only if no Stop was called since it began.
	stops   uint64
	scheds  map[string]*feeder.Feeder
	sweeper *maintenance.TimeoutSweeper // the running await-timeout sweep, poked by local awaits

	exec     *executor.Executor   // runs claimed rows of every queue
	commits  *committer.Committer // the executor's group committer: Stop aborts it when out of time
	trans    transitions          // transitions taken since the last merge into the stored definitions (graph.go)
	finished finishWaiters        // WaitResult callers, woken by this process's final outcomes
	ownCtx   context.Context      // Background, marked as the engine's own (insideEngine): steps' and feeder hooks' base

	oversized oversizedGuard // failOversized's backoff
	// bulkGrace is BulkStatementGrace (a test shortens it): how long a
	// bulk statement under way at its call's deadline may run past it.
	bulkGrace time.Duration

	// Outcomes the database did not confirm (events.go), since New: Stop
	// reports those of the Stop's own drain, and those a closed pool
	// refused during the run (runState keeps the counts at its start).
	unconfirmed, closedPool atomic.Int64

	// newCalls are the periodic schedules' New calls not yet returned
	// (periodicNew), by schedule name.
	newCallsMu sync.Mutex
	newCalls   map[string]*newCall
}

// startState is a Start in progress (see Engine.starting).
type startState struct {
	cancel context.CancelCauseFunc // a Stop called meanwhile ends the start with errStoppedWhileStarting
	done   chan struct{}           // closed when that Start returns
}

// errStoppedWhileStarting is the cause a Stop gives a Start in progress.
var errStoppedWhileStarting = fmt.Errorf("gendurable: start: Stop was called while the engine was starting: %w", ErrEngineStopped)

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
	// stopped is closed when the Stop of this run returns, with stopErr its
	// result: a second Stop (or a Start) called meanwhile waits for it.
	stopped chan struct{}
	stopErr error
	// closedPoolAtStart is Engine.closedPool when the run started.
	closedPoolAtStart int64
}

// nilPointer reports whether v holds a nil pointer (a typed nil: a
// constructor's nil result passed on without its error), which an == nil
// check of the interface misses.
func nilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// made is ErrNotMade for a nil Engine or one New did not make: each
// method checks it first, so such an engine fails with a typed error, not
// with a nil dereference or a misleading one ("invalid schema name: """).
func (e *Engine) made() error {
	if e == nil || e.q == nil || e.pool == nil {
		return ErrNotMade
	}
	return nil
}

// usable is made, then ErrInvalidInput for a nil ctx: every method that
// takes a context checks it first, so a nil one is a typed error rather
// than a nil dereference somewhere inside (an API probe: eight methods
// panicked on it, two more inside context.WithTimeout, while Start and
// Stop returned this error). op names the method.
func (e *Engine) usable(ctx context.Context, op string) error {
	if err := e.made(); err != nil {
		return err
	}
	if ctx == nil {
		return errorf(ErrInvalidInput, "%s: nil context", op)
	}
	return nil
}

// New validates cfg and returns an engine. It does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errorf(ErrInvalidConfig, "nil pool")
	}
	c := Config{}
	if cfg != nil {
		c = cfg.clone() // withDefaults fills in the queues' defaults: not in the caller's map
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
		signalLimits: jsonLimits{maxBytes: c.MaxSignalBytes, bytesName: "MaxSignalBytes", maxDepth: c.MaxJSONDepth},
		bulkGrace:    BulkStatementGrace}
	e.ownCtx = e.ownCall(context.Background())
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
	defs := make(map[machineKey]*executor.Definition, len(e.registry))
	for k, core := range e.registry {
		defs[k] = core.executorDefinition(e.stateLimits, e.newInstance)
	}
	e.commits = committer.New(committer.Config{Lease: c.LeaseDuration, MaxInFlight: c.CommitConcurrency}, q, pool)
	e.exec = executor.New(executor.Config{
		Queries: q, Pool: pool,
		Committer: e.commits,
		Lookup:    func(name string, version int) *executor.Definition { return defs[machineKey{name, version}] },
		Events:    execEvents{e}, Log: c.Logger,
		Kick: e.kickQueue, KickAt: e.kickQueueAt, KickBelow: e.kickAllBelow, AwaitParked: e.pokeTimeouts,
		RatedKey: func(key string) bool { p := e.policy(key); return p != nil && p.Rate > 0 },
		HandoffLimit: func(key string) int {
			switch p := e.policy(key); {
			case p == nil:
				return 1
			case p.Rate > 0:
				return 0 // each start draws a token in a pick
			default:
				return p.Limit
			}
		},
		Lease: c.LeaseDuration, Heartbeat: c.HeartbeatInterval, TxIdle: c.TxIdleTimeout,
		UnknownVersionDelay: c.UnknownVersionDelay,
	})
	return e, nil
}

// maxJSONBBytes is the largest value a jsonb holds (256 MiB less one:
// PostgreSQL's JENTRY_OFFLENMASK).
const maxJSONBBytes = 1<<28 - 1

// MaxCommitConcurrency is Config.CommitConcurrency's ceiling.
const MaxCommitConcurrency = 100

func (c *Config) withDefaults() error {
	heartbeatSet := c.HeartbeatInterval // the floor is for a value set, not LeaseDuration/3
	setDefault(&c.Schema, DefaultSchema)
	setDefault(&c.LeaseDuration, DefaultLeaseDuration)
	setDefault(&c.HeartbeatInterval, min(DefaultHeartbeatInterval, c.LeaseDuration/3))
	setDefault(&c.ReaperInterval, DefaultReaperInterval)
	setDefault(&c.DrainTimeout, DefaultDrainTimeout)
	setDefault(&c.TxIdleTimeout, c.LeaseDuration)
	setDefault(&c.UnknownVersionDelay, DefaultUnknownVersionDelay)
	setDefault(&c.PartitionRetryDelay, DefaultPartitionRetryDelay)
	setDefault(&c.MaxSignalBytes, DefaultMaxSignalBytes)
	setDefault(&c.MaxStateBytes, DefaultMaxStateBytes)
	setDefault(&c.MaxJSONDepth, DefaultMaxJSONDepth)
	setDefault(&c.Retention, DefaultRetention)
	setDefault(&c.PruneInterval, DefaultPruneInterval)
	setDefault(&c.MaintenanceTimeout, max(c.LeaseDuration, DefaultMinMaintenanceTimeout))
	if c.CommitConcurrency <= 0 {
		// The committer reads 0 or less as its default too; filled in here
		// so that Engine.Config reports what runs.
		c.CommitConcurrency = committer.DefaultMaxInFlight
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.LeaseDuration < 0 || c.HeartbeatInterval < 0 || c.DrainTimeout < 0 || c.UnknownVersionDelay < 0 || c.MaintenanceTimeout < 0:
		return errorf(ErrInvalidConfig, "durations must not be negative (LeaseDuration %s, HeartbeatInterval %s, DrainTimeout %s, UnknownVersionDelay %s, MaintenanceTimeout %s)",
			c.LeaseDuration, c.HeartbeatInterval, c.DrainTimeout, c.UnknownVersionDelay, c.MaintenanceTimeout)
	case c.MaintenanceTimeout < time.Second:
		// A deadline that short abandons healthy statements too, sweep after
		// sweep (a Duration of 30 is 30 ns, its unit forgotten): no lease
		// would ever be reaped (TestMaintenanceTimeoutUnderASecondRefused).
		return errorf(ErrInvalidConfig, "MaintenanceTimeout %s below 1s: every maintenance statement would be abandoned at its deadline", c.MaintenanceTimeout)
	case c.HeartbeatInterval > c.LeaseDuration/3:
		// Not HeartbeatInterval*3 > LeaseDuration: the product overflows
		// for an interval above a third of a Duration's range, and a
		// heartbeat of 1<<62 passed (its claims were lost before every step).
		return errorf(ErrInvalidConfig, "HeartbeatInterval %s exceeds LeaseDuration / 3 (%s): a live step could be reaped",
			c.HeartbeatInterval, c.LeaseDuration/3)
	case c.LeaseDuration < MinLeaseDuration:
		return errorf(ErrInvalidConfig, "LeaseDuration %s below %s: a claim would expire within a pick's or a heartbeat's round trip", c.LeaseDuration, MinLeaseDuration)
	case c.LeaseDuration > MaxLeaseDuration:
		// A misuse probe's math.MaxInt64: a crashed worker's rows were
		// never reaped, and MaintenanceTimeout (its default the lease)
		// bounded nothing.
		return errorf(ErrInvalidConfig, "LeaseDuration %s above %s: a crashed worker's steps would wait that long to run again (heartbeats keep a long step's lease: the lease need not outlast the step)", c.LeaseDuration, MaxLeaseDuration)
	case c.MaxStateBytes < 0 || c.MaxSignalBytes < 0 || c.PartitionRetryDelay < 0:
		return errorf(ErrInvalidConfig, "negative MaxStateBytes, MaxSignalBytes or PartitionRetryDelay")
	case c.MaxStateBytes > maxJSONBBytes || c.MaxSignalBytes > maxJSONBBytes:
		return errorf(ErrInvalidConfig, "MaxStateBytes %d or MaxSignalBytes %d above %d bytes, the most a PostgreSQL jsonb holds", c.MaxStateBytes, c.MaxSignalBytes, maxJSONBBytes)
	case c.CommitConcurrency > MaxCommitConcurrency:
		return errorf(ErrInvalidConfig, "CommitConcurrency %d above %d: each outcome statement in flight needs a connection of its own", c.CommitConcurrency, MaxCommitConcurrency)
	}
	for i, h := range c.Hooks {
		if f, ok := h.(HookFunc); h == nil || ok && f == nil || nilPointer(h) {
			return errorf(ErrInvalidConfig, "Hooks[%d] is nil", i)
		}
	}
	if err := belowFloor("", time.Millisecond, map[string]time.Duration{
		"HeartbeatInterval": heartbeatSet, "ReaperInterval": c.ReaperInterval,
		"AwaitTimeoutInterval": c.AwaitTimeoutInterval, "PruneInterval": c.PruneInterval,
		"UnknownVersionDelay": c.UnknownVersionDelay, "TxIdleTimeout": c.TxIdleTimeout,
		"DrainTimeout": c.DrainTimeout,
	}); err != nil {
		return err
	}
	if err := belowFloor("", time.Second, map[string]time.Duration{"Retention": c.Retention}); err != nil {
		return err
	}
	var err error
	if c.KeyPolicies, err = validKeyPolicies(c.KeyPolicies); err != nil {
		return err
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
		if p := nameProblem(name); p != "" {
			return errorf(ErrInvalidConfig, "queue name %s %s", quoted(name), p)
		}
		if err := qc.withDefaults(name); err != nil {
			return err
		}
		queues[name] = qc
	}
	c.Queues = queues
	return nil
}

// belowFloor refuses a positive duration under floor, naming the first
// such field in name order: a Duration of 30 is 30 ns, its unit forgotten,
// and an interval that short runs its sweep back to back, a Retention that
// short deletes every finished instance at once.
// The message starts with where (`queue "q": `), if any.
func belowFloor(where string, floor time.Duration, fields map[string]time.Duration) error {
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if d := fields[name]; d > 0 && d < floor {
			return errorf(ErrInvalidConfig, "%s%s %s is below %s (a time.Duration counts nanoseconds: write 30 * time.Second, not 30)", where, name, d, floor)
		}
	}
	return nil
}

// prefetch is the rows claimed beyond the running slots: Prefetch once
// defaulted, none as 0.
func (qc *QueueConfig) prefetch() int { return max(qc.Prefetch, 0) }

func (qc *QueueConfig) withDefaults(name string) error {
	setDefault(&qc.Concurrency, DefaultConcurrency)
	// None is kept as -1, not 0: a configuration derived from
	// Engine.Config must not come back with the default.
	switch {
	case qc.Prefetch == 0 && qc.GlobalConcurrency > 0:
		qc.Prefetch = -1 // a buffered claim takes a place of the bound (see Prefetch)
	case qc.Prefetch == 0:
		qc.Prefetch = qc.Concurrency
	case qc.Prefetch < 0:
		qc.Prefetch = -1
	}
	setDefault(&qc.MinDemand, 1)
	switch {
	case qc.ChainSteps == 0:
		qc.ChainSteps = DefaultChainSteps
	case qc.ChainSteps < 0:
		qc.ChainSteps = -1
	}
	// The intervals set, before the unset ones default from them: a
	// PollInterval of 999µs alone was refused as "BusyPollInterval 999µs",
	// a field the caller never set (a promise probe).
	if err := belowFloor(fmt.Sprintf("queue %q: ", name), time.Millisecond, map[string]time.Duration{
		"BusyPollInterval": qc.BusyPollInterval, "PollInterval": qc.PollInterval, "MaxPollInterval": qc.MaxPollInterval,
	}); err != nil {
		return err
	}
	// An unset interval defaults within the ones set: MaxPollInterval 200ms
	// alone polls every 200ms at most, not a refusal of the default 1s.
	if qc.MaxPollInterval > 0 {
		setDefault(&qc.PollInterval, min(DefaultPollInterval, qc.MaxPollInterval))
	}
	setDefault(&qc.PollInterval, DefaultPollInterval)
	setDefault(&qc.MaxPollInterval, max(DefaultMaxPollInterval, qc.PollInterval))
	setDefault(&qc.BusyPollInterval, min(DefaultBusyPollInterval, qc.PollInterval))
	switch {
	case qc.Concurrency < 0 || qc.GlobalConcurrency < 0:
		return errorf(ErrInvalidConfig, "queue %q: negative Concurrency or GlobalConcurrency", name)
	case qc.GlobalConcurrency > math.MaxInt32:
		// The pick takes it as an int4: a larger one failed every pick.
		return errorf(ErrInvalidConfig, "queue %q: GlobalConcurrency %d above %d", name, qc.GlobalConcurrency, math.MaxInt32)
	case qc.Concurrency > maxConcurrency:
		// A worker goroutine per place, started with the feeder: at 1<<20
		// an idle engine held that many goroutines' stacks.
		return errorf(ErrInvalidConfig, "queue %q: Concurrency %d above %d", name, qc.Concurrency, maxConcurrency)
	case qc.Concurrency > maxQueueWindow || qc.prefetch() > maxQueueWindow || qc.Concurrency+qc.prefetch() > maxQueueWindow:
		// A pick's batch (and 4 × it, its bound of keys) is an int4.
		return errorf(ErrInvalidConfig, "queue %q: Concurrency + Prefetch (%d + %d) above %d", name, qc.Concurrency, qc.prefetch(), maxQueueWindow)
	case qc.MinDemand < 0 || qc.MinDemand > qc.Concurrency+qc.prefetch():
		return errorf(ErrInvalidConfig, "queue %q: MinDemand %d outside 1..Concurrency+Prefetch (%d)", name, qc.MinDemand, qc.Concurrency+qc.prefetch())
	case qc.BusyPollInterval < 0 || qc.PollInterval < qc.BusyPollInterval || qc.MaxPollInterval < qc.PollInterval:
		return errorf(ErrInvalidConfig, "queue %q: need 0 < BusyPollInterval <= PollInterval <= MaxPollInterval (%s, %s, %s, unset ones at their defaults)",
			name, qc.BusyPollInterval, qc.PollInterval, qc.MaxPollInterval)
	}
	if err := belowFloor(fmt.Sprintf("queue %q: ", name), time.Millisecond, map[string]time.Duration{
		"BusyPollInterval": qc.BusyPollInterval, "PollInterval": qc.PollInterval, "MaxPollInterval": qc.MaxPollInterval,
	}); err != nil {
		return err
	}
	return nil
}

// Config returns a copy of the engine's configuration with defaults filled
// in. Its map and slices are copies too: changing them (to derive another
// engine's configuration) changes nothing in this engine. The defaults
// derived from LeaseDuration (HeartbeatInterval, TxIdleTimeout,
// MaintenanceTimeout) are filled in too: a derived configuration with
// another LeaseDuration keeps them unless they are set to zero again.
func (e *Engine) Config() Config {
	if e == nil {
		return Config{}
	}
	return e.cfg.clone()
}

// clone is c with its map and slices copied, so that neither the caller's
// Config given to New nor the copy Engine.Config returns shares them with
// the engine's own.
func (c Config) clone() Config {
	c.Machines = slices.Clone(c.Machines)
	c.Queues = maps.Clone(c.Queues)
	c.Periodic = slices.Clone(c.Periodic)
	c.KeyPolicies = slices.Clone(c.KeyPolicies)
	c.Hooks = slices.Clone(c.Hooks)
	return c
}

// Start checks that the schema is migrated (else [ErrSchemaVersion]), that
// no table inherits from gendurable's (else migrate.ErrDependents: the
// engine's statements would take in that table's rows) and,
// for an engine with queues, that the pool's transactions default to read
// committed, the isolation level the pick needs (else [ErrInvalidConfig]),
// then starts the maintenance services (reaper, await-timeout sweep,
// pruner, periodic schedules, in that order) and the feeders of the
// configured queues in background goroutines. ctx bounds the start-up checks only; the engine runs until
// [Engine.Stop]. Called while a Stop (or another Start) is in progress,
// Start first waits for it to return (or for ctx). No lock is held across
// the checks' round trips: an Insert, a Signal or a Stop called meanwhile
// does not wait for them (a network cut off would hold it until ctx ends);
// a Stop called meanwhile ends them, and Start returns an error wrapping
// [ErrEngineStopped] (TestStopDuringAStartCutOff). So does a Stop called
// while this Start waited for another Start or Stop: once Stop returned, no
// Start begun before it starts the engine
// (TestAStopEndsAStartWaitingItsTurn). A database that cannot be reached
// for the checks (down, restarting, out of connections) fails Start with
// the driver's error (a *pgconn.ConnectError or a *pgconn.PgError of class
// 08 or 57P03, …); Start does not retry: call it again (the engine is left
// stopped), or let your supervisor restart the process. Once started, the
// engine rides out outages on its own.
func (e *Engine) Start(ctx context.Context) error {
	if err := e.made(); err != nil {
		return err
	}
	if ctx == nil {
		// Refused before any state is touched: it panicked inside
		// context.WithCancelCause with e.mu held, and every later Start
		// and Stop waited for ever (a library-misuse probe).
		return errorf(ErrInvalidInput, "start: nil context")
	}
	e.mu.Lock()
	stops := e.stops
	for e.stopping != nil || e.starting != nil {
		// A Stop is in progress (its steps still drain), or another Start:
		// go on once it returned.
		var wait <-chan struct{}
		what := "the Stop in progress"
		if st := e.stopping; st != nil {
			wait = st.stopped
		} else {
			wait, what = e.starting.done, "the Start in progress"
		}
		stopping := e.stopping != nil
		e.mu.Unlock()
		if stopping && e.insideEngine(ctx) {
			return errors.New("gendurable: start: a Stop is in progress, and this call comes from a step or a hook it may be waiting for")
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("gendurable: start: waiting for %s: %w", what, ctx.Err())
		}
		e.mu.Lock()
	}
	if e.stops != stops {
		// A Stop came after this Start and while it waited: the caller
		// that stopped the engine (before closing its pool, say) must not
		// find it running once Stop returned.
		e.mu.Unlock()
		return errStoppedWhileStarting
	}
	if e.running != nil {
		e.mu.Unlock()
		return ErrAlreadyStarted
	}
	// The checks below wait on the database: e.mu is let go meanwhile
	// (TestInsertDuringAStartCutOff), and a Stop ends them (Stop).
	ctx, cancel := context.WithCancelCause(ctx)
	st := &startState{cancel: cancel, done: make(chan struct{})}
	e.starting = st
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.starting = nil
		e.mu.Unlock()
		cancel(nil)
		close(st.done)
	}()
	if err := e.startChecks(ctx); err != nil {
		if c := context.Cause(ctx); errors.Is(c, errStoppedWhileStarting) {
			return c
		}
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := context.Cause(ctx); errors.Is(c, errStoppedWhileStarting) {
		return c
	}
	e.commits.Resume() // a Stop out of time may have aborted it
	rs := &runState{scheds: map[string]*feeder.Feeder{}, stopped: make(chan struct{}), closedPoolAtStart: e.closedPool.Load()}
	// The maintenance services start first and stop last, after the
	// feeders have drained. They run until Stop, not under ctx, which
	// bounds start-up only.
	services, sweeper := e.maintenanceServices()
	if err := maintenance.StartAll(context.Background(), services); err != nil {
		return fmt.Errorf("gendurable: start: %w", err)
	}
	rs.services = services
	pickCtx, pickCancel := context.WithCancel(context.Background())
	// Steps' contexts say they are the engine's own (insideEngine): a Stop
	// called from a step while another Stop runs must not wait for it.
	workCtx, workCancel := context.WithCancelCause(e.ownCtx)
	beatCtx, beatCancel := context.WithCancel(context.Background())
	rs.pickCancel, rs.workCancel, rs.beatCancel = pickCancel, workCancel, beatCancel

	keyPolicies := pickPolicies(e.cfg.KeyPolicies)
	for name, qc := range e.cfg.Queues {
		ev := &schedEvents{e: e}
		s := feeder.New(feeder.Config{
			Queue: name, Concurrency: qc.Concurrency, Prefetch: qc.prefetch(), MinDemand: qc.MinDemand,
			BusyPollInterval: qc.BusyPollInterval, PollInterval: qc.PollInterval, MaxPollInterval: qc.MaxPollInterval,
			Lease: e.cfg.LeaseDuration, HeartbeatInterval: e.cfg.HeartbeatInterval, KeyPolicies: keyPolicies,
			Global: qc.GlobalConcurrency, FloorCheck: feeder.DefaultFloorCheck, KeyRate: e.keyRate,
		}, e.q, e.pool, e.exec.ForQueue(name, max(qc.ChainSteps, 0), qc.GlobalConcurrency == 0), ev, e.log)
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
		e.log.Warn("gendurable: total queue concurrency reaches the pool size; steps with WithTx outcomes hold a connection for their transaction, and picks, heartbeats and outcomes need one too",
			"concurrency", conc, "pool_max_conns", poolMax)
	}
	if len(e.cfg.Queues) > 0 {
		// A definition whose default queue no queue of this engine is: its
		// instances wait for another process that works that queue, and
		// with none they wait for good, saying nothing (a probe: a
		// newcomer's Job{Queue: "emails"} beside Queues{"default"}).
		var unworked []string
		for k, core := range e.registry {
			if _, ok := e.cfg.Queues[core.queue]; !ok {
				unworked = append(unworked, fmt.Sprintf("%s (queue %q)", k.name, core.queue))
			}
		}
		if len(unworked) > 0 {
			slices.Sort(unworked)
			unworked = slices.Compact(unworked)
			e.log.Info("gendurable: machines whose default queue this engine does not work; their instances run only where an engine works that queue (Config.Queues)",
				"machines", unworked)
		}
	}
	e.running = rs
	e.scheds = rs.scheds
	e.sweeper = sweeper
	e.log.Info("gendurable: engine started", "schema", e.cfg.Schema, "queues", len(e.cfg.Queues))
	return nil
}

// startError is Start's error for a check that failed doing what; one a
// connection pooler caused says what to change (sqlq.PoolerAdvice).
func startError(what string, err error) error {
	if advice := sqlq.PoolerAdvice(err); advice != "" {
		what += " (" + advice + ")"
	}
	return fmt.Errorf("gendurable: start: %s: %w", what, err)
}

// startChecks are Start's round trips to the database, under ctx: the
// schema's version, the pool's isolation level, the stored definitions.
func (e *Engine) startChecks(ctx context.Context) error {
	v, err := sqlq.InstalledVersion(ctx, e.pool, e.cfg.Schema)
	if err != nil {
		return startError("reading schema version", err)
	}
	if want := sqlq.LatestVersion(); v != want {
		return &schemaVersionError{what: "start", schema: e.cfg.Schema, have: v, want: want}
	}
	if len(e.cfg.Queues) > 0 {
		// The pick refuses any other level: a pool whose transactions
		// default to repeatable read or serializable would start, log a
		// failed pick every poll and never run a step.
		level, err := sqlq.DefaultIsolation(ctx, e.pool)
		if err != nil {
			return startError("reading the transaction isolation level", err)
		}
		if level != "read committed" {
			return errorf(ErrInvalidConfig, "the pool's transactions run at %s, the pick needs read committed "+
				"(set default_transaction_isolation to 'read committed' for the pool's connections, role or database)", level)
		}
	}
	if err := e.storeDefinitions(ctx); err != nil {
		return startError("storing machine definitions", err)
	}
	return nil
}

// stopGrace is how long past its context's end Stop still waits for a
// feeder's pick in flight, or the release of its prefetched rows, before it
// abandons them, and for cancelled steps to return.
const stopGrace = 500 * time.Millisecond

// stopFromInsideGrace is what a Stop called from a step or a hook is
// allowed beyond DrainTimeout (see Stop).
const stopFromInsideGrace = 5 * time.Second

// commitSettle is how long Stop, once out of time, waits for the outcomes
// it abandoned (Committer.Abort) to be settled: their statements end at
// once.
const commitSettle = 100 * time.Millisecond

// afterGrace returns a context that ends grace after ctx ends (with ctx's
// values). The returned func releases it.
func afterGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	late, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// A timer left running by the release only cancels late once more.
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return late, func() { stop(); cancel() }
}

// Stop shuts the engine down gracefully (give ctx a deadline: with none,
// a step that ignores its cancel holds Stop for as long as it runs): it
// stops picking, hands prefetched
// rows straight back to runnable, waits up to DrainTimeout for in-flight
// steps to commit their outcomes, then cancels their contexts (cause
// ErrEngineStopped) and waits for them to return. Steps still running 500
// ms after ctx is done (a step that ignores its cancel) are abandoned to
// the reaper and Stop returns an error wrapping ctx's; steps that return
// on their cancel within those 500 ms are not reported, also when ctx was
// done when Stop was called. Outcomes still waiting on the database then
// (a network cut off: they would be retried for up to a lease) are given
// up too, within 100 ms more, and so is the outcome of any step that
// returns later, until the next Start: their rows keep their leases and
// are reaped, and Stop's error says so (TestStopWithAnOutcomeCutOff).
// An outcome waiting on a row lock another transaction holds (a caller's
// open SignalTx on a child's parent: docs/design.md §4) is waited for until
// it has waited a lease, then given up (its row is reaped after its lease;
// Stop's error counts it), also when ctx has no deadline
// (TestStopIsNotHeldUpByAParkedOutcome).
// Steps already abandoned for ignoring their context past StepTimeout
// (the engine sent their outcomes) are not waited for; if any still run,
// Stop says so with an error wrapping [ErrStepTimeout].
// Stop's error also says when prefetched rows could not be handed back
// (they are reaped after their lease), when outcomes of its drain were not
// written or not confirmed by the database, and when outcomes were refused
// because the pool was closed while the engine ran (wrapping
// puddle.ErrClosedPool: close the pool after Stop returns; a closed pool
// that cost no outcome is not noticed), with how many outcomes that cost.
// Each was logged when it happened, and its step runs again once its lease
// expires (TestStopAfterThePoolWasClosedSaysSo).
// The maintenance services stop last, in the reverse of their start order:
// a statement they have in flight is cancelled, and the last merge of
// observed transitions (graph.go) runs for at most 5 s and not past ctx —
// so maintenance never holds a Stop past ctx's deadline
// (TestStopWithMaintenanceCutOff). A pick in flight is let finish (its
// answer may hold claims) unless it is still waiting 500 ms after ctx
// ended: then it is abandoned, and rows it claimed are reaped after their
// lease, as a crashed worker's are (TestStopWithAPickCutOff) — so a Stop
// whose network is cut off returns within 500 ms of ctx's deadline, plus
// the time of the hooks it calls (each queue's DrainEvent): a hook that
// blocks, which Hooks must not, holds Stop as long. Stop
// on an engine that is not running returns nil; on one whose Start is in
// progress, it ends that start (Start returns an error wrapping
// ErrEngineStopped) and returns nil once Start has returned, or an error
// wrapping ctx's if ctx ends first. A Stop called while
// another is in progress waits for that one and returns its result (or,
// if its own ctx ends first, an error wrapping ctx's) — unless it is called
// from a step or a hook with the context the engine gave it: then it
// returns nil at once, since the Stop in progress may be waiting for that
// step or hook. Called so on a running engine with no Stop in progress, it
// takes the run at once and stops it on a goroutine of its own (allowed
// DrainTimeout and 5 s; an error it ends with is logged), returning nil at
// once: the calling step returns and its outcome is written as the Stop
// drains (TestStopFromAStepStopsTheEngineAndKeepsItsOutcome). A Start
// called meanwhile waits for the Stop, then starts.
func (e *Engine) Stop(ctx context.Context) error {
	if err := e.made(); err != nil {
		return err
	}
	if ctx == nil {
		// Refused before any state is touched: it panicked after marking
		// the engine stopping, and a later Stop waited for ever.
		return errorf(ErrInvalidInput, "stop: nil context")
	}
	e.mu.Lock()
	e.stops++
	rs := e.running
	if rs == nil && e.starting != nil {
		// A Start in progress, waiting on the database: end it. The
		// engine is then not running (Start returns an error wrapping
		// ErrEngineStopped).
		st := e.starting
		e.mu.Unlock()
		st.cancel(errStoppedWhileStarting)
		select {
		case <-st.done:
		case <-ctx.Done():
			return fmt.Errorf("gendurable: stop: waiting for the Start in progress to end: %w", ctx.Err())
		}
		e.mu.Lock()
		rs = e.running
	}
	if rs == nil {
		st := e.stopping
		e.mu.Unlock()
		if st == nil || e.insideEngine(ctx) {
			// Not running; or called from a step or a hook (with the
			// context it was given), which the Stop in progress may be
			// waiting for: waiting here would wait for ever.
			return nil
		}
		select {
		case <-st.stopped:
			return st.stopErr
		case <-ctx.Done():
			return fmt.Errorf("gendurable: stop: waiting for the Stop in progress: %w", ctx.Err())
		}
	}
	e.running, e.scheds, e.sweeper = nil, nil, nil
	e.stopping = rs
	e.mu.Unlock()
	if e.insideEngine(ctx) {
		// Called from a step or a hook with the context the engine gave
		// it: this Stop waits for that step (or for the step whose event
		// the hook reports) to return, so it cannot wait on this
		// goroutine. The run is this Stop's already (a Start meanwhile
		// waits for it; a later run is never stopped by it); it goes on
		// on a goroutine of its own, with a context of its own (one that
		// inherited the caller's mark would be inside the engine too),
		// allowed DrainTimeout and 5 s, and this call returns at once.
		// The step's outcome is written as usual while the Stop drains.
		go func() {
			// Saturated: a DrainTimeout near a Duration's range ("as long
			// as steps need") wrapped the sum negative, and the Stop
			// cancelled every step at once (a misuse probe).
			sctx, cancel := context.WithTimeout(context.Background(), min(e.cfg.DrainTimeout, math.MaxInt64-stopFromInsideGrace)+stopFromInsideGrace)
			defer cancel()
			e.stopRun(sctx, rs, func(err error) {
				e.log.Error("gendurable: stop called from a step or a hook", "err", err)
			})
		}()
		return nil
	}
	return e.stopRun(ctx, rs, nil)
}

// stopRun stops rs, a run Stop has taken (e.stopping), and reports what it
// returns to report too (if set), before a Stop waiting for it can return.
func (e *Engine) stopRun(ctx context.Context, rs *runState, report func(error)) error {
	var err error
	defer func() {
		rs.stopErr = err
		if err != nil && report != nil {
			report(err)
		}
		e.mu.Lock()
		e.stopping = nil
		e.mu.Unlock()
		close(rs.stopped)
	}()
	start := time.Now()
	unconfirmedBefore := e.unconfirmed.Load()
	// late ends stopGrace after ctx: what Stop still waits for past ctx's
	// end (the release of prefetched rows, steps returning on cancel).
	late, lateDone := afterGrace(ctx, stopGrace)
	defer lateDone()
	rs.pickCancel()
	// An outcome parked on a row lock another transaction holds (a caller's
	// open SignalTx) is given up once it has waited a lease, so the drain
	// below is not held up by it for longer (docs/design.md §4).
	e.commits.Drain()
	// The feeders stop picking and release their buffers. A pick in flight
	// is let finish (its answer may hold claims), unless ctx ends first and
	// stopGrace passes — the network cut off, the server stuck: then it is
	// abandoned, and the rows it claimed or could not release are reaped
	// after their lease. (The grace lets a Stop called with a context that
	// is already done still hand its prefetched rows back on a database that
	// answers in milliseconds.)
	var abandonedPick error
	loopsDone := make(chan struct{})
	go func() { rs.loops.Wait(); close(loopsDone) }()
	select {
	case <-loopsDone:
	case <-late.Done():
		for _, s := range rs.scheds {
			s.Abort()
		}
		<-loopsDone
		abandonedPick = fmt.Errorf("gendurable: stop: a pick or a release of prefetched rows still waiting on the database was abandoned (its rows are reaped after their lease): %w", ctx.Err())
	}

	drainCtx, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	completed := true
	for _, s := range rs.scheds {
		if !s.Wait(drainCtx) {
			completed = false
		}
	}
	cancel()
	rs.workCancel(ErrEngineStopped)
	abandoned := 0
	left := false
	for _, s := range rs.scheds {
		// Steps that honour their context return within the grace, also when
		// ctx is done already: only those that do not are reported.
		if !s.Wait(late) {
			left = true
		}
		abandoned += s.Abandoned()
	}
	if left {
		// Some have not settled. Those whose outcome is still waiting on
		// the database (a network cut off; the committer retries for up to
		// a lease) are abandoned now, their rows reaped after their lease,
		// rather than written after Stop returned
		// (TestStopWithAnOutcomeCutOff); what is left then is steps that
		// ignore their cancellation.
		e.commits.Abort()
		settle, cancel := context.WithTimeout(context.Background(), commitSettle)
		for _, s := range rs.scheds {
			if !s.Wait(settle) {
				err = fmt.Errorf("gendurable: stop: steps ignoring cancellation are still running: %w", ctx.Err())
			}
		}
		cancel()
		if err == nil {
			err = fmt.Errorf("gendurable: stop: outcomes still waiting on the database were abandoned (their rows are reaped after their lease): %w", ctx.Err())
		}
	}
	err = errors.Join(abandonedPick, err)
	if abandoned > 0 {
		err = errors.Join(err, fmt.Errorf("gendurable: stop: %d steps abandoned for ignoring their context past StepTimeout are still running (the engine sent their outcomes; the log says if one was not written): %w",
			abandoned, ErrStepTimeout))
	}
	for name, s := range rs.scheds {
		if n, rerr := s.ReleaseFailed(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("gendurable: stop: queue %q: handing back %d prefetched rows failed (they are reaped after their lease): %w", name, n, rerr))
		}
	}
	if n := e.closedPool.Load() - rs.closedPoolAtStart; n > 0 {
		err = errors.Join(err, fmt.Errorf("gendurable: stop: the pool was closed while the engine ran: %d outcomes could not be written, and their steps run again once their leases expire (close the pool only after Stop returns): %w",
			n, puddle.ErrClosedPool))
	} else if n := e.unconfirmed.Load() - unconfirmedBefore; n > 0 {
		err = errors.Join(err, fmt.Errorf("gendurable: stop: %d outcomes were not written while the engine stopped, or not confirmed (refused by the database, given up on a row another transaction held locked, or unanswered — those may have been written; see the log); a step whose outcome was not written runs again once its lease expires", n))
	}
	for name, s := range rs.scheds {
		if len(e.cfg.Hooks) > 0 {
			// The feeder's last load: its buffer handed back, what still runs
			// (steps ignoring their cancellation). Without it the last
			// SaturationEvent was a pick's from before the Stop, and a gauge
			// fed from it (gdotel's in_flight and buffered) went on reporting
			// steps running and rows buffered in a stopped engine.
			qc := e.cfg.Queues[name]
			e.emit(e.ownCall(ctx), &SaturationEvent{Queue: name, InFlight: s.InFlight(), Buffered: 0,
				Concurrency: qc.Concurrency, Prefetch: qc.prefetch()})
		}
		e.emit(e.ownCall(ctx), &DrainEvent{Queue: name, Released: rs.scheds[name].ReleasedOnStop(), Completed: completed, Duration: time.Since(start)})
	}
	rs.beatCancel()
	maintenance.StopAll(ctx, rs.services) // in reverse start order, each waited for; a final flush ends with ctx
	rs.heartbeats.Wait()
	if err != nil {
		e.log.Warn("gendurable: engine stopped", "drained", completed, "took", time.Since(start), "err", err)
	} else {
		e.log.Info("gendurable: engine stopped", "drained", completed, "took", time.Since(start))
	}
	return err
}

// oversizedLookahead is how many rows at the head of a queue
// failOversized looks at.
const oversizedLookahead = 1000

// failOversized backs off, per queue, while it keeps finding nothing to
// fail (or failing itself): from oversizedBackoffMin, doubling, up to
// oversizedBackoffMax.
const (
	oversizedBackoffMin = time.Second
	oversizedBackoffMax = time.Minute
)

// failOversized runs after a pick of queue failed on a PostgreSQL limit
// (SQLSTATE 54000): a row whose unconsumed signals or children (with their
// results) the pick cannot build into one jsonb value makes every pick that
// reaches it fail, and would stay runnable for good. It fails every such row
// at the head of the queue, in one statement (a cancel, each with its sizes
// in its reason), so the picks go on and an operator sees why. It runs on the
// feeder's goroutine, under MaintenanceTimeout: the failed pick took its time
// already. When it found nothing to fail, or failed itself, the picks that
// fail again do not run it again at once: it waits oversizedBackoffMin, then
// twice as long each time, up to oversizedBackoffMax (the look reads the
// sizes of up to oversizedLookahead rows' children and signals); once it
// failed some row, the next pick failure runs it at once.
func (e *Engine) failOversized(queue string) {
	if !e.oversized.due(queue, time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MaintenanceTimeout)
	defer cancel()
	e.oversized.done(queue, e.failOversized1(ctx, queue), time.Now())
}

// failOversized1 is one look of failOversized; it reports whether it failed
// a row too large to claim.
func (e *Engine) failOversized1(ctx context.Context, queue string) bool {
	rows, err := e.q.OversizedClaims(ctx, e.pool, queue, oversizedLookahead, e.oversized.limitBytes())
	if err != nil {
		e.log.Warn("gendurable: looking for instances too large to claim failed", "queue", queue, "err", err)
		return false
	}
	if len(rows) == 0 {
		e.log.Warn("gendurable: a pick failed on a PostgreSQL limit, and no instance at the head of the queue is too large to claim",
			"queue", queue, "looked_at", oversizedLookahead)
		return false
	}
	// In id order, as every bulk cancel locks its rows (sqlq.CancelManyEach).
	slices.SortFunc(rows, func(a, b sqlq.Oversized) int { return cmp.Compare(a.ID, b.ID) })
	ids, reasons := make([]int64, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
		reasons[i] = truncate(fmt.Sprintf("too large to claim: its latest fan-out's children and results come to %d bytes and its unconsumed signals to %d; "+
			"a claim carries each as one jsonb value, which PostgreSQL caps at 256 MB", r.KidBytes, r.InboxBytes))
	}
	changed, err := e.q.CancelManyEach(ctx, e.pool, ids, reasons)
	if err != nil {
		e.log.Warn("gendurable: failing instances too large to claim failed", "queue", queue, "ids", ids, "err", err)
		return false
	}
	byID := make(map[int64]sqlq.Oversized, len(rows))
	for _, r := range rows {
		byID[r.ID] = r
	}
	for _, c := range changed {
		r := byID[c.ID]
		e.log.Error("gendurable: failed an instance too large to claim", "queue", queue, "id", r.ID,
			"children_bytes", r.KidBytes, "inbox_bytes", r.InboxBytes)
	}
	return len(changed) > 0 // the backoff resets only when a row was failed
}

// oversizedGuard is failOversized's backoff, per queue. Its zero value is
// ready to use.
type oversizedGuard struct {
	mu    sync.Mutex
	next  map[string]time.Time // no look before this
	fails map[string]int       // looks in a row that failed nothing
	limit int64                // the size reported as too large; 0: sqlq.MaxClaimBytes (tests lower it)
}

// due reports whether failOversized may look at queue at now.
func (g *oversizedGuard) due(queue string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !now.Before(g.next[queue])
}

// done records a look at queue that ended at now, and whether it failed
// rows (progress): without, the next look waits.
func (g *oversizedGuard) done(queue string, progress bool, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if progress {
		delete(g.next, queue)
		delete(g.fails, queue)
		return
	}
	if g.next == nil {
		g.next, g.fails = map[string]time.Time{}, map[string]int{}
	}
	g.fails[queue]++
	g.next[queue] = now.Add(backoff.Exp(oversizedBackoffMin, oversizedBackoffMax, g.fails[queue]))
}

func (g *oversizedGuard) limitBytes() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.limit == 0 {
		return sqlq.MaxClaimBytes
	}
	return g.limit
}

func (e *Engine) pokeTimeouts(timeout time.Duration) {
	e.mu.Lock()
	sweeper := e.sweeper
	e.mu.Unlock()
	if sweeper != nil {
		sweeper.PokeIn(timeout)
	}
}

// kickQueueAt wakes the local feeder of queue at t.
func (e *Engine) kickQueueAt(queue string, t time.Time) {
	e.mu.Lock()
	s := e.scheds[queue]
	e.mu.Unlock()
	if s != nil {
		s.KickAt(t)
	}
}

// kickAllBelow wakes every local feeder for rows eligible from t on, maybe
// below their picks' floors.
func (e *Engine) kickAllBelow(t time.Time) {
	e.mu.Lock()
	scheds := make([]*feeder.Feeder, 0, len(e.scheds))
	for _, s := range e.scheds {
		scheds = append(scheds, s)
	}
	e.mu.Unlock()
	for _, s := range scheds {
		s.KickBelow(t)
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

// Reap runs one reaper sweep now: every expired lease goes back to runnable
// with attempt + 1, or fails once its attempts are spent (a prefetched claim
// whose step never started, and a claim no heartbeat confirmed, go back
// without the attempt: see [StepError].Uncharged). It returns the
// number of rows recovered. Engines run it every ReaperInterval; it is
// exported for tools and tests. Each statement runs under
// Config.MaintenanceTimeout as well as ctx.
func (e *Engine) Reap(ctx context.Context) (int, error) {
	if err := e.usable(ctx, "Reap"); err != nil {
		return 0, err
	}
	n, err := e.reaper().RunOnce(ctx)
	if err != nil && (notMigrated(err) || schemaObjectMissing(err)) {
		// As every other call says it (ErrNotMigrated, ErrSchemaVersion,
		// what to run), not the database's "relation does not exist".
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // the sweep's own "gendurable: reap:" is dbErr's
		}
		return n, e.dbErr(ctx, err, "reap")
	}
	return n, err
}

func (e *Engine) emit(ctx context.Context, ev Event) {
	for _, h := range e.cfg.Hooks {
		e.callHook(ctx, h, ev)
	}
}

// engineCallKey marks the contexts the engine hands to steps and hooks:
// steps' derive from workCtx, which carries it; hooks called off a step's
// path get ownCtx or a context marked by ownCall.
type engineCallKey struct{}

// ownCall marks ctx as one the engine hands to a hook (see insideEngine).
func (e *Engine) ownCall(ctx context.Context) context.Context {
	return context.WithValue(ctx, engineCallKey{}, e)
}

// insideEngine reports whether ctx is one e handed to a step or a hook:
// a call made with it runs on e's own goroutines, which a Stop in progress
// may be waiting for.
func (e *Engine) insideEngine(ctx context.Context) bool {
	v, _ := ctx.Value(engineCallKey{}).(*Engine)
	return v == e
}

// callHook shields the engine from a panicking hook: telemetry must never
// take a worker down.
func (e *Engine) callHook(ctx context.Context, h Hook, ev Event) {
	defer func() {
		if v := recover(); v != nil {
			e.log.Error("gendurable: hook panicked", "event", ev.EventName(), "panic", (&PanicError{Value: v}).Error())
		}
	}()
	h.OnEvent(ctx, ev)
}

// schedEvents adapts feeder observations to hooks and logs.
type schedEvents struct{ e *Engine }

func (s *schedEvents) Pick(r feeder.PickReport) {
	if r.Err != nil && sqlq.ProgramLimit(r.Err) {
		s.e.failOversized(r.Queue)
	}
	if len(s.e.cfg.Hooks) == 0 {
		return
	}
	ev := &PickEvent{Queue: r.Queue, Count: r.Count, Demand: r.Demand, Duration: r.Duration, Err: r.Err}
	for i := range r.KeysFull {
		if r.KeysFull[i] == 0 && (i >= len(r.KeysRated) || r.KeysRated[i] == 0) {
			continue
		}
		t := KeyThrottle{Default: i == 0, Full: int(r.KeysFull[i])}
		if i > 0 && i <= len(s.e.cfg.KeyPolicies) {
			t.Prefix = s.e.cfg.KeyPolicies[i-1].Prefix
		}
		if i < len(r.KeysRated) {
			t.RateLimited = int(r.KeysRated[i])
		}
		ev.Throttled = append(ev.Throttled, t)
	}
	s.e.emit(s.e.ownCtx, ev)
}

func (s *schedEvents) Saturation(queue string, inFlight, buffered, concurrency, prefetch int) {
	if len(s.e.cfg.Hooks) == 0 {
		return
	}
	s.e.emit(s.e.ownCtx, &SaturationEvent{Queue: queue, InFlight: inFlight, Buffered: buffered, Concurrency: concurrency, Prefetch: prefetch})
}

func (s *schedEvents) LeaseLost(queue string, id int64, started bool) {
	if started {
		s.e.log.Warn("gendurable: lease lost; cancelling the step", "queue", queue, "id", id)
	} else {
		s.e.log.Warn("gendurable: lease lost before the step started; the claim is dropped, no step ran", "queue", queue, "id", id)
	}
	s.e.emit(s.e.ownCtx, &LeaseLostEvent{Queue: queue, InstanceID: id, Unstarted: !started})
}

func (s *schedEvents) HeartbeatFailed(queue string, err error) {
	s.e.log.Warn("gendurable: heartbeat failed", append([]any{"queue", queue}, sqlq.ErrAttrs(err)...)...)
}

func (s *schedEvents) Released(queue string, count int, err error) {
	if count > 0 {
		s.e.log.Info("gendurable: released prefetched rows", "queue", queue, "count", count)
	}
}
