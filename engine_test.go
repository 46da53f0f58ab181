package gendurable_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

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

// expireAndReap makes the lease of instance id run out, as if its worker had
// stalled past it, and reaps it with the engine's reaper. The worker's
// heartbeat still runs, though: one that lands between the two statements
// finds the lapsed lease still holding its token (nobody reaped it yet) and
// extends it again, and the reap then finds nothing. So both are repeated
// until the reaper has recovered the row.
func (b *testBundle) expireAndReap(id int64) {
	b.t.Helper()
	eventually(b.t, 10*time.Second, func() bool {
		b.exec(`UPDATE {{s}}.gendurable_instances SET lease_expires_at = now() - interval '1 second'
		        WHERE id = $1 AND status = 'executing'`, id)
		n, err := b.eng.Reap(context.Background())
		require.NoError(b.t, err)
		require.LessOrEqual(b.t, n, 1, "only instance %d is executing", id)
		return n == 1
	}, "instance %d: its lease was never reaped", id)
}

func TestHeartbeatKeepsLongStepAlivePastLease(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{
		Name: "long",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			select {
			case <-time.After(2 * time.Second): // four leases long
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		},
	}
	b := setup(t, nil, job)
	cfg := b.eng.Config()
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 500*time.Millisecond, 150*time.Millisecond, 50*time.Millisecond
	eng, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	b.eng = eng
	b.start()
	id := b.insert(job.New(orderArgs{}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "never reaped")
	require.Empty(t, r.Errors)
}

func TestZombieOutcomeIsFencedOut(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var zombieCtxErr atomic.Value
	// Process A's step stalls and ignores its context, like a stopped process.
	stalled := &gendurable.Job[orderArgs]{
		Name: "fenced",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			close(started)
			<-release
			if cause := context.Cause(ctx); cause != nil {
				zombieCtxErr.Store(cause)
			}
			return nil // a late success: must change nothing
		},
	}
	logA := &eventLog{}
	a := setup(t, nil, stalled)
	cfgA := a.eng.Config()
	cfgA.Hooks = []gendurable.Hook{logA}
	cfgA.ReaperInterval = -1
	cfgA.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 20 * time.Millisecond}}
	cfgA.LeaseDuration, cfgA.HeartbeatInterval = 3*time.Second, 200*time.Millisecond
	engA, err := gendurable.New(a.pool, &cfgA)
	require.NoError(t, err)
	a.eng = engA
	a.start()
	id := a.insert(stalled.New(orderArgs{}))
	<-started

	// The lease runs out (as if A stalled past it) and the reaper recovers it.
	a.expireAndReap(id)

	// Process B runs the step again and finishes the instance.
	healthy := &gendurable.Job[orderArgs]{Name: "fenced", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		require.Equal(t, 1, j.Attempt, "the rerun counts the expired lease")
		return nil
	}}
	engB, err := gendurable.New(a.pool, fastConfig(a.schema, healthy))
	require.NoError(t, err)
	require.NoError(t, engB.Start(context.Background()))
	defer func() { _ = engB.Stop(context.Background()) }()
	done := a.waitStatus(id, "done", 10*time.Second)

	// A's heartbeat notices the lease is gone and cancels its step context.
	eventually(t, 5*time.Second, func() bool {
		_, ok := findEvent(logA, func(e *gendurable.LeaseLostEvent) bool { return e.InstanceID == id })
		return ok
	}, "A never noticed its lease was lost")

	close(release) // the zombie finishes late
	ev := func() *gendurable.StepEvent {
		var ev *gendurable.StepEvent
		eventually(t, 5*time.Second, func() bool {
			var ok bool
			ev, ok = findEvent(logA, func(e *gendurable.StepEvent) bool { return e.InstanceID == id })
			return ok
		}, "zombie step never reported")
		return ev
	}()
	require.True(t, ev.Fenced, "the zombie's outcome was rejected by the fence")
	require.ErrorIs(t, zombieCtxErr.Load().(error), gendurable.ErrLeaseLost)
	after := a.row(id)
	require.Equal(t, done.FinishedAt, after.FinishedAt, "the row is exactly as B left it")
	require.Equal(t, done.Attempt, after.Attempt)
	require.Len(t, after.Errors, 1)
	require.Equal(t, "lease_expired", after.Errors[0]["kind"])
}

// crashy is the machine of the kill -9 test: in the helper process its step
// hangs; in the test process it succeeds, counting Handle calls.
var crashyHandleCalls atomic.Int32

