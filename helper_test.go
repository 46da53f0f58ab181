package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// testBundle is one test's isolated world: a schema, a pool and an engine.
type testBundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	eng    *gendurable.Engine
}

// fastConfig returns engine settings tuned for tests: short lease, quick polls.
func fastConfig(schema string, machines ...gendurable.Definition) *gendurable.Config {
	return &gendurable.Config{
		Schema:            schema,
		Machines:          machines,
		Queues:            map[string]gendurable.QueueConfig{"default": {Concurrency: 4, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}},
		LeaseDuration:     3 * time.Second,
		HeartbeatInterval: time.Second,
		ReaperInterval:    200 * time.Millisecond,
		DrainTimeout:      5 * time.Second,
	}
}

// setup creates a schema and an engine (not started) with cfg; cfg.Schema is
// filled in. A nil cfg means fastConfig with the given machines.
func setup(t *testing.T, cfg *gendurable.Config, machines ...gendurable.Definition) *testBundle {
	t.Helper()
	db := gendurabletest.NewDB(t, nil)
	return bundleOn(t, db.Pool, db.Schema, cfg, machines...)
}

// bundleOn makes the engine of a testBundle on pool and schema (see setup).
func bundleOn(t *testing.T, pool *pgxpool.Pool, schema string, cfg *gendurable.Config, machines ...gendurable.Definition) *testBundle {
	t.Helper()
	if cfg == nil {
		cfg = fastConfig(schema, machines...)
	}
	cfg.Schema = schema
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	// A test that starts the engine itself and fails before its own Stop
	// must not leave it running past the test: it would log to a finished
	// test (a panic that fails the whole package) and use a dropped schema.
	// Registered after the database's cleanup, so it runs before it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	})
	return &testBundle{t: t, pool: pool, schema: schema, eng: eng}
}

// start starts the engine and stops it when the test ends.
func (b *testBundle) start() {
	b.t.Helper()
	require.NoError(b.t, b.eng.Start(context.Background()))
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.eng.Stop(ctx)
	})
}

func (b *testBundle) insert(p gendurable.InsertParams) int64 {
	b.t.Helper()
	res, err := b.eng.Insert(context.Background(), p)
	require.NoError(b.t, err)
	return res.ID
}

// row is an instance row as the tests read it.
type row struct {
	ID          int64
	FSM         string
	Version     int
	Queue       string
	Step        string
	State       json.RawMessage
	Result      json.RawMessage
	Status      string
	Priority    int
	Attempt     int
	MaxAttempts int
	EligibleAt  time.Time
	LeaseExp    *time.Time
	Token       *int64
	Errors      []map[string]any
	FinishedAt  *time.Time
	Now         time.Time // the database clock when read
}

func (b *testBundle) row(id int64) row {
	b.t.Helper()
	var r row
	var errs []byte
	err := b.pool.QueryRow(context.Background(), fmt.Sprintf(`
		SELECT id, fsm, fsm_version, queue, step, state, result, status::text, priority, attempt,
		       max_attempts, eligible_at, lease_expires_at, claim_token, errors, finished_at, now()
		FROM %s.gendurable_instances WHERE id = $1`, b.schema), id).Scan(
		&r.ID, &r.FSM, &r.Version, &r.Queue, &r.Step, &r.State, &r.Result, &r.Status, &r.Priority,
		&r.Attempt, &r.MaxAttempts, &r.EligibleAt, &r.LeaseExp, &r.Token, &errs, &r.FinishedAt, &r.Now)
	require.NoError(b.t, err)
	require.NoError(b.t, json.Unmarshal(errs, &r.Errors))
	return r
}

// insertAllDone inserts ps in one InsertMany and waits until every one of
// them is done, each within timeout.
func (b *testBundle) insertAllDone(ps []gendurable.InsertParams, timeout time.Duration) {
	b.t.Helper()
	res, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(b.t, err)
	for _, r := range res {
		b.waitStatus(r.ID, "done", timeout)
	}
}

