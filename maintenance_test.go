package gendurable_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// TestAwaitTimeoutIntervalKnob: the await-timeout sweep follows
// ReaperInterval unless AwaitTimeoutInterval is set — off with a negative
// ReaperInterval, as before the knob existed — and AwaitTimeoutInterval
// runs or stops it on its own. The deadline is written behind the engine's
// back (as by another process), so only the sweep's own timer can find it.
func TestAwaitTimeoutIntervalKnob(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	for _, c := range []struct {
		name          string
		reaper, sweep time.Duration
		wakes         bool
		sweepInConfig time.Duration
	}{
		{"follows a disabled reaper", -1, 0, false, 0},
		{"disabled alone", 50 * time.Millisecond, -1, false, -1},
		{"runs alone", -1, 50 * time.Millisecond, true, 50 * time.Millisecond},
	} {
		eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, ReaperInterval: c.reaper,
			AwaitTimeoutInterval: c.sweep, Logger: testLogger(t)})
		require.NoError(t, err)
		require.Equal(t, c.sweepInConfig, eng.Config().AwaitTimeoutInterval, c.name)
		require.NoError(t, eng.Start(context.Background()))
		b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, awaits, await_deadline)
			VALUES ('m', 'a', 'awaiting_signal', '{go}', now() + interval '100 milliseconds')`)
		due := func() bool {
			return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_signal'`) == 0
		}
		if c.wakes {
			eventually(t, 3*time.Second, due, "%s: await not woken", c.name)
		} else {
			time.Sleep(400 * time.Millisecond)
			require.False(t, due(), "%s: await woken with no sweep", c.name)
		}
		require.NoError(t, eng.Stop(context.Background()))
		b.exec(`DELETE FROM {{s}}.gendurable_instances`)
	}
}

// cutOffEngine starts an engine on b's schema (insert-only unless cfg has
// queues) whose pool of two connections reaches the database only through
// a proxy that can cut it off; both end with the test. An insert-only
// engine's reaper sends one statement at a time: on one connection, and on
// the second once it abandoned one on a dead connection (pgx keeps the
// dead one's place in the pool for up to 15 s while it closes it).
func cutOffEngine(t *testing.T, b *testBundle, cfg *gendurable.Config) (*gendurable.Engine, *dbtest.CutProxy) {
	t.Helper()
	pool, proxy := timedCutOffPool(t, 2)
	cfg.Schema, cfg.Logger = b.schema, testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	t.Cleanup(func() {
		proxy.Close() // the engine's sockets end: nothing waits on the cut
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
		pool.Close()
	})
	return eng, proxy
}

// TestMaintenanceTimeoutDefault: the maintenance statements' deadline is
// max(LeaseDuration, 30s) unless set; a negative one is refused.
func TestMaintenanceTimeoutDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	for _, c := range []struct {
		lease, set, want time.Duration
	}{
		{0, 0, gendurable.DefaultLeaseDuration},
		{time.Second, 0, 30 * time.Second},
		{2 * time.Minute, 0, 2 * time.Minute},
		{time.Second, 5 * time.Second, 5 * time.Second},
	} {
		eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, LeaseDuration: c.lease, MaintenanceTimeout: c.set})
		require.NoError(t, err)
		require.Equal(t, c.want, eng.Config().MaintenanceTimeout, "lease %s, set %s", c.lease, c.set)
	}
	_, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, MaintenanceTimeout: -time.Second})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
}

// TestMaintenanceTimeoutUnderASecondRefused: New refuses a
// MaintenanceTimeout under a second. A Duration of 30 is 30 ns (its unit
// forgotten): every maintenance statement was abandoned at that deadline,
// its connection closed, sweep after sweep — no expired lease reaped, no
// await timeout fired, no periodic slot inserted, only warnings logged. A
// second is the least accepted, and with it an expired lease is reaped.
func TestMaintenanceTimeoutUnderASecondRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	for _, d := range []time.Duration{30, time.Millisecond, time.Second - 1} {
		_, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, MaintenanceTimeout: d})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "MaintenanceTimeout %s", d)
	}
	eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, MaintenanceTimeout: time.Second, Logger: testLogger(t)})
	require.NoError(t, err)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, lease_expires_at, claim_token, max_attempts)
		VALUES ('m', 'a', 'executing', now() - interval '1 second', 7, 5)`)
	n, err := eng.Reap(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// TestPruneUnderTheLongestMaintenanceTimeout: a MaintenanceTimeout so long
// that 10 × it (a prune batch's deadline) is past the longest Duration —
// math.MaxInt64 set to mean "no deadline" — gives a prune batch the longest deadline. 10 × it wrapped
// around to a negative deadline before, which failed every batch at once:
// nothing was ever pruned.
func TestPruneUnderTheLongestMaintenanceTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	for _, cfg := range []*gendurable.Config{
		{MaintenanceTimeout: math.MaxInt64},
		{MaintenanceTimeout: 30 * 365 * 24 * time.Hour},
		{LeaseDuration: gendurable.MaxLeaseDuration, MaintenanceTimeout: math.MaxInt64},
	} {
		cfg.Schema, cfg.Logger = b.schema, testLogger(t)
		eng, err := gendurable.New(b.pool, cfg)
		require.NoError(t, err)
		b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at)
			VALUES ('m', 'a', 'done', now() - interval '1 hour')`)
		n, err := eng.Prune(context.Background(), time.Minute, nil)
		require.NoError(t, err, "MaintenanceTimeout %s", eng.Config().MaintenanceTimeout)
		require.EqualValues(t, 1, n)
	}
}

