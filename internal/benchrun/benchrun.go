// Package benchrun is the engine of `gendurable bench`: it inserts a
// workload, works it with engines in this process (and optionally in worker
// processes), and measures throughput, latency, statements per step and the
// process's CPU and memory.
package benchrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Workloads lists the workload names.
var Workloads = []string{"job", "fsm3", "signal", "fanout", "partition", "keys"}

// Bounds of Options.Queues and Options.Engines: each queue of each engine
// is a feeder with its buffer and connections (the pool is sized by their
// product), and their names are built at once.
const (
	MaxQueues  = 1000
	MaxEngines = 100
)

// Options configure one run.
type Options struct {
	hold *scratch.Hold // the schema's use, from prepare to drop

	DatabaseURL string
	// Schema is the benchmark's own schema, default "gendurable_bench":
	// created and marked by it, dropped at the end. An existing schema it did
	// not create is refused (scratch.ErrNotScratch) unless ResetSchema.
	Schema      string
	Workload    string // one of Workloads
	N           int    // instances (fanout: parents; keys: the parallelism phase's) to insert; default 10000
	Concurrency int    // per queue per engine; default 100
	Prefetch    int    // per queue per engine; default = Concurrency
	Queues      int    // queues the instances are spread over; default 1
	Engines     int    // engines in this process; default 1
	MinDemand   int    // per queue; default: the engine's default
	Commits     int    // outcome statements in flight per engine; default: the engine's
	// StepSleep: each step of workload job sleeps this long (default 0).
	// Heartbeat is the engines' HeartbeatInterval (default the engine's,
	// 20s; workload keys keeps its own). With steps long enough for claims
	// to wait in the buffer across heartbeats, they measure what clearing
	// the claims' not-started marks costs (docs/design.md §4, "Prefetched
	// claims").
	StepSleep time.Duration
	Heartbeat time.Duration
	MaxConns  int // the run's pool size; default min(90, Engines × (Queues × 4 + 8) + 4)
	Progress  io.Writer
	// Keys, KeySleep, FairBacklog, FairRows and FairRounds shape workload
	// keys (see KeysReport): Keys partition keys of limit 4 (default 8),
	// each step sleeping KeySleep (default 5ms); tenant A's backlog
	// (default 100,000 rows); tenant B's rows per round (default 100) and
	// rounds per fairness phase (default 5).
	Keys        int
	KeySleep    time.Duration
	FairBacklog int
	FairRows    int
	FairRounds  int
	// KeyRate and RateWindow shape its rate phase: a key rated KeyRate
	// starts per second (default 50) measured over RateWindow (default 30s).
	KeyRate    int
	RateWindow time.Duration
	// FreshStats skips wearing the table's statistics: by default the run
	// starts from an empty table whose planner statistics say almost every
	// row is done, as on an installation in use (sqlq.WearStatistics).
	FreshStats bool

	// ResetSchema drops an existing Schema that bench did not create, and
	// everything in it; Confirm, if set, is asked first.
	ResetSchema bool
	Confirm     func(question string) (bool, error)
	// AuditLogger, if set, gets a line when ResetSchema drops a schema.
	AuditLogger *slog.Logger
}

// Report is what one run measured.
type Report struct {
	Workload          string  `json:"workload"`
	Instances         int     `json:"instances"`
	Steps             int64   `json:"steps"`
	Concurrency       int     `json:"concurrency"`
	Queues            int     `json:"queues"`
	Engines           int     `json:"engines"`
	InsertsPerSec     float64 `json:"inserts_per_sec"`
	StepsPerSec       float64 `json:"steps_per_sec"`
	InstancesPerSec   float64 `json:"instances_per_sec"`
	StatementsPerStep float64 `json:"statements_per_step"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	WorkSeconds       float64 `json:"work_seconds"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	MaxRSSMB          float64 `json:"max_rss_mb"`
	// Statements breaks the work phase's statements down by kind.
	Statements []StatementStat `json:"statements,omitempty"`
	// Keys is what workload keys measured; its other fields are those of
	// its parallelism phase.
	Keys *KeysReport `json:"keys,omitempty"`
}

// CheckStepOptions checks StepSleep and Heartbeat (the workload set
// first): the CLI calls it before anything else runs, Run again.
func (o *Options) CheckStepOptions() error {
	if o.StepSleep < 0 || o.Heartbeat < 0 {
		return errors.New("bench: --step-sleep and --heartbeat must not be negative")
	}
	if o.StepSleep > 0 && o.Workload != "job" {
		return errors.New("bench: --step-sleep is for workload job")
	}
	return nil
}

