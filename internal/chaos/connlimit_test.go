//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// sampleConns counts the backends of one worker (by application_name) every
// 10 ms until ctx is done and returns the largest count seen and how many
// samples were taken.
func sampleConns(ctx context.Context, env *chaos.Env, app string) (maxSeen *int, samples *int, wait func()) {
	maxSeen, samples = new(int), new(int)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var n int
			if env.Admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n) == nil {
				*samples++
				*maxSeen = max(*maxSeen, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return maxSeen, samples, wg.Wait
}

// TestChaos09ConnectionLimits: a worker with a pool of 6 connections and a
// concurrency of 16 (then a pool of 2 and a concurrency of 8) runs only
// partitioned steps (every key distinct, so all of them could run at once),
// whose own code also uses the pool (a keyed step holds no connection of
// its own since keys are leases; its side-effect writes, its outcome
// transaction and the engine's statements compete for the pool). The
// engine must never open more connections than the pool allows, must keep
// going (degrade, not deadlock: commits in every 2 s window), and must say
// so.
func TestChaos09ConnectionLimits(t *testing.T) {
	t.Parallel() // with the other light scenarios (stall, poison, clock)
	for _, pc := range []struct{ pool, conc int }{{6, 16}, {2, 8}} {
		t.Run(fmt.Sprintf("pool%d", pc.pool), func(t *testing.T) {
			t.Parallel() // separate schemas and workers
			connLimits(t, pc.pool, pc.conc)
		})
	}
}

func connLimits(t *testing.T, pool, conc int) {
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "conns")
	fleet := newFleet(t)
	n := pick(300, 4000) * min(pool, 6) / 6
	cfg := env.Worker("w1")
	cfg.Concurrency, cfg.MaxConns = conc, pool
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = env.M.Leaf.New(chaos.LeafState{SleepMs: 30}).With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("conn-%d", i)})
	}
	_, err := env.Insert(ctx, "leaf", ps)
	must(t, err)

	sctx, stopSampling := context.WithCancel(ctx)
	maxSeen, samples, waitSampler := sampleConns(sctx, env, chaos.AppName(env.Schema, "w1"))
	start := time.Now()
	proc, err := fleet.Start(cfg, 30*time.Second)
	must(t, err)
	_, live, err := env.WaitTerminal(ctx, time.Now().Add(pick(60*time.Second, 300*time.Second)))
	must(t, err)
	took := time.Since(start)
	stopSampling()
	waitSampler()
	_, stopErr := proc.Term(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)
	// Progress: the longest gap between two commits.
	var gap time.Duration
	must(t, env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT coalesce(max(d), interval '0') FROM
		(SELECT ended - lag(ended) OVER (ORDER BY ended) AS d FROM {{s}}.chaos_oracle) x`)).Scan(&gap))
	reports := append(proc.Stderr("pool size"), proc.Stderr("no connection")...)

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live after %s: the exhausted pool deadlocked", live, took.Round(time.Second))
	c.check(*maxSeen <= cfg.MaxConns, "the worker held %d connections at once, over its pool's %d", *maxSeen, cfg.MaxConns)
	// The sampler must have watched the whole run: a sample every 50 ms at
	// least (it takes one every 10 ms plus a query), and never fewer than 10.
	// (With key leases the run is short: 0.8 s at CI size, where the partition
	// locks made it 12 s.)
	c.check(*samples >= max(10, int(took/(50*time.Millisecond))), "only %d connection samples in %s", *samples, took.Round(time.Millisecond))
	c.check(gap < 2*time.Second, "no step committed for %s: stalled", gap.Round(time.Millisecond))
	c.check(len(reports) > 0, "the engine never reported that its pool is too small for its concurrency")
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	rep := "none"
	if len(reports) > 0 {
		rep = reports[0]
		if i := strings.Index(rep, "msg="); i >= 0 {
			rep = rep[i:]
		}
	}
	summary(t, r.Line("conn-limits", fmt.Sprintf("pool of %d, concurrency %d, %d distinct partition keys", cfg.MaxConns, cfg.Concurrency, n))+
		fmt.Sprintf(" (at most %d connections seen in %d samples; all done in %s, %.0f steps/s, longest gap between commits %s; reported: %s; %s)",
			*maxSeen, *samples, took.Round(100*time.Millisecond), float64(r.Committed)/took.Seconds(), gap.Round(time.Millisecond), trunc(rep, 160), r.Invariants()))
	c.done()
}
