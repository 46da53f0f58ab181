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
		{"Duplicates", r.Duplicates, 2}, {"Overlaps", r.Overlaps, 1}, {"OpenSpans", r.OpenSpans, 1},
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