func (o *Options) defaults() error {
	if o.Schema == "" {
		o.Schema = "gendurable_bench"
	}
	if o.Workload == "" {
		o.Workload = "job"
	}
	if !contains(Workloads, o.Workload) {
		return fmt.Errorf("unknown workload %q (want one of %s)", o.Workload, strings.Join(Workloads, ", "))
	}
	if o.N <= 0 {
		o.N = 10000
	}
	if err := o.CheckStepOptions(); err != nil {
		return err
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 100
	}
	if o.Prefetch == 0 {
		o.Prefetch = o.Concurrency
	}
	if o.Queues <= 0 {
		o.Queues = 1
	}
	if o.Engines <= 0 {
		o.Engines = 1
	}
	if o.Queues > MaxQueues || o.Engines > MaxEngines {
		return fmt.Errorf("bench: at most %d queues and %d engines", MaxQueues, MaxEngines)
	}
	if o.MaxConns <= 0 {
		o.MaxConns = min(90, o.Engines*(o.Queues*4+8)+4)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Workload == "keys" {
		if o.Queues != 1 || o.Engines != 1 {
			return errors.New("workload keys runs one engine on one queue")
		}
		if o.Keys <= 0 {
			o.Keys = 8
		}
		if o.KeySleep <= 0 {
			o.KeySleep = 5 * time.Millisecond
		}
		if o.FairBacklog <= 0 {
			o.FairBacklog = 100_000
		}
		if o.FairRows <= 0 {
			o.FairRows = 100
		}
		if o.FairRounds <= 0 {
			o.FairRounds = 5
		}
		if o.KeyRate <= 0 {
			o.KeyRate = 50
		}
		if o.RateWindow <= 0 {
			o.RateWindow = 30 * time.Second
		}
	}
	return nil
}

// The machines a bench workload runs or seeds rows of: a bench schema
// holding instances of any other is someone else's data, never dropped
// without --reset-schema (scratch.Share).
func init() {
	scratch.Share("bench_job", "bench_fsm3", "bench_await", "bench_fanout", "bench_pickup", "bench_keys", "bench_floor", "long_horizon_job")
}

// drop drops the run's schema and lets go of its use, saying on Progress
// when it cannot: a schema left behind made every later bench refuse to
// run.
func (o *Options) drop(pool *pgxpool.Pool, schema string) {
	err := scratch.DropHeld(context.Background(), pool, schema, o.hold)
	o.hold.Release()
	o.hold = nil
	if err != nil && o.Progress != nil {
		fmt.Fprintf(o.Progress, "bench: its schema %q was not dropped: %v\n", schema, err)
	}
}

// prepare gives the run a fresh schema of its own (see Options.Schema),
// held (scratch.Use) from before its drop until drop: a demo started
// meanwhile refuses to drop it, where it had dropped the schema under a
// running bench, whose own drop then took the demo's (a hostile operator's
// probe). A bench that prepares again (a size at a time) keeps its hold.
func (o *Options) prepare(ctx context.Context, pool *pgxpool.Pool) error {
	if o.hold == nil {
		h, err := scratch.Use(ctx, pool, o.Schema)
		if err != nil {
			return err
		}
		o.hold = h
	}
	err := scratch.Prepare(ctx, pool, o.Schema, scratch.Options{Owner: "bench", Reset: o.ResetSchema, Confirm: o.Confirm,
		Logger: o.AuditLogger, Hold: o.hold})
	if err != nil {
		o.hold.Release()
		o.hold = nil
	}
	return err
}

// queueConfig is the configuration of each of the run's queues.
func (o *Options) queueConfig() gendurable.QueueConfig {
	return gendurable.QueueConfig{Concurrency: o.Concurrency, Prefetch: o.Prefetch, MinDemand: o.MinDemand,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 200 * time.Millisecond}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// counter counts statements through a pgx tracer and keeps, per statement
// kind (its first words), how many ran and how long they took end to end.
type counter struct {
	n     atomic.Int64
	mu    sync.Mutex
	kinds map[string]*StatementStat
}

// StatementStat is the time spent in one kind of statement.
type StatementStat struct {
	Kind    string  `json:"kind"`
	Count   int64   `json:"count"`
	TotalMs float64 `json:"total_ms"`
}

type traceKey struct{}

type traceStart struct {
	kind string
	at   time.Time
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return context.WithValue(ctx, traceKey{}, traceStart{kind: statementKind(d.SQL), at: time.Now()})
}

func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kinds == nil {
		c.kinds = map[string]*StatementStat{}
	}
	k := c.kinds[st.kind]
	if k == nil {
		k = &StatementStat{Kind: st.kind}
		c.kinds[st.kind] = k
	}
	k.Count++
	k.TotalMs += float64(time.Since(st.at).Microseconds()) / 1000
}

func (c *counter) reset() {
	c.n.Store(0)
	c.mu.Lock()
	c.kinds = nil
	c.mu.Unlock()
}

func (c *counter) stats() []StatementStat {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []StatementStat
	for _, k := range c.kinds {
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TotalMs > out[j].TotalMs })
	return out
}