// waitStatus polls until the instance has the status, failing after timeout.
func (b *testBundle) waitStatus(id int64, status string, timeout time.Duration) row {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := b.row(id)
		if r.Status == status {
			return r
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("instance %d: status %q (step %q, attempt %d, errors %v) after %s, want %q",
				id, r.Status, r.Step, r.Attempt, r.Errors, timeout, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exec runs SQL against the test schema ({{s}} is replaced by its name).
// timedCutOffPool is cutOffPool with a connect and ping timeout of a
// second, and no cleanup: the caller closes the pool (and the proxy, if it
// must end before the test does).
func timedCutOffPool(t *testing.T, maxConns int32) (*pgxpool.Pool, *dbtest.CutProxy) {
	t.Helper()
	proxy := dbtest.NewCutProxyFor(t, dbtest.URL())
	pcfg := proxy.PoolConfig(t, dbtest.URL())
	pcfg.ConnConfig.ConnectTimeout, pcfg.PingTimeout = time.Second, time.Second
	pcfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	return pool, proxy
}

func (b *testBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.pool.Exec(context.Background(), replaceSchema(sql, b.schema), args...)
	require.NoError(b.t, err)
}

func (b *testBundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), replaceSchema(sql, b.schema), args...).Scan(&n))
	return n
}

// lockRows locks the instance rows ids in a transaction of its own, so
// that a statement writing one of them waits; it returns the transaction
// (rolled back when the test ends, if the test has not ended it) and its
// backend's pid, for blockedBy.
func (b *testBundle) lockRows(ids ...int64) (pgx.Tx, int) {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, replaceSchema(`SELECT 1 FROM {{s}}.gendurable_instances WHERE id = ANY ($1) FOR UPDATE`, b.schema), ids)
	require.NoError(b.t, err)
	return tx, int(tx.Conn().PgConn().PID())
}

// blockedBy counts the sessions waiting for a lock that the backend pid
// holds, whose statement contains like ("" for any).
func (b *testBundle) blockedBy(pid int, like string) int {
	b.t.Helper()
	return b.count(`SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))
		AND strpos(query, $2) > 0`, pid, like)
}

// proxiedEngine starts a second engine of cfg (its Schema set to b's)
// whose connections reach the server through a dbtest.CutProxy, so a test
// can cut or strand them; at cleanup the proxy closes and the engine stops.
func (b *testBundle) proxiedEngine(cfg *gendurable.Config) (*gendurable.Engine, *dbtest.CutProxy) {
	b.t.Helper()
	ctx := context.Background()
	proxy := dbtest.NewCutProxyFor(b.t, dbtest.URL())
	pcfg := proxy.PoolConfig(b.t, dbtest.URL())
	pcfg.ConnConfig.ConnectTimeout, pcfg.PingTimeout = time.Second, time.Second
	pcfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(b.t, err)
	cfg.Schema = b.schema
	eng, err := gendurable.New(pool, cfg)
	require.NoError(b.t, err)
	require.NoError(b.t, eng.Start(ctx))
	b.t.Cleanup(func() {
		proxy.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
		pool.Close()
	})
	return eng, proxy
}

func replaceSchema(sql, schema string) string { return strings.ReplaceAll(sql, "{{s}}", schema) }

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: "+msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func near(t *testing.T, want, got time.Time, tol time.Duration) {
	t.Helper()
	require.WithinDuration(t, want, got, tol)
}

// testLogger sends engine logs to the test log (shown with -v or on failure).
func testLogger(t *testing.T) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// tWriter logs to its test while the test runs, and to stderr after it:
// t.Log from a goroutine that outlives its test panics and fails the whole
// package, hiding which test left it running.
type tWriter struct {
	t     *testing.T
	mu    sync.Mutex
	ended bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		fmt.Fprintf(os.Stderr, "%s (logged after the test ended): %s\n", w.t.Name(), strings.TrimSpace(string(p)))
		return len(p), nil
	}
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

type orderArgs struct {
	I int `json:"i"`
}

// recorder is a job that records the order in which it ran.
type recorder struct {
	mu  sync.Mutex
	ran []int
}

func (rec *recorder) job(name string) *gendurable.Job[orderArgs] {
	return &gendurable.Job[orderArgs]{
		Name: name,
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			rec.mu.Lock()
			rec.ran = append(rec.ran, j.State.I)
			rec.mu.Unlock()
			return nil
		},
	}
}

