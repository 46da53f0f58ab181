//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// flowMix builds n top-level flows: every one awaits a "go" signal, a third
// fan out to two leaf children (partitioned over 16 keys), a quarter carry a
// partition key of their own (20 keys).
func flowMix(env *chaos.Env, n, offset, sleepMs int) []gendurable.InsertParams {
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		k := i + offset
		s := chaos.FlowState{Await: true, SleepMs: sleepMs}
		if k%3 == 0 {
			s.Kids, s.Depth, s.KidKeys = 2, 1, 16
		}
		p := env.M.Flow.New(s)
		if k%4 == 0 {
			p = p.With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("top-%d", (k/4)%20)})
		}
		ps[i] = p
	}
	return ps
}

// goSignaller sends each id its "go" signal at a random moment within
// 300 ms of being handed it (a third of them twice, with the same dedup
// key), at most 16 at a time, retrying through database trouble.
type goSignaller struct {
	ctx  context.Context
	env  *chaos.Env
	sem  chan struct{}
	wg   sync.WaitGroup
	sent atomic.Int64
	dups atomic.Int64
	errs atomic.Int64
}

func startGoSignaller(ctx context.Context, env *chaos.Env) *goSignaller {
	return &goSignaller{ctx: ctx, env: env, sem: make(chan struct{}, 16)}
}

func (s *goSignaller) send(ids []int64) {
	for _, id := range ids {
		s.wg.Add(1)
		time.AfterFunc(time.Duration(rand.IntN(300))*time.Millisecond, func() {
			defer s.wg.Done()
			s.sem <- struct{}{}
			defer func() { <-s.sem }()
			times := 1
			if rand.IntN(3) == 0 {
				times = 2
			}
			for range times {
				err := chaos.Retry(s.ctx, func(ctx context.Context) error {
					r, err := s.env.Eng.Signal(ctx, id, "go", map[string]int64{"id": id}, &gendurable.SignalOpts{DedupKey: "go"})
					if err == nil && r.Duplicate {
						s.dups.Add(1)
					}
					return err
				})
				if err != nil {
					s.errs.Add(1)
				} else {
					s.sent.Add(1)
				}
			}
		})
	}
}

func (s *goSignaller) close() { s.wg.Wait() }

// TestChaos01WorkerKill: 4 worker processes; every 2 s a random one is
// SIGKILLed and restarted, while 3-step flows (signals, children, partition
// keys) are inserted in waves. All instances must end terminal within lease
// + reaper interval + 60 s of the last kill, none lost, exactly one
// committed outcome per (instance, seq), duplicate side effects at most
// kills × per-process concurrency.
func TestChaos01WorkerKill(t *testing.T) {
	ctx := bg(t, 15*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "kill")
	fleet := newFleet(t)
	const workers, conc = 4, 8
	storm := pick(8*time.Second, 90*time.Second)
	initial, wave := pick(500, 1500), pick(30, 20) // full: a load the 2-core box sustains under kills

	cfgs := map[string]chaos.WorkerConfig{}
	for i := 1; i <= workers; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.Concurrency, cfg.MaxConns = conc, 8 // 4 × 8 + the harness's 6: within the 40 connections make test may use
		cfgs[cfg.Name] = cfg
		_, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
	}
	sig := startGoSignaller(ctx, env)
	inserted := 0
	ids, err := env.Insert(ctx, "flow", flowMix(env, initial, 0, 20))
	must(t, err)
	inserted += len(ids)
	sig.send(ids)

	kills := 0
	var lastKill time.Time
	start := time.Now()
	killTick := time.NewTicker(2 * time.Second)
	waveTick := time.NewTicker(500 * time.Millisecond)
	for time.Since(start) < storm {
		select {
		case <-killTick.C:
			killAndRestart(ctx, t, env, fleet, cfgs)
			kills++
			lastKill = time.Now()
		case <-waveTick.C:
			ids, err := env.Insert(ctx, "flow", flowMix(env, wave, inserted, 20))
			must(t, err)
			inserted += len(ids)
			sig.send(ids)
		}
	}
	killTick.Stop()
	waveTick.Stop()
	sig.close()

	cfg := cfgs["w1"]
	bound := time.Duration(cfg.LeaseMs+cfg.ReaperMs)*time.Millisecond + 60*time.Second
	_, live, err := env.WaitTerminal(ctx, lastKill.Add(bound))
	must(t, err)
	afterKill := time.Since(lastKill)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live %s after the last kill (bound %s)", live, afterKill.Round(time.Millisecond), bound)
	c.check(r.Duplicates <= kills*conc, "%d duplicate step runs > kills × concurrency = %d", r.Duplicates, kills*conc)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	c.check(sig.errs.Load() == 0, "%d signals could not be sent", sig.errs.Load())
	summary(t, r.Line("worker-kill", fmt.Sprintf("%d kills", kills))+
		fmt.Sprintf(" (%d top-level + %d children, %d processes × %d steps, %d signals sent of which %d dedup no-ops; all terminal %s after the last kill, bound %s; %s)",
			r.TopLevel, r.Instances-r.TopLevel, workers, conc, sig.sent.Load(), sig.dups.Load(),
			afterKill.Round(100*time.Millisecond), bound, r.Invariants()))
	c.done()
}
