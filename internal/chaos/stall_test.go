//go:build chaos

package chaos_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// TestChaos02Stall: a worker is SIGSTOPped for 2× the lease in the middle
// of its steps, then SIGCONTed. Its leases expire and are reaped; another
// worker reruns the steps (partitioned ones only once the zombie has let go
// of its key). The zombie's late outcomes must change nothing (fenced), no
// two runs of one partition key may overlap, and each interrupted step must
// rerun exactly once.
func TestChaos02Stall(t *testing.T) {
	t.Parallel() // with the other light scenarios (poison, clock, connection limits)
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "stall")
	fleet := newFleet(t)
	stalls := pick(1, 3)
	n := pick(300, 1500)

	a := env.Worker("w1")
	b := env.Worker("w2")
	procA, err := fleet.Start(a, 30*time.Second)
	must(t, err)
	_, err = fleet.Start(b, 30*time.Second)
	must(t, err)
	lease := time.Duration(a.LeaseMs) * time.Millisecond

	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		p := env.M.Leaf.New(chaos.LeafState{SleepMs: 300})
		if i%2 == 0 {
			p = p.With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("stall-%d", i%10)})
		}
		ps[i] = p
	}
	_, err = env.Insert(ctx, "leaf", ps)
	must(t, err)

	type window struct {
		from, to time.Time // database clock: once stopped, once continued
		cont     time.Time // harness clock, just before SIGCONT
	}
	var windows []window
	for s := 0; s < stalls; s++ {
		time.Sleep(500 * time.Millisecond)
		// Stop it in the middle of its steps: wait until it runs some.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			n, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_effects WHERE pid = $1 AND ended IS NULL`, procA.PID)
			must(t, err)
			if n >= 2 {
				break
			}
		}
		must(t, procA.Stop(2*time.Second))
		id, from, err := env.Fault(ctx, "stop", procA)
		must(t, err)
		time.Sleep(2 * lease)
		cont := time.Now()
		must(t, procA.Signal(syscall.SIGCONT))
		to, err := env.FaultEnd(ctx, id)
		must(t, err)
		windows = append(windows, window{from, to, cont})
	}
	_, live, err := env.WaitTerminal(ctx, time.Now().Add(60*time.Second))
	must(t, err)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)

	// The zombie runs: steps of the stalled worker in flight when it stopped
	// (a run still open at one stall may show up at the next: counted once).
	// A run's claim was reaped if a lease_expired entry names its token
	// (or, an entry with no token — a claim a pick revoked — its attempt).
	type zombie struct {
		committed, reaped, staleStart, handled bool
		runs                                   int
		workEnd                                *time.Time
		stall                                  int
	}
	zs := map[string]zombie{}
	for i, w := range windows {
		rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `
			SELECT z.run_id, z.work_end,
			       EXISTS (SELECT 1 FROM {{s}}.chaos_oracle o WHERE o.run_id = z.run_id),
			       EXISTS (SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
			               WHERE i.id = z.instance AND e->>'kind' = 'lease_expired' AND `+chaos.ReapedClaim+`),
			       EXISTS (SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
			               WHERE i.id = z.instance AND e->>'kind' = 'lease_expired' AND `+chaos.ReapedClaim+`
			                 AND (e->>'at')::timestamptz < z.started),
			       EXISTS (SELECT 1 FROM {{s}}.gendurable_instances i, jsonb_array_elements(i.errors) e
			               WHERE i.id = z.instance AND e->>'kind' <> 'lease_expired' AND (e->>'attempt')::int = z.attempt),
			       (SELECT count(*) FROM {{s}}.chaos_effects x WHERE x.instance = z.instance AND x.seq = z.seq)
			FROM {{s}}.chaos_effects z
			WHERE z.pid = $1 AND z.started <= $2 AND (z.ended IS NULL OR z.ended >= $2)`), procA.PID, w.from)
		must(t, err)
		for rows.Next() {
			var id string
			z := zombie{stall: i}
			must(t, rows.Scan(&id, &z.workEnd, &z.committed, &z.reaped, &z.staleStart, &z.handled, &z.runs))
			if _, seen := zs[id]; !seen {
				zs[id] = z
			}
		}
		rows.Close()
	}
	zombies := len(zs)
	reaped, lateApplied, rerunOnce, rerunOther, staleStarts, committedAlone, handled, unexplained := 0, 0, 0, 0, 0, 0, 0, 0
	// How soon after SIGCONT each reaped run's work ended: its context is
	// cancelled at once (the lease deadline has passed), unless its work
	// (a sleep) had ended while it was stopped.
	var tailMax time.Duration
	lateTails := 0
	for _, z := range zs {
		if z.reaped && z.workEnd != nil {
			tail := z.workEnd.Sub(windows[z.stall].cont)
			tailMax = max(tailMax, tail)
			if tail > 250*time.Millisecond {
				lateTails++
			}
		}
		switch {
		case z.reaped:
			reaped++
			if z.committed {
				lateApplied++
			}
			if z.staleStart {
				staleStarts++
			}
			if z.runs == 2 {
				rerunOnce++
			} else {
				rerunOther++
			}
		case z.committed && z.runs == 1:
			committedAlone++ // its outcome committed before its lease ran out
		case !z.committed && z.handled:
			// Not reaped (its open outcome transaction kept the row locked
			// through the stall) but rolled back when its own deadline had
			// passed on waking: Handle retried it, an attempt counted.
			handled++
		default:
			unexplained++
		}
	}
	// Each reaped zombie run must have tried to write its outcome and been
	// refused: fenced out, or (when the commit's own deadline passed while
	// the process was stopped) not written at all.
	fenced, unwritten := int64(0), int64(0)
	if ev := procA.Last("stopped"); ev != nil {
		fenced, unwritten = ev.Counts["fenced"], ev.Counts["commit_errors"]
	}
	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live", live)
	c.check(zombies > 0, "the stalled worker had no step in flight: the scenario proved nothing")
	c.check(lateApplied == 0, "%d late outcomes of reaped zombie runs were applied", lateApplied)
	c.check(rerunOther == 0, "%d reaped steps did not rerun exactly once", rerunOther)
	c.check(staleStarts == 0, "the stalled worker started %d steps after their claim had been reaped (it must wait for a heartbeat after a pause)", staleStarts)
	c.check(lateTails == 0, "%d reaped runs of the stalled worker went on working more than 250ms after SIGCONT (longest %s)", lateTails, tailMax)
	c.check(unexplained == 0, "%d zombie runs neither reaped, nor committed alone, nor retried through Handle", unexplained)
	c.check(int(fenced+unwritten) >= reaped, "the stalled worker reported %d fenced and %d unwritten outcomes for %d reaped runs", fenced, unwritten, reaped)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	summary(t, r.Line("stall", fmt.Sprintf("%d stalls of %s (2× lease)", stalls, 2*lease))+
		fmt.Sprintf(" (%d steps in flight in the stalled worker: %d reaped and rerun once each, their work ended at most %s after SIGCONT, %d late outcomes fenced and %d not written = 0 rows changed, %d started after their reap, %d committed by the zombie itself before any reap, %d rolled back on waking and retried through Handle; %d partition overlaps (%d if the stopped time counted as running); %s)",
			zombies, rerunOnce, tailMax.Round(100*time.Microsecond), fenced, unwritten, staleStarts, committedAlone, handled, r.Overlaps, r.OverlapsCountingStops, r.Invariants()))
	c.done()
}
