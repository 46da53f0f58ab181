//go:build chaos

package chaos_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
)

// poisonCase is one kind of poison step and what its failure must record.
type poisonCase struct {
	fsm      string
	n        int
	wantKind string // kind of the last error entry
	wantText string // the recorded reason must mention this
}

// TestChaos06PoisonSteps: one worker process runs poison steps next to
// ordinary work: a step that panics, one whose outcome state cannot be
// encoded (NaN), one whose Handle panics, one whose outcome holds a NUL
// (jsonb rejects it), one whose stored state does not decode, two whose
// outcome state nests deeper than Config.MaxJSONDepth (one in its own
// transaction, one group-committed with bystanders), and one that loops
// forever ignoring its context; a hook panics on every step event. Each
// poison instance must end failed with its reason recorded, after its
// attempts; the process must survive and finish the ordinary work (the
// bystanders without reruns); the looping step must be reported, and the
// process must never run more steps at once than its concurrency.
func TestChaos06PoisonSteps(t *testing.T) {
	t.Parallel() // with the other light scenarios (stall, clock, connection limits)
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "poison")
	fleet := newFleet(t)
	cfg := env.Worker("w1")
	cfg.Concurrency = 8
	cfg.DrainMs, cfg.StopMs = 500, 1500
	cfg.PanicHook = true
	cfg.CommitConc = 1 // one outcome statement at a time: outcomes that arrive meanwhile share the next one
	proc, err := fleet.Start(cfg, 30*time.Second)
	must(t, err)

	m := env.M
	cases := []poisonCase{
		{"poison_panic", 5, "panic", "poison step panics"},
		{"poison_encode", 5, "error", "NaN"},
		{"poison_handle", 5, "error", "Handle"},
		{"poison_nul", 5, "outcome_rejected", "Unicode escape"},
		{"poison_decode", 5, "state_decode", "does not decode"},
		{"poison_deep", 4, "error", "MaxJSONDepth"},
		{"poison_deep_plain", 4, "error", "MaxJSONDepth"},
	}
	var ps []gendurable.InsertParams
	for i := 0; i < 5; i++ {
		ps = append(ps, m.PoisonPanic.New(chaos.LeafState{}), m.PoisonEncode.New(chaos.EncodeState{F: 1}),
			m.PoisonHandle.New(chaos.LeafState{}), m.PoisonNUL.New(chaos.BlobState{}),
			m.PoisonDecode.New(chaos.DecodeState{N: 1}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	}
	ps = append(ps, m.PoisonLoop.New(chaos.LeafState{}))
	bystanders := pick(200, 3000)
	for i := 0; i < bystanders; i++ {
		ps = append(ps, m.Plain.New(chaos.LeafState{SleepMs: 5}), m.Leaf.New(chaos.LeafState{SleepMs: 5}))
		if i%(bystanders/4) == bystanders/8 { // deep outcomes among the bystanders' group commits
			two := gendurable.InsertOpts{MaxAttempts: 2}
			ps = append(ps, m.PoisonDeep.New(chaos.BlobState{}).With(two), m.PoisonDeepPlain.New(chaos.BlobState{}).With(two))
		}
	}
	_, err = env.Insert(ctx, "mixed", ps)
	must(t, err)
	// Stored state that no longer decodes (e.g. written by an older deploy).
	_, err = env.Admin.Exec(ctx, chaos.SQL(env.Schema, `UPDATE {{s}}.gendurable_instances
		SET state = '{"n": "not a number"}', eligible_at = now() WHERE fsm = 'poison_decode'`))
	must(t, err)

	// Wait for everything but the looping step, then a little for it.
	deadline := time.Now().Add(pick(40*time.Second, 120*time.Second))
	for time.Now().Before(deadline) {
		n, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed') AND fsm <> 'poison_loop'`)
		must(t, err)
		if n == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	loopDeadline := time.Now().Add(5 * time.Second)
	var loopStatus, loopKind, loopErr string
	var loopAttempt int
	for {
		must(t, env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT status::text, attempt, coalesce(errors->-1->>'kind', ''), coalesce(errors->-1->>'error', '')
			FROM {{s}}.gendurable_instances WHERE fsm = 'poison_loop'`)).Scan(&loopStatus, &loopAttempt, &loopKind, &loopErr))
		if loopStatus == "failed" || time.Now().After(loopDeadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	alive := proc.Alive()
	maxConc, err := env.Count(ctx, `SELECT coalesce(max(c), 0) FROM (
		SELECT (SELECT count(*) FROM {{s}}.chaos_effects x WHERE x.pid = e.pid AND x.started <= e.started
		        AND coalesce(x.ended, 'infinity') > e.started) AS c
		FROM {{s}}.chaos_effects e WHERE e.pid = $1) y`, proc.PID)
	must(t, err)
	stopped, termErr := proc.Term(30 * time.Second)
	ignoringReported := stopped != nil && strings.Contains(stopped.Err, "abandoned")
	hookPanics := int64(0)
	if stopped != nil {
		hookPanics = stopped.Counts["hook_panics"]
	}
	warned := len(proc.Stderr("abandoned it")) > 0

	c := &criteria{t: t}
	c.check(alive, "the worker process died: %v\n%s", termErr, proc.StderrTail(20))
	var outcomes []string
	withReason, poison := 0, 1 // the looping step counts as poison
	for _, pc := range cases {
		rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `SELECT id, status::text, attempt, errors FROM {{s}}.gendurable_instances WHERE fsm = $1`), pc.fsm)
		must(t, err)
		okN := 0
		var bad []string
		for rows.Next() {
			var id int64
			var status string
			var attempt int
			var errs []byte
			must(t, rows.Scan(&id, &status, &attempt, &errs))
			var hist []gendurable.StepError
			_ = json.Unmarshal(errs, &hist)
			last := gendurable.StepError{}
			if len(hist) > 0 {
				last = hist[len(hist)-1]
			}
			switch {
			case status != "failed":
				bad = append(bad, fmt.Sprintf("#%d is %s (attempt %d)", id, status, attempt))
			case last.Kind != pc.wantKind || !strings.Contains(last.Error, pc.wantText):
				bad = append(bad, fmt.Sprintf("#%d failed with %s %q, want %s mentioning %q", id, last.Kind, trunc(last.Error, 200), pc.wantKind, pc.wantText))
			default:
				okN++
			}
		}
		rows.Close()
		withReason += okN
		poison += pc.n
		outcomes = append(outcomes, fmt.Sprintf("%s %d/%d", strings.TrimPrefix(pc.fsm, "poison_"), okN, pc.n))
		c.check(len(bad) == 0, "%s: %s", pc.fsm, strings.Join(bad, "; "))
	}
	c.check(loopStatus == "failed", "the step looping while ignoring its context is still %s at attempt %d", loopStatus, loopAttempt)
	c.check(loopKind == "timeout" && strings.Contains(loopErr, "ignored its context") && strings.Contains(loopErr, "attempts exhausted"),
		"the looping step failed with %s %q, want timeout: ignored its context, attempts exhausted", loopKind, loopErr)
	if loopStatus == "failed" && loopKind == "timeout" {
		withReason++
	}
	c.check(ignoringReported && warned, "the step ignoring cancellation was not reported (by Stop: %v, in the log: %v)", ignoringReported, warned)
	c.check(maxConc <= cfg.Concurrency, "the process ran %d steps at once, over its concurrency %d", maxConc, cfg.Concurrency)
	c.check(hookPanics > 0, "the panicking hook never ran")

	// The ordinary work finished, exactly once, next to the poison.
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)
	bystanderReruns, err := env.Count(ctx, `SELECT coalesce(sum(n - 1), 0)::int FROM
		(SELECT count(*) AS n FROM {{s}}.chaos_effects WHERE fsm IN ('plain', 'leaf') GROUP BY instance, seq) x`)
	must(t, err)
	c.check(r.DoneByFsm["plain"] == bystanders && r.DoneByFsm["leaf"] == bystanders, "ordinary work: %d/%d plain and %d/%d leaf done",
		r.DoneByFsm["plain"], bystanders, r.DoneByFsm["leaf"], bystanders)
	c.check(bystanderReruns == 0, "%d bystander steps ran again (their outcome shared a batch with a poison outcome)", bystanderReruns)
	c.check(r.Lost == 0 && r.MultiCommit == 0, "lost %d, double commits %d", r.Lost, r.MultiCommit)
	summary(t, r.Line("poison", fmt.Sprintf("%d poison instances: %d failed with their own reason recorded, %d with another, %d never ended",
		poison, withReason, r.Failed-withReason, poison-r.Failed))+
		fmt.Sprintf(" (by kind: %s; looping step: %s at attempt %d, abandoned and reported: %v; process survived: %v; %d hook panics absorbed; max %d steps at once (limit %d); %d bystanders done, %d rerun)",
			strings.Join(outcomes, ", "), loopStatus, loopAttempt, ignoringReported && warned, alive, hookPanics, maxConc, cfg.Concurrency,
			r.DoneByFsm["plain"]+r.DoneByFsm["leaf"], bystanderReruns))
	c.done()
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
