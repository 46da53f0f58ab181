package benchrun

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
)

// KeysReport is what workload keys measured, in three phases on one engine
// with one queue (Options.Concurrency, Prefetch, MinDemand):
//
//  1. Parallelism: Options.N rows spread over Keys partition keys
//     ("par-0", "par-1", …) whose KeyPolicy has Limit 4; each step sleeps
//     KeySleep. The step function counts, in this process, how many steps
//     of its key are running.
//  2. Fairness with A idle: FairRounds rounds, each of FairRows rows of
//     tenant B inserted at once (one InsertMany) into the idle engine, the
//     next 20–100 ms after the last of them started; their insert → start
//     latency.
//  3. Fairness with A busy: FairBacklog rows of tenant A inserted with the
//     engine stopped, then the engine started; once A's steps have filled
//     its claim window twice over, the same rounds of B; the same latency.
//     The engine is stopped once B's rows have all started; A's backlog is
//     left unfinished.
//
// Both tenants are partition keys ("tenant-a", "tenant-b") with one
// KeyPolicy, prefix "tenant-", whose limit is the queue's whole claim window
// (concurrency + prefetch): A alone may fill every running and prefetched
// place, so B gets in only through the pick's round robin between keys.
// Every step sleeps KeySleep. Insert → start is the row's inserted_at
// (database clock) to the moment its step function is entered, translated
// to the database clock by an offset measured with clock_timestamp()
// (the sample with the shortest round trip of five).
type KeysReport struct {
	Keys    int     `json:"keys"`     // partition keys of the parallelism phase
	Limit   int     `json:"limit"`    // their KeyPolicy limit (4)
	SleepMs float64 `json:"sleep_ms"` // each step's sleep, every phase
	// MaxRunning is the most steps of one key seen running at once;
	// KeysAtLimit how many keys reached Limit at some point.
	MaxRunning  int `json:"max_running"`
	KeysAtLimit int `json:"keys_at_limit"`
	// MeanRunning is the time-weighted mean of a key's running steps from
	// the phase's first step start to its last step end: the steps' summed
	// run time / (Keys × that span). Time a slot spends between a step's
	// end and the next start (outcome commit, pick) counts as not running.
	MeanRunning float64 `json:"mean_running"`
	// StepsPerSec is the parallelism phase's steps / its work time (the
	// report's steps_per_sec).
	StepsPerSec float64        `json:"steps_per_sec"`
	Fairness    FairnessReport `json:"fairness"`
	Rate        RateReport     `json:"rate"`
}

// FairnessReport is the fairness phases of workload keys (see KeysReport).
type FairnessReport struct {
	Limit    int `json:"limit"`     // the "tenant-" KeyPolicy limit: concurrency + prefetch
	ABacklog int `json:"a_backlog"` // tenant A rows inserted before B's
	// ARunnableAtB is how many of A's rows were still runnable just before
	// B's first round was inserted.
	ARunnableAtB int `json:"a_runnable_at_b"`
	BRows        int `json:"b_rows"`   // tenant B rows inserted at once, per round
	BRounds      int `json:"b_rounds"` // rounds of B's rows per phase
	// BStarted and BIdleStarted are how many of B's rows started with A
	// busy and with A idle: all b_rounds × b_rows, or the run fails.
	BStarted     int `json:"b_started"`
	BIdleStarted int `json:"b_idle_started"`
	// B's insert → start latency percentiles (nearest rank, over every
	// round's rows) with A busy and with A idle.
	BP50Ms     float64 `json:"b_p50_ms"`
	BP99Ms     float64 `json:"b_p99_ms"`
	BIdleP50Ms float64 `json:"b_idle_p50_ms"`
	BIdleP99Ms float64 `json:"b_idle_p99_ms"`
	// P99Ratio is b_p99_ms / b_idle_p99_ms.
	P99Ratio float64 `json:"p99_ratio"`
	// Trace and IdleTrace are where B's wait went, with A busy and idle.
	Trace     BTrace `json:"trace"`
	IdleTrace BTrace `json:"idle_trace"`
}