func (rec *recorder) order() []int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]int(nil), rec.ran...)
}

type spanArgs struct {
	Key string `json:"key"`
}

type weirdState struct {
	Name string         `json:"name"`
	Any  map[string]any `json:"any,omitempty"`
}

type probeState struct {
	Do   string `json:"do"`
	N    int    `json:"n"`
	Seen []int  `json:"seen,omitempty"`
}

// probeMachine's step "a" does what the state says; "b" records what it saw.
func probeMachine(handleCalls *atomic.Int32) *gendurable.Machine[probeState] {
	return &gendurable.Machine[probeState]{
		Name:        "probe",
		Start:       "a",
		MaxAttempts: 3,
		Backoff:     func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[probeState]{
			"a": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				s := r.State
				s.N++
				switch s.Do {
				case "next":
					return r.Next("b", s), nil
				case "next_delay":
					return r.Next("b", s).After(time.Hour), nil
				case "replay":
					return r.Replay(s, time.Hour), nil
				case "done":
					return gendurable.Done(map[string]int{"n": s.N}), nil
				case "stop":
					return gendurable.Stop("told to stop"), nil
				case "error":
					return gendurable.Outcome{}, errors.New("boom")
				case "panic":
					panic("kaboom")
				case "invalid_step":
					return r.Next("nope", s), nil
				case "zero":
					return gendurable.Outcome{}, nil
				case "bad_result":
					return gendurable.Done(func() {}), nil
				}
				return gendurable.Stop("unknown action " + s.Do), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
				return gendurable.Done(r.State), nil
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[probeState], err error) (gendurable.Outcome, error) {
			if handleCalls != nil {
				handleCalls.Add(1)
			}
			if r.Attempt+1 >= r.MaxAttempts {
				return gendurable.Stop("gave up"), nil
			}
			return r.Replay(r.State, 0), nil
		},
	}
}

type fanState struct {
	Width    int      `json:"width"`
	Depth    int      `json:"depth"`
	Fail     bool     `json:"fail,omitempty"`
	Seen     []string `json:"seen,omitempty"`
	Resumes  int      `json:"resumes,omitempty"`
	ChildSum int      `json:"child_sum,omitempty"`
}

type leafArgs struct {
	N    int  `json:"n"`
	Fail bool `json:"fail,omitempty"`
}

// slotHog is a job whose step holds its slot until release is closed (or
// its context ends): rows claimed behind it wait in the prefetch buffer.
func slotHog(name string, release <-chan struct{}) *gendurable.Job[leafArgs] {
	return &gendurable.Job[leafArgs]{Name: name, Perform: func(ctx context.Context, _ *gendurable.Run[leafArgs]) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}}
}

// unreachablePool is a pool of a server that is not there (nothing listens
// on port 1): a call that reaches for a connection fails with a connection
// error, so a call that returns another error checked before any SQL.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// statusParent is a machine that schedules kids() as its children, then
// finishes with their statuses ([]string, in the order of Run.Children).
func statusParent(name string, kids func() []gendurable.InsertParams) *gendurable.Machine[fanState] {
	return &gendurable.Machine[fanState]{Name: name, Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, kids()...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				var st []string
				for _, c := range r.Children {
					st = append(st, string(c.Status))
				}
				return gendurable.Done(st), nil
			},
		}}
}

// fanMachines: a parent that fans out Width leaf jobs (or, with Depth > 0,
// Width sub-parents), then sums its children's results.
func fanMachines() (*gendurable.Machine[fanState], *gendurable.Job[leafArgs]) {
	leaf := &gendurable.Job[leafArgs]{
		Name: "leaf", MaxAttempts: 1,
		Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
			if j.State.Fail {
				return gendurable.JobCancel(errors.New("leaf failed on purpose"))
			}
			return nil
		},
	}
	var parent *gendurable.Machine[fanState]
	parent = &gendurable.Machine[fanState]{
		Name: "fan", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				var kids []gendurable.InsertParams
				for i := 0; i < r.State.Width; i++ {
					if r.State.Depth > 0 {
						kids = append(kids, parent.New(fanState{Width: r.State.Width, Depth: r.State.Depth - 1}))
					} else {
						kids = append(kids, leaf.New(leafArgs{N: i, Fail: r.State.Fail && i == 0}))
					}
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				s := r.State
				s.Resumes++
				for _, c := range r.Children {
					s.Seen = append(s.Seen, fmt.Sprintf("%s:%s", c.Machine, c.Status))
					var sub fanState
					if c.Machine == "fan" {
						if err := jsonUnmarshal(c.Result, &sub); err != nil {
							return gendurable.Outcome{}, err
						}
						s.ChildSum += 1 + sub.ChildSum
					} else {
						s.ChildSum++
					}
				}
				return gendurable.Done(s), nil
			},
		},
	}
	return parent, leaf
}