func crashyMachine(hang bool) *gendurable.Machine[orderArgs] {
	return &gendurable.Machine[orderArgs]{
		Name: "crashy", Start: "work",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"work": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				if hang {
					select {} // killed here
				}
				return gendurable.Done(map[string]int{"attempt": r.Attempt}), nil
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[orderArgs], err error) (gendurable.Outcome, error) {
			crashyHandleCalls.Add(1)
			return gendurable.Stop("handle must not be called for a crash"), nil
		},
	}
}

// TestHelperWorkerProcess is not a test: it is the worker process that
// TestReapKilledWorkerProcess starts and kills.
func TestHelperWorkerProcess(t *testing.T) {
	schema := os.Getenv("GENDURABLE_HELPER_SCHEMA")
	if schema == "" {
		t.Skip("helper process only")
	}
	serveHelper(func(*pgxpool.Pool) *gendurable.Config {
		return &gendurable.Config{
			Schema:   schema,
			Machines: []gendurable.Definition{crashyMachine(true)},
			Queues:   map[string]gendurable.QueueConfig{"default": {PollInterval: 20 * time.Millisecond}},
			// A short lease kept alive by heartbeats while this process lives.
			LeaseDuration: time.Second, HeartbeatInterval: 200 * time.Millisecond, ReaperInterval: -1,
		}
	})
}

// serveHelper runs, in a helper process, an engine configured by cfg until
// the process is killed; a failure to start exits with a code of its own.
func serveHelper(cfg func(*pgxpool.Pool) *gendurable.Config) {
	pool, err := pgxpool.New(context.Background(), dbtest.URL())
	if err != nil {
		os.Exit(3)
	}
	eng, err := gendurable.New(pool, cfg(pool))
	if err != nil {
		os.Exit(4)
	}
	if err := eng.Start(context.Background()); err != nil {
		os.Exit(5)
	}
	select {} // until SIGKILL
}

func TestReapKilledWorkerProcess(t *testing.T) {
	t.Parallel()
	m := crashyMachine(false)
	b := setup(t, nil, m)
	id := b.insert(m.New(orderArgs{}))

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$")
	cmd.Env = append(os.Environ(), "GENDURABLE_HELPER_SCHEMA="+b.schema)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		}
	})
	eventually(t, 20*time.Second, func() bool { return b.row(id).Status == "executing" }, "worker never claimed the row")

	// Alive, the worker's heartbeats hold the lease well past its length.
	time.Sleep(2 * time.Second)
	r := b.row(id)
	require.Equal(t, "executing", r.Status)
	require.True(t, r.LeaseExp.After(r.Now), "lease was extended by heartbeats")
	token := *r.Token

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = cmd.Process.Wait()
	killed = true

	// This process reaps the expired lease and runs the step again.
	b.start()
	r = b.waitStatus(id, "done", 15*time.Second)
	require.Equal(t, 1, r.Attempt, "the crash counted one attempt")
	require.JSONEq(t, `{"attempt":1}`, string(r.Result))
	require.Len(t, r.Errors, 1)
	require.Equal(t, "lease_expired", r.Errors[0]["kind"])
	require.Zero(t, crashyHandleCalls.Load(), "a crash is not a handled error")
	require.Nil(t, r.Token)
	require.NotEqual(t, int64(0), token)
}

func TestReaperFailsAfterMaxAttemptsOfExpiredLeases(t *testing.T) {
	t.Parallel()
	m := crashyMachine(false)
	b := setup(t, nil, m)
	res, err := b.eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 2}))
	require.NoError(t, err)
	id := res.ID
	// Two claims whose workers vanished.
	for i := 0; i < 2; i++ {
		b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', claim_token = 99,
		        lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
		n, err := b.eng.Reap(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	r := b.row(id)
	require.Equal(t, "failed", r.Status, "no poison loop: failed after max attempts")
	require.Equal(t, 2, r.Attempt)
	require.Len(t, r.Errors, 2)
	require.Contains(t, r.Errors[1]["error"], "attempts exhausted")
	require.NotNil(t, r.FinishedAt)
}

func TestGracefulDrain(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}, 10), make(chan struct{})
	job := &gendurable.Job[orderArgs]{
		Name: "drain",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			<-release // ignores ctx: finishes within the drain timeout
			return nil
		},
	}
	log := &eventLog{}
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		Hooks:    []gendurable.Hook{log},
		// A long lease: only the drain can hand the prefetched rows back quickly.
		LeaseDuration: time.Minute, HeartbeatInterval: 10 * time.Second, DrainTimeout: 10 * time.Second,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 5, PollInterval: 20 * time.Millisecond}},
	}
	b := setup(t, cfg)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := 0; i < 4; i++ {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Start(ctx))
	<-started
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 4
	}, "prefetch did not claim the rest")

	stopped := make(chan error, 1)
	go func() { stopped <- b.eng.Stop(ctx) }()
	// The three prefetched rows go back at once, while the running one drains.
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		                WHERE status = 'runnable' AND claim_token IS NULL AND attempt = 0`) == 3
	}, "prefetched rows were not released")
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) before the in-flight step finished", err)
	default:
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`))
	ev, ok := findEvent(log, func(*gendurable.DrainEvent) bool { return true })
	require.True(t, ok)
	require.Equal(t, 3, ev.Released)
	require.True(t, ev.Completed)
}

