//go:build chaos

package chaos_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
	"github.com/gendurable/gendurable/internal/pgtemp"
)

// startSkewedServer starts a private PostgreSQL whose clock runs skew
// ahead of the real one (an LD_PRELOAD shim), so that every worker's clock
// is off by -skew from the database's.
func startSkewedServer(t *testing.T, shim string, skew time.Duration) *pgtemp.Server {
	t.Helper()
	return startPrivateServer(t, "LD_PRELOAD="+shim, "CHAOS_CLOCK_SKEW_SEC="+strconv.Itoa(int(skew.Seconds())))
}

// TestChaos07Clock: lease and eligibility decisions use the database clock
// only. The database runs an hour ahead of the workers, then an hour
// behind (a clock-skew shim preloaded into a private PostgreSQL: the same
// as workers whose clocks are an hour off). RunIn, durable sleeps and await
// timeouts must wait their time on the database clock (never early, not
// an hour late), a step longer than its lease must not be reaped while its
// worker heartbeats, and a killed worker's leases must be reaped no earlier
// than lease − heartbeat after the kill.
func TestChaos07Clock(t *testing.T) {
	t.Parallel() // with the other light scenarios (stall, poison, connection limits)
	shimDir := filepath.Join(os.TempDir(), "gendurable-chaos", fmt.Sprintf("shim-%d", os.Getpid()))
	shim, err := chaos.BuildSkewShim(shimDir)
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(shimDir) }) // after the subtests; the servers keep the loaded library
	skews := []time.Duration{time.Hour, -time.Hour}
	servers := make([]*pgtemp.Server, len(skews))
	for i, s := range skews {
		servers[i] = startSkewedServer(t, shim, s)
	}
	for i, skew := range skews {
		srv := servers[i]
		t.Run(fmt.Sprintf("db%+dh", int(skew.Hours())), func(t *testing.T) {
			t.Parallel()
			clockScenario(t, srv, skew)
		})
	}
}