// statementKind names a statement by its first three words (its first CTE
// or keywords). It reads no further than those: it runs for every statement
// of the run, in the measured process, and the engine's statements are
// kilobytes long (splitting the whole text cost a keyed workload, which
// sends many small outcome statements, about a tenth of its client CPU).
func statementKind(sql string) string {
	words := make([]string, 0, 3)
	for len(words) < 3 {
		sql = strings.TrimLeftFunc(sql, unicode.IsSpace)
		if sql == "" {
			break
		}
		end := strings.IndexFunc(sql, unicode.IsSpace)
		if end < 0 {
			end = len(sql)
		}
		words = append(words, sql[:end])
		sql = sql[end:]
	}
	return strings.Join(words, " ")
}

// stepCounter counts committed steps through the engine hook.
type stepCounter struct{ n atomic.Int64 }

func (s *stepCounter) OnEvent(_ context.Context, ev gendurable.Event) {
	if e, ok := ev.(*gendurable.StepEvent); ok && !e.Fenced && e.CommitErr == nil {
		s.n.Add(1)
	}
}

type args struct {
	I int `json:"i"`
}

type fsmState struct {
	N int `json:"n"`
}

// machines builds the workload's definitions (fresh values per engine).
func machines(stepSleep time.Duration) (job *gendurable.Job[args], fsm3, await, fan *gendurable.Machine[fsmState]) {
	job = &gendurable.Job[args]{Name: "bench_job", Perform: func(context.Context, *gendurable.Run[args]) error {
		if stepSleep > 0 {
			time.Sleep(stepSleep)
		}
		return nil
	}}
	next := func(step string) gendurable.StepFunc[fsmState] {
		return func(_ context.Context, r *gendurable.Run[fsmState]) (gendurable.Outcome, error) {
			return r.Next(step, fsmState{N: r.State.N + 1}), nil
		}
	}
	done := func(_ context.Context, r *gendurable.Run[fsmState]) (gendurable.Outcome, error) {
		return gendurable.Done(nil), nil
	}
	fsm3 = &gendurable.Machine[fsmState]{Name: "bench_fsm3", Start: "a",
		Steps: map[string]gendurable.StepFunc[fsmState]{"a": next("b"), "b": next("c"), "c": done}}
	await = &gendurable.Machine[fsmState]{Name: "bench_await", Start: "park",
		Steps: map[string]gendurable.StepFunc[fsmState]{
			"park": func(_ context.Context, r *gendurable.Run[fsmState]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "go"), nil
			},
			"woken": func(_ context.Context, r *gendurable.Run[fsmState]) (gendurable.Outcome, error) {
				if len(r.Awaited) == 0 {
					return gendurable.Outcome{}, errors.New("woken without the signal")
				}
				return gendurable.Done(nil), nil
			},
		}}
	fan = &gendurable.Machine[fsmState]{Name: "bench_fanout", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fsmState]{
			"spawn": func(_ context.Context, r *gendurable.Run[fsmState]) (gendurable.Outcome, error) {
				kids := make([]gendurable.InsertParams, 10)
				for i := range kids {
					kids[i] = job.New(args{I: i}).With(gendurable.InsertOpts{Queue: r.Queue})
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": done,
		}}
	return job, fsm3, await, fan
}

// stepsPer is the number of steps one inserted unit takes, and the instances it makes.
func stepsPer(workload string) (steps, instances int) {
	switch workload {
	case "fsm3":
		return 3, 1
	case "signal":
		return 2, 1
	case "fanout":
		return 12, 11
	}
	return 1, 1
}

