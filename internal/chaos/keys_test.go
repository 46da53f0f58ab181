//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// TestChaos12KeyStallTerminated: three workers run keyed leaves only (limit
// 1, twelve keys), each of which writes its key's fenced resource with its
// claim token when its work starts and when it ends; half of them honour
// their context, half ignore it (they work to the end and write whatever
// happens). One worker is SIGSTOPped while it runs steps of both kinds;
// while it is stopped, every one of its database backends is terminated,
// and the harness waits 2× the lease, so that its leases run out, its rows
// are reaped and the other workers run the keys' next rows. Then it is
// SIGCONTed.
//
// Pass: among the runs that honour their context, none of a key starts
// while another is running (database clock; a frozen process is not
// running, see spansCTE), and no keyed run starts while another row of its
// key holds a live slot; each of them in flight in the stopped worker ends
// its work within 250 ms of SIGCONT (cancelled with ErrLeaseLost, or done
// with work that ended while it was stopped); the fenced resource accepts
// no write from a claim that is no longer current — the late writes of the
// stopped runs are refused by their token; nothing lost or stuck, exactly
// one committed outcome per step.
func TestChaos12KeyStallTerminated(t *testing.T) {
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "kstall")
	fleet := newFleet(t)
	const keys = 12
	const lagLimit = 250 * time.Millisecond
	stalls := pick(2, 4)
	n := pick(480, 2400)

	var stalled *chaos.Proc
	for i := 1; i <= 3; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.Concurrency, cfg.MaxConns = 4, 6 // 3 × 6 + the harness's 6
		p, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
		if i == 1 {
			stalled = p
		}
	}
	lease := time.Duration(stalled.Cfg.LeaseMs) * time.Millisecond

	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = env.M.Leaf.New(chaos.LeafState{SleepMs: 300, Fence: true, IgnoreCtx: (i/keys)%2 == 1}).
			With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("fk-%d", i%keys)})
	}
	_, err := env.Insert(ctx, "leaf", ps)
	must(t, err)

	type stall struct {
		from, to   time.Time // database clock: once stopped, once continued
		cont       time.Time // harness clock, just before SIGCONT
		terminated int
	}
	var windows []stall
	for s := 0; s < stalls; s++ {
		time.Sleep(500 * time.Millisecond)
		// Stop it in the middle of its steps: wait until it runs some of
		// each kind.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var honouring, ignoring int
			must(t, chaos.Retry(ctx, func(ctx context.Context) error {
				return env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT count(*) FILTER (WHERE honours), count(*) FILTER (WHERE NOT honours)
					FROM {{s}}.chaos_effects WHERE pid = $1 AND ended IS NULL`), stalled.PID).Scan(&honouring, &ignoring)
			}))
			if honouring >= 2 && ignoring >= 1 {
				break
			}
		}
		must(t, stalled.Stop(2*time.Second))
		id, from, err := env.Fault(ctx, "stop", stalled)
		must(t, err)
		terminated, err := env.TerminateWorker(ctx, stalled.Name)
		must(t, err)
		time.Sleep(2 * lease)
		cont := time.Now()
		must(t, stalled.Signal(syscall.SIGCONT))
		to, err := env.FaultEnd(ctx, id)
		must(t, err)
		windows = append(windows, stall{from: from, to: to, cont: cont, terminated: terminated})
	}
	_, live, err := env.WaitTerminal(ctx, time.Now().Add(60*time.Second))
	must(t, err)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)

	// The stopped runs: the stopped worker's runs in flight when it stopped.
	type stopped struct {
		key                   string
		honours               bool
		cause                 *string
		workEnd               *time.Time
		committed, reaped     bool
		writesAfter, accepted int // fenced writes it offered after its stop, and how many were accepted
		stall                 int
		successors            int // runs of its key by other workers while it was stopped
	}
	var zs []stopped
	terminated := 0
	keysTakenOver := map[string]bool{}
	successors := 0
	for i, w := range windows {
		terminated += w.terminated
		rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `
			SELECT z.pkey, z.honours, z.cause, z.work_end,
			       EXISTS (SELECT 1 FROM {{s}}.chaos_oracle o WHERE o.run_id = z.run_id),
			       EXISTS (SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
			               WHERE i.id = z.instance AND e->>'kind' = 'lease_expired' AND (e->>'attempt')::int = z.attempt),
			       (SELECT count(*) FROM {{s}}.chaos_fenced_log f WHERE f.run_id = z.run_id AND f.at > $2),
			       (SELECT count(*) FROM {{s}}.chaos_fenced_log f WHERE f.run_id = z.run_id AND f.at > $2 AND f.accepted),
			       (SELECT count(*) FROM {{s}}.chaos_effects x WHERE x.pkey = z.pkey AND x.pid <> z.pid
			          AND x.started > $2 AND x.started < $3)
			FROM {{s}}.chaos_effects z
			WHERE z.pid = $1 AND z.started <= $2 AND (z.ended IS NULL OR z.ended >= $2)`), stalled.PID, w.from, w.to)
		must(t, err)
		for rows.Next() {
			z := stopped{stall: i}
			must(t, rows.Scan(&z.key, &z.honours, &z.cause, &z.workEnd, &z.committed, &z.reaped, &z.writesAfter, &z.accepted, &z.successors))
			zs = append(zs, z)
			if z.successors > 0 {
				keysTakenOver[z.key] = true
				successors += z.successors
			}
		}
		rows.Close()
	}
	var lags []time.Duration
	honouring, cancelled, doneLate, committedAlone, unexplained, honouringWrites, honouringAccepted, lateEnds := 0, 0, 0, 0, 0, 0, 0, 0
	ignoring, ignoringWrites, ignoringAccepted, ignoringReaped := 0, 0, 0, 0
	for _, z := range zs {
		if !z.honours {
			ignoring++
			ignoringWrites += z.writesAfter
			ignoringAccepted += z.accepted
			if z.reaped {
				ignoringReaped++
			}
			continue
		}
		honouring++
		honouringWrites += z.writesAfter
		honouringAccepted += z.accepted
		switch {
		case z.committed && !z.reaped && z.cause == nil:
			committedAlone++ // its outcome was on its way to the database when the process stopped
			continue
		case z.cause != nil && *z.cause == "lease_lost":
			cancelled++
		case z.cause == nil && z.reaped && !z.committed:
			// Its work (a sleep) ended while it was stopped; on waking it
			// went on before the cancellation reached it. Its outcome was
			// fenced out.
			doneLate++
		default:
			unexplained++
			continue
		}
		if z.workEnd == nil {
			unexplained++
			continue
		}
		lag := z.workEnd.Sub(windows[z.stall].cont)
		lags = append(lags, lag)
		if lag < 0 || lag > lagLimit {
			lateEnds++
		}
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	lagText := "none"
	if len(lags) > 0 {
		lagText = fmt.Sprintf("%s–%s", lags[0].Round(100*time.Microsecond), lags[len(lags)-1].Round(100*time.Microsecond))
	}

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live", live)
	c.check(honouring > 0, "the stopped worker had no step that honours its context in flight: the scenario proved nothing")
	c.check(terminated > 0, "no backend of the stopped worker was terminated")
	c.check(successors > 0, "no other worker ran a row of a stopped run's key while it was stopped: the scenario proved nothing")
	c.check(unexplained == 0, "%d runs in flight in the stopped worker (honouring their context) were neither cancelled with ErrLeaseLost, nor reaped, nor committed before the stop", unexplained)
	c.check(lateEnds == 0, "%d of %d stopped runs ended their work outside 0–%s of SIGCONT (%s)", lateEnds, len(lags), lagLimit, lagText)
	// The stopped worker's connections are gone: a write after SIGCONT needs
	// a new one, and by the time it has one its context is cancelled.
	c.check(honouringWrites == 0, "the stopped runs that honour their context wrote %d times to the fenced resource after their stop", honouringWrites)
	c.check(honouringAccepted+ignoringAccepted == 0, "the fenced resource accepted %d late writes of stopped runs", honouringAccepted+ignoringAccepted)
	c.check(r.FencedWrites > 0, "no fenced write at all")
	// Each run of the stopped worker whose claim was reaped (in flight at a
	// stop, or done with its work but its outcome not yet committed) runs
	// again once.
	reapedRuns, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_effects z WHERE z.pid = $1 AND EXISTS (
		SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
		WHERE i.id = z.instance AND e->>'kind' = 'lease_expired' AND (e->>'attempt')::int = z.attempt)`, stalled.PID)
	must(t, err)
	c.check(r.Duplicates <= reapedRuns, "%d duplicate step runs for %d reaped runs of the stopped worker", r.Duplicates, reapedRuns)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	summary(t, r.Line("key-stall", fmt.Sprintf("%d stalls of %s (2× lease) with the worker's %d backends terminated", stalls, 2*lease, terminated))+
		fmt.Sprintf(" (%d keys, limit 1; in flight in the stopped worker: %d runs honouring their context — %d cancelled with ErrLeaseLost, %d whose work had ended while stopped went on before the cancellation reached them (reaped, outcome fenced), all ending their work %s after SIGCONT; %d committed before the stop; %d late writes to the fenced resource, %d accepted — "+
			"and %d ignoring it — %d reaped; %d late writes, %d accepted; meanwhile %d runs of %d of their keys by the other workers; "+
			"%d overlapping runs of one key among those honouring their context (%d if a stopped process counted as running), %d runs started while their key's slot was held; "+
			"fenced resource: %d writes, %d refused, %d from claims no longer current of which %d accepted; %s)",
			keys, honouring, cancelled, doneLate, lagText, committedAlone, honouringWrites, honouringAccepted,
			ignoring, ignoringReaped, ignoringWrites, ignoringAccepted, successors, len(keysTakenOver),
			r.Overlaps, r.OverlapsCountingStops, r.SlotExcess,
			r.FencedWrites, r.FencedRefused, r.StaleRefused+r.StaleAccepted, r.StaleAccepted, r.Invariants()))
	c.done()
}

// TestChaos13KeyLimitKillStorm: three worker processes with KeyPolicies
// {Prefix: "k3-", Limit: 3} run leaves over four k3- keys, two keys of the
// default limit 1 and one key inserted with KeyLimit 2, while every 1.5 s a
// random worker is SIGKILLed and restarted. Pass: never more runs of a key
// at once than its limit (database clock; a killed run ends at its kill),
// and the k3- keys do reach 3 at once; 0 lost, 0 stuck, exactly one
// committed outcome per step, duplicate runs at most kills × concurrency.
func TestChaos13KeyLimitKillStorm(t *testing.T) {
	ctx := bg(t, 15*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "klimit")
	fleet := newFleet(t)
	const workers, conc = 3, 8
	storm := pick(8*time.Second, 60*time.Second)
	initial, wave := pick(400, 1500), pick(20, 20)
	policies := []gendurable.KeyPolicy{{Prefix: "k3-", Limit: 3}}
	must(t, env.SetKeyPolicies(ctx, policies))

	cfgs := map[string]chaos.WorkerConfig{}
	for i := 1; i <= workers; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.Concurrency, cfg.MaxConns = conc, 8 // 3 × 8 + the harness's 6
		cfg.KeyPolicies = policies
		cfgs[cfg.Name] = cfg
		_, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
	}
	mix := func(n int) []gendurable.InsertParams {
		ps := make([]gendurable.InsertParams, n)
		for i := range ps {
			var o gendurable.InsertOpts
			switch k := rand.IntN(20); {
			case k < 14:
				o.PartitionKey = fmt.Sprintf("k3-%d", k%4)
			case k < 17:
				o.PartitionKey = fmt.Sprintf("k1-%d", k%2)
			default:
				o.PartitionKey, o.KeyLimit = "kx-0", 2
			}
			ps[i] = env.M.Leaf.New(chaos.LeafState{SleepMs: 150}).With(o)
		}
		return ps
	}
	ids, err := env.Insert(ctx, "leaf", mix(initial))
	must(t, err)
	inserted := len(ids)

	kills := 0
	var lastKill time.Time
	start := time.Now()
	killTick := time.NewTicker(1500 * time.Millisecond)
	waveTick := time.NewTicker(500 * time.Millisecond)
	for time.Since(start) < storm {
		select {
		case <-killTick.C:
			names := fleet.Current()
			victim := names[rand.IntN(len(names))]
			_, _, err := env.Fault(ctx, "kill", victim)
			must(t, err)
			victim.Kill()
			kills++
			lastKill = time.Now()
			_, err = fleet.Start(cfgs[victim.Name], 0)
			must(t, err)
		case <-waveTick.C:
			ids, err := env.Insert(ctx, "leaf", mix(wave))
			must(t, err)
			inserted += len(ids)
		}
	}
	killTick.Stop()
	waveTick.Stop()

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
	c.check(r.KeyPeaks[3] == 3, "the limit-3 keys ran at most %d at once: the scenario did not reach the limit", r.KeyPeaks[3])
	c.check(r.Duplicates <= kills*conc, "%d duplicate step runs > kills × concurrency = %d", r.Duplicates, kills*conc)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	summary(t, r.Line("key-limit-kill", fmt.Sprintf("%d kills", kills))+
		fmt.Sprintf(" (%d leaves over 4 keys of limit 3 (policy k3-), 2 of limit 1, 1 of KeyLimit 2, %d processes × %d steps; most at once per key: limit 3 → %d, limit 2 → %d, limit 1 → %d; all terminal %s after the last kill, bound %s; %s)",
			inserted, workers, conc, r.KeyPeaks[3], r.KeyPeaks[2], r.KeyPeaks[1], afterKill.Round(100*time.Millisecond), bound, r.Invariants()))
	c.done()
}
