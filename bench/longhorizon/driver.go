// Package longhorizon drives the long-horizon benchmark of issue 15: one or
// more job-queue adapters that speak the adapter protocol (see adapter.go),
// one system at a time, through the same phases on the same PostgreSQL —
// warmup, clean, idle-in-tx, recovery, active-readers, high-load, recovery,
// kill-worker, start-worker — sampling the database beside the adapters'
// own metrics, then a per-phase Markdown summary and PNG plots.
//
// bench/README.md ("Long horizon") documents the method and the outputs.
package longhorizon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrInvalidOption wraps every rejected option.
var ErrInvalidOption = errors.New("invalid option")

// Phase names, in the default order.
const (
	PhaseWarmup        = "warmup"
	PhaseClean         = "clean"
	PhaseIdleInTx      = "idle-in-tx"
	PhaseRecovery1     = "recovery-1"
	PhaseActiveReaders = "active-readers"
	PhaseHighLoad      = "high-load"
	PhaseRecovery2     = "recovery-2"
	PhaseKillWorker    = "kill-worker"
	PhaseStartWorker   = "start-worker"
)

// Phase is one phase of a run at full length (Options.Scale multiplies it).
type Phase struct {
	Name     string
	Duration time.Duration
}

// DefaultPhases are the targets at full length: 10 min clean → 15
// idle-in-tx → 10 recovery → 10 active-readers → 10 high-load → 10 recovery,
// after a 3 min warmup and before the crash phases (3 min each): 74 minutes
// per system.
func DefaultPhases() []Phase {
	return []Phase{
		{PhaseWarmup, 3 * time.Minute},
		{PhaseClean, 10 * time.Minute},
		{PhaseIdleInTx, 15 * time.Minute},
		{PhaseRecovery1, 10 * time.Minute},
		{PhaseActiveReaders, 10 * time.Minute},
		{PhaseHighLoad, 10 * time.Minute},
		{PhaseRecovery2, 10 * time.Minute},
		{PhaseKillWorker, 3 * time.Minute},
		{PhaseStartWorker, 3 * time.Minute},
	}
}

// Options configure a run. The zero value runs gendurable alone with the
// defaults documented on each field; Commands must name each system's
// adapter.
type Options struct {
	// DatabaseURL is the maintenance connection (a postgres:// URL); the
	// driver creates its databases through it. Default: the local server.
	DatabaseURL string
	// Systems run one after the other. Default: gendurable.
	Systems []string
	// Commands is each system's adapter command line: the adapter process
	// itself (no `go run` or shell wrapper — SIGKILL must reach it).
	Commands map[string][]string
	// Rate is the total offered rate, jobs/s, split evenly between the
	// replicas (each gets PRODUCER_RATE = Rate/Replicas, and changes it
	// through PRODUCER_RATE_CONTROL_FILE). Default 200.
	Rate float64
	// Workers is each replica's WORKER_COUNT. Default 8.
	Workers int
	// Replicas is the number of adapter processes per system. Default 2.
	Replicas int
	// PayloadBytes and WorkMS are JOB_PAYLOAD_BYTES and JOB_WORK_MS.
	// Defaults 256 and 1.
	PayloadBytes, WorkMS int
	// SampleEvery is SAMPLE_EVERY_S and the driver's own sample period
	// (whole seconds). Default 5 s.
	SampleEvery time.Duration
	// Scale multiplies every phase's duration (0.05 for a smoke run);
	// a scaled phase lasts at least 1 s (or its full length, if
	// shorter). Default 1.
	Scale float64
	// Phases in order. Default DefaultPhases.
	Phases []Phase
	// HighLoadFactor multiplies Rate during high-load. Default 1.5.
	HighLoadFactor float64
	// Readers is the number of REPEATABLE READ scanners in active-readers
	// (default 4); each pauses ReaderPause (default 10 ms) between passes.
	Readers     int
	ReaderPause time.Duration
	// DrainTimeout bounds the wait, after the last phase, for every job
	// inserted before it to finish (not scaled: it waits out leases).
	// Default 150 s.
	DrainTimeout time.Duration
	// ReadyTimeout bounds the wait for a replica's descriptor. Default 2 min.
	ReadyTimeout time.Duration
	// DBPrefix + system is the database of a system run; it is dropped and
	// created afresh (only if this driver created it). Default "lh_".
	DBPrefix string
	// KeepDB keeps each system's database after its run (default: dropped).
	KeepDB bool
	// Out is the output directory. Default "long-horizon-out".
	Out string
	// Counters count unfinished jobs per descriptor system. Default
	// DefaultCounters.
	Counters map[string]Counter
	// Log receives progress. Default os.Stderr.
	Log io.Writer
}