// Run executes one benchmark run.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	stmts := &counter{}
	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(o.MaxConns)
	pcfg.ConnConfig.Tracer = stmts
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := o.prepare(ctx, pool); err != nil {
		return nil, err
	}
	defer o.drop(pool, o.Schema)
	if !o.FreshStats {
		q, err := sqlq.New(o.Schema)
		if err != nil {
			return nil, err
		}
		if err := q.WearStatistics(ctx, pool, 200_000); err != nil {
			return nil, fmt.Errorf("wear statistics: %w", err)
		}
	}

	if o.Workload == "keys" {
		return runKeys(ctx, o, pool, stmts)
	}
	queues := map[string]gendurable.QueueConfig{}
	queueNames := make([]string, o.Queues)
	for i := range queueNames {
		queueNames[i] = fmt.Sprintf("q%d", i)
		queues[queueNames[i]] = o.queueConfig()
	}
	steps := &stepCounter{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var engines []*gendurable.Engine
	var inserter *gendurable.Engine
	var job *gendurable.Job[args]
	var fsm3, await, fan *gendurable.Machine[fsmState]
	for i := 0; i < o.Engines; i++ {
		j, f3, aw, fn := machines(o.StepSleep)
		if i == 0 {
			job, fsm3, await, fan = j, f3, aw, fn
		}
		eng, err := gendurable.New(pool, &gendurable.Config{
			Schema: o.Schema, Machines: []gendurable.Definition{j, f3, aw, fn},
			Queues: queues, Hooks: []gendurable.Hook{steps}, Logger: quiet, CommitConcurrency: o.Commits,
			HeartbeatInterval: o.Heartbeat,
		})
		if err != nil {
			return nil, err
		}
		engines = append(engines, eng)
	}
	inserter = engines[0]

	// Insert the backlog first, in batches.
	const batch = 5000
	insertStart := time.Now()
	var ids []int64
	for done := 0; done < o.N; {
		n := min(batch, o.N-done)
		ps := make([]gendurable.InsertParams, n)
		for i := range ps {
			q := gendurable.InsertOpts{Queue: queueNames[(done+i)%len(queueNames)]}
			switch o.Workload {
			case "job":
				ps[i] = job.New(args{I: done + i}).With(q)
			case "partition":
				q.PartitionKey = fmt.Sprintf("key-%d", (done+i)%100)
				ps[i] = job.New(args{I: done + i}).With(q)
			case "fsm3":
				ps[i] = fsm3.New(fsmState{}).With(q)
			case "signal":
				ps[i] = await.New(fsmState{}).With(q)
			case "fanout":
				ps[i] = fan.New(fsmState{}).With(q)
			}
		}
		res, err := inserter.InsertMany(ctx, ps)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		done += n
	}
	insertDur := time.Since(insertStart)
	if _, err := pool.Exec(ctx, `ANALYZE "`+o.Schema+`".gendurable_instances`); err != nil {
		return nil, err
	}

	stepsPerUnit, instPerUnit := stepsPer(o.Workload)
	wantSteps := int64(o.N * stepsPerUnit)
	ru0 := usage()
	stmts.reset()
	workStart := time.Now()
	for _, eng := range engines {
		if err := eng.Start(ctx); err != nil {
			return nil, err
		}
	}
	var signalErr error
	var wg sync.WaitGroup
	if o.Workload == "signal" {
		// Signals race the parks: some arrive before, some after.
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < len(ids); i += 8 {
					if _, err := inserter.Signal(ctx, ids[i], "go", nil, nil); err != nil {
						signalErr = err
						return
					}
				}
			}()
		}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	lastProgress := time.Now()
	for steps.n.Load() < wantSteps {
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Since(lastProgress) > 250*time.Millisecond {
			lastProgress = time.Now()
			el := time.Since(workStart).Seconds()
			fmt.Fprintf(o.Progress, "\r%s: %d/%d steps, %.0f steps/s   ", o.Workload, steps.n.Load(), wantSteps, float64(steps.n.Load())/el)
		}
	}
	tick.Stop()
	work := time.Since(workStart)
	fmt.Fprintln(o.Progress)
	statements := stmts.n.Load()
	wg.Wait()
	if signalErr != nil {
		return nil, signalErr
	}
	ru1 := usage()
	for _, eng := range engines {
		_ = eng.Stop(ctx)
	}

	p50, p99, err := latencies(ctx, pool, o.Schema)
	if err != nil {
		return nil, err
	}
	cpu := ru1.cpu - ru0.cpu
	return &Report{
		Workload: o.Workload, Instances: o.N * instPerUnit, Steps: wantSteps,
		Concurrency: o.Concurrency, Queues: o.Queues, Engines: o.Engines,
		InsertsPerSec:     float64(o.N) / insertDur.Seconds(),
		StepsPerSec:       float64(wantSteps) / work.Seconds(),
		InstancesPerSec:   float64(o.N*instPerUnit) / work.Seconds(),
		StatementsPerStep: float64(statements) / float64(wantSteps),
		P50Ms:             p50, P99Ms: p99,
		WorkSeconds: work.Seconds(), CPUSeconds: cpu, MaxRSSMB: ru1.maxRSSMB,
		Statements: stmts.stats(),
	}, nil
}

