//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
	"github.com/gendurable/gendurable/internal/pgbouncer"
)

// bouncerFlows builds n top-level flows: every one awaits a "go" signal, a
// third fan out to two leaf children whose partition keys are drawn from 8
// (the checker counts overlapping runs of a key).
func bouncerFlows(env *chaos.Env, n, offset int) []gendurable.InsertParams {
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		s := chaos.FlowState{Await: true, SleepMs: 20}
		if (i+offset)%3 == 0 {
			s.Kids, s.Depth, s.KidKeys = 2, 1, 8
		}
		ps[i] = env.M.Flow.New(s)
	}
	return ps
}

// TestChaos11PgBouncer: 3 worker processes reach the database only through
// a PgBouncer in transaction pooling mode (8 server sessions for up to
// 3 × 8 client connections; pgx's exec mode set in the URL,
// default_query_exec_mode=cache_describe), while flows arrive in waves (each awaits a
// "go" signal, a third fan out to 2 keyed children; every step commits its
// outcome with WithTx). Every 2 s a fault: a random worker is SIGKILLed and
// restarted, or (every third fault) the pooler's server sessions are
// terminated under it. The same criteria as the worker kill storm, and the
// workers never held more server sessions than the pooler's pool.
//
// Keyed instances are in the mix (the fan-out's children): a key's slot is
// its executing row and the pick's per-key lock is transaction-scoped, so
// transaction pooling keeps them; 0 partition overlaps is among the criteria.
func TestChaos11PgBouncer(t *testing.T) {
	ctx := bg(t, 10*time.Minute)
	const poolSize = 8
	b := pgbouncer.StartWith(t, chaos.DefaultURL(), pgbouncer.Options{PoolSize: poolSize})
	u, err := url.Parse(b.URL)
	must(t, err)
	q := u.Query()
	q.Set("default_query_exec_mode", "cache_describe")
	u.RawQuery = q.Encode()
	env := newEnv(t, chaos.DefaultURL(), "bouncer") // the harness itself connects directly
	fleet := newFleet(t)
	const workers, conc = 3, 8
	storm := pick(8*time.Second, 60*time.Second)
	initial, wave := pick(300, 1000), pick(20, 20)

	// The workers' server sessions, sampled: never more than the pool, as
	// held for a second. A backend PgBouncer closed (its client was killed
	// mid-transaction, or it was terminated) stays in pg_stat_activity until
	// its process has exited, while PgBouncer already opens its
	// replacement: single samples saw 9 and 10 for a pool of 8 that way.
	// What the check is for — workers reaching the server past the pooler,
	// 8 sessions each — would hold for every sample of a second.
	const hold = time.Second
	sctx, stopSampling := context.WithCancel(ctx)
	var maxSessions, maxSeen, samples int
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		type sample struct {
			at time.Time
			n  int
		}
		var recent []sample
		for sctx.Err() == nil {
			var n int
			if env.Admin.QueryRow(sctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`,
				chaos.AppName(env.Schema, "w")+"%").Scan(&n) == nil {
				now := time.Now()
				samples++
				maxSeen = max(maxSeen, n)
				recent = append(recent, sample{now, n})
				for len(recent) > 0 && now.Sub(recent[0].at) > hold {
					recent = recent[1:]
				}
				if now.Sub(recent[0].at) >= hold*9/10 { // the window spans about a second
					held := n
					for _, r := range recent {
						held = min(held, r.n)
					}
					maxSessions = max(maxSessions, held)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	cfgs := map[string]chaos.WorkerConfig{}
	for i := 1; i <= workers; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.URL = u.String()
		cfg.Concurrency, cfg.MaxConns = conc, 8
		cfgs[cfg.Name] = cfg
		_, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
	}
	sig := startGoSignaller(ctx, env)
	inserted := 0
	ids, err := env.Insert(ctx, "flow", bouncerFlows(env, initial, 0))
	must(t, err)
	inserted += len(ids)
	sig.send(ids)

	kills, terms, terminated := 0, 0, 0
	var lastFault time.Time
	start := time.Now()
	faultTick := time.NewTicker(2 * time.Second)
	waveTick := time.NewTicker(500 * time.Millisecond)
	for time.Since(start) < storm {
		select {
		case <-faultTick.C:
			if (kills+terms)%3 == 2 {
				_, _, err := env.Fault(ctx, "terminate", nil)
				must(t, err)
				n, err := env.TerminateWorkers(ctx)
				must(t, err)
				terms++
				terminated += n
			} else {
				killAndRestart(ctx, t, env, fleet, cfgs)
				kills++
			}
			lastFault = time.Now()
		case <-waveTick.C:
			ids, err := env.Insert(ctx, "flow", bouncerFlows(env, wave, inserted))
			must(t, err)
			inserted += len(ids)
			sig.send(ids)
		}
	}
	faultTick.Stop()
	waveTick.Stop()
	sig.close()

	cfg := cfgs["w1"]
	bound := time.Duration(cfg.LeaseMs+cfg.ReaperMs)*time.Millisecond + 60*time.Second
	_, live, err := env.WaitTerminal(ctx, lastFault.Add(bound))
	must(t, err)
	afterFault := time.Since(lastFault)
	_, stopErr := fleet.TermAll(30 * time.Second)
	stopSampling()
	sampling.Wait()
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live %s after the last fault (bound %s)", live, afterFault.Round(time.Millisecond), bound)
	// A kill reruns at most the victim's running steps; a termination at
	// most every worker's.
	dupBound := kills*conc + terms*workers*conc
	c.check(r.Duplicates <= dupBound, "%d duplicate step runs > %d (kills × concurrency + terminations × workers × concurrency)", r.Duplicates, dupBound)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	c.check(sig.errs.Load() == 0, "%d signals could not be sent", sig.errs.Load())
	c.check(samples > 0 && maxSessions <= poolSize, "%d server sessions of the workers held for a second (pool %d; %d samples)", maxSessions, poolSize, samples)
	summary(t, r.Line("pgbouncer", fmt.Sprintf("%d kills, %d terminations (%d server sessions)", kills, terms, terminated))+
		fmt.Sprintf(" (%d top-level + %d children, %d processes × %d steps through PgBouncer pool_mode=transaction, default_pool_size %d: at most %d server sessions held for a second (%d in a single sample, some exiting) in %d samples; %d signals sent of which %d dedup no-ops; all terminal %s after the last fault, bound %s; %s)",
			r.TopLevel, r.Instances-r.TopLevel, workers, conc, poolSize, maxSessions, maxSeen, samples, sig.sent.Load(), sig.dups.Load(),
			afterFault.Round(100*time.Millisecond), bound, r.Invariants()))
	c.done()
}