// BTrace breaks tenant B's insert → start down, as medians over a phase's
// rounds. Times count from the moment InsertMany returned (B's rows
// committed), in this process's clock, except CommitMs.
type BTrace struct {
	// CommitMs: B's inserted_at (the insert transaction's start, database
	// clock) to InsertMany's return.
	CommitMs float64 `json:"commit_ms"`
	// FirstPickMs: to the start of the first pick that ended after the
	// insert returned (negative: it was already in flight).
	FirstPickMs float64 `json:"first_pick_ms"`
	// FirstStartMs and LastStartMs: to B's first and last step start.
	FirstStartMs float64 `json:"first_start_ms"`
	LastStartMs  float64 `json:"last_start_ms"`
	// Picks that ended after the insert and began before B's last start, their mean duration
	// (ms), and the mean rows each asked for (demand) and claimed.
	Picks      float64 `json:"picks"`
	PickMs     float64 `json:"pick_ms"`
	PickDemand float64 `json:"pick_demand"`
	PickRows   float64 `json:"pick_rows"`
}

func (t BTrace) String() string {
	return fmt.Sprintf("commit %.1f ms; after it: first pick %.1f ms, B's first start %.1f ms, last %.1f ms; %.0f picks of %.1f ms, %.0f asked, %.0f claimed",
		t.CommitMs, t.FirstPickMs, t.FirstStartMs, t.LastStartMs, t.Picks, t.PickMs, t.PickDemand, t.PickRows)
}

// pickTracer records the engine's picks while on.
type pickTracer struct {
	mu    sync.Mutex
	on    bool
	picks []tracedPick
}

type tracedPick struct {
	start          time.Time
	dur            time.Duration
	demand, claims int
}

func (p *pickTracer) OnEvent(_ context.Context, ev gendurable.Event) {
	e, ok := ev.(*gendurable.PickEvent)
	if !ok {
		return
	}
	end := time.Now()
	p.mu.Lock()
	if p.on {
		p.picks = append(p.picks, tracedPick{start: end.Add(-e.Duration), dur: e.Duration, demand: e.Demand, claims: e.Count})
	}
	p.mu.Unlock()
}

// start clears the record and turns it on; stop turns it off and returns it.
func (p *pickTracer) start() {
	p.mu.Lock()
	p.on, p.picks = true, nil
	p.mu.Unlock()
}

func (p *pickTracer) stop() []tracedPick {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = false
	return p.picks
}