// stopGrace is the protocol's bound on a SIGTERM exit; the driver waits
// twice as long before it kills.
const stopGrace = 5 * time.Second

func (o *Options) withDefaults() (Options, error) {
	c := *o
	if c.DatabaseURL == "" {
		c.DatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	if len(c.Systems) == 0 {
		c.Systems = []string{"gendurable"}
	}
	setDefault(&c.Rate, 200)
	setDefault(&c.Workers, 8)
	setDefault(&c.Replicas, 2)
	setDefault(&c.PayloadBytes, 256)
	setDefault(&c.WorkMS, 1)
	setDefault(&c.SampleEvery, 5*time.Second)
	setDefault(&c.Scale, 1)
	setDefault(&c.HighLoadFactor, 1.5)
	setDefault(&c.Readers, 4)
	setDefault(&c.ReaderPause, 10*time.Millisecond)
	setDefault(&c.DrainTimeout, 150*time.Second)
	setDefault(&c.ReadyTimeout, 2*time.Minute)
	setDefault(&c.DBPrefix, "lh_")
	setDefault(&c.Out, "long-horizon-out")
	if c.Phases == nil {
		c.Phases = DefaultPhases()
	}
	if c.Counters == nil {
		c.Counters = DefaultCounters
	}
	if c.Log == nil {
		c.Log = os.Stderr
	}
	switch {
	case c.Rate < 0 || c.Workers < 0 || c.Replicas < 0 || c.Scale < 0 || c.HighLoadFactor < 0 || c.Readers < 0:
		return c, fmt.Errorf("%w: rate, workers, replicas, scale, high-load factor and readers must not be negative", ErrInvalidOption)
	case c.SampleEvery < time.Second || c.SampleEvery%time.Second != 0:
		return c, fmt.Errorf("%w: sample period %v: want whole seconds", ErrInvalidOption, c.SampleEvery)
	case !identOK(c.DBPrefix):
		return c, fmt.Errorf("%w: db prefix %q: want a plain lower-case identifier", ErrInvalidOption, c.DBPrefix)
	}
	seen := map[string]bool{}
	for _, s := range c.Systems {
		if !identOK(s) || seen[s] {
			return c, fmt.Errorf("%w: system %q: want distinct plain lower-case names", ErrInvalidOption, s)
		}
		seen[s] = true
		if len(c.Commands[s]) == 0 {
			return c, fmt.Errorf("%w: no adapter command for system %q", ErrInvalidOption, s)
		}
	}
	for _, p := range c.Phases {
		if p.Name == PhaseKillWorker && c.Replicas < 2 {
			return c, fmt.Errorf("%w: phase %s needs at least 2 replicas", ErrInvalidOption, p.Name)
		}
	}
	if _, err := dbURL(c.DatabaseURL, "x"); err != nil {
		return c, err
	}
	return c, nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

func identOK(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// Scaled is d × scale, at least 1 s (or d, if shorter).
func Scaled(d time.Duration, scale float64) time.Duration {
	return max(time.Duration(float64(d)*scale), min(d, time.Second))
}

// Span is a phase as it ran.
type Span struct {
	Name       string    `json:"name"`
	Start, End time.Time `json:"-"`
	StartS     float64   `json:"start_s"` // since the system run's start
	EndS       float64   `json:"end_s"`
}

// rateChange records the total rate the live replicas were told to offer.
type rateChange struct {
	T    time.Time
	Rate float64
}

// StopResult is how a replica answered SIGTERM at the end of a run.
type StopResult struct {
	Replica int     `json:"replica"`
	TookS   float64 `json:"took_s"`
	Clean   bool    `json:"clean"` // exit 0 within 5 s
}

// DrainResult counts, in the system's own tables, the jobs inserted before
// the end of the last phase that never finished (lost) or finished failed.
type DrainResult struct {
	Counted bool    `json:"counted"`
	Note    string  `json:"note,omitempty"`
	Pending int64   `json:"pending"` // unfinished when the drain ended: lost
	Failed  int64   `json:"failed"`
	WaitedS float64 `json:"waited_s"`
}

// SystemRun is one system's run.
type SystemRun struct {
	System     string      `json:"system"`
	Database   string      `json:"database"`
	Descriptor Descriptor  `json:"descriptor"`
	Start      time.Time   `json:"start"`
	Spans      []Span      `json:"phases"`
	KillS      float64     `json:"kill_s,omitempty"`      // SIGKILL, since start
	RestartS   float64     `json:"restart_s,omitempty"`   // the killed replica back
	KilledExit string      `json:"killed_exit,omitempty"` // how the killed replica ended
	Drain      DrainResult `json:"drain"`
	DrainEndS  float64     `json:"drain_end_s"` // the drain after the last phase ended, since start
	// KillDrain is the wait, from the SIGKILL, for every job inserted
	// before it to finish: the jobs the killed replica held come back
	// after their lease.
	KillDrain   DrainResult  `json:"kill_drain"`
	Stops       []StopResult `json:"stops"`
	Inserted    float64      `json:"inserted"`  // Σ enqueue_rate × window_s, every replica
	Completed   float64      `json:"completed"` // Σ completion_rate × window_s
	ProtoErrors []string     `json:"protocol_errors,omitempty"`
	Problems    []string     `json:"problems,omitempty"`

	Points    []Point    `json:"-"`
	DBSamples []DBSample `json:"-"`
	Samples   []Sample   `json:"-"`
	rates     []rateChange
}

// Report is a whole run.
type Report struct {
	Options Options      `json:"-"`
	Runs    []*SystemRun `json:"runs"`
	// Partial is set when a run cut short wrote the outputs of the
	// systems that had finished before it (Run's error says which failed).
	Partial bool `json:"-"`
}

// Run runs every system of o in turn and writes the outputs to o.Out. If a
// system's run fails or ctx ends, the systems that finished before it are
// still written (Report.Partial), and the error names the one cut short.
func Run(ctx context.Context, o Options) (*Report, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	rep := &Report{Options: o}
	for _, sys := range o.Systems {
		r, err := runSystem(ctx, &o, sys)
		if err != nil {
			err = fmt.Errorf("%s: %w", sys, err)
			// A run cut short (SIGINT, SIGTERM, a replica that would not
			// start) still reports the systems that ran to the end: an
			// hour-long run of the first system is not lost to the second.
			if len(rep.Runs) > 0 {
				if werr := WriteOutputs(rep); werr != nil {
					err = errors.Join(err, werr)
				} else {
					rep.Partial = true
				}
			}
			if r != nil {
				rep.Runs = append(rep.Runs, r)
			}
			return rep, err
		}
		rep.Runs = append(rep.Runs, r)
	}
	return rep, WriteOutputs(rep)
}

func (o *Options) logf(format string, args ...any) {
	fmt.Fprintf(o.Log, "long-horizon: "+format+"\n", args...)
}

// system is the state of one system's run while it runs.
type system struct {
	o        *Options
	run      *SystemRun
	dir, url string
	rateFile string // PRODUCER_RATE_CONTROL_FILE of every replica
	sink     *sink
	reps     []*replica
	rate     []float64 // per replica, 0 when not running
	mu       sync.Mutex
}

func (s *system) env(i int, rate float64) []string {
	return []string{
		"DATABASE_URL=" + s.url,
		fmt.Sprintf("BENCH_INSTANCE_ID=%d", i),
		"PRODUCER_RATE_CONTROL_FILE=" + s.rateFile,
		"SCENARIO=long_horizon",
		"PRODUCER_MODE=fixed",
		fmt.Sprintf("PRODUCER_RATE=%g", rate),
		fmt.Sprintf("WORKER_COUNT=%d", s.o.Workers),
		fmt.Sprintf("JOB_PAYLOAD_BYTES=%d", s.o.PayloadBytes),
		fmt.Sprintf("JOB_WORK_MS=%d", s.o.WorkMS),
		fmt.Sprintf("SAMPLE_EVERY_S=%d", int(s.o.SampleEvery/time.Second)),
	}
}

// start starts replica i offering rate and waits for its descriptor.
func (s *system) start(ctx context.Context, i int, rate float64) (Descriptor, error) {
	if old := s.reps[i]; old != nil {
		select {
		case <-old.done:
		default: // never two incarnations of one replica
			s.problem("replica %d still running at its restart; killed", i)
			old.kill()
		}
	}
	r, err := startReplica(i, s.o.Commands[s.run.System], s.env(i, rate), filepath.Join(s.dir, fmt.Sprintf("replica%d.log", i)), s.sink)
	if err != nil {
		return Descriptor{}, err
	}
	s.reps[i] = r
	select {
	case d := <-r.desc:
		s.setRate(i, rate)
		return d, nil
	case <-r.done:
		return Descriptor{}, fmt.Errorf("replica %d exited before its descriptor (%v); see %s", i, r.exitErr, filepath.Join(s.dir, fmt.Sprintf("replica%d.log", i)))
	case <-time.After(s.o.ReadyTimeout):
		r.kill()
		return Descriptor{}, fmt.Errorf("replica %d: no descriptor within %v", i, s.o.ReadyTimeout)
	case <-ctx.Done():
		r.kill()
		return Descriptor{}, ctx.Err()
	}
}

func (s *system) setRate(i int, rate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rate[i] = rate
	total := 0.0
	for _, r := range s.rate {
		total += r
	}
	s.run.rates = append(s.run.rates, rateChange{time.Now(), total})
}

// stop sends SIGTERM to replica i and records how it went.
func (s *system) stop(i int) StopResult {
	took, clean := s.reps[i].terminate(2 * stopGrace)
	s.setRate(i, 0)
	return StopResult{Replica: i, TookS: took.Seconds(), Clean: clean && took <= stopGrace}
}

func (s *system) problem(format string, args ...any) {
	s.mu.Lock()
	s.run.Problems = append(s.run.Problems, fmt.Sprintf(format, args...))
	s.mu.Unlock()
	s.o.logf("%s: "+format, append([]any{s.run.System}, args...)...)
}

// setRates tells every running replica to offer rate from now on, through
// PRODUCER_RATE_CONTROL_FILE (an adapter re-reads it every second); a
// replica started later reads it too.
func (s *system) setRates(rate float64) error {
	tmp := s.rateFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatFloat(rate, 'g', -1, 64)+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.rateFile); err != nil {
		return err
	}
	for i, r := range s.reps {
		if r == nil {
			continue
		}
		select {
		case <-r.done:
		default:
			s.setRate(i, rate)
		}
	}
	return nil
}

func runSystem(ctx context.Context, o *Options, sysName string) (*SystemRun, error) {
	s := &system{o: o, run: &SystemRun{System: sysName, Database: o.DBPrefix + sysName},
		dir: filepath.Join(o.Out, sysName), reps: make([]*replica, o.Replicas), rate: make([]float64, o.Replicas)}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if s.url, err = dbURL(o.DatabaseURL, s.run.Database); err != nil {
		return nil, err
	}
	if err := recreateDatabase(ctx, o.DatabaseURL, s.run.Database); err != nil {
		return nil, err
	}
	if !o.KeepDB {
		defer func() {
			if err := dropDatabase(context.Background(), o.DatabaseURL, s.run.Database); err != nil {
				o.logf("%s: drop %s: %v", sysName, s.run.Database, err)
			}
		}()
	}
	rawf, err := os.Create(filepath.Join(s.dir, "adapter.jsonl"))
	if err != nil {
		return nil, err
	}
	defer rawf.Close()
	s.sink = &sink{raw: rawf}
	defer func() { // never leave an adapter behind
		for _, r := range s.reps {
			if r != nil {
				select {
				case <-r.done:
				default:
					r.kill()
				}
			}
		}
	}()

	base := o.Rate / float64(o.Replicas)
	if s.rateFile, err = filepath.Abs(filepath.Join(s.dir, "producer_rate")); err != nil {
		return nil, err
	}
	if err := s.setRates(base); err != nil {
		return nil, err
	}
	o.logf("%s: database %s, %d replicas × (%g jobs/s, %d workers)", sysName, s.run.Database, o.Replicas, base, o.Workers)
	for i := range s.reps {
		d, err := s.start(ctx, i, base)
		if err != nil {
			return s.run, err
		}
		if i == 0 {
			s.run.Descriptor = d
			if d.System != sysName {
				s.problem("descriptor says system %q", d.System)
			}
		}
	}
	tables := s.run.Descriptor.EventTables
	s.run.Start = time.Now()

	sampCtx, stopSampler := context.WithCancel(ctx)
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		s.sampleLoop(sampCtx, tables)
	}()
	defer func() { stopSampler(); <-samplerDone }()

	factor := 1.0
	killed := -1
	var killWait sync.WaitGroup // KillDrain is known
	for _, ph := range o.Phases {
		d := Scaled(ph.Duration, o.Scale)
		span := Span{Name: ph.Name, Start: time.Now()}
		o.logf("%s: phase %s (%v)", sysName, ph.Name, d.Round(100*time.Millisecond))
		phCtx, cancel := context.WithDeadline(ctx, span.Start.Add(d))
		var wg sync.WaitGroup
		want := 1.0
		if ph.Name == PhaseHighLoad {
			want = o.HighLoadFactor
		}
		if want != factor {
			if err := s.setRates(base * want); err != nil {
				cancel()
				return s.run, err
			}
			factor = want
		}
		switch ph.Name {
		case PhaseIdleInTx:
			wg.Go(func() {
				if err := holdXmin(phCtx, s.url); err != nil && phCtx.Err() == nil {
					s.problem("idle-in-tx holder: %v", err)
				}
			})
		case PhaseActiveReaders:
			for range o.Readers {
				wg.Go(func() {
					if _, err := readLoop(phCtx, s.url, tables, o.ReaderPause); err != nil {
						s.problem("reader: %v", err)
					}
				})
			}
		case PhaseKillWorker:
			killed = len(s.reps) - 1
			wg.Go(func() {
				select {
				case <-phCtx.Done():
					return
				case <-time.After(d / 2):
				}
				s.reps[killed].kill()
				s.setRate(killed, 0)
				s.run.KillS = time.Since(s.run.Start).Seconds()
				s.run.KilledExit = fmt.Sprint(s.reps[killed].exitErr)
				o.logf("%s: SIGKILL replica %d", sysName, killed)
				killWait.Go(func() { // how long the jobs it may have held take to finish
					s.run.KillDrain = s.waitFinished(ctx, tables, time.Second, "after the SIGKILL")
				})
			})
		case PhaseStartWorker:
			if killed >= 0 {
				if _, err := s.start(ctx, killed, base*factor); err != nil {
					cancel()
					return s.run, err
				}
				s.run.RestartS = time.Since(s.run.Start).Seconds()
				killed = -1
			}
		}
		<-phCtx.Done()
		wg.Wait()
		cancel()
		if ctx.Err() != nil {
			return s.run, ctx.Err()
		}
		span.End = time.Now()
		s.run.Spans = append(s.run.Spans, span)
		for i, r := range s.reps {
			select {
			case <-r.done:
				if i != killed {
					s.problem("replica %d exited during %s (%v); not restarted", i, ph.Name, r.exitErr)
					s.setRate(i, 0)
					killed = i // restarted by start-worker, if that is still to come
				}
			default:
			}
		}
	}
	if killed >= 0 { // the phase list had no start-worker
		if _, err := s.start(ctx, killed, base*factor); err != nil {
			return s.run, err
		}
	}

	killWait.Wait()
	s.run.Drain = s.waitFinished(ctx, tables, 500*time.Millisecond, "drain")
	s.run.DrainEndS = time.Since(s.run.Start).Seconds()
	for i := range s.reps {
		res := s.stop(i)
		s.run.Stops = append(s.run.Stops, res)
	}
	stopSampler()
	<-samplerDone

	s.sink.mu.Lock()
	s.run.Points = s.sink.points
	s.run.ProtoErrors = s.sink.protoErrs
	s.sink.mu.Unlock()
	s.finish()
	return s.run, nil
}

// sampleLoop samples the database at every wall-clock multiple of the
// sample period (the instants the adapters report at) until ctx ends.
func (s *system) sampleLoop(ctx context.Context, tables []string) {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		s.problem("sampler: %v", err)
		return
	}
	defer conn.Close(context.Background())
	p := s.o.SampleEvery
	warned := false
	for {
		next := time.Now().Truncate(p).Add(p)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		qctx, cancel := context.WithTimeout(ctx, p)
		ds, err := sampleDB(qctx, conn, tables, next)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.problem("sample at %s: %v", next.Format(time.TimeOnly), err)
			continue
		}
		if len(ds.Tables) < len(tables) && !warned {
			warned = true
			s.problem("only %d of the event tables %v found (to_regclass on the default search_path)", len(ds.Tables), tables)
		}
		s.mu.Lock()
		s.run.DBSamples = append(s.run.DBSamples, ds)
		s.mu.Unlock()
	}
}