func TestDrainTimeoutCancelsStepsWithoutCountingAnAttempt(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	var cause atomic.Value
	job := &gendurable.Job[orderArgs]{
		Name: "slow",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
			return ctx.Err()
		},
	}
	b := setup(t, nil, job)
	cfg := b.eng.Config()
	cfg.DrainTimeout = 100 * time.Millisecond
	eng, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	id := b.insert(job.New(orderArgs{})) // inserted through b.eng: same registration
	require.NoError(t, eng.Start(context.Background()))
	<-started
	require.NoError(t, eng.Stop(context.Background()))
	require.True(t, errors.Is(cause.Load().(error), gendurable.ErrEngineStopped))
	r := b.row(id)
	require.Equal(t, "runnable", r.Status, "interrupted work runs again")
	require.Equal(t, 0, r.Attempt, "shutdown is not the step's failure")
	require.Equal(t, "interrupted", r.Errors[0]["kind"])
}

func TestUnknownVersionIsReleasedNotRun(t *testing.T) {
	t.Parallel()
	var ranV1, ranV2 atomic.Int32
	mk := func(v int, ran *atomic.Int32) *gendurable.Job[orderArgs] {
		return &gendurable.Job[orderArgs]{Name: "versioned", Version: v, Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			require.Equal(t, v, j.Version)
			ran.Add(1)
			return nil
		}}
	}
	v1, v2 := mk(1, &ranV1), mk(2, &ranV2)
	log := &eventLog{}
	// This worker only knows version 2.
	cfg := fastConfig("", v2)
	cfg.Hooks = []gendurable.Hook{log}
	cfg.UnknownVersionDelay = time.Hour
	b := setup(t, cfg)
	// An older producer inserts a version-1 row.
	producer, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{v1}})
	require.NoError(t, err)
	old, err := producer.Insert(context.Background(), v1.New(orderArgs{}))
	require.NoError(t, err)
	b.start()
	cur := b.insert(v2.New(orderArgs{}))
	b.waitStatus(cur, "done", 10*time.Second)
	eventually(t, 5*time.Second, func() bool {
		_, ok := findEvent(log, func(e *gendurable.UnknownVersionEvent) bool { return e.InstanceID == old.ID && e.Version == 1 })
		return ok
	}, "no unknown-version event")
	r := b.row(old.ID)
	require.Equal(t, "runnable", r.Status, "released, never failed")
	require.Equal(t, 0, r.Attempt)
	require.Empty(t, r.Errors)
	near(t, r.Now.Add(time.Hour), r.EligibleAt, time.Minute)
	require.Zero(t, ranV1.Load())

	// A process that knows both runs each row on its own version.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() WHERE id = $1`, old.ID)
	both, err := gendurable.New(b.pool, fastConfig(b.schema, v1, v2))
	require.NoError(t, err)
	require.NoError(t, b.eng.Stop(context.Background()))
	require.NoError(t, both.Start(context.Background()))
	defer func() { _ = both.Stop(context.Background()) }()
	b.waitStatus(old.ID, "done", 10*time.Second)
	require.Equal(t, int32(1), ranV1.Load())
	require.Equal(t, int32(1), ranV2.Load())
}

func TestStartStopRepeatedly(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("cycle")
	b := setup(t, nil, job)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		require.NoError(t, b.eng.Start(ctx))
		require.ErrorIs(t, b.eng.Start(ctx), gendurable.ErrAlreadyStarted)
		id := b.insert(job.New(orderArgs{I: i}))
		b.waitStatus(id, "done", 10*time.Second)
		require.NoError(t, b.eng.Stop(ctx))
		require.NoError(t, b.eng.Stop(ctx), "Stop is idempotent")
	}
	require.Len(t, rec.order(), 10)
}