// eventLog is a hook that keeps every event it sees.
type eventLog struct {
	mu     sync.Mutex
	events []gendurable.Event
}

func (l *eventLog) OnEvent(_ context.Context, ev gendurable.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) { // copy: events must not be retained
	case *gendurable.StepEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.LeaseLostEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.UnknownVersionEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.DrainEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.ReapEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.PickEvent:
		c := *e
		l.events = append(l.events, &c)
	case *gendurable.SaturationEvent:
		c := *e
		l.events = append(l.events, &c)
	}
}

func findEvent[E gendurable.Event](l *eventLog, match func(E) bool) (E, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		if e, ok := ev.(E); ok && match(e) {
			return e, true
		}
	}
	var zero E
	return zero, false
}

// pauseTracer is a statement tracer that calls its hook, when one is set,
// as each statement's answer has arrived and before its caller goes on (a
// transaction's next statement or COMMIT): a hook that blocks holds the
// caller there, its locks held and its snapshot taken, which widens a race
// window at a chosen point.
type pauseTracer struct {
	hook atomic.Pointer[func(conn *pgx.Conn, sql string, args []any)]
}

type pauseStartKey struct{}

type pauseStart struct {
	sql  string
	args []any
}

func (p *pauseTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, pauseStartKey{}, pauseStart{d.SQL, d.Args})
}

func (p *pauseTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if h := p.hook.Load(); h != nil && d.Err == nil {
		s, _ := ctx.Value(pauseStartKey{}).(pauseStart)
		(*h)(conn, s.sql, s.args)
	}
}

// pauseAt makes the tracer hold the first statement whose text contains
// like and whose first argument is id (or a slice holding id alone): it
// returns the held session's pid once it is held, and a release function.
func (p *pauseTracer) pauseAt(t *testing.T, like string, id int64) (held <-chan int, release func()) {
	t.Helper()
	heldc, gate := make(chan int, 1), make(chan struct{})
	var once sync.Once
	hook := func(conn *pgx.Conn, sql string, args []any) {
		if !strings.Contains(sql, like) || len(args) == 0 {
			return
		}
		switch a := args[0].(type) {
		case int64:
			if a != id {
				return
			}
		case []int64:
			if len(a) != 1 || a[0] != id {
				return
			}
		default:
			return
		}
		first := false
		once.Do(func() { first = true })
		if !first {
			return
		}
		heldc <- int(conn.PgConn().PID())
		<-gate
	}
	p.hook.Store(&hook)
	var ronce sync.Once
	release = func() { ronce.Do(func() { p.hook.Store(nil); close(gate) }) }
	t.Cleanup(release)
	return heldc, release
}

// setupTraced is setup on a pool whose statements go through tracer.
func setupTraced(t *testing.T, tracer pgx.QueryTracer, cfg *gendurable.Config, machines ...gendurable.Definition) *testBundle {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: tracer})
	return bundleOn(t, pool, schema, cfg, machines...)
}

// keepBusy inserts a job every 5 ms until the returned func is called, and
// waits 1.5 s first: the queue's picks come back short, so its pick floor is
// set and follows now() (docs/design.md §4).
func keepBusy(b *testBundle, job *gendurable.Job[orderArgs]) (stop func()) {
	done, producing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(producing)
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := b.eng.Insert(context.Background(), job.New(orderArgs{I: 0})); err != nil {
				b.t.Error(err)
				return
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	return func() { close(done); <-producing }
}