// TestReaperOfAnEngineCutOffRecovers: an engine's one pool connection is
// stranded — nothing crosses it any more, nothing is closed, as when a NAT
// or proxy forgets it — while its reaper sweeps every 100 ms. The reap
// statement sent on it is abandoned at Config.MaintenanceTimeout (1 s here)
// and the next sweep, on a fresh connection, recovers a lease that expired
// after the strand: within MaintenanceTimeout + ReaperInterval. Without the
// deadline the reaper waited on the dead connection for as long as the
// OS's TCP keepalive allows.
func TestReaperOfAnEngineCutOffRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	var reapErr atomic.Pointer[gendurable.ReapEvent] // one with Err: the abandoned statement is seen by hooks
	_, proxy := cutOffEngine(t, b, &gendurable.Config{LeaseDuration: time.Second, HeartbeatInterval: 300 * time.Millisecond,
		ReaperInterval: 100 * time.Millisecond, AwaitTimeoutInterval: -1, MaintenanceTimeout: time.Second,
		Hooks: []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
			if r, ok := ev.(*gendurable.ReapEvent); ok && r.Err != nil {
				reapErr.CompareAndSwap(nil, r)
			}
		})}})
	expired := func() int64 {
		var id int64
		require.NoError(t, b.pool.QueryRow(context.Background(), `INSERT INTO `+b.schema+`.gendurable_instances
			(fsm, step, status, lease_expires_at, claim_token, max_attempts)
			VALUES ('m', 'a', 'executing', now() - interval '1 second', 7, 5) RETURNING id`).Scan(&id))
		return id
	}
	runnable := func(id int64) func() bool {
		return func() bool {
			return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND status = 'runnable'`, id) == 1
		}
	}
	eventually(t, 5*time.Second, runnable(expired()), "lease expired before the strand not reaped")

	proxy.Strand()
	stranded := time.Now()
	eventually(t, 10*time.Second, runnable(expired()), "lease expired after the strand not reaped")
	took := time.Since(stranded)
	t.Logf("reaped %s after the strand", took.Round(time.Millisecond))
	require.Less(t, took, time.Second+100*time.Millisecond+2*time.Second, "about MaintenanceTimeout + ReaperInterval")
	require.Greater(t, took, 500*time.Millisecond, "the statement on the stranded connection did not wait for its deadline")
	ev := reapErr.Load()
	require.NotNil(t, ev, "the abandoned reap statement came to the hooks as a ReapEvent with Err")
	require.ErrorContains(t, ev.Err, "no reply within 1s")
	require.Zero(t, ev.Count)
}

// TestStopWithMaintenanceCutOff: an engine's network is cut (nothing
// crosses, nothing is closed) while its reaper and await-timeout sweep
// send a statement every 100 ms, with a MaintenanceTimeout (30 s) far
// longer than the test, and with transitions its steps took not yet merged
// into the stored graph. Stop returns within its context (1 s): it cancels
// the statements in flight (pgx interrupts the read at once), and the last
// merge of the transitions, which waits on the cut, ends with Stop's
// context. It ended after its own 5 s before.
func TestStopWithMaintenanceCutOff(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "stopcut", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, PollInterval: 20 * time.Millisecond}}
	eng, proxy := cutOffEngine(t, b, cfg)
	b.waitStatus(b.insert(job.New(orderArgs{})), "done", 10*time.Second) // a transition to merge on Stop
	proxy.Cut()
	time.Sleep(500 * time.Millisecond) // the next sweeps are sent, and wait
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := eng.Stop(ctx)
	took := time.Since(start)
	t.Logf("Stop took %s with the network cut: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 1500*time.Millisecond)
}
