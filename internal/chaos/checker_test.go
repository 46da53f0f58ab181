//go:build linux

package chaos_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos"
)

// TestCheckerFindsViolations plants one of each violation by hand and
// checks that the checker counts each exactly: a checker that finds nothing
// proves nothing. (Fast; runs with `go test ./...`.)
func TestCheckerFindsViolations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := newEnv(t, chaos.DefaultURL(), "checker")
	exec := func(stmt string, args ...any) {
		t.Helper()
		if _, err := env.Admin.Exec(ctx, chaos.SQL(env.Schema, stmt), args...); err != nil {
			t.Fatalf("%v\n%s", err, stmt)
		}
	}
	ins := func(status, extra string) int64 {
		t.Helper()
		var id int64
		stmt := `INSERT INTO {{s}}.gendurable_instances (fsm, step, status` + extra + `) RETURNING id`
		if err := env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, stmt), status).Scan(&id); err != nil {
			t.Fatalf("%v\n%s", err, stmt)
		}
		return id
	}
	// A clean instance: done at seq 1 with oracle rows for seq 0 and 1.
	clean := ins("done", `, result) VALUES ('flow', 'join', $1::text::{{s}}.gendurable_status, '{"seq": 1}'`)
	exec(`INSERT INTO {{s}}.chaos_expected VALUES ($1, 'flow')`, clean)
	for seq := 0; seq <= 1; seq++ {
		exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker) VALUES ($1, 'flow', 's', $2, 0, 'r', 1, 'w')`, clean, seq)
		exec(`INSERT INTO {{s}}.chaos_oracle (instance, fsm, step, seq, attempt, token, run_id, pid, worker, started) VALUES ($1, 'flow', 's', $2, 0, $3, 'r', 1, 'w', now())`, clean, seq, 100+seq)
	}
	r, err := chaos.Check(ctx, env.Admin, env.Schema, chaos.CheckOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if v := r.Violations(false); len(v) != 0 || r.Duplicates != 0 || r.Done != 1 {
		t.Fatalf("clean schema: violations %v, %d duplicates, %d done", v, r.Duplicates, r.Done)
	}

	// Lost outcome: done at seq 2, but seq 1 never committed.
	gap := ins("done", `, result) VALUES ('flow', 'join', $1::text::{{s}}.gendurable_status, '{"seq": 2}'`)
	for _, seq := range []int{0, 2} {
		exec(`INSERT INTO {{s}}.chaos_oracle (instance, fsm, step, seq, attempt, token, run_id, pid, worker, started) VALUES ($1, 'flow', 's', $2, 0, $3, 'r', 1, 'w', now())`, gap, seq, 200+seq)
	}
	// Double commit of one (instance, seq), sharing a token; and one without a token.
	dbl := ins("done", `, result) VALUES ('leaf', 'work', $1::text::{{s}}.gendurable_status, '{"seq": 0}'`)
	exec(`INSERT INTO {{s}}.chaos_oracle (instance, fsm, step, seq, attempt, token, run_id, pid, worker, started) VALUES ($1, 'leaf', 'work', 0, 0, 300, 'a', 1, 'w', now()), ($1, 'leaf', 'work', 0, 1, 300, 'b', 1, 'w', now()), ($1, 'leaf', 'work', 0, 2, NULL, 'c', 1, 'w', now())`, dbl)
	// Three runs of one step: two duplicates.
	for i := 0; i < 3; i++ {
		exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker) VALUES ($1, 'leaf', 'work', 0, $2, 'x', 1, 'w')`, dbl, i)
	}
	// A row the harness inserted that vanished.
	exec(`INSERT INTO {{s}}.chaos_expected VALUES (987654321, 'flow')`)
	// Two overlapping runs of one partition key, and an open span (excluded).
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended) VALUES
		(-1, 'leaf', 'work', 0, 0, 'o1', 1, 'w', 'k', now(), now() + interval '2 seconds'),
		(-2, 'leaf', 'work', 0, 0, 'o2', 1, 'w', 'k', now() + interval '1 second', now() + interval '3 seconds'),
		(-3, 'leaf', 'work', 0, 0, 'o3', 7, 'w', 'k', now() + interval '10 seconds', NULL)`)
	// Key limits: limit 3 for "k3-" keys. Three runs of k3-a at once are
	// within it; four of k3-b are one too many. An instance inserted with
	// key_limit 2 runs twice at once within its limit.
	exec(`INSERT INTO {{s}}.chaos_key_limits VALUES ('k3-', 3)`)
	for i, k := range []string{"k3-a", "k3-a", "k3-a", "k3-b", "k3-b", "k3-b", "k3-b"} {
		exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended) VALUES
			(-10 - $2, 'leaf', 'work', 0, 0, 'l', 1, 'w', $1, now() + $2 * interval '1 millisecond', now() + interval '1 second')`, k, i)
	}
	two := ins("done", `, partition_key, key_limit) VALUES ('plain', 'work', $1::text::{{s}}.gendurable_status, 'k2', 2`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended) VALUES
		($1, 'plain', 'work', 0, 0, 'a', 1, 'w', 'k2', now(), now() + interval '1 second'),
		($1, 'plain', 'work', 1, 0, 'b', 1, 'w', 'k2', now(), now() + interval '1 second')`, two)
	// A stopped process (pid 8, stopped at +20 s): its run of key s1, cancelled
	// with ErrLeaseLost, ends at the stop and does not overlap the run another
	// process made of s1 meanwhile; its run of key s2, which neither saw a
	// cancellation nor was reaped (its claim was not lost), does.
	exec(`INSERT INTO {{s}}.chaos_faults (kind, pid, worker, at, until) VALUES ('stop', 8, 'w8', now() + interval '20 seconds', now() + interval '24 seconds')`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended, cause) VALUES
		(-30, 'leaf', 'work', 0, 0, 's1', 8, 'w8', 's1', now() + interval '19 seconds', now() + interval '25 seconds', 'lease_lost'),
		(-31, 'leaf', 'work', 0, 0, 's1b', 9, 'w9', 's1', now() + interval '21 seconds', now() + interval '22 seconds', NULL),
		(-32, 'leaf', 'work', 0, 0, 's2', 8, 'w8', 's2', now() + interval '19 seconds', now() + interval '25 seconds', NULL),
		(-33, 'leaf', 'work', 0, 0, 's2b', 9, 'w9', 's2', now() + interval '21 seconds', now() + interval '22 seconds', NULL)`)
	// A run of pid 8 that went on with its work after the stop, but whose
	// claim (token 77) was reaped meanwhile (it lost its claim while
	// stopped): it ends at the stop too.
	reaped := ins("done", `, errors) VALUES ('plain', 'work', $1::text::{{s}}.gendurable_status, '[{"kind": "lease_expired", "attempt": 0, "token": 77}]'`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended, token) VALUES
		($1, 'plain', 'work', 0, 0, 's3', 8, 'w8', 's3', now() + interval '19 seconds', now() + interval '25 seconds', 77),
		(-35, 'leaf', 'work', 0, 0, 's3b', 9, 'w9', 's3', now() + interval '21 seconds', now() + interval '22 seconds', NULL)`, reaped)
	// Two reaps that charged no attempt: of claim 91, under which no step
	// started, and of claim 92, under which one did (the gate broken).
	uncharged := ins("done", `, errors) VALUES ('plain', 'work', $1::text::{{s}}.gendurable_status,
		'[{"kind": "lease_expired", "attempt": 0, "token": 91, "uncharged": true},
		  {"kind": "lease_expired", "attempt": 0, "token": 92, "uncharged": true}]'`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, token) VALUES
		($1, 'plain', 'work', 0, 0, 'u1', 1, 'w', 92)`, uncharged)
	// Unconfirmed reaps (claims no heartbeat wrote): claim 95's step
	// started, which such a claim may (not UnchargedStarted), after a
	// marked claim of the step went free (allowed); claim 96 went free
	// after step "work" had gone free so before (UnconfirmedTwice); claim
	// 97 is of another step, and claim 98 of "work" after it (allowed).
	unconfirmed := ins("done", `, errors) VALUES ('plain', 'work', $1::text::{{s}}.gendurable_status,
		'[{"kind": "lease_expired", "step": "work", "attempt": 0, "token": 94, "uncharged": true},
		  {"kind": "lease_expired", "step": "work", "attempt": 0, "token": 95, "uncharged": true, "unconfirmed": true},
		  {"kind": "lease_expired", "step": "work", "attempt": 1, "token": 96, "uncharged": true, "unconfirmed": true},
		  {"kind": "lease_expired", "step": "join", "attempt": 1, "token": 97, "uncharged": true, "unconfirmed": true},
		  {"kind": "lease_expired", "step": "work", "attempt": 0, "token": 98, "uncharged": true, "unconfirmed": true}]'`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, token) VALUES
		($1, 'plain', 'work', 0, 0, 'u2', 1, 'w', 95)`, unconfirmed)
	// A run of a step that ignores its context promises nothing: left out.
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, started, ended, honours) VALUES
		(-34, 'leaf', 'work', 0, 0, 'i1', 9, 'w9', 's1', now() + interval '21 seconds', now() + interval '22 seconds', false)`)
	// Key slots: a run of k3-a that started while three other rows of its
	// key held a slot, and one of s1 that started with none. A run that
	// started with a claim no longer current.
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, holders) VALUES
		(-40, 'leaf', 'work', 0, 0, 'h1', 1, 'w', 'k3-a', 3), (-41, 'leaf', 'work', 0, 0, 'h2', 1, 'w', 's1', 0)`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, claim_current) VALUES
		(-42, 'leaf', 'work', 0, 0, 'st', 1, 'w', false), (-43, 'leaf', 'work', 0, 0, 'st2', 1, 'w', true)`)
	// One that started after an operator's cancel fenced its claim out (its
	// lease kept): no stale start.
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, claim_current, cancelled_before) VALUES
		(-44, 'leaf', 'work', 0, 0, 'st3', 1, 'w', false, true)`)
	// Process 12 was stopped for 4 s. A step entered before the stop whose
	// start reached the database on waking, its claim gone and its key's
	// slot taken: no stale start, no slot excess (the instant of waking).
	// One entered before the stop that started 3 s after the wake, and one
	// entered after the wake: both count.
	exec(`INSERT INTO {{s}}.chaos_faults (kind, pid, worker, at, until) VALUES ('stop', 12, 'w12', now() - interval '10 seconds', now() - interval '6 seconds')`)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker, pkey, holders, claim_current, entered, started, ended) VALUES
		(-45, 'leaf', 'work', 0, 0, 'wk1', 12, 'w12', 'w1', 1, false, now() - interval '10.001 seconds', now() - interval '5.9 seconds', now() - interval '5.89 seconds'),
		(-46, 'leaf', 'work', 0, 0, 'wk2', 12, 'w12', NULL, NULL, false, now() - interval '10.001 seconds', now() - interval '3 seconds', NULL),
		(-47, 'leaf', 'work', 0, 0, 'wk3', 12, 'w12', NULL, NULL, false, now() - interval '5.95 seconds', now() - interval '5.9 seconds', NULL)`)
	// The fenced resource: a current write, a stale write refused, and a
	// stale write accepted.
	exec(`INSERT INTO {{s}}.chaos_fenced_log (key, n, token, instance, run_id, pid, phase, accepted, current) VALUES
		('f', 1, 5, -30, 'r5', 1, 'start', true, true),
		('f', 2, 4, -31, 'r4', 1, 'end', false, false),
		('g', 1, 3, -32, 'r3', 1, 'end', true, false)`)
	// A lost wake-up: parked on "go" with an unconsumed "go".
	parked := ins("awaiting_signal", `, awaits) VALUES ('waiter', 'got', $1::text::{{s}}.gendurable_status, '{go}'`)
	exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'go')`, parked)
	// A parent whose join started before its child finished.
	parent := ins("done", `, result) VALUES ('plain', 'join', $1::text::{{s}}.gendurable_status, '{"seq": 0}'`)
	exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, parent_id, finished_at) VALUES ('plain', 'work', 'done', $1, now() + interval '1 minute')`, parent)
	exec(`INSERT INTO {{s}}.chaos_effects (instance, fsm, step, seq, attempt, run_id, pid, worker) VALUES ($1, 'plain', 'join', 0, 0, 'j', 1, 'w')`, parent)
	// Executing an hour past its lease.
	ins("executing", `, lease_expires_at) VALUES ('plain', 'work', $1::text::{{s}}.gendurable_status, now() - interval '1 hour'`)

	r, err = chaos.Check(ctx, env.Admin, env.Schema, chaos.CheckOpts{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"MissingRows", r.MissingRows, 1}, {"LostOutcomes", r.LostOutcomes, 1}, {"Lost", r.Lost, 2},
		{"MultiCommit", r.MultiCommit, 1}, {"TokenReuse", r.TokenReuse, 1}, {"NullToken", r.NullToken, 1},
		{"Duplicates", r.Duplicates, 2}, {"Overlaps", r.Overlaps, 3}, {"OpenSpans", r.OpenSpans, 3},
		{"CutAtStop", r.CutAtStop, 2}, {"OverlapsCountingStops", r.OverlapsCountingStops, 5},
		{"KeyPeaks[1]", r.KeyPeaks[1], 2}, {"KeyPeaks[2]", r.KeyPeaks[2], 2}, {"KeyPeaks[3]", r.KeyPeaks[3], 4},
		{"SlotExcess", r.SlotExcess, 1}, {"StaleStarts", r.StaleStarts, 3}, {"WokeStarts", r.WokeStarts, 1},
		{"Uncharged", r.Uncharged, 7}, {"UnchargedStarted", r.UnchargedStarted, 1},
		{"Unconfirmed", r.Unconfirmed, 4}, {"UnconfirmedTwice", r.UnconfirmedTwice, 1}, {"UnconfirmedStarted", r.UnconfirmedStarted, 1},
		{"FencedWrites", r.FencedWrites, 3}, {"FencedRefused", r.FencedRefused, 1},
		{"StaleAccepted", r.StaleAccepted, 1}, {"StaleRefused", r.StaleRefused, 1},
		{"LostWakeUps", r.LostWakeUps, 1}, {"FaninEarly", r.FaninEarly, 1}, {"PastLease", r.PastLease, 1},
		{"Stuck", r.Stuck, 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	for _, smp := range r.Samples {
		if strings.Contains(smp, "ERROR") || strings.Contains(smp, "SQLSTATE") {
			t.Errorf("a sample query failed: %s", smp)
		}
	}
	if v := r.Violations(false); len(v) < 10 {
		t.Errorf("violations: %v", v)
	}
	t.Log(r.Line("checker-selftest"))
}

// TestFencedResourceRefusesOldTokens: the fenced resource applies a write
// whose token is at least the last one it accepted for the key, refuses an
// older one, and logs whether each writer's claim was still current.
func TestFencedResourceRefusesOldTokens(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := newEnv(t, chaos.DefaultURL(), "fenced")
	var a, b int64
	for _, c := range []struct {
		id    *int64
		token int64
	}{{&a, 7}, {&b, 9}} {
		if err := env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `INSERT INTO {{s}}.gendurable_instances
			(fsm, step, status, partition_key, claim_token, lease_expires_at)
			VALUES ('leaf', 'work', 'executing', 'k', $1, now() + interval '1 minute') RETURNING id`), c.token).Scan(c.id); err != nil {
			t.Fatal(err)
		}
	}
	rt := chaos.NewRuntime(nil, env.Schema, 1, "w")
	for _, w := range []struct {
		token, instance int64
		phase           string
		accepted        bool
	}{
		{7, a, "start", true},
		{5, a, "start", false}, // an older claim of a: refused, and not current
		{9, b, "start", true},
		{7, a, "end", false}, // a's claim is current, but b's newer token was seen
		{9, b, "end", true},
	} {
		got, err := rt.FenceWrite(ctx, env.Admin, "k", w.token, w.instance, "r", w.phase)
		if err != nil {
			t.Fatal(err)
		}
		if got != w.accepted {
			t.Errorf("write of token %d (%s): accepted %v, want %v", w.token, w.phase, got, w.accepted)
		}
	}
	var token, writes, refused int
	if err := env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT token, writes, refused FROM {{s}}.chaos_fenced WHERE key = 'k'`)).
		Scan(&token, &writes, &refused); err != nil {
		t.Fatal(err)
	}
	if token != 9 || writes != 3 || refused != 2 {
		t.Errorf("chaos_fenced: token %d, %d writes, %d refused; want 9, 3, 2", token, writes, refused)
	}
	r, err := chaos.Check(ctx, env.Admin, env.Schema, chaos.CheckOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if r.FencedWrites != 5 || r.FencedRefused != 2 || r.StaleRefused != 1 || r.StaleAccepted != 0 {
		t.Errorf("checker: %d writes, %d refused, %d stale refused, %d stale accepted; want 5, 2, 1, 0",
			r.FencedWrites, r.FencedRefused, r.StaleRefused, r.StaleAccepted)
	}
	// a's lease runs out: its claim is no longer current, and with no newer
	// token seen for key k2 the fence accepts its write — a stale write the
	// checker counts.
	if _, err := env.Admin.Exec(ctx, chaos.SQL(env.Schema, `UPDATE {{s}}.gendurable_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1`), a); err != nil {
		t.Fatal(err)
	}
	if got, err := rt.FenceWrite(ctx, env.Admin, "k2", 7, a, "r", "end"); err != nil || !got {
		t.Fatalf("first write of key k2: accepted %v, %v", got, err)
	}
	if r, err = chaos.Check(ctx, env.Admin, env.Schema, chaos.CheckOpts{}); err != nil {
		t.Fatal(err)
	}
	if r.StaleAccepted != 1 {
		t.Errorf("checker: %d stale writes accepted, want 1", r.StaleAccepted)
	}
}
