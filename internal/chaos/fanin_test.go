//go:build chaos

package chaos_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// TestChaos05FanInUnderKills: flows fan out to 8 child flows which fan out
// to 8 leaves each (nested fan-in, many children finishing at once across
// processes), while a random worker of three is SIGKILLed every 1.5 s.
// Every parent must resume exactly once, after its last child, and see all
// its children finished.
func TestChaos05FanInUnderKills(t *testing.T) {
	ctx := bg(t, 15*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "fanin")
	fleet := newFleet(t)
	tops, killsWanted := pick(24, 300), pick(3, 30)
	const workers, conc = 3, 8
	cfgs := map[string]chaos.WorkerConfig{}
	for i := 1; i <= workers; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.Concurrency = conc
		cfgs[cfg.Name] = cfg
		_, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
	}
	ps := make([]gendurable.InsertParams, tops)
	for i := range ps {
		ps[i] = env.M.Flow.New(chaos.FlowState{Kids: 8, Depth: 2, SleepMs: 30})
	}
	_, err := env.Insert(ctx, "flow", ps)
	must(t, err)

	var lastKill time.Time
	for k := 0; k < killsWanted; k++ {
		time.Sleep(1500 * time.Millisecond)
		cur := fleet.Current()
		victim := cur[rand.IntN(len(cur))]
		_, _, err := env.Fault(ctx, "kill", victim)
		must(t, err)
		victim.Kill()
		lastKill = time.Now()
		_, err = fleet.Start(cfgs[victim.Name], 0)
		must(t, err)
	}
	cfg := cfgs["w1"]
	bound := time.Duration(cfg.LeaseMs+cfg.ReaperMs)*time.Millisecond + 60*time.Second
	_, live, err := env.WaitTerminal(ctx, lastKill.Add(bound))
	must(t, err)
	afterKill := time.Since(lastKill)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)
	joins, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_oracle WHERE step = 'join' AND (note->>'children')::int > 0`)
	must(t, err)
	joinRuns, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_effects e WHERE step = 'join'
		AND EXISTS (SELECT 1 FROM {{s}}.gendurable_instances c WHERE c.parent_id = e.instance)`)
	must(t, err)

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live %s after the last kill", live, afterKill.Round(time.Millisecond))
	c.check(joins == r.Parents, "%d parents, but %d committed joins", r.Parents, joins)
	c.check(r.Duplicates <= killsWanted*conc, "%d duplicate step runs > kills × concurrency = %d", r.Duplicates, killsWanted*conc)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	summary(t, r.Line("fan-in", fmt.Sprintf("%d kills", killsWanted))+
		fmt.Sprintf(" (%d parents (nested 1→8→8), each resumed exactly once after its last child: %d committed joins, %d join runs, %d early, %d repeated, %d saw unfinished or missing children; all terminal %s after the last kill; %s)",
			r.Parents, joins, joinRuns, r.FaninEarly, r.FaninMulti, r.FaninWrong, afterKill.Round(100*time.Millisecond), r.Invariants()))
	c.done()
}