// waitFinished takes the database's now() as T and waits until no job
// inserted before T is unfinished in the system's own table (or
// DrainTimeout), the replicas still producing and working; what is still
// unfinished then is lost. It polls every poll.
func (s *system) waitFinished(ctx context.Context, tables []string, poll time.Duration, what string) DrainResult {
	var res DrainResult
	c, ok := s.o.Counters[s.run.Descriptor.System]
	table, found := "", false
	if ok {
		table, found = findTable(tables, c.Table)
	}
	if !found {
		res.Note = fmt.Sprintf("%v: system %q, event tables %v", errNoCounter, s.run.Descriptor.System, tables)
		return res
	}
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		res.Note = err.Error()
		return res
	}
	defer conn.Close(context.Background())
	at, err := dbNow(ctx, conn)
	if err != nil {
		res.Note = err.Error()
		return res
	}
	start := time.Now()
	for {
		res.Pending, res.Failed, err = countPending(ctx, conn, c, table, at)
		if err != nil {
			res.Note = err.Error()
			return res
		}
		res.Counted = true
		res.WaitedS = time.Since(start).Seconds()
		if res.Pending == 0 || time.Since(start) >= s.o.DrainTimeout || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
	s.o.logf("%s: %s: %d unfinished, %d failed of the jobs inserted before it (waited %.1fs)",
		s.run.System, what, res.Pending, res.Failed, res.WaitedS)
	return res
}

// WriteRunJSON writes the run's settings and results (without samples).
func writeRunJSON(path string, rep *Report) error {
	o := rep.Options
	out := map[string]any{
		"settings": map[string]any{
			"rate": o.Rate, "workers_per_replica": o.Workers, "replicas": o.Replicas,
			"payload_bytes": o.PayloadBytes, "work_ms": o.WorkMS, "sample_every_s": o.SampleEvery.Seconds(),
			"scale": o.Scale, "high_load_factor": o.HighLoadFactor, "readers": o.Readers, "systems": o.Systems,
			"commands": o.Commands,
		},
		"runs": rep.Runs,
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