// traceRound is one round's BTrace: B's rows were committed at inserted
// (local clock) and started at starts; dbInserted is their inserted_at
// in this process's clock.
func traceRound(inserted, dbInserted time.Time, starts []time.Time, picks []tracedPick) BTrace {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var tr BTrace
	tr.CommitMs = ms(inserted.Sub(dbInserted))
	if len(starts) == 0 {
		return tr
	}
	first, last := starts[0], starts[0]
	for _, t := range starts {
		if t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	tr.FirstStartMs, tr.LastStartMs = ms(first.Sub(inserted)), ms(last.Sub(inserted))
	var dur time.Duration
	var demand, rows int
	for _, p := range picks {
		if p.start.Add(p.dur).Before(inserted) || p.start.After(last) {
			continue // over before the insert returned, or after B's last start
		}
		if tr.Picks == 0 {
			tr.FirstPickMs = ms(p.start.Sub(inserted))
		}
		tr.Picks++
		dur += p.dur
		demand += p.demand
		rows += p.claims
	}
	if tr.Picks > 0 {
		tr.PickMs = ms(dur) / tr.Picks
		tr.PickDemand = float64(demand) / tr.Picks
		tr.PickRows = float64(rows) / tr.Picks
	}
	return tr
}

// medianTrace is the field-by-field median of rounds' traces.
func medianTrace(rounds []BTrace) BTrace {
	field := func(f func(*BTrace) float64) float64 {
		xs := make([]float64, len(rounds))
		for i := range rounds {
			xs[i] = f(&rounds[i])
		}
		return percentile(xs, 0.5)
	}
	return BTrace{
		CommitMs:     field(func(t *BTrace) float64 { return t.CommitMs }),
		FirstPickMs:  field(func(t *BTrace) float64 { return t.FirstPickMs }),
		FirstStartMs: field(func(t *BTrace) float64 { return t.FirstStartMs }),
		LastStartMs:  field(func(t *BTrace) float64 { return t.LastStartMs }),
		Picks:        field(func(t *BTrace) float64 { return t.Picks }),
		PickMs:       field(func(t *BTrace) float64 { return t.PickMs }),
		PickDemand:   field(func(t *BTrace) float64 { return t.PickDemand }),
		PickRows:     field(func(t *BTrace) float64 { return t.PickRows }),
	}
}

const (
	keyLimit = 4
	tenantA  = "tenant-a"
	tenantB  = "tenant-b"
	ratedKey = "rated-1"
	// bWaitLimit is how long tenant B's rows may take to start.
	bWaitLimit = 2 * time.Minute
)

// RateReport is the rate phase: a key whose KeyPolicy has Rate starts per
// second (burst Rate/10) runs behind tenant A's backlog, in the same queue;
// its starts are counted over a window that begins a second after its first.
type RateReport struct {
	Asked     float64 `json:"asked_per_sec"`    // the policy's rate
	Burst     int     `json:"burst"`            // the policy's burst
	WindowS   float64 `json:"window_s"`         // how long starts were counted
	Starts    int     `json:"starts"`           // starts in the window
	Measured  float64 `json:"measured_per_sec"` // Starts / WindowS
	ErrorPct  float64 `json:"error_pct"`        // (Measured − Asked) / Asked × 100
	MostInSec int     `json:"most_in_a_second"` // most starts in any 1 s of the window
}

// keyMeter is the keys workload's step function and what it observes.
type keyMeter struct {
	sleep  time.Duration
	offset time.Duration // database clock − this process's clock

	mu       sync.Mutex
	running  map[string]int
	peak     map[string]int
	busy     time.Duration // summed run time of the parallelism phase's steps
	first    time.Time
	last     time.Time
	aStarted int
	b        map[int64]float64 // tenant B: insert → first start, ms, by instance
	bAt      []time.Time       // tenant B: first starts, this process's clock
	bIns     time.Time         // tenant B: inserted_at of the last row started, this process's clock
	rated    []time.Time       // the rated key's starts
}

func (m *keyMeter) perform(ctx context.Context, r *gendurable.Run[args]) error {
	start := time.Now()
	key := r.PartitionKey
	par := strings.HasPrefix(key, "par-")
	m.mu.Lock()
	switch {
	case par:
		m.running[key]++
		m.peak[key] = max(m.peak[key], m.running[key])
		if m.first.IsZero() {
			m.first = start
		}
	case key == tenantA:
		m.aStarted++
	case key == tenantB:
		if _, ok := m.b[r.ID]; !ok {
			m.b[r.ID] = float64(start.Add(m.offset).Sub(r.InsertedAt).Microseconds()) / 1000
			m.bAt = append(m.bAt, start)
			m.bIns = r.InsertedAt.Add(-m.offset)
		}
	case key == ratedKey:
		m.rated = append(m.rated, start)
	}
	m.mu.Unlock()
	t := time.NewTimer(m.sleep)
	defer t.Stop()
	var err error
	select {
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if par {
		end := time.Now()
		m.mu.Lock()
		m.running[key]--
		m.busy += end.Sub(start)
		if end.After(m.last) {
			m.last = end
		}
		m.mu.Unlock()
	}
	return err
}

// bStarts swaps out B's latencies observed so far, their start instants
// and the last one's inserted_at (this process's clock).
func (m *keyMeter) bStarts() (ms []float64, at []time.Time, inserted time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms = make([]float64, 0, len(m.b))
	for _, v := range m.b {
		ms = append(ms, v)
	}
	at, inserted = m.bAt, m.bIns
	m.b, m.bAt = map[int64]float64{}, nil
	return ms, at, inserted
}

// syncClock measures the offset of the database's clock.
func (m *keyMeter) syncClock(ctx context.Context, pool *pgxpool.Pool) error {
	off, err := clockOffset(ctx, pool)
	m.mu.Lock()
	m.offset = off
	m.mu.Unlock()
	return err
}

func (m *keyMeter) count(f func() int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f()
}

// runKeys runs workload keys (see KeysReport) in o.Schema, prepared by Run.
func runKeys(ctx context.Context, o Options, pool *pgxpool.Pool, stmts *counter) (*Report, error) {
	window := o.Concurrency + max(0, o.Prefetch)
	meter := &keyMeter{sleep: o.KeySleep, running: map[string]int{}, peak: map[string]int{}, b: map[int64]float64{}}
	job := &gendurable.Job[args]{Name: "bench_keys", Perform: meter.perform}
	steps := &stepCounter{}
	tracer := &pickTracer{}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: o.Schema, Machines: []gendurable.Definition{job},
		Queues: map[string]gendurable.QueueConfig{"q0": o.queueConfig()},
		KeyPolicies: []gendurable.KeyPolicy{{Prefix: "par-", Limit: keyLimit}, {Prefix: "tenant-", Limit: window},
			{Prefix: "rated-", Limit: window, Rate: o.KeyRate, Per: time.Second, Burst: rateBurst(o.KeyRate)}},
		Hooks: []gendurable.Hook{steps, tracer}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CommitConcurrency: o.Commits,
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = eng.Stop(context.Background()) }()
	insert := func(n int, key func(i int) string) error {
		const batch = 5000
		for done := 0; done < n; {
			ps := make([]gendurable.InsertParams, min(batch, n-done))
			for i := range ps {
				ps[i] = job.New(args{I: done + i}).With(gendurable.InsertOpts{Queue: "q0", PartitionKey: key(done + i)})
			}
			if _, err := eng.InsertMany(ctx, ps); err != nil {
				return err
			}
			done += len(ps)
		}
		return nil
	}
	// wait polls until done reports true, printing progress.
	wait := func(phase string, done func() (bool, string)) error {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			ok, msg := done()
			if ok {
				fmt.Fprintf(o.Progress, "\rkeys %s: %s   \n", phase, msg)
				return nil
			}
			if time.Since(last) > 250*time.Millisecond {
				last = time.Now()
				fmt.Fprintf(o.Progress, "\rkeys %s: %s   ", phase, msg)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}

	// 1. Parallelism.
	insertStart := time.Now()
	if err := insert(o.N, func(i int) string { return fmt.Sprintf("par-%d", i%o.Keys) }); err != nil {
		return nil, err
	}
	insertDur := time.Since(insertStart)
	if _, err := pool.Exec(ctx, `ANALYZE "`+o.Schema+`".gendurable_instances`); err != nil {
		return nil, err
	}
	ru0 := usage()
	stmts.reset()
	workStart := time.Now()
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	want := int64(o.N)
	err = wait("parallelism", func() (bool, string) {
		n := steps.n.Load()
		return n >= want, fmt.Sprintf("%d/%d steps, %.0f steps/s", n, want, float64(n)/time.Since(workStart).Seconds())
	})
	if err != nil {
		return nil, err
	}
	work := time.Since(workStart)
	statements := stmts.n.Load()
	ru1 := usage()
	byKind := stmts.stats()
	p50, p99, err := latencies(ctx, pool, o.Schema)
	if err != nil {
		return nil, err
	}
	kr := &KeysReport{Keys: o.Keys, Limit: keyLimit, SleepMs: float64(o.KeySleep.Microseconds()) / 1000,
		StepsPerSec: float64(o.N) / work.Seconds()}
	meter.mu.Lock()
	for _, p := range meter.peak {
		kr.MaxRunning = max(kr.MaxRunning, p)
		if p >= keyLimit {
			kr.KeysAtLimit++
		}
	}
	if span := meter.last.Sub(meter.first); span > 0 {
		kr.MeanRunning = meter.busy.Seconds() / (float64(o.Keys) * span.Seconds())
	}
	meter.mu.Unlock()

	// 2. B alone: the engine is running and idle.
	fr := &kr.Fairness
	fr.Limit, fr.ABacklog, fr.BRows, fr.BRounds = window, o.FairBacklog, o.FairRows, o.FairRounds
	if err := meter.syncClock(ctx, pool); err != nil {
		return nil, err
	}
	bRounds := func(phase string) ([]float64, BTrace, error) {
		var all []float64
		var traces []BTrace
		for round := range o.FairRounds {
			time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
			tracer.start()
			if err := insert(o.FairRows, func(int) string { return tenantB }); err != nil {
				return nil, BTrace{}, err
			}
			inserted := time.Now()
			// B's rows starving would otherwise keep the run waiting forever.
			deadline := time.Now().Add(bWaitLimit)
			err := wait(phase, func() (bool, string) {
				n := meter.count(func() int { return len(meter.b) })
				return n >= o.FairRows || time.Now().After(deadline),
					fmt.Sprintf("round %d/%d: %d/%d of tenant B's rows started", round+1, o.FairRounds, n, o.FairRows)
			})
			started, at, dbInserted := meter.bStarts()
			all = append(all, started...)
			traces = append(traces, traceRound(inserted, dbInserted, at, tracer.stop()))
			if err != nil {
				return nil, BTrace{}, err
			}
			if len(started) < o.FairRows {
				return nil, BTrace{}, fmt.Errorf("keys %s: only %d of tenant B's %d rows started within %v", phase, len(started), o.FairRows, bWaitLimit)
			}
		}
		return all, medianTrace(traces), nil
	}
	idle, idleTrace, err := bRounds("fairness, A idle")
	if err != nil {
		return nil, err
	}
	fr.IdleTrace = idleTrace
	fr.BIdleStarted = len(idle)
	fr.BIdleP50Ms, fr.BIdleP99Ms = percentile(idle, 0.5), percentile(idle, 0.99)

	// 3. B behind A's backlog.
	if err := eng.Stop(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Progress, "keys fairness: inserting tenant A's %d rows…\n", o.FairBacklog)
	if err := insert(o.FairBacklog, func(int) string { return tenantA }); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `ANALYZE "`+o.Schema+`".gendurable_instances`); err != nil {
		return nil, err
	}
	if err := meter.syncClock(ctx, pool); err != nil {
		return nil, err
	}
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	warm := min(2*window, o.FairBacklog/2)
	err = wait("fairness, A busy", func() (bool, string) {
		n := meter.count(func() int { return meter.aStarted })
		return n >= warm, fmt.Sprintf("%d/%d of tenant A's rows started before B's insert", n, warm)
	})
	if err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+o.Schema+`".gendurable_instances
		WHERE queue = 'q0' AND partition_key = $1 AND status = 'runnable'`, tenantA).Scan(&fr.ARunnableAtB); err != nil {
		return nil, err
	}
	busy, busyTrace, err := bRounds("fairness, A busy")
	if err != nil {
		return nil, err
	}
	fr.Trace = busyTrace
	fr.BStarted = len(busy)
	fr.BP50Ms, fr.BP99Ms = percentile(busy, 0.5), percentile(busy, 0.99)
	if fr.BIdleP99Ms > 0 {
		fr.P99Ratio = fr.BP99Ms / fr.BIdleP99Ms
	}

	// 4. A rated key behind what is left of A's backlog.
	rr := &kr.Rate
	rr.Asked, rr.Burst = float64(o.KeyRate), rateBurst(o.KeyRate)
	secs := o.RateWindow.Seconds()
	if err := insert(int(float64(o.KeyRate)*(secs+3))+rr.Burst, func(int) string { return ratedKey }); err != nil {
		return nil, err
	}
	var from time.Time
	err = wait("rate", func() (bool, string) {
		m := meter
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.rated) == 0 {
			return false, "waiting for the rated key's first start"
		}
		if from.IsZero() {
			from = m.rated[0].Add(time.Second) // past the burst
		}
		left := time.Until(from.Add(o.RateWindow))
		return left <= 0, fmt.Sprintf("%d starts of the rated key, %s to go", len(m.rated), left.Round(time.Second))
	})
	if err != nil {
		return nil, err
	}
	meter.mu.Lock()
	perSec := map[int64]int{}
	for _, t := range meter.rated {
		if !t.Before(from) && t.Before(from.Add(o.RateWindow)) {
			rr.Starts++
			perSec[int64(t.Sub(from)/time.Second)]++
		}
	}
	meter.mu.Unlock()
	for _, n := range perSec {
		rr.MostInSec = max(rr.MostInSec, n)
	}
	rr.WindowS = secs
	rr.Measured = float64(rr.Starts) / secs
	rr.ErrorPct = (rr.Measured - rr.Asked) / rr.Asked * 100

	return &Report{
		Workload: o.Workload, Instances: o.N, Steps: want,
		Concurrency: o.Concurrency, Queues: 1, Engines: 1,
		InsertsPerSec:     float64(o.N) / insertDur.Seconds(),
		StepsPerSec:       kr.StepsPerSec,
		InstancesPerSec:   kr.StepsPerSec,
		StatementsPerStep: float64(statements) / float64(want),
		P50Ms:             p50, P99Ms: p99,
		WorkSeconds: work.Seconds(), CPUSeconds: ru1.cpu - ru0.cpu,
		MaxRSSMB:   ru1.maxRSSMB,
		Statements: byKind,
		Keys:       kr,
	}, nil
}

// rateBurst is the rate phase's bucket: a tenth of a second's starts, so
// that picks (every BusyPollInterval, 25 ms, while the queue is busy) never
// find the bucket full and lose tokens.
func rateBurst(rate int) int { return max(1, rate/10) }

// clockOffset is the database's clock minus this process's: of five
// clock_timestamp() round trips, the shortest's, against its midpoint.
func clockOffset(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	best, offset := time.Duration(math.MaxInt64), time.Duration(0)
	for range 5 {
		var db time.Time
		t0 := time.Now()
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
			return 0, err
		}
		if rtt := time.Since(t0); rtt < best {
			best, offset = rtt, db.Sub(t0.Add(rtt/2))
		}
	}
	return offset, nil
}

// percentile is the nearest-rank percentile p of xs (0 when empty).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