func clockScenario(t *testing.T, srv *pgtemp.Server, skew time.Duration) {
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, srv.URL(), "clock")
	fleet := newFleet(t)
	c := &criteria{t: t}

	dbNow, err := env.Now(ctx)
	must(t, err)
	measured := time.Until(dbNow)
	if d := measured - skew; d < -time.Minute || d > time.Minute {
		t.Fatalf("the database clock is %s off the workers', want %s: the skew shim did not take", measured.Round(time.Second), skew)
	}

	delay := 2 * time.Second
	hangCfg := env.Worker("w2")
	hangCfg.Knobs = chaos.Knobs{Hang: true, ClockSleep: delay, LongStep: 6 * time.Second}
	hangCfg.ReaperMs = -1 // the other worker reaps
	hang, err := fleet.Start(hangCfg, 30*time.Second)
	must(t, err)
	_, err = env.Insert(ctx, "clock_hang", repeat(10, func() gendurable.InsertParams { return env.M.ClockHang.New(chaos.LeafState{}) }))
	must(t, err)
	// Let the doomed worker claim and start them before anyone else runs.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_effects WHERE pid = $1`, hang.PID)
		must(t, err)
		if n > 0 || time.Now().After(deadline) {
			c.check(n > 0, "the hanging worker never started a step")
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cfg := env.Worker("w1")
	cfg.Knobs = chaos.Knobs{ClockSleep: delay, LongStep: 6 * time.Second}
	_, err = fleet.Start(cfg, 30*time.Second)
	must(t, err)
	lease := time.Duration(cfg.LeaseMs) * time.Millisecond
	beat := time.Duration(cfg.HeartbeatMs) * time.Millisecond
	reaper := time.Duration(cfg.ReaperMs) * time.Millisecond

	var ps []gendurable.InsertParams
	for i := 0; i < 20; i++ {
		ps = append(ps, env.M.Leaf.New(chaos.LeafState{}).With(gendurable.InsertOpts{RunIn: delay}),
			env.M.ClockSleep.New(chaos.LeafState{}), env.M.ClockAwait.New(chaos.LeafState{}))
	}
	for i := 0; i < 3; i++ {
		ps = append(ps, env.M.ClockLong.New(chaos.LeafState{}))
	}
	_, err = env.Insert(ctx, "clock", ps)
	must(t, err)

	time.Sleep(1500 * time.Millisecond)
	_, killedAt, err := env.Fault(ctx, "kill", hang)
	must(t, err)
	hang.Kill()

	_, live, err := env.WaitTerminal(ctx, time.Now().Add(60*time.Second))
	must(t, err)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live", live)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)

	// Waits, all on the database clock: from the insert (RunIn) or from the
	// now() of the transaction that committed the sleep or the park, to the
	// next step's start.
	type span struct{ min, max time.Duration }
	waits := map[string]*span{}
	rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `
		SELECT 'run_in', i.inserted_at, e.started FROM {{s}}.gendurable_instances i
		  JOIN {{s}}.chaos_effects e ON e.instance = i.id AND e.seq = 0
		  WHERE i.fsm = 'leaf'
		UNION ALL
		SELECT i.fsm, o.tx_start, e.started FROM {{s}}.gendurable_instances i
		  JOIN {{s}}.chaos_oracle o ON o.instance = i.id AND o.seq = 0
		  JOIN {{s}}.chaos_effects e ON e.instance = i.id AND e.seq = 1
		  WHERE i.fsm IN ('clock_sleep', 'clock_await')`))
	must(t, err)
	for rows.Next() {
		var kind string
		var from, to time.Time
		must(t, rows.Scan(&kind, &from, &to))
		d := to.Sub(from)
		s := waits[kind]
		if s == nil {
			s = &span{d, d}
			waits[kind] = s
		}
		s.min, s.max = min(s.min, d), max(s.max, d)
	}
	rows.Close()
	for _, kind := range []string{"run_in", "clock_sleep", "clock_await"} {
		s := waits[kind]
		if s == nil {
			c.check(false, "%s: no measurement", kind)
			continue
		}
		c.check(s.min >= delay, "%s ran early: %s after its %s wait began (database clock)", kind, s.min.Round(time.Millisecond), delay)
		c.check(s.max <= delay+3*time.Second, "%s ran late: %s after its %s wait began", kind, s.max.Round(time.Millisecond), delay)
	}
	awaitedEmpty, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'clock_await' AND (result->>'awaited')::int = 0`)
	must(t, err)
	c.check(awaitedEmpty == 20, "%d of 20 timed-out awaits saw an empty Awaited", awaitedEmpty)

	// The long step outlived its lease three times over, heartbeated: never reaped.
	var longReaped, longRuns int
	must(t, env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT
		(SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'clock_long' AND (attempt > 0 OR errors <> '[]')),
		(SELECT count(*) FROM {{s}}.chaos_effects WHERE fsm = 'clock_long' AND seq = 0)`)).Scan(&longReaped, &longRuns))
	c.check(longReaped == 0 && longRuns == 3, "steps longer than the lease (heartbeated): %d reaped, %d runs of 3", longReaped, longRuns)

	// The killed worker's leases: reaped after its last heartbeat + lease, not before.
	var reaped int
	var firstReap, lastReap *time.Time
	must(t, env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT count(*), min((e->>'at')::timestamptz), max((e->>'at')::timestamptz)
		FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
		WHERE i.fsm = 'clock_hang' AND e->>'kind' = 'lease_expired'`)).Scan(&reaped, &firstReap, &lastReap))
	c.check(reaped > 0, "no lease of the killed worker was reaped")
	earliest := lease - beat - 50*time.Millisecond
	latest := lease + reaper + 2*time.Second
	var reapMin, reapMax time.Duration
	if firstReap != nil {
		reapMin, reapMax = firstReap.Sub(killedAt), lastReap.Sub(killedAt)
		c.check(reapMin >= earliest, "a killed worker's lease was reaped %s after the kill, before lease − heartbeat (%s): early", reapMin.Round(time.Millisecond), earliest)
		c.check(reapMax <= latest, "a killed worker's lease was reaped %s after the kill (expected within %s)", reapMax.Round(time.Millisecond), latest)
	}
	w := func(k string) string {
		if s := waits[k]; s != nil {
			return fmt.Sprintf("%s–%s", s.min.Round(10*time.Millisecond), s.max.Round(10*time.Millisecond))
		}
		return "?"
	}
	summary(t, r.Line(fmt.Sprintf("clock (database %+dh from the workers)", int(skew.Hours())), "")+
		fmt.Sprintf(", measured skew %s; waits of %s on the database clock: RunIn %s, durable sleep %s, await timeout %s (never early); "+
			"steps 3× their lease: %d reaped; killed worker's %d leases reaped %s–%s after the kill (lease %s, heartbeat %s: never early); %s",
			measured.Round(time.Second), delay, w("run_in"), w("clock_sleep"), w("clock_await"), longReaped, reaped,
			reapMin.Round(10*time.Millisecond), reapMax.Round(10*time.Millisecond), lease, beat, r.Invariants()))
	c.done()
}

func repeat(n int, f func() gendurable.InsertParams) []gendurable.InsertParams {
	out := make([]gendurable.InsertParams, n)
	for i := range out {
		out[i] = f()
	}
	return out
}