// latencies reads insert → done latency percentiles from the database clock.
func latencies(ctx context.Context, pool *pgxpool.Pool, schema string) (p50, p99 float64, err error) {
	err = pool.QueryRow(ctx, `
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0)
		FROM (SELECT extract(epoch FROM finished_at - inserted_at) * 1000 AS ms
		      FROM "`+schema+`".gendurable_instances WHERE finished_at IS NOT NULL AND parent_id IS NULL) t`).Scan(&p50, &p99)
	return p50, p99, err
}

// Print writes a report as a table, or as one JSON object.
func Print(w io.Writer, r *Report, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	rows := [][2]string{
		{"workload", r.Workload},
		{"instances", fmt.Sprint(r.Instances)},
		{"steps", fmt.Sprint(r.Steps)},
		{"engines × queues × concurrency", fmt.Sprintf("%d × %d × %d", r.Engines, r.Queues, r.Concurrency)},
		{"inserts/s", fmt.Sprintf("%.0f", r.InsertsPerSec)},
		{"steps/s", fmt.Sprintf("%.0f", r.StepsPerSec)},
		{"instances/s", fmt.Sprintf("%.0f", r.InstancesPerSec)},
		{"statements/step", fmt.Sprintf("%.3f", r.StatementsPerStep)},
		{"latency p50 / p99 (insert → done)", fmt.Sprintf("%.1f ms / %.1f ms", r.P50Ms, r.P99Ms)},
		{"worker CPU", fmt.Sprintf("%.2f s over %.2f s", r.CPUSeconds, r.WorkSeconds)},
		{"max RSS", fmt.Sprintf("%.0f MB", r.MaxRSSMB)},
	}
	if k := r.Keys; k != nil {
		f := k.Fairness
		rows = append(rows, [][2]string{
			{"keys × limit, step sleep", fmt.Sprintf("%d × %d, %.1f ms", k.Keys, k.Limit, k.SleepMs)},
			{"a key's running steps max / mean", fmt.Sprintf("%d / %.2f (%d of %d keys reached the limit)", k.MaxRunning, k.MeanRunning, k.KeysAtLimit, k.Keys)},
			{"tenant B insert → start, A idle", fmt.Sprintf("p50 %.1f ms / p99 %.1f ms (%d of %d × %d started)", f.BIdleP50Ms, f.BIdleP99Ms, f.BIdleStarted, f.BRounds, f.BRows)},
			{"tenant B insert → start, A busy", fmt.Sprintf("p50 %.1f ms / p99 %.1f ms (%d of %d × %d started; A: %d inserted, %d runnable)", f.BP50Ms, f.BP99Ms, f.BStarted, f.BRounds, f.BRows, f.ABacklog, f.ARunnableAtB)},
			{"B's p99 busy / idle", fmt.Sprintf("%.2f (tenant limit %d)", f.P99Ratio, f.Limit)},
			{"B's wait, A idle (round medians)", f.IdleTrace.String()},
			{"B's wait, A busy (round medians)", f.Trace.String()},
			{"rated key starts/s", fmt.Sprintf("%.2f for %.0f/s asked (%+.1f %%, burst %d; %d in %.0f s, at most %d in a second)",
				k.Rate.Measured, k.Rate.Asked, k.Rate.ErrorPct, k.Rate.Burst, k.Rate.Starts, k.Rate.WindowS, k.Rate.MostInSec)},
		}...)
	}
	for _, row := range rows {
		if _, err := fmt.Fprintf(w, "%-34s %s\n", row[0], row[1]); err != nil {
			return err
		}
	}
	for _, st := range r.Statements {
		if _, err := fmt.Fprintf(w, "  %-32s %6d × %6.2f ms = %7.0f ms\n", st.Kind, st.Count, st.TotalMs/float64(st.Count), st.TotalMs); err != nil {
			return err
		}
	}
	return nil
}