// TestZombieReturnDoesNotDropTheNewClaim: the same process claims an
// instance again after its first run's lease was reaped; when the stale run
// finally returns, the new run must keep its heartbeat (and so its lease).
func TestZombieReturnDoesNotDropTheNewClaim(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	firstStarted, releaseFirst, secondStarted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	job := &gendurable.Job[orderArgs]{
		Name: "rerun",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			switch runs.Add(1) {
			case 1:
				close(firstStarted)
				<-releaseFirst // a stall that ignores the context
				return nil
			default:
				close(secondStarted)
				time.Sleep(2500 * time.Millisecond) // several leases long
				return nil
			}
		},
	}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 200*time.Millisecond, -1
	b := setup(t, cfg)
	b.start()
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(releaseFirst) }) }) // before the engine stops
	id := b.insert(job.New(orderArgs{}))
	<-firstStarted
	b.expireAndReap(id)
	select {
	case <-secondStarted:
	case <-time.After(10 * time.Second):
		t.Fatalf("instance %d was reaped but never ran again: %+v", id, b.row(id))
	}
	release.Do(func() { close(releaseFirst) }) // the zombie returns while the second run is in flight

	// Reap often while the second run lasts: its lease must stay alive.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		_, err := b.eng.Reap(context.Background())
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
	}
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 1, r.Attempt, "reaped once (the stall), never the live second run")
	require.Equal(t, int32(2), runs.Load())
}

// TestNoFalseLeaseLossWhileOutcomesCommit: a heartbeat that runs while an
// outcome commits no longer finds the claim (the row just finished). That
// is no lost lease: nothing may be reported or cancelled. With no reaper
// and no other process, no lease can really be lost here.
func TestNoFalseLeaseLossWhileOutcomesCommit(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "quick", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	var lost atomic.Int64
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 3*time.Second, 5*time.Millisecond, -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 16, PollInterval: 10 * time.Millisecond}}
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		if _, ok := ev.(*gendurable.LeaseLostEvent); ok {
			lost.Add(1)
		}
	})}
	b := setup(t, cfg)
	ps := make([]gendurable.InsertParams, 3000)
	for i := range ps {
		ps[i] = job.New(orderArgs{})
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	b.start()
	eventually(t, 60*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) == len(ps)
	}, "all jobs done")
	require.Zero(t, lost.Load(), "lease-lost events with no reaper and no other process")
}

// pausedMachine records each start of its step (instance, attempt, and the
// time it was entered, before any wait for a connection) in table starts,
// then works for 300ms.
func pausedMachine(pool *pgxpool.Pool, schema string) *gendurable.Machine[orderArgs] {
	return &gendurable.Machine[orderArgs]{
		Name: "paused", Start: "work",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"work": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				entered := time.Now()
				if pool != nil {
					if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".starts VALUES ($1, $2, $3)", r.ID, r.Attempt, entered); err != nil {
						return gendurable.Outcome{}, err
					}
				}
				time.Sleep(300 * time.Millisecond)
				return gendurable.Done(nil), nil
			},
		},
	}
}

// TestHelperPausedWorkerProcess is not a test: it is the worker process
// that TestPausedWorkerStartsNoReapedClaim stops and continues.
func TestHelperPausedWorkerProcess(t *testing.T) {
	schema := os.Getenv("GENDURABLE_PAUSE_SCHEMA")
	if schema == "" {
		t.Skip("helper process only")
	}
	serveHelper(func(pool *pgxpool.Pool) *gendurable.Config {
		return &gendurable.Config{
			Schema:        schema,
			Machines:      []gendurable.Definition{pausedMachine(pool, schema)},
			Queues:        map[string]gendurable.QueueConfig{"default": {Concurrency: 3, Prefetch: 10, PollInterval: 20 * time.Millisecond}},
			LeaseDuration: 1500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond, ReaperInterval: -1,
		}
	})
}

// TestPausedWorkerStartsNoReapedClaim: a worker holding prefetched claims
// is paused (SIGSTOP) past its lease; meanwhile the claims are reaped. When
// it continues, it must not start any of them before a heartbeat has told
// it which are still its own: they may already run elsewhere.
func TestPausedWorkerStartsNoReapedClaim(t *testing.T) {
	t.Parallel()
	m := pausedMachine(nil, "") // this process only inserts and reaps
	b := setup(t, nil, m)
	b.exec(`CREATE TABLE {{s}}.starts (id bigint, attempt int, at timestamptz)`)
	for range 10 {
		b.insert(m.New(orderArgs{}))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPausedWorkerProcess$")
	cmd.Env = append(os.Environ(), "GENDURABLE_PAUSE_SCHEMA="+b.schema)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.starts`) >= 1 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) >= 5
	}, "the worker never ran a step with claims prefetched")

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(2500 * time.Millisecond) // past the lease
	reaped, err := b.eng.Reap(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, reaped, 5, "the paused worker's claims were reaped")
	continued := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(1500 * time.Millisecond)

	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.starts WHERE attempt = 0 AND at > $1`, continued),
		"after the pause the worker started steps of claims that had been reaped meanwhile")
}
